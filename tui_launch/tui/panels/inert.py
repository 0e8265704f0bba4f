"""Text from workers and journals, made inert for the dashboard's terminal.

Whatever a worker prints (or a journal holds) reaches the dashboard as text, and Textual writes
a segment's characters to the terminal as they are: an OSC ``ESC ] 0 ; title BEL`` in a log line
renamed the terminal's window, ``ESC [ 2 J`` cleared it under the dashboard, ``ESC [ H`` moved
the cursor, and a bell rang. Every place the dashboard shows such text (the log views, the
agent log, the root cause, the stacks, the cluster view, the notices and toasts) goes through
:func:`inert`, the one sanitizer:

- SGR sequences (``ESC [ ... m``, colours) are dropped: the dashboard draws its own colours,
  and a worker's would bleed into the panels around them;
- ``\\r`` is dropped (what is left of a CRLF; a ``\\r``-rewritten line reaches the log views as
  its last state already);
- every other control character (C0 but tab and newline, DEL, C1) is shown in caret notation,
  ``^[`` for ESC, ``^G`` for BEL, so a title change reads ``^[]0;title^G``: visible, and inert.

The headless console is not a dashboard: it keeps torchrun's pass-through (a worker's colours
and progress bars reach the terminal as they would under torchrun).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.text import Text

__all__ = ["Inert", "inert", "inert_renderable", "inert_text"]

# Any character that a terminal acts on: C0 (but tab and newline), DEL, C1.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What inert() replaces: a whole SGR sequence first (dropped), else one control character.
_UNSAFE = re.compile(r"\x1b\[[0-9;:]*m|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    s = match.group()
    if len(s) > 1 or s == "\r":
        return ""  # an SGR sequence, or a carriage return
    code = ord(s)
    if code >= 0x80:  # C1: the 8-bit form of ESC + a letter (0x9b is CSI, ESC [)
        return "^[" + chr(code - 0x40)
    return "^" + chr(code ^ 0x40)  # ESC -> ^[, BEL -> ^G, DEL -> ^?


def inert(text: str) -> str:
    """``text`` with nothing a terminal would act on (see the module's docstring)."""
    if _CONTROL.search(text) is None:  # the common case: one scan, no copy
        return text
    return _UNSAFE.sub(_visible, text)


def inert_lines(lines: Iterable[str]) -> list[str]:
    """:func:`inert` of each line."""
    return [inert(line) for line in lines]


def inert_text(text: Text) -> Text:
    """A Rich ``Text`` made inert, keeping its styles (so it wraps as it will be shown)."""
    plain = text.plain
    if _CONTROL.search(plain) is None:
        return text
    out = text.blank_copy()
    pos = 0
    for match in _UNSAFE.finditer(plain):
        if match.start() > pos:
            out.append_text(text[pos : match.start()])
        out.append(_visible(match))
        pos = match.end()
    if pos < len(plain):
        out.append_text(text[pos:])
    return out


class Inert:
    """Any Rich renderable, rendered and then made inert segment by segment.

    For tables and groups, whose strings are measured before they are rendered: a line that
    grows (``^[`` is two cells where ESC was none) is cropped by the panel like any other.
    """

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            if segment.control or _CONTROL.search(segment.text) is None:
                # Rich's own control segments (none in a panel) are not text of a worker.
                yield segment
            else:
                yield Segment(inert(segment.text), segment.style)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.renderable)


def inert_renderable(renderable: RenderableType) -> RenderableType:
    """What a panel shows, made inert: a Text keeps its type (and its wrapping), a string
    stays a string, anything else is wrapped in :class:`Inert`."""
    if isinstance(renderable, Text):
        return inert_text(renderable)
    if isinstance(renderable, str):
        return inert(renderable)
    return Inert(renderable)
