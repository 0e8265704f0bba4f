"""Benchmark workload: every rank writes LINES lines of about 100 bytes to stdout, flat out.

Usage: ``flood.py DIR [LINES]`` under a launcher (LINES: 200000 by default).

Every rank joins a gloo group and waits at a barrier, so that all ranks start together; then it
writes ``time.time()`` to ``DIR/start_<rank>``, writes its lines through ``sys.stdout.write``,
flushes, and writes ``time.time()`` to ``DIR/end_<rank>`` and the CPU the loop took (user and
system seconds, ``getrusage``) to ``DIR/cpu_<rank>``. The workers' wall time is
``max(end_*) - min(start_*)``: how long the ranks took to get their output out, which a
launcher can only lengthen by taking CPU from them or by making their writes block.

torchrun starts every Python worker as ``python -u`` (``torch.distributed.run``; tuilaunch
runs the same code): stdout is unbuffered, so every line is its own ``write(2)``, 2,000,000 a
rank by default in ``logpath.py``; the system seconds in ``cpu_<rank>`` are what those writes
cost, to a file or to ``/dev/null``.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import torch.distributed as dist


def mark(path: str, value: float) -> None:
    with open(path, "w") as fp:
        fp.write(repr(value))


def main() -> None:
    out = sys.argv[1]
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    prefix = f"[flood] rank {rank} line "
    pad = " " + "x" * (100 - len(prefix) - 7 - 2)  # ~100 bytes with the number and newline
    mark(os.path.join(out, f"start_{rank}"), time.time())
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    write = sys.stdout.write
    for i in range(lines):
        write(f"{prefix}{i:07d}{pad}\n")
    sys.stdout.flush()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    mark(os.path.join(out, f"end_{rank}"), time.time())
    with open(os.path.join(out, f"cpu_{rank}"), "w") as fp:
        fp.write(f"{r1.ru_utime - r0.ru_utime!r} {r1.ru_stime - r0.ru_stime!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
