"""The progress watcher (issue 15): log lines in, progress events out, folded by the store.

Unit tests drive :class:`ProgressWatch` on a fake clock (slowdowns, stalls, the journal's
rate, the ``\\r`` partial-line handler called directly); real launches run ``stepper.py``
under tuilaunch (a plain ``step N/T`` loop, a tqdm bar, a kill and a resume from a
checkpoint) and check the journal and the printed goodput summary.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from conftest import PY, WORKERS, read_journal, wait_for

from tui_launch.core.diagnosis.records import Answer
from tui_launch.core.diagnosis.stacks.model import Frame, RankRecord, ThreadStack
from tui_launch.core.diagnosis.straggler import (
    StragglerJudge,
    StragglerSampler,
    _lone_outsider,
    in_collective,
    is_stopped,
)
from tui_launch.core.logs.tail import LogSource
from tui_launch.core.model import events as ev
from tui_launch.core.model.progress import goodput
from tui_launch.core.model.store import RunStore, replay
from tui_launch.core.progress.watch import ProgressWatch
from tui_launch.testing.builders import workers_started

STEPPER = str(WORKERS / "stepper.py")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _src(rank: int = 0, stream: str = "stdout", attempt: int = 0) -> LogSource:
    return LogSource(attempt, rank, rank, stream, "", False, None)


def _watch(**kw) -> tuple[ProgressWatch, RunStore, Clock]:
    store = RunStore()
    clock = Clock()
    w = ProgressWatch(store.post, clock=clock, **kw)
    w.on_event(workers_started(0, 2, 5100, at=0.0))
    return w, store, clock


def test_rate_eta_and_journal_every_ten_seconds():
    w, store, clock = _watch()
    for k in range(1, 121):  # 4 steps/s for 30 s, a tick every second
        clock.t += 0.25
        w.on_lines(_src(), [f"step {k}/1000 loss 0.5"])
        if k % 4 == 0:
            w.tick()
    job = store.snapshot().progress.job
    assert job is not None and job.global_rank == 0 and job.step == 120 and job.total == 1000
    assert abs(job.rate - 4.0) < 0.05
    assert abs(job.eta - 880 / 4.0) < 3
    records = [e for e in store.events() if isinstance(e, ev.ProgressRecord)]
    assert len(records) == 3  # at 1 s, 11 s, 21 s (samples in between are not journaled)
    assert store.snapshot().progress.history(0)[-1] == job.rate


def test_slowdown_and_stall_are_flagged_and_journaled():
    w, store, clock = _watch(slow_for=5.0, window=5.0, stall_after=8.0)
    step = 0
    for second in range(60):
        per_s = 10 if second < 20 else 5  # half speed after 20 s
        if second >= 45:
            per_s = 0  # the counter stops
        for _ in range(per_s):
            step += 1
            clock.t += 1.0 / per_s
            w.on_lines(_src(), [f"step {step} loss 1.0"])
        if per_s == 0:
            clock.t += 1.0
        w.tick()
        if second == 19:
            assert store.snapshot().progress.active == ()
        if second == 35:
            p = store.snapshot().progress
            assert p.flagged(0) == "slow" and p.job.slow
    p = store.snapshot().progress
    assert p.flagged(0) == "stalled" and p.job.stalled and p.job.stalled_for >= 8
    kinds = [(e.what, e.active) for e in store.events() if isinstance(e, ev.Slowdown)]
    assert kinds == [("slow", True), ("slow", False), ("stalled", True)]


def test_partial_handler_reads_an_unterminated_tqdm_bar():
    # The tailer will hand unterminated \r text to on_partial (branch w15a); called directly.
    w, _store, clock = _watch()
    bar = ""
    for k in range(0, 41):
        clock.t += 0.1
        bar += f"\rtrain: {k:3d}%|          | {k}/100 [00:0{k // 10}<00:10, 10.00it/s]"
        w.on_partial(_src(stream="stderr"), bar, clock.t)
    w.on_partial(_src(stream="stderr"), "", clock.t)  # completed: nothing to read
    (sample,) = [e for e in w.tick() if isinstance(e, ev.ProgressSample)]
    (r,) = sample.ranks
    assert (r.step, r.total, r.stream, r.fmt) == (40, 100, "stderr", "tqdm")
    assert abs(r.rate - 10.0) < 0.5


def _last_record(journal) -> dict:
    return [e for e in read_journal(journal) if e["kind"] == "progress"][-1]


def test_plain_step_loop_rate_and_eta(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    report = tmp_path / "rate"
    launch = tuilaunch(
        "--nproc-per-node", "2", "--journal", str(journal),
        STEPPER, "--steps", "150", "--interval", "0.1", "--report", str(report),
    )  # fmt: skip
    assert launch.wait(120) == 0, launch.output
    real = float(report.read_text())
    records = [e for e in read_journal(journal) if e["kind"] == "progress"]
    assert len(records) >= 3  # at 1 s, at 11 s, the last
    # mid-run, ten seconds in: the rate over the window so far, and the ETA from it
    mid = records[1]["ranks"][0]
    assert 50 < mid["step"] < 150 and mid["total"] == 150
    assert abs(mid["rate"] - real) / real < 0.15, (mid, real)
    assert abs(mid["eta"] - (150 - mid["step"]) / mid["rate"]) < 0.5
    last = _last_record(journal)
    assert last["steps_reached"] == 150 and last["leader"] == 0
    # over the whole run, our rate (from arrival times) is the loop's within 5 %
    assert abs(last["ranks"][0]["rate"] - real) / real < 0.05, (last, real)
    assert "attempt 0: reached step 150" in launch.stderr


def test_tqdm_loop_rate_close_to_the_loop(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    report = tmp_path / "rate"
    launch = tuilaunch(
        "--nproc-per-node", "1", "--journal", str(journal),
        STEPPER, "--steps", "100", "--interval", "0.05", "--fmt", "tqdm", "--report", str(report),
    )  # fmt: skip
    assert launch.wait(120) == 0, launch.output
    real = float(report.read_text())
    last = _last_record(journal)
    (r,) = last["ranks"]
    assert (r["step"], r["total"], r["fmt"], r["stream"]) == (100, 100, "tqdm", "stderr")
    assert abs(r["rate"] - real) / real < 0.05, (r, real)
    assert r["claimed_rate"] is not None and abs(r["claimed_rate"] - r["rate"]) < 6.0


def test_kill_and_resume_show_as_work_redone(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    ckpt = tmp_path / "ckpt"
    launch = tuilaunch(
        "--nproc-per-node", "2", "--max-restarts", "1", "--journal", str(journal),
        # Killed about mid-way between the checkpoints at 20 and 30, so that some work is
        # usually redone; a slow machine may still stop it at step 21, which the resumed
        # attempt prints first again: 0 redone by the first-printed-step rule, not shown.
        "--inject", "kill:rank=1,after=2.9s,attempt=0",
        STEPPER, "--steps", "60", "--interval", "0.1", "--ckpt", str(ckpt),
        "--save-every", "10",
    )  # fmt: skip
    assert launch.wait(120) == 0, launch.output
    out = launch.stderr
    m = re.search(r"attempt 1: reached step 60, resumed from (\d+)(?:, (\d+) steps redone)?", out)
    assert m, out[-3000:]
    resumed, redone = int(m.group(1)), int(m.group(2) or 0)
    # a log line reports a finished step: the first line after resuming from the checkpoint
    # at step 10k says 10k + 1
    assert (resumed - 1) % 10 == 0 and resumed > 1
    assert 0 <= redone < 10
    assert re.search(r"goodput: making progress \d+% of wall time", out)
    # The same summary from the journal alone.
    snap = replay(ev.from_dict(d) for d in read_journal(journal))
    summary = goodput(snap.progress, snap.attempts, snap.finished.wall)
    assert summary is not None and summary.steps_redone == redone


# ----------------------------------------------------------------- stragglers (inferred)

LOCKSTEP = str(WORKERS / "lockstep.py")


def test_straggler_judge_names_one_rank_only_when_the_others_wait():
    judge = StragglerJudge()
    for k in range(12):  # healthy: every rank waits about half the time
        judge.add({0: k % 2 == 0, 1: k % 2 == 1, 2: k % 3 == 0})
    assert judge.straggler() is None
    judge.reset()
    for _ in range(9):
        judge.add({0: True, 1: False, 2: True})
    assert judge.straggler() is None  # too few samples yet
    judge.add({0: True, 1: None, 2: True})  # an unknown sample counts for nobody
    judge.add({0: True, 1: False, 2: False})
    assert judge.straggler() == 1
    judge.reset()
    for _ in range(12):  # two ranks never wait: no single straggler to name
        judge.add({0: True, 1: False, 2: False})
    assert judge.straggler() is None


def _stragglers(journal) -> list[dict]:
    return [e for e in read_journal(journal) if e["kind"] == "straggler"]


def _lockstep(tuilaunch, tmp_path, *extra: str, worker: tuple[str, ...] = ()) -> tuple:
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "3", "--stack-samples", "0.5",
        "--journal", str(journal), *extra,
        # --waits: each step's work is a sleep: the same stacks to the sampler, no CPU, so
        # py-spy is not starved of it on a loaded machine (as it was with busy ranks)
        LOCKSTEP, "--steps", "250", "--work", "0.01", "--waits", *worker,
    )  # fmt: skip
    assert launch.wait(180) == 0, launch.output
    return launch, journal


def test_straggler_with_more_work_per_step_is_named(tuilaunch, tmp_path):
    # 300 steps of 60 ms (about 18 s): 30 samples or more at 0.5 s
    launch, journal = _lockstep(
        tuilaunch, tmp_path, worker=("--extra-rank", "1", "--extra", "0.05", "--steps", "300")
    )
    named = [e for e in _stragglers(journal) if e["global_rank"] is not None]
    assert named and {e["global_rank"] for e in named} == {1}, _stragglers(journal)
    assert "straggler (inferred from stack samples): rank 1" in launch.stderr


def test_straggler_from_an_injected_slow_rank_is_named(tuilaunch, tmp_path):
    # The slowed rank is stopped 60 % of the time: the sampler reads "stopped" from /proc
    # (not waiting for anyone) instead of the stack it was stopped in, which is inside the
    # all_reduce about as often as the others' are when steps are this short.
    _, journal = _lockstep(
        tuilaunch, tmp_path, "--inject", "slow:rank=1,duty=60,period=1s", worker=("--steps", "600")
    )
    named = [e for e in _stragglers(journal) if e["global_rank"] is not None]
    assert named and {e["global_rank"] for e in named} == {1}, _stragglers(journal)


def test_a_stopped_rank_reads_as_not_waiting_without_pyspy(tmp_path):
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        assert not is_stopped(proc.pid)
        # a running (sleeping) process needs py-spy: none here, so nothing is known
        assert in_collective(proc.pid, str(tmp_path / "no-py-spy")) is None
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: is_stopped(proc.pid), 10, what="the process to be stopped")
        assert in_collective(proc.pid, str(tmp_path / "no-py-spy")) is False
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: not is_stopped(proc.pid), 10, what="the process to run again")
    finally:
        proc.kill()
        proc.wait()


def test_sampler_backs_off_on_a_balanced_run_and_comes_back():
    judge = StragglerJudge(min_samples=3)
    sampler = StragglerSampler(lambda e: None, lambda r: None, interval=1.0, judge=judge)
    for _ in range(3):
        judge.add({0: True, 1: True, 2: True})
    assert judge.balanced()
    for _ in range(3):
        judge.add({0: True, 1: False, 2: True})
    assert not judge.balanced()  # rank 1 drifts away: sample at the full rate again
    judge.reset()
    # one rank out while all the others wait: a straggler's sample, whatever the shares say
    assert _lone_outsider({0: True, 1: False, 2: True})
    assert not _lone_outsider({0: True, 1: False})  # two ranks: one out is half of all samples
    assert not _lone_outsider({0: True, 1: False, 2: False})
    assert not _lone_outsider({0: True, 1: False, 2: None})
    if sampler.pyspy is None:
        pytest.skip("py-spy is not installed")
    idle = "import time; print('up', flush=True); time.sleep(60)"
    procs = [subprocess.Popen([PY, "-c", idle], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for p in procs:  # py-spy can read them once the interpreter runs the script
            assert p.stdout is not None and p.stdout.readline() == b"up\n"
        sampler.set_workers(0, [(r, p.pid) for r, p in enumerate(procs)])
        # two idle ranks, never in a collective: balanced once min_samples are in
        delays = [sampler.tick() for _ in range(7)]
        assert delays[:2] == [1.0, 1.0]
        assert delays[2:] == [2.0, 4.0, 8.0, 8.0, 8.0], delays
        sampler.set_workers(1, [(r, p.pid) for r, p in enumerate(procs)])
        assert sampler.tick() == 1.0  # a new attempt starts over
    finally:
        for p in procs:
            p.kill()
            p.communicate()


def test_no_straggler_claimed_on_a_healthy_run(tuilaunch, tmp_path):
    launch, journal = _lockstep(tuilaunch, tmp_path)
    assert [e for e in _stragglers(journal) if e["global_rank"] is not None] == []
    assert "inferred from stack samples" not in launch.stderr


def test_straggler_samples_read_the_live_polls_stacks_before_pyspy(tmp_path):
    # The live poll (on by default) holds every rank's stacks, at most 2 s old: a sample reads
    # a rank's main thread there once per answer, and starts py-spy (none here: unknown) only
    # for a rank the poll has no new answer of. Idle ranks at 8 cost 1.7 % of a core in py-spy.
    waiting = (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 3252),)
    working = (Frame("forward", "train.py", 12),)

    def answer(rank: int, frames: tuple[Frame, ...]) -> Answer:
        stack = ThreadStack(1, "MainThread", frames, main=True)
        return Answer(RankRecord(rank), (stack,), {"threads": []}, 0.0)

    latest: dict[int, tuple[float, Answer]] = {}
    sampler = StragglerSampler(
        lambda e: None, lambda r: None, interval=1.0, pyspy=str(tmp_path / "no-py-spy"),
        judge=StragglerJudge(min_samples=1), recent=lambda: latest,
    )  # fmt: skip
    procs = [subprocess.Popen([PY, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        sampler.set_workers(0, [(r, p.pid) for r, p in enumerate(procs)])
        now = time.monotonic()
        latest.update({0: (now, answer(0, waiting)), 1: (now, answer(1, working))})
        latest[2] = (now - 10.0, answer(2, waiting))  # too old to say where rank 2 is now
        sampler.tick()
        assert sampler.judge.shares() == {0: 1.0, 1: 0.0}  # rank 2: py-spy, none: unknown
        assert (sampler.from_polls, sampler.from_pyspy) == (2, 1)
        sampler.tick()  # the same answers again: each was one sample already
        assert (sampler.from_polls, sampler.from_pyspy) == (2, 4)
        os.kill(procs[0].pid, signal.SIGSTOP)  # a stopped rank waits for nobody
        wait_for(lambda: is_stopped(procs[0].pid), 10, what="rank 0 to be stopped")
        now = time.monotonic()
        latest.update({g: (now, answer(g, waiting)) for g in range(3)})
        sampler.tick()
        assert sampler.judge.shares() == {0: 0.5, 1: 0.5, 2: 1.0}
        assert (sampler.from_polls, sampler.from_pyspy) == (5, 4)
    finally:
        for p in procs:
            p.kill()
            p.wait()
