"""Progress from the logs, with no code change in the training program.

- ``reading``: :class:`ProgressReading` (step, total, epoch, claimed rate, loss, stated
  throughput, format), the format families a stream locks on to, global steps.
- ``formats``: every format real training programs print: its parser, its cheap anchor, its
  row in the table that runs them.
- ``parse``: :func:`parse_line`: one line, as a terminal shows it and pre-filtered, to a reading.
- ``tracker``: :class:`ProgressTracker`, one (rank, stream): format lock-on, training vs eval
  bars, our own rate from arrival times, ETA, slowdown and stall flags.
- ``job``: :class:`JobProgress`: the trackers of every rank, and the rank that prints.
- ``watch``: the progress watcher (``tuilaunch-progress``): a sink on the log tailer and a
  listener on the store, posting progress events.
- ``workerenv``: what the workers' environment gets so that their bars can be read
  (``TTY_COMPATIBLE=1``; added by the log specs in :mod:`tui_launch.core.seam.logspecs`).

All but ``watch`` are pure and standard-library only: time is always an argument. Goodput
(:func:`summarize_goodput`) is re-exported from :mod:`tui_launch.core.model.goodput`, where the
store's reducer can reach it.
"""

from tui_launch.core.model.goodput import (
    AttemptGoodput,
    AttemptProgress,
    GoodputSummary,
    summarize_goodput,
)
from tui_launch.core.progress.job import JobProgress, JobProgressState
from tui_launch.core.progress.parse import (
    FAMILIES,
    ProgressReading,
    family_of,
    maybe_progress,
    parse_line,
    strip_ansi,
)
from tui_launch.core.progress.tracker import ProgressState, ProgressTracker

__all__ = [
    "FAMILIES",
    "AttemptGoodput",
    "AttemptProgress",
    "GoodputSummary",
    "JobProgress",
    "JobProgressState",
    "ProgressReading",
    "ProgressState",
    "ProgressTracker",
    "family_of",
    "maybe_progress",
    "parse_line",
    "strip_ansi",
    "summarize_goodput",
]
