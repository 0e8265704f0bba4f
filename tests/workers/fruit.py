"""Test worker: print lines that ``--duplicate-*-filters`` match and lines they do not.

stdout gets ``apple``/``orange`` lines among others, stderr ``pear`` lines among others, each
line naming the rank. No torch: it starts fast. Exits 0.
"""

from __future__ import annotations

import os
import sys

STDOUT = ["apple {r}", "banana {r}", "an orange for rank {r}", "kiwi {r}", "apple pie {r}"]
STDERR = ["pear {r}", "apple on stderr {r}", "plum {r}", "pear tree {r}"]


def main() -> None:
    rank = os.environ.get("RANK", "?")
    for i in range(max(len(STDOUT), len(STDERR))):
        if i < len(STDOUT):
            print(STDOUT[i].format(r=rank), flush=True)
        if i < len(STDERR):
            print(STDERR[i].format(r=rank), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
