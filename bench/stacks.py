"""Benchmark: wall time of a stack dump of 1, 2, 4 and 8 local ranks (issue 14: ≤ 1 s for 8).

The ranks are real processes: Python with torch imported, a second thread, optionally child
processes (``--children``, like data-loader workers), sleeping in a function of their own, with
faulthandler registered on tuilaunch's signal and stderr in a file, as a rank started through
the worker bootstrap with ``--dump-via-faulthandler`` would be. Two dump paths are measured:

``py-spy``        :func:`tui_launch.core.diagnosis.stacks.dump_ranks`: one ``py-spy dump --json``
per
                  process (ranks and their children), all in parallel;
``faulthandler``  :func:`tui_launch.core.diagnosis.stacks.dump_via_faulthandler`: signal every
rank, cut
                  the dump out of its stderr file.

Each cell is the median (and max) of ``--repeat`` dumps after one warm-up dump, wall clock
from the call to its return. Every process started here is killed before the bench exits.

Usage::

    .venv/bin/python bench/stacks.py [--repeat 9] [--children 1] [--ranks 1,2,4,8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui_launch.core.diagnosis.stacks import (  # noqa: E402
    dump_ranks,
    dump_via_faulthandler,
    find_pyspy,
    verdict,
)
from tui_launch.core.workers.shim import FAULTHANDLER_ENV, FAULTHANDLER_SIGNAL  # noqa: E402

RANK = """
import multiprocessing, os, sys, threading, time
import torch
from tui_launch.core.workers import shim
shim.install_faulthandler()

def loader_worker(parent):
    while os.getppid() == parent:
        time.sleep(0.2)

def helper():
    while True:
        time.sleep(1)

def load_batch():
    print("up", flush=True)
    while True:
        time.sleep(1)

threading.Thread(target=helper, name="helper", daemon=True).start()
for _ in range(int(sys.argv[1])):
    multiprocessing.get_context("fork").Process(target=loader_worker, args=(os.getpid(),)).start()
load_batch()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--children", type=int, default=1)
    parser.add_argument("--ranks", default="1,2,4,8")
    args = parser.parse_args()
    sizes = [int(n) for n in args.ranks.split(",")]
    if find_pyspy() is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")

    tmp = Path(tempfile.mkdtemp(prefix="bench-stacks-"))
    env = {**os.environ, FAULTHANDLER_ENV: str(int(FAULTHANDLER_SIGNAL)), "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    logs: dict[int, str] = {}
    try:
        for i in range(max(sizes)):
            logs[i] = str(tmp / f"err{i}.log")
            with open(logs[i], "wb") as err:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", RANK, str(args.children)],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        start_new_session=True,  # the whole group is killed at the end
                    )
                )
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == b"up\n"
        targets = [(i, i, p.pid) for i, p in enumerate(procs)]
        print(
            f"{len(procs)} ranks up (torch imported, 2 threads, {args.children} child each); "
            f"{os.cpu_count()} CPUs; median and max of {args.repeat} dumps after 1 warm-up\n"
        )
        print(f"{'ranks':>5}  {'processes':>9}  {'py-spy median':>13}  {'max':>7}  "
              f"{'faulthandler median':>19}  {'max':>7}")  # fmt: skip
        for n in sizes:
            sub = targets[:n]
            row = []
            for path in ("py-spy", "faulthandler"):
                times = []
                for k in range(args.repeat + 1):
                    start = time.monotonic()
                    if path == "py-spy":
                        dump = dump_ranks(sub, "bench")
                    else:
                        dump = dump_via_faulthandler(sub, logs, "bench")
                    took = time.monotonic() - start
                    bad = [r.global_rank for r in dump.ranks if not r.process.threads]
                    if bad:
                        raise SystemExit(f"{path}: no stack for ranks {bad}: {verdict(dump).text}")
                    if k:
                        times.append(took)
                row.append((statistics.median(times), max(times)))
            (pm, px), (fm, fx) = row
            procs_n = n * (1 + args.children)
            print(f"{n:>5}  {procs_n:>9}  {pm:>11.3f} s  {px:>5.3f} s  "
                  f"{fm:>17.3f} s  {fx:>5.3f} s")  # fmt: skip
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()


if __name__ == "__main__":
    main()
