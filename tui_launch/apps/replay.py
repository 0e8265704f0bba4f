"""``tuilaunch replay RUN_DIR|journal``: the dashboard over a recorded run."""

from __future__ import annotations

import gc
import os
import select
import signal
import sys
import threading

from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model import layout
from tui_launch.tui.app import Dashboard
from tui_launch.tui.modes import ReplayMode
from tui_launch.tui.sources.replay import OPEN_AT_END, ReplaySource


def journal_of(target: str) -> str:
    """The journal a ``replay`` argument names (a run directory or the file); ValueError."""
    path = layout.journal_of(target)
    if not os.path.isfile(path):
        raise ValueError(f"no journal at {path}")
    return path


USAGE = "usage: tuilaunch replay RUN_DIR|journal.jsonl [--no-confirm] [--refresh-hz HZ]"


def precompute(timeline: Timeline, stop: threading.Event) -> None:
    """The replay's background thread: the rest of the index and every checkpoint, then the
    objects made so far out of the cyclic GC's reach (as the live dashboard does after its
    first frame): a full collection walking a day's checkpoints took ~80 ms of a cursor move."""
    timeline.precompute(stop)
    gc.freeze()


SERVER_GONE_GRACE = 2.0  # s the dashboard has to leave once its server is gone


def end_with_server() -> None:
    """Under a web server (``tuilaunch serve``: textual-serve's web driver, whose stdin is
    the server's pipe), end this process when the server is gone: its end of the pipe closed,
    even by a SIGKILL. A thread blocks in ``poll`` for the pipe's hang-up (it reads nothing:
    the dashboard's input thread owns the data), then asks the dashboard to leave (the web
    driver's SIGTERM), and ends the process itself if it has not left within
    :data:`SERVER_GONE_GRACE` s. Nothing is shown to anyone any more, and nothing is written."""
    if "web_driver" not in os.environ.get("TEXTUAL_DRIVER", "") or sys.stdin is None:
        return
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError):
        return

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: POLLHUP and POLLERR come anyway
        while not poller.poll():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(SERVER_GONE_GRACE)
        os._exit(1)

    threading.Thread(target=watch, name="tuilaunch-server-gone", daemon=True).start()


def view_args(argv: list[str], ignore: tuple[str, ...] = ()) -> tuple[str | None, float, bool]:
    """The target and the dashboard's own options of ``replay`` and ``attach``:
    ``(target, --refresh-hz, not --no-confirm)``; ``ignore`` lists flags taken here and handled
    by the caller (``--control``). Raises ValueError, in one line, on anything else."""
    from tui_launch.core.launch import validate

    target, refresh_hz, confirm, rest = None, 4.0, True, list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--no-confirm":
            confirm = False
        elif arg == "--refresh-hz":
            if not rest:
                raise ValueError("--refresh-hz needs a value")
            value = rest.pop(0)
            try:
                refresh_hz = validate.refresh_hz("--refresh-hz", float(value))
            except ValueError:
                raise ValueError(f"--refresh-hz needs a number, got {value!r}") from None
            except validate.UsageError as e:  # 1e9 starved the event loop: no frame, no keys
                raise ValueError(str(e)) from None
        elif arg in ignore:
            continue
        elif arg.startswith("-") or target is not None:
            raise ValueError(f"unexpected argument {arg!r}")
        else:
            target = arg
    return target, refresh_hz, confirm


def main(argv: list[str]) -> int:
    """``tuilaunch replay``: open the dashboard on a journal (exit 2 on bad input)."""
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        target, refresh_hz, confirm = view_args(argv)
        if target is None:
            raise ValueError("a run directory or journal is needed")
        # Only the first chunk is indexed before the first frame: the precompute thread
        # indexes the rest (the bar's event count grows meanwhile; G waits for it).
        timeline = Timeline(journal_of(target), index=False)
        if not len(timeline):
            raise ValueError(f"{timeline.path} holds no whole event")
    except (ValueError, OSError) as e:
        print(f"tuilaunch replay: error: {e} ({USAGE})", file=sys.stderr)
        return 2
    stop = threading.Event()
    worker = threading.Thread(
        target=precompute, args=(timeline, stop), name="tuilaunch-replay", daemon=True
    )
    # A short journal opens on its end (the run's final state); a long one on its start, at
    # once, and the checkpoints are computed in the background once the first frame is up
    # (started before, that thread would hold the GIL the first frame needs).
    cursor = len(timeline) if timeline.indexed and len(timeline) <= OPEN_AT_END else 0
    source = ReplaySource(timeline, cursor)
    mode = ReplayMode(source, worker)
    app = Dashboard(
        source, refresh_hz=refresh_hz, confirm=confirm, on_ready=worker.start, mode=mode
    )
    end_with_server()
    try:
        app.run()
    finally:
        stop.set()
    return 0
