"""Turn one line of a rank's output into a progress reading, with no configuration.

Cost matters more than elegance here: the launcher reads every line every rank prints, and
most of them are not progress at all. :func:`parse_line` takes what a terminal would show of
the line (its latest ``\\r``-segment), rejects almost every line that is not progress with
:func:`maybe_progress` (a handful of substring tests) before any regular expression runs,
strips ANSI sequences, and hands the rest to the formats (:mod:`.formats`), each behind its own
cheap anchor. Standard library only: this runs in the core.
"""

from __future__ import annotations

import re

from tui_launch.core.progress.formats import family_anchor, parse_segment
from tui_launch.core.progress.reading import FAMILIES, ProgressReading, family_of

__all__ = [
    "FAMILIES",
    "ProgressReading",
    "family_anchor",
    "family_of",
    "maybe_progress",
    "parse_line",
    "strip_ansi",
]


#: SGR colours and the other CSI sequences (cursor moves of rich/tqdm in a terminal).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def strip_ansi(text: str) -> str:
    """Remove ANSI colour/cursor sequences (torchtitan colours every field)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def _latest_segment(text: str) -> str:
    """The last non-blank ``\\r``-segment: what a terminal would show for a tqdm line.

    tqdm redraws with ``'\\r' + bar`` and ends the line only at close, and ``tqdm.write``
    clears the bar with ``'\\r' + spaces + '\\r'`` before the message, so blank segments
    are skipped.
    """
    if "\r" not in text:
        return text
    for seg in reversed(text.split("\r")):
        if seg.strip():
            return seg
    return ""


def maybe_progress(text: str) -> bool:
    """Cheap pre-filter: False means no format below can match ``text``.

    Five substring tests (C speed, no regex). Every format contains one of them: ``/`` (tqdm
    ``n/total``, ``it/s``/``s/it``, Megatron ``N/ M``, timm/ImageNet ``[i/n]``, llm.c, DeepSpeed's
    ``epoch=0/micro_step``, ``Epoch N/M``), ``tep`` (step, Step, global_step, Steps),
    ``ter`` (iter, iteration), ``poch`` (Epoch, epoch) or ``{`` (the Trainer's dicts).
    """
    return "/" in text or "tep" in text or "ter" in text or "poch" in text or "{" in text


def parse_line(text: str, family: str | None = None) -> ProgressReading | None:
    """Parse one line (or the latest ``\\r``-segment of an unterminated one).

    ``family`` restricts the attempt to one format family (a locked stream): then only that
    family's pattern runs, plus the step-less lines every stream accepts (the Trainer's dicts,
    epoch lines and declared totals). Returns None when the line states no progress.
    """
    s = _latest_segment(text)
    if not maybe_progress(s):
        return None
    return parse_segment(strip_ansi(s), family)
