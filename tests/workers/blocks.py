"""Test worker: ~100-byte lines to stdout in large blocks, without a flush per line.

A program whose stdout is block-buffered (C stdio to a file, or Python's ``BufferedWriter``)
writes many lines with one ``write(2)``. By default the lines go through an 8 KB
``BufferedWriter`` on fd 1, which writes whole lines only (a block of 81 lines, 8,100 bytes);
``--cut`` writes exact ``--block``-byte blocks instead, cutting lines anywhere, as C stdio does.
Each line is ``R<rank> <number> x...x\\n`` (``--width`` bytes with the newline), so that a
reader can check every line whole, per rank in order, and none missing.

Usage: ``blocks.py [--lines N] [--block B] [--width W] [--cut]``. No process group is created.
"""

from __future__ import annotations

import argparse
import io
import os


def line(rank: str, i: int, width: int) -> bytes:
    """Line ``i`` of ``rank``: ``width`` bytes, newline included."""
    head = f"R{rank} {i:07d} "
    return (head + "x" * (width - len(head) - 1) + "\n").encode()


def main() -> None:
    p = argparse.ArgumentParser(description="Write lines in blocks, no flush per line.")
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--block", type=int, default=8192)
    p.add_argument("--width", type=int, default=100)
    p.add_argument("--cut", action="store_true")
    args = p.parse_args()
    rank = os.environ.get("RANK", "0")
    if args.cut:
        pending = bytearray()
        for i in range(args.lines):
            pending += line(rank, i, args.width)
            while len(pending) >= args.block:
                os.write(1, pending[: args.block])
                del pending[: args.block]
        if pending:
            os.write(1, pending)
        return
    out = io.BufferedWriter(io.FileIO(1, "w", closefd=False), buffer_size=args.block)
    for i in range(args.lines):
        out.write(line(rank, i, args.width))
    out.flush()


if __name__ == "__main__":
    main()
