"""A progress reading: what one line says, the family its format belongs to, global steps.

:class:`ProgressReading` is what a parsed line says; :data:`FAMILIES` groups format names
into the families a stream locks on to (:func:`family_of`); :func:`global_steps` turns a
per-epoch bar's reading into the run's steps. The parsers that make readings are in
:mod:`.formats`, the line they read is prepared by :mod:`.parse`. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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
