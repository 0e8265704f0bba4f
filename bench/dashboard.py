"""Benchmark tuilaunch's dashboard against headless torchrun, on the same machine, in the same run.

The dashboard needs a terminal: every tuilaunch launch here runs in a detached tmux session of
its own (``tmux -S <private socket>``, 160x45, no status line, ``remain-on-exit``), with stdout,
stderr and stdin on the pane, so the dashboard really draws and reads keys. torchrun runs
headless, its output to a file. Both are started by the same small ``sh`` wrapper::

    date +%s.%N > t0
    /usr/bin/time -f '%e %U %S' -o time.txt python -m <launcher> ... [> output.txt 2>&1]
    echo $? > rc
    date +%s.%N > t1

so wall time (``t1 - t0``) and the CPU time of the launcher with everything it waited for
(``time.txt``) are taken the same way for both.

Three measurements:

``cpu``
    The launcher process's own CPU (``utime + stime`` of its ``/proc/<pid>/stat``: for tuilaunch
    that is the dashboard, the agent and the log tailer together) while 8 ranks run a steady
    training loop (``workloads/steady.py``: gloo all_reduce steps, a line every 0.5 s per rank),
    sampled over a window of the steady state (65 s to 85 s after the loop began: past the
    first minute, when the dashboard's uptimes stop counting seconds), as % of one core.
    Launchers: torchrun (its agent), tuilaunch at the default 4 Hz, tuilaunch --refresh-hz 1.
    Target: tuilaunch <= 3 % of one core at 4 Hz.

``launch``
    Wall time of the no-op job (``workloads/noop.py``) under the dashboard
    (``--exit-on-finish``) and under torchrun, nproc 2 and 4. Target: ratio <= 1.15.

``flood``
    4 ranks x 200,000 lines of 100 bytes, written flat out (``workloads/flood.py``). Workers'
    wall = max(end) - min(start) from the ranks' own clocks, under the dashboard and under
    ``torchrun --redirects 3``; target: ratio <= 1.05. Also the launcher's CPU seconds during
    the flood and until it is idle again, and, in a third interleaved launch (the dashboard
    with key probes, kept apart so that the probing's own CPU does not slow the workers of the
    measured launch), key latency: ``?`` is sent and the pane captured every ~10 ms until the
    help screen's title "tuilaunch keys" shows; Escape closes it; 3 probes, spaced, from the
    moment the flood starts. Target: <= 200 ms, max and median.

How: launchers interleaved (A, B, A, B; ``--abba`` flips the order every other round),
``--warmup`` rounds thrown away (``launch`` only), medians of ``--repeat`` samples, ratios of
medians and medians of per-round ratios. Every sample records the load average and the share of
the CPUs that other processes used meanwhile (``/proc/stat`` busy time minus ours), with the
busiest of them for ``cpu``. Every process of a launch carries a token in its environment
(the tmux server and pane included); after each launch, on a timeout, ^C or SIGTERM, the tmux
server is killed and whatever still carries the token is killed and counted, as in ``run.py``,
whose helpers (and frozen copy of ``tui_launch/``) this reuses.

Output: a markdown report on stdout (progress on stderr) and
``bench/results/dashboard-<command>-<timestamp>.json``.

Usage::

    .venv/bin/python bench/dashboard.py cpu --repeat 3
    .venv/bin/python bench/dashboard.py launch --repeat 5
    .venv/bin/python bench/dashboard.py flood --repeat 5
    .venv/bin/python bench/dashboard.py all
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as harness
from run import (
    Settings,
    SetupError,
    base_env,
    busy_cpu_s,
    kill_token,
    median,
    ratio,
    rel_mad,
    settle,
    snapshot_code,
    token_pids,
    verdict,
)

BENCH = harness.BENCH
WORKLOADS = harness.WORKLOADS
RESULTS = harness.RESULTS
TMUX = shutil.which("tmux") or "/usr/bin/tmux"
GNU_TIME = "/usr/bin/time"
CLK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1

CPU_TARGET_PCT = 3.0
LAUNCH_TARGET = 1.15
FLOOD_TARGET = 1.05
KEY_TARGET_S = 0.200
HELP_TITLE = "tuilaunch keys"

Sample = dict[str, Any]


# --------------------------------------------------------------------------- /proc


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """(comm, fields after the comm) of ``/proc/<pid>/stat``; fields[0] is the state."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            data = fp.read()
    except OSError:
        return None
    close = data.rindex(")")
    return data[data.index("(") + 1 : close], data[close + 2 :].split()


def proc_cpu(pid: int) -> float | None:
    """utime + stime of one process (not its children), in seconds."""
    st = _stat(pid)
    if st is None:
        return None
    f = st[1]
    return (int(f[11]) + int(f[12])) / CLK


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return [x.decode(errors="replace") for x in fp.read().split(b"\0") if x]
    except OSError:
        return []


def all_cpu() -> dict[int, tuple[str, float]]:
    """Every process: pid -> (comm, utime + stime)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out[int(entry)] = (st[0], (int(st[1][11]) + int(st[1][12])) / CLK)
    return out


def own_cpu() -> float:
    """CPU of this harness and what it waited for (tmux clients, py-spy)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def loadavg() -> list[float]:
    return list(os.getloadavg())


@dataclass
class Mark:
    """The machine at one instant: for the share of CPU other processes used in a window."""

    wall: float = field(default_factory=time.time)
    busy: float = field(default_factory=busy_cpu_s)
    mine: float = field(default_factory=own_cpu)
    load: list[float] = field(default_factory=loadavg)
    procs: dict[int, tuple[str, float]] | None = None

    @classmethod
    def full(cls) -> Mark:
        m = cls()
        m.procs = all_cpu()
        return m


def noise(a: Mark, b: Mark, ours_s: float, ours_pids: set[int] | None = None) -> dict[str, Any]:
    """Other processes' CPU between two marks: busy time minus ours (launch + harness)."""
    wall = max(1e-9, b.wall - a.wall)
    foreign = max(0.0, (b.busy - a.busy) - ours_s - (b.mine - a.mine))
    out: dict[str, Any] = {
        "window_s": wall,
        "loadavg1": b.load[0],
        "foreign_cpu_s": foreign,
        "foreign_share": foreign / (wall * NCPU),
        "harness_cpu_s": b.mine - a.mine,
    }
    if a.procs is not None and b.procs is not None:
        skip = (ours_pids or set()) | {os.getpid()}
        deltas = []
        for pid, (comm, cpu) in b.procs.items():
            if pid in skip:
                continue
            before = a.procs.get(pid)
            d = cpu - before[1] if before and before[0] == comm else cpu
            if d > 0:
                deltas.append((d, pid, comm))
        deltas.sort(reverse=True)
        out["busiest_others"] = [
            {"pid": pid, "comm": comm, "pct_of_core": 100 * d / wall} for d, pid, comm in deltas[:3]
        ]
    return out


# --------------------------------------------------------------------------- one launch


@dataclass(frozen=True)
class Kind:
    """A way of launching: which module, in tmux or headless, with which extra options."""

    name: str
    module: str
    tui: bool
    options: tuple[str, ...] = ()


TORCHRUN = Kind("torchrun", "torch.distributed.run", tui=False)


def tuilaunch(name: str, *options: str) -> Kind:
    return Kind(name, "tui_launch", tui=True, options=options)


class Tmux:
    """A private tmux server (own socket and config) with one detached session."""

    def __init__(self, tmp: Path, width: int = 160, height: int = 45) -> None:
        self.sock = str(tmp / "tmux.sock")
        self.conf = tmp / "tmux.conf"
        self.conf.write_text(
            "set -g remain-on-exit on\n"
            "set -g status off\n"
            'set -g default-terminal "tmux-256color"\n'
            "set -sg escape-time 0\n"
            "set -g history-limit 100\n"
        )
        self.name = "tlbench"
        self.size = (width, height)
        self.server_pid: int | None = None

    def _run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TMUX, "-S", self.sock, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )

    def start(self, command: str, env: dict[str, str]) -> None:
        """Start the server with ``env`` (the token included: the pane inherits it)."""
        w, h = self.size
        r = self._run(
            "new-session", "-d", "-s", self.name, "-x", str(w), "-y", str(h), command, env=env
        )
        if r.returncode != 0:
            raise RuntimeError(f"tmux new-session failed: {r.stderr.strip()}")
        pid = self._run("display-message", "-p", "-t", self.name, "#{pid}").stdout.strip()
        self.server_pid = int(pid) if pid.isdigit() else None

    def capture(self) -> str:
        return self._run("capture-pane", "-p", "-t", self.name).stdout

    def send(self, *keys: str, literal: bool = False) -> None:
        self._run("send-keys", "-t", self.name, *(["-l"] if literal else []), *keys)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self._run("kill-server")


class Job:
    """One launch in a ``sh`` wrapper: in a tmux pane (tuilaunch) or headless (torchrun)."""

    def __init__(
        self,
        kind: Kind,
        nproc: int,
        script: Path,
        script_args: Sequence[str],
        settings: Settings,
        launcher_args: Sequence[str] = (),
    ) -> None:
        self.kind = kind
        self.token = uuid.uuid4().hex
        self.tmp = Path(tempfile.mkdtemp(prefix="tlbench_dash_"))
        self.marks = self.tmp / "marks"
        self.marks.mkdir()
        self.settings = settings
        cmd = [
            settings.python,
            "-m",
            kind.module,
            *kind.options,
            *launcher_args,
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--log-dir",
            str(self.tmp / "logs"),
            str(script),
            str(self.marks),
            *script_args,
        ]
        t = self.tmp
        timed = f"{GNU_TIME} -f '%e %U %S' -o {t / 'time.txt'} {shlex.join(cmd)}"
        if not kind.tui:
            timed += f" > {t / 'output.txt'} 2>&1"
        self.shell = (
            f"cd {t} && date +%s.%N > {t / 't0'}; {timed}; echo $? > {t / 'rc'}; "
            f"date +%s.%N > {t / 't1'}"
        )
        self.env = base_env(self.token, {}, settings.pythonpath)
        self.tmux: Tmux | None = Tmux(t) if kind.tui else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.launcher: int | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self.tmux is not None:
            self.tmux.start(self.shell, self.env)
        else:
            self.proc = subprocess.Popen(
                ["sh", "-c", self.shell],
                cwd=self.tmp,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

    def done(self) -> bool:
        """Whether the wrapper has written t1 (whole: date's line ends with a newline)."""
        try:
            return (self.tmp / "t1").read_text().endswith("\n")
        except OSError:
            return False

    def find_launcher(self, timeout: float = 30.0) -> int | None:
        """The launcher's pid: the token process running ``python -m <module>``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done():
            for pid in token_pids(self.token):
                cmd = cmdline(pid)
                # cmd[1:3], not any "-m": /usr/bin/time's command line holds the same words.
                if cmd[1:3] == ["-m", self.kind.module]:
                    self.launcher = pid
                    return pid
            time.sleep(0.05)
        return None

    def marks_of(self, prefix: str) -> dict[int, str]:
        out = {}
        for p in self.marks.glob(f"{prefix}_*"):
            with contextlib.suppress(OSError, ValueError):
                out[int(p.name.split("_", 1)[1])] = p.read_text()
        return out

    def wait_marks(self, prefix: str, n: int, deadline: float) -> dict[int, str] | None:
        """All ``n`` ranks' ``prefix_<rank>`` marks, or None at the deadline / launcher's end."""
        while time.monotonic() < deadline:
            found = self.marks_of(prefix)
            if len(found) >= n and all(found.values()):
                return found
            if self.done():
                return None
            time.sleep(0.02)
        return None

    def wait(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self.done():
                return True
            time.sleep(0.02)
        return self.done()

    def workers_alive(self) -> bool:
        script = str(self.tmp / "marks")
        return any(script in cmdline(pid) for pid in token_pids(self.token))

    def outcome(self) -> dict[str, Any]:
        """Wall (t1 - t0), exit status and /usr/bin/time's figures, as far as they exist."""

        def num(name: str) -> float | None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return float((self.tmp / name).read_text().split()[0])
            return None

        t0, t1, rc = num("t0"), num("t1"), num("rc")
        out: dict[str, Any] = {
            "wall_s": t1 - t0 if t0 is not None and t1 is not None else None,
            "exit_code": int(rc) if rc is not None else None,
            "t0": t0,
            "t1": t1,
        }
        with contextlib.suppress(OSError, ValueError, IndexError):
            last = (self.tmp / "time.txt").read_text().strip().splitlines()[-1].split()
            out["launch_cpu_s"] = float(last[1]) + float(last[2])  # launcher + waited children
        return out

    def tmux_cpu(self) -> float:
        if self.tmux is None or self.tmux.server_pid is None:
            return 0.0
        return proc_cpu(self.tmux.server_pid) or 0.0

    def output_tail(self) -> str:
        if self.tmux is not None:
            with contextlib.suppress(Exception):
                return self.tmux.capture()[-3000:]
            return ""
        with contextlib.suppress(OSError):
            return (self.tmp / "output.txt").read_bytes()[-3000:].decode(errors="replace")
        return ""

    def close(self) -> int:
        """Kill the tmux server and whatever is left of the launch; return the leftovers count."""
        try:
            if self.tmux is not None:
                self.tmux.kill()
            if self.proc is not None:
                if self.proc.poll() is None:
                    with contextlib.suppress(OSError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            return settle(self.token, grace=5.0)
        finally:
            if token_pids(self.token):  # still there: one more round, then give up
                kill_token(self.token)
            shutil.rmtree(self.tmp, ignore_errors=True)


@contextlib.contextmanager
def launched(job: Job) -> Any:
    """Start a job and always clean it up (also on ^C, SIGTERM, exceptions)."""
    try:
        job.start()
        yield job
    finally:
        job.leftovers = job.close()  # type: ignore[attr-defined]


def _times(marks: dict[int, str]) -> list[float]:
    return [float(v.split()[0]) for v in marks.values()]


def _progress(label: str, s: Sample, extra: str = "") -> None:
    state = "ok" if s.get("ok") else f"FAILED ({s.get('error') or s.get('exit_code')})"
    left = f" leftovers={s['leftover_processes']}" if s.get("leftover_processes") else ""
    nz = s.get("noise") or {}
    print(
        f"[{label} {s.get('round', '?')}] {s['launcher']:<16} {extra} {state}{left}"
        f" | load {nz.get('loadavg1', 0):.2f}, others {nz.get('foreign_share', 0):.0%} of CPUs",
        file=sys.stderr,
        flush=True,
    )


# --------------------------------------------------------------------------- cpu


def sample_cpu(kind: Kind, opts: argparse.Namespace, settings: Settings) -> Sample:
    """One steady run; the launcher's CPU over [w0, w1] s after the loop began."""
    s: Sample = {"launcher": kind.name, "nproc": opts.cpu_nproc, "ok": False}
    job = Job(
        kind,
        opts.cpu_nproc,
        WORKLOADS / "steady.py",
        [str(opts.seconds), str(opts.step)],
        settings,
    )
    w0, w1 = opts.window
    with launched(job):
        start = time.monotonic()
        pid = job.find_launcher()
        starts = job.wait_marks("start", opts.cpu_nproc, start + opts.timeout)
        if pid is None or starts is None:
            s["error"] = "the loop never started" if pid else "no launcher process"
            s["output_tail"] = job.output_tail()
        else:
            loop0 = min(_times(starts))
            s["startup_s"] = loop0 - (job.outcome()["t0"] or loop0)
            time.sleep(max(0.0, loop0 + w0 - time.time()))
            ours0 = {p: proc_cpu(p) for p in token_pids(job.token)}
            a = Mark.full()
            c0 = proc_cpu(pid)
            series = []
            while time.time() < loop0 + w1 and not job.done():
                time.sleep(min(1.0, max(0.0, loop0 + w1 - time.time())))
                series.append((time.time() - loop0, proc_cpu(pid)))
            c1 = proc_cpu(pid)
            ours1 = {p: proc_cpu(p) for p in token_pids(job.token)}
            b = Mark.full()
            wall = b.wall - a.wall
            if c0 is None or c1 is None or job.done() or wall < 0.5 * (w1 - w0):
                s["error"] = "the launch ended before the window did"
            else:
                deltas = {
                    p: (ours1[p] or 0.0) - (ours0.get(p) or 0.0)
                    for p in ours1
                    if ours1[p] is not None
                }
                groups: dict[str, float] = collections.defaultdict(float)
                for p, d in deltas.items():
                    cmd = " ".join(cmdline(p))
                    if p == pid:
                        g = "launcher"
                    elif str(job.marks) in cmd:
                        g = "workers"
                    elif job.tmux is not None and p == job.tmux.server_pid:
                        g = "tmux"
                    else:
                        g = "other"  # tuilaunch's reaper, sh, /usr/bin/time
                    groups[g] += d
                s.update(
                    ok=True,
                    window=[w0, w1],
                    window_s=wall,
                    launcher_cpu_s=c1 - c0,
                    launcher_pct=100 * (c1 - c0) / wall,
                    workers_pct=100 * groups["workers"] / wall,
                    tmux_pct=100 * groups["tmux"] / wall,
                    helpers_pct=100 * groups["other"] / wall,
                    series=[
                        (round(t, 2), round(100 * (c - p) / (t - tp), 2))
                        for (tp, p), (t, c) in zip([(w0, c0), *series[:-1]], series, strict=True)
                        if c is not None and p is not None and t > tp
                    ],
                    noise=noise(a, b, sum(deltas.values()), set(ours1)),
                )
        deadline = time.monotonic() + opts.seconds + opts.timeout
        if s["ok"] and not job.wait(deadline):
            s.update(ok=False, error="did not finish in time")
        s.update(job.outcome())
        if s["ok"] and s["exit_code"] != 0:
            s.update(ok=False, error=f"exit {s['exit_code']}", output_tail=job.output_tail())
    s["leftover_processes"] = job.leftovers  # type: ignore[attr-defined]
    return s


def bench_cpu(opts: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    kinds = [
        TORCHRUN,
        tuilaunch("tuilaunch", "--exit-on-finish"),
        tuilaunch(
            f"tuilaunch {opts.slow_hz:g}Hz", "--exit-on-finish", "--refresh-hz", f"{opts.slow_hz:g}"
        ),
    ]
    samples = []
    for r in range(opts.repeat):
        order = kinds[::-1] if opts.abba and r % 2 else kinds
        for kind in order:
            s = sample_cpu(kind, opts, settings)
            s["round"] = r
            samples.append(s)
            _progress(
                "cpu",
                s,
                f"launcher {s.get('launcher_pct', float('nan')):5.2f}% of a core"
                f" (workers {s.get('workers_pct', float('nan')):.0f}%)",
            )
    rows = []
    base = None
    for kind in kinds:
        mine = [s for s in samples if s["launcher"] == kind.name and s["ok"]]
        vals = [s["launcher_pct"] for s in mine]
        row = {
            "launcher": kind.name,
            "options": list(kind.options),
            **_stats(vals),
            "runs": sum(1 for s in samples if s["launcher"] == kind.name),
            "succeeded": len(mine),
            "workers_pct": median([s["workers_pct"] for s in mine]),
            "tmux_pct": median([s["tmux_pct"] for s in mine]),
            "helpers_pct": median([s["helpers_pct"] for s in mine]),
            "foreign_share": median([s["noise"]["foreign_share"] for s in mine]),
            "loadavg1": median([s["noise"]["loadavg1"] for s in mine]),
        }
        if kind is TORCHRUN:
            base = row["median"]
        else:
            row["minus_torchrun_pp"] = (
                row["median"] - base if row["median"] is not None and base is not None else None
            )
            row["ratio"] = ratio(row["median"], base)
        rows.append(row)
    profile = None
    if opts.py_spy:
        profile = profile_cpu(opts, settings)
    return {
        "target_pct_of_core": CPU_TARGET_PCT,
        "workload": {
            "script": "steady.py",
            "nproc": opts.cpu_nproc,
            "seconds": opts.seconds,
            "step_s": opts.step,
            "window": opts.window,
        },
        "summary": rows,
        "samples": samples,
        "profile": profile,
    }


def _stats(vals: Sequence[float]) -> dict[str, Any]:
    return {
        "median": median(vals),
        "min": min(vals) if vals else None,
        "max": max(vals) if vals else None,
        "rel_mad": rel_mad(vals),
    }


# --------------------------------------------------------------------------- py-spy


def py_spy(pid: int, seconds: float, out: Path, gil: bool) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [
            str(exe if exe.exists() else "py-spy"),
            "record",
            "-p",
            str(pid),
            "-d",
            str(max(1, int(seconds))),
            "-r",
            "100",
            "-f",
            "raw",
            "-o",
            str(out),
            "--nonblocking",
            "--threads",
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


_WRAPPERS = (
    "<module>",
    "main",
    "run_cli",
    "run_dashboard",
    "App.run",
    "invoke",
    "_invoke",
    "Thread.run",
    "Thread._bootstrap",
    "Thread._bootstrap_inner",
)


def _function(frame: str) -> tuple[str, str]:
    """``'f (path/file.py:12)'`` -> (``'f'``, ``'path/file.py'``)."""
    name, _, where = frame.rpartition(" (")
    return name, where.rstrip(")").rsplit(":", 1)[0]


def summarize_raw(path: Path, seconds: float, top: int = 15) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks: share of a core per thread, function, widget."""
    self_fn: collections.Counter[str] = collections.Counter()
    self_line: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    widgets: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        if frames[0].startswith(("thread", "process")):
            threads[frames[0].split(": ", 1)[-1]] += n
        code = [f for f in frames if " (" in f and not f.startswith(("thread", "process"))]
        if not code:
            continue
        name, where = _function(code[-1])
        self_fn[f"{name} ({where})"] += n
        self_line[code[-1]] += n
        seen, seen_w = set(), set()
        for f in code:
            name, where = _function(f)
            if any(k in where for k in ("tui_launch", "textual", "rich")) and (
                name not in _WRAPPERS
            ):
                seen.add(f"{name} ({where})")
            if "textual/widgets/" in where or where.endswith("textual/widget.py"):
                seen_w.add(name.split(".")[0])
        for key in seen:
            incl[key] += n
        for key in seen_w:
            widgets[key] += n

    def pct(n: int) -> float:
        return 100.0 * n / (100 * seconds)  # 100 Hz: samples / (rate * s) = share of a core

    return {
        "samples": total,
        "seconds": seconds,
        "active_pct_of_core": pct(total),
        "threads": [(t, pct(n)) for t, n in threads.most_common(8)],
        "self": [(f, pct(n)) for f, n in self_fn.most_common(top)],
        "self_lines": [(f, pct(n)) for f, n in self_line.most_common(top)],
        "inclusive": [(f, pct(n)) for f, n in incl.most_common(top)],
        "widgets": [(w, pct(n)) for w, n in widgets.most_common(10)],
    }


class Spy:
    """py-spy on one process, twice at once: the GIL holder only (what runs Python), and every
    thread that is not idle (running, or waiting for the GIL or a core)."""

    def __init__(self, pid: int, seconds: float, opts: argparse.Namespace, tag: str) -> None:
        self.seconds = seconds
        stamp = time.strftime("%Y%m%d-%H%M%S")
        Path(opts.results_dir).mkdir(parents=True, exist_ok=True)
        self.outs = {
            mode: Path(opts.results_dir) / f"pyspy-{tag}-{mode}-{stamp}.txt"
            for mode in ("gil", "active")
        }
        self.procs = {m: py_spy(pid, seconds, out, m == "gil") for m, out in self.outs.items()}

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seconds": self.seconds}
        for mode, proc in self.procs.items():
            try:
                _, err = proc.communicate(timeout=self.seconds + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            path = self.outs[mode]
            if path.exists():
                out[mode] = {"raw": str(path), **summarize_raw(path, self.seconds)}
            else:
                out[mode] = {"error": err.decode(errors="replace")[-500:]}
        return out


def profile_cpu(opts: argparse.Namespace, settings: Settings) -> dict[str, Any] | None:
    """An extra, unmeasured 4 Hz steady run with py-spy on the launcher over the window."""
    kind = tuilaunch("tuilaunch", "--exit-on-finish")
    job = Job(
        kind, opts.cpu_nproc, WORKLOADS / "steady.py", [str(opts.seconds), str(opts.step)], settings
    )
    w0, w1 = opts.window
    result = None
    with launched(job):
        pid = job.find_launcher()
        starts = job.wait_marks("start", opts.cpu_nproc, time.monotonic() + opts.timeout)
        if pid is not None and starts is not None:
            loop0 = min(_times(starts))
            time.sleep(max(0.0, loop0 + w0 - time.time()))
            result = Spy(pid, w1 - w0, opts, "cpu").result()
        job.wait(time.monotonic() + opts.seconds + opts.timeout)
    return result


# --------------------------------------------------------------------------- launch


def sample_launch(kind: Kind, n: int, opts: argparse.Namespace, settings: Settings) -> Sample:
    s: Sample = {"launcher": kind.name, "nproc": n, "ok": False}
    job = Job(kind, n, WORKLOADS / "noop.py", [], settings)
    with launched(job):
        a = Mark()
        finished = job.wait(time.monotonic() + opts.timeout)
        b = Mark()
        s.update(job.outcome())
        tmux_cpu = job.tmux_cpu()
        cpus = [float(v) for v in job.marks_of("cpu").values() if v]
        s["timed_out"] = not finished
        s["tmux_cpu_s"] = tmux_cpu
        if finished and s["exit_code"] == 0 and s["wall_s"] is not None:
            s["ok"] = True
            if len(cpus) == n and s.get("launch_cpu_s") is not None:
                s["launcher_cpu_s"] = s["launch_cpu_s"] - sum(cpus)
        else:
            s["error"] = "timeout" if not finished else f"exit {s['exit_code']}"
            s["output_tail"] = job.output_tail()
        s["noise"] = noise(a, b, (s.get("launch_cpu_s") or 0.0) + tmux_cpu)
    s["leftover_processes"] = job.leftovers  # type: ignore[attr-defined]
    return s


def bench_launch(opts: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    kinds = [TORCHRUN, tuilaunch("tuilaunch", "--exit-on-finish")]
    warm, samples = [], []
    for i in range(opts.warmup):
        for kind in kinds:
            s = sample_launch(kind, opts.launch_nproc[0], opts, settings)
            s["round"] = -1 - i
            warm.append(s)
            _progress("launch warmup", s, f"nproc {s['nproc']} wall {s.get('wall_s') or 0:.3f}s")
    for r in range(opts.repeat):
        for n in opts.launch_nproc:
            order = kinds[::-1] if opts.abba and r % 2 else kinds
            for kind in order:
                s = sample_launch(kind, n, opts, settings)
                s["round"] = r
                samples.append(s)
                _progress("launch", s, f"nproc {n} wall {s.get('wall_s') or 0:.3f}s")
    rows = []
    for n in opts.launch_nproc:
        row: dict[str, Any] = {"nproc": n}
        per_round: dict[str, dict[int, float]] = {}
        for kind in kinds:
            mine = [s for s in samples if s["nproc"] == n and s["launcher"] == kind.name]
            ok = [s for s in mine if s["ok"]]
            key = "tuilaunch" if kind.tui else "torchrun"
            per_round[key] = {s["round"]: s["wall_s"] for s in ok}
            row[key] = {
                **_stats([s["wall_s"] for s in ok]),
                "runs": len(mine),
                "succeeded": len(ok),
                "launcher_cpu_median": median(
                    [s["launcher_cpu_s"] for s in ok if s.get("launcher_cpu_s") is not None]
                ),
                "foreign_share": median([s["noise"]["foreign_share"] for s in mine]),
                "loadavg1": median([s["noise"]["loadavg1"] for s in mine]),
            }
        row["ratio"] = ratio(row["tuilaunch"]["median"], row["torchrun"]["median"])
        row["paired_ratio_median"] = median(
            [
                t / per_round["torchrun"][k]
                for k, t in per_round["tuilaunch"].items()
                if per_round["torchrun"].get(k)
            ]
        )
        spreads = [row[x]["rel_mad"] for x in ("torchrun", "tuilaunch") if row[x]["rel_mad"]]
        row["noise"] = max(spreads) if spreads else None
        rows.append(row)
    return {"target_ratio": LAUNCH_TARGET, "summary": rows, "warmup": warm, "samples": samples}


# --------------------------------------------------------------------------- flood


class CpuSampler(threading.Thread):
    """(time.time(), utime + stime) of one process every ``interval`` s, until stopped."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True, name="cpu-sampler")
        self.pid, self.interval = pid, interval
        self.points: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            c = proc_cpu(self.pid)
            if c is None:
                return
            self.points.append((time.time(), c))
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)

    def at(self, t: float) -> float | None:
        """CPU at time ``t`` (linear between samples; the last sample after the end)."""
        pts = self.points
        if not pts or t < pts[0][0]:
            return pts[0][1] if pts else None
        for (ta, ca), (tb, cb) in itertools.pairwise(pts):
            if ta <= t <= tb:
                return ca + (cb - ca) * (t - ta) / (tb - ta) if tb > ta else cb
        return pts[-1][1]


def probe_keys(job: Job, n: int, gap: float, timeout: float, poll: float) -> list[dict[str, Any]]:
    """Send ``?``, capture the pane every ``poll`` s until the help title shows, Escape; n times."""
    assert job.tmux is not None
    tmux = job.tmux
    probes = []
    for i in range(n):
        if i:
            time.sleep(gap)
        sent = time.time()
        t0 = time.perf_counter()
        tmux.send("?", literal=True)
        seen = None
        captures = 0
        while time.perf_counter() - t0 < timeout:
            c0 = time.perf_counter()
            screen = tmux.capture()
            captures += 1
            if HELP_TITLE in screen:
                seen = time.perf_counter() - t0
                break
            time.sleep(max(0.0, poll - (time.perf_counter() - c0)))
        e0 = time.perf_counter()
        tmux.send("Escape")
        closed = None
        while time.perf_counter() - e0 < timeout:
            c0 = time.perf_counter()
            if HELP_TITLE not in tmux.capture():
                closed = time.perf_counter() - e0
                break
            time.sleep(max(0.0, poll - (time.perf_counter() - c0)))
        probes.append(
            {
                "sent": sent,
                "latency_s": seen,
                "captures": captures,
                "capture_s": (seen / captures) if seen else None,
                "escape_closed_s": closed,
            }
        )
    return probes


def sample_flood(
    kind: Kind,
    opts: argparse.Namespace,
    settings: Settings,
    probes: int = 0,
    spy_seconds: float = 0.0,
) -> Sample:
    """One flood; workers' wall, the launcher's CPU, and (``probes``) key latencies."""
    n = opts.flood_nproc
    s: Sample = {"launcher": kind.name, "nproc": n, "lines": opts.lines, "ok": False}
    job = Job(kind, n, WORKLOADS / "flood.py", [str(opts.lines)], settings)
    with launched(job):
        a = Mark()
        deadline = time.monotonic() + opts.timeout
        pid = job.find_launcher()
        sampler = CpuSampler(pid) if pid is not None else None
        spy: Spy | None = None
        if sampler is not None:
            sampler.start()
        try:
            starts = job.wait_marks("start", n, deadline)
            if spy_seconds and starts is not None and pid is not None:
                spy = Spy(pid, spy_seconds, opts, "flood")
            if probes and starts is not None:
                s["probes"] = probe_keys(job, probes, opts.probe_gap, 10.0, opts.poll)
            ends = job.wait_marks("end", n, deadline) if starts is not None else None
            # torchrun exits by itself. The dashboard stays up (no --exit-on-finish) and keeps
            # reading the log files: its pane is looked at every --catchup-poll s until the
            # log view shows a rank's last line (or --catchup-timeout), then it is quit with q.
            caught_at = None
            view = None
            if job.tmux is not None and ends is not None:
                limit = min(deadline, time.monotonic() + opts.catchup_timeout)
                while time.monotonic() < limit and not job.done():
                    view = _log_view(job.tmux.capture(), opts.lines)
                    if view["caught_up"]:
                        caught_at = time.time()
                        break
                    time.sleep(opts.catchup_poll)
                s["final_view"] = view
                if caught_at is None and not job.done():
                    # Not there: is the view stuck, or the reading behind? f re-renders the
                    # view from the kept lines.
                    job.tmux.send("f", literal=True)
                    time.sleep(2.0)
                    s["view_after_f"] = _log_view(job.tmux.capture(), opts.lines)
            if ends is not None:  # the launcher's CPU is counted to --after s past the flood
                until = max(_times(ends)) + opts.after
                while time.time() < until and not job.done():
                    time.sleep(0.05)
            if job.tmux is not None and not job.done():
                job.tmux.send("q", literal=True)
            finished = job.wait(deadline)
        finally:
            if sampler is not None:
                sampler.stop()
            if spy is not None:
                s["profile"] = spy.result()
        b = Mark()
        s.update(job.outcome())
        tmux_cpu = job.tmux_cpu()
        s["noise"] = noise(a, b, (s.get("launch_cpu_s") or 0.0) + tmux_cpu)
        s["tmux_cpu_s"] = tmux_cpu
        if starts is None or ends is None or not finished:
            s["error"] = "timeout" if not finished else "the ranks did not all report"
            s["output_tail"] = job.output_tail()
        else:
            t_start, t_end = min(_times(starts)), max(_times(ends))
            s["workers_wall_s"] = t_end - t_start
            s["start_spread_s"] = max(_times(starts)) - t_start
            if sampler is not None and sampler.points:
                # From the flood's start to --after s past its end (torchrun: or its exit).
                c0, c1 = sampler.at(t_start), sampler.at(t_end)
                c2 = sampler.at(t_end + opts.after)
                if c0 is not None and c1 is not None and c2 is not None:
                    s["launcher_cpu_flood_s"] = c1 - c0
                    s["launcher_cpu_after_s"] = c2 - c1
            if job.tmux is not None:
                s["caught_up_after_s"] = caught_at - t_end if caught_at is not None else None
            for p in s.get("probes", []):
                p["phase"] = (
                    "before the flood"
                    if p["sent"] < t_start
                    else "workers writing"
                    if p["sent"] < t_end
                    else "dashboard catching up"
                    if caught_at is None or p["sent"] < caught_at
                    else "caught up"
                )
            s["ok"] = s["exit_code"] == 0 and (
                not probes or all(p["latency_s"] is not None for p in s["probes"])
            )
            if not s["ok"]:
                s["error"] = (
                    f"exit {s['exit_code']}" if s["exit_code"] != 0 else "a key probe timed out"
                )
                s["output_tail"] = job.output_tail()
    s["leftover_processes"] = job.leftovers  # type: ignore[attr-defined]
    return s


LOG_LINE = re.compile(r"\[(\d+)\] \[flood\] rank \d+ line (\d+)")


def _log_view(screen: str, lines: int) -> dict[str, Any]:
    """How far the dashboard's log view got: the log bar, the newest line number per rank shown."""
    bar = [ln for ln in screen.splitlines() if "following" in ln or "paused" in ln]
    newest: dict[str, int] = {}
    for rank, num in LOG_LINE.findall(screen):
        newest[rank] = max(newest.get(rank, -1), int(num))
    return {
        "log_bar": bar[-1].split("log:", 1)[-1].strip() if bar else None,
        "newest_line_shown": newest,
        "caught_up": bool(newest) and max(newest.values()) == lines - 1,
    }


def bench_flood(opts: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    torch_kind = Kind("torchrun --redirects 3", TORCHRUN.module, False, ("--redirects", "3"))
    dash = tuilaunch("tuilaunch", "--no-confirm")
    probed = tuilaunch("tuilaunch + keys", "--no-confirm")
    kinds = [torch_kind, dash, *([probed] if opts.probes else [])]  # --probes 0: no probed run
    samples = []
    for r in range(opts.repeat):
        order = kinds[:2][::-1] + kinds[2:] if opts.abba and r % 2 else kinds
        for kind in order:
            s = sample_flood(kind, opts, settings, probes=opts.probes if kind is probed else 0)
            s["round"] = r
            samples.append(s)
            lat = [p["latency_s"] for p in s.get("probes", [])]
            keys = (
                " keys " + "/".join("timeout" if x is None else f"{1000 * x:.0f}ms" for x in lat)
                if lat
                else ""
            )
            _progress(
                "flood",
                s,
                f"workers {s.get('workers_wall_s') or 0:.2f}s launcher CPU "
                f"{s.get('launcher_cpu_flood_s') or 0:.2f}s in the flood, "
                f"{s.get('launcher_cpu_after_s') or 0:.2f}s in the {opts.after:g} s after{keys}"
                f"{' view: ' + json.dumps(s['final_view']) if s.get('final_view') else ''}",
            )
    rows = []
    per_round: dict[str, dict[int, float]] = {}
    for kind in kinds:
        mine = [s for s in samples if s["launcher"] == kind.name]
        ok = [s for s in mine if s["ok"]]
        per_round[kind.name] = {s["round"]: s["workers_wall_s"] for s in ok}
        rows.append(
            {
                "launcher": kind.name,
                **_stats([s["workers_wall_s"] for s in ok]),
                "runs": len(mine),
                "succeeded": len(ok),
                "launcher_cpu_flood_s": median(
                    [
                        s["launcher_cpu_flood_s"]
                        for s in ok
                        if s.get("launcher_cpu_flood_s") is not None
                    ]
                ),
                "launcher_cpu_after_s": median(
                    [
                        s["launcher_cpu_after_s"]
                        for s in ok
                        if s.get("launcher_cpu_after_s") is not None
                    ]
                ),
                "caught_up": sum(1 for s in ok if s.get("caught_up_after_s") is not None),
                "caught_up_after_f": sum(
                    1 for s in ok if (s.get("view_after_f") or {}).get("caught_up")
                ),
                "caught_up_after_s": median(
                    [s["caught_up_after_s"] for s in ok if s.get("caught_up_after_s") is not None]
                ),
                "foreign_share": median([s["noise"]["foreign_share"] for s in mine]),
                "loadavg1": median([s["noise"]["loadavg1"] for s in mine]),
            }
        )
    base = rows[0]["median"]
    for row in rows[1:]:
        row["ratio"] = ratio(row["median"], base)
        row["paired_ratio_median"] = median(
            [
                t / per_round[torch_kind.name][k]
                for k, t in per_round[row["launcher"]].items()
                if per_round[torch_kind.name].get(k)
            ]
        )
    spreads = [x["rel_mad"] for x in rows[:2] if x["rel_mad"]]
    probes_all = [p for s in samples for p in s.get("probes", [])]
    lat = [p["latency_s"] for p in probes_all if p["latency_s"] is not None]
    key_stats = {
        "probes": len(probes_all),
        "timed_out": sum(1 for p in probes_all if p["latency_s"] is None),
        "median_s": median(lat),
        "max_s": max(lat) if lat else None,
        "by_phase": {
            ph: median(
                [
                    p["latency_s"]
                    for p in probes_all
                    if p.get("phase") == ph and p["latency_s"] is not None
                ]
            )
            for ph in sorted({p.get("phase") or "?" for p in probes_all})
        },
        "capture_s_median": median([p["capture_s"] for p in probes_all if p.get("capture_s")]),
        "escape_closed_median_s": median(
            [p["escape_closed_s"] for p in probes_all if p["escape_closed_s"] is not None]
        ),
    }
    profile = None
    if opts.py_spy:
        s = sample_flood(probed, opts, settings, probes=opts.probes, spy_seconds=opts.spy_seconds)
        profile = {
            **(s.pop("profile", None) or {}),
            "probes": [p["latency_s"] for p in s.get("probes", [])],
            "workers_wall_s": s.get("workers_wall_s"),
        }
    return {
        "profile": profile,
        "target_ratio": FLOOD_TARGET,
        "key_target_s": KEY_TARGET_S,
        "catchup_timeout_s": opts.catchup_timeout,
        "after_s": opts.after,
        "workload": {"script": "flood.py", "nproc": opts.flood_nproc, "lines": opts.lines},
        "summary": rows,
        "noise": max(spreads) if spreads else None,
        "keys": key_stats,
        "samples": samples,
    }


# --------------------------------------------------------------------------- report


def _f(x: float | None, fmt: str = ".3f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{fmt}}{unit}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1000 * x:.0f} ms"


def _spread(d: dict[str, Any], fmt: str = ".3f") -> str:
    if d.get("median") is None:
        return "n/a"
    return f"{d['median']:{fmt}} ({d['min']:{fmt}}-{d['max']:{fmt}})"


def table_cpu(res: dict[str, Any]) -> str:
    w = res["workload"]
    lines = [
        f"### cpu: launcher process CPU, {w['nproc']} ranks of steady.py, window "
        f"{w['window'][0]:g}-{w['window'][1]:g} s of the loop (% of one core, median (min-max))",
        "",
        "| launcher | launcher CPU % | - torchrun (pp) | ≤ 3 % | ok | workers % | tmux % "
        "| reaper etc. % | others' share of CPUs | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["summary"]:
        is_tui = row["launcher"] != "torchrun"
        target = (
            ("yes" if row["median"] <= CPU_TARGET_PCT else "**no**")
            if is_tui and row["median"] is not None
            else "-"
        )
        lines.append(
            f"| {row['launcher']} | {_spread(row, '.2f')} "
            f"| {_f(row.get('minus_torchrun_pp'), '+.2f') if is_tui else '-'} | {target} "
            f"| {row['succeeded']}/{row['runs']} | {_f(row['workers_pct'], '.0f')} "
            f"| {_f(row['tmux_pct'], '.2f')} | {_f(row['helpers_pct'], '.2f')} "
            f"| {_f(row['foreign_share'], '.0%')} | {_f(row['loadavg1'], '.2f')} |"
        )
    lines += _profile_lines(res.get("profile"), "4 Hz, steady window")
    return "\n".join(lines)


def _profile_lines(prof: dict[str, Any] | None, what: str) -> list[str]:
    """py-spy's findings in markdown: threads (active / holding the GIL), functions, widgets."""
    if not prof or "self" not in (prof.get("gil") or {}):
        return []
    gil, active = prof["gil"], prof.get("active") or {}
    busy = dict(active.get("threads", []))
    held = dict(gil["threads"])
    names = sorted(set(busy) | set(held), key=lambda t: -(busy.get(t, 0) + held.get(t, 0)))
    return [
        "",
        f"py-spy on the tuilaunch process ({what}; an extra, unmeasured run; "
        f"{prof['seconds']:g} s at 100 Hz, twice at once: `--gil`, only the thread holding the "
        "GIL, i.e. running Python; and without it, every thread not idle: running or waiting "
        f"for the GIL or a core). Some thread held the GIL {gil['active_pct_of_core']:.1f} % "
        "of the time. Raw stacks: "
        f"{gil['raw']}{', ' + active['raw'] if active.get('raw') else ''}.",
        "",
        "| thread | not idle, % of the time | holding the GIL, % of the time |",
        "|---|---|---|",
        *[f"| {t} | {_f(busy.get(t), '.1f')} | {_f(held.get(t), '.1f')} |" for t in names[:7]],
        "",
        "Holding the GIL, top functions by self time (% of the time):",
        "",
        *[f"- {p:.2f} % {f}" for f, p in gil["self"][:12]],
        "",
        "Holding the GIL, top tui_launch / textual / rich functions, inclusive (% of the time):",
        "",
        *[f"- {p:.2f} % {f}" for f, p in gil["inclusive"][:15]],
        "",
        "Holding the GIL, by Textual widget class (inclusive): "
        + ", ".join(f"{w} {p:.1f} %" for w, p in gil.get("widgets", [])[:8]),
    ]


def table_launch(res: dict[str, Any]) -> str:
    lines = [
        "### launch: wall time of the no-op job, dashboard (tmux, --exit-on-finish) vs "
        "torchrun headless (s, median (min-max))",
        "",
        "| nproc | torchrun | tuilaunch dashboard | ratio | paired ratio | ≤ 1.15 | ok "
        "| launcher CPU s (torchrun / tuilaunch) | others' share of CPUs | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["summary"]:
        a, b = row["torchrun"], row["tuilaunch"]
        lines.append(
            f"| {row['nproc']} | {_spread(a)} | {_spread(b)} | {_f(row['ratio'])} "
            f"| {_f(row['paired_ratio_median'])} "
            f"| {verdict(row['ratio'], LAUNCH_TARGET, row['noise'])} "
            f"| {a['succeeded']}/{a['runs']} / {b['succeeded']}/{b['runs']} "
            f"| {_f(a['launcher_cpu_median'])} / {_f(b['launcher_cpu_median'])} "
            f"| {_f(a['foreign_share'], '.0%')} / {_f(b['foreign_share'], '.0%')} "
            f"| {_f(a['loadavg1'], '.2f')} / {_f(b['loadavg1'], '.2f')} |"
        )
    return "\n".join(lines)


def table_flood(res: dict[str, Any]) -> str:
    w = res["workload"]
    lines = [
        f"### flood: {w['nproc']} ranks x {w['lines']:,} lines of 100 bytes; workers' wall "
        "= max(end) - min(start) (s, median (min-max))",
        "",
        "| launcher | workers' wall | ratio | paired ratio | ≤ 1.05 | ok "
        f"| launcher CPU s in the flood | launcher CPU s in the {res['after_s']:g} s after it "
        "| log view shows the last line, s after the flood (runs; else after f) "
        "| others' share of CPUs | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(res["summary"]):
        v = "-"
        if i == 1:
            v = verdict(row.get("ratio"), FLOOD_TARGET, res["noise"])
        elif i == 2:
            v = "(probed)"
        caught = (
            f"{_f(row['caught_up_after_s'], '.1f')} ({row['caught_up']}/{row['succeeded']}; "
            f"after f: {row['caught_up_after_f']})"
            if i
            else "-"
        )
        lines.append(
            f"| {row['launcher']} | {_spread(row)} | {_f(row.get('ratio'))} "
            f"| {_f(row.get('paired_ratio_median'))} | {v} | {row['succeeded']}/{row['runs']} "
            f"| {_f(row['launcher_cpu_flood_s'], '.2f')} "
            f"| {_f(row['launcher_cpu_after_s'], '.2f')} | {caught} "
            f"| {_f(row['foreign_share'], '.0%')} | {_f(row['loadavg1'], '.2f')} |"
        )
    k = res["keys"]
    if not k["probes"]:
        return "\n".join(lines)
    ok = (
        "yes"
        if k["max_s"] is not None and k["max_s"] <= KEY_TARGET_S and not k["timed_out"]
        else "**no**"
    )
    phases = ", ".join(f"{ph}: {_ms(v)}" for ph, v in k["by_phase"].items())
    lines += [
        "",
        f'Key latency under the flood (`?` → "{HELP_TITLE}" on screen): {k["probes"]} probes, '
        f"median {_ms(k['median_s'])}, max {_ms(k['max_s'])}, "
        f"{k['timed_out']} timed out (10 s); ≤ 200 ms: {ok}. Median by phase: {phases}. "
        f"Resolution: one `tmux capture-pane` takes {_ms(k['capture_s_median'])} (median); "
        f"Escape closed the help in {_ms(k['escape_closed_median_s'])} (median).",
    ]
    prof = res.get("profile")
    if prof and "gil" in prof:
        lat = ", ".join("timeout" if x is None else _ms(x) for x in prof.get("probes", []))
        lines += _profile_lines(
            prof,
            f"probed flood, from its start; keys {lat}; workers' wall "
            f"{_f(prof.get('workers_wall_s'), '.2f')} s",
        )
    return "\n".join(lines)


def noise_line(results: dict[str, Any]) -> str:
    nz = [s["noise"] for r in results.values() for s in r["samples"] if s.get("noise")]
    if not nz:
        return ""
    shares = [x["foreign_share"] for x in nz]
    return (
        f"Machine noise: other processes used a median {statistics.median(shares):.0%} "
        f"(max {max(shares):.0%}) of the {NCPU} CPUs during the measurements; load average "
        f"{statistics.median(x['loadavg1'] for x in nz):.2f} (median, 1 min)."
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark tuilaunch's dashboard against torchrun (see the module docstring)."
    )
    p.add_argument("command", choices=("cpu", "launch", "flood", "all"))
    p.add_argument("--repeat", type=int, default=3, help="samples per launcher (and nproc)")
    p.add_argument("--warmup", type=int, default=1, help="discarded rounds (launch only)")
    p.add_argument("--abba", action="store_true", help="flip the order every other round")
    p.add_argument("--timeout", type=float, default=240.0, help="s per launch, past the workload")
    p.add_argument("--python", default=sys.executable, help="interpreter for both launchers")
    p.add_argument(
        "--code",
        default="worktree",
        metavar="worktree|installed|REV",
        help="which tuilaunch (as in run.py: a frozen copy of the working tree)",
    )
    p.add_argument("--name", default=None, help="results file prefix")
    p.add_argument("--results-dir", default=str(RESULTS))
    g = p.add_argument_group("cpu")
    g.add_argument("--cpu-nproc", type=int, default=8)
    g.add_argument("--seconds", type=float, default=90.0, help="steady loop length (90)")
    g.add_argument("--step", type=float, default=0.05, help="sleep per training step (0.05)")
    g.add_argument(
        "--window",
        type=float,
        nargs=2,
        default=[65.0, 85.0],
        metavar=("FROM", "TO"),
        help="sampling window, s after the loop began (65 85)",
    )
    g.add_argument("--slow-hz", type=float, default=1.0, help="the extra row's --refresh-hz (1)")
    g.add_argument(
        "--py-spy",
        action="store_true",
        help="cpu, flood: also profile the dashboard with py-spy in an extra, unmeasured run",
    )
    g = p.add_argument_group("launch")
    g.add_argument("--launch-nproc", default="2,4")
    g = p.add_argument_group("flood")
    g.add_argument("--flood-nproc", type=int, default=4)
    g.add_argument("--lines", type=int, default=200_000, help="lines per rank (200000)")
    g.add_argument(
        "--probes",
        type=int,
        default=3,
        help="key probes per probed launch (3; 0: no probed launch)",
    )
    g.add_argument("--probe-gap", type=float, default=0.2, help="s between probes (0.2)")
    g.add_argument("--poll", type=float, default=0.01, help="pane capture interval (0.01)")
    g.add_argument(
        "--spy-seconds", type=float, default=10.0, help="py-spy length from the flood start (10)"
    )
    g.add_argument(
        "--catchup-timeout",
        type=float,
        default=30.0,
        help="s to wait for the dashboard's log view to show the last line (30)",
    )
    g.add_argument(
        "--after",
        type=float,
        default=10.0,
        help="the launcher's CPU is also counted this many s past the flood (10)",
    )
    g.add_argument(
        "--catchup-poll", type=float, default=0.5, help="pane capture interval meanwhile (0.5)"
    )
    args = p.parse_args(argv)
    args.launch_nproc = [int(x) for x in args.launch_nproc.split(",") if x.strip()]
    if args.window[1] > args.seconds or args.window[0] >= args.window[1]:
        p.error("--window must lie inside the loop's --seconds")
    return args


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # leave through every launch's cleanup


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    for tool in (TMUX, GNU_TIME):
        if not Path(tool).exists():
            print(f"dashboard.py: {tool} is needed", file=sys.stderr)
            return 2
    settings = Settings(
        python=args.python,
        nprocs=[],
        repeat=args.repeat,
        warmup=args.warmup,
        timeout=args.timeout,
        abba=args.abba,
        code=args.code,
    )
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="tlbench_code_"))
    benches: list[tuple[str, Callable[[argparse.Namespace, Settings], dict[str, Any]]]] = [
        ("launch", bench_launch),
        ("flood", bench_flood),
        ("cpu", bench_cpu),
    ]
    results: dict[str, Any] = {}
    try:
        settings.pythonpath = snapshot_code(settings.code, work, settings.python)
        info = harness.machine_info(settings)
        info["tmux"] = subprocess.run([TMUX, "-V"], capture_output=True, text=True).stdout.strip()
        for name, bench in benches:
            if args.command in (name, "all"):
                results[name] = bench(args, settings)
    except SetupError as e:
        print(f"dashboard.py: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["loadavg_at_end"] = os.getloadavg()

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{args.name or 'dashboard-' + args.command}-{stamp}.json"
    doc = {
        "command": args.command,
        "argv": list(sys.argv[1:] if argv is None else argv),
        "started": started,
        "duration_s": time.time() - started,
        "machine": info,
        "settings": {**settings.__dict__, **{k: v for k, v in vars(args).items()}},
        **results,
    }
    out_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")

    parts = [
        f"## tuilaunch dashboard vs torchrun — "
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}",
        "",
        f"{info['cpu_count']} CPUs ({info['cpu_model'] or 'unknown'}), Python {info['python']}, "
        f"torch {info['torch']}, tuilaunch {info['tuilaunch']} ({harness._code_label(info)}), "
        f"{info['tmux']}; {args.repeat} samples per cell, "
        f"{'ABBA' if args.abba else 'ABAB'}-interleaved.",
        noise_line(results),
        "",
    ]
    tables = {"launch": table_launch, "flood": table_flood, "cpu": table_cpu}
    for name, _ in benches:
        if name in results:
            parts += [tables[name](results[name]), ""]
    leftovers = sum(
        s.get("leftover_processes", 0)
        for r in results.values()
        for s in r["samples"] + r.get("warmup", [])
    )
    parts.append(f"Leftover processes killed after launches: {leftovers}. Raw data: {out_path}")
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
