"""Test worker without torch: a training loop that prints its progress, as real ones do.

Options:
  --steps N         steps in all (default 50)
  --interval S      seconds per step (default 0.1)
  --fmt plain|tqdm  ``step N/T loss X`` lines, or tqdm's bar (the bytes tqdm writes, each
                    redraw ended by a newline so that whole lines reach the tailer)
  --ckpt PATH       save the step reached there every ``--save-every`` steps and resume from
                    it (a restarted attempt redoes the steps since the last save)
  --save-every K    (default 10)
  --report PATH     the printing rank writes the loop's real rate there at the end (steps/s
                    between its first and last printed step)

Only the printing rank (``--print-rank``, default 0) prints progress; every rank steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def tqdm_line(n: int, total: int, elapsed: float, rate: float | None) -> str:
    """One tqdm redraw: ``train:  40%|####      | 20/50 [00:02<00:03, 9.87it/s]``."""
    pct = 100 * n // total
    filled = 10 * n // total
    bar = "#" * filled + " " * (10 - filled)

    def mmss(s: float) -> str:
        return f"{int(s) // 60:02d}:{int(s) % 60:02d}"

    left = mmss((total - n) / rate) if rate else "?"
    r = f"{rate:.2f}it/s" if rate else "?it/s"
    return f"\rtrain: {pct:3d}%|{bar}| {n}/{total} [{mmss(elapsed)}<{left}, {r}]"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--fmt", default="plain")
    p.add_argument("--ckpt", default=None)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--print-rank", type=int, default=0)
    p.add_argument("--report", default=None)
    args, _ = p.parse_known_args()
    rank = int(os.environ.get("RANK", "0"))
    start = 0
    if args.ckpt and os.path.exists(args.ckpt):
        with open(args.ckpt) as fp:
            start = int(fp.read().strip() or 0)
    printing = rank == args.print_rank
    t0 = time.monotonic()
    out = sys.stderr if args.fmt == "tqdm" else sys.stdout
    if printing and args.fmt == "tqdm":
        out.write(tqdm_line(start, args.steps, 0.0, None) + "\n")
        out.flush()
    printed: list[float] = []
    for n in range(start + 1, args.steps + 1):
        time.sleep(args.interval)
        if printing:
            printed.append(time.monotonic())
            if args.fmt == "tqdm":
                elapsed = time.monotonic() - t0
                out.write(tqdm_line(n, args.steps, elapsed, (n - start) / elapsed) + "\n")
            else:
                out.write(f"step {n}/{args.steps} loss {1.0 / n:.4f}\n")
            out.flush()
        if args.ckpt and rank == 0 and n % args.save_every == 0:
            tmp = f"{args.ckpt}.tmp"
            with open(tmp, "w") as fp:
                fp.write(str(n))
            os.replace(tmp, args.ckpt)
    if printing and args.report and len(printed) > 1:
        with open(args.report, "w") as fp:
            fp.write(str((len(printed) - 1) / (printed[-1] - printed[0])))


if __name__ == "__main__":
    main()
