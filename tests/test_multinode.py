"""Several agents as nodes: c10d, static, etcd and etcd-v2 rendezvous, elasticity, cluster view.

Every node is a real ``tuilaunch --no-tui`` process on this machine (one test puts them in
separate network namespaces, as separate hosts); workers are real gloo jobs
(``tests/workers/elastic.py``): each rank appends ``RANK WORLD_SIZE RESTART GROUP_RANK PID`` to
a log once its process group has formed, then steps until the test creates a stop file. etcd
tests start a real ``etcd --enable-v2`` on a free loopback port. Short join, last-call and
heartbeat timeouts keep the set fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import (
    WORKERS,
    Launch,
    _launch,
    base_env,
    free_port,
    journal_path,
    read_journal,
    tuilaunch_cmd,
    wait_for,
)

from tui_launch.core.job.view import EtcdKV, TCPStoreKV, read_cluster

ELASTIC = str(WORKERS / "elastic.py")
# Heartbeats every second, dead after 3 missed: a lost node is noticed in ~3-5 s.
RDZV_CONF = "join_timeout=40,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
COMMON = ("--nproc-per-node", "1", "--monitor-interval", "0.2")


def node_env(**extra: str) -> dict[str, str]:
    return base_env(TUILAUNCH_CLUSTER_INTERVAL="0.5", **extra)


class Job:
    """One elastic job's files: the workers' log and the stop file."""

    def __init__(self, tmp: Path) -> None:
        self.log = tmp / "ranks.log"
        self.stop = tmp / "stop"
        self.log.touch()

    def lines(self) -> list[tuple[int, int, int, int, int]]:
        out = []
        for ln in self.log.read_text().splitlines():
            rank, world, restart, group, pid = ln.split()
            out.append((int(rank), int(world), int(restart), int(group), int(pid)))
        return out

    def worlds(self, size: int) -> list[tuple[int, int, int, int, int]]:
        return [x for x in self.lines() if x[1] == size]

    def wait_world(self, size: int, count: int, timeout: float = 60) -> list:
        return wait_for(
            lambda: len(self.worlds(size)) >= count and self.worlds(size),
            timeout,
            what=f"{count} rank(s) in a world of {size}; log: {self.lines()}",
        )

    def script(self) -> tuple[str, ...]:
        return (ELASTIC, str(self.log), str(self.stop))


def wait_hosting(launch: Launch, port: int) -> None:
    """Wait until ``launch`` listens on ``port``, i.e. hosts the c10d store: killing the other
    agent must not take the store with it (a fixed 0.5 s sleep lost that race under load)."""
    proc = psutil.Process(launch.pid)

    def listening() -> bool:
        conns = getattr(proc, "net_connections", proc.connections)(kind="tcp")  # psutil < 6
        return any(
            c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in conns
        )

    wait_for(listening, 60, what=f"agent {launch.pid} hosting the store on port {port}")


def start(launches: list[Launch], args: list[str], prefix: tuple[str, ...] = ()) -> Launch:
    launch = _launch([*prefix, *tuilaunch_cmd(*args)], None, node_env())
    launches.append(launch)
    return launch


def c10d_args(port: int, run_id: str, nnodes: str) -> list[str]:
    return [
        *COMMON,
        "--nnodes",
        nnodes,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        RDZV_CONF,
    ]


def finish(job: Job, nodes: list[Launch], timeout: float = 60) -> None:
    job.stop.touch()
    for n in nodes:
        code = n.wait(timeout)
        assert code == 0, n.output[-4000:]


def restarts(launch: Launch) -> dict[str, int]:
    events = read_journal(journal_path(launch.output))
    counts = {"failure": 0, "manual": 0, "membership": 0}
    for e in events:
        if e["kind"] == "restart":
            counts[e["cause"]] += 1
    return counts


def causes_since(launch: Launch, since: float) -> list[str]:
    """The causes of this node's restarts after the wall-clock time ``since``.

    (A node can restart with no failed attempt of its own: torch's "a node is waiting" check
    can come before its rank's broken collective.)"""
    events = read_journal(journal_path(launch.output))
    return [e["cause"] for e in events if e["kind"] == "restart" and e["wall"] >= since]


def check_cluster(kv, run_id: str, job: Job, nodes: int) -> None:
    """The cluster view's records, read back from the job's store, match the workers."""
    pids = {pid: rank for rank, world, _r, _g, pid in job.worlds(nodes)}

    def complete():
        recs = read_cluster(kv, run_id)
        running = [r for r in recs if r.state == "running" and r.group_world_size == nodes]
        return len(running) == nodes and running

    recs = wait_for(complete, 30, what=f"{nodes} running nodes in the cluster view")
    assert sorted(r.group_rank for r in recs) == list(range(nodes))
    seen = {pid: g for r in recs for g, _lr, pid, st in r.ranks if st == "running"}
    assert seen == {pid: rank for pid, rank in pids.items()}, (seen, pids)
    for r in recs:
        assert r.local_world_size == 1
        # With MIN:MAX, a node that came late makes one membership restart: never a failure.
        assert r.restarts[:2] == (0, 0)
        assert r.host and r.pid > 0 and r.age is not None


# ----------------------------------------------------------------------------- c10d / static


def test_static_two_nodes(launches, tmp_path):
    """--node-rank/--master-addr/--master-port; the cluster view lives in rank 0's store."""
    job, port, run_id = Job(tmp_path), free_port(), f"st{uuid.uuid4().hex[:6]}"
    nodes = [
        start(
            launches,
            [
                *COMMON,
                "--nnodes",
                "2",
                "--node-rank",
                str(i),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--rdzv-id",
                run_id,
                *job.script(),
            ],
        )
        for i in (0, 1)
    ]
    ranks = job.wait_world(2, 2)
    assert sorted((r, g) for r, _w, _x, g, _p in ranks) == [(0, 0), (1, 1)]
    check_cluster(TCPStoreKV("127.0.0.1", port), run_id, job, 2)
    finish(job, nodes)


# ----------------------------------------------------------------------------- etcd


def _killed_and_said(nodes: list[Launch]) -> str:
    """Kill ``nodes``; the end of what each printed."""
    for node in nodes:
        node.kill()
    out = []
    for i, node in enumerate(nodes):
        with contextlib.suppress(AssertionError):
            node.wait(30)
        out.append(f"node {i} ({node.proc.poll()}):\n{node.output[-3000:]}")
    return "\n".join(out)


@pytest.mark.parametrize("backend", ["etcd-v2", "etcd"])
def test_etcd_two_nodes(launches, tmp_path, etcd_server, backend):
    """Both etcd backends against a real etcd; the cluster view's records are in etcd."""
    host, port = etcd_server
    job, run_id = Job(tmp_path), f"{backend.replace('-', '')}{uuid.uuid4().hex[:6]}"
    args = [
        *COMMON,
        "--nnodes",
        "2",
        "--rdzv-backend",
        backend,
        "--rdzv-endpoint",
        f"{host}:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        RDZV_CONF if backend == "etcd-v2" else "last_call_timeout=1,timeout=40",
        *job.script(),
    ]
    nodes = [start(launches, args) for _ in range(2)]
    try:
        ranks = job.wait_world(2, 2)
    except AssertionError as e:  # seen once in CI (etcd, not reproduced): what the nodes said
        raise AssertionError(f"{e}\n{_killed_and_said(nodes)}") from None
    assert sorted(r for r, *_ in ranks) == [0, 1]
    check_cluster(EtcdKV(host, port), run_id, job, 2)
    finish(job, nodes)


# ----------------------------------------------------------------------------- elasticity


def test_scale_up_is_a_membership_restart(launches, tmp_path):
    """--nnodes 1:2: a node that joins mid-run restarts the group as a world of 2, free."""
    job, port, run_id = Job(tmp_path), free_port(), f"up{uuid.uuid4().hex[:6]}"
    a = start(launches, [*c10d_args(port, run_id, "1:2"), *job.script()])
    job.wait_world(1, 1)
    b = start(launches, [*c10d_args(port, run_id, "1:2"), *job.script()])
    ranks = job.wait_world(2, 2)
    assert sorted(r for r, *_ in ranks) == [0, 1]
    finish(job, [a, b])
    assert restarts(a) == {"failure": 0, "manual": 0, "membership": 1}
    assert restarts(b) == {"failure": 0, "manual": 0, "membership": 0}
    assert "nodes: attempt 1 has 2 node(s) (+" in a.stderr


def test_c10d_two_nodes_cluster_view_and_scale_down(launches, tmp_path):
    """Two agents on one c10d endpoint form one world of two, and each node's status is in the
    store. Then, with --nnodes 1:2 --max-restarts 0, one agent is SIGKILLed: its node is lost,
    and the other goes on alone as a world of 1 without spending the failure budget."""
    job, port, run_id = Job(tmp_path), free_port(), f"down{uuid.uuid4().hex[:6]}"
    a = start(launches, [*c10d_args(port, run_id, "1:2"), *job.script()])
    wait_hosting(a, port)
    b = start(launches, [*c10d_args(port, run_id, "1:2"), *job.script()])
    ranks = job.wait_world(2, 2)
    assert sorted((r, g) for r, _w, _x, g, _p in ranks) == [(0, 0), (1, 1)]
    check_cluster(TCPStoreKV("127.0.0.1", port), run_id, job, 2)
    os.kill(b.pid, signal.SIGKILL)
    b.wait(30)
    try:
        job.wait_world(1, 1)
    except AssertionError as e:
        raise AssertionError(f"{e}\nsurvivor's output:\n{a.output[-6000:]}") from None
    finish(job, [a])
    counts = restarts(a)  # 2 membership restarts if b came after a's last call
    assert counts["failure"] == counts["manual"] == 0 and counts["membership"] >= 1, counts
    assert "node lost:" in a.stderr
    # attempt 1, or 2 when b joined after a's last call (one more membership restart)
    assert re.search(r"nodes: attempt \d+ has 1 node\(s\) \(-", a.stderr), a.stderr[-3000:]
    # The surviving node printed both nodes' lines: "cluster <id> (node <group rank> of 2 ...".
    ranks = re.findall(r"\] cluster \S+ \(node (\d+) of 2\b", a.stderr)
    assert set(ranks) == {"0", "1"}, a.stderr[-3000:]


def test_genuine_failure_restarts_without_the_lost_node_wait(launches, tmp_path):
    """--nnodes 1:2, one rank fails by itself: its node is evidently alive, so it re-rendezvouses
    at once instead of waiting a heartbeat window to rule out a lost node, and the other node
    (whose rank only saw the collective break) sees it waiting and restarts too. The failing
    node spends its budget once, neither reports a lost node, and the group is back well
    inside the 15 s heartbeat window (before, the nodes waited out the window, ~17 s, unless
    one mistook the other's re-rendezvous for a lost node)."""
    job, port, run_id = Job(tmp_path), free_port(), f"gen{uuid.uuid4().hex[:6]}"
    marker = tmp_path / "failed_at"
    args = c10d_args(port, run_id, "1:2")
    # A long heartbeat window, so that waiting it out would show.
    slow_beats = "keep_alive_interval=5,keep_alive_max_attempt=3"
    args[args.index(RDZV_CONF)] = f"join_timeout=40,last_call_timeout=1,{slow_beats}"
    args = [*args, "--max-restarts", "3", *job.script()]
    env = node_env(TL_FAIL_ONCE=str(marker))
    a = _launch(tuilaunch_cmd(*args), None, env)
    launches.append(a)
    wait_hosting(a, port)
    b = _launch(tuilaunch_cmd(*args), None, env)
    launches.append(b)
    first = {pid for *_x, pid in job.wait_world(2, 2)}
    failed_at = float(wait_for(lambda: marker.exists() and marker.read_text(), 60, what="failure"))

    def back() -> float | None:
        again = [x for x in job.worlds(2) if x[4] not in first]
        return time.time() if len(again) >= 2 else None

    up_at = wait_for(back, 60, interval=0.05, what="both ranks back in a world of 2")
    latency = up_at - failed_at
    finish(job, [a, b])
    started = [
        next(
            e["wall"]
            for e in read_journal(journal_path(n.output))
            if e["kind"] == "workers_started" and e["wall"] > failed_at
        )
        for n in (a, b)
    ]
    print(
        f"failure -> both nodes' workers started {max(started) - failed_at:.2f}s, "
        f"-> both up (past init_process_group) {latency:.2f}s"
    )
    own = re.compile(r"\] attempt \d+ failed: rank 1 .*failed by itself \(TL_FAIL_ONCE\)")
    failed, other = (a, b) if own.search(a.stderr) else (b, a)
    assert own.search(failed.stderr) and not own.search(other.stderr)
    # The node whose rank failed spends one restart of its budget, at once.
    assert causes_since(failed, failed_at) == ["failure"], failed.stderr[-3000:]
    # The other restarts once: a failure if its rank's broken collective was seen first, else
    # torch's own "a node is waiting" membership restart; never a lost node.
    assert causes_since(other, failed_at) in (["failure"], ["membership"]), other.stderr[-3000:]
    for node in (a, b):
        assert "node lost:" not in node.stderr, node.stderr[-3000:]
    # Waiting out the window took >= 17 s before any worker was restarted. From there to
    # past init_process_group is two interpreters importing torch: seconds, many more on a
    # busy machine, so that part only gets a sanity bound.
    assert max(started) - failed_at < 10, f"{max(started) - failed_at:.1f}s to restarted workers"
    assert latency < 60, f"{latency:.1f}s from the failure to both workers up again"


def test_below_min_nodes_fails_clearly(launches, tmp_path):
    """--nnodes 2:3 and one of two nodes dies: the other waits for the join timeout, then fails
    with a sentence that says why."""
    job, port, run_id = Job(tmp_path), free_port(), f"min{uuid.uuid4().hex[:6]}"
    args = c10d_args(port, run_id, "2:3")
    # Short enough that the test does not wait long once b is gone, long enough for b's
    # launcher to start and join the first round on a loaded machine (6 s was not, once).
    args[args.index(RDZV_CONF)] = RDZV_CONF.replace("join_timeout=40", "join_timeout=15")
    a = start(launches, [*args, *job.script()])
    wait_hosting(a, port)
    b = start(launches, [*args, *job.script()])
    job.wait_world(2, 2)
    os.kill(b.pid, signal.SIGKILL)
    b.wait(30)
    assert a.wait(90) == 75  # a node lost (below MIN): infrastructure
    assert "fewer than the minimum of 2 node(s) (--nnodes 2:3) joined" in a.stderr, a.stderr[-3000:]
    assert "dynamic_rendezvous.py" not in a.stderr  # one line, not the agent's traceback


# ----------------------------------------------------------------------------- store host


def test_store_host_by_address(monkeypatch):
    """Who hosts the c10d store without is_host: torch's hostname check, plus an IP literal
    that an interface of this network namespace holds (a bind test); nothing else changes."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend

    from tui_launch.core.seam.rendezvous import is_local_address, local_store_host

    assert is_local_address("127.0.0.1") and not is_local_address("0.0.0.0")
    assert not is_local_address("198.51.100.77")  # TEST-NET-2: nobody's address
    assert not is_local_address("localhost")  # hostnames stay torch's business
    torch_says = {"localhost": True, "node0": True}
    monkeypatch.setattr(backend, "_matches_machine_hostname", lambda h: torch_says.get(h, False))
    original = backend._matches_machine_hostname
    decided: list[str] = []
    with local_store_host(decided.append):
        check = backend._matches_machine_hostname
        assert check("localhost") and check("node0")  # torch's yes is kept
        assert not check("node1") and not check("198.51.100.77")
        assert decided == []
        assert check("127.0.0.1")  # torch (faked here) said no; the address is ours
        assert decided == ["127.0.0.1"]
    assert backend._matches_machine_hostname is original


# ----------------------------------------------------------------------------- separate hosts


def _netns_ok() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    name = f"tlprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@pytest.fixture
def two_hosts() -> Iterator[list[tuple[str, str, str]]]:
    """Two network namespaces joined by a veth pair: (namespace, address, interface) each."""
    why = _netns_ok()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:5]
    net = f"10.211.{int(tag[:2], 16) % 250}"
    hosts = [(f"tl{tag}{i}", f"{net}.{i + 1}", f"tl{tag}v{i}") for i in (0, 1)]
    cmds = [
        ["ip", "netns", "add", hosts[0][0]],
        ["ip", "netns", "add", hosts[1][0]],
        ["ip", "link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2]],
    ]
    for ns, addr, dev in hosts:
        cmds += [
            ["ip", "link", "set", dev, "netns", ns],
            ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev],
            ["ip", "-n", ns, "link", "set", dev, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]
    try:
        for c in cmds:
            subprocess.run(c, check=True, capture_output=True, text=True)
        yield hosts
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot set up network namespaces: {' '.join(e.cmd)}: {e.stderr.strip()}")
    finally:
        for ns, _a, _d in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_separate_hosts_in_network_namespaces(launches, tmp_path, two_hosts):
    """Each agent in its own network namespace (its own address, no shared loopback): the
    rendezvous, the workers' gloo group and the cluster view all go over the veth link."""
    job, port, run_id = Job(tmp_path), 29500, f"ns{uuid.uuid4().hex[:6]}"
    (_ns0, addr0, _d0), (_ns1, addr1, _d1) = two_hosts
    nodes = []
    for ns, addr, dev in two_hosts:
        args = [*c10d_args(port, run_id, "2"), "--local-addr", addr, *job.script()]
        args[args.index("--rdzv-endpoint") + 1] = f"{addr0}:{port}"
        # No is_host: torch's hostname check says no in both namespaces (they keep the
        # machine's hostname); tuilaunch sees that addr0 is an address of the first one.
        env = node_env(GLOO_SOCKET_IFNAME=dev)
        cmd = ["ip", "netns", "exec", ns, *tuilaunch_cmd(*args)]
        launch = _launch(cmd, None, env)
        launches.append(launch)
        nodes.append(launch)
        time.sleep(0.5)
    ranks = job.wait_world(2, 2)
    assert sorted(r for r, *_ in ranks) == [0, 1]
    finish(job, nodes)
    hosting = "this node hosts the c10d store"
    assert f"{hosting}: {addr0} is an address" in nodes[0].stderr, nodes[0].stderr[-3000:]
    assert hosting not in nodes[1].stderr, nodes[1].stderr[-3000:]
    for n in nodes:
        assert f"master {addr0}:" in n.stderr, n.stderr[-3000:]
        cluster = [ln for ln in n.stderr.splitlines() if "] cluster " in ln]
        assert any(f" {addr0}:" in ln for ln in cluster), cluster
        assert any(f" {addr1}:" in ln for ln in cluster), cluster
