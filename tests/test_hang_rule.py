"""The adaptive hang rule (issue 35): the rhythm's limit, partial hangs, the back-off, I/O.

Pure parts driven with plain numbers: :class:`~tui_launch.core.diagnosis.rhythm.Rhythm` (how
long a job may stand still), :class:`~tui_launch.core.diagnosis.stacks.hang.HangDetector` in
its adaptive mode, and :func:`~tui_launch.core.diagnosis.stacks.hang.confirm` with the main
threads' I/O. The real launches are in ``tests/test_hang_auto.py``.
"""

from __future__ import annotations

import pytest

from tui_launch.core.diagnosis import rhythm
from tui_launch.core.diagnosis.rhythm import COLLECTIVES, OUTPUT, STEPS, Rhythm, percentile
from tui_launch.core.diagnosis.stacks.hang import (
    CONFIRM,
    DUMP,
    HUNG,
    IO_MOVED,
    NOTHING,
    WATCHING,
    HangDetector,
    confirm,
)
from tui_launch.core.diagnosis.stacks.model import (
    Frame,
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
)


def _steps(r: Rhythm, rank: int, times: list[float]) -> bool:
    return r.steps(rank, tuple(times[-64:]), times[-1] if times else None)


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 0.9) == 0.0
    assert percentile([3.0], 0.9) == 3.0
    assert percentile([float(i) for i in range(1, 11)], 0.9) == 9.0
    assert percentile([float(i) for i in range(1, 101)], 0.9) == 90.0


def test_before_a_rhythm_the_rule_is_output_silence_with_a_minute_floor() -> None:
    r = Rhythm()
    r.start(100.0)
    e = r.expect(130.0)
    assert e.basis == OUTPUT and e.limit == rhythm.QUIET_FLOOR and e.still_for == 30.0
    assert not e.overdue and r.expect(100.0 + rhythm.QUIET_FLOOR).overdue
    assert rhythm.QUIET_FLOOR > 60  # a job printing once a minute: not before its first line
    # A first step and two more are not a rhythm yet (the first step's time never counts).
    r.output(150.0)
    assert not _steps(r, 0, [])
    assert _steps(r, 0, [150.0, 151.0, 152.0])
    assert not r.by_steps and r.expect(160.0).basis == OUTPUT


def test_without_step_lines_the_collectives_are_the_rhythm() -> None:
    """A job that prints no step lines (the DDP tutorial's one line an epoch) is judged by the
    collective sequence numbers the live poll reads every 2 s: moving at every poll is below
    the poll's resolution, so the floor; output (a heartbeat thread) is then no movement."""
    r = Rhythm()
    r.start(0.0)
    moves: dict[int, float] = {}
    moved: list[int] = []
    for t in (2.0, 4.0, 6.0, 8.0):  # every rank's number moved at each poll
        moves = {g: t for g in range(4)}
        moved = r.collectives(moves, waiting=False)
    assert moved == [0, 1, 2, 3] and r.by_collectives and not r.by_steps
    e = r.expect(10.0)
    assert e.basis == COLLECTIVES and e.limit == rhythm.FLOOR and e.typical == 2.0
    assert e.still_for == 2.0 and not e.overdue
    assert r.expect(8.0 + rhythm.FLOOR).overdue
    assert e.said(9.0) == "no collective for 9.0 s; one came every 2.0 s"
    # The same numbers again: nobody moved.
    assert r.collectives(moves, waiting=True) == []
    # Moves every other poll (2-4 s apart): the p90 less the poll, times the multiple.
    slow = Rhythm()
    slow.start(0.0)
    for t in (4.0, 8.0, 12.0, 16.0):
        slow.collectives({0: t}, waiting=False)
    assert slow.expect(17.0).limit == rhythm.MULTIPLE * (4.0 - rhythm.COLLECTIVE_RESOLUTION)
    # Steps, once they have a rhythm, take over from the collectives.
    assert _steps(r, 0, [1.0, 2.0, 3.0, 4.0]) and r.expect(5.0).basis == STEPS


def test_ranks_waiting_in_a_collective_before_a_rhythm_wait_ten_seconds() -> None:
    """A hang in the first seconds (step 6 of a Trainer): no rhythm yet, but ranks wait in a
    collective that some rank has not finished: suspected after WAIT_FLOOR of no number
    moving, not the output's 90 s."""
    r = Rhythm()
    r.start(0.0)
    r.collectives({0: 3.0, 1: 3.0}, waiting=False)
    assert not r.by_collectives and r.expect(20.0).basis == OUTPUT  # nobody waits: output
    r.collectives({0: 5.0, 1: 3.0}, waiting=True)
    e = r.expect(12.0)
    assert r.by_collectives and e.basis == COLLECTIVES and e.limit == rhythm.WAIT_FLOOR
    assert e.still_for == 7.0 and not e.overdue and r.expect(15.0).overdue
    assert e.said() == "no collective for 7.0 s; ranks wait in one"
    assert "the collective ranks wait in" in e.expected()
    # Output is no movement while the collectives are the measure, and a new attempt forgets.
    r.output(14.0)
    assert r.expect(15.0).basis == COLLECTIVES
    r.start(20.0)
    assert not r.by_collectives and r.expect(21.0).basis == OUTPUT


def test_steps_make_the_limit_a_multiple_of_their_p90_with_a_floor() -> None:
    r = Rhythm()
    r.start(0.0)
    moves = [10.0 + 0.8 * i for i in range(20)]  # 0.8 s steps after a 10 s first step
    assert _steps(r, 0, moves)
    assert r.by_steps
    last = moves[-1]
    e = r.expect(last + 2.0)
    # 5 x 0.8 s is under the floor: sub-second steps are judged against the floor.
    assert e.basis == STEPS and e.limit == rhythm.FLOOR and e.typical == pytest.approx(0.8)
    assert e.still_for == pytest.approx(2.0) and not e.overdue
    assert not r.expect(last + 5.9).overdue and r.expect(last + 6.0).overdue
    assert r.expect(last + 41.0).said() == "no step for 41 s; steps took 0.8 s"
    assert "a step every 0.8 s" in e.expected() and "after 6.0 s" in e.expected()
    # Slower steps: the multiple of their p90 rules.
    slow = Rhythm()
    slow.start(0.0)
    _steps(slow, 0, [4.0 * i for i in range(1, 12)])
    assert slow.expect(44.0).limit == pytest.approx(5 * 4.0)


def test_output_is_not_movement_once_steps_are_followed() -> None:
    """A partial hang: a thread keeps printing while the steps stop."""
    r = Rhythm()
    r.start(0.0)
    moves = [1.0 + 0.5 * i for i in range(10)]
    _steps(r, 0, moves)
    for k in range(40):
        r.output(moves[-1] + 0.25 * k)  # a heartbeat every 0.25 s
    e = r.expect(moves[-1] + 10.0)
    assert e.basis == STEPS and e.overdue and e.still_for == pytest.approx(10.0)
    # The same moves read again are not an advance; a new one is.
    assert not _steps(r, 0, moves)
    assert _steps(r, 0, [*moves, moves[-1] + 10.5])
    assert not r.expect(moves[-1] + 11.0).overdue


def test_an_eval_bar_that_moves_is_movement() -> None:
    r = Rhythm()
    r.start(0.0)
    moves = [1.0 + 0.5 * i for i in range(10)]
    r.steps(0, tuple(moves), moves[-1])
    # The training counter stands still for 30 s, but the eval bar moved at +28 s.
    assert not r.steps(0, tuple(moves), moves[-1]) and r.steps(0, tuple(moves), moves[-1] + 28)
    e = r.expect(moves[-1] + 30.0)
    assert e.still_for == pytest.approx(2.0) and not e.overdue


def test_every_rank_with_a_rhythm_must_be_overdue() -> None:
    """Rank 0 prints every 10 steps, rank 1 every step: the job stands still only when both
    have been still for their own limits."""
    r = Rhythm()
    r.start(0.0)
    _steps(r, 0, [10.0 * i for i in range(1, 8)])  # every 10 s: limit 50 s
    _steps(r, 1, [1.0 * i for i in range(1, 71)])  # every second: limit 6 s
    e = r.expect(76.0)  # rank 1 still for 6 s (overdue), rank 0 for 6 s of 50
    assert not e.overdue and e.rank == 0
    e = r.expect(121.0)
    assert e.overdue and e.still_for == pytest.approx(51.0)


def test_a_pause_the_job_recovered_from_is_not_suspected_again() -> None:
    """A checkpoint save of 120 s every few minutes: the first is suspected (the stacks clear
    it), the next ones are within 1.5 x the longest pause of the last half hour."""
    r = Rhythm()
    r.start(0.0)
    moves = [0.8 * i for i in range(1, 200)]
    _steps(r, 0, moves)
    after = moves[-1] + 120.0
    for k in range(100):  # read every step, as the watch does every half second
        moves.append(after + 0.8 * k)
        _steps(r, 0, moves)
    e = r.expect(moves[-1] + 120.0)
    assert e.limit == pytest.approx(180.0, abs=1.0) and not e.overdue
    # Forgotten after half an hour of steady steps.
    for _ in range(2400):
        moves.append(moves[-1] + 0.8)
        _steps(r, 0, moves)
    assert r.expect(moves[-1] + 1.0).limit == rhythm.FLOOR


def test_a_slow_second_step_is_warm_up_not_a_pause() -> None:
    """The step after the first recompiles (20 s): it leaves the percentile after ten steps and
    is never remembered as a pause."""
    r = Rhythm()
    r.start(0.0)
    moves = [30.0, 50.0]
    moves += [50.0 + 0.8 * i for i in range(1, 12)]
    _steps(r, 0, moves)
    assert r.expect(moves[-1]).limit == rhythm.FLOOR


def test_a_job_that_prints_every_minute_is_not_suspected_every_minute() -> None:
    r = Rhythm()
    r.start(0.0)
    for k in range(1, 6):
        r.output(60.0 * k)
    e = r.expect(300.0 + 59.0)
    assert e.basis == OUTPUT and e.limit >= 1.5 * 60 and not e.overdue
    assert e.limit == 5 * 60.0 and r.expect(300.0 + 300.0).overdue


def test_adaptive_detector_backs_off_after_a_cleared_suspicion() -> None:
    d = HangDetector(0, 3.0, adaptive=True)
    assert d.enabled
    d.start(0.0, [0])
    assert d.poll(4.0, still_for=4.0, limit=5.0) == NOTHING
    assert d.poll(5.0, still_for=5.0, limit=5.0) == DUMP
    d.first(_dump({0: "a"}), 5.2)
    assert d.poll(8.3, still_for=8.3, limit=5.0) == CONFIRM
    result = d.second(_dump({0: "b"}), 8.4)
    assert not result.hung and d.state == WATCHING
    # Not again before the stillness has doubled (5 + 3.4 s -> 16.8 s).
    assert d.backoff == pytest.approx(16.8)
    assert d.poll(10.0, still_for=10.0, limit=5.0) == NOTHING
    assert d.poll(17.0, still_for=17.0, limit=5.0) == DUMP
    # A step ends the back-off.
    d.output(0, 17.5)
    assert d.backoff == 0.0 and d.poll(22.5, still_for=5.0, limit=5.0) == DUMP


def test_adaptive_detector_confirms_a_still_job() -> None:
    d = HangDetector(0, 3.0, adaptive=True)
    d.start(0.0, [0, 1])
    assert d.poll(5.0, still_for=5.0, limit=5.0) == DUMP
    d.first(_dump({0: "wait", 1: "stuck"}), 5.1)
    assert d.poll(8.2, still_for=8.2, limit=5.0) == CONFIRM
    assert d.second(_dump({0: "wait", 1: "stuck"}), 8.3).hung and d.state == HUNG


def test_fixed_detector_keeps_its_meaning() -> None:
    """--hang-timeout N: output silence against N, whatever the caller says of steps."""
    d = HangDetector(10.0, 4.0)
    d.start(0.0, [0])
    assert d.poll(6.0, still_for=6.0, limit=5.0) == NOTHING
    assert d.poll(10.0) == DUMP


def test_main_thread_io_is_movement() -> None:
    """A checkpoint save sits in one line (torch.save's loop) while it writes: not hung."""
    first, second = _dump({0: "save", 1: "barrier"}), _dump({0: "save", 1: "barrier"})
    assert confirm(first, second).hung
    assert confirm(first, second, {0: IO_MOVED - 1, 1: 0}).hung
    busy = confirm(first, second, {0: 50 * IO_MOVED, 1: 0})
    assert not busy.hung and busy.moved == (0,)
    assert "the main threads of ranks 0 did 819 kB of I/O" in busy.text


def _dump(places: dict[int, str]) -> StackDump:
    ranks = tuple(
        RankStack(
            local_rank=g,
            global_rank=g,
            process=ProcessStack(
                pid=1000 + g,
                state="S",
                method="py-spy",
                threads=(ThreadStack(1000 + g, "MainThread", (Frame(fn, "x.py", 1),), main=True),),
            ),
        )
        for g, fn in places.items()
    )
    return StackDump(reason="test", wall=0.0, duration=0.1, ranks=ranks)


def test_the_dashboard_says_what_the_rule_expects() -> None:
    """The header once the job has stood still for half its limit; the Stacks tab always."""
    from tui_launch.core.model.events import HangWatchSample
    from tui_launch.core.model.store import replay
    from tui_launch.tui.panels.render import header
    from tui_launch.tui.panels.stacks import stacks_panel

    expected = "a step every 0.8 s: suspected after 5.0 s without"
    calm = replay([HangWatchSample(0, "steps", 5.0, 1.0, 0.8, expected)])
    assert "no step" not in header(calm, 0.0).plain
    assert stacks_panel(calm, None, 0.0).plain.startswith(f"hang rule: {expected}; no step for")
    still = replay([HangWatchSample(0, "steps", 5.0, 3.2, 0.8, expected)])
    assert "no step 3s/5s" in header(still, 0.0).plain
    hung = replay([HangWatchSample(0, "steps", 5.0, 9.0, 0.8, expected, "hung")])
    assert "(hung)" in stacks_panel(hung, None, 0.0).plain


def test_main_thread_cpu_outside_a_collective_is_movement() -> None:
    """An evaluation in one Python line shows the same stack twice while it computes; a rank
    that spins in a collective (NCCL's waits do) has not moved."""
    from tui_launch.core.diagnosis.stacks.hang import CPU_MOVED

    first, second = _dump({0: "evaluate"}), _dump({0: "evaluate"})
    assert confirm(first, second, cpu={0: CPU_MOVED / 10}).hung
    busy = confirm(first, second, cpu={0: 1.0})
    assert not busy.hung and "the main threads of ranks 0 computed 1.0 s" in busy.text
    waiting = RankStack(
        local_rank=1,
        global_rank=1,
        process=ProcessStack(
            pid=1001,
            state="R",
            method="py-spy",
            threads=(
                ThreadStack(
                    1001,
                    "MainThread",
                    (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 3252),),
                    main=True,
                ),
            ),
        ),
    )
    spin = StackDump(reason="t", wall=0.0, duration=0.1, ranks=(waiting,))
    assert confirm(spin, spin, cpu={1: 3.0}).hung


def test_partial_output_is_movement_but_not_a_piece_of_our_own_faulthandler_dump(tmp_path) -> None:
    # The hang watch hears of unended output (a \r progress bar) from the tailer's partial
    # sink; with --dump-via-faulthandler, the dump it asked for is written to the rank's stderr
    # a few bytes per write(2), and a piece read mid-dump ("  Fi") must not clear the suspicion.
    import time

    from tui_launch.core.diagnosis.dumps import Dumper
    from tui_launch.core.diagnosis.hangwatch import HangWatch
    from tui_launch.core.logs.tail import STDERR, STDOUT, LogSource
    from tui_launch.core.workers.table import RankTable

    dumper = Dumper(lambda e: None, RankTable(), lambda: str(tmp_path), dict, via_faulthandler=True)
    watch = HangWatch(lambda e: None, dumper, lambda: True, timeout=60.0)
    watch.attempt_started(0, {0: 0, 1: 1})
    err = LogSource(0, 1, 1, STDERR, str(tmp_path / "err"), False, None)
    out = LogSource(0, 1, 1, STDOUT, str(tmp_path / "out"), False, None)
    t0 = time.monotonic()
    for piece in (
        "  Fi",
        '  File "/x/train.py", line 3',
        "Thread 0x7f",
        "Curr",
        "Current thread 0x1",
    ):
        watch.partial_sink(err, piece, t0 + 5)
    assert watch.detector.silence(t0 + 6) >= 6 - 0.5  # none of them counted
    watch.partial_sink(err, "epoch 1:  40%|####", t0 + 5)
    assert watch.detector.silence(t0 + 6) == pytest.approx(1.0)
    watch.partial_sink(out, "  loss 0.5", t0 + 7)  # stdout: faulthandler writes to stderr only
    assert watch.detector.silence(t0 + 8) == pytest.approx(1.0)
    watch.partial_sink(out, "", t0 + 9)  # "" is a newline ending it: the line sink's
    assert watch.detector.silence(t0 + 10) == pytest.approx(3.0)
