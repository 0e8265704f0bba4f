"""Every panel of the dashboard, in the order it sits: the one list the dashboard composes,
titles and redraws from (:class:`~tui_launch.tui.app.Dashboard`).

Each panel is declared beside its renderer (a :class:`~tui_launch.tui.panels.base.Panel`); a
new one is a row here. Within a place the order is the screen's: the side panels top down,
the tabs left to right.
"""

from __future__ import annotations

from tui_launch.tui.panels import ranks, render, stacks
from tui_launch.tui.panels.base import Panel

__all__ = ["PANELS"]

PANELS: tuple[Panel, ...] = (
    render.HEADER,
    render.RENDEZVOUS,
    render.RESTARTS,
    ranks.GPUS,
    Panel.own("logs-tab", "Logs"),  # tui/widgets/logpane.py: one rank or all, filter, follow
    render.ROOT_CAUSE,
    Panel.own("agent-tab", "Agent log"),  # torch's own messages (a LogView)
    render.CLUSTER,
    stacks.STACKS,
)
