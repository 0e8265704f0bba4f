"""A panel of the dashboard as a record: where it sits, what it shows, when it redraws.

Each renderer module declares its panels beside its renderers (``render.HEADER``,
``ranks.GPUS``, ``stacks.STACKS``, ...) and :mod:`tui_launch.tui.panels.board` lists them in the
order they sit; the dashboard (:class:`~tui_launch.tui.app.Dashboard`) composes, titles and
redraws every panel by looping over that list. A panel's ``key`` is what its content depends
on: the panel's widget (:class:`~tui_launch.tui.widgets.cached.CachedPanel`) calls ``render``
only when the key changed, so a key says as much about the cost of the dashboard as about what
it shows.

Pure like the renderers: no Textual here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from rich.console import RenderableType

from tui_launch.core.model.store import Snapshot

if TYPE_CHECKING:
    from tui_launch.core.diagnosis.stacks import StackDump

__all__ = ["Frame", "Panel", "Where"]


class Where(Enum):
    """Where a panel sits (``dashboard.tcss`` styles each place)."""

    HEADER = "header"  # the line at the top: its height is the stylesheet's, never measured
    SIDE = "side"  # the side column (stacked above the table on a narrow screen), bordered
    TAB = "tab"  # a tab under the workers table


@dataclass(frozen=True)
class Frame:
    """What one redraw of the dashboard hands every panel."""

    snap: Snapshot
    now: float  # the source's clock (a refresh stops it at the run's end)
    second: int  # int(now): what a key that moves with the clock holds
    clock: bool  # the first frame of a new second (or a frame drawn out of the refresh)
    narrow: bool  # the screen is narrow: the side panels stack above the table
    stack_dump: Callable[[str], StackDump | None]  # the source's dump at a path


def _once(frame: Frame) -> object:
    return None  # the same key on every frame: drawn once


@dataclass(frozen=True)
class Panel:
    """One panel: a :class:`~tui_launch.tui.widgets.cached.CachedPanel` with id ``id``,
    showing ``render(frame)`` whenever ``key(frame)`` (compared with ``==``) changed.

    A panel with ``render`` None is a tab whose widget the dashboard makes itself (the Logs
    and the Agent log: widgets with state of their own); it is listed for its place among the
    tabs.
    """

    id: str  # the widget's id: dashboard.tcss and the tests find it by this
    where: Where
    title: str = ""  # SIDE: the border title; TAB: the tab's label
    key: Callable[[Frame], object] = _once
    render: Callable[[Frame], RenderableType] | None = None
    tab: str = ""  # TAB: the pane's id (the tab bar's), when it is not ``id``
    # A TAB drawn only while its tab is shown (and at once when the tab comes to the front),
    # for a panel whose key moves while nobody looks (the clock, samples).
    while_shown: bool = False
    # A border title that changes with what is shown, checked on every frame.
    retitle: Callable[[Frame], str] | None = None
    # Figures that arrive mid-second wait for the clock's frame, unless what ``shape``
    # returns changes (the panel's layout: rows appear, go, change kind).
    shape: Callable[[Snapshot], object] | None = None

    @property
    def pane(self) -> str:
        """The id of what the tab bar shows for a TAB (the panel's scroller)."""
        return self.tab or self.id

    @staticmethod
    def own(id: str, title: str) -> Panel:
        """A tab whose widget the dashboard makes itself, with id ``id``."""
        return Panel(id, Where.TAB, title, render=None)
