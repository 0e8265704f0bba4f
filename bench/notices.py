"""Benchmark: ``tuilaunch report`` and ``status --json`` of a journal full of notices (issue 32).

A run of 2 ranks whose journal holds ``N`` :class:`~tui_launch.core.model.events.Notice`
events (a part that warns again and again: a store retry storm, a full disk, a reaper that
keeps dying) between its start and its end. Folding them costs each reducer one step per
event; a reducer that rebuilt the snapshot's tuple of notices for every notice made the two
commands quadratic in ``N``.

Measured, for each ``N`` of ``--notices``: the wall and CPU time (user + system of the child,
which a shared machine's load disturbs far less) of ``python -m tui_launch report PATH -o OUT``
and ``python -m tui_launch status PATH --json``, each in a fresh interpreter, killed after
``--timeout`` seconds (reported as ``> timeout``). ``--code`` picks the tuilaunch measured:
``worktree`` (the copy of this tree's ``tui_launch/``), ``installed``, or a git revision, as in
``bench/run.py``.

Usage::

    .venv/bin/python bench/notices.py [--notices 40000 1000000] [--code worktree|REV]
        [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import snapshot_code

from tui_launch.core.model import layout
from tui_launch.core.model.events import Notice, RunFinished, to_dict
from tui_launch.testing import builders

NPROC = 2


def write_journal(path: str, notices: int) -> int:
    """Write a run of :data:`NPROC` ranks with ``notices`` notices; its event count."""
    seq = 0
    with open(path, "w") as fp:

        def put(data: dict[str, object]) -> None:
            nonlocal seq
            fp.write(json.dumps({"seq": seq, **data}, default=str) + "\n")
            seq += 1

        put(to_dict(builders.run_started(NPROC, max_restarts=0)))
        for e in builders.attempt(0, NPROC, 0.0, 1000):
            if e.journaled:
                put(to_dict(e))
        # Built once and copied as JSON: a million Notice objects would cost more than the
        # commands measured.
        base = to_dict(Notice("warning", "store retry storm: 3 retries", **builders.at(1.0)))
        for k in range(notices):
            put({**base, "wall": base["wall"] + k * 0.01, "mono": base["mono"] + k * 0.01})
        end = RunFinished(
            outcome="succeeded", exit_code=0, message="", **builders.at(2.0 + notices * 0.01)
        )
        put(to_dict(end))
    return seq


def measure(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, float, bool]:
    """Wall seconds, CPU seconds of the child, and whether it finished in ``timeout``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        subprocess.run(
            cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=timeout, cwd="/"
        )
        done = True
    except subprocess.TimeoutExpired:  # run() killed it and waited for it
        done = False
    t = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notices", type=int, nargs="+", default=[40_000, 1_000_000])
    ap.add_argument("--code", default="worktree")
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        code = snapshot_code(a.code, Path(tmp), py)
        env = dict(os.environ)
        if code is not None:
            env["PYTHONPATH"] = code
        print(f"code: {a.code}; load average {os.getloadavg()[0]:.1f}", flush=True)
        print("| notices | events | journal | command | wall | CPU |")
        print("|---|---|---|---|---|---|")
        for n in a.notices:
            run_dir = os.path.join(tmp, f"run-{n}")
            os.makedirs(run_dir)
            path = layout.RunDirLayout(run_dir).journal
            events = write_journal(path, n)
            size = os.path.getsize(path) / 1e6
            for name, cmd in (
                ("report", [py, "-m", "tui_launch", "report", path, "-o", path + ".html"]),
                ("status --json", [py, "-m", "tui_launch", "status", path, "--json"]),
            ):
                t, cpu, done = measure(cmd, env, a.timeout)
                shown = f"{t:.2f} s" if done else f"> {a.timeout:.0f} s (killed)"
                print(
                    f"| {n:,} | {events:,} | {size:.1f} MB | {name} | {shown} | {cpu:.2f} s |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
