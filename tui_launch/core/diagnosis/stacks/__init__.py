"""Stacks of every local rank, a verdict on them, and hang detection.

- ``model``: the frozen records of a dump (frames, threads, processes, ranks, the dump).
- ``pyspy``: :func:`dump_ranks`: every rank (and its child processes) with py-spy, in
  parallel, each call under a hard time limit; ``--nonblocking`` for a stopped rank, the
  kernel wait channel for a rank in ``D``; one line with the fix when ptrace is not permitted;
  :func:`~.pyspy.with_native`: the C/C++ frames of each running rank (a confirmed hang).
- ``lastwords``: a rank's last traceback on stderr as a stack: the survivors of a failure,
  gone before py-spy could read them.
- ``sigdump``: :func:`dump_via_faulthandler`: the same without ptrace, for ranks started
  through the worker bootstrap with ``TUILAUNCH_FAULTHANDLER_SIGNAL`` set: signal, then cut
  the dump out of stderr.
- ``waits``: :data:`~.waits.WAITS`: every torch function a rank waits for its peers in
  (collectives, DDP's broadcasts, FSDP's all-gathers, ``Work.wait``), listed once.
- ``verdict``: :func:`verdict`: which ranks wait in a collective and which is the odd one
  out; :func:`group_stacks`: identical main-thread stacks folded.
- ``save``: :func:`save` / :func:`load`: ``<run_dir>/stacks/<timestamp>-<reason>/``
  ``stacks.{json,txt}``; :func:`dumped_event`: the journal's
  :class:`~tui_launch.core.model.events.StacksDumped`.
- ``collective``: :func:`~.collective.collective_verdict`: the verdict on the ranks' Flight
  Recorder records (a rank behind, ranks that disagree, every rank at one collective).
- ``hang``: :class:`HangDetector` and :func:`confirm`: silence on every rank, then two dumps
  that match.

Standard library only (py-spy is a binary from its wheel); nothing here imports a front end.
"""

from __future__ import annotations

from tui_launch.core.diagnosis.stacks.hang import (
    CONFIRM,
    DUMP,
    NOTHING,
    Confirmation,
    HangDetector,
    confirm,
    hang_event,
)
from tui_launch.core.diagnosis.stacks.model import (
    Frame,
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
    dump_from_dict,
    dump_to_dict,
    short_file,
)
from tui_launch.core.diagnosis.stacks.pyspy import (
    NO_PYSPY,
    Target,
    dump_process,
    dump_ranks,
    find_pyspy,
    parse_pyspy_json,
    proc_children,
    ptrace_fix,
    run_pyspy,
)
from tui_launch.core.diagnosis.stacks.save import (
    SavedDump,
    dumped_event,
    load,
    render_text,
    save,
)
from tui_launch.core.diagnosis.stacks.sigdump import dump_via_faulthandler, parse_faulthandler
from tui_launch.core.diagnosis.stacks.verdict import (
    RankPlace,
    StackGroup,
    Verdict,
    collective_of,
    group_stacks,
    judge,
    place_of,
    verdict,
)
from tui_launch.core.model.text import rank_list

__all__ = [
    "CONFIRM",
    "DUMP",
    "NOTHING",
    "NO_PYSPY",
    "Confirmation",
    "Frame",
    "HangDetector",
    "ProcessStack",
    "RankPlace",
    "RankStack",
    "SavedDump",
    "StackDump",
    "StackGroup",
    "Target",
    "ThreadStack",
    "Verdict",
    "collective_of",
    "confirm",
    "dump_from_dict",
    "dump_process",
    "dump_ranks",
    "dump_to_dict",
    "dump_via_faulthandler",
    "dumped_event",
    "find_pyspy",
    "group_stacks",
    "hang_event",
    "judge",
    "load",
    "parse_faulthandler",
    "parse_pyspy_json",
    "place_of",
    "proc_children",
    "ptrace_fix",
    "rank_list",
    "render_text",
    "run_pyspy",
    "save",
    "short_file",
    "verdict",
]
