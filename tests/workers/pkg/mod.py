"""Test worker run as a module (``-m pkg.mod``): prints its RANK and argv."""

from __future__ import annotations

import os
import sys


def main() -> None:
    sys.stdout.write(f"module ok RANK={os.environ.get('RANK')} argv={sys.argv}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
