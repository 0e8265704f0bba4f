"""Progress from the logs, with no code change in the training program (issue 15).

* :func:`parse_line` turns one line into a :class:`ProgressReading` (step, total, epoch,
  claimed rate, loss, stated throughput, format).
* :class:`ProgressTracker` follows one (rank, stream): format lock-on, training vs eval bars,
  our own rate from arrival times, ETA, slowdown and stall flags.
* :class:`JobProgress` holds the trackers of every rank and names the rank that prints.
* :func:`summarize_goodput` does the per-attempt bookkeeping across restarts.

Pure and standard-library only: time is always an argument.
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
