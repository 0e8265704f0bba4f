"""The base of the dashboard's modes: what a dashboard over one kind of source does beyond
the view. The live run's mode is this base itself; :mod:`tui_launch.tui.modes` has the
replay and the attaches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from textual.widget import Widget


class View(Protocol):
    """What the base mode needs of its dashboard (the modes that need more, in
    :mod:`tui_launch.tui.modes`, hold the :class:`~tui_launch.tui.app.Dashboard` itself)."""

    def refresh_view(self) -> None:
        """Redraw what changed."""


class Mode:
    """What a dashboard over one kind of source does beyond the view: the live run's mode is
    this base itself (nothing more); :mod:`tui_launch.tui.modes` has the replay and the
    attaches. The Dashboard calls these hooks; a mode's ``action_<name>`` methods answer the
    action table's keys that the app has no method for (the replay cursor's)."""

    replay = False  # the replay keys apply, and the acting ones only with ``controls``
    controls = False  # an attach --control: the acting keys apply to a replayed live run
    acts_on_finish = True  # the run's end is acted on (a recorded end is only shown)

    app: View

    def bind(self, app: View) -> None:
        """Called by the Dashboard that holds this mode, before it composes."""
        self.app = app

    def compose(self) -> Iterator[Widget]:
        """The widgets right under the header (the replay bar)."""
        return iter(())

    def on_mount(self) -> None:
        """Called as the Dashboard mounts, before its first refresh."""

    def tick(self) -> None:
        """One refresh of the Dashboard (its interval, the run's end)."""
        self.app.refresh_view()

    def notice(self, message: str, severity: str | None) -> str:
        """A toast's text (an attach --control says why the socket refused)."""
        return message

    def leaving(self) -> None:
        """Called as the Dashboard exits."""
