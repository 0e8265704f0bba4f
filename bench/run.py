"""Benchmark tuilaunch against torchrun, on the same machine, in the same run.

Two measurements, each for ``--nproc-per-node`` 1, 2 and 4:

``launch``
    Launch overhead. Wall time of a whole no-op job (``workloads/noop.py``: gloo
    ``init_process_group``, one ``all_reduce``, ``destroy_process_group``) under::

        python -m torch.distributed.run --standalone --nproc-per-node N noop.py
        python -m tui_launch --no-tui  --standalone --nproc-per-node N noop.py

    measured from ``Popen`` to the launcher's exit. Target: tuilaunch/torchrun <= 1.05.

``restart``
    Failure -> restarted workers. ``workloads/crash_once.py`` fails one rank on attempt 0
    (it writes ``time.time()`` to ``fail_0`` and ``os._exit(1)``); on attempt 1 every rank
    writes ``time.time()`` to ``up_<rank>`` once past ``init_process_group`` and one
    ``all_reduce``. Latency = max(up_*) - fail_0. Both launchers run with ``--max-restarts 1``
    and ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (without it torch's own restarts mostly fail;
    ``--torchrun-shared-store`` adds torchrun without it as a third, informational launcher).
    tuilaunch runs as it does by default, which dumps the surviving ranks' stacks before torch
    terminates them (issue 14); ``tuilaunch-no-dump`` (``--no-dump-on-failure``) shows what
    the dump costs. Target: tuilaunch no slower than torchrun (ratio <= ~1.0 within noise;
    <= 1.1 with the dump).

How: the launchers are interleaved (A, B, A, B, ...; ``--abba`` flips the order every
round), ``--warmup`` runs of each are thrown away, and every figure is a median of
``--repeat`` samples; the ratio is tuilaunch's median over torchrun's median (the median of
the per-round ratios is shown too). Absolute times depend on the machine and its load: only
the ratios of one run are meant to be compared. Each launcher runs in a session of its own
(``start_new_session=True``) with output to a file, under a per-launch timeout; every
process of a launch carries a token in its environment, so after each launch (and on a
timeout or ^C) whatever is left of it is found in ``/proc`` and killed, and counted.

``--warm-start`` (``launch``, ``restart``, ``all``) adds ``tuilaunch-warm``
(``tuilaunch --warm-start``: workers forked from a spare interpreter that imported torch
ahead, issue 19) to the same interleaved rounds, with its own ratio over torchrun. Targets:
first launch <= 0.9x torchrun, failure -> restarted group <= 0.5x. ``--fail-after S``
(``restart``) makes the failing rank wait S seconds after its first ``all_reduce`` (every
launcher alike; the latency is measured from the failure).

Each sample also records the CPU time of the launch (launcher + workers, from
``RUSAGE_CHILDREN``; for ``launch`` also the launcher's share: the total minus what each
noop.py rank reports at the end of its main) and the CPU time other processes used meanwhile
(``/proc/stat`` busy time minus ours), which says how noisy the machine was.

The tuilaunch measured is frozen at the start (``--code``: a copy of the working tree's
``tui_launch/`` by default, or a git revision), put first on every launch's ``PYTHONPATH``, so
edits made while the benchmark runs do not change what it measures.

Output: a markdown table on stdout (progress on stderr) and
``bench/results/<name>-<timestamp>.json`` with machine info, settings, summaries and every
raw sample.

Usage::

    .venv/bin/python bench/run.py launch --repeat 7
    .venv/bin/python bench/run.py restart --repeat 5
    .venv/bin/python bench/run.py all
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tui_launch.testing.procs import env_holders

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORKLOADS = BENCH / "workloads"
RESULTS = BENCH / "results"
TOKEN_VAR = "TUILAUNCH_BENCH_TOKEN"
SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
LAUNCH_TARGET = 1.05
RESTART_TARGET = 1.0
WARM_LAUNCH_TARGET = 0.9
WARM_RESTART_TARGET = 0.5

Sample = dict[str, Any]


@dataclass(frozen=True)
class Launcher:
    """One way of launching: a module to run and environment changes (None: unset)."""

    name: str
    module_args: tuple[str, ...]
    env: dict[str, str | None] = field(default_factory=dict)
    timeout: float | None = None  # None: the benchmark's --timeout

    def command(self, python: str, nproc: int, log_dir: str, script: Sequence[str]) -> list[str]:
        return [
            python,
            *self.module_args,
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--log-dir",
            log_dir,
            *script,
        ]


@dataclass
class Settings:
    """What a benchmark run does; saved in the results file."""

    python: str
    nprocs: list[int]
    repeat: int
    warmup: int
    timeout: float
    abba: bool
    shared_store: bool = False
    shared_timeout: float = 60.0
    code: str = "worktree"
    pythonpath: str | None = None  # the snapshot of tui_launch, first on every launch's path
    warm_start: bool = False  # also run tuilaunch --warm-start
    fail_after: float = 0.0  # restart: seconds the failing rank waits before failing


TORCHRUN = Launcher("torchrun", ("-m", "torch.distributed.run"))
TUILAUNCH = Launcher("tuilaunch", ("-m", "tui_launch", "--no-tui"))
TUILAUNCH_NO_DUMP = Launcher(
    "tuilaunch-no-dump", ("-m", "tui_launch", "--no-tui", "--no-dump-on-failure")
)
TUILAUNCH_WARM = Launcher("tuilaunch-warm", ("-m", "tui_launch", "--no-tui", "--warm-start"))


# --------------------------------------------------------------------------- processes


def base_env(
    token: str, changes: dict[str, str | None], pythonpath: str | None = None
) -> dict[str, str]:
    """Our environment without anything that changes a launch's behaviour, plus ``changes``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "TORCH_DISABLE_SHARE"))
        and k not in ("OMP_NUM_THREADS", "LOGLEVEL", "MASTER_ADDR", "MASTER_PORT")
    }
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (pythonpath, env.get("PYTHONPATH")) if x)
    env[TOKEN_VAR] = token
    return env


def token_pids(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (workers inherit it)."""
    return env_holders(TOKEN_VAR, token)


def kill_token(token: str) -> int:
    """SIGKILL every process (and process group) of a launch; return how many there were."""
    pids = token_pids(token)
    for pid in pids:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(pid, signal.SIGKILL)
    return len(pids)


def settle(token: str, grace: float) -> int:
    """Wait up to ``grace`` s for a launch's processes to go; kill the rest; return their count."""
    deadline = time.monotonic() + grace
    while token_pids(token):
        if time.monotonic() >= deadline:
            killed = kill_token(token)
            end = time.monotonic() + 5
            while token_pids(token) and time.monotonic() < end:
                time.sleep(0.05)
            return killed
        time.sleep(0.05)
    return 0


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_sockets(port: int) -> set[int]:
    """Inodes of the TCP sockets listening on ``port`` in this network namespace.

    Read from ``/proc/net/tcp{,6}`` (state 0A), so probing never connects to the server: a
    c10d store would log a stray client.
    """
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fp:
                next(fp, None)
                for line in fp:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        found.add(int(fields[9]))
        except OSError:
            continue
    return found


def listening(port: int) -> bool:
    """Whether some process of this network namespace listens on TCP ``port``."""
    return bool(listening_sockets(port))


def holds_socket(pid: int, inodes: set[int]) -> bool:
    """Whether process ``pid`` has one of these sockets open (its fds in ``/proc``)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
    return False


def become_subreaper() -> bool:
    """Make orphaned descendants (a killed agent's workers) this process's children.

    Their CPU then reaches ``RUSAGE_CHILDREN`` once :func:`reap_orphans` waits for them, so the
    "other processes" share stays honest when a benchmark SIGKILLs an agent on purpose.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans() -> None:
    """Wait for every exited child (call only when no ``Popen`` of ours is still unwaited)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as fp:
        fields = [int(x) for x in fp.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_once(
    launcher: Launcher,
    nproc: int,
    script: Path,
    settings: Settings,
    env_changes: dict[str, str | None],
    keep: Callable[[Path], dict[str, Any]] | None = None,
) -> Sample:
    """One launch, start to exit, with cleanup. ``keep(workdir)`` reads the workload's files."""
    token = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix="tlbench_"))
    marks = tmp / "marks"
    marks.mkdir()
    out_path = tmp / "output.txt"
    cmd = launcher.command(settings.python, nproc, str(tmp / "logs"), [str(script), str(marks)])
    env = base_env(token, {**env_changes, **launcher.env}, settings.pythonpath)
    limit = launcher.timeout or settings.timeout
    sample: Sample = {
        "launcher": launcher.name,
        "nproc": nproc,
        "loadavg1": os.getloadavg()[0],
    }
    try:
        with open(out_path, "wb") as out:
            busy0, cpu0 = busy_cpu_s(), children_cpu_s()
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                cmd,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            timed_out, killed = False, 0
            try:
                rc: int | None = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out, rc = True, None
                killed = _kill_launch(proc, token)
            except BaseException:  # ^C: leave nothing behind, then stop
                _kill_launch(proc, token)
                raise
            wall = time.perf_counter() - t0
            cpu = children_cpu_s() - cpu0
            foreign = max(0.0, busy_cpu_s() - busy0 - cpu)
        leftovers = settle(token, grace=5.0)
        sample.update(
            wall_s=wall,
            exit_code=rc,
            ok=rc == 0,
            timed_out=timed_out,
            killed_at_timeout=killed,
            leftover_processes=leftovers,
            cpu_s=cpu,
            foreign_cpu_s=foreign,
            foreign_load=foreign / (wall * (os.cpu_count() or 1)),
        )
        if keep is not None:
            sample.update(keep(marks))
        if rc != 0:
            text = out_path.read_bytes()[-3000:].decode(errors="replace")
            sample["output_tail"] = text
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sample


def _kill_launch(proc: subprocess.Popen[bytes], token: str) -> int:
    """SIGKILL the launcher's process group and every process of the launch; return the count."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    killed = kill_token(token)
    proc.wait()
    return killed


# --------------------------------------------------------------------------- statistics


def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def rel_mad(xs: Sequence[float]) -> float | None:
    """Median absolute deviation over the median: how much the samples scatter."""
    if len(xs) < 2:
        return None
    m = statistics.median(xs)
    return statistics.median([abs(x - m) for x in xs]) / m if m else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(
    samples: list[Sample], nprocs: Sequence[int], names: Sequence[str], metric: str
) -> list[dict[str, Any]]:
    """Per nproc: medians, spreads and successes per launcher, and tuilaunch/torchrun ratios."""
    rows = []
    for n in nprocs:
        row: dict[str, Any] = {"nproc": n}
        by_round: dict[str, dict[int, float]] = {}
        for name in names:
            mine = [s for s in samples if s["nproc"] == n and s["launcher"] == name]
            vals = [s[metric] for s in mine if s["ok"] and s.get(metric) is not None]
            by_round[name] = {
                s["round"]: s[metric] for s in mine if s["ok"] and s.get(metric) is not None
            }
            row[name] = {
                "median": median(vals),
                "min": min(vals) if vals else None,
                "max": max(vals) if vals else None,
                "rel_mad": rel_mad(vals),
                "succeeded": sum(1 for s in mine if s["ok"]),
                "runs": len(mine),
                "timed_out": sum(1 for s in mine if s["timed_out"]),
                "leftover_processes": sum(s["leftover_processes"] for s in mine),
                "wall_median": median([s["wall_s"] for s in mine if s["ok"]]),
                "cpu_median": median([s["cpu_s"] for s in mine if s["ok"]]),
                "launcher_cpu_median": median(
                    [s["launcher_cpu_s"] for s in mine if s.get("launcher_cpu_s") is not None]
                ),
            }
        row["ratio"] = ratio(row["tuilaunch"]["median"], row["torchrun"]["median"])
        if "tuilaunch-warm" in row:
            row["ratio_warm"] = ratio(row["tuilaunch-warm"]["median"], row["torchrun"]["median"])
            warm_pairs = [
                t / r
                for k, t in by_round["tuilaunch-warm"].items()
                if (r := by_round["torchrun"].get(k))
            ]
            row["paired_ratio_warm_median"] = median(warm_pairs)
        pairs = [
            t / r for k, t in by_round["tuilaunch"].items() if (r := by_round["torchrun"].get(k))
        ]
        row["paired_ratio_median"] = median(pairs)
        spreads = [row[x]["rel_mad"] for x in ("torchrun", "tuilaunch") if row[x]["rel_mad"]]
        row["noise"] = max(spreads) if spreads else None
        rows.append(row)
    return rows


def verdict(r: float | None, target: float, noise: float | None) -> str:
    if r is None:
        return "n/a"
    if r <= target:
        return "yes"
    if noise is not None and r <= target * (1 + noise):
        return "within noise"
    return "**no**"


# --------------------------------------------------------------------------- benchmarks


def _rounds(
    settings: Settings,
    launchers: Sequence[Launcher],
    run: Callable[[Launcher, int], Sample],
    label: str,
) -> tuple[list[Sample], list[Sample]]:
    warm: list[Sample] = []
    for i in range(settings.warmup):
        for launcher in launchers:
            s = run(launcher, settings.nprocs[0])
            s["round"] = -1 - i
            warm.append(s)
            _progress(label, "warmup", s)
    samples: list[Sample] = []
    for r in range(settings.repeat):
        for n in settings.nprocs:
            order = list(launchers)
            if settings.abba and r % 2:
                order.reverse()
            for launcher in order:
                s = run(launcher, n)
                s["round"] = r
                samples.append(s)
                _progress(label, f"{r + 1}/{settings.repeat}", s)
    return warm, samples


def _progress(label: str, where: str, s: Sample) -> None:
    extra = f" latency {s['latency_s']:.3f}s" if s.get("latency_s") is not None else ""
    state = "ok" if s["ok"] else f"rc={s['exit_code']}"
    if s["timed_out"]:
        state = f"TIMEOUT ({s['killed_at_timeout']} processes killed)"
    left = f" leftovers={s['leftover_processes']}" if s["leftover_processes"] else ""
    print(
        f"[{label} {where}] nproc={s['nproc']} {s['launcher']:<15} wall {s['wall_s']:.3f}s"
        f"{extra} {state}{left} foreign load {s['foreign_load']:.0%}",
        file=sys.stderr,
        flush=True,
    )


def bench_launch(settings: Settings) -> dict[str, Any]:
    """Wall time of the no-op job under each launcher."""
    launchers = [TORCHRUN, TUILAUNCH, *([TUILAUNCH_WARM] if settings.warm_start else [])]

    def run(launcher: Launcher, n: int) -> Sample:
        s = run_once(launcher, n, WORKLOADS / "noop.py", settings, {}, keep=read_worker_cpu)
        s["launcher_cpu_s"] = (
            s["cpu_s"] - s["worker_cpu_s"] if s["ok"] and s["workers_reported"] == n else None
        )
        return s

    warm, samples = _rounds(settings, launchers, run, "launch")
    rows = summarize(samples, settings.nprocs, [x.name for x in launchers], "wall_s")
    return {"target_ratio": LAUNCH_TARGET, "summary": rows, "warmup": warm, "samples": samples}


def read_worker_cpu(marks: Path) -> dict[str, Any]:
    """noop.py's per-rank CPU times (the launcher's own = the launch's total minus these)."""
    times = []
    for p in marks.glob("cpu_*"):
        try:
            times.append(float(p.read_text()))
        except (OSError, ValueError):
            continue
    return {"worker_cpu_s": sum(times), "workers_reported": len(times)}


def read_marks(marks: Path) -> dict[str, Any]:
    """crash_once.py's timestamps, and the restart latency when every rank came back."""

    def read(p: Path) -> float | None:
        try:
            return float(p.read_text())
        except (OSError, ValueError):
            return None

    fail = read(marks / "fail_0")
    ups = {p.name: read(p) for p in sorted(marks.glob("up_*"))}
    up_times = [t for t in ups.values() if t is not None]
    return {"fail_time": fail, "up_times": ups, "up_ranks": len(up_times)}


def bench_restart(settings: Settings) -> dict[str, Any]:
    """Failure -> restarted group latency under each launcher, --max-restarts 1."""
    # tuilaunch dumps the surviving ranks' stacks before torch tears the group down (on by
    # default: that is the figure against torchrun); the no-dump variant shows what it costs.
    launchers = [TORCHRUN, TUILAUNCH, TUILAUNCH_NO_DUMP]
    if settings.warm_start:
        launchers = [TORCHRUN, TUILAUNCH, TUILAUNCH_WARM]
    if settings.shared_store:
        launchers.append(
            Launcher(
                "torchrun-shared",
                TORCHRUN.module_args,
                env={SHARE_STORE_ENV: None},
                timeout=settings.shared_timeout,
            )
        )

    def run(launcher: Launcher, n: int) -> Sample:
        restart_launcher = Launcher(
            launcher.name,
            (*launcher.module_args, "--max-restarts", "1"),
            launcher.env,
            launcher.timeout,
        )
        s = run_once(
            restart_launcher,
            n,
            WORKLOADS / "crash_once.py",
            settings,
            {SHARE_STORE_ENV: "1", "BENCH_FAIL_AFTER": str(settings.fail_after)},
            keep=read_marks,
        )
        complete = s["fail_time"] is not None and s["up_ranks"] == n
        s["latency_s"] = (
            max(t for t in s["up_times"].values() if t is not None) - s["fail_time"]
            if complete
            else None
        )
        s["ok"] = bool(s["ok"] and complete)
        return s

    warm, samples = _rounds(settings, launchers, run, "restart")
    rows = summarize(samples, settings.nprocs, [x.name for x in launchers], "latency_s")
    if settings.shared_store:
        for row in rows:
            mine = [s for s in samples if s["nproc"] == row["nproc"]]
            shared = [s for s in mine if s["launcher"] == "torchrun-shared"]
            row["torchrun-shared"]["note"] = (
                f"{SHARE_STORE_ENV} unset: {sum(s['ok'] for s in shared)}/{len(shared)} "
                "restarts succeeded"
            )
    return {
        "target_ratio": RESTART_TARGET,
        "env": {SHARE_STORE_ENV: "1"},
        "summary": rows,
        "warmup": warm,
        "samples": samples,
    }


# --------------------------------------------------------------------------- report


def _s(x: float | None, unit: str = "s") -> str:
    return "n/a" if x is None else f"{x:.3f}{unit}"


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _spread(d: dict[str, Any]) -> str:
    if d["median"] is None:
        return "n/a"
    return f"{d['median']:.3f} ({d['min']:.3f}-{d['max']:.3f})"


def table_launch(result: dict[str, Any]) -> str:
    lines = [
        "### launch: wall time of a no-op job (median, min-max, seconds)",
        "",
        "| nproc | torchrun | tuilaunch | ratio | paired ratio | ≤ 1.05 "
        "| ok (torchrun / tuilaunch) | CPU s, all (torchrun / tuilaunch) "
        "| CPU s, launcher only (torchrun / tuilaunch) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        a, b = row["torchrun"], row["tuilaunch"]
        lines.append(
            f"| {row['nproc']} | {_spread(a)} | {_spread(b)} | {_r(row['ratio'])} "
            f"| {_r(row['paired_ratio_median'])} "
            f"| {verdict(row['ratio'], LAUNCH_TARGET, row['noise'])} "
            f"| {a['succeeded']}/{a['runs']} / {b['succeeded']}/{b['runs']} "
            f"| {_r(a['cpu_median'])} / {_r(b['cpu_median'])} "
            f"| {_r(a['launcher_cpu_median'])} / {_r(b['launcher_cpu_median'])} |"
        )
    return "\n".join(lines)


def table_warm(result: dict[str, Any], what: str, target: float) -> str:
    """``tuilaunch --warm-start`` against torchrun (and plain tuilaunch), from the same rounds."""
    lines = [
        f"### {what} with `--warm-start` (median, min-max, seconds)",
        "",
        f"| nproc | torchrun | tuilaunch | tuilaunch --warm-start | warm ratio | paired "
        f"| ≤ {target} | ok (torchrun / tuilaunch / warm) | CPU s, all (torchrun / warm) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        a, b, w = row["torchrun"], row["tuilaunch"], row.get("tuilaunch-warm")
        if w is None:
            continue
        lines.append(
            f"| {row['nproc']} | {_spread(a)} | {_spread(b)} | {_spread(w)} "
            f"| {_r(row['ratio_warm'])} | {_r(row['paired_ratio_warm_median'])} "
            f"| {verdict(row['ratio_warm'], target, row['noise'])} "
            f"| {a['succeeded']}/{a['runs']} / {b['succeeded']}/{b['runs']} "
            f"/ {w['succeeded']}/{w['runs']} "
            f"| {_r(a['cpu_median'])} / {_r(w['cpu_median'])} |"
        )
    return "\n".join(lines)


def table_restart(result: dict[str, Any]) -> str:
    lines = [
        "### restart: failure → restarted workers past init_process_group "
        "(median, min-max, seconds)",
        "",
        f"Both launchers with `--max-restarts 1` and `{SHARE_STORE_ENV}=1`; tuilaunch as by "
        "default, dumping the surviving ranks' stacks before the teardown "
        "(`--no-dump-on-failure`: the last column).",
        "",
        "| nproc | torchrun | tuilaunch | ratio | paired ratio | ≤ 1.0 "
        "| succeeded (torchrun / tuilaunch) | wall (torchrun / tuilaunch) "
        "| tuilaunch --no-dump-on-failure |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        a, b = row["torchrun"], row["tuilaunch"]
        c = row.get("tuilaunch-no-dump")
        if c is None and "tuilaunch-warm" in row:
            continue  # the --warm-start table shows these rounds
        lines.append(
            f"| {row['nproc']} | {_spread(a)} | {_spread(b)} | {_r(row['ratio'])} "
            f"| {_r(row['paired_ratio_median'])} "
            f"| {verdict(row['ratio'], RESTART_TARGET, row['noise'])} "
            f"| {a['succeeded']}/{a['runs']} / {b['succeeded']}/{b['runs']} "
            f"| {_s(a['wall_median'])} / {_s(b['wall_median'])} "
            f"| {_spread(c) if c else '-'} |"
        )
    notes = [
        row["torchrun-shared"]["note"] for row in result["summary"] if "torchrun-shared" in row
    ]
    if notes:
        lines.append("")
        for row in result["summary"]:
            c = row["torchrun-shared"]
            lines.append(
                f"- torchrun, nproc {row['nproc']}, {c['note']} "
                f"({c['timed_out']} timed out); latency when it worked: {_spread(c)}"
            )
    return "\n".join(lines)


class SetupError(Exception):
    """The benchmark cannot run (tuilaunch does not start, a bad --code)."""


def snapshot_code(code: str, dest: Path, python: str) -> str | None:
    """Freeze the tuilaunch that will be measured; return the directory to put on PYTHONPATH.

    ``worktree``: a copy of the working tree's ``tui_launch/`` (edits made while the benchmark
    runs do not reach it); ``installed``: no copy, whatever the environment imports; anything
    else: that git revision's ``tui_launch/``. The copy is byte-compiled once, so no launch pays
    for compiling it.
    """
    if code == "installed":
        return None
    target = dest / "code"
    target.mkdir()
    if code == "worktree":
        shutil.copytree(
            ROOT / "tui_launch",
            target / "tui_launch",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", code, "tui_launch"],
            capture_output=True,
        )
        if archive.returncode != 0:
            raise SetupError(f"--code {code}: {archive.stderr.decode(errors='replace').strip()}")
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    subprocess.run(
        [python, "-m", "compileall", "-q", str(target / "tui_launch")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return str(target)


def code_info(code: str) -> dict[str, Any]:
    """Which tuilaunch is measured: the revision, and whether tui_launch/ differed from it."""

    def git(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)

    rev = "HEAD" if code in ("worktree", "installed") else code
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}").stdout.strip()
    local_edits = None
    if rev == "HEAD":
        local_edits = git("diff", "--quiet", "HEAD", "--", "tui_launch").returncode != 0
    return {"code": code, "git_commit": commit, "tui_launch_edited_since_commit": local_edits}


def machine_info(settings: Settings) -> dict[str, Any]:
    """The machine, the interpreter, torch and tuilaunch; fails if tuilaunch cannot start."""
    env = base_env("probe", {}, settings.pythonpath)
    check = subprocess.run(
        [settings.python, "-m", "tui_launch", "--version"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if check.returncode != 0:
        tail = "\n".join((check.stdout + check.stderr).strip().splitlines()[-6:])
        raise SetupError(f"tuilaunch does not start (--code {settings.code}):\n{tail}")
    probe = (
        "import json, platform, sys, torch, tui_launch; print(json.dumps({"
        "'python': sys.version.split()[0], 'python_executable': sys.executable, "
        "'torch': torch.__version__, 'tuilaunch': tui_launch.__version__, "
        "'tuilaunch_path': tui_launch.__file__}))"
    )
    versions = json.loads(
        subprocess.run(
            [settings.python, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    model = ""
    try:
        with open("/proc/cpuinfo") as fp:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in fp if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo") as fp:
            kb = int(next(ln for ln in fp if ln.startswith("MemTotal")).split()[1])
            mem_gb = round(kb / 1024 / 1024, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "memory_gb": mem_gb,
        "platform": platform.platform(),
        **versions,
        **code_info(settings.code),
        "loadavg_at_start": os.getloadavg(),
    }


def _code_label(info: dict[str, Any]) -> str:
    commit = str(info.get("git_commit") or "?")[:10]
    if info["code"] == "worktree":
        edited = info.get("tui_launch_edited_since_commit")
        return f"working tree at {commit}{', with local edits' if edited else ''}"
    if info["code"] == "installed":
        return f"as installed, {commit}"
    return f"{info['code']} = {commit}"


def noise_line(results: dict[str, Any]) -> str:
    samples = [s for r in results.values() for s in r["samples"]]
    if not samples:
        return ""
    loads = [s["foreign_load"] for s in samples]
    return (
        f"Machine noise: other processes used a median {statistics.median(loads):.0%} "
        f"(max {max(loads):.0%}) of the {os.cpu_count()} CPUs during the launches; "
        f"load average {statistics.median(s['loadavg1'] for s in samples):.2f} (median, 1 min)."
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repeat", type=int, default=5, help="samples per launcher and nproc")
    common.add_argument("--warmup", type=int, default=1, help="discarded runs of each launcher")
    common.add_argument(
        "--nproc", default="1,2,4", help="comma-separated --nproc-per-node values (1,2,4)"
    )
    common.add_argument(
        "--timeout", type=float, default=180.0, help="seconds before a launch is killed"
    )
    common.add_argument(
        "--abba", action="store_true", help="flip the launcher order every round (A B, B A, ...)"
    )
    common.add_argument(
        "--python", default=sys.executable, help="interpreter that runs both launchers"
    )
    common.add_argument(
        "--code",
        default="worktree",
        metavar="worktree|installed|REV",
        help="which tuilaunch to measure: a copy of the working tree's tui_launch/ taken at the "
        "start (default; edits during the run do not affect it), the installed one as is, or "
        "a git revision's",
    )
    common.add_argument("--name", default=None, help="results file prefix (default: the command)")
    common.add_argument(
        "--results-dir", default=str(RESULTS), help="where the JSON goes (bench/results)"
    )
    common.add_argument(
        "--warm-start",
        action="store_true",
        help="also run tuilaunch --warm-start (issue 19) in the same rounds",
    )
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument(
        "--fail-after",
        type=float,
        default=0.0,
        help="restart: seconds the failing rank waits after its first all_reduce (all launchers)",
    )
    shared.add_argument(
        "--torchrun-shared-store",
        action="store_true",
        help=f"also run torchrun with {SHARE_STORE_ENV} unset (torch's default) and count how "
        "many of its restarts succeed",
    )
    shared.add_argument(
        "--shared-timeout",
        type=float,
        default=60.0,
        help="timeout for those runs (they often hang)",
    )
    parser = argparse.ArgumentParser(
        description="Benchmark tuilaunch against torchrun (see the module docstring)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("launch", parents=[common], help="launch overhead on a no-op job")
    sub.add_parser("restart", parents=[common, shared], help="failure → restarted latency")
    sub.add_parser("all", parents=[common, shared], help="launch, then restart")
    return parser.parse_args(argv)


def _on_sigterm(signum: int, frame: object) -> None:
    # Leave through run_once's cleanup, as on ^C.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    settings = Settings(
        python=args.python,
        nprocs=[int(x) for x in args.nproc.split(",") if x.strip()],
        repeat=args.repeat,
        warmup=args.warmup,
        timeout=args.timeout,
        abba=args.abba,
        shared_store=getattr(args, "torchrun_shared_store", False),
        shared_timeout=getattr(args, "shared_timeout", 60.0),
        code=args.code,
        warm_start=args.warm_start,
        fail_after=getattr(args, "fail_after", 0.0),
    )
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="tlbench_code_"))
    try:
        settings.pythonpath = snapshot_code(settings.code, work, settings.python)
        info = machine_info(settings)
        results: dict[str, Any] = {}
        if args.command in ("launch", "all"):
            results["launch"] = bench_launch(settings)
        if args.command in ("restart", "all"):
            results["restart"] = bench_restart(settings)
    except SetupError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["loadavg_at_end"] = os.getloadavg()

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{args.name or args.command}-{stamp}.json"
    doc = {
        "command": args.command,
        "argv": list(sys.argv[1:] if argv is None else argv),
        "started": started,
        "duration_s": time.time() - started,
        "machine": info,
        "settings": settings.__dict__,
        **results,
    }
    out_path.write_text(json.dumps(doc, indent=1) + "\n")

    parts = [
        f"## tuilaunch vs torchrun — {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}",
        "",
        f"{info['cpu_count']} CPUs ({info['cpu_model'] or 'unknown'}), Python {info['python']}, "
        f"torch {info['torch']}, tuilaunch {info['tuilaunch']} ({_code_label(info)}); "
        f"{settings.repeat} samples per cell, "
        f"{'ABBA' if settings.abba else 'ABAB'}-interleaved, {settings.warmup} warm-up.",
        noise_line(results),
        "",
    ]
    if "launch" in results:
        parts += [table_launch(results["launch"]), ""]
        if settings.warm_start:
            parts += [table_warm(results["launch"], "launch", WARM_LAUNCH_TARGET), ""]
    if "restart" in results:
        if not settings.warm_start:
            parts += [table_restart(results["restart"]), ""]
        else:
            what = f"restart (the failing rank fails {settings.fail_after:g} s into attempt 0)"
            parts += [table_warm(results["restart"], what, WARM_RESTART_TARGET), ""]
    leftovers = sum(
        s["leftover_processes"] for r in results.values() for s in r["samples"] + r["warmup"]
    )
    parts.append(f"Leftover processes killed after launches: {leftovers}. Raw data: {out_path}")
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
