"""The ``tuilaunch`` command: hand argv to the subcommand's ``main(argv) -> int``, then exit.

``tuilaunch ls|replay|attach|status|ctl|mcp|serve|why ...`` run the module of that name in
:mod:`tui_launch.apps`; anything else is a launch (:mod:`tui_launch.apps.launch`),
whose argv torch's own parser reads.

Exit status: the table of :mod:`tui_launch.core.model.exitcodes` (``docs/restart-policy.md``):
0 success, 1 a program failure, 2 bad input, 75 an infrastructure failure (a lost node, a hang,
a kill from outside), 143 preempted, 128 + N when the launcher itself was stopped by another
signal N; torchrun's (0, or 1 for every failure) with ``--exit-codes torchrun``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import sys
from typing import NoReturn

# Subcommands, recognised only as the first argument (before torchrun's parser sees argv).
# A script literally named like one runs as `tuilaunch ./ls`.
SUBCOMMANDS = ("ls", "replay", "attach", "report", "status", "ctl", "mcp", "serve", "why")


# 128 + SIGPIPE: what a shell reports for a command whose reader went away.
SIGPIPE_EXIT = 141


def run_subcommand(argv: list[str]) -> int:
    """Run one of ``SUBCOMMANDS`` (``argv[0]``) and return its exit code."""
    app = importlib.import_module(f"tui_launch.apps.{argv[0]}")
    # Dashboards and servers stay up for hours.
    if argv[0] not in ("ls", "report", "status", "ctl", "why"):
        _collect_from_here()
    try:
        code: int = app.main(argv[1:])
    except BrokenPipeError:
        # `tuilaunch ls | head`: the reader left, which is no error of ours. Quiet, like
        # `ls` killed by SIGPIPE; stdout goes to /dev/null so the flush at exit cannot raise.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return SIGPIPE_EXIT
    return code


def _collect_from_here() -> None:
    # main() switched the cyclic GC off for the imports; an attach or a replay may stay open
    # for hours, and Textual makes cyclic garbage at every refresh: what is loaded by now
    # lives as long as the process (frozen, out of the collector's walks), the rest is
    # collected as usual.
    gc.freeze()
    gc.enable()


def run(argv: list[str] | None = None) -> int:
    """Run tuilaunch with ``argv`` (default: ``sys.argv[1:]``) and return the exit status."""
    given = sys.argv[1:] if argv is None else argv
    if given and given[0] in SUBCOMMANDS:
        return run_subcommand(given)  # before torch is imported: `ls` answers at once
    from tui_launch.apps import launch

    return launch.main(argv)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point."""
    # Loading torch and Textual allocates ~185,000 long-lived objects, and the GC's full
    # collections while they load find nothing to free: the launch switches the GC back on
    # once they are loaded (and frozen).
    gc.disable()
    code = run(argv)
    # The run is over: its workers are reaped and every file it wrote is closed. What is
    # left is tearing down an interpreter that holds torch and joining an agent thread that
    # may be stuck inside torch (a rendezvous, a store wait). Neither does anything for the
    # user: run the atexit handlers (logging's flush), flush, and leave.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe must not change the exit code
            stream.flush()
    os._exit(code)
