"""Test worker without torch: tick at a steady pace and report the longest pause.

Options:
  --ticks N        how many ticks (default 40)
  --interval S     seconds between ticks (default 0.1)
  --dump PATH      first write argv, sys.path[0], __name__, __spec__.name and the env as JSON

Prints ``tick N`` for each tick and, at the end, ``max gap S`` (the longest time between two
ticks: a SIGSTOPped worker shows the time it was stopped). Unknown arguments are ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--dump", default=None)
    args, _ = parser.parse_known_args()
    if args.dump:
        data = {
            "argv": sys.argv,
            "path0": sys.path[0],
            "name": __name__,
            "spec": getattr(globals().get("__spec__"), "name", None),
            "env": dict(os.environ),
        }
        with open(args.dump, "w") as fp:
            json.dump(data, fp, sort_keys=True)
    last = time.monotonic()
    gap = 0.0
    for n in range(args.ticks):
        time.sleep(args.interval)
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now
        sys.stdout.write(f"tick {n}\n")
        sys.stdout.flush()
    sys.stdout.write(f"max gap {gap:.2f}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
