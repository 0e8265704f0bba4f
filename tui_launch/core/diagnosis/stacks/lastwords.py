"""A rank's last words as a stack: the traceback it printed on stderr when it raised.

Before torch tears a failed group down, tuilaunch dumps the ranks that survived the first
failure. On gloo they rarely hold still for it: a peer's death breaks their collective within
milliseconds, the exception unwinds and the interpreter is in its exit handlers (or gone) by
the time py-spy attaches ("no Python frame", or ``weakref.finalize``). What they were doing
when the peer died is still on record, with no code in the rank: Python printed it, as the
traceback of the exception the broken collective raised. :func:`stack_of_traceback` reads the
last traceback of a stderr tail into the frames a dump holds (innermost first, as py-spy gives
them); :func:`exiting` tells a stack taken in the exit handlers from one taken in the program.

Pure: lines in, frames out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tui_launch.core.diagnosis.stacks.model import Frame, ThreadStack, short_file

# torch's worker excepthook prefixes every line with its rank.
_RANK_TAG = re.compile(r"^\[(?:default)?rank\d+\]: ?")
_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')
# "During handling of the above exception ..." / "The above exception was the direct cause
# ...": a chained traceback; the last one printed is the one that ended the rank.
_CHAINED = re.compile(r"^(During handling of the above exception|The above exception was)")


# What gloo and NCCL put in their messages that says nothing to a user: the C++ source line,
# and the advice after the first sentence.
_SOURCE = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cu|h|hpp):\d+\]\s*")


def short_exception(line: str, limit: int = 120) -> str:
    """An exception line in brief: gloo's ``RuntimeError: [.../pair.cc:553] Connection
    closed by peer [127.0.0.1]:53140. This is typically ...`` -> ``RuntimeError: Connection
    closed by peer [127.0.0.1]:53140``."""
    text = _SOURCE.sub("", line).strip()
    cut = text.find(". ")
    if cut > 0:
        text = text[:cut]
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


@dataclass(frozen=True)
class LastWords:
    """The frames of a rank's last traceback (innermost first) and its exception line."""

    frames: tuple[Frame, ...]
    exception: str


def stack_of_traceback(lines: tuple[str, ...] | list[str]) -> LastWords | None:
    """The last complete traceback in ``lines`` (a stderr tail), or None when there is none.

    Complete: frames followed by the exception line, so a traceback still being written is
    not taken for the rank's last words.
    """
    plain = [_RANK_TAG.sub("", ln.rstrip("\n")) for ln in lines]
    # Anywhere in its line: a progress bar that never ended its line (tqdm's) precedes it.
    start = max((i for i, ln in enumerate(plain) if ln.rstrip().endswith(_HEADER)), default=None)
    if start is None:
        return None
    frames: list[Frame] = []
    exception = ""
    for ln in plain[start + 1 :]:
        m = _FRAME.match(ln)
        if m is not None:
            path = m["path"]
            frames.append(Frame(m["function"], short_file(path), int(m["line"]), path))
            continue
        if not ln.strip() or ln.startswith((" ", "\t")):
            continue  # the quoted source line, its ^^^^ markers
        if _CHAINED.match(ln):
            break
        exception = ln.strip()
        break
    if not frames or not exception:
        return None
    return LastWords(tuple(reversed(frames)), exception)


def exiting(thread: ThreadStack | None) -> bool:
    """Whether a main thread's stack is outside the program: no frame at all, or only the
    interpreter's exit handlers (``atexit``, ``weakref.finalize``, ``threading._shutdown``),
    which run after the program's own ``<module>`` frame is gone."""
    if thread is None or not thread.frames:
        return True
    return not any(f.function == "<module>" for f in thread.frames)
