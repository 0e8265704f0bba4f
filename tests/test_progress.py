"""The progress parser, tracker, job view and goodput bookkeeping (tui_launch.core.progress).

Fixtures under tests/fixtures/progress/: tqdm, the Hugging Face Trainer, Lightning (tqdm and
rich bars) and the tuilaunch example are real captured bytes (make/README.md says which
versions); the others are rendered from the projects' own format strings. No sleeps: the
tracker takes time as an argument.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tui_launch.core.progress import (
    AttemptProgress,
    JobProgress,
    ProgressReading,
    ProgressTracker,
    maybe_progress,
    parse_line,
    summarize_goodput,
)

FIX = Path(__file__).parent / "fixtures" / "progress"


def segments(name: str) -> list[str]:
    """Every non-blank ``\\r``/``\\n`` segment of a fixture, in order (what a terminal shows)."""
    text = (FIX / name).read_text(encoding="utf-8")
    return [s for s in re.split(r"[\r\n]", text) if s.strip()]


def readings(name: str) -> list[ProgressReading]:
    return [r for r in map(parse_line, segments(name)) if r is not None]


def lines(name: str) -> list[str]:
    return [s for s in (FIX / name).read_text(encoding="utf-8").split("\n") if s.strip()]


# --- real captures -----------------------------------------------------------------------------


def test_tqdm_with_total() -> None:
    rs = readings("tqdm_total.txt")
    assert len(rs) == len(segments("tqdm_total.txt"))  # every redraw parses
    assert [r.step for r in rs][:3] == [0, 5, 10]
    assert all(r.total == 50 and r.fmt == "tqdm" and r.phase == "train" for r in rs)
    assert rs[0].rate is None  # "?it/s" before the first rate
    assert rs[-1].step == 50 and rs[-1].rate == pytest.approx(48.66)


def test_tqdm_without_total() -> None:
    rs = readings("tqdm_nototal.txt")
    assert [r.step for r in rs] == [0, 5, 10, 15, 20, 25, 30, 35, 40, 40]
    assert all(r.total is None and r.desc is None for r in rs)
    assert rs[-1].rate == pytest.approx(49.29)


def test_tqdm_unit_scale_suffixes() -> None:
    rs = readings("tqdm_unit_scale.txt")
    assert rs[1].step == 250_000 and rs[1].total == 2_000_000
    assert rs[4].step == 1_000_000  # "1.00M/2.00M"
    assert rs[-1].rate == pytest.approx(2.45e6)  # "2.45Mit/s"


def test_tqdm_seconds_per_iteration() -> None:
    rs = readings("tqdm_s_per_it.txt")
    assert [r.step for r in rs[:4]] == [0, 1, 2, 3]
    assert rs[1].rate == pytest.approx(1 / 1.30)  # "1.30s/it" -> it/s


def test_tqdm_desc_prefix() -> None:
    rs = readings("tqdm_desc.txt")
    assert all(r.desc == "train" and r.phase == "train" and r.total == 40 for r in rs)
    assert rs[-1].step == 40


def test_hf_trainer_capture() -> None:
    rs = readings("hf_trainer.txt")
    dicts = [r for r in rs if r.fmt == "hf_dict" and r.phase == "train"]
    # logging_steps=5 over 30 steps; values are quoted strings in transformers 5
    assert [d.epoch for d in dicts] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert dicts[0].loss == pytest.approx(4.321) and dicts[0].grad_norm == pytest.approx(1.281)
    assert dicts[0].learning_rate == pytest.approx(4.333e-05)
    evals = [r for r in rs if r.fmt == "hf_dict" and r.phase == "eval"]
    assert len(evals) == 3 and evals[0].loss == pytest.approx(4.334)
    summary = [r for r in rs if r.fmt == "hf_summary"]
    assert len(summary) == 1
    assert summary[0].rate == pytest.approx(13.05) and summary[0].samples_per_s == 52.21
    assert summary[0].loss == pytest.approx(4.323) and summary[0].phase == "summary"
    bars = [r for r in rs if r.fmt == "tqdm"]
    assert {r.total for r in bars} == {30, 4}  # the training bar and the eval bar
    assert max(r.step or 0 for r in bars if r.total == 30) == 30


def test_hf_trainer_tracked() -> None:
    """The eval bar (0/4 .. 4/4, printed mid-training) never becomes the job's bar."""
    tr = ProgressTracker(min_interval=0)
    for i, seg in enumerate(segments("hf_trainer.txt")):
        tr.feed(seg, float(i))
        assert tr.total in (None, 30)
    st = tr.snapshot(100.0)
    assert (st.step, st.total, st.percent) == (30, 30, 100.0)
    assert st.fmt == "tqdm" and st.locked
    assert st.loss == pytest.approx(4.323)  # the final train_loss
    assert st.epoch == pytest.approx(0.6) and st.finished
    assert st.claimed_rate == pytest.approx(13.09)


def test_lightning_tqdm_capture() -> None:
    rs = readings("lightning_tqdm.txt")
    train = [r for r in rs if r.phase == "train" and r.fmt == "lightning"]
    assert {r.epoch for r in train} == {0.0, 1.0} and {r.total for r in train} == {32}
    first_loss = next(r for r in train if r.loss is not None)
    assert (first_loss.step, first_loss.loss) == (1, pytest.approx(5.720))
    assert train[-1].step == 32 and train[-1].loss == pytest.approx(0.392)
    evals = {r.desc for r in rs if r.phase == "eval"}
    assert evals == {
        "Sanity Checking",
        "Sanity Checking DataLoader 0",
        "Validation",
        "Validation DataLoader 0",
    }


def test_lightning_tqdm_tracked() -> None:
    tr = ProgressTracker(min_interval=0)
    for i, seg in enumerate(segments("lightning_tqdm.txt")):
        tr.feed(seg, i * 0.1)
    st = tr.snapshot(100.0)
    # global steps: two epochs of 32; the tqdm bar's "Epoch 1" states no number of epochs,
    # so the run's total is unknown (not the epoch's 32)
    assert (st.step, st.total, st.epoch) == (64, None, 1.0)
    assert st.steps_done == 64
    assert st.fmt == "lightning" and st.loss == pytest.approx(0.392)


def test_lightning_rich_piped_and_terminal() -> None:
    # Piped (as under tuilaunch), rich prints the final bar once, metrics wrapped below it,
    # after Lightning's "`max_epochs=2` reached" (a declared total).
    declared, final = readings("lightning_rich.txt")
    assert (declared.fmt, declared.step, declared.epoch_total) == ("declared", None, 2)
    assert final.fmt == "lightning_rich"
    assert (final.step, final.total, final.epoch, final.epoch_total) == (32, 32, 1.0, 2)
    assert final.rate == pytest.approx(61.71)
    # Forced into terminal mode: live redraws with colours and cursor movement.
    rs = readings("lightning_rich_terminal.txt")
    train = [r for r in rs if r.phase == "train"]
    assert {r.epoch for r in train} == {0.0, 1.0} and {r.total for r in train} == {32}
    assert next(r for r in train if r.loss is not None).loss == pytest.approx(5.719)
    assert {r.desc for r in rs if r.phase == "eval"} == {"Sanity Checking", "Validation"}


def test_lightning_rich_wrapped_at_80_columns() -> None:
    # Lightning 2.6.6, rich 15, RichProgressBar() to a file (a rank's log under tuilaunch, 300
    # steps): rich cannot ask a file its width and uses 80 columns, where the remaining time
    # wraps onto a line of its own ("300/300 0:00:18 •        16.55it/s ...", then
    # "0:00:00"). Piped: the final bar only; with TTY_COMPATIBLE=1: live redraws (cursor up
    # over the two lines), the first 14 and the last 6 lines of the log kept.
    (final,) = readings("lightning_rich_80cols.txt")
    assert (final.fmt, final.step, final.total, final.epoch) == ("lightning_rich", 300, 300, 0.0)
    assert final.rate == pytest.approx(16.55) and final.loss == pytest.approx(1.925)
    rs = readings("lightning_rich_tty_compatible.txt")
    assert {r.fmt for r in rs} == {"lightning_rich"} and {r.total for r in rs} == {300}
    steps = [r.step for r in rs]
    assert steps[:4] == [0, 0, 1, 2] and steps[-4:] == [297, 298, 299, 300]
    assert rs[-1].rate == pytest.approx(15.46) and rs[-1].loss == pytest.approx(1.928)


def test_tuilaunch_example_capture() -> None:
    rs = [r for r in readings("tuilaunch_example.txt") if r.step is not None]
    assert [(r.fmt, r.step, r.epoch) for r in rs[::2]] == [
        ("tuilaunch", 20, 0.0),
        ("tuilaunch", 40, 1.0),
        ("tuilaunch", 60, 2.0),
    ]
    assert rs[0].loss == pytest.approx(21.5604)


# --- fixtures rendered from the projects' format strings ----------------------------------------

# (fixture, line index) -> the fields that line must give
EXPECTED: list[tuple[str, int, dict[str, object]]] = [
    ("torchtitan.txt", 0, dict(fmt="torchtitan", step=1, loss=12.2528, tokens_per_s=415.0)),
    ("torchtitan.txt", 2, dict(step=10, loss=9.8721, tokens_per_s=5321.0, tflops=34.59)),
    (
        "megatron.txt",
        0,
        dict(fmt="megatron", step=1, total=5000, loss=10.43863, tflops=80.2, step_time=19.1388),
    ),
    ("megatron.txt", 3, dict(step=10, total=5000, rate=1000 / 1204.3, grad_norm=26.203)),
    (
        "megatron_deepspeed.txt",
        0,
        dict(step=199, total=317892, samples_per_s=53.753, tokens_per_s=1146.733, tflops=69.85),
    ),
    ("deepspeed.txt", 0, dict(fmt="deepspeed", step=10)),
    ("deepspeed.txt", 1, dict(step=10, epoch=0.0, samples_per_s=25.02104949951172)),
    ("deepspeed.txt", 6, dict(step=40, epoch=0.0, samples_per_s=120.5)),  # the older shape
    ("nanogpt.txt", 0, dict(fmt="nanogpt", step=0, loss=10.9914)),
    ("nanogpt.txt", 2, dict(step=10, loss=9.4512, step_time=0.09732, rate=1000 / 97.32)),
    (
        "timm.txt",
        1,
        dict(fmt="timm", step=50, total=390, epoch=0.0, loss=6.41, samples_per_s=4970.87),
    ),
    ("timm.txt", 4, dict(step=0, total=97, phase="eval")),
    ("imagenet.txt", 1, dict(fmt="imagenet", step=10, total=5005, epoch=0.0, loss=6.9078)),
    ("imagenet.txt", 4, dict(fmt="imagenet", step=0, total=196, phase="eval")),
    ("llmc.txt", 0, dict(fmt="llmc", step=1, total=18865, loss=11.009872, tokens_per_s=492960.0)),
    ("llmc.txt", 1, dict(step=2, step_time=0.40161)),
    ("llmc.txt", 3, dict(step=4, loss=10.4101, tokens_per_s=1312220.0)),
    ("generic.txt", 0, dict(fmt="epoch", step=None, epoch=1.0, epoch_total=10)),
    ("generic.txt", 1, dict(fmt="generic", step=100, loss=2.345)),
    ("generic.txt", 2, dict(step=200, total=1000, loss=1.98)),
    ("generic.txt", 3, dict(step=300, loss=1.75)),
    ("generic.txt", 4, dict(step=400, total=1000)),
    ("generic.txt", 5, dict(step=500)),
    ("generic.txt", 6, dict(step=3, phase="eval")),
    ("generic.txt", 7, dict(fmt="epoch", epoch=2.0, epoch_total=10)),
]


@pytest.mark.parametrize(("name", "index", "want"), EXPECTED, ids=lambda v: str(v)[:20])
def test_rendered_fixture_lines(name: str, index: int, want: dict[str, object]) -> None:
    reading = parse_line(lines(name)[index])
    assert reading is not None
    for key, value in want.items():
        got = getattr(reading, key)
        assert got == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize(
    ("name", "noise"),
    [
        ("torchtitan.txt", []),
        ("megatron.txt", [1]),  # the memory report line
        ("nanogpt.txt", [6]),  # "saving checkpoint"
        ("imagenet.txt", [5]),  # the " *   Acc@1" summary
        ("generic.txt", [8]),
    ],
)
def test_non_progress_lines_give_nothing(name: str, noise: list[int]) -> None:
    for i in noise:
        assert parse_line(lines(name)[i]) is None


def test_torchtune_description() -> None:
    rs = readings("torchtune.txt")
    assert rs[0].fmt == "tqdm" and rs[0].step == 0  # the first draw has no description yet
    assert [(r.fmt, r.step, r.epoch) for r in rs[1:]] == [("torchtune", i, 1.0) for i in (1, 2, 3)]
    assert rs[1].loss == pytest.approx(1.2245) and rs[1].total == 1000


def test_ansi_is_stripped_and_latest_segment_wins() -> None:
    line = (
        "\x1b[31mstep: 7  \x1b[32mloss:  1.5000  \x1b[34mtps: 1,234  \x1b[36mtflops: 1.00\x1b[39m"
    )
    r = parse_line(line)
    assert r is not None and (r.step, r.loss, r.tokens_per_s) == (7, 1.5, 1234.0)
    r = parse_line(
        "\r 10%|█  | 1/10 [00:01<00:09, 1.00it/s]\r 20%|██ | 2/10 [00:02<00:08, 1.00it/s]"
    )
    assert r is not None and r.step == 2
    # tqdm.write clears the bar with spaces: the blank segment is skipped
    r = parse_line("{'loss': 0.5, 'epoch': 1.0}\r      \r")
    assert r is not None and r.loss == 0.5


def test_hf_dict_numbers_quoted_or_not() -> None:
    a = parse_line("{'loss': 2.5759, 'grad_norm': 3.1, 'learning_rate': 4.44e-06, 'epoch': 0.12}")
    b = parse_line(
        "{'loss': '2.5759', 'grad_norm': '3.1', 'learning_rate': '4.44e-06', 'epoch': '0.12'}"
    )
    assert a == b and a is not None
    assert (a.loss, a.learning_rate, a.epoch, a.grad_norm) == (2.5759, 4.44e-06, 0.12, 3.1)


def test_prefilter_rejects_plain_lines() -> None:
    for noise in ("INFO loading model", "Using 8 GPUs", "warning: something happened"):
        assert not maybe_progress(noise)
        assert parse_line(noise) is None


# --- the tracker -------------------------------------------------------------------------------


def bar(n: int, total: int = 100, desc: str = "") -> str:
    lead = f"{desc}: " if desc else ""
    return f"\r{lead}{100 * n // total:3d}%|█   | {n}/{total} [00:01<00:09, 9.00it/s]"


def test_lock_on_after_three_and_other_formats_ignored() -> None:
    tr = ProgressTracker(min_interval=0)
    tr.feed("step 1", 0.0)
    tr.feed(bar(1), 1.0)
    assert tr.family is None
    tr.feed(bar(2), 2.0)
    tr.feed(bar(3), 3.0)
    assert tr.family == "tqdm"
    tr.feed("step 999 of the data loader", 4.0)  # another family: ignored once locked
    assert tr.step == 3
    tr.feed("Epoch 2/5", 5.0)  # a clear epoch line still counts
    assert (tr.epoch, tr.epoch_total) == (2.0, 5)
    tr.feed(bar(4), 6.0)
    assert tr.step == 4


def test_falling_counter_same_total_is_next_epoch() -> None:
    tr = ProgressTracker(min_interval=0)
    tr.feed("Epoch 0/3", 0.0)
    for i, n in enumerate([0, 50, 100, 0, 30]):
        tr.feed(bar(n, desc="train"), float(i))
    st = tr.snapshot(5.0)
    assert (st.step, st.total, st.epoch, st.steps_done) == (30, 100, 1.0, 130)


def test_eval_bar_is_not_training() -> None:
    tr = ProgressTracker(min_interval=0)
    for t, n in enumerate([10, 20, 30]):
        tr.feed(bar(n, 100), float(t))
    # an eval bar: another total, from 0, while training is mid-way (no description)
    tr.feed(bar(0, 8), 3.0)
    tr.feed(bar(4, 8), 4.0)
    st = tr.snapshot(4.5)
    assert (st.step, st.total) == (30, 100)
    assert (st.eval_step, st.eval_total) == (4, 8)
    assert st.stalled_for == pytest.approx(0.5)  # the eval bar moving is not a stall
    tr.feed(bar(31, 100), 5.0)
    st = tr.snapshot(5.0)
    assert (st.step, st.steps_done, st.eval_step) == (31, 21, None)
    # a validation bar named as such with the same total is eval too
    tr.feed(bar(2, 100, desc="Validation DataLoader 0"), 6.0)
    assert tr.step == 31


def test_data_preparation_bar_before_training() -> None:
    tr = ProgressTracker(min_interval=0)
    tr.feed(bar(1000, 1000, desc="Map"), 0.0)  # datasets' map, not training
    tr.feed(bar(0, 50), 1.0)
    tr.feed(bar(5, 50), 2.0)
    assert (tr.step, tr.total) == (5, 50)


def steady(tr: ProgressTracker, rate: float, t0: float, t1: float, every: int = 1) -> float:
    """Feed a ``step N`` line every ``every`` steps at ``rate`` steps/s from t0 to t1."""
    step = int(t0 * rate) // every * every
    t = t0
    while t <= t1:
        tr.feed(f"step {step} loss 1.0", t)
        step += every
        t = step / rate
    return t


def test_rate_from_our_clock() -> None:
    tr = ProgressTracker()
    # the line claims 100 it/s, lines really arrive at 4 steps/s
    for i in range(200):
        tr.feed(bar(i, 1000).replace("9.00it/s", "100.00it/s"), i / 4)
    st = tr.snapshot(200 / 4)
    assert st.rate == pytest.approx(4.0, rel=0.02)
    assert st.claimed_rate == 100.0
    assert st.eta == pytest.approx((1000 - 199) / 4.0, rel=0.02)
    assert st.percent == pytest.approx(19.9)
    assert st.step_time == pytest.approx(0.25, rel=0.02)


def test_coalescing_keeps_the_rate() -> None:
    """200 lines/s of a bar: parsed at most every 50 ms, the rate is still right."""
    tr = ProgressTracker(min_interval=0.05)
    for i in range(20000):
        tr.feed(bar(i, 100000), i / 200)
    st = tr.snapshot(100.0)
    assert st.rate == pytest.approx(200.0, rel=0.02)
    assert st.step == 19999  # the last line was kept and parsed at snapshot


def test_no_false_slowdown_with_log_every_10_steps() -> None:
    tr = ProgressTracker()
    steady(tr, 2.0, 0.0, 600.0, every=10)
    st = tr.snapshot(600.0)
    assert st.rate == pytest.approx(2.0, rel=0.02)
    assert st.best_rate == pytest.approx(2.0, rel=0.02)
    assert not st.slowdown


def test_slowdown_after_a_minute_below_80_percent() -> None:
    tr = ProgressTracker()
    t = steady(tr, 10.0, 0.0, 120.0)
    assert tr.best_rate == pytest.approx(10.0, rel=0.02)
    step = tr.step or 0
    # now 6 steps/s (60 %): flagged once the window's rate stayed low for 60 s
    flagged_at = None
    for k in range(1, 200 * 6):
        now = t + k / 6
        tr.feed(f"step {step + k} loss 1.0", now)
        if flagged_at is None and tr.snapshot(now).slowdown:
            flagged_at = now - t
    assert flagged_at is not None
    # the windowed rate crosses 80 % within the window, then 60 s must pass
    assert 60.0 <= flagged_at <= 60.0 + tr.window
    assert tr.snapshot(t + 199).rate == pytest.approx(6.0, rel=0.02)


def test_brief_dip_is_not_a_slowdown() -> None:
    tr = ProgressTracker()
    t = steady(tr, 10.0, 0.0, 120.0)
    step = tr.step or 0
    for k in range(1, 100):  # 20 s at 5 steps/s, then back to 10
        tr.feed(f"step {step + k}", t + k / 5)
    t2 = t + 99 / 5
    step2 = step + 99
    for k in range(1, 1200):
        tr.feed(f"step {step2 + k}", t2 + k / 10)
        assert not tr.snapshot(t2 + k / 10).slowdown


def test_stalled_for() -> None:
    tr = ProgressTracker(min_interval=0)
    tr.feed("step 1", 10.0)
    tr.feed("step 2", 11.0)
    tr.feed("step 2", 30.0)  # printed again, did not move
    assert tr.snapshot(41.0).stalled_for == pytest.approx(30.0)


# --- the job ----------------------------------------------------------------------------------


def test_job_progress_is_the_printing_rank() -> None:
    job = JobProgress(min_interval=0)
    # Megatron prints from the last rank only; the others print other things.
    for t in range(10):
        job.feed(3, "stdout", f" iteration {t + 1:8d}/{100:8d} | lm loss: 1.0E+00 |", float(t))
        job.feed(0, "stderr", "[W init] some warning about NCCL", float(t))
    st = job.state(10.0)
    assert (st.rank, st.stream) == (3, "stdout")
    assert st.progress is not None and st.progress.step == 10
    assert set(st.streams) == {(3, "stdout")}


def test_job_leader_is_most_advanced_and_sticky() -> None:
    job = JobProgress(min_interval=0)
    job.feed(0, "stderr", bar(10), 0.0)  # HF: local rank 0 of node 0
    assert job.leader(0.0) == (0, "stderr")
    for t in range(1, 5):
        job.feed(0, "stderr", bar(10 + t), float(t))
        job.feed(8, "stderr", bar(11 + t), float(t))  # and of node 1, one step ahead
        assert job.leader(float(t)) == (0, "stderr")  # within the margin: no flipping
    job.feed(8, "stderr", bar(40), 6.0)
    assert job.leader(6.0) == (8, "stderr")  # clearly ahead now


# --- goodput ----------------------------------------------------------------------------------


def test_goodput_with_a_restart() -> None:
    # attempt 0: starts at 0, first step at 20 s, reaches step 80, dies at 120 s
    a0 = ProgressTracker(min_interval=0)
    for s in range(1, 81):
        a0.feed(f"step {s}", 20.0 + s)
    first = a0.attempt_progress(0.0, 120.0)
    assert (first.first_step, first.first_step_at, first.steps_reached) == (1, 21.0, 80)
    # attempt 1: starts at 130 s, resumes from the step-60 checkpoint, first step at 160 s
    a1 = ProgressTracker(min_interval=0)
    for s in range(61, 101):
        a1.feed(f"step {s}", 160.0 + (s - 61))
    second = a1.attempt_progress(130.0, 200.0)
    summary = summarize_goodput([first, second], now=200.0)
    l0, l1 = summary.attempts
    assert (l0.steps_reached, l0.resumed_from, l0.redone) == (80, None, 0)
    assert l0.time_to_first_step == pytest.approx(21.0)
    assert (l1.steps_reached, l1.resumed_from, l1.redone) == (100, 61, 19)
    assert l1.time_to_first_step == pytest.approx(30.0)
    assert summary.steps_redone == 19
    assert summary.wall == pytest.approx(190.0)
    # progress: 79 s in attempt 0 (steps 1..80) and 39 s in attempt 1
    assert summary.progress_time == pytest.approx(79.0 + 39.0)
    assert summary.progress_share == pytest.approx(118.0 / 190.0)


def test_goodput_tqdm_resume_is_exact() -> None:
    """A bar drawn with initial=60 says exactly where the attempt resumed."""
    tr = ProgressTracker(min_interval=0)
    tr.feed("\r  6%|▌   | 60/1000 [00:00<?, ?it/s]", 5.0)
    tr.feed("\r  6%|▌   | 61/1000 [00:01<15:00, 1.00it/s]", 9.0)
    ap = tr.attempt_progress(0.0, None)
    assert (ap.first_step, ap.first_step_at) == (60, 9.0)  # the first draw is not a step
    s = summarize_goodput([AttemptProgress(0.0, 4.0, 1, 1.0, 75, 3.0), ap], now=10.0)
    assert s.attempts[1].redone == 15 and s.attempts[1].time_to_first_step == 9.0


def test_noise_between_bar_redraws_does_not_hide_the_bar() -> None:
    """Coalescing is per kind of line: a warning with a path (it passes the pre-filter) that
    comes right after a bar redraw does not take the bar's place."""
    tr = ProgressTracker()
    noise = "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py:560: UserWarning"
    for i in range(4000):
        t = i / 200
        tr.feed(bar(i, 10000), t)
        tr.feed(noise, t + 0.001)
    st = tr.snapshot(20.0)
    assert st.locked and st.fmt == "tqdm"
    assert st.step == 3999
    assert st.rate == pytest.approx(200.0, rel=0.02)


def test_a_batch_of_lines_gives_what_feeding_them_one_by_one_gives() -> None:
    # One read of the tailer: lines that arrived together. The progress watch feeds them as a
    # batch (only the first and newest of each kind are looked at): the progress it reads is
    # the one feeding every line gives (the format lock may come a read later: it counts
    # readings, and a batch gives fewer).
    hf = lines("hf_trainer.txt")
    bars = segments("tqdm_total.txt")
    noise = [f"INFO loading shard {i} of 64" for i in range(50)]
    batches = [noise[:10], hf[:40], bars[:30] + noise + bars[30:60], noise, hf[40:] + bars[60:]]
    one, batch = ProgressTracker(), ProgressTracker()
    for k, group in enumerate(batches):
        t = 100.0 + k
        for line in group:
            one.feed(line, t)
        batch.feed_lines(group, t)
        a, b = one.snapshot(t + 0.5), batch.snapshot(t + 0.5)
        fields = ("step", "total", "epoch", "loss", "steps_done", "finished", "fmt")
        assert [getattr(b, f) for f in fields] == [getattr(a, f) for f in fields], k
    assert b == a


# --- the corpus's captures: Lightning's default bar in global steps, the DDP tutorial ----------


def test_lightning_rich_bar_counts_global_steps_with_the_runs_total() -> None:
    # Lightning's rich bar restarts each epoch ("Epoch 5/7 ... 6/16"); the tracker counts the
    # run's steps: 5 * 16 + 6 of 8 * 16.
    tr = ProgressTracker(min_interval=0)
    seen: list[tuple[int | None, int | None]] = []
    for i, seg in enumerate(segments("corpus_lightning_rich.txt")):
        tr.feed(seg, i * 0.05)
        seen.append((tr.step, tr.total))
    steps = [s for s, _ in seen if s is not None]
    assert steps == sorted(steps), "a global step never goes back"
    assert {t for _, t in seen if t is not None} == {128}
    st = tr.snapshot(100.0)
    assert (st.step, st.total, st.epoch, st.epoch_total) == (128, 128, 7.0, 8)
    assert st.steps_done == 128 and st.percent == 100.0


def test_lightning_epoch_bar_in_the_middle_of_a_run() -> None:
    # "step 6/128 in the 7th epoch of 10" is step 774/1280, and the ETA is for the run
    tr = ProgressTracker(min_interval=0)
    for k in range(4):
        tr.feed(f"Epoch 6/9  ━━━━━━━━━━ {3 + k}/128 0:00:01 • 0:00:09 12.00it/s v_num: 0", k)
    st = tr.snapshot(4.0)
    assert (st.step, st.total, st.epoch, st.epoch_total) == (774, 1280, 6.0, 10)
    assert st.rate == pytest.approx(1.0) and st.eta == pytest.approx(1280 - 774)


def test_lightning_tqdm_bar_reset_is_not_a_step_back() -> None:
    # Lightning resets its tqdm bar to 0 before naming the next epoch: "Epoch 0: 0/32" after
    # "Epoch 0: 32/32" is a redraw, and the next epoch goes on from 32.
    tr = ProgressTracker(min_interval=0)
    for t, (epoch, n) in enumerate([(0, 31), (0, 32), (0, 0), (1, 0), (1, 1)]):
        tr.feed(bar(n, 32, desc=f"Epoch {epoch}"), float(t))
        if t == 2:
            assert tr.step == 32
    st = tr.snapshot(5.0)
    assert (st.step, st.total, st.steps_done) == (33, None, 33 - 31)


def test_ddp_tutorial_epoch_lines() -> None:
    # printed when an epoch starts: "Epoch 3 | ... | Steps: 32" means 3 * 32 steps are done
    rs = [r for r in readings("corpus_ddp_tutorial.txt") if r.step is not None]
    assert {r.fmt for r in rs} == {"ddp_tutorial"}
    assert [(r.step, r.epoch) for r in rs[:3]] == [(0, 0.0), (32, 1.0), (64, 2.0)]
    assert all(r.total is None and r.loss is None for r in rs)
    tr = ProgressTracker(min_interval=0)
    for i, seg in enumerate(segments("corpus_ddp_tutorial.txt")):
        tr.feed(seg, float(i))
    st = tr.snapshot(100.0)
    assert (st.fmt, st.locked, st.step, st.epoch) == ("ddp_tutorial", True, 19 * 32, 19.0)
    assert st.rate is not None and st.rate > 0
    # the snapshot line and a line of another program are not the tutorial's: epoch lines
    # with no step
    for line in (
        "Epoch 10 | Training snapshot saved at /tmp/snapshot.pt",
        "[GPU0] Epoch 1 | Batchsize: 32 | Steps: 32 | lr 0.1",
    ):
        r = parse_line(line)
        assert r is not None and (r.fmt, r.step) == ("epoch", None), line


# --- epoch lines as the counter, declared totals, the step a restart resumed from --------------


@pytest.mark.parametrize(
    ("line", "epoch", "epoch_total"),
    [
        ("epoch 2 rank 1", 2.0, None),  # the trainer of issue 32
        ("Epoch 3/10", 3.0, 10),  # Keras
        ("Epoch [3/10], Loss: 0.1234", 3.0, 10),  # the PyTorch tutorials' print
        ("epoch 3 of 10 done", 3.0, 10),
        ("Epoch: 4 | train_loss: 0.512 | test_acc: 0.81", 4.0, None),
        ("[epoch=5] lr 0.1", 5.0, None),
        ("Resuming training from snapshot at Epoch 4", 4.0, None),
    ],
)
def test_epoch_lines_of_common_shapes(line: str, epoch: float, epoch_total: int | None) -> None:
    r = parse_line(line)
    assert r is not None
    assert (r.fmt, r.step, r.epoch, r.epoch_total) == ("epoch", None, epoch, epoch_total)


@pytest.mark.parametrize(
    "line", ["{'loss': 1.2, 'epoch': 0.25}", "Unix epoch 1732800000", "num_epochs", "epochs 3"]
)
def test_not_an_epoch_line(line: str) -> None:
    r = parse_line(line)
    assert r is None or r.epoch in (None, 0.25), r


@pytest.mark.parametrize(
    ("line", "total", "epoch_total"),
    [
        ("Overriding: max_iters = 5000", 5000, None),  # nanoGPT's configurator
        ("max_iters = 1500", 1500, None),  # the config file it prints
        ("Namespace(epochs=10, batch_size=32)", None, 10),
        ("  Total optimization steps = 60", 60, None),  # the Hugging Face Trainer
        ("  Num Epochs = 3", None, 3),
        ("Training for 100 epochs", None, 100),
        ("[RANK 0] start: restart_count=0 world_size=2 pid=7 epochs=100", None, 100),  # the demo
    ],
)
def test_declared_totals(line: str, total: int | None, epoch_total: int | None) -> None:
    r = parse_line(line)
    assert r is not None
    assert (r.fmt, r.step, r.total, r.epoch_total) == ("declared", None, total, epoch_total)
    assert parse_line("max_steps=-1") is None


def test_a_program_that_prints_only_epochs_counts_epochs() -> None:
    tr = ProgressTracker()
    for e in range(4):
        for rank_line in (f"epoch {e} rank 0", f"epoch {e} rank 0 loss 0.5"):
            tr.feed(rank_line, 10.0 * e)
    st = tr.snapshot(31.0)
    assert (st.fmt, st.step, st.total, st.eta, st.steps_done) == ("epoch", 3, None, None, 3)
    assert st.rate == pytest.approx(0.1)
    facts = tr.attempt_progress(0.0)
    assert (facts.first_step, facts.steps_reached) == (0, 3)
    # with the number of epochs: an ETA in epochs
    tr = ProgressTracker()
    for e in range(1, 4):
        tr.feed(f"Epoch [{e}/10], Loss: 0.5", 10.0 * e)
    st = tr.snapshot(31.0)
    assert (st.step, st.total) == (3, 10)
    assert st.eta == pytest.approx(70.0)


def test_step_lines_take_over_from_epoch_lines() -> None:
    # "Epoch 1/3" then per-step lines: the counter is the steps, counted from the first one
    tr = ProgressTracker(min_interval=0)
    tr.feed("Epoch 1/3", 0.0)
    tr.feed("Epoch 2/3", 1.0)
    for i in range(1, 11):
        tr.feed(f"step {i} loss 0.5", 1.0 + i)
    st = tr.snapshot(12.0)
    assert (st.fmt, st.step, st.epoch, st.epoch_total, st.steps_done) == ("generic", 10, 2.0, 3, 9)
    facts = tr.attempt_progress(0.0)
    assert (facts.first_step, facts.steps_reached) == (1, 10)


TUTORIAL_RESUMED = [
    "Loading snapshot",
    "Resuming training from snapshot at Epoch 4",
    "[GPU0] Epoch 4 | Batchsize: 32 | Steps: 20",
]


def test_resumed_from_is_the_first_step_line_read_together_with_a_resume_message() -> None:
    # The DDP tutorial resumed: its first lines come in one read of the log; the next epoch's
    # line a second later. The attempt resumed from step 4 * 20, not from the next epoch's 100.
    tr = ProgressTracker()
    tr.feed_lines(TUTORIAL_RESUMED, 1.0)
    for k, epoch in enumerate((5, 6)):
        tr.feed_lines([f"[GPU0] Epoch {epoch} | Batchsize: 32 | Steps: 20"], 2.0 + k)
    facts = tr.attempt_progress(0.0)
    assert (facts.first_step, facts.steps_reached) == (80, 120)


def test_resumed_from_is_the_first_step_line_fed_right_after_a_resume_message() -> None:
    # the same lines one by one, the step line within the coalescing interval of the message
    tr = ProgressTracker()
    for i, line in enumerate(TUTORIAL_RESUMED):
        tr.feed(line, 1.0 + 0.001 * i)
    tr.feed("[GPU0] Epoch 5 | Batchsize: 32 | Steps: 20", 2.0)
    assert tr.attempt_progress(0.0).first_step == 80


def test_totals_inferred_from_what_the_program_declared() -> None:
    # nanoGPT's configurator prints the override before the first iteration
    tr = ProgressTracker(min_interval=0)
    tr.feed("Overriding: max_iters = 60", 0.0)
    for i in range(11):
        tr.feed(f"iter {i}: loss 4.0000, time 100.00ms, mfu -100.00%", 1.0 + 0.1 * i)
    st = tr.snapshot(2.0)
    assert (st.step, st.total) == (10, 60) and st.eta == pytest.approx(5.0)
    # the demo: "epochs=100" at the start, then epochs of 20 steps: 100 x 20 steps in all
    tr = ProgressTracker(min_interval=0)
    tr.feed("[RANK 0] start: restart_count=0 world_size=2 pid=7 epochs=100", 0.0)
    for e in range(3):
        tr.feed(f"[RANK 0] Epoch {e} | Batchsize: 32 | Steps: 20 | loss 1.0", 1.0 + e)
    st = tr.snapshot(3.0)
    assert (st.step, st.total) == (60, 2000) and st.eta == pytest.approx((2000 - 60) / 20)
    # the DDP tutorial states no number of epochs: no total, no ETA
    tr = ProgressTracker(min_interval=0)
    for e in range(3):
        tr.feed(f"[GPU0] Epoch {e} | Batchsize: 32 | Steps: 32", float(e))
    st = tr.snapshot(3.0)
    assert (st.step, st.total, st.eta) == (64, None, None)


def test_eta_text_says_why_there_is_none() -> None:
    from tui_launch.core.model.events import RankProgress
    from tui_launch.core.model.progress import fmt_eta, fmt_step

    def rank(**kw: object) -> RankProgress:
        base: dict[str, object] = dict(global_rank=0, local_rank=0, stream="stdout", step=3)
        return RankProgress(**{**base, **kw})  # type: ignore[arg-type]

    assert fmt_eta(rank(total=10, rate=0.1, eta=70.0)) == "1m"
    assert fmt_eta(rank(total=None, rate=0.1)) == "? no total"
    assert fmt_eta(rank(total=10, rate=None)) == "? no rate yet"
    assert fmt_step(rank(total=10, fmt="epoch")) == "epoch 3/10"
    assert fmt_step(rank(total=10, fmt="generic")) == "3/10"
