"""A tab bar that is one widget: the dashboard's Logs / Root cause / Agent log / Cluster tabs.

Textual's ``TabbedContent`` is twelve widgets deep (tabs, their row, scroller, underline,
switcher, pane), and the compositor asks every widget under a changed region to paint itself
on every frame, cached or not: with the log scrolling once a second, the tab machinery cost more
than the log. Here one widget draws the labels and the underline, and shows one of the panes
(``display``) that follow it in the layout.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

__all__ = ["TabBar"]

INDENT = 1  # columns before the first label
GAP = 2  # columns between labels


class TabBar(Static, can_focus=True):
    """Two lines, labels and an underline; ``active`` is the shown pane's id.

    Click a label, or focus the bar (Tab) and use left / right.
    """

    DEFAULT_CSS = """
    TabBar {
        height: 2;
    }
    TabBar > .tabbar--active {
        color: $text;
        text-style: bold;
    }
    TabBar > .tabbar--inactive {
        color: $text-muted;
    }
    TabBar > .tabbar--line {
        color: $foreground 15%;
    }
    TabBar > .tabbar--line-active {
        color: $accent;
    }
    TabBar:focus > .tabbar--line-active {
        color: $text-accent;
    }
    """
    COMPONENT_CLASSES = {
        "tabbar--active",
        "tabbar--inactive",
        "tabbar--line",
        "tabbar--line-active",
    }
    BINDINGS = [
        Binding("left", "previous", "Previous tab", show=False),
        Binding("right", "next", "Next tab", show=False),
    ]

    active: reactive[str] = reactive("", init=False)

    class Activated(Message):
        """The tab with ``tab_id`` became the active one."""

        def __init__(self, bar: TabBar, tab_id: str) -> None:
            super().__init__()
            self.bar = bar
            self.tab_id = tab_id

    def __init__(
        self, tabs: Sequence[tuple[str, str]], panes: Sequence[Widget], *, id: str | None = None
    ) -> None:
        """``tabs``: (pane id, label) in order; ``panes``: the widgets they show."""
        super().__init__(id=id)
        self._tabs = tuple(tabs)
        self._panes = {pane.id: pane for pane in panes}
        self.set_reactive(TabBar.active, self._tabs[0][0])

    @property
    def tab_ids(self) -> tuple[str, ...]:
        """Pane ids, in order."""
        return tuple(tab_id for tab_id, _ in self._tabs)

    def on_mount(self) -> None:
        self._show(self.active)

    def watch_active(self, old: str, new: str) -> None:
        if new not in self.tab_ids:
            raise ValueError(f"no tab {new!r}")
        self._show(new)
        self.post_message(self.Activated(self, new))

    def _show(self, active: str) -> None:
        for tab_id, pane in self._panes.items():
            pane.display = tab_id == active
        self.update(self._render_tabs(active))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self.is_mounted:
            self.update(self._render_tabs(self.active))

    def _render_tabs(self, active: str) -> Text:
        def style(name: str) -> Style:
            return self.get_component_rich_style(f"tabbar--{name}", partial=True)

        labels, line = Text(" " * INDENT, no_wrap=True), Text("━" * INDENT, style("line"))
        for i, (tab_id, label) in enumerate(self._tabs):
            on = tab_id == active
            if i:
                labels.append(" " * GAP)
                line.append("━" * GAP, style("line"))
            labels.append(label, style("active" if on else "inactive"))
            line.append("━" * len(label), style("line-active" if on else "line"))
        # The underline runs on to the right edge (the bar is drawn with no wrap or ellipsis).
        line.append("━" * 400, style("line"))
        labels.append("\n")
        labels.append_text(line)
        return labels

    def _tab_at(self, x: int) -> str | None:
        pos = INDENT
        for tab_id, label in self._tabs:
            if pos <= x < pos + len(label):
                return tab_id
            pos += len(label) + GAP
        return None

    def on_click(self, event: events.Click) -> None:
        """A click on a label shows its pane."""
        offset = event.get_content_offset(self)
        if offset is None:
            return
        tab_id = self._tab_at(offset.x)
        if tab_id is not None:
            self.active = tab_id

    def action_next(self) -> None:
        """The tab to the right (wraps)."""
        ids = self.tab_ids
        self.active = ids[(ids.index(self.active) + 1) % len(ids)]

    def action_previous(self) -> None:
        """The tab to the left (wraps)."""
        ids = self.tab_ids
        self.active = ids[(ids.index(self.active) - 1) % len(ids)]
