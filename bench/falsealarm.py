"""The false-alarm benchmark (issue 35): healthy jobs with the pauses real training has, under
tuilaunch's hang watch, must end with no hang confirmed.

Each job is a real launch, ``tuilaunch --no-tui --standalone --nproc-per-node 4`` (gloo, CPU)
of ``bench/workloads/pauses.py`` with one pause (``--pauses``): a 120 s checkpoint save after
every 120 s of training (``checkpoint``, 480 s), an evaluation pass 20x a step every 25 steps
(``eval``, 240 s), a 30 s first step (``warmup``, 120 s), step times that vary 10x
(``variable``, 180 s), a job that prints every 60 s only (``quiet``, 300 s): 22 minutes of job
time in all, the jobs ``--parallel`` at a time. Each job ends by itself; the harness reads its
journal and counts the suspicions raised (the hang watch's first dump, reason
``hang-suspected``; in brackets those raised before rank 0's first step, while the launch
was starting), those cleared (``hang_cleared`` with ``suspected``), and the hangs
confirmed (``hang`` events): the target is 0 confirmed.

``--scale s`` runs every job's clock ``1/s`` times faster (steps, pauses, print intervals and
job length all times ``s``) and passes ``--hang-timeout`` 300 x ``s`` unless ``--hang-timeout``
is given. That is a faithful stand-in for a rule that compares silence with the timeout and
nothing else (main's rule: every time it looks at scales with the job and the timeout
together; only the launch's start-up and the dumps' own time do not, and both make a scaled
run more likely to raise a suspicion, not less). A rule that learns from step times with
floors in seconds is not scale-free: measure it at ``--scale 1`` with no flag.

Usage::

    .venv/bin/python bench/falsealarm.py                    # every pause, real time, no flag
    .venv/bin/python bench/falsealarm.py --quick            # every pause at --scale 0.1
    .venv/bin/python bench/falsealarm.py --pauses checkpoint,quiet --scale 0.05

Results: ``bench/results/falsealarm-<stamp>.json`` and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hangzoo import (
    RESULTS,
    Program,
    flags_label,
    is_cleared_suspicion,
    is_suspicion,
    is_verdict,
    launch,
    machine,
    read_events,
    run_all,
    write_results,
)

BENCH = Path(__file__).resolve().parent
PAUSES = BENCH / "workloads" / "pauses.py"
# Each pause's job length in seconds at scale 1 (steps and pauses, from its first step).
SECONDS = {"checkpoint": 480.0, "eval": 240.0, "warmup": 120.0, "variable": 180.0, "quiet": 300.0}
DEFAULT_TIMEOUT = 300.0  # main's --hang-timeout default, scaled with --scale


def run_job(work: Path, pause: str, index: int, settings: argparse.Namespace) -> dict[str, Any]:
    """One healthy job from launch to its end; what the hang watch said about it."""
    seconds = SECONDS[pause]
    args = ("--pause", pause, "--seconds", str(seconds), "--scale", str(settings.scale))
    program = Program(pause, PAUSES)
    directory = work / f"{pause}-{index}"
    mark = directory / "first-step"
    env = {"PAUSES_MARK": str(mark)}
    run = launch(directory, program, settings.nproc, settings.flags, env, args)
    cap = seconds * settings.scale + settings.start_cap
    while run.proc.poll() is None and time.time() - run.started < cap:
        time.sleep(1.0)
    outcome = "ended" if run.proc.poll() is not None else "over its time (stopped)"
    ended = run.stop()
    events = read_events(run.journal)
    try:
        first_step: float | None = float(mark.read_text())
    except (OSError, ValueError):
        first_step = None
    suspicions = [e for e in events if is_suspicion(e)]
    return {
        "program": "pauses",
        "pause": pause,
        "index": index,
        "outcome": outcome,
        "job_seconds": seconds * settings.scale,
        "wall_seconds": time.time() - run.started,
        "first_step_wall": first_step,
        "suspicions": len(suspicions),
        # Raised while the launch started (imports, rendezvous): before rank 0's first step.
        "suspicions_at_start": sum(
            1 for e in suspicions if first_step is None or e["wall"] < first_step
        ),
        "cleared": sum(1 for e in events if is_cleared_suspicion(e)),
        "confirmed": sum(1 for e in events if is_verdict(e)),
        "verdicts": [e.get("verdict") for e in events if is_verdict(e)],
        "directory": str(run.directory),
        **ended,
    }


def table(samples: list[dict[str, Any]], scale: float) -> str:
    """One row per job, and the total."""
    lines = [
        "| pause | job time (s) | exit | suspicions raised (at start-up) | cleared "
        "| hangs confirmed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in samples:
        unscaled = f" ({s['job_seconds'] / scale:.0f} at scale 1)" if scale != 1 else ""
        lines.append(
            f"| {s['pause']} | {s['job_seconds']:.0f}{unscaled} "
            f"| {s['launcher_rc']} | {s['suspicions']} ({s['suspicions_at_start']}) "
            f"| {s['cleared']} | {s['confirmed']} |"
        )
    total = sum(s["job_seconds"] for s in samples)
    lines.append(
        f"| **all** | {total:.0f} | | {sum(s['suspicions'] for s in samples)} "
        f"({sum(s['suspicions_at_start'] for s in samples)}) "
        f"| {sum(s['cleared'] for s in samples)} | {sum(s['confirmed'] for s in samples)} |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every pause at --scale 0.1")
    parser.add_argument("--pauses", default=None, help=f"comma-separated of {','.join(SECONDS)}")
    parser.add_argument("--scale", type=float, default=None, help="clock factor (1; quick 0.1)")
    parser.add_argument(
        "--hang-timeout",
        default=None,
        help="passed to tuilaunch (default: none at scale 1, else 300 x the scale)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of each pause (1)")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=5, help="jobs at once (5)")
    parser.add_argument("--start-cap", type=float, default=240.0, help="start-up allowance (s)")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--name", default="falsealarm")
    parser.add_argument("--work", default=None, help="keep the jobs' directories here")
    args = parser.parse_args(argv)
    pauses = tuple(args.pauses.split(",") if args.pauses else SECONDS)
    bad = [p for p in pauses if p not in SECONDS]
    if bad:
        print(f"falsealarm.py: unknown pause: {', '.join(bad)}", file=sys.stderr)
        return 2
    if args.scale is None:
        args.scale = 0.1 if args.quick else 1.0
    timeout = args.hang_timeout
    if timeout is None and args.scale != 1.0:
        timeout = f"{DEFAULT_TIMEOUT * args.scale:g}"
    args.flags = ["--hang-timeout", timeout] if timeout is not None else []
    started = time.time()
    info = machine()
    print(
        f"falsealarm: {len(pauses)} pause(s) x {args.runs}, scale {args.scale:g}, "
        f"{flags_label(args.flags)}; load {os.getloadavg()}",
        file=sys.stderr,
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        work = (
            Path(args.work)
            if args.work
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="falsealarm-")))
        )
        jobs = [
            (lambda p=p, i=i: run_job(work, p, i, args)) for i in range(args.runs) for p in pauses
        ]
        samples = run_all(jobs, args.parallel)
    info["loadavg_at_end"] = os.getloadavg()
    doc = {
        "command": "falsealarm",
        "argv": argv,
        "started": started,
        "duration_s": time.time() - started,
        "machine": info,
        "settings": {
            "pauses": pauses,
            "scale": args.scale,
            "runs": args.runs,
            "nproc": args.nproc,
            "parallel": args.parallel,
            "flags": args.flags,
        },
        "samples": samples,
        "confirmed": sum(s["confirmed"] for s in samples),
    }
    path = write_results(args.name, doc, args.results_dir)
    print(
        f"## falsealarm: {args.nproc} gloo ranks, scale {args.scale:g}, "
        f"{flags_label(args.flags)} ({time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}"
        f", commit {info['git_commit']}, load {info['loadavg_at_start'][0]:.2f} -> "
        f"{info['loadavg_at_end'][0]:.2f}, {args.parallel} jobs at once)\n"
    )
    print(table(samples, args.scale))
    left = sum(s["leftover_processes"] for s in samples)
    print(f"\nLeftover processes: {left}. Raw data: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
