"""Test worker: ignore the polite stop signals, so only SIGKILL ends it.

Options:
  --ready PATH   append "<RANK> <pid>" to PATH once the handlers are installed
  --seconds S    how long to sleep (default 120)

Ignores SIGTERM, SIGINT, SIGHUP and SIGQUIT; imports no torch, so it starts fast.
"""

from __future__ import annotations

import argparse
import os
import signal
import time


def main() -> None:
    parser = argparse.ArgumentParser(description="Ignore SIGTERM and friends.")
    parser.add_argument("--ready", default=None)
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    if args.ready:
        with open(args.ready, "a") as f:
            f.write(f"{os.environ.get('RANK', '0')} {os.getpid()}\n")
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)


if __name__ == "__main__":
    main()
