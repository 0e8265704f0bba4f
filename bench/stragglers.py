"""Benchmark: what the straggler sampling costs the ranks (issue 15).

Target: stack sampling (``--stack-samples``, py-spy ``dump --nonblocking`` of every rank)
slows the ranks' step rate by at most 1 %.

``rate``  — the lockstep gloo loop of ``tests/workers/lockstep.py`` (``--ranks`` ranks, each
            step ``--work`` seconds of Python compute and an all_reduce) under tuilaunch with
            ``--stack-samples 0`` (off), the default 5 s and an aggressive 1 s, the settings
            interleaved round after round so drifting load on the machine hits each alike;
            reported: each setting's median steps/s (rank 0, first to last step) and its
            change against off.
``dump``  — CPU seconds one ``py-spy dump --nonblocking`` costs (its own process: the rank
            is read, never paused), so the cost per rank and second at an interval is
            known without the noise of a shared machine.
``tick``  — the real ``StragglerSampler.tick`` over ``--ranks`` idle Python processes, in
            this process as in the launcher: per sample of every rank, the CPU this process
            spends (``RUSAGE_SELF``: the thread pool, fork/exec of py-spy, reading its JSON)
            and the CPU of the py-spy processes (``RUSAGE_CHILDREN``: the launcher's waited
            children, so a launch's CPU counts them); as % of a core at ``--interval`` and
            after the back-off on a balanced run (8 x the interval).

    .venv/bin/python bench/stragglers.py rate [--rounds 5] [--ranks 2] [--steps 500]
    .venv/bin/python bench/stragglers.py dump
    .venv/bin/python bench/stragglers.py tick [--ranks 8] [--samples 20] [--interval 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKSTEP = ROOT / "tests" / "workers" / "lockstep.py"
TICKER = ROOT / "tests" / "workers" / "ticker.py"


def one_run(stack_samples: float, ranks: int, steps: int, work: float) -> float:
    """Rank 0's steps/s for one launch."""
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "rate"
        cmd = [
            sys.executable, "-m", "tui_launch", "--no-tui", "--standalone",
            "--nproc-per-node", str(ranks), "--stack-samples", str(stack_samples),
            "--no-gpu", str(LOCKSTEP), "--steps", str(steps), "--work", str(work),
            "--report", str(report),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, cwd=d, timeout=600)
        return float(report.read_text())


def rate(args: argparse.Namespace) -> None:
    settings = (0.0, 5.0, 1.0)
    got: dict[float, list[float]] = {s: [] for s in settings}
    for k in range(args.rounds):
        for s in settings if k % 2 == 0 else reversed(settings):
            got[s].append(one_run(s, args.ranks, args.steps, args.work))
            print(f"round {k} --stack-samples {s:g}: {got[s][-1]:.2f} steps/s", flush=True)
    base = statistics.median(got[0.0])
    for s in settings:
        med = statistics.median(got[s])
        print(
            f"--stack-samples {s:g}: median {med:.2f} steps/s "
            f"({100 * (med - base) / base:+.1f} % vs off), runs {[round(v, 2) for v in got[s]]}"
        )


def dump(_: argparse.Namespace) -> None:
    from tui_launch.core.stacks import find_pyspy

    pyspy = find_pyspy()
    assert pyspy, "py-spy not found"
    p = subprocess.Popen(
        [sys.executable, str(TICKER), "--ticks", "100000", "--interval", "0.01"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        n, t0 = 20, time.monotonic()
        for _ in range(n):
            subprocess.run(
                [pyspy, "dump", "--pid", str(p.pid), "--json", "--nonblocking"],
                capture_output=True,
                check=True,
            )
        wall = (time.monotonic() - t0) / n
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / n
        print(f"py-spy dump --nonblocking: {1000 * cpu:.1f} ms CPU, {1000 * wall:.1f} ms wall each")
        for interval in (5.0, 1.0):
            print(
                f"  at --stack-samples {interval:g}: "
                f"{100 * cpu / interval:.2f} % of a core per rank"
            )
    finally:
        p.kill()
        p.wait()


def tick(args: argparse.Namespace) -> None:
    from tui_launch.core.progress.straggler import StragglerJudge, StragglerSampler

    sampler = StragglerSampler(
        lambda e: None, lambda r: None, interval=args.interval, judge=StragglerJudge()
    )
    assert sampler.pyspy, "py-spy not found"
    procs = [
        subprocess.Popen(
            [sys.executable, str(TICKER), "--ticks", "100000", "--interval", "0.01"],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(args.ranks)
    ]
    try:
        time.sleep(2.0)
        sampler.set_workers(0, [(r, p.pid) for r, p in enumerate(procs)])
        sampler.tick()  # warm: the thread pool's imports, py-spy's binary in the page cache
        s0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        for _ in range(args.samples):
            sampler.tick()
        wall = (time.monotonic() - t0) / args.samples
        s1 = resource.getrusage(resource.RUSAGE_SELF)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        own = (s1.ru_utime - s0.ru_utime + s1.ru_stime - s0.ru_stime) / args.samples
        spy = (c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime) / args.samples
        print(
            f"one sample of {args.ranks} ranks: launcher {1000 * own:.1f} ms CPU, "
            f"py-spy {1000 * spy:.1f} ms CPU, {1000 * wall:.0f} ms wall"
        )
        for label, every in (
            (f"every {args.interval:g} s", args.interval),
            (f"backed off ({8 * args.interval:g} s)", 8 * args.interval),
        ):
            print(
                f"  {label}: launcher {100 * own / every:.2f} % of a core, py-spy "
                f"{100 * spy / every:.2f} %, together {100 * (own + spy) / every:.2f} %"
            )
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rate")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--ranks", type=int, default=2)
    r.add_argument("--steps", type=int, default=500)
    r.add_argument("--work", type=float, default=0.01)
    sub.add_parser("dump")
    t = sub.add_parser("tick")
    t.add_argument("--ranks", type=int, default=8)
    t.add_argument("--samples", type=int, default=20)
    t.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    {"rate": rate, "dump": dump, "tick": tick}[args.cmd](args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
