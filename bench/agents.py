"""Many real tuilaunch agents on one machine: the cluster view, a lost node, a job-wide dump.

N real ``tuilaunch --no-tui`` agents on localhost form one elastic job (``--nnodes N-1:N
--nproc-per-node 1 --max-restarts 1``), over the c10d store or a real etcd (``etcd-v2``), one
gloo worker each (``workloads/hangable.py``: steps; hangs in ``load_batch`` on the rank asked
to). Each agent is told apart by its pid (torch names a node ``addr:pid``). The agents reach the
store through a counting proxy (``storeproxy.py``), which reads every request off the wire and
puts it down to tuilaunch (keys under ``tuilaunch/``) or torch (the rendezvous).

Phases, each checked, each timed:

``form``
    Agent 0 starts first (with c10d it hosts the store, on a port of its own, reached
    directly; every other agent goes through the proxy), then the rest. Done when every rank
    is up in a world of N and the viewing agent (agent 1) prints a cluster line for each of
    the N nodes, each ``node k of N: running``.
``steady``
    ``--window`` seconds of a steady job: tuilaunch's and torch's store requests/s and bytes/s
    (the proxy, over N-1 agents, scaled to N), the latency of torch's own keep-alive
    operations (``get_state`` and ``set_state`` of torch's rendezvous backend, timed from a
    separate probe process every 0.5 s, straight to the store), and the CPU (% of one core)
    and RSS of the viewing agent, of the agent that hosts the store, and the median agent.
``lost``
    The last agent is SIGKILLed (the store's host and the viewer are spared). Done when every
    survivor's rank is up again in a world of N-1 and every survivor's journal has the
    ``node_change`` that names the lost node; records how long that took and each survivor's
    restart causes (a failure, or a membership change: torch's rules decide).
``dump``
    A rank on another node than the viewer's is made to hang (``load_batch``); the others wait
    for it in ``all_reduce``. ``tuilaunch ctl <viewer> dump`` asks the viewer for a dump, which
    it makes job-wide; done when its journal has the ``job_stacks`` event: every rank, no node
    missing, the verdict naming the hung rank (``rank R is not in a collective: ... in
    load_batch``). Dump -> verdict = from ctl's start to that event.

Then every agent gets SIGTERM, and whatever still carries the run's token after the grace is
SIGKILLed and counted ("leftover processes": should be 0). ``--views on,off`` (``--baseline``)
adds, for each N and backend, a ``form`` + ``steady`` run with the cluster view off
(``TUILAUNCH_CLUSTER_INTERVAL=0``): what the view costs, measured in the same sitting.

    .venv/bin/python bench/agents.py --nodes 4,8,16 --backends c10d,etcd-v2 [--baseline]
    .venv/bin/python bench/agents.py --quick              # N=4, c10d, 10 s windows

The machine's load is recorded beside every figure (``/proc/loadavg`` at each phase). Markdown
on stdout, progress on stderr, everything in ``bench/results/agents-<time>.json``.
``tests/test_agents_real.py`` runs the same phases at N=4 and checks them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui_launch.testing.procs import cpu_s, env_holders, rss_mb

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import storeproxy  # noqa: E402 (bench/ is put on the path above for the tests' import)

ROOT = BENCH.parent
WORKLOAD = BENCH / "workloads" / "hangable.py"
RESULTS = BENCH / "results"
TOKEN_VAR = "TUILAUNCH_BENCH_TOKEN"
CLUSTER_ENV = "TUILAUNCH_CLUSTER_INTERVAL"
BACKENDS = ("c10d", "etcd-v2")
# torch's keep-alive defaults (5 s, 3 missed): what users get. A long join timeout, for N agents
# starting on two cores; a last call that lets a late agent join the first round.
RDZV_CONF = "join_timeout=600,last_call_timeout=10,read_timeout=60"
# For tests: heartbeats every second, a node lost after 3 missed.
FAST_RDZV_CONF = (
    "join_timeout=300,last_call_timeout=3,read_timeout=60,keep_alive_interval=1,"
    "keep_alive_max_attempt=3"
)
CLUSTER_LINE = re.compile(
    r"\] cluster (?P<node>\S+) \(node (?P<rank>\d+) of (?P<world>\d+)(?: on [^)]*)?\): "
    r"(?P<lost>LOST, )?"
    r"(?P<state>[a-z_]+),"
)
VIEWER, HOST = 1, 0  # agent 1 views and is asked for dumps; agent 0 hosts the c10d store


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loadavg() -> tuple[float, float, float]:
    """``/proc/loadavg``'s three figures."""
    return os.getloadavg()


def token_pids(token_var: str, token: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries the token."""
    return env_holders(token_var, token)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (by /proc's parent links)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fp:
                    parent[int(entry)] = int(fp.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def quantile(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of ``xs``; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float = 0.2) -> Any:
    """Poll ``predicate`` until truthy; :class:`Failed` with ``what`` at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Failed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


class Failed(Exception):
    """A phase did not do what it should (one line)."""


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """A live journal's events so far (a half-written last line is skipped)."""
    out = []
    with contextlib.suppress(OSError), open(path) as fp:
        for line in fp:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


@dataclass
class Agent:
    """One tuilaunch agent (a node): its process, journal and output file."""

    index: int
    proc: subprocess.Popen[bytes]
    journal: Path
    output: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self, kind: str) -> list[dict[str, Any]]:
        """This agent's journaled events of one kind."""
        return [e for e in read_json_lines(self.journal) if e.get("kind") == kind]

    def text(self) -> str:
        """What the agent printed so far (stdout and stderr)."""
        try:
            return self.output.read_text(errors="replace")
        except OSError:
            return ""

    def cluster(self) -> dict[str, dict[str, Any]]:
        """The latest headless cluster line of each node, parsed: what this agent's view shows."""
        seen: dict[str, dict[str, Any]] = {}
        for m in CLUSTER_LINE.finditer(self.text()):
            seen[m["node"]] = {
                "rank": int(m["rank"]),
                "world": int(m["world"]),
                "state": m["state"],
                "lost": bool(m["lost"]),
            }
        return seen


class Bed:
    """N real agents on localhost in one elastic job, and the store they share.

    Args:
        n: the number of agents (nodes), one worker each.
        backend: ``c10d`` or ``etcd-v2``.
        workdir: where journals, outputs, logs and the workers' marks go.
        env: the agents' environment (the token is added).
        token_var, token: every process of the bed carries ``token_var=token``.
        python: the interpreter that runs ``-m tui_launch``.
        rdzv_conf: ``--rdzv-conf``.
        etcd_port: an etcd server's client port on loopback (etcd-v2; None: start one here).
        cluster_interval: ``TUILAUNCH_CLUSTER_INTERVAL`` for the agents (None: the default).
        log: where progress lines go.
    """

    def __init__(
        self,
        n: int,
        backend: str,
        workdir: Path,
        *,
        env: dict[str, str],
        token_var: str = TOKEN_VAR,
        token: str | None = None,
        python: str = sys.executable,
        rdzv_conf: str = RDZV_CONF,
        etcd_port: int | None = None,
        cluster_interval: str | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    ) -> None:
        if n < 3:
            raise ValueError("at least 3 agents: a store host, a viewer and one to lose")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}")
        self.n, self.backend, self.workdir = n, backend, workdir
        self.token_var, self.token = token_var, token or uuid.uuid4().hex
        self.python, self.rdzv_conf, self.log = python, rdzv_conf, log
        self.env = {**env, token_var: self.token, "PYTHONUNBUFFERED": "1"}
        if cluster_interval is not None:
            self.env[CLUSTER_ENV] = cluster_interval
        self.view = cluster_interval is None or float(cluster_interval) > 0
        self.marks = workdir / "marks"
        self.marks.mkdir(parents=True, exist_ok=True)
        self.stop_file, self.hang_file = workdir / "stop", workdir / "hang"
        self.run_id = f"ag{uuid.uuid4().hex[:8]}"
        self.agents: list[Agent] = []
        self.killed: Agent | None = None
        self.proxy: storeproxy.Proxy | None = None
        self.etcd: subprocess.Popen[bytes] | None = None
        self.etcd_port = etcd_port
        self.store_port = 0  # where the store itself listens (the probe goes there)
        self.started = 0.0

    # ------------------------------------------------------------------ processes

    def _start_etcd(self) -> int:
        exe = shutil.which("etcd")
        if exe is None:
            raise Failed("etcd is not installed")
        client, peer = free_port(), free_port()
        data = self.workdir / "etcd"
        argv = [exe, "--enable-v2", "--data-dir", str(data)]
        argv += ["--listen-client-urls", f"http://127.0.0.1:{client}"]
        argv += ["--advertise-client-urls", f"http://127.0.0.1:{client}"]
        argv += ["--listen-peer-urls", f"http://127.0.0.1:{peer}"]
        argv += ["--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"]
        argv += ["--initial-cluster", f"default=http://127.0.0.1:{peer}"]
        # Without the bed's token: the store outlives the agents' sweep, and is stopped last.
        env = {k: v for k, v in self.env.items() if k != self.token_var}
        with open(self.workdir / "etcd.log", "wb") as err:
            self.etcd = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)

        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", client), timeout=1) as s:
                    s.sendall(b"GET /version HTTP/1.0\r\n\r\n")
                    return b"etcdserver" in s.recv(4096)
            except OSError:
                return False

        wait_until(up, 30, "etcd to answer")
        return client

    def _agent_cmd(self, i: int, endpoint: str) -> list[str]:
        return [
            self.python,
            "-m",
            "tui_launch",
            "--no-tui",
            "--nnodes",
            f"{self.n - 1}:{self.n}",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            self.backend,
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            self.run_id,
            "--rdzv-conf",
            self.rdzv_conf,
            "--max-restarts",
            "1",
            "--control-socket",
            "--journal",
            str(self.workdir / f"agent{i}.jsonl"),
            "--log-dir",
            str(self.workdir / f"logs{i}"),
            str(WORKLOAD),
            str(self.marks),
            str(self.stop_file),
            str(self.hang_file),
        ]

    def _spawn(self, i: int, endpoint: str) -> Agent:
        output = self.workdir / f"agent{i}.txt"
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                self._agent_cmd(i, endpoint),
                cwd=self.workdir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        agent = Agent(i, proc, self.workdir / f"agent{i}.jsonl", output)
        self.agents.append(agent)
        return agent

    def start(self) -> None:
        """Start the store (etcd), the proxy and the N agents; agent 0 first."""
        self.started = time.time()
        if self.backend == "c10d":
            self.store_port = free_port()
            host = self._spawn(HOST, f"127.0.0.1:{self.store_port}")
            self.proxy = storeproxy.Proxy(self.store_port, storeproxy.TCPStoreReader).start()
            # Agent 0 hosts the store on its port: only then may the others connect.
            wait_until(
                lambda: host.proc.poll() is not None or _listening(self.store_port),
                120,
                "agent 0 to host the c10d store",
            )
            if host.proc.poll() is not None:
                raise Failed(f"agent 0 exited: {host.text()[-2000:]}")
        else:
            self.store_port = self.etcd_port or self._start_etcd()
            self.proxy = storeproxy.Proxy(self.store_port, storeproxy.HTTPReader).start()
            self._spawn(HOST, f"127.0.0.1:{self.proxy.port}")
        for i in range(1, self.n):
            self._spawn(i, f"127.0.0.1:{self.proxy.port}")
        self.log(f"  {self.n} agents started ({self.backend}, run {self.run_id})")

    def close(self, grace: float = 30.0) -> dict[str, Any]:
        """SIGTERM every agent, wait ``grace``, SIGKILL what is left; count the leftovers."""
        for a in self.agents:
            if a.proc.poll() is None:
                with contextlib.suppress(OSError):
                    a.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for a in self.agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(max(0.1, deadline - time.monotonic()))
        while token_pids(self.token_var, self.token) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = token_pids(self.token_var, self.token)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for a in self.agents:
            if a.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(a.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(10)
        if self.proxy is not None:
            self.proxy.close()
        if self.etcd is not None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(10)
        codes = {a.index: a.proc.poll() for a in self.agents}
        return {"leftover_processes": len(left), "exit_codes": codes}

    # ------------------------------------------------------------------ reading the job

    def records(self, prefix: str = "up_") -> list[dict[str, Any]]:
        """The workers' marks (``up_<pid>``, ``hung_<pid>``)."""
        out = []
        for p in self.marks.glob(prefix + "*"):
            if p.suffix != ".tmp":
                with contextlib.suppress(OSError, ValueError):
                    out.append(json.loads(p.read_text()))
        return out

    def world(self, size: int, since: float) -> list[dict[str, Any]] | None:
        """Every rank of a world of ``size`` up after ``since`` (None: not yet)."""
        recs = {r["rank"]: r for r in self.records() if r["world"] == size and r["t"] > since}
        return list(recs.values()) if len(recs) == size else None

    def alive(self) -> list[Agent]:
        """The agents still running."""
        return [a for a in self.agents if a.proc.poll() is None]

    def _check_alive(self, expected: Sequence[Agent]) -> None:
        dead = [a for a in expected if a.proc.poll() is not None]
        if dead:
            a = dead[0]
            raise Failed(f"agent {a.index} exited {a.proc.poll()}: {a.text()[-1500:]}")

    def node_of(self, agent: Agent) -> str:
        """The agent's node name in the cluster view (``addr:pid``)."""
        viewer = self.agents[VIEWER].cluster()
        for node in viewer:
            if node.endswith(f":{agent.pid}"):
                return node
        raise Failed(f"agent {agent.index} (pid {agent.pid}) is not in the viewer's cluster view")

    # ------------------------------------------------------------------ phases

    def form(self, timeout: float) -> dict[str, Any]:
        """Every rank up in a world of N, and (view on) the viewer's cluster view showing N
        running nodes."""
        viewer = self.agents[VIEWER]

        def formed() -> dict[str, Any] | None:
            self._check_alive(self.agents)
            recs = self.world(self.n, self.started)
            seen = viewer.cluster()
            running = [
                n for n, s in seen.items() if s["world"] == self.n and s["state"] == "running"
            ]
            if recs is None or (self.view and len(running) < self.n):
                return None
            return {"records": recs, "nodes": sorted(running)}

        got = wait_until(formed, timeout, f"{self.n} ranks up and {self.n} nodes in the view")
        up = max(r["t"] for r in got["records"])
        return {
            "seconds": round(up - self.started, 2),
            "view_seconds": round(time.time() - self.started, 2),
            "nodes_in_view": len(got["nodes"]),
            "group_ranks": sorted(r["group_rank"] for r in got["records"]),
            "loadavg": loadavg(),
        }

    def steady(self, window: float) -> dict[str, Any]:
        """Store traffic, torch's keep-alive latency, the agents' CPU and RSS over ``window`` s."""
        assert self.proxy is not None
        probe_out = self.workdir / f"probe-{time.monotonic_ns()}.json"
        with open(self.workdir / "probe.err", "ab") as err:
            probe = subprocess.Popen(
                [
                    self.python,
                    str(Path(__file__)),
                    "probe",
                    "--backend",
                    self.backend,
                    "--port",
                    str(self.store_port),
                    "--run-id",
                    self.run_id,
                    "--seconds",
                    str(window),
                    "--out",
                    str(probe_out),
                ],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        # Let the probe import torch and connect before the window opens.
        wait_until(
            lambda: probe_out.with_suffix(".ready").exists() or probe.poll() is not None,
            120,
            "the keep-alive probe to connect",
        )
        before = self.proxy.totals()
        cpu0 = {a.index: cpu_s(a.pid) for a in self.agents}
        t0 = time.monotonic()
        rss: dict[int, list[float]] = {a.index: [] for a in self.agents}
        while time.monotonic() - t0 < window:
            for a in self.agents:
                r = rss_mb(a.pid)
                if r is not None:
                    rss[a.index].append(r)
            time.sleep(1.0)
        elapsed = time.monotonic() - t0
        after = self.proxy.totals()
        cpu1 = {a.index: cpu_s(a.pid) for a in self.agents}
        self._check_alive(self.agents)
        try:
            probe.wait(window + 60)
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait()
        lat = json.loads(probe_out.read_text()) if probe_out.exists() else {}
        # The proxy carries N-1 agents (c10d: agent 0 reaches its own store directly).
        through = self.n - 1 if self.backend == "c10d" else self.n
        traffic = {}
        for who in (storeproxy.TUILAUNCH, storeproxy.TORCH):
            a, b = after.get(who, storeproxy.Totals()), before.get(who, storeproxy.Totals())
            scale = self.n / through / elapsed
            traffic[who] = {
                "requests_per_s": round((a.requests - b.requests) * scale, 1),
                "bytes_per_s": round((a.bytes - b.bytes) * scale),
                "sent_per_s": round((a.sent - b.sent) * scale),
                "received_per_s": round((a.received - b.received) * scale),
                "by_op_per_s": {
                    op: round((n - b.by_op.get(op, 0)) * scale, 2) for op, n in a.by_op.items()
                },
                "connections": a.connections,
            }
        cpu = {
            i: round(100 * (cpu1[i] - cpu0[i]) / elapsed, 2)
            for i in cpu0
            if cpu0[i] is not None and cpu1[i] is not None
        }
        agent_rss = {i: round(max(v), 1) for i, v in rss.items() if v}
        return {
            "window_s": round(elapsed, 1),
            "store": traffic,
            "store_unparsed_connections": self.proxy.unparsed,
            "keep_alive_ms": lat,
            "viewer_cpu_pct": cpu.get(VIEWER),
            "viewer_rss_mb": agent_rss.get(VIEWER),
            "host_cpu_pct": cpu.get(HOST),
            "host_rss_mb": agent_rss.get(HOST),
            "median_agent_cpu_pct": statistics.median(cpu.values()) if cpu else None,
            "median_agent_rss_mb": statistics.median(agent_rss.values()) if agent_rss else None,
            "agents_cpu_pct": cpu,
            "agents_rss_mb": agent_rss,
            "loadavg": loadavg(),
        }

    def lose_one(self, timeout: float) -> dict[str, Any]:
        """SIGKILL the last agent; the others restart as a world of N-1."""
        victim = self.agents[-1]
        node = self.node_of(victim)
        workers = descendants(victim.pid)
        survivors = [a for a in self.agents if a is not victim]
        t0 = time.time()
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(30)
        self.killed = victim
        self.log(f"  SIGKILLed agent {victim.index} (node {node})")

        def workers_gone() -> bool:
            return all(not Path(f"/proc/{p}").exists() or _zombie(p) for p in workers)

        gone: list[float] = []

        def back() -> list[dict[str, Any]] | None:
            self._check_alive(survivors)
            if not gone and workers_gone():
                gone.append(time.time() - t0)
            return self.world(self.n - 1, t0)

        recs = wait_until(back, timeout, f"the {self.n - 1} survivors' ranks up in a world of them")
        up = max(r["t"] for r in recs)
        if not gone:
            with contextlib.suppress(Failed):
                wait_until(workers_gone, 30, "the killed agent's workers to go", poll=0.1)
                gone.append(time.time() - t0)
        gone_in = round(gone[0], 1) if gone else None

        def told(a: Agent) -> bool:
            return any(
                e["group_world_size"] == self.n - 1 and node in e["left"] and e["wall"] >= t0
                for e in a.events("node_change")
            )

        wait_until(lambda: all(told(a) for a in survivors), 60, "every survivor's node_change")
        viewer = self.agents[VIEWER]

        def view_after() -> dict[str, Any] | None:
            seen = viewer.cluster()
            rest = [
                k for k, v in seen.items() if v["world"] == self.n - 1 and v["state"] == "running"
            ]
            if len(rest) < self.n - 1 or not seen.get(node, {}).get("lost"):
                return None
            return {"running": len(rest), "lost": node}

        # The view marks the lost node (its record stops changing: LOST after 5 intervals)
        # and shows the others running in the smaller world.
        view = wait_until(view_after, 60, "the viewer to show the lost node and the rest")
        causes = {}
        for a in survivors:
            causes[a.index] = [e["cause"] for e in a.events("restart") if e["wall"] >= t0]
        lost_lines = sum("node lost:" in a.text() for a in survivors)
        return {
            "killed_node": node,
            "seconds": round(up - t0, 2),
            "restart_causes": causes,
            "survivors_told": len(survivors),
            "view_running": view["running"],
            "view_lost": view["lost"],
            "view_after_s": round(time.time() - t0, 1),
            "survivors_saying_node_lost": lost_lines,
            "killed_workers_gone_s": gone_in,
            "loadavg": loadavg(),
        }

    def hang_and_dump(self, timeout: float) -> dict[str, Any]:
        """Hang a rank on another node than the viewer's; ``ctl dump`` on the viewer; the
        job-wide verdict must name it."""
        viewer = self.agents[VIEWER]
        size = self.n - 1 if self.killed is not None else self.n
        recs = self.world(size, self.started)
        if recs is None:
            raise Failed(f"no world of {size} to hang a rank in")
        mine = set(descendants(viewer.pid))
        host_pids = set(descendants(self.agents[HOST].pid))
        others = [r for r in recs if r["pid"] not in mine and r["pid"] not in host_pids]
        target = max(others, key=lambda r: r["rank"])
        rank, restart = target["rank"], target["restart"]
        tmp = self.hang_file.with_suffix(".tmp")
        tmp.write_text(f"{rank} {restart}\n")
        os.replace(tmp, self.hang_file)
        wait_until(
            lambda: any(r["pid"] == target["pid"] for r in self.records("hung_")),
            60,
            f"rank {rank} to hang",
        )
        time.sleep(1.0)  # the other ranks reach the all_reduce it never joins (0.2 s steps)
        before = {e.get("request") for e in viewer.events("job_stacks")}
        t0 = time.time()
        ctl = subprocess.run(
            [self.python, "-m", "tui_launch", "ctl", str(viewer.pid), "dump"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        ctl_s = time.time() - t0
        if ctl.returncode != 0:
            raise Failed(f"ctl dump exited {ctl.returncode}: {(ctl.stdout + ctl.stderr)[-800:]}")

        def gathered() -> dict[str, Any] | None:
            new = [e for e in viewer.events("job_stacks") if e.get("request") not in before]
            return new[-1] if new else None

        e = wait_until(gathered, timeout, "the job-wide dump on the viewer")
        ranks = sorted(r["global_rank"] for r in e["ranks"])
        return {
            "hung_rank": rank,
            "hung_pid": target["pid"],
            "verdict": e["verdict"],
            "odd_ranks": e["odd_ranks"],
            "ranks": ranks,
            "nodes": len(e["nodes"]),
            "missing": e["missing"],
            "dump_to_verdict_s": round(e["wall"] - t0, 2),
            "ctl_s": round(ctl_s, 2),
            "ctl_output": ctl.stdout.strip()[-300:],
            "node_dump_s": sorted(round(n.get("duration", 0.0), 2) for n in e["nodes"]),
            "loadavg": loadavg(),
        }


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ---------------------------------------------------------------------- keep-alive probe


def probe(args: argparse.Namespace) -> int:
    """Time torch's own rendezvous backend calls (``get_state``, then ``set_state`` of the
    same state with its token: a keep-alive's two store operations) every ``interval`` s."""
    from datetime import timedelta

    if args.backend == "c10d":
        from torch.distributed import TCPStore
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )

        store = TCPStore(
            "127.0.0.1",
            args.port,
            is_master=False,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )
        backend: Any = C10dRendezvousBackend(store, args.run_id)
    else:
        import etcd
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import (
            EtcdRendezvousBackend,
        )

        client = etcd.Client(host="127.0.0.1", port=args.port, read_timeout=60)
        backend = EtcdRendezvousBackend(client, args.run_id, key_prefix="/torch/elastic/rendezvous")
    out = Path(args.out)
    out.with_suffix(".ready").touch()
    gets: list[float] = []
    sets: list[float] = []
    state_bytes: list[int] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        got = backend.get_state()
        gets.append((time.perf_counter() - t) * 1000)
        if got is not None:
            state, token = got
            state_bytes.append(len(state))
            t = time.perf_counter()
            backend.set_state(state, token)
            sets.append((time.perf_counter() - t) * 1000)
        time.sleep(args.interval)

    def summary(xs: list[float]) -> dict[str, Any]:
        return {
            "n": len(xs),
            "p50": round(quantile(xs, 0.5) or 0, 2),
            "p99": round(quantile(xs, 0.99) or 0, 2),
            "max": round(max(xs), 2) if xs else None,
        }

    result = {
        "get_state": summary(gets),
        "set_state": summary(sets),
        "keep_alive": summary([g + s for g, s in zip(gets, sets, strict=False)]),
        "state_bytes": max(state_bytes) if state_bytes else None,
    }
    out.write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------- the benchmark


def agents_env(workdir: Path) -> dict[str, str]:
    """The agents' environment: ours, less what changes a launch; a run index of their own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "TORCH_DISABLE_SHARE", "SLURM_"))
        and k not in ("OMP_NUM_THREADS", "LOGLEVEL", "MASTER_ADDR", "MASTER_PORT", CLUSTER_ENV)
    }
    index = workdir / "index"
    index.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(index)
    env["XDG_STATE_HOME"] = str(index)
    env["TMPDIR"] = str(workdir)
    return env


def scenario(n: int, backend: str, args: argparse.Namespace, view: bool = True) -> dict[str, Any]:
    """One bed of ``n`` agents through the phases; every phase's figures, or where it failed."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tlagents{n}{backend[:2]}_"))
    bed = Bed(
        n,
        backend,
        workdir,
        env=agents_env(workdir),
        python=args.python,
        rdzv_conf=args.rdzv_conf,
        cluster_interval=None if view else "0",
    )
    result: dict[str, Any] = {"nodes": n, "backend": backend, "cluster_view": view}
    phase = "start"
    try:
        bed.start()
        phase = "form"
        result["form"] = bed.form(args.form_timeout)
        _say(f"  formed in {result['form']['seconds']} s")
        phase = "steady"
        result["steady"] = bed.steady(args.window)
        _say(f"  steady: {json.dumps(_brief(result['steady']))}")
        if view:
            phase = "lost"
            result["lost"] = bed.lose_one(args.form_timeout)
            _say(f"  lost node: back in {result['lost']['seconds']} s")
            phase = "dump"
            result["dump"] = bed.hang_and_dump(60)
            _say(
                f"  dump -> verdict {result['dump']['dump_to_verdict_s']} s: "
                f"{result['dump']['verdict'][:120]}"
            )
        result["ok"] = True
    except (Failed, subprocess.TimeoutExpired, OSError) as e:
        result["ok"] = False
        result["failed"] = {"phase": phase, "error": str(e)[:3000]}
        _say(f"  FAILED in {phase}: {str(e)[:500]}")
        result["outputs"] = {a.index: a.text()[-3000:] for a in bed.agents[:3]}
    finally:
        result["close"] = bed.close()
        _say(f"  closed: {result['close']}")
        if args.keep:
            result["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def _brief(s: dict[str, Any]) -> dict[str, Any]:
    tl = s["store"][storeproxy.TUILAUNCH]
    return {
        "tuilaunch_req_s": tl["requests_per_s"],
        "tuilaunch_B_s": tl["bytes_per_s"],
        "keep_alive_p50_p99_ms": [
            s["keep_alive_ms"].get("keep_alive", {}).get(k) for k in ("p50", "p99")
        ],
        "viewer_cpu_pct": s["viewer_cpu_pct"],
        "viewer_rss_mb": s["viewer_rss_mb"],
    }


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of every scenario."""
    head = (
        "| N | backend | view | formed s | tuilaunch store req/s | tuilaunch B/s | torch req/s | "
        "torch B/s | keep-alive p50 / p99 ms | viewer CPU % | viewer RSS MiB | lost node -> "
        "back s | dump -> verdict s | verdict | load (1 min) | ok |"
    )
    rows = [head, "|" + "---|" * 16]
    for r in results:
        st, lo, du = r.get("steady", {}), r.get("lost", {}), r.get("dump", {})
        tl = st.get("store", {}).get(storeproxy.TUILAUNCH, {})
        to = st.get("store", {}).get(storeproxy.TORCH, {})
        ka = st.get("keep_alive_ms", {}).get("keep_alive", {})
        loads = [p.get("loadavg", [None])[0] for p in (r.get("form", {}), st, lo, du) if p]
        rows.append(
            "| "
            + " | ".join(
                str(x)
                for x in (
                    r["nodes"],
                    r["backend"],
                    "on" if r["cluster_view"] else "off",
                    r.get("form", {}).get("seconds", "-"),
                    tl.get("requests_per_s", "-"),
                    tl.get("bytes_per_s", "-"),
                    to.get("requests_per_s", "-"),
                    to.get("bytes_per_s", "-"),
                    f"{ka.get('p50', '-')} / {ka.get('p99', '-')}",
                    st.get("viewer_cpu_pct", "-"),
                    st.get("viewer_rss_mb", "-"),
                    lo.get("seconds", "-"),
                    du.get("dump_to_verdict_s", "-"),
                    (du.get("verdict", "-")[:60] + "...") if du else "-",
                    "-".join(f"{x:.1f}" for x in loads if x is not None) or "-",
                    "yes" if r.get("ok") else f"**no** ({r.get('failed', {}).get('phase')})",
                )
            )
            + " |"
        )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The benchmark's options (``probe`` is the keep-alive probe's own subcommand)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    pr = sub.add_parser("probe", help="(internal) time torch's keep-alive store operations")
    pr.add_argument("--backend", choices=BACKENDS, required=True)
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--run-id", required=True)
    pr.add_argument("--seconds", type=float, default=30.0)
    pr.add_argument("--interval", type=float, default=0.5)
    pr.add_argument("--out", required=True)
    p.add_argument("--nodes", default="4,8,16", help="N agents per run, comma-separated")
    p.add_argument("--backends", default="c10d,etcd-v2", help="c10d, etcd-v2 or both")
    p.add_argument("--window", type=float, default=30.0, help="seconds of the steady window")
    p.add_argument("--form-timeout", type=float, default=600.0)
    p.add_argument("--rdzv-conf", default=RDZV_CONF)
    p.add_argument(
        "--views", default="on", help="the cluster view on, off (form + steady only) or on,off"
    )
    p.add_argument("--baseline", action="store_true", help="the same as --views on,off")
    p.add_argument("--quick", action="store_true", help="N=4, c10d, a 10 s window")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--name", default="agents")
    p.add_argument("--results-dir", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.command is None and args.quick:
        args.nodes, args.backends, args.window = "4", "c10d", 10.0
    if args.baseline:
        args.views = "on,off"
    return args


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
    sys.exit(143)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every (N, backend) in turn; print the table; write the JSON."""
    args = parse_args(argv)
    if args.command == "probe":
        return probe(args)
    # SIGTERM (a timeout, a person) unwinds like ^C: every bed is closed, nothing is left.
    signal.signal(signal.SIGTERM, _on_sigterm)
    nodes = [int(x) for x in args.nodes.split(",") if x]
    backends = [b for b in args.backends.split(",") if b]
    views = [v == "on" for v in args.views.split(",") if v]
    bad = [b for b in backends if b not in BACKENDS]
    if bad or any(n < 3 for n in nodes) or not set(args.views.split(",")) <= {"on", "off"}:
        print(
            f"agents.py: error: backends from {BACKENDS}, N >= 3, --views on,off", file=sys.stderr
        )
        return 2
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "git_commit": commit,
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": loadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results = []
    for n in nodes:
        for backend in backends:
            for view in views:
                _say(
                    f"N={n} {backend} cluster view {'on' if view else 'off'} "
                    f"(load {loadavg()[0]:.1f})"
                )
                results.append(scenario(n, backend, args, view))
    meta["loadavg_at_end"] = loadavg()
    md = table(results)
    print(md)
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    _say(f"results: {path}")
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
