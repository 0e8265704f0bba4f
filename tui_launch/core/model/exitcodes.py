"""The exit codes a scheduler can act on, and torchrun's behind ``--exit-codes torchrun``.

One table (``docs/restart-policy.md``):

=====  ===============  ===============================================================
code   meaning          when
=====  ===============  ===============================================================
0      success          every rank exited 0; or every rank's ``main`` returned and one
                        crashed in teardown (the work is done: a retry would redo it)
1      program          a failure in the program a retry will not fix: a startup error,
                        an exception, a native crash, an OOM inside the job's own limit
                        (CUDA, or the run's cgroup)
2      usage            bad input to tuilaunch (nothing started)
75     infrastructure   a failure a retry may fix: a node lost, a backend error (NCCL,
                        gloo, the store), a hang, a signal or an OOM kill from outside
                        the job, a GPU hardware fault (on another node), a rendezvous
                        that never completed (``EX_TEMPFAIL``)
143    preempted        the launcher got SIGTERM or the scheduler's warning signal
                        (``--preempt-signals``); the workers were told and given
                        ``--shutdown-timeout`` to save
128+N  stopped          another signal N to the launcher (SIGINT: 130, SIGHUP: 129)
=====  ===============  ===============================================================

``--exit-codes torchrun`` gives torchrun's: 0, 1 for every failure, 2 for bad usage, 128+N
for a signal.
"""

from __future__ import annotations

import signal

from tui_launch.core.model import failclass
from tui_launch.core.model.failclass import FailureClass
from tui_launch.core.model.words import Word

SUCCESS = 0
PROGRAM = 1
USAGE = 2
INFRASTRUCTURE = 75  # sysexits.h EX_TEMPFAIL: "try again later"
PREEMPTED = 128 + int(signal.SIGTERM)  # what a SIGTERMed container reports anyway


class ExitStyle(Word):
    """``--exit-codes``: the table above, or torchrun's codes."""

    TUILAUNCH = "tuilaunch"
    TORCHRUN = "torchrun"


# The option's choices, in words.
STYLES: tuple[str, ...] = tuple(s.value for s in ExitStyle)

MEANINGS = {
    SUCCESS: "success",
    PROGRAM: "program failure (a retry will not fix it)",
    USAGE: "bad usage",
    INFRASTRUCTURE: "infrastructure failure (a retry may fix it)",
    PREEMPTED: "preempted",
}


# What a failed run's class means in the table: a retry may fix it (infrastructure) or not
# (program). Every class has its row: tests/test_failclass.py goes through the enum.
CLASS_MEANINGS: dict[FailureClass, str] = {
    FailureClass.STARTUP: "program",
    FailureClass.EXCEPTION: "program",
    FailureClass.CRASH: "program",
    FailureClass.OOM: "program",  # inside the job's own limit: a retry outgrows it again
    FailureClass.TEARDOWN: "program",
    FailureClass.COLLATERAL: "program",
    FailureClass.PREEMPTED: "program",  # a preempted run's outcome says so, not its class
    FailureClass.SIGNAL: "infrastructure",
    FailureClass.BACKEND: "infrastructure",
    FailureClass.HANG: "infrastructure",
    FailureClass.NODE_LOST: "infrastructure",
    FailureClass.OOM_OUTSIDE: "infrastructure",
    # The GPU failed, not the program: the scheduler may run the job on a healthy node.
    FailureClass.GPU_FAULT: "infrastructure",
}


def meaning(outcome: str, cls: str) -> str:
    """What the run's end means in the table: success, program, infrastructure, preempted,
    usage or stopped."""
    if outcome == "succeeded":
        return "success"
    if outcome == "preempted":
        return "preempted"
    if outcome == "stopped":
        return "stopped"
    if outcome == "usage":
        return "usage"
    if cls in failclass.CLASSES:
        return CLASS_MEANINGS[FailureClass(cls)]
    return "program"  # no class (""), or a word this table does not know


def exit_code(outcome: str, cls: str, torchrun_code: int, style: str) -> int:
    """The launcher's exit status.

    Args:
        outcome: succeeded, failed, stopped, preempted, error or usage.
        cls: the class of the failure that ended the run ("" when none).
        torchrun_code: what torchrun would have returned (0, 1, 2 or 128+N).
        style: ``tuilaunch`` (the table above) or ``torchrun``.
    """
    if style == ExitStyle.TORCHRUN:
        return torchrun_code
    what = meaning(outcome, cls)
    if what == "success":
        return SUCCESS
    if what == "preempted":
        return PREEMPTED
    if what in ("stopped", "usage"):
        return torchrun_code
    if what == "infrastructure":
        return INFRASTRUCTURE
    return torchrun_code if torchrun_code == USAGE else PROGRAM
