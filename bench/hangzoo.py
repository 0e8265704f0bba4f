"""The hang benchmark (issue 35): how fast tuilaunch's hang watch suspects and confirms each
kind of hang, and whether its verdict names the rank that hung.

Each run is a real launch, ``tuilaunch --no-tui --standalone --nproc-per-node 4`` (gloo, CPU)
of a program with a hang class chosen by the environment (``tests/corpus/_hooks.py``:
``CORPUS_HANG_KIND``, ``CORPUS_HANG_RANK``, ``CORPUS_HANG_STEP``), on

* ``loop``: ``tests/corpus/ddp_loop.py``, a plain DDP loop (0.2 s steps, rank 0 prints each);
* ``tutorial``: ``tests/corpus/multigpu_torchrun.py``, the PyTorch DDP tutorial, unchanged
  (``CORPUS_STEP_SECONDS=0.2``; every rank prints one line per epoch of 16 steps);
* ``nanogpt`` (on request, ``--programs``): ``tests/corpus/nanogpt.py``, nanoGPT's loop
  (``CORPUS_STEP_SECONDS=0.2``; rank 0 prints ``iter N: loss ...`` each step);
* ``megatron`` and ``titan`` (on request): ``tests/corpus/megatron_style.py`` (TP=2 x PP=2,
  22 process groups; the last rank prints each iteration) and
  ``tests/corpus/torchtitan_style.py`` (FSDP2 x TP on a 2-D mesh; every rank prints each
  step), ``CORPUS_STEP_SECONDS=0.2``: jobs of many groups, where the verdict must name the
  rank in its group.

The classes (``--classes``): ``sigstop`` (the rank is SIGSTOPped), ``sleep`` (it sleeps forever
in its own code before the collective), ``collective`` (it calls ``all_gather`` where the
others all-reduce), ``gil`` (a C call holding the GIL), ``dataloader`` (its DataLoader worker
deadlocks), ``chatty`` (stuck in its own code while a background thread prints every 2 s),
``lock`` (it waits for a lock another of its threads holds).

The hung rank writes the wall time at which it hangs into a file (``CORPUS_HANG_MARK``) just
before it does; the harness reads the run's journal (``--journal``) and measures from that time
to the first suspicion (the hang watch's first dump, ``stacks_dumped`` with reason
``hang-suspected``) and to the confirmed verdict (the ``hang`` event), and whether the
verdict's ``odd_ranks`` is exactly the hung rank. Suspicions raised before the hang started are
false ones and counted apart. After the verdict (or ``--cap`` seconds after the hang without
one: a miss) the harness stops the launcher with SIGTERM, waits for it, and counts (and kills)
any process of the launch left behind. The rank that hangs rotates with the run (1, 2, 3, 0,
...), so rank 0, the one that prints, hangs too.

Launches run ``--parallel`` at a time (a hung job is idle, so a few at once cost little; on a
busy machine, fewer). Results: ``bench/results/hangzoo-<stamp>.json`` (every run) and a
Markdown table on stdout (per program and class: runs, confirmed, time to suspicion and to
verdict, median and worst, right rank n/N).

Usage::

    .venv/bin/python bench/hangzoo.py                      # every class, both programs, 5 runs
    .venv/bin/python bench/hangzoo.py --quick              # 4 classes, loop only, 2 runs
    .venv/bin/python bench/hangzoo.py --hang-timeout 10    # a flag for the rule (a labelled row)
    .venv/bin/python bench/hangzoo.py --classes sleep,gil --programs loop --runs 3

Everything after ``--`` goes to tuilaunch before the program (``-- --on-hang dump``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tui_launch.core.model.layout import JOURNAL_NAME
from tui_launch.testing.procs import env_holders

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CORPUS = ROOT / "tests" / "corpus"
RESULTS = BENCH / "results"
TOKEN_VAR = "TUILAUNCH_BENCH_TOKEN"

CLASSES = ("sigstop", "sleep", "collective", "gil", "dataloader", "chatty", "lock")
QUICK_CLASSES = ("sigstop", "sleep", "collective", "chatty")
# The bar: confirmed and the right rank named in <= 15 s at the median, <= 30 s worst.
TARGET_MEDIAN = 15.0
TARGET_WORST = 30.0


@dataclass(frozen=True)
class Program:
    """A program the hang classes are applied to: its path, arguments, environment, and the
    step at which the rank hangs (a few seconds into training)."""

    name: str
    path: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    hang_step: int = 15


PROGRAMS = {
    "loop": Program("loop", CORPUS / "ddp_loop.py", hang_step=15),
    "tutorial": Program(
        "tutorial",
        CORPUS / "multigpu_torchrun.py",
        ("100000", "100000"),  # total_epochs save_every: it runs until the hang
        {"CORPUS_STEP_SECONDS": "0.2"},
        hang_step=20,
    ),
    "nanogpt": Program(
        "nanogpt",
        CORPUS / "nanogpt.py",
        (),
        {"CORPUS_STEPS": "1000000", "CORPUS_STEP_SECONDS": "0.2"},
        hang_step=20,
    ),
    "megatron": Program(
        "megatron",
        CORPUS / "megatron_style.py",
        (),
        {"CORPUS_STEPS": "1000000", "CORPUS_STEP_SECONDS": "0.2"},
        hang_step=20,
    ),
    "titan": Program(
        "titan",
        CORPUS / "torchtitan_style.py",
        (),
        {"CORPUS_STEPS": "1000000", "CORPUS_STEP_SECONDS": "0.2"},
        hang_step=20,
    ),
}
DEFAULT_PROGRAMS = ("loop", "tutorial")


def base_env() -> dict[str, str]:
    """This environment without what would change a launch (a torchrun's or Slurm's)."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_", "SLURMD_", "CORPUS_"))
        and k not in ("OMP_NUM_THREADS", "LOGLEVEL")
    }


def leftovers(token: str) -> list[int]:
    """Live processes (not zombies) whose environment holds the launch's token."""
    return env_holders(TOKEN_VAR, token)


def read_events(path: Path) -> list[dict[str, Any]]:
    """The journal's events so far (a last line still being written is skipped)."""
    events = []
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def is_suspicion(e: dict[str, Any]) -> bool:
    """The hang watch's first dump of a suspected hang."""
    return e["kind"] == "stacks_dumped" and str(e.get("reason", "")).startswith("hang-suspect")


def is_verdict(e: dict[str, Any]) -> bool:
    """A confirmed hang."""
    return e["kind"] == "hang"


def is_cleared_suspicion(e: dict[str, Any]) -> bool:
    """A suspicion that ended before it was confirmed."""
    return e["kind"] == "hang_cleared" and bool(e.get("suspected"))


@dataclass
class Launched:
    """A launch under way: its process, token, directory, start time."""

    proc: subprocess.Popen[bytes]
    token: str
    directory: Path
    started: float
    out: Any

    @property
    def journal(self) -> Path:
        return self.directory / JOURNAL_NAME

    def stop(self, grace: float = 90.0) -> dict[str, Any]:
        """SIGTERM the launcher, wait for it, then kill whatever of the launch is left."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            rc: int | None = self.proc.wait(grace)
            forced = False
        except subprocess.TimeoutExpired:
            forced = True
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait(10)
        deadline = time.monotonic() + 10
        left = leftovers(self.token)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = leftovers(self.token)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        self.out.close()
        return {"launcher_rc": rc, "launcher_forced": forced, "leftover_processes": len(left)}


def launch(
    directory: Path,
    program: Program,
    nproc: int,
    flags: list[str],
    env: dict[str, str],
    args: tuple[str, ...] | None = None,
) -> Launched:
    """Start ``tuilaunch --no-tui --standalone`` of ``program`` with its journal in
    ``directory`` (which also gets its logs, its temp files and its output)."""
    directory.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    full_env = {
        **base_env(),
        **program.env,
        **env,
        TOKEN_VAR: token,
        "TMPDIR": str(directory),
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "tui_launch",
        "--no-tui",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--journal",
        str(directory / JOURNAL_NAME),
        "--log-dir",
        str(directory / "logs"),
        *flags,
        str(program.path),
        *(program.args if args is None else args),
    ]
    out = open(directory / "output.txt", "wb")  # noqa: SIM115 (closed by Launched.stop)
    proc = subprocess.Popen(
        cmd,
        cwd=directory,
        env=full_env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return Launched(proc, token, directory, time.time(), out)


def run_one(
    work: Path,
    program: Program,
    kind: str,
    index: int,
    settings: argparse.Namespace,
) -> dict[str, Any]:
    """One hang: launch, wait for the verdict (or the cap), stop, measure."""
    nproc = settings.nproc
    rank = (index + 1) % nproc
    directory = work / f"{program.name}-{kind}-{index}"
    mark = directory / "hang-mark.json"
    env = {
        "CORPUS_HANG_RANK": str(rank),
        "CORPUS_HANG_STEP": str(program.hang_step),
        "CORPUS_HANG_KIND": kind,
        "CORPUS_HANG_MARK": str(mark),
    }
    run = launch(directory, program, nproc, settings.flags, env)
    hang_wall: float | None = None
    outcome = ""
    while not outcome:
        time.sleep(0.5)
        if hang_wall is None and mark.exists():
            with contextlib.suppress(ValueError, OSError):
                hang_wall = float(json.loads(mark.read_text())["wall"])
        events = read_events(run.journal)
        if hang_wall is not None and any(is_verdict(e) and e["wall"] >= hang_wall for e in events):
            outcome = "confirmed"
        elif run.proc.poll() is not None:
            outcome = "launcher exited"
        elif hang_wall is None and time.time() - run.started > settings.start_cap:
            outcome = "never hung"
        elif hang_wall is not None and time.time() - hang_wall > settings.cap:
            outcome = "missed"
    ended = run.stop()
    events = read_events(run.journal)
    sample: dict[str, Any] = {
        "program": program.name,
        "kind": kind,
        "index": index,
        "rank": rank,
        "outcome": outcome,
        "hang_wall": hang_wall,
        "directory": str(directory),
        **ended,
    }
    before = [e for e in events if is_suspicion(e) and (hang_wall is None or e["wall"] < hang_wall)]
    sample["false_suspicions_before_hang"] = len(before)
    if hang_wall is None:
        return sample
    after = [e for e in events if e["wall"] >= hang_wall]
    suspicions = [e for e in after if is_suspicion(e)]
    verdicts = [e for e in after if is_verdict(e)]
    verdict = verdicts[0] if verdicts else None
    sample["to_suspicion_s"] = suspicions[0]["wall"] - hang_wall if suspicions else None
    sample["suspicion_odd_ranks"] = suspicions[0].get("odd_ranks") if suspicions else None
    sample["suspicions_cleared_in_hang"] = sum(
        1
        for e in after
        if is_cleared_suspicion(e) and (verdict is None or e["wall"] <= verdict["wall"])
    )
    sample["suspicions_in_hang"] = len(suspicions)
    if verdict is not None:
        sample["to_verdict_s"] = verdict["wall"] - hang_wall
        sample["odd_ranks"] = verdict.get("odd_ranks")
        sample["right_rank"] = verdict.get("odd_ranks") == [rank]
        sample["verdict"] = verdict.get("verdict")
        sample["confirmation"] = verdict.get("confirmation")
        sample["stood_still"] = verdict.get("stood_still", "")  # the adaptive rule's words
    else:
        sample["to_verdict_s"] = None
        sample["right_rank"] = False
    return sample


def _fmt(values: list[float | None], worst: bool = False) -> str:
    """Median (or worst) of times where a missing one (None) counts as infinite."""
    if not values:
        return "-"
    xs = [float("inf") if v is None else v for v in values]
    x = max(xs) if worst else statistics.median(xs)
    return "never" if x == float("inf") else f"{x:.1f}"


def summarize(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per program and class."""
    rows = []
    keys = sorted({(s["program"], s["kind"]) for s in samples}, key=_order)
    for program, kind in keys:
        mine = [s for s in samples if (s["program"], s["kind"]) == (program, kind)]
        hung = [s for s in mine if s["hang_wall"] is not None]
        verdicts = [s.get("to_verdict_s") for s in hung]
        right = sum(1 for s in hung if s.get("right_rank"))
        named = [s for s in hung if s.get("right_rank") and s.get("to_verdict_s") is not None]
        ok_median = (
            len(named) == len(hung)
            and bool(hung)
            and (statistics.median(s["to_verdict_s"] for s in named) <= TARGET_MEDIAN)
        )
        ok_worst = ok_median and max(s["to_verdict_s"] for s in named) <= TARGET_WORST
        rows.append(
            {
                "program": program,
                "kind": kind,
                "runs": len(mine),
                "hung": len(hung),
                "confirmed": sum(1 for v in verdicts if v is not None),
                "suspicion_median": _fmt([s.get("to_suspicion_s") for s in hung]),
                "suspicion_worst": _fmt([s.get("to_suspicion_s") for s in hung], worst=True),
                "verdict_median": _fmt(verdicts),
                "verdict_worst": _fmt(verdicts, worst=True),
                "right_rank": right,
                "false_before": sum(s["false_suspicions_before_hang"] for s in mine),
                "cleared_in_hang": sum(s.get("suspicions_cleared_in_hang", 0) for s in hung),
                "leftovers": sum(s["leftover_processes"] for s in mine),
                "meets_target": ok_worst,
                "outcomes": sorted({s["outcome"] for s in mine}),
            }
        )
    return rows


def _order(key: tuple[str, str]) -> tuple[int, int]:
    program, kind = key
    programs = list(PROGRAMS)
    return (
        programs.index(program) if program in programs else 99,
        CLASSES.index(kind) if kind in CLASSES else 99,
    )


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the summary."""
    lines = [
        "| program | class | runs | confirmed | to suspicion (median / worst, s) "
        "| to verdict (median / worst, s) | right rank | suspicions cleared in the hang "
        "| false suspicions before it | <= 15 s / 30 s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['kind']} | {r['runs']} | {r['confirmed']}/{r['hung']} "
            f"| {r['suspicion_median']} / {r['suspicion_worst']} "
            f"| {r['verdict_median']} / {r['verdict_worst']} "
            f"| {r['right_rank']}/{r['hung']} | {r['cleared_in_hang']} | {r['false_before']} "
            f"| {'yes' if r['meets_target'] else 'no'} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """Where and on what code the benchmark ran."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    edited = (
        subprocess.run(
            ["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "tui_launch"]
        ).returncode
        != 0
    )
    import torch

    return {
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "git_commit": commit,
        "tui_launch_edited_since_commit": edited,
        "loadavg_at_start": os.getloadavg(),
    }


def run_all(
    jobs: list[Callable[[], dict[str, Any]]], parallel: int, quiet: bool = False
) -> list[dict[str, Any]]:
    """Run the jobs ``parallel`` at a time, in order; print a line per finished one."""
    samples: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for sample in pool.map(lambda job: job(), jobs):
            samples.append(sample)
            if not quiet:
                print(_line(sample), file=sys.stderr, flush=True)
    return samples


def _line(s: dict[str, Any]) -> str:
    keys = ("to_suspicion_s", "to_verdict_s")
    times = " ".join(
        f"{k[3:-2]}={s[k]:.1f}s" if s.get(k) is not None else f"{k[3:-2]}=-" for k in keys
    )
    if "pause" in s:
        return (
            f"{s['pause']}#{s['index']}: {s['outcome']} rc={s['launcher_rc']} "
            f"suspicions={s['suspicions']} cleared={s['cleared']} confirmed={s['confirmed']} "
            f"left={s['leftover_processes']}"
        )
    what = s["kind"]
    return (
        f"{s['program']}/{what}#{s['index']}: {s['outcome']} {times} "
        f"odd={s.get('odd_ranks')} rank={s.get('rank')} left={s['leftover_processes']}"
    )


def write_results(name: str, doc: dict[str, Any], results_dir: str) -> Path:
    """``<results_dir>/<name>-<stamp>.json``."""
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(doc["started"]))
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def flags_label(flags: list[str]) -> str:
    """How the rule was set, in the table's words."""
    return " ".join(flags) if flags else "no flag (the default rule)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 classes, loop only, 2 runs")
    parser.add_argument("--runs", type=int, default=None, help="runs per class (5; quick 2)")
    parser.add_argument("--classes", default=None, help=f"comma-separated of {','.join(CLASSES)}")
    parser.add_argument("--programs", default=None, help="comma-separated of " + ",".join(PROGRAMS))
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=2, help="launches at once (2)")
    parser.add_argument(
        "--hang-timeout", default=None, help="passed to tuilaunch (default: no flag)"
    )
    parser.add_argument(
        "--cap",
        type=float,
        default=None,
        help="seconds after the hang to wait for a verdict (default: 120, or the timeout + 90)",
    )
    parser.add_argument("--start-cap", type=float, default=300.0, help="seconds to reach the hang")
    parser.add_argument("--results-dir", default=str(RESULTS))
    parser.add_argument("--name", default="hangzoo")
    parser.add_argument("--work", default=None, help="keep the runs' directories here")
    args = parser.parse_args(argv)
    classes = tuple(
        args.classes.split(",") if args.classes else (QUICK_CLASSES if args.quick else CLASSES)
    )
    programs = tuple(
        args.programs.split(",") if args.programs else ("loop",) if args.quick else DEFAULT_PROGRAMS
    )
    bad = [c for c in classes if c not in CLASSES] + [p for p in programs if p not in PROGRAMS]
    if bad:
        print(f"hangzoo.py: unknown class or program: {', '.join(bad)}", file=sys.stderr)
        return 2
    runs = args.runs or (2 if args.quick else 5)
    args.flags = [*(["--hang-timeout", args.hang_timeout] if args.hang_timeout else []), *extra]
    if args.cap is None:
        args.cap = float(args.hang_timeout) + 90.0 if args.hang_timeout else 120.0
    started = time.time()
    info = machine()
    print(
        f"hangzoo: {len(programs)} program(s) x {len(classes)} class(es) x {runs} run(s), "
        f"{args.nproc} ranks, {flags_label(args.flags)}; load {os.getloadavg()}",
        file=sys.stderr,
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        work = (
            Path(args.work)
            if args.work
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hangzoo-")))
        )
        jobs = [
            (lambda p=PROGRAMS[p], k=k, i=i: run_one(work, p, k, i, args))
            for i in range(runs)
            for p in programs
            for k in classes
        ]
        samples = run_all(jobs, args.parallel)
    info["loadavg_at_end"] = os.getloadavg()
    rows = summarize(samples)
    doc = {
        "command": "hangzoo",
        "argv": argv + (["--", *extra] if extra else []),
        "started": started,
        "duration_s": time.time() - started,
        "machine": info,
        "settings": {
            "classes": classes,
            "programs": programs,
            "runs": runs,
            "nproc": args.nproc,
            "parallel": args.parallel,
            "flags": args.flags,
            "cap": args.cap,
        },
        "summary": rows,
        "samples": samples,
    }
    path = write_results(args.name, doc, args.results_dir)
    print(
        f"## hangzoo: {args.nproc} gloo ranks, {flags_label(args.flags)} "
        f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}, commit "
        f"{info['git_commit']}, load {info['loadavg_at_start'][0]:.2f} -> "
        f"{info['loadavg_at_end'][0]:.2f}, {args.parallel} launches at once)\n"
    )
    print(table(rows))
    print(f"\nLeftover processes: {sum(r['leftovers'] for r in rows)}. Raw data: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
