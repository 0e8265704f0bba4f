"""Small widgets of the dashboard: a panel that redraws only on change, and a calmer footer.

Textual internals used here; checked against the pinned range (``textual>=8.2,<9``):

- ``Footer.bindings_changed(screen)``: overridden by :class:`KeyFooter` (Textual calls it when
  a screen's bindings are refreshed; the base class recomposes the footer).
- ``Screen.active_bindings`` values as ``(node, binding, enabled, tooltip)`` tuples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Static

from tui_launch.tui.panels.inert import inert_renderable


class CachedPanel(Static):
    """A ``Static`` that redraws only when what it shows changed, and lays out only when its
    height changed.

    :meth:`show` takes a key (whatever the content depends on) and a function making the
    content: the function is not even called while the key stays the same.
    ``measure=False`` is for panels whose height the CSS fixes (the header): no layout ever.
    """

    def __init__(self, *, measure: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._measure = measure
        self._key: object = _NEVER
        self._text: Text | None = None
        self._height: int | None = None

    def show(self, key: object, make: Callable[..., RenderableType], *args: object) -> None:
        """Show ``make(*args)`` unless ``key`` is the key of what is shown already.

        The content is made inert (:mod:`tui_launch.tui.panels.inert`): a panel shows text from the
        workers and the journal (tracebacks, stacks, node errors), never their escapes."""
        if self._key == key:
            return
        self._key = key
        content = inert_renderable(make(*args))
        if isinstance(content, Text) and content == self._text:
            return  # a new key, the same words (the GPU panel's "no GPU" line, every sample)
        self._text = content if isinstance(content, Text) else None
        # A Static's update lays out (and so repaints) the whole screen by default, in case
        # its height changed. Panels change every second (GPU figures, the clock) but rarely
        # change height: measure the new content and lay out only when it did.
        self.update(content, layout=False)
        if not self._measure:
            return
        width = self.content_region.width
        if not width:
            self.refresh(layout=True)
            return
        size = self.screen.size
        height = self.get_content_height(size, size, width)
        if self._height != height:
            self._height = height
            self.refresh(layout=True)


_NEVER = object()  # the key of a panel that has shown nothing yet


class KeyFooter(Footer):
    """Textual's footer, rebuilt only when the keys it would show change.

    The footer rebuilds every key widget whenever its screen's bindings are refreshed,
    including when a dialog or the help closes and the dashboard resumes with the very keys it
    had: that rebuild was most of what closing a dialog cost.
    """

    _shown: tuple[object, ...] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Footer composes no key until its screen's first bindings signal, and then
        # recomposes after a refresh: the first frames had no footer (an attach's first full
        # frame waited ~2 frames more for it). The screen's bindings are there at compose.
        self.set_reactive(Footer._bindings_ready, True)

    def compose(self) -> ComposeResult:
        """The keys, from the first compose on."""
        self._shown = self._keys(self.screen)
        yield from super().compose()

    def _keys(self, screen: Screen) -> tuple[object, ...]:
        keys = tuple(
            (binding.key, binding.description, enabled, tooltip)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
            if binding.show
        )
        return (self.show_command_palette, keys)

    def watch_show_command_palette(self, show: bool) -> None:
        # The palette's key is composed or not (Footer only repaints on this change).
        if self._shown is not None and self._shown[0] != show and self.is_attached:
            self.call_after_refresh(self.recompose)
            self._shown = None

    def bindings_changed(self, screen: Screen) -> None:
        """Recompose (as Footer does) unless the same keys would be shown again."""
        keys = self._keys(screen)
        if keys == self._shown and self.children:
            return
        self._shown = keys
        super().bindings_changed(screen)
