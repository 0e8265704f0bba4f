"""The last lines of a log file as a terminal last showed them: what a report prints of a rank.

Read from the file's end, so a log of any size costs about the same: the line starts are found
by a backward search for newlines (at most :data:`SCAN_BYTES`), and of each line at most its
last :data:`LINE_BYTES` are read. A line is shown as the part after its last carriage return (a
progress bar redrawn in place: a tqdm bar of one epoch is one line of megabytes), without
colours or cursor moves; a line still longer than :data:`LINE_CHARS` is cut to its end, saying
how much was left out.
"""

from __future__ import annotations

import os
import re
from typing import BinaryIO

LINE_BYTES = 64 * 1024  # read of one line at most (its end: what a terminal showed last)
LINE_CHARS = 2000  # shown of one line at most
SCAN_BYTES = 64 * 1024 * 1024  # searched backwards for the lines' starts at most
CHUNK = 64 * 1024

# Terminal control sequences (colours, cursor moves, titles).
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def tail_lines(path: str, count: int) -> tuple[int, tuple[str, ...]] | None:
    """The file's size and its last ``count`` lines (None: unreadable)."""
    try:
        with open(path, "rb") as fp:
            size = fp.seek(0, os.SEEK_END)
            spans = _last_spans(fp, size, count)
            return size, tuple(_read_line(fp, start, end, cut) for start, end, cut in spans)
    except OSError:
        return None


def _last_spans(fp: BinaryIO, size: int, count: int) -> list[tuple[int, int, bool]]:
    """The byte ranges ``(start, end, cut)`` of the file's last ``count`` lines (the newline
    left out; ``cut``: the line began before the search gave up, so its start is unknown)."""
    end = size
    fp.seek(max(0, size - 1))
    if size and fp.read(1) == b"\n":
        end = size - 1  # the newline that ends the last line does not start an empty one
    # Newlines before ``end``, from the last backwards: each one ends the line before it.
    breaks: list[int] = []
    pos, floor = end, max(0, end - SCAN_BYTES)
    while pos > floor and len(breaks) < count:
        lo = max(floor, pos - CHUNK)
        fp.seek(lo)
        chunk = fp.read(pos - lo)
        hit = len(chunk)
        while len(breaks) < count:
            hit = chunk.rfind(b"\n", 0, hit)
            if hit < 0:
                break
            breaks.append(lo + hit)
        pos = lo
    spans = []
    stop = end
    for b in breaks:
        spans.append((b + 1, stop, False))
        stop = b
    if len(breaks) < count and size > 0:
        # The file's first line, or one that began before the search gave up.
        spans.append((floor, stop, floor > 0))
    return spans[::-1]


def _read_line(fp: BinaryIO, start: int, end: int, cut: bool) -> str:
    """The line in ``[start, end)`` as a terminal last showed it."""
    lo = max(start, end - LINE_BYTES)
    fp.seek(lo)
    raw = fp.read(end - lo).rstrip(b"\r")
    r = raw.rfind(b"\r")
    if r >= 0:
        # Redrawn in place: the terminal shows what came after the last carriage return.
        raw, lo, cut = raw[r + 1 :], lo + r + 1, False
    text = _CONTROL.sub("", raw.decode("utf-8", "replace"))
    left_out = lo - start if r < 0 else 0
    if len(text) > LINE_CHARS:
        left_out += len(text[:-LINE_CHARS].encode("utf-8", "replace"))
        text = text[-LINE_CHARS:]
    if left_out > 0 or cut:
        more = "more than " if cut else ""
        return f"[{more}{left_out:,} bytes of this line left out] {text}"
    return text
