"""``tuilaunch attach [RUN] [--control]``: the dashboard on a running job."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from tui_launch.apps.replay import end_with_server, journal_of, precompute, view_args
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.remote.controlsock import ControlClient, ControlError, find
from tui_launch.tui.app import Dashboard
from tui_launch.tui.modes import AttachMode, ControlMode
from tui_launch.tui.sources.attach import AttachSource
from tui_launch.tui.sources.control import HELP, USAGE, ControlSource


def resolve_attach(target: str | None) -> str:
    """The journal of the run ``target`` names (run dir, pid, run id; default: the only live
    run of this user on this node); ValueError with a one-line reason."""
    from tui_launch.core.remote import runindex

    found = runindex.sweep(runindex.entries())  # stale runs go, whatever is asked
    if target is not None and os.path.isdir(target):
        return journal_of(target)
    live = [e for e in found if runindex.state(e) == runindex.LIVE]
    if target is not None:
        # The pid, or the run id the launcher shows (--standalone: torch's random one).
        live = [e for e in live if target in (str(e.pid), e.run_id)]
    if not live:
        raise ValueError(f"no live run{'' if target is None else ' ' + repr(target)} here")
    if len(live) > 1:
        pids = ", ".join(str(e.pid) for e in live)
        raise ValueError(f"{len(live)} live runs (pids {pids}): name one (tuilaunch ls)")
    if not live[0].journal or not os.path.isfile(live[0].journal):
        raise ValueError(f"run {live[0].pid} has no journal yet: try again in a moment")
    return live[0].journal


def _read_only(argv: list[str]) -> int:
    """``tuilaunch attach [RUN_DIR | PID | RUN_ID]``: read-only dashboard on a running job."""
    usage = "usage: tuilaunch attach [RUN_DIR|PID|RUN_ID] [--refresh-hz HZ]"
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    try:
        # --no-confirm is taken and changes nothing: a read-only attach acts on nothing.
        target, refresh_hz, _ = view_args(argv)
        timeline = Timeline(resolve_attach(target))
    except (ValueError, OSError) as e:
        print(f"tuilaunch attach: error: {e} ({usage})", file=sys.stderr)
        return 2
    run_attached(AttachMode, AttachSource(timeline), refresh_hz=refresh_hz)
    return 0


def run_attached(mode: type[AttachMode], source: AttachSource, **kwargs: Any) -> None:
    """Run the dashboard over ``source`` in ``mode``: its first frame is the end's state
    without the old telemetry (:class:`AttachSource`); the checkpoints (the exact state, and
    any cursor move back) are computed by a background thread started once that frame is up."""
    stop = threading.Event()
    worker = threading.Thread(
        target=precompute, args=(source.timeline, stop), name="tuilaunch-attach", daemon=True
    )

    def start() -> None:
        if worker.ident is None:  # once, though a dashboard may call on_ready again
            worker.start()

    app = Dashboard(source, mode=mode(source, worker), on_ready=start, **kwargs)
    end_with_server()
    try:
        app.run()
    finally:
        stop.set()


def _control(argv: list[str]) -> int:
    """``tuilaunch attach [TARGET] --control``: exit 2 with one line on bad input."""
    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return 0
    try:
        target, refresh_hz, confirm = view_args(argv, ignore=("--control",))
        path, journal = find(target)
        client = ControlClient(path)
        answer = client.call("status")  # the socket answers, and it is ours, before any UI
        if not answer.get("ok"):
            raise ControlError(str(answer.get("detail", "refused")))
        pid = answer.get("pid")
        if not journal:
            raise ValueError("the run has no journal yet: try again in a moment")
        timeline = Timeline(journal)
    except (ValueError, OSError, ControlError) as e:
        print(f"tuilaunch attach: error: {e} ({USAGE})", file=sys.stderr)
        return 2
    source = ControlSource(timeline, client, pid if isinstance(pid, int) else None)
    run_attached(ControlMode, source, refresh_hz=refresh_hz, confirm=confirm)
    return 0


def main(argv: list[str]) -> int:
    """``tuilaunch attach [TARGET] [--control]``: exit 2 with one line on bad input."""
    if "--control" in argv or {"-h", "--help"} & set(argv):  # the control help names both
        return _control(argv)
    return _read_only(argv)
