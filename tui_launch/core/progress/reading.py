"""A progress reading and the helpers every format parser shares.

:class:`ProgressReading` is what a parsed line says; :data:`FAMILIES` groups format names
into the families a stream locks on to; :func:`maybe_progress` is the cheap pre-filter;
the number and phase helpers are used by the parsers of :mod:`.formats`;
:func:`global_steps` turns a per-epoch bar's reading into the run's steps. Standard library
only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

#: SGR colours and the other CSI sequences (cursor moves of rich/tqdm in a terminal).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# tqdm's format_sizeof: a number and an SI suffix when unit_scale is on ("1.23k", "12.3M").
_SIZED = r"\d+(?:\.\d+)?[kMGTPEZY]?"
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}

# Words in a bar's description (or a line's prefix) that say it is not the training loop:
# evaluation bars, and the data-preparation bars that often come before training (datasets'
# "Map", "Filter", "Generating train split", tokenisation, loading checkpoint shards).
_EVAL_WORDS = ("val", "eval", "test", "sanity", "predict")
_OTHER_WORDS = ("map", "filter", "generating", "download", "tokeniz", "loading", "shard")


@dataclass(frozen=True, slots=True)
class ProgressReading:
    """What one line says about progress. Every field but ``fmt`` may be unknown (None).

    ``step``/``total`` are the counter of the bar or log line as printed (a tqdm bar's
    ``n``/``total``); ``rate`` is the rate the line *claims* in steps per second (``s/it``
    converted), which for tqdm is an EMA and for Lightning a lifetime mean, so the tracker
    measures its own. ``phase`` is ``"train"``, ``"eval"`` (validation/test bars and eval
    dicts) or ``"summary"`` (the Trainer's final ``train_runtime`` dict). ``per_epoch`` is
    the number of steps in one epoch, when the line states it; ``total``/``epoch_total``
    without a ``step`` are a total the program declared (``max_iters = 5000``).
    """

    fmt: str
    step: int | None = None
    total: int | None = None
    epoch: float | None = None
    epoch_total: int | None = None
    rate: float | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    step_time: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    phase: str = "train"
    desc: str | None = None
    per_epoch: int | None = None

    @property
    def family(self) -> str:
        """The format family a stream locks onto (all tqdm-based bars are one family)."""
        return family_of(self.fmt)


#: fmt -> family. A stream locks onto a family: the Trainer, Lightning and torchtune bars are
#: all tqdm bars, and DeepSpeed prints two line shapes for one counter.
FAMILIES: dict[str, str] = {
    "tqdm": "tqdm",
    "lightning": "tqdm",
    "torchtune": "tqdm",
    "lightning_rich": "rich",
    "hf_dict": "hf",
    "hf_summary": "hf",
    "torchtitan": "torchtitan",
    "megatron": "megatron",
    "deepspeed": "deepspeed",
    "nanogpt": "nanogpt",
    "timm": "timm",
    "imagenet": "imagenet",
    "llmc": "llmc",
    "tuilaunch": "tuilaunch",
    "ddp_tutorial": "tuilaunch",
    "generic": "generic",
    "epoch": "epoch",
    "declared": "declared",
}


def family_of(fmt: str) -> str:
    """The lock-on family of a format name (unknown names are their own family)."""
    return FAMILIES.get(fmt, fmt)


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


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def _int(s: str | None) -> int | None:
    if s is None:
        return None
    try:
        return int(s.replace(",", ""))
    except ValueError:
        return None


def _sized(s: str) -> float:
    """tqdm's unit_scale notation back to a number: '1.23k' -> 1230.0."""
    mult = _SCALE.get(s[-1])
    return float(s[:-1]) * mult if mult else float(s)


def _phase_of(prefix: str) -> str:
    """``"eval"``, ``"other"`` (data preparation) or ``"train"`` from a bar's description."""
    low = prefix.lower()
    if any(w in low for w in _EVAL_WORDS):
        return "eval"
    if any(w in low for w in _OTHER_WORDS):
        return "other"
    return "train"


def _pick_loss(pairs: dict[str, str]) -> float | None:
    """The training loss among ``key=value`` metrics: ``loss``, ``train_loss``, then ``*loss*``."""
    for key in ("loss", "train_loss", "train_loss_step", "train_loss_epoch"):
        if key in pairs:
            return _num(pairs[key])
    for key, val in pairs.items():
        if "loss" in key.lower() and not key.lower().startswith(("val", "eval", "test")):
            return _num(val)
    return None


#: Formats whose training bar counts the batches of one epoch and states which epoch (0-based):
#: Lightning's tqdm bar ("Epoch 6: ... 6/128") and its rich bar ("Epoch 6/9 ... 6/128").
_PER_EPOCH_BARS = frozenset({"lightning", "lightning_rich"})


def global_steps(r: ProgressReading) -> ProgressReading:
    """A per-epoch training bar's reading in global steps, with the run's total where known.

    Lightning's bar restarts every epoch: "Epoch 6/9 ... 6/128" (the 7th epoch of 10; Lightning
    counts from 0) is global step 6 * 128 + 6 = 774 of 1280 (every epoch has the same number
    of batches). The total is the run's only when the line states the number of epochs (the
    rich bar's "Epoch 7/9", 0-based); the tqdm bar's "Epoch 7" does not, and its total is
    unknown (None) rather than the epoch's.
    Any other reading is returned as it is.
    """
    if (
        r.fmt not in _PER_EPOCH_BARS
        or r.phase != "train"
        or r.epoch is None
        or r.step is None
        or not r.total
    ):
        return r
    per_epoch = r.total
    return replace(
        r,
        step=int(r.epoch) * per_epoch + r.step,
        total=r.epoch_total * per_epoch if r.epoch_total else None,
        per_epoch=per_epoch,
    )
