"""The scale harness: N emulated nodes of tuilaunch against the job's real store (issue 36).

Each emulated node runs tuilaunch's real node-side code, the cluster view's publisher and
reader (``ClusterView``) and the job-wide dump responder and gatherer (``JobDumps``), with
synthetic ranks (``tui_launch.testing.scale``: stacks and Flight Recorder summaries, the
culprits placed on chosen nodes). Alongside, torch's own rendezvous traffic for the same N:
every node's keep-alive, done by torch's own backend objects (``C10dRendezvousBackend`` /
``EtcdRendezvousBackend``: ``get_state``, then ``set_state`` (compare-and-set) of a state blob
the size that torch's ``_RendezvousState`` pickles to with N participants, retried when another
node's write won, as ``_DistributedRendezvousOpExecutor`` does) every 5 s (torch's default
``keep_alive_interval``), each node at its own phase.

For each store (a ``TCPStore`` with ``use_libuv=True``, one with ``use_libuv=False``, a real
``etcd``) and each N, two phases on a fresh server: ``baseline`` (torch's keep-alives only)
and ``tuilaunch`` (the same keep-alives, plus N tuilaunch nodes, one of which is the viewing
node: it renders the Cluster tab once a second, keeps the headless cluster lines, and asks for
one job-wide dump, timing it to the verdict and checking that the verdict names the culprits).

Processes: the store server; one for torch's keep-alives; ``--procs`` for the tuilaunch nodes;
one for the viewing node (so that its memory and CPU are its own). Nodes in one process are
driven by a few threads from one schedule; store calls release the GIL.

Usage::

    .venv/bin/python bench/scale.py --nodes 8,64,256,1000 --stores libuv,legacy,etcd
    .venv/bin/python bench/scale.py --quick          # N=8, 64; 25 s phases

Results (every figure, the load average beside each) go to ``bench/results/scale-<ts>.json``;
the markdown table to stdout.
"""

from __future__ import annotations

import argparse
import heapq
import io
import json
import os
import pickle
import platform
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KEEP_ALIVE = 5.0  # s: torch's default keep_alive_interval
RUN_ID = "scale"


def loadavg() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float | None:
    """The ``q``-quantile of ``values`` (None for none)."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


# ------------------------------------------------------------------------------------ stores


def tcp_client(port: int, tally: Any, timeout: float = 120.0) -> Any:
    from torch.distributed import TCPStore

    from tui_launch.testing.scale import Counting

    store = TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    return Counting(store, tally)


def etcd_client(port: int, tally: Any) -> Any:
    import etcd

    from tui_launch.testing.scale import Counting

    return Counting(etcd.Client(host="127.0.0.1", port=port, read_timeout=30), tally)


def start_server(kind: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A store server of ``kind`` in a process of its own: the process and its port."""
    port = free_port()
    if kind == "etcd":
        exe = shutil.which("etcd")
        if exe is None:
            raise SystemExit("etcd is not installed")
        peer = free_port()
        url, purl = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        argv = [exe, "--enable-v2", "--data-dir", str(workdir / "etcd")]
        argv += ["--listen-client-urls", url, "--advertise-client-urls", url]
        argv += ["--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl]
        argv += ["--initial-cluster", f"default={purl}"]
        log = open(workdir / "etcd.log", "wb")  # noqa: SIM115 - the server outlives this call
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    else:
        code = (
            "import sys, time; from datetime import timedelta; from torch.distributed import "
            f"TCPStore; s = TCPStore('127.0.0.1', {port}, is_master=True, "
            f"wait_for_workers=False, timeout=timedelta(seconds=60), use_libuv={kind == 'libuv'})"
            "; print('up', flush=True); time.sleep(1e9)"
        )
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"up":
            raise SystemExit(f"the {kind} TCPStore did not start")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if kind == "etcd":
                import etcd

                etcd.Client(host="127.0.0.1", port=port).read("/")
            else:
                socket.create_connection(("127.0.0.1", port), 1).close()
            return proc, port
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the {kind} store did not answer")


def server_cpu(pid: int) -> float:
    """CPU seconds used so far by process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def in_parallel(fn: Callable[[int], Any], items: range, threads: int = 16) -> list[Any]:
    """``fn`` of every item, ``threads`` at a time (connecting 1,000 clients one by one takes
    minutes on a loaded machine; a connect releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as ex:
        return list(ex.map(fn, items))


def ready_and_wait(ns: argparse.Namespace) -> float:
    """Say this child is set up, wait for the go (the common start time) and return it."""
    Path(ns.out + ".ready").write_text("1")
    go = Path(ns.out).parent / "go"
    while not go.exists():
        time.sleep(0.05)
    time.sleep(0.05)
    return float(go.read_text())


# --------------------------------------------------------------------------- the schedule


class Schedule:
    """Calls ``fn(i)`` for every item when it is due, on ``threads`` threads; ``fn`` returns
    the delay to its next call. ``wake(i)`` makes item ``i`` due now."""

    def __init__(self, fn: Callable[[int], float], threads: int) -> None:
        self._fn = fn
        self._heap: list[tuple[float, int, int]] = []
        self._gen: dict[int, int] = {}
        self._cv = threading.Condition()
        self._stop = False
        self.lag: list[float] = []  # s each call started after it was due
        self._threads = [
            threading.Thread(target=self._run, daemon=True, name=f"sched-{k}")
            for k in range(threads)
        ]

    def add(self, i: int, due: float) -> None:
        with self._cv:
            g = self._gen.get(i, 0) + 1
            self._gen[i] = g
            heapq.heappush(self._heap, (due, g, i))
            self._cv.notify()

    def wake(self, i: int) -> None:
        self.add(i, time.monotonic())

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(10)

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._stop:
                        return
                    if self._heap:
                        due, g, i = self._heap[0]
                        if self._gen.get(i) != g:  # superseded by a later add/wake
                            heapq.heappop(self._heap)
                            continue
                        wait = due - time.monotonic()
                        if wait <= 0:
                            heapq.heappop(self._heap)
                            self._gen[i] = g + 1_000_000  # running: a wake re-adds it
                            break
                        self._cv.wait(min(wait, 0.5))
                    else:
                        self._cv.wait(0.5)
            start = time.monotonic()
            self.lag.append(start - due)
            try:
                delay = self._fn(i)
            except Exception as e:  # a node's error must not stop the others
                print(f"node {i}: {e!r}", file=sys.stderr)
                delay = 1.0
            with self._cv:
                if self._gen.get(i) == g + 1_000_000:  # not woken meanwhile
                    self._gen[i] = g
                    heapq.heappush(self._heap, (time.monotonic() + delay, g, i))
                    self._cv.notify()
                else:
                    pass  # woken while running: its add() is in the heap already


# ---------------------------------------------------------------- torch's keep-alives (child)


def state_blob(nodes: int) -> bytes:
    """torch's ``_RendezvousState`` of a complete round of ``nodes`` nodes, pickled."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    st = _RendezvousState()
    now = datetime.now(timezone.utc)
    for i in range(nodes):
        nd = _NodeDesc(f"gpu-node-{i:05d}.cluster.internal", 10000 + i, 0)
        st.participants[nd] = i
        st.last_heartbeats[nd] = now
    st.complete = True
    st.round = 1
    return pickle.dumps(st)


def torch_child(ns: argparse.Namespace) -> dict[str, Any]:
    """Every node's keep-alive through torch's own backend objects; latencies and counts."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import (
        EtcdRendezvousBackend,
    )

    from tui_launch.testing.scale import Tally

    tally = Tally()
    blob = state_blob(ns.n)

    def backend(_: int) -> Any:
        if ns.store == "etcd":
            return EtcdRendezvousBackend(etcd_client(ns.port, tally), RUN_ID, ttl=7200)
        return C10dRendezvousBackend(tcp_client(ns.port, tally), RUN_ID)

    backends = in_parallel(backend, range(ns.n))
    backends[0].set_state(blob, None)  # the round is complete: every node is a participant
    ns.t0 = ready_and_wait(ns)
    t0, warm, end = ns.t0, ns.t0 + ns.warmup, ns.t0 + ns.duration
    ops: list[tuple[float, float, int]] = []  # (start, seconds, tries)
    errors = [0]
    counter = [0]

    def keep_alive(i: int) -> float:
        start = time.time()
        if start > end:
            return 3600.0
        b = backends[i]
        tries = 0
        try:
            got = b.get_state()
            token = got[1] if got else None
            while tries < 20:
                tries += 1
                counter[0] += 1
                # A heartbeat changes one timestamp: same size, different bytes.
                mine = blob[:-24] + f"{i:08d}{counter[0]:016d}".encode()[-24:]
                res = b.set_state(mine, token)
                if res is None or res[2]:
                    break
                token = res[1]
        except Exception:
            errors[0] += 1
        if start >= warm:
            ops.append((start, time.time() - start, tries))
        return KEEP_ALIVE

    sched = Schedule(keep_alive, ns.threads)
    now_m, now_w = time.monotonic(), time.time()
    rnd = random.Random(1)
    for i in range(ns.n):
        sched.add(i, now_m + max(0.0, t0 - now_w) + rnd.uniform(0, KEEP_ALIVE))
    sched.start()
    while time.time() < warm:
        time.sleep(0.2)
    c0 = tally.as_dict()
    while time.time() < end:
        time.sleep(0.2)
    c1 = tally.as_dict()
    sched.stop()
    lat = [s for _, s, _ in ops]
    return {
        "cpu_s": time.process_time(),
        "keepalives": len(ops),
        "errors": errors[0],
        "p50_ms": 1000 * (pct(lat, 0.5) or 0),
        "p99_ms": 1000 * (pct(lat, 0.99) or 0),
        "max_ms": 1000 * max(lat, default=0),
        "retries": sum(t - 1 for _, _, t in ops),
        "blob_bytes": len(blob),
        "lag_p99_ms": 1000 * (pct(sched.lag, 0.99) or 0),
        # Requests and bytes in the measured window only.
        "store": {k: c1[k] - c0[k] for k in ("requests", "sent", "received")},
        "window_s": ns.duration - ns.warmup,
    }


# ---------------------------------------------------------------- tuilaunch's nodes (child)


def make_kv(store: str, port: int, tally: Any) -> Any:
    """tuilaunch's own client (the class the real run uses), its connection counted."""
    from tui_launch.core.job.view import EtcdKV, TCPStoreKV

    if store == "etcd":
        kv = EtcdKV("127.0.0.1", port)
        kv._client = etcd_client(port, tally)
    else:
        # Connect patiently (a loaded machine), then use tuilaunch's own 3 s store timeout.
        client = tcp_client(port, tally, timeout=120.0)
        client.set_timeout(timedelta(seconds=3.0))
        kv = TCPStoreKV("127.0.0.1", port, store=client)
    return kv


def culprits_of(ns: argparse.Namespace) -> tuple[int, ...]:
    """The placed culprits' global ranks: local rank 3 of each chosen node."""
    return tuple(c * ns.nproc + min(3, ns.nproc - 1) for c in culprit_nodes(ns.n))


def culprit_nodes(n: int) -> tuple[int, ...]:
    """Nodes that run a culprit: one near the middle, one at the end (never the viewer)."""
    return tuple(sorted({max(1, n // 2 + 1), n - 1}))


def build_node(
    i: int, ns: argparse.Namespace, kv: Any, post: Callable[[Any], object], wake: Any
) -> tuple[Any, Any, Any]:
    """Emulated node ``i``: its ClusterView with a JobDumps rider on a synthetic dumper."""
    from tui_launch.core.job.jobstacks import JobDumps
    from tui_launch.core.job.view import ClusterView
    from tui_launch.testing.scale import SyntheticDumper, node_name, node_snapshot

    snap = node_snapshot(i, ns.n, ns.nproc, RUN_ID)
    view = ClusterView(
        post=post,
        snapshot=lambda: snap,
        host=f"node{i:04d}.sim",
        handler=None,
        endpoint=lambda h: "",
        run_id=RUN_ID,
        interval=ns.interval,
        connector=lambda h, ep: kv,
    )
    view.node = node_name(i)
    dumper = SyntheticDumper(i, ns.nproc, culprits_of(ns), f"/scale/{i}")
    jobs = JobDumps(
        post,
        dumper,  # type: ignore[arg-type]
        view.node,
        view.host,
        lambda: snap,
        wake,
    )
    view.rider = jobs.tick
    return view, jobs, dumper


def nodes_child(ns: argparse.Namespace) -> dict[str, Any]:
    """Nodes ``first .. first+count-1`` of the job, on one schedule; requests and bytes."""
    from tui_launch.core.model.events import JobStacks
    from tui_launch.testing.scale import Tally

    tally = Tally()
    views: dict[int, Any] = {}
    gathered: list[float] = []

    def post(e: Any) -> None:
        if isinstance(e, JobStacks):
            gathered.append(time.time())

    sched = Schedule(lambda i: views[i].run_once(), ns.threads)
    kvs = in_parallel(lambda _: make_kv(ns.store, ns.port, tally), range(ns.count))
    for k, i in enumerate(range(ns.first, ns.first + ns.count)):
        views[i] = build_node(i, ns, kvs[k], post, lambda i=i: sched.wake(i))[0]
    ns.t0 = ready_and_wait(ns)
    now_m, now_w = time.monotonic(), time.time()
    rnd = random.Random(ns.first)
    for i in views:
        sched.add(i, now_m + max(0.0, ns.t0 - now_w) + rnd.uniform(0, ns.interval))
    sched.start()
    marks: dict[str, Any] = {}
    while time.time() < ns.t0 + ns.warmup:
        time.sleep(0.2)
    marks["warm"] = tally.as_dict()
    cpu0 = time.process_time()
    while time.time() < ns.t0 + ns.duration:
        time.sleep(0.2)
    marks["end"] = tally.as_dict()
    cpu = time.process_time() - cpu0
    sched.stop()
    return {
        "nodes": len(views),
        "cpu_s": cpu,
        "tally": marks,
        "shared_records_read": len(gathered),
        "lag_p99_ms": 1000 * (pct(sched.lag, 0.99) or 0),
    }


def viewer_child(ns: argparse.Namespace) -> dict[str, Any]:
    """Node 0, as a real run wires it: its own cluster thread, a run store, the Cluster tab
    drawn once a second, the headless cluster lines, one job-wide dump."""
    from rich.console import Console

    from tui_launch.core.model.store import RunStore
    from tui_launch.core.model.text import cluster_lines
    from tui_launch.headless import CLUSTER_LINES_MAX
    from tui_launch.testing.scale import Tally
    from tui_launch.tui.panels.render import cluster_panel

    tally = Tally()
    store = RunStore()
    kv = make_kv(ns.store, ns.port, tally)
    view, jobs, dumper = build_node(0, ns, kv, store.post, lambda: view.wake())
    dumper.listeners.append(jobs.on_taken)
    ns.t0 = ready_and_wait(ns)
    view.start()
    render_cpu, renders = [0.0], [0]
    headless: dict[str, str] = {}
    headless_printed = [0]
    stop = threading.Event()
    tab: list[str] = []

    def draw() -> None:
        # The dashboard redraws the Cluster tab when a new sample arrives, at most once a second.
        seen = None
        while not stop.wait(1.0):
            s = store.snapshot()
            c0 = time.thread_time()
            console = Console(file=io.StringIO(), width=160, color_system=None, record=True)
            console.print(cluster_panel(s, time.monotonic()))
            out = console.export_text()
            if s.cluster is not None and s.cluster is not seen:
                # The headless output's rule (headless.py's _print_cluster): a line per node
                # when it changes; past CLUSTER_LINES_MAX nodes, only nodes not running.
                seen = s.cluster
                lines = cluster_lines(s.cluster.nodes, 10.0)
                many = len(lines) > CLUSTER_LINES_MAX
                for node, line in lines.items():
                    if headless.get(node) != line:
                        headless[node] = line
                        if not many or " running " not in f" {line} ":
                            headless_printed[0] += 1
            render_cpu[0] += time.thread_time() - c0
            renders[0] += 1
            tab[:] = out.splitlines()

    drawer = threading.Thread(target=draw, daemon=True)
    drawer.start()
    cpu0 = time.process_time()
    w0 = time.time()
    dump_at = ns.t0 + ns.dump_at
    marks: dict[str, Any] = {}
    while time.time() < dump_at:
        if "warm" not in marks and time.time() >= ns.t0 + ns.warmup:
            marks["warm"] = tally.as_dict()
        time.sleep(0.1)
    asked = time.time()
    dumper.take("key", "dashboard")
    verdict: dict[str, Any] = {}
    while time.time() < ns.t0 + ns.duration:
        js = store.snapshot().job_stacks
        if js and not verdict:
            e = js[-1]
            verdict = {
                "seconds": time.time() - asked,
                "verdict": e.verdict,
                "odd_ranks": list(e.odd_ranks),
                "ranks": len(e.ranks),
                "nodes": len(e.nodes),
                "missing": len(e.missing),
                "names_culprits": set(e.odd_ranks) == set(culprits_of(ns)),
            }
        time.sleep(0.05)
    marks["end"] = tally.as_dict()
    marks.setdefault("warm", marks["end"])
    cpu = time.process_time() - cpu0
    wall = time.time() - w0
    stop.set()
    view.stop()
    s = store.snapshot()
    return {
        "cluster_nodes_seen": len(s.cluster.nodes) if s.cluster else 0,
        "dump": verdict or {"seconds": None, "names_culprits": False},
        "cpu_pct": 100 * cpu / wall,
        "tab_render_ms": 1000 * render_cpu[0] / max(1, renders[0]),
        "tab_cpu_pct_at_1hz": 100 * render_cpu[0] / wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "headless_lines": headless_printed[0],
        "tab_head": tab[:14],
        "tally": marks,
    }


# ------------------------------------------------------------------------------ orchestration


def child(role: str, ns: argparse.Namespace, **kw: Any) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(Path(__file__)), f"_{role}"]
    opts = {
        "store": ns.store,
        "port": ns.port,
        "n": ns.n,
        "nproc": ns.nproc,
        "t0": ns.t0,
        "duration": ns.duration,
        "warmup": ns.warmup,
        "interval": ns.interval,
        "dump_at": ns.dump_at,
        "threads": ns.threads,
        "out": ns.out,
        **kw,
    }
    for k, v in opts.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(argv, start_new_session=True)


def run_phase(store: str, n: int, with_tl: bool, ns: argparse.Namespace) -> dict[str, Any]:
    """One phase on a fresh server: torch's keep-alives, and tuilaunch's nodes if asked."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server, port = start_server(store, work)
        load0 = loadavg()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        outs: dict[str, Path] = {}
        try:
            p = argparse.Namespace(**vars(ns))
            p.store, p.port, p.n, p.t0 = store, port, n, 0.0
            p.threads = 16
            if ns.favour:
                favour(server.pid)
            for role, kw in [("torch", {})]:
                outs[role] = work / f"{role}.json"
                p.out = str(outs[role])
                procs[role] = child(role, p, **kw)
                if ns.favour:
                    favour(procs[role].pid)
            if with_tl:
                per = (n - 1 + ns.procs - 1) // ns.procs
                for k in range(ns.procs):
                    first, count = 1 + k * per, min(per, n - 1 - k * per)
                    if count <= 0:
                        continue
                    outs[f"nodes{k}"] = work / f"nodes{k}.json"
                    p.out = str(outs[f"nodes{k}"])
                    procs[f"nodes{k}"] = child("nodes", p, first=first, count=count)
                outs["viewer"] = work / "viewer.json"
                p.out = str(outs["viewer"])
                procs["viewer"] = child("viewer", p)
            setup0 = time.time()
            while not all(Path(str(o) + ".ready").exists() for o in outs.values()):
                dead = [k for k, pr in procs.items() if pr.poll() is not None]
                if dead or time.time() - setup0 > 900:
                    raise SystemExit(f"set-up failed: {dead or 'timed out'}")
                time.sleep(0.2)
            p.t0 = time.time() + 1.0
            (work / "go.tmp").write_text(repr(p.t0))
            (work / "go.tmp").rename(work / "go")
            while time.time() < p.t0 + p.warmup:
                time.sleep(0.2)
            cpu0, loads = server_cpu(server.pid), [loadavg()]
            while time.time() < p.t0 + p.duration:
                time.sleep(1)
                loads.append(loadavg())
            cpu1 = server_cpu(server.pid)
            for name, proc in procs.items():
                try:
                    proc.wait(120 + n * 0.1)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    print(f"{name} did not finish", file=sys.stderr)
            res: dict[str, Any] = {"store": store, "n": n, "tuilaunch": with_tl}
            res["setup_s"] = p.t0 - setup0
            for name, path in outs.items():
                res[name] = json.loads(path.read_text()) if path.exists() else None
            res["server_cpu_pct"] = 100 * (cpu1 - cpu0) / (p.duration - p.warmup)
            res["load"] = {"start": load0, "median": statistics.median(loads), "max": max(loads)}
            return res
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            server.kill()
            server.wait()


def tl_rate(res: dict[str, Any]) -> tuple[float, float]:
    """tuilaunch's store requests/s and bytes/s over the measured window (every node)."""
    window = res["torch"]["window_s"] if res.get("torch") else 1.0
    req = byt = 0.0
    for k, v in res.items():
        if (k.startswith("nodes") or k == "viewer") and v:
            a, b = v["tally"]["warm"], v["tally"]["end"]
            req += b["requests"] - a["requests"]
            byt += b["sent"] + b["received"] - a["sent"] - a["received"]
    return req / window, byt / window


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| store | N | keep-alive p50 / p99 ms (samples), torch only | p99 with tuilaunch "
        "| p99 change | tuilaunch req/s | tuilaunch KB/s | torch KB/s | dump -> verdict s "
        "| culprits named "
        "| viewer peak MB | viewer CPU % | tab render ms (% core at 1 Hz) | load |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for base, tl in rows:
        b, t = base["torch"], tl["torch"]
        v = tl.get("viewer") or {}
        req, byt = tl_rate(tl)
        torch_bytes = (b["store"]["sent"] + b["store"]["received"]) / max(1e-9, b["window_s"])
        change = 100 * (t["p99_ms"] - b["p99_ms"]) / b["p99_ms"] if b["p99_ms"] else 0.0
        dump = v.get("dump", {})
        out.append(
            f"| {tl['store']} | {tl['n']} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} "
            f"({b['keepalives']}) | {t['p99_ms']:.1f} | {change:+.0f} % | {req:.0f} "
            f"| {byt / 1024:.0f} "
            f"| {torch_bytes / 1024:.0f} | "
            f"{dump.get('seconds') or float('nan'):.1f} | {dump.get('names_culprits')} "
            f"| {v.get('peak_rss_mb', 0):.0f} | {v.get('cpu_pct', 0):.1f} "
            f"| {v.get('tab_render_ms', 0):.1f} ({v.get('tab_cpu_pct_at_1hz', 0):.1f} %) "
            f"| {base['load']['median']:.1f} / {tl['load']['median']:.1f} |"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,64,256,1000", help="N, comma-separated")
    parser.add_argument("--stores", default="libuv,legacy,etcd")
    parser.add_argument("--nproc", type=int, default=8, help="synthetic ranks per node")
    parser.add_argument("--duration", type=float, default=60.0, help="s per phase")
    parser.add_argument("--warmup", type=float, default=10.0, help="s not measured")
    parser.add_argument("--dump-at", type=float, default=0.0, help="s (0: mid-window)")
    parser.add_argument("--interval", type=float, default=2.0, help="cluster interval")
    parser.add_argument("--procs", type=int, default=2, help="processes of tuilaunch nodes")
    parser.add_argument("--quick", action="store_true", help="N=8,64, 25 s phases")
    parser.add_argument(
        "--no-favour",
        dest="favour",
        action="store_false",
        help="leave the store and torch's agents at the default priority",
    )
    parser.add_argument("--results-dir", default=str(HERE / "results"))
    parser.add_argument("--name", default="scale")
    ns = parser.parse_args()
    if ns.quick:
        ns.nodes, ns.duration, ns.warmup = "8,64", 25.0, 6.0
    if not ns.dump_at:
        ns.dump_at = ns.warmup + (ns.duration - ns.warmup) / 3
    out = Path(ns.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{ns.name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {
        "argv": sys.argv,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip(),
    }
    rows, raw = [], []
    for store in ns.stores.split(","):
        for n in (int(x) for x in ns.nodes.split(",")):
            print(f"{store} N={n}: torch only ...", file=sys.stderr, flush=True)
            base = run_phase(store, n, False, ns)
            print(f"{store} N={n}: with tuilaunch ...", file=sys.stderr, flush=True)
            tl = run_phase(store, n, True, ns)
            rows.append((base, tl))
            raw += [base, tl]
            print(table([(base, tl)]).splitlines()[-1], file=sys.stderr, flush=True)
            # After every N: a long run stopped half-way keeps what it measured.
            path.write_text(json.dumps({"meta": meta, "runs": raw, "table": table(rows)}, indent=1))
    report = table(rows)
    print(report)
    print(f"results: {path}", file=sys.stderr)
    return 0


def favour(pid: int) -> None:
    """Run ``pid`` at nice -10 where allowed: the store's host and torch's agents stand for
    machines of their own, and the emulated tuilaunch nodes' CPU (which on a real job is on
    the other machines) must not delay them on this one; the store itself still serves every
    client alike."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, -10)
    except OSError:
        print("could not raise the store's and torch's priority (not permitted)", file=sys.stderr)


def child_main(role: str, argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    for k in ("store", "out"):
        p.add_argument(f"--{k}")
    for k in ("port", "n", "nproc", "threads", "first", "count"):
        p.add_argument(f"--{k}", type=int, default=0)
    for k in ("t0", "duration", "warmup", "interval", "dump-at"):
        p.add_argument(f"--{k}", type=float)
    ns = p.parse_args(argv)
    fn = {"torch": torch_child, "nodes": nodes_child, "viewer": viewer_child}[role]
    res = fn(ns)
    Path(ns.out).write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        sys.exit(child_main(sys.argv[1][1:], sys.argv[2:]))
    sys.exit(main())
