"""``tuilaunch replay``: a real run's journal, replayed at a cursor, panels, logs and keys."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import PY, WARM, WORKERS, base_env, journal_path, rich_text, wait_for

from tui_launch.apps.attach import resolve_attach
from tui_launch.apps.replay import journal_of
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.journal.writer import read_journal
from tui_launch.core.model.events import LogMark, WorkersStarted
from tui_launch.core.model.store import replay
from tui_launch.tui.app import Dashboard
from tui_launch.tui.modes import AttachMode, ReplayMode
from tui_launch.tui.panels import render
from tui_launch.tui.sources.attach import AttachSource
from tui_launch.tui.sources.replay import ReplaySource


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The journal of a real headless run: rank 1 killed in attempt 0, one restart, success."""
    logs = tmp_path_factory.mktemp("replay-run")
    cmd = [PY, "-m", "tui_launch", "--no-tui", *WARM, "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "1", "--log-dir", str(logs)]
    cmd += ["--inject", "kill:rank=1,after=1.5s,attempt=0", str(WORKERS / "ticker.py")]
    cmd += ["--ticks", "30"]
    index = tmp_path_factory.mktemp("replay-index")  # the run registers here, not in $HOME
    index.chmod(0o700)
    env = base_env(XDG_RUNTIME_DIR=str(index))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return journal_path(done.stdout + done.stderr)


def _cursors(tl: Timeline) -> dict[str, int]:
    return {
        "failed": tl.kinds.index("attempt_failed") + 1,
        "restarted": tl.kinds.index("restart") + 1,
        "end": len(tl),
    }


def test_snapshots_at_three_cursors_match_the_journal_prefix(recorded: Path) -> None:
    events = read_journal(str(recorded))
    tl = Timeline(str(recorded), every=7)  # small checkpoints: every path is exercised
    assert len(tl) == len(events)
    for name, n in _cursors(tl).items():
        expected = replay(events[:n])
        got = tl.snapshot(n)
        assert got == expected, name
        now = tl.mono[n - 1]
        for panel in (render.header, render.restarts_panel, render.rendezvous_panel):
            shown = rich_text(panel(got, now))
            assert shown == rich_text(panel(expected, now)), (name, panel.__name__)
    snap = tl.snapshot(_cursors(tl)["failed"])
    assert snap.root_cause is not None and snap.root_cause.global_rank == 1
    assert len(tl.snapshot(_cursors(tl)["restarted"]).attempts) == 1
    assert tl.snapshot(len(tl)).finished is not None


def test_log_marks_are_journaled_about_once_a_second(recorded: Path) -> None:
    marks = [e for e in read_journal(str(recorded)) if isinstance(e, LogMark)]
    assert marks, "no log_mark in the journal"
    keys = {(a, r, s) for m in marks for a, r, s, _ in m.offsets}
    assert {(0, 0, "stdout"), (0, 1, "stdout"), (1, 0, "stdout"), (1, 1, "stdout")} <= keys
    # At most one a second, but for the forced ones when an attempt's files close (2).
    gaps = [b.mono - a.mono for a, b in itertools.pairwise(marks)]
    assert sum(g < 0.9 for g in gaps) <= 2


def test_logs_are_cut_at_the_cursor(recorded: Path) -> None:
    tl = Timeline(str(recorded))
    n = _cursors(tl)["failed"]
    src = ReplaySource(tl, cursor=n)
    cut = tl.log_offsets(n)
    run_dir = recorded.parent
    for rank in (0, 1):
        path = run_dir / "attempt_0" / str(rank) / "stdout.log"
        whole = path.read_bytes()[: cut[(0, rank, "stdout")]].decode().splitlines()
        assert src.logs.lines(rank, "stdout")[-len(whole) :] == whole
        assert whole, f"rank {rank} wrote nothing before the failure"
    # Attempt 1 has not begun at this cursor: none of its lines are shown.
    assert all(not s.startswith("---- attempt 1") for s in src.logs.lines(0))
    src.move(len(tl))  # forward: the rest is appended
    assert any(s.startswith("---- attempt 1") for s in src.logs.lines(0))
    assert src.logs.lines(0, "stdout")[-1].startswith("max gap")
    src.move(n)  # back: rebuilt up to the cut
    assert src.rebuilt == 1
    assert all(not s.startswith("---- attempt 1") for s in src.logs.lines(0))


def test_a_journal_cut_mid_line_replays_to_its_last_whole_event(
    recorded: Path, tmp_path: Path
) -> None:
    data = recorded.read_bytes()
    lines = data.splitlines(keepends=True)
    cut = tmp_path / "journal.jsonl"
    cut.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    tl = Timeline(str(cut))
    events = read_journal(str(recorded))
    assert len(tl) == len(events) - 1
    assert tl.snapshot(len(tl)) == replay(events[:-1])
    with cut.open("ab") as fp:  # the writer finishes the line: refresh() picks it up
        fp.write(lines[-1][len(lines[-1]) // 2 :])
    assert tl.refresh() == len(events)


@pytest.mark.slow
def test_replay_bad_input(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for args in ([], [str(tmp_path / "nowhere")], [str(empty)], ["x", "y"], ["--refresh-hz"]):
        done = subprocess.run(
            [PY, "-m", "tui_launch", "replay", *args],
            env=base_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, args
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, args
        assert done.stderr.startswith("tuilaunch replay: error:"), args


def test_replay_keys(recorded: Path) -> None:
    tl = Timeline(str(recorded))
    src = ReplaySource(tl)
    app = Dashboard(src, refresh_hz=20, mode=ReplayMode(src))
    asyncio.run(_drive_keys(app, src, tl))
    assert app.return_code == 0


async def _drive_keys(app: Dashboard, src: ReplaySource, tl: Timeline) -> None:
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        assert src.cursor == len(tl)
        for action in ("kill", "term", "stop_continue", "restart", "inject"):
            assert not app.check_action(action, ()), action
        assert app.check_action("replay_play", ())
        await pilot.press("g")
        assert src.cursor == 0
        await pilot.press("full_stop", "full_stop")
        assert src.cursor == 2
        await pilot.press("comma")
        assert src.cursor == 1
        await pilot.press("right_square_bracket")
        assert tl.kinds[src.cursor - 1] in ("injection", "attempt_failed", "restart")
        first = src.cursor
        await pilot.press("right_square_bracket")
        assert src.cursor > first
        await pilot.press("left_square_bracket")
        assert src.cursor == first
        assert src.snapshot() == tl.snapshot(first)
        await pilot.press("plus", "plus")
        assert src.speed == 5.0
        await pilot.press("minus")
        assert src.speed == 2.0
        await pilot.press("space")
        # Playing moves at least one event a tick (20 Hz): on a loaded machine the press can
        # take longer than the ~20 ticks left to the end, where playing stops by itself.
        assert src.playing or src.cursor == len(tl)
        await wait_until_moved(pilot, src, first)
        await pilot.press("G")
        assert src.cursor == len(tl)
        bar = str(app.query_one("#replaybar").render())
        assert f"event {len(tl)}/{len(tl)}" in bar and "run_finished" in bar
        await pilot.press("q")
        await pilot.pause()


async def wait_until_moved(pilot, src: ReplaySource, start: int) -> None:
    """Let the app run until playing moved the cursor (polled, with a deadline)."""
    deadline = time.monotonic() + 10
    while src.cursor == start and time.monotonic() < deadline:
        await pilot.pause(0.05)
    assert src.cursor > start


def test_a_run_directory_names_its_journal(recorded: Path, tmp_path: Path) -> None:
    assert journal_of(str(recorded.parent)) == str(recorded)
    assert journal_of(str(recorded)) == str(recorded)
    with pytest.raises(ValueError, match="no journal"):
        journal_of(str(tmp_path))


def test_attach_follows_a_running_job_read_only(tmp_path: Path, tuilaunch) -> None:
    index = tmp_path / "index"
    index.mkdir(mode=0o700)
    env = base_env(XDG_RUNTIME_DIR=str(index))
    none = subprocess.run(
        [PY, "-m", "tui_launch", "attach"], env=env, capture_output=True, text=True, timeout=60
    )
    assert none.returncode == 2 and none.stderr.count("\n") == 1 and "no live run" in none.stderr
    job = tuilaunch(
        "--standalone", "--nproc-per-node", "2", str(WORKERS / "ticker.py"), "--ticks", "600",
        env=env,
    )  # fmt: skip
    os.environ["XDG_RUNTIME_DIR"] = str(index)
    try:

        def journal() -> str | None:
            with contextlib.suppress(ValueError):
                path = resolve_attach(None)
                if '"workers_started"' in Path(path).read_text():
                    return path
            return None

        path = wait_for(journal, 60, what="the job's journal, with its workers")
        assert resolve_attach(str(job.pid)) == path
    finally:
        del os.environ["XDG_RUNTIME_DIR"]
    started = next(e for e in read_journal(path) if isinstance(e, WorkersStarted))
    src = AttachSource(Timeline(path))
    app = Dashboard(src, refresh_hz=10, mode=AttachMode(src))
    asyncio.run(_drive_attach(app, src, {w.local_rank: w.pid for w in started.workers}, job))
    job.wait()


async def _drive_attach(app: Dashboard, src: AttachSource, pids: dict, job) -> None:
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        shown = {r.local_rank: r.pid for r in src.snapshot().ranks}
        assert shown == pids
        for action in ("kill", "term", "stop_continue", "restart", "inject"):
            assert not app.check_action(action, ()), action
        await pilot.press("comma")
        assert not src.following
        await pilot.press("G")
        assert src.following
        job.proc.send_signal(signal.SIGTERM)  # the job ends: the attached view sees it
        deadline = time.monotonic() + 60
        while src.snapshot().finished is None and time.monotonic() < deadline:
            await pilot.pause(0.1)
        assert src.snapshot().finished is not None
        # SIGTERM to the launcher is a preemption (docs/restart-policy.md)
        assert src.snapshot().finished.outcome == "preempted"
        await pilot.press("q")


def test_a_jump_past_the_precompute_waits_for_it(recorded: Path) -> None:
    """While the background thread has not reached a place, a jump there leaves the screen
    answering (the bar says how far it got) and lands once the checkpoints exist."""
    tl = Timeline(str(recorded), every=2)
    tl.CUT_EVERY = 4
    gate = threading.Event()

    def background() -> None:
        gate.wait(60)
        tl.precompute()

    worker = threading.Thread(target=background, daemon=True)
    src = ReplaySource(tl, cursor=0)
    app = Dashboard(src, refresh_hz=20, mode=ReplayMode(src, worker))
    asyncio.run(_drive_pending(app, src, tl, worker, gate))


async def _drive_pending(
    app: Dashboard,
    src: ReplaySource,
    tl: Timeline,
    worker: threading.Thread,
    gate: threading.Event,
) -> None:
    async with app.run_test(size=(160, 45)) as pilot:
        worker.start()
        await pilot.pause()
        await pilot.press("G")
        assert src.cursor == 0 and src.pending is not None and not tl.ready(len(tl))
        await pilot.pause()
        assert "going to the end: computed up to event" in str(app.query_one("#replaybar").render())
        gate.set()
        deadline = time.monotonic() + 30
        while src.cursor != len(tl) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert src.cursor == len(tl) and src.pending is None
        assert src.snapshot() == replay(read_journal(tl.path))
        await pilot.press("q")


@pytest.mark.slow
def test_attach_and_replay_load_only_what_the_first_frame_needs() -> None:
    """The attach path imports no torch and none of the modules that only a dump or the
    inject menu needs; the subcommand leaves the GC on (main() turned it off for the imports:
    an attach may stay open for hours)."""
    code = (
        "import gc, sys; from tui_launch import cli; gc.disable(); "
        "print(cli.run_subcommand(['attach', '--bogus'])); "
        "import tui_launch.tui.sources.control; "
        "heavy = ('torch', 'tui_launch.core.diagnosis.stacks', 'tui_launch.core.job.jobstacks', "
        "'tui_launch.core.run.inject', 'tui_launch.core.run.runner'); "
        "print([m for m in heavy if m in sys.modules]); print(gc.isenabled())"
    )
    out = subprocess.run(
        [PY, "-c", code], env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["2", "[]", "True"], out.stdout


def test_attach_refreshes_as_soon_as_the_journal_grows(recorded: Path, tmp_path: Path) -> None:
    """The attached dashboard's journal watch (a look at its size every 50 ms) refreshes as
    soon as a line is appended, without waiting for the next refresh (0.5 Hz here)."""
    lines = recorded.read_bytes().splitlines(keepends=True)
    growing = tmp_path / "journal.jsonl"
    growing.write_bytes(b"".join(lines[:-1]))
    src = AttachSource(Timeline(str(growing)))
    mode = AttachMode(src)
    app = Dashboard(src, refresh_hz=0.5, mode=mode)

    async def drive() -> None:
        async with app.run_test(size=(160, 45)):
            assert src.cursor == len(lines) - 1
            mode.watch_journal()  # nothing new: no refresh
            assert src.cursor == len(lines) - 1
            with growing.open("ab") as fp:
                fp.write(lines[-1])
            mode.watch_journal()
            assert src.cursor == len(lines) and src.snapshot().finished is not None

    asyncio.run(drive())


def test_the_merged_log_interleaves_ranks_in_the_order_they_wrote(recorded: Path) -> None:
    """The merged view (all ranks) orders lines by the log marks (about once a second), not
    rank by rank; each rank's own lines keep their order. Checked against the marks of the
    real journal and the rank log files."""
    tl = Timeline(str(recorded))
    src = ReplaySource(tl)  # opens on the end: every line of both attempts, one read each
    run_dir = recorded.parent
    # For each stream, the file's lines (by attempt) and the index of the first mark that
    # covers each of them (the mark whose offset reaches the line's end).
    marks = [
        (i, {(a, r, st): off for a, r, st, off in e.offsets})
        for i, e in enumerate(read_journal(str(recorded)))
        if isinstance(e, LogMark)
    ]
    per_stream: dict[tuple[int, str], list[tuple[str, int]]] = {}
    for attempt in (0, 1):
        for rank in (0, 1):
            for stream in ("stdout", "stderr"):
                path = run_dir / f"attempt_{attempt}" / str(rank) / f"{stream}.log"
                if not path.exists():
                    continue
                covered = [
                    (i, o[(attempt, rank, stream)])
                    for i, o in marks
                    if (attempt, rank, stream) in o
                ]
                end = 0
                for line in path.read_bytes().splitlines(keepends=True):
                    end += len(line)
                    at = next((i for i, off in covered if off >= end), len(tl))
                    per_stream.setdefault((rank, stream), []).append(
                        (line.decode().rstrip("\n"), at)
                    )
    merged = [(lr, s, t) for _, lr, s, t in src.logs.since(0) if s != "marker"]
    assert len(merged) == sum(map(len, per_stream.values()))
    seen: dict[tuple[int, str], int] = {}
    order = []
    for lr, s, text in merged:
        k = seen.get((lr, s), 0)
        seen[(lr, s)] = k + 1
        want, at = per_stream[(lr, s)][k]
        assert text == want  # each rank's own order is kept
        order.append(at)
    assert order == sorted(order), "a line shown before one written a mark earlier"
    ranks = [lr for lr, _, _ in merged]
    switches = sum(a != b for a, b in itertools.pairwise(ranks))
    assert switches > 3, f"rank blocks, not interleaved: {switches} switches"


@pytest.fixture(scope="module")
def stepping(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real headless run whose rank prints ``step N/T`` lines for ~8 s."""
    logs = tmp_path_factory.mktemp("replay-steps")
    cmd = [PY, "-m", "tui_launch", "--no-tui", *WARM, "--standalone", "--nproc-per-node", "1"]
    cmd += ["--log-dir", str(logs), str(WORKERS / "stepper.py"), "--steps", "32"]
    cmd += ["--interval", "0.25"]
    index = tmp_path_factory.mktemp("replay-steps-index")
    index.chmod(0o700)
    env = base_env(XDG_RUNTIME_DIR=str(index))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return journal_path(done.stdout + done.stderr)


def test_the_header_step_is_the_one_the_log_shows_at_the_cursor(stepping: Path) -> None:
    """At every cursor of a replay, the header's step is the last step the log shows there.
    The journal's progress records are 10 s apart: the step used to lag the log by up to
    that, and an attempt's first 10 s showed none."""
    import re

    from tui_launch.tui.panels.progress import header_progress

    tl = Timeline(str(stepping))
    src = ReplaySource(tl, cursor=0)
    checked = 0
    for n in range(1, len(tl) + 1):
        src.move(n)
        snap = src.snapshot()
        if snap.finished is not None:
            break
        steps = [m for m in (re.match(r"step (\d+)/", t) for t in src.logs.lines(0, "stdout")) if m]
        if not steps:
            continue
        shown = str(header_progress(snap))
        assert f"step {steps[-1].group(1)}/32" in shown, (n, tl.kinds[n - 1], shown)
        checked += 1
    assert checked >= 5, checked  # the log moved at least at five marks
