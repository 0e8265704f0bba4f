"""Running the dashboard in a real terminal, safely.

While the dashboard owns the terminal, anything the launcher process writes to file
descriptor 2 (torch's C++ warnings, Python warnings) would paint over it. So fd 2 is pointed at a
pipe whose lines go to the agent log, and Textual draws on a duplicate of the terminal's fd.
Everything is put back before the summary is printed, whether the dashboard ended cleanly or
with an exception.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from tui_launch.core.logs.stderr import StderrPipe
from tui_launch.core.run.handle import RunHandle
from tui_launch.tui.sources.live import LiveSource

# run_dashboard's code when the user pressed D: the job goes on headless, without the terminal.
DETACHED = -1

# Mouse and paste modes off, kitty keys off, main screen back, cursor shown, focus events off.
_LEAVE_APP_MODE = (
    b"\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?2004l\x1b[<u\x1b[?1049l\x1b[?25h\x1b[?1004l"
)


def run_dashboard(
    runner: RunHandle,
    *,
    refresh_hz: float,
    confirm: bool,
    exit_on_finish: bool,
    app_class: type | None = None,
    headless: bool = False,
) -> tuple[int | None, BaseException | None]:
    """Run the dashboard until the user quits (or the job ends, with ``exit_on_finish``).

    Returns the exit code the dashboard left with (None if it did not end cleanly;
    :data:`DETACHED` after ``D``) and the exception that ended it, if any. The job itself
    keeps running either way. ``app_class`` and ``headless`` (no terminal) are for tests.
    """
    from tui_launch.tui.app import Dashboard

    app_class = app_class or Dashboard

    source = LiveSource(runner)
    error: BaseException | None = None
    code: int | None = None
    # fd 2 into the agent log (torch's C++ warnings would paint over the dashboard); the
    # store client's retries are counted for the rendezvous panel.
    with StderrPipe(runner.agent_log, runner.store.post, to_terminal=False):
        app = app_class(
            source,
            refresh_hz=refresh_hz,
            confirm=confirm,
            exit_on_finish=exit_on_finish,
            # The dashboard's widgets, styles and Textual itself live as long as the run:
            # out of the cyclic GC's reach too (see the gc.freeze() in apps.launch.main).
            on_ready=gc.freeze,
        )

        def restore_terminal() -> None:
            # A `node` injection SIGKILLs this process: give the terminal back first, with
            # direct writes (Textual's own writer thread would not get to run).
            driver = getattr(app, "_driver", None)
            attrs = getattr(driver, "attrs_before", None)
            fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
            if attrs is not None:
                import termios

                with contextlib.suppress(Exception):
                    termios.tcsetattr(driver.fileno, termios.TCSANOW, attrs)  # type: ignore[union-attr]
            os.write(fd, _LEAVE_APP_MODE)

        runner.before_exit(restore_terminal, first=True)
        try:
            result = app.run(headless=headless)
        except Exception as e:  # the UI is a window onto the job: keep the job
            error = e
        else:
            if app.clean_exit:
                code = result if result is not None else 0
                if getattr(app, "detached", False):
                    code = DETACHED
            else:
                error = getattr(app, "_exception", None) or RuntimeError("the dashboard stopped")
    return code, error
