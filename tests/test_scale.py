"""The job across many nodes (issue 36): what the scale harness (``bench/scale.py``) found.

Emulated nodes run tuilaunch's real node-side code (the cluster view, the job-wide dump
responder and gatherer, each on its own ``tuilaunch-cluster`` loop) with synthetic ranks
(``tui_launch.testing.scale``) against real stores: a ``TCPStore`` with each of torch's server
backends, and a real etcd. The harness itself, at small N, runs last.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from test_runner_parts import MemKV

from tui_launch.core.job import view as view_mod
from tui_launch.core.job.jobstacks import SHARED_FRAMES_UP_TO, JobDumps, shared_record
from tui_launch.core.job.view import (
    MAX_BACKOFF,
    RIDER_TICK,
    ClusterView,
    EtcdKV,
    TCPStoreKV,
    next_backoff,
)
from tui_launch.core.model.events import JobStacks
from tui_launch.core.model.store import RunStore
from tui_launch.testing.scale import (
    Counting,
    SyntheticDumper,
    Tally,
    node_name,
    node_snapshot,
)

ROOT = Path(__file__).resolve().parent.parent
NPROC = 8


def _tcp_server(libuv: bool) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        timeout=timedelta(seconds=30),
        wait_for_workers=False,
        use_libuv=libuv,
    )


@pytest.fixture(params=["libuv", "legacy", "etcd"])
def store_kv(request: pytest.FixtureRequest) -> Any:
    """A factory of tuilaunch's own clients to one real store of each kind."""
    if request.param == "etcd":
        host, port = request.getfixturevalue("etcd_server")
        return lambda: EtcdKV(host, port)
    server = _tcp_server(request.param == "libuv")  # the lambda keeps it alive
    return lambda: TCPStoreKV("127.0.0.1", server.port, timeout=30.0)


def _node(i: int, nodes: int, culprits: tuple[int, ...], kv: Any, post: Any, run: str) -> Any:
    snap = node_snapshot(i, nodes, NPROC, "scale")
    view = ClusterView(
        post=post,
        snapshot=lambda: snap,
        host=f"node{i:04d}.sim",
        handler=None,
        endpoint=lambda h: "",
        run_id=run,
        interval=0.5,
        connector=lambda h, ep: kv,
    )
    view.node = node_name(i)
    dumper = SyntheticDumper(i, NPROC, culprits, f"/scale/{i}")
    jobs = JobDumps(post, dumper, view.node, view.host, lambda: snap, view.wake)  # type: ignore[arg-type]
    view.rider = jobs.tick
    dumper.listeners.append(jobs.on_taken)
    return view, dumper


@pytest.mark.slow
def test_job_wide_dump_of_many_nodes_names_the_placed_culprits(store_kv) -> None:
    """12 nodes x 8 ranks, each node on its own cluster loop: a dump asked on node 0 reaches
    every node, the verdict there names the two placed culprits (on nodes 5 and 11) among 96
    ranks, and the nodes that answered read back a record of the verdict and the odd ranks
    only (past 64 ranks, every rank of the job stays in job.json on the asking node)."""
    nodes, run = 12, f"scale{time.monotonic_ns()}"
    culprits = (5 * NPROC + 3, 11 * NPROC + 3)
    views = []
    asker = RunStore()
    shared: list[JobStacks] = []

    def answered(e: object) -> None:
        if isinstance(e, JobStacks):
            shared.append(e)

    try:
        for i in range(nodes):
            kv = store_kv()
            views.append(_node(i, nodes, culprits, kv, answered if i else asker.post, run))
        for v, _ in views:
            v.start()
        first = views[0][0]
        reader = store_kv()
        wait_for(
            lambda: len(view_mod.registered_nodes(reader, first.prefix)) == nodes,
            30,
            what="every node registered",
        )
        asked = time.monotonic()
        views[0][1].take("key", "dashboard")
        (e,) = wait_for(lambda: asker.snapshot().job_stacks, 30, what="the job-wide verdict")
        took = time.monotonic() - asked
        assert set(e.odd_ranks) == set(culprits), e.verdict
        assert e.verdict.startswith("ranks 43, 91 never issued all_reduce #1000"), e.verdict
        assert len(e.ranks) == nodes * NPROC and not e.missing and len(e.nodes) == nodes
        assert took < 15, took  # every node answered: no wait for the deadline
        wait_for(lambda: len(shared) >= nodes - 1, 30, what="the record on every other node")
        for got in shared:
            assert got.verdict == e.verdict and set(got.odd_ranks) == set(culprits)
            assert {r.global_rank for r in got.ranks} == set(culprits)  # not all 96
    finally:
        for v, _ in views:
            v.stop()


def test_shared_record_of_a_big_job_carries_the_odd_ranks_only() -> None:
    """Every node reads the gathered record back: at 1,000 nodes x 8 ranks, the whole record
    (~1 MB) read by every node was a gigabyte through the store per dump."""
    from tui_launch.core.job.jobstacks import job_event, node_answer

    answers = {}
    for i in range(20):
        d = SyntheticDumper(i, NPROC, (13 * NPROC + 3,), f"/r/{i}")
        answers[node_name(i)] = node_answer(node_name(i), f"h{i}", i, d.take("key", "remote"))
    e = job_event(1, "key", "dashboard", node_name(0), answers)
    assert len(e.ranks) == 160 > SHARED_FRAMES_UP_TO and e.odd_ranks == (107,)
    small = shared_record(e)
    assert [r.global_rank for r in small.ranks] == [107] and small.ranks[0].frames
    assert {n.node for n in small.nodes} == {node_name(0), node_name(13)}
    assert small.verdict == e.verdict
    assert len(json.dumps(small.ranks[0].frames)) < 200
    few = job_event(1, "key", "dashboard", node_name(0), dict(list(answers.items())[:4]))
    assert shared_record(few) == few  # up to 64 ranks: everything, frames included


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "legacy"])
def test_a_list_filled_in_order_is_read_in_few_round_trips(libuv: bool) -> None:
    """Answers and the index are lists whose last slots may be counted but not yet written;
    reading them a key at a time cost two round trips per key (2,000 at 1,000 nodes)."""
    server = _tcp_server(libuv)
    tally = Tally()
    kv = TCPStoreKV("127.0.0.1", server.port, store=Counting(_client(server.port), tally))
    for k in range(500):
        kv.append("l/", f"v{k}".encode())
    kv.add("l/n", 3)  # three writers counted, their values not there yet
    before = tally.requests
    values = kv.appended("l/", 0)
    assert values == [f"v{k}".encode() for k in range(500)]
    assert tally.requests - before <= 14, tally.by_op  # a count, a binary search, one fetch
    assert kv.appended("l/", 498) == [b"v498", b"v499"]
    kv.set("l/501", b"late")
    assert kv.appended("l/", 500) == [b"late"]
    index = [f"l/{k}" for k in range(1, 504)]
    before = tally.requests
    got = kv.get_many(index)
    assert got[:501] == [*values, b"late"] and got[501:] == [None, None]
    assert tally.requests - before <= 20, tally.by_op


def _client(port: int) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(
        "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
    )


def test_etcd_lists_are_appended_without_retries(etcd_server) -> None:
    """On etcd the answers go to in-order keys: a thousand writers never retry each other (a
    counter's compare-and-swap would), and one listing reads them all."""
    host, port = etcd_server
    kv = EtcdKV(host, port)
    tally = Tally()
    kv._client = Counting(kv._client, tally)
    pfx = f"t{time.monotonic_ns()}/a/1/"
    for k in range(30):
        kv.append(pfx, f"v{k}".encode())
    assert tally.requests == 30
    assert kv.appended(pfx, 0) == [f"v{k}".encode() for k in range(30)]
    assert kv.appended(pfx, 28) == [b"v28", b"v29"]
    assert kv.appended("nothing/here/", 0) == []


class _SlowKV(MemKV):
    """A store whose reads take ``delay`` seconds (a store loaded by a big job)."""

    delay = 0.0

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        time.sleep(self.delay)
        return super().get_many(keys)


def _view(kv: MemKV, interval: float) -> ClusterView:
    return ClusterView(
        post=lambda e: None,
        snapshot=RunStore().snapshot,
        host="a",
        handler=None,
        endpoint=lambda h: "",
        run_id="job",
        interval=interval,
        connector=lambda h, ep: kv,
    )


def test_readers_back_off_while_the_store_is_slow_and_come_back() -> None:
    assert next_backoff(1.0, took=0.5, due=2.0) == 2.0
    assert next_backoff(MAX_BACKOFF, took=0.5, due=2.0) == MAX_BACKOFF
    assert next_backoff(4.0, took=0.001, due=2.0) == 2.0
    assert next_backoff(1.0, took=0.001, due=2.0) == 1.0
    kv = _SlowKV()
    v = _view(kv, interval=2.0)  # a read is slow past 0.1 s; a loaded machine's fast one is not
    kv.delay = 0.3
    reads = []
    for _ in range(4):
        v._last_read = 0.0  # due now: time each read
        v.tick()
        reads.append(v.backoff)
    assert reads == [2.0, 4.0, 8.0, 8.0]
    kv.delay = 0.0
    for _ in range(3):
        v._last_read = 0.0
        v.tick()
    assert v.backoff == 1.0


def test_a_dump_under_way_ticks_fast_without_republishing() -> None:
    """While a job-wide dump is under way the loop ticks every 0.25 s; each tick used to
    write this node's record again (at 1,000 nodes, 4,000 writes/s for the dump's length)."""
    kv = MemKV()
    sets: list[str] = []
    real_set = kv.set

    def counted(key: str, value: bytes) -> None:
        sets.append(key)
        real_set(key, value)

    kv.set = counted  # type: ignore[method-assign]
    v = _view(kv, interval=5.0)
    v.rider = lambda kv, pfx, nodes: RIDER_TICK
    assert v.run_once() == RIDER_TICK
    for _ in range(5):
        assert v.run_once() == RIDER_TICK
    status = [k for k in sets if "/s/" in k]
    assert len(status) == 1, sets
    v.set_handler(None)  # a new round: publish at once (the group rank may have changed)
    v.run_once()
    assert len([k for k in sets if "/s/" in k]) == 2


@pytest.mark.slow
def test_the_scale_harness_runs_at_small_n(tmp_path) -> None:
    """``bench/scale.py`` end to end at N=8: torch's keep-alives measured with and without
    tuilaunch's nodes, a job-wide dump whose verdict names the placed culprits."""
    argv = [sys.executable, str(ROOT / "bench" / "scale.py"), "--nodes", "8", "--stores"]
    argv += ["libuv", "--duration", "14", "--warmup", "3", "--results-dir", str(tmp_path)]
    argv += ["--no-favour"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("scale-*.json")
    runs = json.loads(path.read_text())["runs"]
    base, tl = runs
    assert not base["tuilaunch"] and tl["tuilaunch"]
    assert base["torch"]["keepalives"] > 0 and tl["torch"]["keepalives"] > 0
    assert base["torch"]["errors"] == tl["torch"]["errors"] == 0
    viewer = tl["viewer"]
    assert viewer["dump"]["names_culprits"], viewer["dump"]
    assert viewer["dump"]["ranks"] == 64 and viewer["dump"]["missing"] == 0
    assert viewer["cluster_nodes_seen"] == 8
    assert "8 node(s)" in viewer["tab_head"][0]
    assert "| libuv | 8 |" in out.stdout


def test_headless_prints_past_32_nodes_only_the_nodes_not_running() -> None:
    """At 64 nodes the harness counted 64 headless lines: the rule meant to print only nodes
    that are not running past 32 never matched. Now: the failed node and the lost one."""
    from dataclasses import replace

    from tui_launch.headless import cluster_lines_shown
    from tui_launch.testing.builders import node_status

    nodes = tuple(node_status(i, "running", 0, 8, 40, age=1.0) for i in range(40))
    assert cluster_lines_shown(nodes[:32], 10.0) == {n.node for n in nodes[:32]}
    nodes = (
        *nodes[:5],
        replace(nodes[5], state="failed"),
        replace(nodes[6], age=60.0),
        *nodes[7:],
    )
    assert cluster_lines_shown(nodes, 10.0) == {nodes[5].node, nodes[6].node}


def test_cluster_tab_of_a_thousand_nodes_lists_the_problems_and_counts_the_rest() -> None:
    """1,000 nodes: the lost and failed nodes come first, then healthy ones up to CLUSTER_ROWS,
    and the rest is a count (listing 200 rows cost ~110 ms a draw, over 5 % of a core at the
    tab's 1 Hz; bench/scale.py measures the draw)."""
    import io

    from rich.console import Console

    from tui_launch.core.model.events import ClusterSample, NodeStatus
    from tui_launch.tui.panels.render import CLUSTER_ROWS, cluster_panel

    def node(i: int, state: str = "running", age: float = 1.0) -> NodeStatus:
        ranks = tuple((i * 8 + r, r, 1000 + r, state) for r in range(8))
        return NodeStatus(
            f"n{i:04d}:1", f"n{i:04d}", i, state, i, 1000, 8, 0, ranks, (0, 0, 0), None, None, age
        )

    nodes = [node(i) for i in range(1000)]
    nodes[700] = node(700, age=30.0)  # lost: its record is 30 s old
    nodes[900] = node(900, state="failed")
    store = RunStore()
    store.post(ClusterSample(nodes=tuple(nodes), store="tcpstore 127.0.0.1:1"))
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(cluster_panel(store.snapshot(), time.monotonic()))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    rows = [ln for ln in lines if ln.lstrip().startswith("n0")]
    assert len(rows) == CLUSTER_ROWS <= 80, len(rows)
    assert "n0700" in rows[0] and "lost" in rows[0] and "n0900" in rows[1], rows[:2]
    assert f"... and {1000 - CLUSTER_ROWS} more healthy node(s)" in lines[-1], lines[-3:]
    assert lines[0].startswith("1000 node(s)")
