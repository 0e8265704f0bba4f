"""``tuilaunch status [RUN] [--json]``: a run's state, for a person or a script.

``RUN`` is a run id, a launcher pid, a run directory or a journal (default: the only live
run, else the latest started live run, else the latest ended one). ``--json`` prints the
versioned document of :mod:`tui_launch.core.remote.status` (``docs/status.schema.json``).

Exit status (shared with ``ctl``, documented in ``docs/scripting.md``): :data:`OK` the state
was printed; :data:`USAGE` bad usage; :data:`NO_RUN` no such run, or its journal cannot be read.
"""

from __future__ import annotations

import json
import os
import sys

# The exit statuses of the verbs for scripts (status, ctl): a script tests these.
OK = 0  # done (ctl: the run carried the command out)
REFUSED = 1  # ctl: the run (or the client's own check of its socket) refused the command
USAGE = 2  # bad usage: one line on stderr, nothing was asked of any run
NO_RUN = 3  # no such run (no live run for ctl), or its journal cannot be read
UNREACHABLE = 4  # ctl: the run does not listen for control, or did not answer

USAGE_LINE = "usage: tuilaunch status [RUN_ID|PID|RUN_DIR|journal] [--json] [--no-socket]"
HELP = f"""{USAGE_LINE}

The state of a run of this user: phase or outcome, attempts, each rank's pid, state, step
and rate, the hang verdict and the root cause. RUN defaults to the only live run (else the
latest started live run, else the latest ended one).

  --json        the versioned JSON document (docs/status.schema.json)
  --no-socket   read the journal only (do not ask a live run's control socket)

Exit status: 0 printed, 2 bad usage, 3 no such run, or its journal cannot be read."""


def main(argv: list[str]) -> int:
    """``tuilaunch status``: print a run's state (exit statuses above)."""
    from tui_launch.core.remote import status

    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return OK
    as_json, socket = False, True
    target: str | None = None
    for arg in argv:
        if arg == "--json":
            as_json = True
        elif arg == "--no-socket":
            socket = False
        elif arg.startswith("-") or target is not None:
            error = f"unexpected argument {arg!r} ({USAGE_LINE})"
            print(f"tuilaunch status: error: {error}", file=sys.stderr)
            return USAGE
        else:
            target = arg
    try:
        doc = status.status(status.resolve(target), socket=socket)
    except status.NoSuchRun as e:
        print(f"tuilaunch status: error: {e}", file=sys.stderr)
        return NO_RUN
    except OSError as e:
        print(f"tuilaunch status: error: cannot read the journal: {e}", file=sys.stderr)
        return NO_RUN
    try:
        print(json.dumps(doc, indent=2) if as_json else status.text(doc), flush=True)
    except BrokenPipeError:  # `status | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return OK
