"""Benchmark: what GPU and process telemetry costs.

Two measurements, both against the fake NVML (``tui_launch.core.telemetry.fake_nvml``) configured
with 8 GPUs, so they run anywhere:

``tick``  — CPU time of one sampler tick (``Telemetry.tick``: psutil over every rank's tree,
            every NVML call a real tick makes, the rank ↔ GPU mapping, building and posting
            the sample into a real store) for 8 GPUs x 8 ranks. The ranks are real processes
            (``sh -c 'sleep & exec sleep'``: a rank and one child each, like a data-loader
            worker), and each rank's pid is on its own GPU in the fake's process lists, so the
            pid path is taken. ``--inferred`` uses another PID namespace instead (GPU UUIDs in
            CUDA_VISIBLE_DEVICES), which adds the reads of the workers' environments.
            Reported: median, p90, mean and max CPU ms per tick (``time.thread_time``), wall ms,
            and NVML calls per tick. Target: median ≤ 5 ms.

``share`` — the telemetry thread's share of the launcher's CPU in a real launch: the
            launcher (a :class:`~tui_launch.core.run.runner.Runner` in this process, headless, as
            ``tuilaunch --no-tui``) runs ``--nproc-per-node 8 --no-python sleep S`` with
            telemetry on the 8 fake GPUs at the default 1 s interval; reported are the
            telemetry thread's CPU seconds, the launcher process's CPU seconds over the same
            window (``getrusage(RUSAGE_SELF)``, workers excluded) and the ratio.

The fake answers from Python; a real NVML call goes through ctypes into the driver and costs
more (tens of microseconds; process utilisation can take longer), which this bench cannot
measure without a GPU.

Usage::

    .venv/bin/python bench/telemetry.py tick [--ticks 300] [--inferred]
    .venv/bin/python bench/telemetry.py share [--seconds 20]
    .venv/bin/python bench/telemetry.py all
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui_launch.core import telemetry as tm  # noqa: E402
from tui_launch.core.model.events import Event, WorkersStarted  # noqa: E402
from tui_launch.core.model.store import RunStore  # noqa: E402
from tui_launch.core.telemetry import fake_nvml as fake  # noqa: E402

N = 8


def _spawn_ranks(env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i in range(N):
        e = {**os.environ, "LOCAL_RANK": str(i), **(env or {})}
        procs.append(subprocess.Popen(["sh", "-c", "sleep 600 & exec sleep 600"], env=e))
    time.sleep(0.3)
    return procs


def _kill_ranks(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill each rank and its child, by pid."""
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/task/{p.pid}/children") as fp:
                kids = [int(c) for c in fp.read().split()]
        except OSError:
            kids = []
        for pid in kids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        p.kill()
        p.wait()


def bench_tick(ticks: int, inferred: bool) -> dict[str, float]:
    """CPU per tick for 8 GPUs x 8 ranks; returns the figures."""
    env = None
    if inferred:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(fake.gpu_uuid(i) for i in range(N))}
    procs = _spawn_ranks(env)
    try:
        pids = [p.pid for p in procs]
        fake.configure(
            N,
            pid_offset=fake.PID_OFFSET if inferred else 0,
            processes={i: [(pid, (10 + i) << 30)] for i, pid in enumerate(pids)},
        )
        store = RunStore()
        t = tm.Telemetry(store.post, nvml=fake, journal_every=10.0)
        t.open()
        t.set_workers(0, [tm.RankTarget(i, i, pid) for i, pid in enumerate(pids)])
        for _ in range(5):  # warm-up: first CPU readings, caches
            t.tick()
        fake.calls.clear()
        cpu, wall = [], []
        for _ in range(ticks):
            c0, w0 = time.thread_time(), time.perf_counter()
            s = t.tick()
            cpu.append((time.thread_time() - c0) * 1000)
            wall.append((time.perf_counter() - w0) * 1000)
        want = "inferred" if inferred else "pid"
        assert all(r.mapping == want for r in s.ranks), [r.mapping for r in s.ranks]
        assert all(r.procs == 2 for r in s.ranks), [r.procs for r in s.ranks]
        calls = sum(fake.calls.values()) / ticks
    finally:
        _kill_ranks(procs)
    cpu.sort()
    return {
        "median_ms": statistics.median(cpu),
        "p90_ms": cpu[int(0.9 * len(cpu)) - 1],
        "mean_ms": statistics.fmean(cpu),
        "max_ms": cpu[-1],
        "wall_median_ms": statistics.median(wall),
        "nvml_calls_per_tick": calls,
    }


def bench_share(seconds: float) -> dict[str, float]:
    """The telemetry thread's share of the launcher's CPU in a real 8-rank launch."""
    from tui_launch.core.launch.args import parse
    from tui_launch.core.launch.validate import validate
    from tui_launch.core.run.config import RunConfig
    from tui_launch.core.run.runner import Runner

    os.environ[tm.FAKE_ENV] = str(N)
    args, _ = parse(
        ["--standalone", "--nproc-per-node", str(N), "--no-python", "sleep", str(seconds)]
    )
    validate(args)
    store = RunStore()

    def on_event(e: Event) -> None:
        # Real NVML lists the workers' pids; tell the fake, so it does not search for them
        # itself (its search would be counted as the sampler's CPU).
        if isinstance(e, WorkersStarted):
            fake.set_processes({w.local_rank: [(w.pid, 12 << 30)] for w in e.workers})

    store.subscribe(on_event)
    tel = tm.Telemetry(store.post, interval=1.0)
    runner = Runner(args, store, RunConfig(echo=False), telemetry=tel)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    runner.start()
    code = runner.wait(seconds + 120)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - t0
    launcher = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    snap = store.snapshot()
    assert code == 0, code
    assert snap.telemetry is not None and len(snap.telemetry.latest.gpus) == N
    ticks = [r for r in snap.telemetry.latest.ranks if r.mapping == "pid"]
    assert len(ticks) == N, snap.telemetry.latest.ranks
    return {
        "wall_s": wall,
        "open_cpu_s": tel.open_cpu_seconds,
        "ticks": tel.ticks,
        "telemetry_cpu_s": tel.cpu_seconds,
        "launcher_cpu_s": launcher,
        "share_pct": 100 * tel.cpu_seconds / launcher if launcher else 0.0,
        "telemetry_cpu_per_tick_ms": 1000
        * (tel.cpu_seconds - tel.open_cpu_seconds)
        / max(1, tel.ticks),
        "core_pct": 100 * tel.cpu_seconds / wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("tick", "share", "all"))
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--inferred", action="store_true")
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.2f}")
    if a.what in ("tick", "all"):
        modes = [a.inferred] if a.what == "tick" else [False, True]
        for inferred in modes:
            r = bench_tick(a.ticks, inferred)
            label = "inferred (namespace mismatch)" if inferred else "pid match"
            verdict = "yes" if r["median_ms"] <= 5.0 else "NO"
            print(
                f"tick, 8 GPUs x 8 ranks (2 processes each), {label}: CPU median "
                f"{r['median_ms']:.2f} ms, p90 {r['p90_ms']:.2f}, mean {r['mean_ms']:.2f}, "
                f"max {r['max_ms']:.2f}; wall median {r['wall_median_ms']:.2f} ms; "
                f"{r['nvml_calls_per_tick']:.1f} NVML calls/tick; target <= 5 ms: {verdict}"
            )
    if a.what in ("share", "all"):
        r = bench_share(a.seconds)
        print(
            f"share, real launch of 8 ranks for {a.seconds:.0f}s ({r['wall_s']:.1f}s wall, "
            f"{r['ticks']} ticks): telemetry thread {r['telemetry_cpu_s']:.3f} s CPU "
            f"({r['open_cpu_s'] * 1000:.0f} ms to open NVML and psutil, then "
            f"{r['telemetry_cpu_per_tick_ms']:.2f} ms/tick) of the launcher's "
            f"{r['launcher_cpu_s']:.2f} s = {r['share_pct']:.1f}% of the launcher's CPU, "
            f"{r['core_pct']:.2f}% of one core"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
