"""Job-wide stack dumps (issue 14, many nodes): two agents as two nodes on this machine.

A dump asked for on one node goes through the job's own c10d store (no new server, no new
port) to the other node, which dumps its own ranks and publishes where they are; the asking
node gathers every rank of the job into one ``job_stacks`` event (journal, Cluster and Stacks
tabs) and ``job.txt``. Real agents, real gloo workers: one node is a ``tuilaunch --no-tui``
process, the other a :class:`Runner` in this process when the test calls its control API.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from conftest import (
    TOKEN_VAR,
    WORKERS,
    Launch,
    _launch,
    read_journal,
    tuilaunch_cmd,
    wait_for,
    wait_gone,
)
from test_multinode import (
    COMMON,
    RDZV_CONF,
    Job,
    c10d_args,
    free_port,
    node_env,
    wait_hosting,
)

from tui_launch.core.launch.args import parse
from tui_launch.core.model.commands import DumpStacks
from tui_launch.core.model.events import JobStacks, StacksDumped
from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside
from tui_launch.core.model.store import RunStore
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner

HANG = str(WORKERS / "hang.py")
TWO = ("--nproc-per-node", "2")


def _node(launches: list[Launch], args: list[str], journal: Path) -> Launch:
    launch = _launch(tuilaunch_cmd("--journal", str(journal), *args), None, node_env())
    launches.append(launch)
    return launch


def _kind(path: Path, kind: str) -> list[dict]:
    if not path.exists():
        return []
    return [e for e in read_journal(path) if e["kind"] == kind]


@pytest.fixture(params=["c10d", "etcd-v2"])
def backend(request) -> tuple[str, tuple[str, int] | None]:
    """The rendezvous backend, and the etcd server for etcd-v2 (started before the token is
    set: it must not count as something a launch left behind)."""
    if request.param == "etcd-v2":
        return request.param, request.getfixturevalue("etcd_server")
    return request.param, None


@pytest.fixture
def in_process(backend, monkeypatch):
    """Isolate what a Runner in this process changes in its environment; stop it after."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    monkeypatch.setenv("TUILAUNCH_CLUSTER_INTERVAL", "0.5")
    monkeypatch.setenv(SHARE_STORE_ENV, "x")
    monkeypatch.delenv(SHARE_STORE_ENV)
    made: list[Runner] = []
    yield made
    for r in made:
        if not r.done:
            r.stop()
            r.stop()
            r.wait(30)
    assert wait_gone(token, 10) == []


def test_dump_on_one_node_gives_every_rank_of_the_job(backend, launches, tmp_path, in_process):
    """2 nodes x 2 ranks: dump_stacks on one node (the control API, as the d key calls it)
    gives the stacks of all four ranks, the other node's among them; through the c10d
    store, and through etcd (where the request counter is a compare-and-swap)."""
    job, run_id = Job(tmp_path), f"js{uuid.uuid4().hex[:6]}"
    name, etcd = backend
    if etcd is None:
        port = free_port()
        rdzv = c10d_args(port, run_id, "2")
    else:
        host, port = etcd
        rdzv = [*COMMON, "--nnodes", "2", "--rdzv-backend", name]
        rdzv += ["--rdzv-endpoint", f"{host}:{port}", "--rdzv-id", run_id]
        rdzv += ["--rdzv-conf", RDZV_CONF]
    args = [*rdzv, *TWO, "--hang-timeout", "0"]
    remote_journal = tmp_path / "remote.jsonl"
    remote = _node(launches, [*args, *job.script()], remote_journal)
    if etcd is None:
        wait_hosting(remote, port)
    targs, _ = parse([*args, "--log-dir", str(tmp_path / "logs"), *job.script()])
    store = RunStore()
    runner = Runner(targs, store, RunConfig(echo=False, journal_path=str(tmp_path / "local.jsonl")))
    in_process.append(runner)
    runner.start()
    job.wait_world(4, 4)
    wait_for(
        lambda: (c := store.snapshot().cluster) is not None and len(c.nodes) == 2,
        30,
        what="both nodes in the cluster view",
    )

    local = runner.execute(DumpStacks("api", source="api")).dump
    assert isinstance(local, StacksDumped) and len(local.ranks) == 2

    def gathered() -> JobStacks | None:
        jobs = store.snapshot().job_stacks
        return jobs[-1] if jobs else None

    e = wait_for(gathered, 30, what="the job-wide dump")
    assert sorted(r.global_rank for r in e.ranks) == [0, 1, 2, 3], e
    assert e.missing == () and len(e.nodes) == 2 and e.path == local.path
    me = runner.membership.cluster.node if runner.membership.cluster else ""
    theirs = [r for r in e.ranks if r.node != me]
    assert sorted(r.global_rank for r in theirs) == sorted(set(range(4)) - set(local.ranks))
    # Where each remote rank is: its innermost frames, down to the worker's own file.
    for r in theirs:
        assert r.known and r.frames and any("elastic.py" in f for f in r.frames), r
    other = next(n for n in e.nodes if n.node != me)
    assert other.error == "" and other.method.startswith("py-spy") and other.path
    # The other node dumped its own ranks because this one asked, and kept them.
    remote_dumps = wait_for(
        lambda: _kind(remote_journal, "stacks_dumped"), 10, what="the other node's dump"
    )
    assert remote_dumps[0]["source"] == "remote" and remote_dumps[0]["reason"] == "api"
    assert Path(remote_dumps[0]["path"], "stacks.txt").exists()
    # The other node is told the gathered record too (its Cluster and Stacks tabs show it).
    shared = wait_for(
        lambda: _kind(remote_journal, "job_stacks"), 20, what="the record on the other node"
    )
    assert sorted(r["global_rank"] for r in shared[0]["ranks"]) == [0, 1, 2, 3]
    assert shared[0]["requested_by"] == me and shared[0]["verdict"] == e.verdict
    # This node's journal has the job-wide record, and job.txt sits beside its own dump.
    (journaled,) = _kind(tmp_path / "local.jsonl", "job_stacks")
    assert sorted(r["global_rank"] for r in journaled["ranks"]) == [0, 1, 2, 3]
    text = Path(local.path, "job.txt").read_text()
    assert text.startswith(e.verdict) and "elastic.py" in text and other.node in text

    job.stop.touch()
    assert remote.wait(60) == 0, remote.output[-4000:]
    assert runner.wait(60) == 0


def test_hang_suspected_on_one_node_dumps_every_node(launches, tmp_path):
    """Only one node watches for hangs (the other has --hang-timeout 0): its suspicion asks
    both, and the job-wide verdict names rank 1 and the three ranks waiting in all_reduce."""
    port, run_id = free_port(), f"jh{uuid.uuid4().hex[:6]}"
    # --no-bootstrap: the stacks' job-wide verdict (with the Flight Recorder: the test below).
    base = [*c10d_args(port, run_id, "2"), *TWO, "--no-bootstrap"]
    script = [HANG, "--seconds", "90"]
    watching_journal, other_journal = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    watching = _node(
        launches, [*base, "--hang-timeout", "4", "--on-hang", "stop", *script], watching_journal
    )
    wait_hosting(watching, port)
    other = _node(launches, [*base, "--hang-timeout", "0", *script], other_journal)
    assert watching.wait(150) == 75, watching.output[-4000:]  # a hang: infrastructure
    # The last suspicion (a slow start can make an earlier one, before the ranks printed).
    *_, e = [x for x in _kind(watching_journal, "job_stacks") if x["reason"] == "hang-suspected"]
    assert sorted(r["global_rank"] for r in e["ranks"]) == [0, 1, 2, 3], e
    assert len(e["nodes"]) == 2 and e["missing"] == []
    assert e["verdict"].startswith("rank 1 is not in a collective: hang.py:"), e["verdict"]
    assert "in load_batch" in e["verdict"]
    assert "ranks 0, 2, 3 wait in all_reduce" in e["verdict"], e["verdict"]
    assert e["odd_ranks"] == [1]
    remote = [d for d in _kind(other_journal, "stacks_dumped") if d["source"] == "remote"]
    assert remote and remote[0]["reason"] == "hang-suspected", remote
    assert "stacks of the job (hang-suspected" in watching.stderr
    if other.proc.poll() is None:
        os.kill(other.pid, signal.SIGTERM)
    other.wait(60)


# ----------------------------------------------------------------------------- pure parts


def _answers() -> dict:
    from tui_launch.core.model.events import JobNode, JobRank

    coll = ("torch/distributed/distributed_c10d.py:3252 in all_reduce", "train.py:80 in step")
    own = ("data.py:41 in load_batch", "train.py:77 in step")

    def rank(node: str, g: int, odd: bool = False) -> JobRank:
        if odd:
            return JobRank(node, g, g % 2, 100 + g, "data.py:41 in load_batch", None, True, own)
        place = "all_reduce (train.py:80 in step)"
        return JobRank(node, g, g % 2, 100 + g, place, "all_reduce", True, coll)

    a = JobNode("10.0.0.1:11", "a", 0, "rank 1 is not in a collective", "/ra/stacks/1", "py-spy")
    b = JobNode("10.0.0.2:22", "b", 1, "every rank waits in all_reduce", "/rb/stacks/1", "py-spy")
    return {
        a.node: (a, (rank(a.node, 0), rank(a.node, 1, odd=True))),
        b.node: (b, (rank(b.node, 2), rank(b.node, 3))),
    }


def test_job_verdict_spans_the_nodes_and_answers_round_trip() -> None:
    from tui_launch.core.job.jobstacks import decode_answer, encode_answer, job_event, job_text

    answers = _answers()
    for info, ranks in answers.values():
        assert decode_answer(encode_answer(info, ranks)) == (info, ranks)
    assert decode_answer(b"{not json") is None
    e = job_event(4, "key", "dashboard", "10.0.0.1:11", answers, missing=["10.0.0.3:33"])
    assert e.verdict == (
        "rank 1 is not in a collective: data.py:41 in load_batch; ranks 0, 2, 3 wait in "
        "all_reduce; no answer from 10.0.0.3:33"
    )
    assert e.odd_ranks == (1,) and [r.global_rank for r in e.ranks] == [0, 1, 2, 3]
    assert [n.group_rank for n in e.nodes] == [0, 1]
    text = job_text(e)
    assert "rank 1 on 10.0.0.1:11: data.py:41 in load_batch  <- odd one out" in text
    assert "ranks 0, 2, 3 on 10.0.0.1:11, 10.0.0.2:22: all_reduce" in text
    assert "10.0.0.3:33: no answer" in text


def test_cluster_and_stacks_tabs_show_where_every_rank_of_the_job_is() -> None:
    from rich.console import Console

    from tui_launch.core.job.jobstacks import job_event
    from tui_launch.core.model.events import ClusterSample
    from tui_launch.core.model.store import reduce
    from tui_launch.testing import scenarios
    from tui_launch.tui.panels.render import cluster_panel
    from tui_launch.tui.panels.stacks import stacks_panel

    src = scenarios.hung()
    s = src.snapshot()
    e = job_event(1, "key", "dashboard", "10.0.0.1:11", _answers())
    s = reduce(s, e)
    assert s.job_stacks == (e,)

    def text(renderable: object) -> str:
        console = Console(width=120, record=True, color_system=None)
        console.print(renderable)
        return console.export_text()

    now = e.mono + 3
    stacks = text(stacks_panel(s, None, now))
    head = "stacks of the job  (key, asked by 10.0.0.1:11; 3s ago): 4 ranks on 2 node(s)"
    assert head in stacks
    assert "rank 1 on 10.0.0.1:11: data.py:41 in load_batch" in stacks
    assert "ranks 0, 2, 3  \u00d7 3 ranks on 10.0.0.1:11, 10.0.0.2:22: all_reduce" in stacks
    assert "data.py:41 in load_batch" in stacks.split("ranks 0, 2, 3")[0]  # odd one first

    s = reduce(s, ClusterSample(nodes=(), store="tcpstore 127.0.0.1:1"))
    cluster = text(cluster_panel(s, now))
    assert "stacks of the job" in cluster and "rank 1 on 10.0.0.1:11" in cluster
    assert "distributed_c10d.py" not in cluster  # places only, no frames


def test_a_request_that_never_came_does_not_block_later_ones(tmp_path, monkeypatch) -> None:
    """Request numbers come from a counter, the request record from a second write: an asker
    that lost the store in between leaves a hole. A node waits for it a while, then answers
    the requests after it (a real TCPStore on loopback; a node with no running rank says so)."""
    import json
    from datetime import timedelta

    from torch.distributed import TCPStore

    from tui_launch.core.diagnosis.dumps import Dumper
    from tui_launch.core.job import jobstacks
    from tui_launch.core.job.view import TCPStoreKV
    from tui_launch.core.workers.table import RankTable

    monkeypatch.setattr(jobstacks, "MISSING_REQUEST_WAIT", 0.5)
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    kv = TCPStoreKV("127.0.0.1", server.port)
    store = RunStore()
    dumper = Dumper(store.post, RankTable(), lambda: str(tmp_path), dict)
    node = jobstacks.JobDumps(store.post, dumper, "b:2", "hb", store.snapshot, lambda: None)
    pfx = "tuilaunch/t/cluster/"
    node.tick(kv, pfx, ())  # joins: requests from now on are its to answer
    kv.add(pfx + "d/n", 1)  # request 1: counted, never written
    kv.add(pfx + "d/n", 1)
    kv.set(pfx + "d/r/2", json.dumps({"node": "a:1", "reason": "key"}).encode())

    def answered() -> list[bytes]:
        node.tick(kv, pfx, ())
        return kv.appended(pfx + "d/a/2/", 0)

    (raw,) = wait_for(answered, 10, what="the answer to request 2")
    got = jobstacks.decode_answer(raw)
    assert got is not None and got[0].error == "no running worker" and got[1] == ()
    assert kv.appended(pfx + "d/a/1/", 0) == []  # the hole is skipped, not answered


def test_job_wide_collective_verdict_names_the_rank_on_the_other_node(launches, tmp_path):
    """The Flight Recorder (no flag: the default) on both nodes: rank 3 (the other node's)
    never issues the all-reduce the others wait in, and the watching node's job-wide verdict
    says so from the records."""
    port, run_id = free_port(), f"jf{uuid.uuid4().hex[:6]}"
    base = [*c10d_args(port, run_id, "2"), *TWO]
    script = [str(Path(__file__).parent / "programs" / "ddp_loop.py"), "--wander-rank", "3"]
    script += ["--seconds", "150"]
    watching_journal, other_journal = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    watching = _node(
        launches, [*base, "--hang-timeout", "4", "--on-hang", "stop", *script], watching_journal
    )
    wait_hosting(watching, port)
    other = _node(launches, [*base, "--hang-timeout", "0", *script], other_journal)
    assert watching.wait(200) == INFRASTRUCTURE, watching.output[-4000:]
    *_, e = [x for x in _kind(watching_journal, "job_stacks") if x["reason"] == "hang-suspected"]
    assert sorted(r["global_rank"] for r in e["ranks"]) == [0, 1, 2, 3], e
    assert e["verdict"].startswith("rank 3 never issued all_reduce #"), e["verdict"]
    assert "wandered_off" in e["verdict"] and e["odd_ranks"] == [3]
    assert {r["global_rank"]: r["coll_seq"] >= 0 for r in e["ranks"]} == dict.fromkeys(
        range(4), True
    )
    if other.proc.poll() is None:
        os.kill(other.pid, signal.SIGTERM)
    other.wait(60)


def test_job_verdict_from_the_records_of_every_node() -> None:
    from dataclasses import replace

    from tui_launch.core.job.jobstacks import job_event

    answers = _answers()
    with_records = {}
    for node, (info, ranks) in answers.items():
        seqs = {0: 41, 1: 40, 2: 41, 3: 41}
        with_records[node] = (
            info,
            tuple(replace(r, coll_op="all_reduce", coll_seq=seqs[r.global_rank]) for r in ranks),
        )
    e = job_event(1, "d", "key", "a", with_records)
    assert e.odd_ranks == (1,)
    assert e.verdict.startswith("rank 1 never issued all_reduce #41 (it is in data.py:41"), (
        e.verdict
    )


def test_a_lost_nodes_fresh_record_is_not_waited_for() -> None:
    """A job-wide dump waits for the nodes of this round: a node lost a few seconds ago still
    has a record under 10 s old, but of the round before (4 nodes, now 3); once it is older
    than a restart's lag it is not asked (a run that waited for it said "no answer from")."""
    from tui_launch.core.job.jobstacks import ROUND_LAG, _alive
    from tui_launch.core.model.events import NodeStatus

    def node(world: int | None, age: float | None, state: str = "running") -> NodeStatus:
        return NodeStatus("n", "h", 1, state, 0, world, 1, 1, (), (0, 0, 0), None, None, age)

    assert _alive(node(3, 1.0), 3) and _alive(node(None, 5.0), 3) and _alive(node(4, 5.0), None)
    assert _alive(node(4, ROUND_LAG), 3)  # maybe not republished since its restart yet
    assert not _alive(node(4, ROUND_LAG + 1), 3)
    assert _alive(node(3, 9.0), 3) and not _alive(node(3, 11.0), 3)
    assert not _alive(node(3, 0.0, state="succeeded"), 3)


def test_a_request_half_written_at_a_nodes_first_look_is_answered(tmp_path) -> None:
    """The asker counts a request, then writes it: a node whose first look falls between the
    two writes took it for one made before it joined and never answered (one node of twelve
    did, in a loaded run of tests/test_scale.py, and the job-wide verdict missed its rank)."""
    import json

    from test_runner_parts import MemKV

    from tui_launch.core.diagnosis.dumps import Dumper
    from tui_launch.core.job import jobstacks
    from tui_launch.core.workers.table import RankTable

    kv, store, pfx = MemKV(), RunStore(), "tuilaunch/t/cluster/"
    dumper = Dumper(store.post, RankTable(), lambda: str(tmp_path), dict)
    node = jobstacks.JobDumps(store.post, dumper, "b:2", "hb", store.snapshot, lambda: None)
    kv.add(pfx + "d/n", 1)  # request 1 counted; the first look comes before its record
    node.tick(kv, pfx, ())
    kv.set(pfx + "d/r/1", json.dumps({"node": "a:1", "reason": "key", "t": 0}).encode())

    def answered() -> list[bytes]:
        node.tick(kv, pfx, ())
        return kv.appended(pfx + "d/a/1/", 0)

    (raw,) = wait_for(answered, 10, what="the answer to request 1")
    got = jobstacks.decode_answer(raw)
    assert got is not None and got[0].error == "no running worker"
