"""Test worker: flood stdout with ``--lines N`` (default 1000) ~100-byte lines.

Ends with ``DONE rank R``.  No process group is created.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description="Write lots of output fast.")
    parser.add_argument("--lines", type=int, default=1000)
    args = parser.parse_args()

    rank = os.environ.get("RANK", "0")
    out = sys.stdout
    for i in range(args.lines):
        head = f"rank {rank} line {i:06d} "
        out.write(head + "x" * (99 - len(head)) + "\n")
    out.write(f"DONE rank {rank}\n")
    out.flush()


if __name__ == "__main__":
    main()
