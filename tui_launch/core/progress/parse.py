"""Turn one line of a rank's output into a progress reading, with no configuration.

The formats are the ones real training programs print: tqdm bars (and
the bars of the Hugging Face Trainer, PyTorch Lightning and torchtune, which are tqdm bars with
their own description), the Trainer's ``{'loss': ...}`` dicts, Lightning's rich bar, torchtitan,
Megatron-LM, DeepSpeed, nanoGPT, timm, the ImageNet example's ``ProgressMeter``, llm.c, the
tuilaunch example, a generic ``step N`` / ``iter N`` / ``Epoch N/M`` / ``epoch N``, and the
totals a program declares (``max_iters = 5000``, ``epochs=10``).

Cost matters more than elegance here: the launcher reads every line every rank prints, and
most of them are not progress at all. :func:`maybe_progress` is a handful of substring tests
that rejects almost every other line before any regular expression runs, and each format has
its own cheap anchor test before its pattern. Standard library only: this runs in the core.
The parsers themselves are in :mod:`.formats`; the reading and their shared helpers in
:mod:`.reading`. A new format: a parser there, an anchor and a row of ``_PARSERS`` here.
"""

from __future__ import annotations

from collections.abc import Callable

from tui_launch.core.progress.formats import (
    _parse_declared,
    _parse_deepspeed,
    _parse_epoch_line,
    _parse_generic,
    _parse_hf_dict,
    _parse_imagenet,
    _parse_llmc,
    _parse_megatron,
    _parse_nanogpt,
    _parse_rich,
    _parse_timm,
    _parse_torchtitan,
    _parse_tqdm,
    _parse_tuilaunch,
)
from tui_launch.core.progress.reading import (
    FAMILIES,
    ProgressReading,
    _latest_segment,
    family_of,
    maybe_progress,
    strip_ansi,
)

__all__ = [
    "FAMILIES",
    "ProgressReading",
    "family_anchor",
    "family_of",
    "maybe_progress",
    "parse_line",
    "strip_ansi",
]


# --- dispatch ------------------------------------------------------------------------------

_Parser = Callable[[str], "ProgressReading | None"]


def _anchor_tqdm(s: str) -> bool:
    return "[" in s and ("/s" in s or "s/" in s)


def _anchor_rich(s: str) -> bool:
    return "•" in s


def _anchor_hf(s: str) -> bool:
    return "{" in s and ":" in s


def _anchor_titan(s: str) -> bool:
    return "step:" in s and "loss:" in s


def _anchor_megatron(s: str) -> bool:
    return "iteration" in s and "|" in s


def _anchor_deepspeed(s: str) -> bool:
    return "step=" in s or "SamplesPerSec=" in s


def _anchor_nanogpt(s: str) -> bool:
    return ": loss " in s or ": train loss " in s


def _anchor_timm(s: str) -> bool:
    return "Train: " in s or "Test: [" in s


def _anchor_imagenet(s: str) -> bool:
    return "Epoch: [" in s or "Test: [" in s


def _anchor_llmc(s: str) -> bool:
    return " | loss " in s


def _anchor_tuilaunch(s: str) -> bool:
    return "| Steps: " in s


def _anchor_declared(s: str) -> bool:
    # a name and a value ("max_iters = 60", "epochs: 10") or "training for 100 epochs"
    return "=" in s or ":" in s or " for " in s


def _anchor_generic(s: str) -> bool:
    # the words of the generic pattern, either case, without lower()-ing the line
    return "tep" in s or "ter" in s or "poch" in s or "TEP" in s or "TER" in s or "POCH" in s


# Most specific first: a tqdm bar may carry "loss=" and "step" words, llm.c's "step  1/74"
# would also satisfy the generic pattern, and DeepSpeed's "global_step=" the generic one.
_PARSERS: tuple[tuple[str, Callable[[str], bool], _Parser], ...] = (
    ("tqdm", _anchor_tqdm, _parse_tqdm),
    ("rich", _anchor_rich, _parse_rich),
    ("megatron", _anchor_megatron, _parse_megatron),
    ("deepspeed", _anchor_deepspeed, _parse_deepspeed),
    ("torchtitan", _anchor_titan, _parse_torchtitan),
    ("nanogpt", _anchor_nanogpt, _parse_nanogpt),
    ("timm", _anchor_timm, _parse_timm),
    ("imagenet", _anchor_imagenet, _parse_imagenet),
    ("llmc", _anchor_llmc, _parse_llmc),
    ("tuilaunch", _anchor_tuilaunch, _parse_tuilaunch),
    ("hf", _anchor_hf, _parse_hf_dict),
    ("generic", _anchor_generic, _parse_generic),
    ("declared", _anchor_declared, _parse_declared),
)
_BY_FAMILY = {name: (anchor, parser) for name, anchor, parser in _PARSERS}


def family_anchor(family: str) -> Callable[[str], bool] | None:
    """The cheap substring test of a family's lines (None for an unknown family)."""
    entry = _BY_FAMILY.get(family)
    return entry[0] if entry is not None else None


def parse_line(text: str, family: str | None = None) -> ProgressReading | None:
    """Parse one line (or the latest ``\\r``-segment of an unterminated one).

    ``family`` restricts the attempt to one format family (a locked stream): then only that
    family's pattern runs, plus the step-less lines every stream accepts (the Trainer's dicts,
    epoch lines and declared totals). Returns None when the line states no progress.
    """
    s = _latest_segment(text)
    if not maybe_progress(s):
        return None
    s = strip_ansi(s)
    if family is not None:
        entry = _BY_FAMILY.get(family)
        if entry is not None and entry[0](s):
            reading = entry[1](s)
            if reading is not None:
                return reading
        if family != "hf" and _anchor_hf(s):
            reading = _parse_hf_dict(s)
            if reading is not None:
                return reading
        if "poch" in s or "POCH" in s:
            reading = _parse_epoch_line(s)
            if reading is not None:
                return reading
        return _parse_declared(s) if _anchor_declared(s) else None
    for _name, anchor, parser in _PARSERS:
        if anchor(s):
            reading = parser(s)
            if reading is not None:
                return reading
    return None
