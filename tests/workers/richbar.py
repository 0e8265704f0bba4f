"""Test worker: a rich progress bar shaped like PyTorch Lightning's RichProgressBar.

``Epoch 0/0 ━━━━━━━━━━╸━━━━━━━━━━━━━━━━ 37/100 0:00:01 • 0:00:02 25.00it/s v_num: 0 train_loss:
0.25``, drawn by ``rich.progress.Progress`` (a ``Live`` display) on stdout. rich draws live only
when its console is a terminal: on a file (the rank's log under tuilaunch) it prints the
finished bar once at the end, unless ``TTY_COMPATIBLE=1`` (rich >= 14) or ``FORCE_COLOR`` is
set. After update ``--hold-at`` it writes ``PATH.reached`` and waits until ``PATH`` exists, so
a test can look at a bar mid-way without timing anything.

Usage: ``richbar.py --hold PATH [--hold-at K] [--total N]``.
"""

from __future__ import annotations

import argparse
import os
import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hold", required=True)
    p.add_argument("--hold-at", type=int, default=37)
    p.add_argument("--total", type=int, default=100)
    args = p.parse_args()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("•"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[rate]}it/s {task.fields[metrics]}"),
    )
    with Progress(*columns) as progress:
        task = progress.add_task("Epoch 0/0", total=args.total, rate="25.00", metrics="v_num: 0")
        for n in range(1, args.total + 1):
            progress.update(task, completed=n, metrics=f"v_num: 0 train_loss: {1 / n:.2f}")
            if n == args.hold_at:
                progress.refresh()
                with open(args.hold + ".reached", "w"):
                    pass
                while not os.path.exists(args.hold):
                    time.sleep(0.05)


if __name__ == "__main__":
    main()
