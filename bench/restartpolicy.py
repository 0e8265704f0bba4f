"""Time to give up on a doomed job: tuilaunch's restart policy against torchrun's restarts.

Two scripts that every restart fails the same way, each launched with
``--standalone --nproc-per-node 2 --max-restarts 3`` by ``torchrun`` and by ``tuilaunch
--no-tui`` (its default ``--restart-policy smart``), one after the other, interleaved over
``--runs`` rounds:

- ``startup``: ``import torch`` and then a module that does not exist (a typo in an import):
  torchrun runs 4 attempts, each paying for the rendezvous and ``import torch``; tuilaunch
  stops after the first (the ``startup`` rule);
- ``storm``: ``import torch``, three training steps, then rank 1 raises at the same step in
  every attempt: torchrun runs 4 attempts, tuilaunch stops after the second (the
  ``same-failure`` rule: it has to see the failure twice to know it repeats).

For each launch: the wall time from start to exit, the exit status and the attempts run
(``attempt_N`` directories of torchrun's log directory, the journal's ``workers_started``
for tuilaunch). The result is the median per launcher and the ratio tuilaunch/torchrun.

Usage::

    nice .venv/bin/python bench/restartpolicy.py --runs 3 --out restartpolicy.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tui_launch.core.model import layout

STARTUP = """\
import torch  # what every attempt pays for before it fails
import not_a_module_of_this_bench  # noqa: F401
"""

STORM = """\
import os, time
import torch  # what every attempt pays for before it fails
rank = int(os.environ["RANK"])
for step in range(1, 100):
    print(f"step {step}/100 loss 0.5", flush=True)
    if rank == 1 and step == 3:
        raise ValueError("bad batch at step 3")
    time.sleep(0.2)
"""

SCRIPTS = {"startup": STARTUP, "storm": STORM}
LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run"],
    "tuilaunch": ["-m", "tui_launch", "--no-tui"],
}


def attempts_of(launcher: str, log_dir: Path, journal: Path) -> int:
    """How many attempts the launch ran."""
    if launcher == "tuilaunch":
        lines = journal.read_text().splitlines() if journal.exists() else []
        return sum(1 for ln in lines if json.loads(ln).get("kind") == "workers_started")
    return len(list(log_dir.glob(f"*/{layout.ATTEMPT_PREFIX}*")))


def launch(launcher: str, script: Path, work: Path, restarts: int) -> dict[str, float | int]:
    """One launch: wall seconds to exit, exit status, attempts run."""
    log_dir = work / f"logs-{launcher}-{time.monotonic_ns()}"
    journal = work / f"journal-{time.monotonic_ns()}.jsonl"
    cmd = [sys.executable, *LAUNCHERS[launcher]]
    cmd += ["--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts)]
    cmd += ["--log-dir", str(log_dir)]
    if launcher == "tuilaunch":
        cmd += ["--journal", str(journal)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.run([*cmd, str(script)], env=env, capture_output=True, timeout=600)
    wall = time.monotonic() - t0
    return {
        "wall": wall,
        "code": proc.returncode,
        "attempts": attempts_of(launcher, log_dir, journal),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    results: dict[str, dict[str, list[dict[str, float | int]]]] = {}
    with tempfile.TemporaryDirectory(prefix="restartpolicy-") as tmp:
        work = Path(tmp)
        for name, text in SCRIPTS.items():
            script = work / f"{name}.py"
            script.write_text(text)
            results[name] = {k: [] for k in LAUNCHERS}
            for _ in range(a.runs):
                for launcher in LAUNCHERS:  # interleaved: a patch of load hits both alike
                    results[name][launcher].append(launch(launcher, script, work, a.max_restarts))
    print(f"--max-restarts {a.max_restarts}, {a.runs} run(s) each, medians")
    print(f"{'script':8} {'launcher':10} {'give up (s)':>12} {'attempts':>9} {'exit':>5}")
    summary = {}
    for name, by in results.items():
        med = {}
        for launcher, runs in by.items():
            wall = statistics.median(float(r["wall"]) for r in runs)
            att = statistics.median(int(r["attempts"]) for r in runs)
            codes = sorted({int(r["code"]) for r in runs})
            med[launcher] = wall
            print(f"{name:8} {launcher:10} {wall:12.1f} {att:9.0f} {codes!s:>5}")
        ratio = med["tuilaunch"] / med["torchrun"]
        summary[name] = {"medians": med, "ratio": ratio}
        print(f"{name:8} tuilaunch/torchrun = {ratio:.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
