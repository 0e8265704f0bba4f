"""Cost of the worker bootstrap and the Flight Recorder being on by default (issue 34).

Each figure is a ratio against ``--no-bootstrap`` (torchrun's exact worker process) measured
in the same run, the two modes alternating (A B B A ...), so that the machine's load hits both:

- ``steps``: the lockstep gloo loop (``tests/workers/lockstep.py``: every step ``--work`` s of
  busy compute and one all_reduce), rank 0's steps/s from its first to its last step.
  Target: defaults / ``--no-bootstrap`` >= 0.99.
- ``corpus``: two programs of ``tests/corpus/`` run unchanged (nanoGPT, the asynchronous
  all-reduce loop), their rate as tuilaunch's progress watch reads it from their own lines
  (the median of rank 0's ``rate`` in the journal's records, one a second). Target >= 0.99.
- ``start``: a worker's start, ``python -u empty.py`` against the bootstrap with its responder
  (``python -u -m tui_launch.core.workers.shim - empty.py``), wall and CPU, medians.
  Target: at most 50 ms more.
- ``idle``: the launcher's own CPU (each thread's ``schedstat``, in nanoseconds; ``/proc``'s
  10 ms ticks beside it) while ``--ranks`` (8) ranks
  sit in a sleep after joining their group (nothing printed: only the launcher's loops run,
  the live poll of the Flight Recorder among them), over ``--window`` seconds, as a share of
  one core. Target: at most 0.5 % of a core at 8 ranks. Beside it, the CPU of the helper
  processes the launcher started and reaped in the window (py-spy), and with ``--torchrun``
  the same idle job under plain ``torchrun`` (torch's own agent loop: the floor).

Usage: ``python bench/bootstrap.py [steps|corpus|start|idle|all] [--quick] [--repeat N]``.
``--quick`` is a short run of each (a smoke test, not a figure).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tui_launch.core.model.layout import STDOUT, RunDirLayout

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
LOCKSTEP = str(ROOT / "tests" / "workers" / "lockstep.py")
CORPUS = ROOT / "tests" / "corpus"
MODES = {"defaults": (), "no-bootstrap": ("--no-bootstrap",)}
IDLE = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(8)
dist.all_reduce(t)
open(os.path.join(sys.argv[1], "ready_%s" % dist.get_rank()), "w").close()
time.sleep(float(sys.argv[2]))
dist.barrier()
dist.destroy_process_group()
"""


def _launch(flags: tuple[str, ...], log_dir: str, *rest: str, env: dict | None = None) -> list:
    return [PY, "-m", "tui_launch", "--no-tui", *flags, "--log-dir", log_dir, *rest]


def alternate(repeat: int, once: Callable[[str], float]) -> dict[str, list[float]]:
    """``once(mode)`` for each mode, ``repeat`` times, the order swapped every round."""
    out: dict[str, list[float]] = {m: [] for m in MODES}
    names = list(MODES)
    for i in range(repeat):
        for mode in names if i % 2 == 0 else names[::-1]:
            out[mode].append(once(mode))
    return out


def ratio_line(what: str, unit: str, runs: dict[str, list[float]]) -> None:
    on, off = runs["defaults"], runs["no-bootstrap"]
    paired = statistics.median(a / b for a, b in zip(on, off, strict=True))
    ratio = statistics.median(on) / statistics.median(off)
    print(
        f"{what}: defaults {statistics.median(on):.3f} {unit}, --no-bootstrap "
        f"{statistics.median(off):.3f} {unit}: ratio {ratio:.4f}"
        f" (paired {paired:.4f}); samples defaults {[round(x, 3) for x in on]}"
        f" --no-bootstrap {[round(x, 3) for x in off]}"
    )


def bench_steps(repeat: int, steps: int, work: float, nproc: int) -> None:
    def once(mode: str) -> float:
        with tempfile.TemporaryDirectory() as d:
            report = os.path.join(d, "rate")
            cmd = _launch(MODES[mode], d, "--standalone", "--nproc-per-node", str(nproc))
            cmd += [LOCKSTEP, "--steps", str(steps), "--work", str(work), "--report", report]
            subprocess.run(cmd, check=True, capture_output=True, timeout=900)
            return float(Path(report).read_text())

    ratio_line(
        f"steps (lockstep, {nproc} ranks, {work * 1000:.0f} ms + all_reduce)",
        "steps/s",
        alternate(repeat, once),
    )


def _journal_rate(journal: Path) -> float:
    """The median of rank 0's progress rate over the journal's records (the run's middle)."""
    rates = []
    for line in journal.read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") != "progress":
            continue
        for r in e["ranks"]:
            if r["global_rank"] == 0 and r.get("rate"):
                rates.append(float(r["rate"]))
    if not rates:
        raise RuntimeError(f"no progress rate in {journal}")
    return statistics.median(rates[len(rates) // 4 :] or rates)


def _own_step_times(log_dir: str) -> float:
    """nanoGPT's own measure: the median of rank 0's ``time X ms`` per iteration, as steps/s.

    Arrival times are no measure at its speed (150 steps in under a second: a few progress
    records, each a handful of 50 ms polls), its own per-iteration times are.
    """
    (run_dir,) = (p for p in Path(log_dir).iterdir() if p.is_dir())
    log = Path(RunDirLayout(str(run_dir)).rank_log(0, 0, STDOUT))
    times = [float(m) for m in re.findall(r"^iter \d+: .*time ([0-9.]+)ms", log.read_text(), re.M)]
    if len(times) < 10:
        raise RuntimeError(f"too few iterations in {log}")
    return 1000.0 / statistics.median(times[len(times) // 10 :])


# (argv, environment, rate): the rate from the program's own timing where it prints one.
CORPUS_RUNS: dict[str, tuple[list[str], dict[str, str], str]] = {
    "nanogpt": (["nanogpt.py", "--max_iters={steps}"], {}, "own"),
    "async": (["async_collective.py"], {"CORPUS_STEPS": "{steps}"}, "journal"),
}


def bench_corpus(repeat: int, steps: int, nproc: int) -> None:
    for name, (argv, env_extra, rate) in CORPUS_RUNS.items():

        def once(mode: str, argv=argv, env_extra=env_extra, rate=rate) -> float:
            with tempfile.TemporaryDirectory() as d:
                args = [str(CORPUS / argv[0]), *(a.format(steps=steps) for a in argv[1:])]
                env = {**os.environ, **{k: v.format(steps=steps) for k, v in env_extra.items()}}
                journal = Path(d) / "progress.jsonl"  # given with --journal
                cmd = _launch(MODES[mode], d, "--journal", str(journal), "--journal-samples", "1")
                cmd += ["--standalone", "--nproc-per-node", str(nproc), *args]
                # Not check=True: nanoGPT's ranks sometimes abort in gloo's teardown after the
                # last step ("terminate called without an active exception"), which the
                # defaults report as a completed run and --no-bootstrap, like torchrun, as a
                # failure. The rate is read from the steps either way.
                subprocess.run(cmd, capture_output=True, timeout=900, cwd=d, env=env)
                return _own_step_times(d) if rate == "own" else _journal_rate(journal)

        ratio_line(
            f"corpus {name} ({nproc} ranks, {steps} steps)", "steps/s", alternate(repeat, once)
        )


def bench_start(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        empty = os.path.join(d, "empty.py")
        Path(empty).write_text("")
        cmds = {
            "no-bootstrap": [PY, "-u", empty],
            "defaults": [PY, "-u", "-m", "tui_launch.core.workers.shim", "-", empty],
        }
        env = {**os.environ, "TUILAUNCH_RESPONDER_DIR": d, "RANK": "0"}
        wall: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, list[float]] = {m: [] for m in MODES}

        def once(mode: str) -> float:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cmds[mode], check=True, env=env)
            wall[mode].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[mode].append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            return wall[mode][-1]

        alternate(repeat, once)
        for what, runs in (("wall", wall), ("CPU", cpu)):
            a, b = statistics.median(runs["no-bootstrap"]), statistics.median(runs["defaults"])
            print(
                f"start ({what}): plain {a * 1000:.1f} ms, bootstrap + responder {b * 1000:.1f} ms:"
                f" +{(b - a) * 1000:.1f} ms (medians of {repeat})"
            )


def _cpu_seconds(pid: int, children: bool = False) -> float:
    """The process's own CPU (user + system), or that of its children it reaped."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    at = 13 if children else 11
    return (int(fields[at]) + int(fields[at + 1])) / os.sysconf("SC_CLK_TCK")


def _thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of ``pid`` from ``schedstat`` (nanoseconds: ``/proc``'s
    10 ms ticks are a twentieth of the figure over a 20 s window)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


def bench_idle(repeat: int, ranks: int, window: float, torchrun: bool = False) -> None:
    helpers: dict[str, list[float]] = {m: [] for m in (*MODES, "torchrun")}
    ticks: dict[str, list[float]] = {m: [] for m in (*MODES, "torchrun")}

    def once(mode: str) -> float:
        with tempfile.TemporaryDirectory() as d:
            script = os.path.join(d, "idle.py")
            Path(script).write_text(IDLE)
            sleep = window + 120.0  # the ranks wait long enough for any start
            if mode == "torchrun":
                cmd = [PY, "-m", "torch.distributed.run", "--standalone"]
                cmd += ["--nproc-per-node", str(ranks)]
            else:
                cmd = _launch(MODES[mode], d, "--standalone", "--nproc-per-node", str(ranks))
            cmd += [script, d, str(sleep)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 300
                while not all(os.path.exists(os.path.join(d, f"ready_{r}")) for r in range(ranks)):
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("the ranks never got ready")
                    time.sleep(0.2)
                time.sleep(3.0)  # past the start's own work (the first samples, the journal)
                c0, h0, t0 = _cpu_seconds(proc.pid), _cpu_seconds(proc.pid, True), time.monotonic()
                s0 = _thread_seconds(proc.pid)
                time.sleep(window)
                c1, h1, t1 = _cpu_seconds(proc.pid), _cpu_seconds(proc.pid, True), time.monotonic()
                s1 = _thread_seconds(proc.pid)
                helpers[mode].append(100.0 * (h1 - h0) / (t1 - t0))
                ticks[mode].append(100.0 * (c1 - c0) / (t1 - t0))
                # Threads alive at both ends (the idle launcher starts and ends none).
                used = sum(s1[t] - s0[t] for t in s1 if t in s0)
                return 100.0 * used / (t1 - t0)
            finally:
                proc.terminate()
                proc.wait(60)

    runs = alternate(repeat, once)
    ratio_line(f"idle launcher CPU ({ranks} ranks, {window:.0f} s window)", "% of a core", runs)
    for mode in MODES:
        print(
            f"  the same from /proc's 10 ms ticks ({mode}): median"
            f" {statistics.median(ticks[mode]):.3f} %, samples {[round(x, 3) for x in ticks[mode]]}"
        )
    for mode in MODES:
        print(
            f"  helpers reaped in the window ({mode}): median"
            f" {statistics.median(helpers[mode]):.3f} % of a core, samples"
            f" {[round(x, 3) for x in helpers[mode]]}"
        )
    if torchrun:
        plain = [once("torchrun") for _ in range(repeat)]
        print(
            f"  plain torchrun, the same idle job: median {statistics.median(plain):.3f} % of a"
            f" core (torch's own agent loop), samples {[round(x, 3) for x in plain]}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "what", nargs="?", default="all", choices=("steps", "corpus", "start", "idle", "all")
    )
    p.add_argument("--quick", action="store_true", help="a short run of each (a smoke test)")
    p.add_argument("--repeat", type=int, default=4, help="rounds of each mode (alternating)")
    p.add_argument("--steps", type=int, default=600, help="lockstep steps")
    p.add_argument("--work", type=float, default=0.02, help="lockstep compute per step, s")
    p.add_argument("--corpus-steps", type=int, default=300)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--ranks", type=int, default=8, help="ranks of the idle run")
    p.add_argument("--window", type=float, default=30.0, help="seconds of the idle window")
    p.add_argument(
        "--torchrun", action="store_true", help="idle: also plain torchrun, the floor (after)"
    )
    args = p.parse_args()
    if args.quick:
        args.repeat, args.steps, args.corpus_steps, args.window = 2, 100, 40, 5.0
    print(f"load average at start: {os.getloadavg()}")
    if args.what in ("start", "all"):
        bench_start(args.repeat * 8)
    if args.what in ("idle", "all"):
        bench_idle(args.repeat, args.ranks, args.window, args.torchrun)
    if args.what in ("steps", "all"):
        bench_steps(args.repeat, args.steps, args.work, args.nproc)
    if args.what in ("corpus", "all"):
        bench_corpus(args.repeat, args.corpus_steps, args.nproc)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
