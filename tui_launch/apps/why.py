"""``tuilaunch why [PATH] [--json]``: Flight Recorder dumps from anywhere, read and judged.

``PATH`` is a run (its id, its launcher's pid, its run directory: the dumps in
``<run dir>/flightrec/``, else the newest stack dump's records), any directory of Flight
Recorder dumps (NCCL's dump-on-timeout pickles of any torch from 2.4 on, their JSON form,
tuilaunch's own), or one dump file; default: the latest run, as ``status`` picks it. The
verdict (:mod:`tui_launch.core.diagnosis.frjudge`) comes first, in one line, then each process
group that waits; ``--json`` prints the same as one document for scripts. A stack dump's
records whose own verdict saw more than them (a second look, the stacks) lead with that verdict
(:func:`tui_launch.core.remote.status.judged`).

Pickles are read by an unpickler that refuses every global
(:class:`~tui_launch.core.diagnosis.frdump.PlainUnpickler`): a dump that names one is refused
whole. Exit status: 0 the verdict was printed (whatever it says); 2 bad usage, or no readable
dump at PATH (none there, a corrupt single file, a pickle that names a global); 3 no such run.
"""

from __future__ import annotations

import json
import os
import sys

from tui_launch.core.diagnosis import frdump
from tui_launch.core.model.layout import JOURNAL_NAME, run_dir_of

OK = 0
USAGE = 2  # bad usage, or nothing there that can be judged
NO_RUN = 3  # as ``status``: PATH names no file, directory or run

USAGE_LINE = "usage: tuilaunch why [RUN_ID|PID|RUN_DIR|DUMP_DIR|DUMP_FILE] [--json]"
HELP = f"""{USAGE_LINE}

Read every rank's Flight Recorder dump and say which rank the others wait on: a rank that never
issued the collective its peers wait in, a rank whose work stopped completing (a GPU or stream
fault), a rank that left no dump, ranks that disagree on a collective (torch's analyser's
classes), or every rank at the same collective.

PATH is a run (id, launcher pid, run directory), a directory of dumps (NCCL's
TORCH_NCCL_DEBUG_INFO_TEMP_FILE pickles, JSON, tuilaunch's own) or one dump file; default: the
latest run. A pickle is read as plain data only: one that names a global is refused.

  --json        one JSON document: the verdict, the culprits, each process group

Exit status: 0 printed, 2 bad usage or no readable dump, 3 no such run."""


def _error(message: str, code: int) -> int:
    print(f"tuilaunch why: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str]) -> int:
    """``tuilaunch why``: print the verdict on a run's or a directory's dumps."""
    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return OK
    as_json = False
    target: str | None = None
    for arg in argv:
        if arg == "--json":
            as_json = True
        elif (arg.startswith("-") and not os.path.exists(arg)) or target is not None:
            return _error(f"unexpected argument {arg!r} ({USAGE_LINE})", USAGE)
        else:
            target = arg
    try:
        found, where = _load(target)
    except _NoRun as e:
        return _error(str(e), NO_RUN)
    except frdump.HostileDump as e:
        return _error(f"refused: {e}", USAGE)
    except frdump.BadDump as e:
        return _error(f"{where_of(target)}: {e}", USAGE)
    except OSError as e:
        return _error(f"cannot read {e.filename or where_of(target)}: {e.strerror or e}", USAGE)
    if not found.dumps:
        if found.unreadable:
            bad = "; ".join(f"rank {r}: {why}" for r, why in sorted(found.unreadable.items())[:3])
            return _error(f"no readable Flight Recorder dump in {where} ({bad})", USAGE)
        return _error(f"no Flight Recorder dump in {where}", USAGE)
    from tui_launch.core.remote.status import judged

    doc, lines = judged(found)
    if as_json:
        print(json.dumps({**doc, "path": where} | doc, indent=2), flush=True)
    else:
        print("\n".join(lines), flush=True)
    return OK


class _NoRun(Exception):
    pass


def where_of(target: str | None) -> str:
    """What the user named, for an error line."""
    return target if target is not None else "the latest run"


def _load(target: str | None) -> tuple[frdump.DumpSet, str]:
    """The dumps ``target`` names, and the path they were read from."""
    from tui_launch.core.remote import status

    if target is not None and os.path.isdir(target):
        path = os.path.abspath(target)
        if frdump.is_run_dir(path):
            return frdump.load_run(path), path
        return frdump.load_dir(path), path
    if target is not None and os.path.isfile(target):
        path = os.path.abspath(target)
        if os.path.basename(path) == JOURNAL_NAME:
            run = run_dir_of(path)
            return frdump.load_run(run), run
        found = frdump.DumpSet(path)
        dump = frdump.load_file(path)
        found.dumps[dump.rank] = dump
        return found, path
    try:
        run = status.resolve(target).run_dir
    except status.NoSuchRun as e:
        if target is not None and (os.sep in target or target.startswith(".")):
            raise _NoRun(f"no such file or directory: {target}") from None
        raise _NoRun(str(e)) from None
    return frdump.load_run(run), run
