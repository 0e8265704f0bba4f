"""The last lines of a log file as a terminal last showed them: what a report prints of a rank.

Read from the file's end (at most :data:`TAIL_BYTES`), so a log of any size costs the same;
each line is the part after its last carriage return (a progress bar redrawn in place),
without colours or cursor moves.
"""

from __future__ import annotations

import os
import re

TAIL_BYTES = 64 * 1024  # read from the end of a log file

# Terminal control sequences (colours, cursor moves) and what a carriage return overwrote.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def tail_lines(path: str, count: int) -> tuple[int, tuple[str, ...]] | None:
    """The file's size and its last ``count`` lines, from its last :data:`TAIL_BYTES` (None:
    unreadable)."""
    try:
        with open(path, "rb") as fp:
            size = fp.seek(0, os.SEEK_END)
            fp.seek(max(0, size - TAIL_BYTES))
            data = fp.read()
    except OSError:
        return None
    lines = data.decode("utf-8", "replace").split("\n")
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first is cut
    if lines and not lines[-1]:
        lines.pop()
    return size, tuple(_plain(line) for line in lines[-count:])


def _plain(line: str) -> str:
    """A log line as it last looked on a terminal, as plain text: the part after its last
    carriage return (a progress bar redrawn in place), without control sequences."""
    line = line.rstrip("\r")
    line = line[line.rfind("\r") + 1 :]
    return _CONTROL.sub("", line)
