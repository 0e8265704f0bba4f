"""The formats real training programs print: each one's parser, its cheap anchor, its row.

The formats: tqdm bars (and the bars of the Hugging Face Trainer, PyTorch Lightning and
torchtune, which are tqdm bars with their own description), the Trainer's ``{'loss': ...}``
dicts, Lightning's rich bar, torchtitan, Megatron-LM, DeepSpeed, nanoGPT, timm, the ImageNet
example's ``ProgressMeter``, llm.c, the tuilaunch example, a generic ``step N`` / ``iter N`` /
``Epoch N/M`` / ``epoch N``, and the totals a program declares (``max_iters = 5000``,
``epochs=10``).

Each ``_parse_*`` takes one ANSI-free line (the latest ``\r``-segment, prepared by
:mod:`.parse`) and returns a :class:`~.reading.ProgressReading` or None; each runs only behind
its format's cheap anchor (a substring test, no regex), in the order of ``_PARSERS``,
:func:`parse_segment` runs them. A new format: its parser, its anchor and its row of
``_PARSERS`` here, its format name in :data:`~.reading.FAMILIES` when it locks with another
family, a fixture in ``tests/fixtures/progress/``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tui_launch.core.progress.reading import ProgressReading

__all__ = ["family_anchor", "parse_segment"]

# --- what every parser shares: numbers as printed, a bar's phase, the training loss -------

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# tqdm's format_sizeof: a number and an SI suffix when unit_scale is on ("1.23k", "12.3M").
_SIZED = r"\d+(?:\.\d+)?[kMGTPEZY]?"
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}

# Words in a bar's description (or a line's prefix) that say it is not the training loop:
# evaluation bars, and the data-preparation bars that often come before training (datasets'
# "Map", "Filter", "Generating train split", tokenisation, loading checkpoint shards).
_EVAL_WORDS = ("val", "eval", "test", "sanity", "predict")
_OTHER_WORDS = ("map", "filter", "generating", "download", "tokeniz", "loading", "shard")


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


# --- tqdm and the frameworks that draw tqdm bars --------------------------------------------

# The tail of a bar with a total: "| 137/375 [00:05<00:09, 25.17it/s, v_num=0]". It starts at
# the bar's closing "|", a literal, so the regex engine jumps between "|" characters.
_TQDM_TOTAL = re.compile(
    rf"\|\s*(?P<n>{_SIZED})/(?P<total>{_SIZED}|\?)\s*"
    r"\[(?P<elapsed>[^<\],]*)(?:<(?P<remaining>[^,\]]*))?,\s*"
    rf"(?P<rate>\?|{_SIZED})(?P<unit>[A-Za-z]*/s|s/[A-Za-z]*)(?P<postfix>[^\]]*)\]"
)
# A bar without a total: "123it [00:05, 24.61it/s]" (optionally "desc: " before it).
_TQDM_NOTOTAL = re.compile(
    rf"(?:^|[\s:|])(?P<n>{_SIZED})(?P<u>[A-Za-z]*) "
    r"\[(?P<elapsed>\d+(?::\d+)+), "
    rf"(?P<rate>\?|{_SIZED})(?P<unit>[A-Za-z]*/s|s/[A-Za-z]*)(?P<postfix>[^\]]*)\]"
)
_PCT_END = re.compile(r"(\d{1,3})%\s*$")
_POSTFIX_PAIR = re.compile(rf"(\w+)=({_NUM}|nan|inf)")
_LIGHTNING_DESC = re.compile(r"^Epoch (\d+)$")
# torchtune: pbar.set_description(f"{curr_epoch + 1}|{self.global_step}|Loss: {loss}")
_TORCHTUNE_DESC = re.compile(rf"^(\d+)\|(\d+)\|Loss: ({_NUM}|nan)")


def _tqdm_rate(rate: str, unit: str) -> float | None:
    if rate == "?":
        return None
    value = _sized(rate)
    if unit.startswith("s/"):
        # tqdm flips to seconds per unit below 1 it/s.
        return 1.0 / value if value > 0 else None
    return value


def _parse_tqdm(s: str) -> ProgressReading | None:
    m = _TQDM_TOTAL.search(s)
    if m is not None:
        left = s[: m.start()]
        bar_at = left.rfind("|")
        head = left[:bar_at] if bar_at >= 0 else left
        pm = _PCT_END.search(head)
        desc = (head[: pm.start()] if pm else head).strip().rstrip(":").strip()
        total_s = m.group("total")
        total = None if total_s == "?" else round(_sized(total_s))
    else:
        m = _TQDM_NOTOTAL.search(s)
        if m is None:
            return None
        desc = s[: m.start("n")].strip().rstrip(":").strip()
        total = None
    step = round(_sized(m.group("n")))
    rate = _tqdm_rate(m.group("rate"), m.group("unit"))
    postfix = m.group("postfix")
    pairs = dict(_POSTFIX_PAIR.findall(postfix)) if "=" in postfix else {}
    loss = _pick_loss(pairs) if pairs else None
    fmt = "tqdm"
    epoch: float | None = None
    if desc:
        lm = _LIGHTNING_DESC.match(desc)
        tm = _TORCHTUNE_DESC.match(desc)
        if lm is not None:
            fmt, epoch = "lightning", float(lm.group(1))
        elif tm is not None:
            fmt, epoch, loss = "torchtune", float(tm.group(1)), _num(tm.group(3))
        elif "DataLoader" in desc or desc in ("Validation", "Testing", "Predicting"):
            fmt = "lightning"
    phase = _phase_of(desc) if desc and fmt != "torchtune" else "train"
    return ProgressReading(
        fmt=fmt,
        step=step,
        total=total,
        epoch=epoch,
        rate=rate,
        loss=loss,
        phase=phase,
        desc=desc or None,
    )


# --- Lightning's RichProgressBar -------------------------------------------------------------

# "Epoch 1/1  ━━━━━━━━━━━━━━━━━━━ 32/32 0:00:00 • 0:00:00 112.63it/s v_num: 0 train_loss: 0.25"
# On a console narrower than the bar (80 columns: a file, whose width rich cannot ask) rich
# wraps the remaining time onto a line of its own: "32/32 0:00:00 •       112.63it/s ...".
_RICH = re.compile(
    r"^\s*(?P<desc>.*?)\s*[━╸╺─\s]*\s(?P<n>\d+)/(?P<total>\d+|\?)\s+"
    r"(?P<elapsed>[\d:-]+)\s*•\s*(?P<remaining>[\d:-]+)?\s+"
    rf"(?:(?P<rate>{_NUM})it/s)?(?P<metrics>.*)$"
)
_RICH_PAIR = re.compile(rf"(\w+): ({_NUM}|nan)")
_EPOCH_OF = re.compile(r"Epoch (\d+)(?:/(\d+))?")


def _parse_rich(s: str) -> ProgressReading | None:
    m = _RICH.match(s)
    if m is None:
        return None
    desc = m.group("desc").strip()
    em = _EPOCH_OF.match(desc)
    pairs = dict(_RICH_PAIR.findall(m.group("metrics")))
    total_s = m.group("total")
    return ProgressReading(
        fmt="lightning_rich",
        step=int(m.group("n")),
        total=None if total_s == "?" else int(total_s),
        epoch=float(em.group(1)) if em else None,
        # Lightning prints "Epoch {current}/{max_epochs - 1}": both 0-based
        epoch_total=int(em.group(2)) + 1 if em and em.group(2) else None,
        rate=_num(m.group("rate")),
        loss=_pick_loss(pairs) if pairs else None,
        phase=_phase_of(desc),
        desc=desc or None,
    )


# --- the Hugging Face Trainer's dicts ----------------------------------------------------------

# "{'loss': 2.5759, 'grad_norm': 1.2, 'learning_rate': 4.44e-06, 'epoch': 0.12}"; newer versions
# print some values as quoted strings ("{'loss': '1.764', ...}"), JSON-style double quotes too.
_DICT_PAIR = re.compile(rf"""['"](\w+)['"]:\s*['"]?({_NUM}|nan|inf)['"]?""")


def _parse_hf_dict(s: str) -> ProgressReading | None:
    start = s.find("{")
    if start < 0 or s.rfind("}") < start:
        return None
    pairs = dict(_DICT_PAIR.findall(s, start))
    if not pairs:
        return None
    if "train_runtime" in pairs:
        return ProgressReading(
            fmt="hf_summary",
            epoch=_num(pairs.get("epoch")),
            rate=_num(pairs.get("train_steps_per_second")),
            loss=_num(pairs.get("train_loss")),
            samples_per_s=_num(pairs.get("train_samples_per_second")),
            phase="summary",
        )
    if "eval_loss" in pairs or "eval_runtime" in pairs:
        return ProgressReading(
            fmt="hf_dict",
            epoch=_num(pairs.get("epoch")),
            loss=_num(pairs.get("eval_loss")),
            samples_per_s=_num(pairs.get("eval_samples_per_second")),
            phase="eval",
        )
    if "loss" not in pairs and "epoch" not in pairs:
        return None
    return ProgressReading(
        fmt="hf_dict",
        epoch=_num(pairs.get("epoch")),
        loss=_num(pairs.get("loss")),
        learning_rate=_num(pairs.get("learning_rate")),
        grad_norm=_num(pairs.get("grad_norm")),
    )


# --- log-line formats ----------------------------------------------------------------------

# torchtitan: "step: 10  loss:  7.1234  grad_norm: ...  memory: ...  tps: 1,234  tflops: 12.34"
_TITAN = re.compile(rf"\bstep:\s*(\d+)\s+loss:\s*({_NUM}|nan)")
_TITAN_TPS = re.compile(r"\btps: ([\d,]+)")
_TITAN_TFLOPS = re.compile(r"\btflops: ([\d,.]+)")
_TITAN_GRAD = re.compile(rf"\bgrad_norm:\s*({_NUM})")


def _parse_torchtitan(s: str) -> ProgressReading | None:
    m = _TITAN.search(s)
    if m is None:
        return None
    tps = _TITAN_TPS.search(s, m.end())
    tfl = _TITAN_TFLOPS.search(s, m.end())
    gn = _TITAN_GRAD.search(s, m.end())
    return ProgressReading(
        fmt="torchtitan",
        step=int(m.group(1)),
        loss=_num(m.group(2)),
        tokens_per_s=_num(tps.group(1)) if tps else None,
        tflops=_num(tfl.group(1)) if tfl else None,
        grad_norm=_num(gn.group(1)) if gn else None,
    )


# Megatron-LM / Megatron-DeepSpeed: " iteration        1/    5000 | consumed samples: ... |
# elapsed time per iteration (ms): 19138.8 | throughput per GPU (TFLOP/s/GPU): 80.2 | ...
# lm loss: 1.043863E+01 | ..." (Megatron-DeepSpeed adds "samples per second:" and "tgs").
_MEGATRON = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_MEGA_FIELD = re.compile(rf"\|\s*([^|:]+?):\s*({_NUM}|nan)\s*(?=\|)")


def _parse_megatron(s: str) -> ProgressReading | None:
    m = _MEGATRON.search(s)
    if m is None:
        return None
    fields = dict(_MEGA_FIELD.findall(s, m.end() - 1))
    ms = _num(fields.get("elapsed time per iteration (ms)"))
    loss = _num(fields.get("lm loss"))
    if loss is None:
        loss = _pick_loss({k.replace(" ", "_"): v for k, v in fields.items()})
    tflops = _num(fields.get("throughput per GPU (TFLOP/s/GPU)") or fields.get("TFLOPs"))
    return ProgressReading(
        fmt="megatron",
        step=int(m.group(1)),
        total=int(m.group(2)),
        rate=1000.0 / ms if ms else None,
        loss=loss,
        samples_per_s=_num(fields.get("samples per second")),
        tokens_per_s=_num(fields.get("tokens per gpu per second (tgs)")),
        tflops=tflops,
        step_time=ms / 1000.0 if ms is not None else None,
        learning_rate=_num(fields.get("learning rate")),
        grad_norm=_num(fields.get("grad norm")),
    )


# DeepSpeed: "[Rank 0] step=10, skipped=4, lr=[...], mom=[...]" and the timer's
# "epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=25.02, CurrSamplesPerSec=25.7,
# MemAllocated=..." (older: "0/20, RunningAvgSamplesPerSec=..." = epoch/global step).
_DS_STEP = re.compile(r"\bstep=(\d+), skipped=(\d+)")
_DS_TIMER = re.compile(
    r"\bepoch=(\d+)/micro_step=\d+/global_step=(\d+), RunningAvgSamplesPerSec=([\d.eE+-]+)"
)
_DS_TIMER_OLD = re.compile(r"(?:^|\s)(\d+)/(\d+), (?:RunningAvg)?SamplesPerSec=([\d.eE+-]+)")


def _parse_deepspeed(s: str) -> ProgressReading | None:
    m = _DS_TIMER.search(s) or _DS_TIMER_OLD.search(s)
    if m is not None:
        return ProgressReading(
            fmt="deepspeed",
            step=int(m.group(2)),
            epoch=float(m.group(1)),
            samples_per_s=_num(m.group(3)),
        )
    m = _DS_STEP.search(s)
    if m is None:
        return None
    return ProgressReading(fmt="deepspeed", step=int(m.group(1)))


# nanoGPT: "iter 10: loss 4.2311, time 97.32ms, mfu 31.20%" and, at eval_interval,
# "step 2000: train loss 1.0154, val loss 1.0882" (the training counter, so phase train).
_NANO_ITER = re.compile(rf"\biter (\d+): loss ({_NUM}|nan), time ({_NUM})ms")
_NANO_EVAL = re.compile(rf"\bstep (\d+): train loss ({_NUM}|nan), val loss")


def _parse_nanogpt(s: str) -> ProgressReading | None:
    m = _NANO_ITER.search(s)
    if m is not None:
        ms = float(m.group(3))
        return ProgressReading(
            fmt="nanogpt",
            step=int(m.group(1)),
            rate=1000.0 / ms if ms > 0 else None,
            loss=_num(m.group(2)),
            step_time=ms / 1000.0,
        )
    m = _NANO_EVAL.search(s)
    if m is None:
        return None
    return ProgressReading(fmt="nanogpt", step=int(m.group(1)), loss=_num(m.group(2)))


# timm: "Train: 3 [ 150/390 ( 38%)]  Loss: 3.142 (3.35)  Time: 0.412s,  621.12/s  (0.420s,
# 609.52/s)  LR: 1.000e-03  Data: 0.011 (0.015)"; validate(): "Test: [  10/97]  Time: ...".
_TIMM = re.compile(r"\bTrain: (\d+) \[\s*(\d+)/(\d+) \(\s*\d+%\)\]")
_TIMM_LOSS = re.compile(rf"Loss:\s*({_NUM}|nan)")
_TIMM_TIME = re.compile(rf"Time: ({_NUM})s,\s+({_NUM})/s")
_TEST_BAR = re.compile(r"^\s*Test: \[\s*(\d+)/(\d+)\]")
# The ImageNet example: "Epoch: [0][  10/5005]\tTime  0.345 ( 0.456)\t...\tLoss 6.9e+00 (...)".
_IMAGENET = re.compile(r"\bEpoch: \[(\d+)\]\[\s*(\d+)/(\d+)\]")
_IMAGENET_LOSS = re.compile(rf"\bLoss\s+({_NUM}|nan)")
_IMAGENET_TIME = re.compile(rf"\bTime\s+({_NUM})")


def _parse_timm(s: str) -> ProgressReading | None:
    m = _TIMM.search(s)
    if m is None:
        return _parse_test_bar(s, "timm")
    lm = _TIMM_LOSS.search(s, m.end())
    tm = _TIMM_TIME.search(s, m.end())
    step_time = _num(tm.group(1)) if tm else None
    return ProgressReading(
        fmt="timm",
        step=int(m.group(2)),
        total=int(m.group(3)),
        epoch=float(m.group(1)),
        rate=1.0 / step_time if step_time else None,
        loss=_num(lm.group(1)) if lm else None,
        samples_per_s=_num(tm.group(2)) if tm else None,
        step_time=step_time,
    )


def _parse_test_bar(s: str, fmt: str) -> ProgressReading | None:
    m = _TEST_BAR.search(s)
    if m is None:
        return None
    return ProgressReading(
        fmt="imagenet" if "\t" in s else fmt,
        step=int(m.group(1)),
        total=int(m.group(2)),
        phase="eval",
        desc="Test",
    )


def _parse_imagenet(s: str) -> ProgressReading | None:
    m = _IMAGENET.search(s)
    if m is None:
        return _parse_test_bar(s, "imagenet")
    lm = _IMAGENET_LOSS.search(s, m.end())
    tm = _IMAGENET_TIME.search(s, m.end())
    step_time = _num(tm.group(1)) if tm else None
    return ProgressReading(
        fmt="imagenet",
        step=int(m.group(2)),
        total=int(m.group(3)),
        epoch=float(m.group(1)),
        rate=1.0 / step_time if step_time else None,
        loss=_num(lm.group(1)) if lm else None,
        step_time=step_time,
    )


# llm.c: "step    1/74 | loss 7.577453 (+nanz)| norm 6.8193 (+nanz)| lr 8.57e-07 |
# 1063.52 ms | -100.0% bf16 MFU | 492960 tok/s" (printf "step %4d/%d | loss %7.6f ...").
_LLMC = re.compile(rf"^\s*step\s+(\d+)/(\d+) \| loss ({_NUM}|nan|-?inf)")
_LLMC_MS = re.compile(rf"\| ({_NUM}) ms \|")
_LLMC_TOK = re.compile(rf"\| ({_NUM}) tok/s|\| tps ({_NUM})")


def _parse_llmc(s: str) -> ProgressReading | None:
    m = _LLMC.match(s)
    if m is None:
        return None
    ms_m = _LLMC_MS.search(s, m.end())
    tok_m = _LLMC_TOK.search(s, m.end())
    ms = _num(ms_m.group(1)) if ms_m else None
    return ProgressReading(
        fmt="llmc",
        step=int(m.group(1)),
        total=int(m.group(2)),
        rate=1000.0 / ms if ms else None,
        loss=_num(m.group(3)),
        tokens_per_s=_num(tok_m.group(1) or tok_m.group(2)) if tok_m else None,
        step_time=ms / 1000.0 if ms is not None else None,
    )


# tuilaunch's examples/train_ddp.py, once per epoch on every rank, when the epoch is done:
# "[RANK 0] Epoch 0 | Batchsize: 32 | Steps: 20 | loss 21.5604". Epochs there are all the same
# length, so the step counter is (epoch + 1) * Steps: it keeps rising across epochs and across
# a restart that resumes from a snapshot, which is what the goodput bookkeeping needs.
# The PyTorch DDP tutorial it comes from (multigpu.py, multigpu_torchrun.py) prints the same
# line without the loss, when the epoch *starts*: "[GPU0] Epoch 152 | Batchsize: 32 | Steps: 32"
# means 152 epochs of 32 steps are done, so its counter is epoch * Steps. Neither line states
# the number of epochs (the tutorial takes it as its first argument, a convention of that
# script only): the run's total is known only when the program states it elsewhere (see
# :func:`_parse_declared`), as epochs x Steps.
_TUILAUNCH = re.compile(
    rf"\bEpoch (\d+) \| Batchsize: \d+ \| Steps: (\d+)(?: \| loss ({_NUM}|nan))?\s*$"
)


def _parse_tuilaunch(s: str) -> ProgressReading | None:
    m = _TUILAUNCH.search(s)
    if m is None:
        return None
    epoch, steps = int(m.group(1)), int(m.group(2))
    if m.group(3) is None:
        return ProgressReading(
            fmt="ddp_tutorial", step=epoch * steps, epoch=float(epoch), per_epoch=steps
        )
    return ProgressReading(
        fmt="tuilaunch",
        step=(epoch + 1) * steps,
        epoch=float(epoch),
        loss=_num(m.group(3)),
        per_epoch=steps,
    )


# Generic: "step 12", "Step: 12/100", "iter 12", "Iteration 12/100", "global_step=12", plus a
# loss if the line states one. Case-insensitive; "steps: 20" does not match (\b after step).
_GENERIC = re.compile(
    r"\b(?:global_step|iteration|step|iter)\b[\s:=#]+(\d+)(?:\s*/\s*(\d+))?", re.I
)
_GENERIC_LOSS = re.compile(rf"\bloss\b[\s:=]+({_NUM}|nan)", re.I)
_EVAL_PREFIX = re.compile(
    r"\b(?:val|valid|validation|validating|eval|evaluation|evaluating|test|testing)\b", re.I
)
# An epoch and maybe the number of epochs: "Epoch 3/10", "epoch: 3/10", "Epoch [3/10]",
# "epoch 3 of 10", "Epoch 3", "epoch=3", "epoch 2 rank 1", "[epoch 3] loss 0.4". Not a
# fraction ("epoch 0.25" is a step-less dict's) nor "epochs"/"num_epochs" (a declared total).
_EPOCH_LINE = re.compile(r"\bepoch\b[\s:=#\[]*(\d+)(?!\d|\.\d)(?:\s*(?:/|\bof\b)\s*(\d+))?", re.I)
# Above this an "epoch" is a Unix time ("epoch 1732800000"), not a training epoch.
_EPOCH_MAX = 100_000


def _parse_generic(s: str) -> ProgressReading | None:
    m = _GENERIC.search(s)
    if m is None:
        return _parse_epoch_line(s)
    lm = _GENERIC_LOSS.search(s)
    em = _EPOCH_LINE.search(s)
    if em is not None and int(em.group(1)) > _EPOCH_MAX:
        em = None
    return ProgressReading(
        fmt="generic",
        step=int(m.group(1)),
        total=_int(m.group(2)),
        epoch=float(em.group(1)) if em else None,
        epoch_total=_int(em.group(2)) if em else None,
        loss=_num(lm.group(1)) if lm else None,
        # only whole eval words: a log prefix holds names like "interval" or "retrieval"
        phase="eval" if _EVAL_PREFIX.search(s, 0, m.start()) else "train",
    )


def _parse_epoch_line(s: str) -> ProgressReading | None:
    """An epoch line with no step: the tracker counts epochs when a stream has no step lines."""
    m = _EPOCH_LINE.search(s)
    if m is None or int(m.group(1)) > _EPOCH_MAX:
        return None
    return ProgressReading(
        fmt="epoch",
        epoch=float(m.group(1)),
        epoch_total=_int(m.group(2)),
        phase="eval" if _EVAL_PREFIX.search(s, 0, m.start()) else "train",
    )


# A total the program declares, usually once at the start: nanoGPT's configurator
# ("Overriding: max_iters = 5000", or the config file it prints), an argparse Namespace
# ("Namespace(epochs=10, ...)"), a config dump ("max_steps: 1000"), the Hugging Face
# Trainer's "Total optimization steps = 60" / "Num Epochs = 3", "Training for 100 epochs".
_DECLARED_STEPS = (
    r"max_iters?|max_steps|total_steps|num_steps|train_steps|training_steps|num_train_steps"
    r"|max_train_steps|num_training_steps|total_iters|num_iters|num_iterations|max_iterations"
    r"|total[ _]optimization[ _]steps"
)
_DECLARED_EPOCHS = (
    r"epochs|max_epochs|num_epochs|n_epochs|total_epochs|num_train_epochs|num[ _]epochs"
)
_DECLARED = re.compile(
    rf"\b(?:(?P<steps>{_DECLARED_STEPS})|(?P<epochs>{_DECLARED_EPOCHS}))\b['\"]?\s*[:=]\s*"
    r"(?P<n>\d+)(?!\d|\.\d)",
    re.I,
)
_TRAIN_FOR = re.compile(
    r"\btrain(?:ing)?\s+for\s+(?P<n>\d+)\s+(?:(?P<epochs>epochs?)|steps?|iter(?:ation)?s?)\b",
    re.I,
)


def _parse_declared(s: str) -> ProgressReading | None:
    m = _DECLARED.search(s) or _TRAIN_FOR.search(s)
    if m is None:
        return None
    n = int(m.group("n"))
    if n <= 0:
        return None
    if m.group("epochs"):
        return ProgressReading(fmt="declared", epoch_total=n)
    return ProgressReading(fmt="declared", total=n)


# --- the formats' cheap anchors, and the table that runs them -------------------------------

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


def parse_segment(s: str, family: str | None = None) -> ProgressReading | None:
    """The reading of one prepared line (:func:`~.parse.parse_line` prepares it), or None.

    ``family`` restricts the attempt to one format family (a locked stream): then only that
    family's pattern runs, plus the step-less lines every stream accepts (the Trainer's dicts,
    epoch lines and declared totals).
    """
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
