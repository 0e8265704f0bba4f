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

``share``  — the sampler's CPU as a share of the ranks' CPU, in a real launch (much less noisy
            than a step rate): ``workloads/lockwork.py`` (fixed work per step) under tuilaunch
            at each ``--stack-samples`` setting in turn; the harness reads ``/proc`` every
            0.2 s: the launcher's ``cutime + cstime`` (its waited children: the py-spy
            processes, nothing else while the ranks run), its own ``utime + stime``, and each
            rank's. py-spy ``--nonblocking`` never pauses a rank, so the CPU it takes is the
            most it can cost the ranks, and exactly that on a machine with no spare core.
``windows`` — the step rate itself, resolved to well under 1 %: ONE launch of
            ``lockwork.py`` (``--stack-samples 0``), and the harness alternates windows of
            ``--window`` seconds with and without sampling every rank (the sampler's own
            ``StragglerSampler.tick``, every ``--interval`` s, from this process: the same
            py-spy processes the launcher would start). Each "on" window's rate (rank 0's
            steps, by its own clock) is compared with the mean of the two "off" windows around
            it: run-to-run noise (start-up, placement, other load drifting over minutes)
            cancels; the sampling is made ``5 / --interval`` times denser than the default to
            measure the dose, and the effect at the default is that divided by the factor.

    .venv/bin/python bench/stragglers.py rate [--rounds 5] [--ranks 2] [--steps 500]
    .venv/bin/python bench/stragglers.py share [--rounds 3] [--ranks 2] [--seconds 40]
    .venv/bin/python bench/stragglers.py windows [--ranks 2] [--windows 40] [--window 3]
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
from subprocess import Popen

ROOT = Path(__file__).resolve().parent.parent
LOCKSTEP = ROOT / "tests" / "workers" / "lockstep.py"
LOCKWORK = ROOT / "bench" / "workloads" / "lockwork.py"
TICK = os.sysconf("SC_CLK_TCK")
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
    from tui_launch.core.diagnosis.stacks import find_pyspy

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
    from tui_launch.core.diagnosis.straggler import StragglerJudge, StragglerSampler

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


def _stat(pid: int) -> tuple[float, float] | None:
    """(utime + stime, cutime + cstime) of ``pid`` in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            f = fp.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK


def _pids(d: Path, ranks: int) -> list[int] | None:
    try:
        return [int((d / f"pid_{r}").read_text()) for r in range(ranks)]
    except (OSError, ValueError):
        return None


def _launch(d: Path, args: argparse.Namespace, stack_samples: float, seconds: float) -> Popen:
    cmd = [
        sys.executable, "-m", "tui_launch", "--no-tui", "--standalone",
        "--nproc-per-node", str(args.ranks), "--stack-samples", str(stack_samples),
        "--no-gpu", "--log-dir", str(d / "logs"), str(LOCKWORK), str(d),
        "--seconds", str(seconds), "--iters", str(args.iters),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=d, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )


def share_run(args: argparse.Namespace, stack_samples: float) -> dict[str, float]:
    """One launch; the CPU of the launcher's children, the launcher and the ranks meanwhile."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        proc = _launch(d, args, stack_samples, seconds=args.seconds + 600)  # the harness stops it
        try:
            first = last = None
            t_end = None
            while proc.poll() is None:
                time.sleep(0.2)
                pids = _pids(d, args.ranks)
                if pids is None:
                    continue
                launcher = _stat(proc.pid)
                ranks = [_stat(p) for p in pids]
                if launcher is None or any(r is None for r in ranks):
                    break
                point = (time.monotonic(), launcher, sum(r[0] for r in ranks if r))
                if first is None:
                    first, t_end = point, point[0] + args.seconds
                last = point
                if t_end is not None and point[0] >= t_end:
                    break
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if first is None or last is None or last is first:
        raise RuntimeError("the ranks never ran")
    wall = last[0] - first[0]
    spy = last[1][1] - first[1][1]
    own = last[1][0] - first[1][0]
    ranks_cpu = last[2] - first[2]
    return {"wall": wall, "spy": spy, "launcher": own, "ranks": ranks_cpu}


def share(args: argparse.Namespace) -> None:
    settings = [float(x) for x in args.settings.split(",")]
    got: dict[float, list[dict[str, float]]] = {s: [] for s in settings}
    for k in range(args.rounds):
        for s in settings if k % 2 == 0 else list(reversed(settings)):
            r = share_run(args, s)
            got[s].append(r)
            print(
                f"round {k} --stack-samples {s:g}: {r['wall']:.1f} s, ranks {r['ranks']:.2f} s "
                f"CPU, py-spy {r['spy']:.3f} s ({100 * r['spy'] / r['ranks']:.2f} % of the "
                f"ranks'), launcher {r['launcher']:.2f} s, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    base = (
        statistics.median(r["launcher"] / r["wall"] for r in got.get(0.0, [])) if 0.0 in got else 0
    )
    print(
        "\n| --stack-samples | py-spy CPU / ranks' CPU | py-spy, % of a core | launcher, % of a "
        "core (vs off) | ranks, % of a core |\n|---|---|---|---|---|"
    )
    for s in settings:
        rs = got[s]
        sh = statistics.median(100 * r["spy"] / r["ranks"] for r in rs)
        lo, hi = (
            min(100 * r["spy"] / r["ranks"] for r in rs),
            max(100 * r["spy"] / r["ranks"] for r in rs),
        )
        spy = statistics.median(100 * r["spy"] / r["wall"] for r in rs)
        own = statistics.median(100 * r["launcher"] / r["wall"] for r in rs)
        rk = statistics.median(100 * r["ranks"] / r["wall"] for r in rs)
        print(
            f"| {s:g} | {sh:.2f} % ({lo:.2f}-{hi:.2f}) | {spy:.2f} | {own:.2f} "
            f"({own - 100 * base:+.2f}) | {rk:.1f} |"
        )


def windows(args: argparse.Namespace) -> None:
    from tui_launch.core.diagnosis.straggler import StragglerJudge, StragglerSampler

    sampler = StragglerSampler(
        lambda e: None, lambda r: None, interval=args.interval, judge=StragglerJudge(), backoff=1
    )
    assert sampler.pyspy, "py-spy not found"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        proc = _launch(d, args, 0.0, seconds=args.window * (args.windows + 2) + 20)
        spans: list[tuple[bool, float, float]] = []
        ticks = 0
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            while (pids := _pids(d, args.ranks)) is None:
                if proc.poll() is not None:
                    raise RuntimeError("the launch ended early")
                time.sleep(0.2)
            sampler.set_workers(0, list(enumerate(pids)))
            time.sleep(args.window)  # past the start-up
            for w in range(args.windows):
                on = w % 2 == 1
                t0 = time.monotonic()
                end = t0 + args.window
                while (now := time.monotonic()) < end:
                    if on:
                        sampler.tick()
                        ticks += 1
                        time.sleep(max(0.0, min(end, now + args.interval) - time.monotonic()))
                    else:
                        time.sleep(end - now)
                spans.append((on, t0, time.monotonic()))
                print(f"window {w} {'on ' if on else 'off'} done, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)  # fmt: skip
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            proc.wait(timeout=args.window * 2 + 60)  # the loop ends by itself a little later
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        steps = _steps(d)
    spy = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
    rates = []
    for on, a, b in spans:
        n = sum(1 for t in steps if a <= t < b)
        rates.append((on, n / (b - a)))
    deltas = []
    for i in range(1, len(rates) - 1):
        on, r = rates[i]
        if on:
            ref = (rates[i - 1][1] + rates[i + 1][1]) / 2
            deltas.append(100 * (r - ref) / ref)
    mean = statistics.mean(deltas)
    se = statistics.stdev(deltas) / len(deltas) ** 0.5 if len(deltas) > 1 else float("nan")
    factor = 5.0 / args.interval
    off = [r for on, r in rates if not on]
    print(
        f"{len(deltas)} on-windows of {args.window:g} s, sampling every {args.interval:g} s "
        f"({ticks} samples of {args.ranks} ranks, py-spy {spy:.2f} s CPU); off-window rates "
        f"{min(off):.1f}-{max(off):.1f} steps/s (median {statistics.median(off):.1f})\n"
        f"step rate, on vs the mean of the off windows around it: mean {mean:+.2f} % "
        f"(standard error {se:.2f} %), median {statistics.median(deltas):+.2f} %\n"
        f"at the default --stack-samples 5 (1/{factor:g} of this dose): {mean / factor:+.3f} % "
        f"(+- {se / factor:.3f} %)"
    )


def _steps(d: Path) -> list[float]:
    """Rank 0's step times (``time.monotonic()``), from the ``steps`` file it writes."""
    path = d / "steps"
    return [float(x) for x in path.read_text().split()] if path.exists() else []


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
    sh = sub.add_parser("share")
    sh.add_argument("--rounds", type=int, default=3)
    sh.add_argument("--ranks", type=int, default=2)
    sh.add_argument("--seconds", type=float, default=40.0)
    sh.add_argument("--iters", type=int, default=200_000)
    sh.add_argument("--settings", default="0,5,1")
    wi = sub.add_parser("windows")
    wi.add_argument("--ranks", type=int, default=2)
    wi.add_argument("--windows", type=int, default=41)
    wi.add_argument("--window", type=float, default=3.0)
    wi.add_argument("--interval", type=float, default=0.5)
    wi.add_argument("--iters", type=int, default=200_000)
    args = parser.parse_args()
    {"rate": rate, "dump": dump, "tick": tick, "share": share, "windows": windows}[args.cmd](args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
