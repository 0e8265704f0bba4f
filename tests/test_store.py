"""The store, the journal, events and the log tailer.

One real launch (a rank that fails on every attempt, one restart) checks that replaying its
journal rebuilds the very summary the launcher printed. Everything else is pure and fast:
``reduce``/``pick_root_cause``, event round trips for every event type, the journal format,
and :class:`LogTailer` on files the test writes itself.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import threading
import time
import types
import typing
from pathlib import Path

import pytest
from conftest import WORKERS, Launch, _launch, tuilaunch_cmd, wait_gone

from tui_launch.core.journal.writer import Journal, read_journal
from tui_launch.core.logs.tail import STDERR, STDOUT, LogSource, LogTailer
from tui_launch.core.model import events as ev
from tui_launch.core.model.store import (
    FAILED,
    RESTARTING,
    RUNNING,
    STOPPED,
    RunStore,
    Snapshot,
    pick_root_cause,
    reduce,
    replay,
)
from tui_launch.testing import builders

# ----------------------------------------------------------------------------- real run


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory) -> tuple[Launch, Path]:
    """crash.py raising (with @record) on rank 1 in both attempts of --max-restarts 1."""
    tmp = tmp_path_factory.mktemp("store_run")
    journal = tmp / "j.jsonl"
    launch = _launch(
        tuilaunch_cmd(
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--journal",
            str(journal),
            str(WORKERS / "crash.py"),
            "--rank",
            "1",
            "--mode",
            "raise",
            "--record",
            "--after",
            "0.2",
        ),
        None,
        None,
    )
    try:
        code = launch.wait(180)
    finally:
        if launch.proc.poll() is None:
            launch.kill()
        left = wait_gone(launch.token, 10)
        if left:
            launch.kill()
        assert not left, f"left behind: {left}"
    assert code == 1, launch.output[-5000:]
    return launch, journal


def _printed_summary(stderr: str) -> str:
    start = stderr.rfind("tuilaunch summary:")
    assert start >= 0, stderr[-3000:]
    lines = stderr[start:].splitlines()
    # The runner-specific trailer (log directory, journal path) is not part of the snapshot.
    return "\n".join(ln for ln in lines if not ln.startswith(("logs: ", "journal: ")))


def test_replayed_journal_prints_the_same_summary(failed_run):
    from tui_launch.summary import print_summary

    launch, journal = failed_run
    snap = replay(read_journal(str(journal)))
    buf = io.StringIO()
    print_summary(snap, None, buf)
    replayed = buf.getvalue()
    replayed = replayed[replayed.index("tuilaunch summary:") :].rstrip("\n")
    assert replayed == _printed_summary(launch.stderr).rstrip("\n")

    # And the structure behind it.
    assert snap.finished is not None and snap.finished.outcome == "failed"
    assert snap.finished.exit_code == 1
    assert snap.failure_restarts == 1 and snap.manual_restarts == 0
    assert snap.budget_left == 0
    assert [a.number for a in snap.attempts] == [0, 1]
    assert snap.root_cause is not None
    assert snap.root_cause.global_rank == 1 and snap.root_cause.attempt == 1
    assert "boom from rank 1" in snap.root_cause.message
    assert "explode" in (snap.root_cause.traceback or "")
    assert "restarts: 1/1 on failure" in launch.stderr
    assert sum(1 for f in snap.failures if not f.collateral) == 2


def test_journal_lines_have_kind_seq_and_clocks(failed_run):
    _, journal = failed_run
    raw = [json.loads(ln) for ln in journal.read_text().splitlines()]
    assert [d["seq"] for d in raw] == list(range(len(raw)))
    for d in raw:
        assert d["kind"] in ev.EVENT_TYPES
        assert isinstance(d["mono"], float) and isinstance(d["wall"], float)
    monos = [d["mono"] for d in raw]
    assert monos == sorted(monos)
    assert raw[0]["kind"] == "run_started" and raw[-1]["kind"] == "run_finished"
    # Every line reads back into the same event (nothing dropped or mangled).
    back = read_journal(str(journal))
    assert len(back) == len(raw)
    for d, e in zip(raw, back, strict=True):
        again = json.loads(json.dumps(ev.to_dict(e)))
        assert again == {k: v for k, v in d.items() if k != "seq"}


# ----------------------------------------------------------------------------- reduce


def _failure(
    rank: int, time: float, collateral: bool = False, attempt: int = 0, code: int = 1
) -> ev.Failure:
    """A failure of ``rank`` at ``time`` (pid 1000 + rank), from the shared builder."""
    return builders.failure(
        attempt, rank, pid=1000 + rank, at=time, code=code, collateral=collateral
    )


def test_a_rank_that_only_says_a_peer_broke_is_not_the_cause_of_the_same_look():
    """A rank SIGKILLed and its peer, which raised "Connection reset by peer" in the collective
    the kill broke, reaped in one look of the monitor: the peer's exit can be seen first (a
    plain DDP loop named rank 0's SIGABRT as the cause, 1 run in 4). The killed rank is."""
    from dataclasses import replace

    peer = replace(
        _failure(0, 3.0, code=-6),
        message="RuntimeError: Read error [127.0.0.1]:2465: Connection reset by peer",
    )
    killed = _failure(1, 3.2, code=-9)
    assert pick_root_cause([peer, killed]) is killed
    # Seconds later it is another failure: the earliest stays the cause.
    assert pick_root_cause([peer, _failure(1, 6.0, code=-9)]) is peer


def test_pick_root_cause_never_collateral_and_earliest_real():
    early_peer = _failure(0, 1.0, collateral=True, code=-15)
    real_late = _failure(1, 5.0)
    real_early = _failure(3, 2.0)
    assert pick_root_cause([early_peer, real_late]) is real_late
    assert pick_root_cause([real_late, early_peer, real_early]) is real_early
    # Same time: the lower global rank.
    a, b = _failure(2, 3.0), _failure(1, 3.0)
    assert pick_root_cause([a, b]) is b
    assert pick_root_cause([]) is None
    # Order of the input does not matter.
    fs = [_failure(r, 10.0 - r, collateral=r % 2 == 0) for r in range(6)]
    best = pick_root_cause(fs)
    assert best is not None and not best.collateral and best.global_rank == 5
    assert pick_root_cause(list(reversed(fs))) is best


def _workers(attempt: int, n: int = 2) -> ev.WorkersStarted:
    """Attempt ``attempt``'s ``n`` workers, pids 100 * (attempt + 1) + i, on the real clocks."""
    return builders.workers_started(attempt, n, 100 * (attempt + 1))


def _run_started(max_restarts: int = 2) -> ev.RunStarted:
    """The run's first event (2 ranks per node), on the real clocks."""
    return builders.run_started(2, max_restarts, at=None)


def test_reduce_follows_a_run_and_snapshots_are_immutable():
    s0 = Snapshot()
    s = reduce(s0, _run_started(2))
    assert s0.version == 0 and s0.run is None  # the old snapshot is untouched
    assert s.version == 1 and s.budget_left == 2 and s.max_restarts == 2
    s = reduce(s, _workers(0))
    assert s.phase == "running" and s.attempt == 0
    assert [r.state for r in s.ranks] == [RUNNING, RUNNING]
    assert len(s.attempts) == 1 and s.attempts[0].ended is None

    before_stop = s
    s = reduce(
        s,
        ev.ControlAction(
            action="stop",
            local_rank=0,
            global_rank=0,
            pid=100,
            signal="SIGSTOP",
            source="t",
            ok=True,
        ),
    )
    assert s.rank(0).state == STOPPED and before_stop.rank(0).state == RUNNING
    # A failed control action changes no rank.
    s2 = reduce(
        s,
        ev.ControlAction(
            action="continue",
            local_rank=0,
            global_rank=0,
            pid=100,
            signal="SIGCONT",
            source="t",
            ok=False,
        ),
    )
    assert s2.rank(0).state == STOPPED
    s = reduce(
        s,
        ev.ControlAction(
            action="continue",
            local_rank=0,
            global_rank=0,
            pid=100,
            signal="SIGCONT",
            source="t",
            ok=True,
        ),
    )
    assert s.rank(0).state == RUNNING
    assert len(s.controls) == 2 and len(s2.controls) == 2

    s = reduce(s, builders.exited(0, 1, 101, -9))
    assert s.rank(1).state == FAILED and s.rank(1).signal == "SIGKILL"
    f_real = _failure(1, 2.0, code=-9)
    f_peer = _failure(0, 1.0, collateral=True, code=-15)
    s = reduce(s, ev.AttemptFailed(attempt=0, failures=(f_peer, f_real)))
    assert s.root_cause is f_real
    assert s.failures == (f_peer, f_real)
    s = reduce(
        s, ev.Restart(cause="failure", from_attempt=0, to_attempt=1, restarts_used=1, budget_left=1)
    )
    assert s.failure_restarts == 1 and s.budget_left == 1 and s.phase == "restarting"
    assert s.rank(0).state == RESTARTING and s.rank(1).state == FAILED
    assert s.attempts[0].end_reason == "failure" and s.attempts[0].ended is not None

    s = reduce(s, _workers(1))
    assert s.attempt == 1 and {r.pid for r in s.ranks} == {200, 201}
    # A late exit of the previous attempt does not touch the new ranks.
    late = reduce(s, builders.exited(0, 0, 100, -15, by_agent=True))
    assert late.ranks == s.ranks

    s = reduce(
        s, ev.Restart(cause="manual", from_attempt=1, to_attempt=2, restarts_used=2, budget_left=1)
    )
    assert s.manual_restarts == 1 and s.failure_restarts == 1 and s.budget_left == 1
    assert s.restarts_used == 2
    s = reduce(s, _workers(2))
    # Failures of earlier attempts are kept; the root cause stays until a new failure.
    assert s.root_cause is f_real and len(s.failures) == 2
    s = reduce(s, ev.Shutdown(reason="stop", signal="SIGTERM"))
    assert s.phase == "stopping" and s.shutdown is not None
    s = reduce(s, ev.RunFinished(outcome="stopped", exit_code=143, message="stopped"))
    assert s.phase == "stopped" and s.finished.exit_code == 143
    assert all(a.ended is not None for a in s.attempts)
    assert [a.end_reason for a in s.attempts] == ["failure", "manual", "stopped"]
    assert s.version == 12 and s.events == 12  # the branches (s2, late) are not in s


def test_root_cause_follows_the_latest_attempt():
    s = replay(
        [
            _run_started(1),
            _workers(0),
            ev.AttemptFailed(attempt=0, failures=(_failure(1, 1.0),)),
            ev.Restart(
                cause="failure", from_attempt=0, to_attempt=1, restarts_used=1, budget_left=0
            ),
            _workers(1),
            ev.AttemptFailed(
                attempt=1,
                failures=(
                    _failure(0, 5.0, attempt=1),
                    _failure(1, 6.0, collateral=True, attempt=1),
                ),
            ),
        ]
    )
    assert s.root_cause is not None
    assert (s.root_cause.attempt, s.root_cause.global_rank) == (1, 0)
    assert len(s.failures) == 3


def test_every_event_type_reaches_its_family_reducer():
    """``reduce`` dispatches by type: every registered event kind has a reducer (its own or its
    sample's, for a journaled twin), but the two that change nothing but the version."""
    from tui_launch.core.model.reducers import REDUCERS, diagnosis, reducer_for, reduces, run

    unreduced = {cls for cls in ev.EVENT_TYPES.values() if reducer_for(cls) is None}
    assert unreduced == {ev.Injected, ev.LogMark}
    assert reducer_for(ev.TelemetryRecord) is reducer_for(ev.TelemetrySample)
    assert reducer_for(ev.ProgressRecord) is reducer_for(ev.ProgressSample)
    assert reducer_for(ev.RunStarted).__module__ == run.__name__
    assert reducer_for(ev.HangDetected).__module__ == diagnosis.__name__
    with pytest.raises(ValueError, match="two reducers"):
        reduces(ev.Notice)(lambda s, e: s)
    assert len(REDUCERS) == len(ev.EVENT_TYPES) - 4  # less Injected, LogMark and the twins


def test_event_count_is_the_journaled_events_and_a_log_mark_is_no_change():
    s = reduce(Snapshot(), _run_started(1))
    assert (s.version, s.events) == (1, 1)
    s = reduce(s, ev.StoreRetry(endpoint="h:1", attempt=1, delay=None, timeout=None))
    assert (s.version, s.events, s.store_retries) == (2, 1, 1)
    s = reduce(
        s,
        ev.Injected(
            spec="hang",
            fault="hang",
            attempt=0,
            global_rank=0,
            local_rank=0,
            pid=1,
            count=1,
            times=1,
            source="cli",
            ok=True,
        ),
    )
    assert (s.version, s.events) == (3, 2)
    assert reduce(s, ev.LogMark(offsets=())) is s


def test_run_store_threads_listeners_and_waiting():
    store = RunStore()
    seen: list[ev.Event] = []

    def broken(_e: ev.Event) -> None:
        raise RuntimeError("listener bug")

    store.subscribe(broken)
    store.post(_run_started())
    store.subscribe(seen.append)  # replays the past event
    assert [e.kind for e in seen] == ["run_started"]

    n = 200
    threads = [
        threading.Thread(target=lambda i=i: store.post(ev.Notice(level="info", message=str(i))))
        for i in range(n)
    ]
    waited: list[Snapshot] = []
    waiter = threading.Thread(target=lambda: waited.append(store.wait_newer(n, timeout=10)))
    waiter.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    waiter.join(10)
    snap = store.snapshot()
    assert snap.version == n + 1 == store.version
    assert len(snap.notices) == n
    assert sorted(int(x.message) for x in snap.notices) == list(range(n))
    assert len(seen) == n + 1  # the broken listener stopped nothing
    assert [e.message for e in seen[1:]] == [x.message for x in snap.notices]  # same order
    assert waited and waited[0].version > n
    assert len(store.events()) == n + 1 and len(store.events(n)) == 1
    # wait_newer returns at its timeout when nothing happens.
    assert store.wait_newer(store.version, timeout=0.05).version == n + 1


# ----------------------------------------------------------------------------- events


def _sample(tp: typing.Any, name: str, depth: int = 0) -> typing.Any:
    """A non-default value of type ``tp`` (resolved hints of an event field)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return _sample(members[0], name, depth)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        return (_sample(item, name, depth), _sample(item, name + "2", depth))
    if tp is bool:
        return True
    if tp is int:
        return 7 + len(name)
    if tp is float:
        return 1.5 + len(name)
    if tp is str:
        return f'{name}-ü\n"x"'
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, depth + 1)
    raise AssertionError(f"no sample for {tp!r} ({name})")


def _build(cls: type, depth: int = 0) -> typing.Any:
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _sample(hints[f.name], f.name, depth) for f in dataclasses.fields(cls)}
    return cls(**kwargs)


@pytest.mark.parametrize("kind", sorted(ev.EVENT_TYPES))
def test_event_round_trip(kind):
    cls = ev.EVENT_TYPES[kind]
    event = _build(cls)
    data = ev.to_dict(event)
    assert data["kind"] == kind == cls.kind
    assert next(iter(data)) == "kind"
    back = ev.from_dict(json.loads(json.dumps(data)))
    assert back == event
    assert type(back) is cls
    hash(back)  # frozen records with tuples, not lists: hashable
    # A journal line (with its seq) reads back the same way.
    assert ev.from_dict({"seq": 3, **json.loads(json.dumps(data))}) == event


def test_event_round_trip_with_none_and_empty_values():
    f = _failure(1, 2.0)
    e = ev.AttemptFailed(attempt=0, failures=(f,))
    assert ev.from_dict(json.loads(json.dumps(ev.to_dict(e)))) == e
    empty = ev.WorkersStarted(attempt=0, workers=(), log_dir="")
    assert ev.from_dict(json.loads(json.dumps(ev.to_dict(empty)))) == empty


def test_journal_buffers_until_dir_and_skips_unknown(tmp_path):
    j = Journal()
    j.write(_run_started())
    j.write(ev.Notice(level="info", message="before the directory"))
    assert j.path is None
    j.set_dir(str(tmp_path))
    j.write(ev.Notice(level="info", message="after"))
    j.set_dir(str(tmp_path / "elsewhere"))  # the first directory wins
    j.close()
    path = tmp_path / "journal.jsonl"
    assert j.path == str(path)
    raw = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [d["seq"] for d in raw] == [0, 1, 2]
    assert [d["kind"] for d in raw] == ["run_started", "notice", "notice"]
    with path.open("a") as fp:
        fp.write('{"kind": "from_the_future", "seq": 3, "mono": 1.0, "wall": 1.0}\n')
        fp.write("not json\n\n")
        fp.write(json.dumps({"seq": 4, **ev.to_dict(ev.Notice(level="w", message="x"))}) + "\n")
    back = read_journal(str(path))
    assert [e.kind for e in back] == ["run_started", "notice", "notice", "notice"]
    assert back[1].message == "before the directory"

    explicit = tmp_path / "sub" / "j.jsonl"
    j2 = Journal(str(explicit))
    j2.write(ev.Notice(level="info", message="x"))
    j2.set_dir(str(tmp_path / "other"))
    j2.close()
    assert explicit.exists() and not (tmp_path / "other" / "journal.jsonl").exists()


# ----------------------------------------------------------------------------- LogTailer


class Collect:
    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}
        self.calls = 0

    def __call__(self, src: LogSource, lines: list[str]) -> None:
        self.calls += 1
        self.lines.setdefault(src.path, []).extend(lines)

    def of(self, path: Path) -> list[str]:
        return self.lines.get(str(path), [])


def _source(path: Path, attempt: int = 0, stream: str = STDOUT, lr: int = 0) -> LogSource:
    return LogSource(
        attempt=attempt,
        local_rank=lr,
        global_rank=lr,
        stream=stream,
        path=str(path),
        console=False,
        prefix=None,
    )


def _tailer(*sources: LogSource) -> tuple[LogTailer, Collect]:
    t = LogTailer()
    c = Collect()
    t.add_sink(c)
    t.add_sources(list(sources))
    return t, c


def test_tailer_partial_lines_wait_for_their_newline(tmp_path):
    p = tmp_path / "out.log"
    t, c = _tailer(_source(p))
    t.drain()  # the file does not exist yet: nothing, no error
    assert c.of(p) == []
    with p.open("ab") as fp:
        fp.write(b"first\nsec")
    t.drain()
    assert c.of(p) == ["first"]
    with p.open("ab") as fp:
        fp.write(b"ond\rstill second\n")
    t.drain()
    # \r stays inside its line; the split line comes out whole.
    assert c.of(p) == ["first", "second\rstill second"]
    with p.open("ab") as fp:
        fp.write(b"\n\nlast without newline")
    t.drain()
    assert c.of(p) == ["first", "second\rstill second", "", ""]
    t.drain(final=True)  # the end of the run flushes the partial line
    assert c.of(p)[-1] == "last without newline"


def test_tailer_line_split_across_reads(tmp_path):
    p = tmp_path / "out.log"
    lines = [f"line {i} " + "y" * i for i in range(40)] + ["ü€ multi-byte ü€ " * 2] * 9
    assert max(len(ln.encode()) for ln in lines) < 60
    p.write_bytes(("\n".join(lines) + "\n").encode())
    t, c = _tailer(_source(p))
    t.CHUNK = 61  # reads end in the middle of lines and of UTF-8 sequences
    t.drain()  # one drain reads to the end, however many chunks that takes
    assert c.of(p) == lines
    assert c.calls > 10


def test_tailer_close_attempt_after_a_chunk_without_newline(tmp_path):
    p = tmp_path / "progress.log"
    progress = "".join(f"\rstep {i:08d} loss 0.123456" for i in range(200_000))
    p.write_text(progress + "\nTraceback: boom\n")
    assert p.stat().st_size > LogTailer.CHUNK
    t, c = _tailer(_source(p, stream=STDERR))
    t.close_attempt(0)  # "read an ended attempt's files to the end"
    got = c.of(p)
    assert got[-1] == "Traceback: boom"
    # A \r-rewritten "line" this long (a bar that never ended its line) arrives as its last
    # states, bounded, not as a stream of fragments (issue 15); the file keeps every byte.
    assert got[:-1] and "".join(got[:-1]).endswith(f"\rstep {199_999:08d} loss 0.123456")
    assert progress.endswith("".join(got[:-1]))
    assert all(len(piece) <= LogTailer.MAX_LINE + LogTailer.CHUNK for piece in got[:-1])
    kept = p.read_bytes() == (progress + "\nTraceback: boom\n").encode()
    assert kept  # (a bool: pytest would diff the 6 MB strings for minutes)


def test_tailer_five_megabytes_of_long_lines(tmp_path):
    p = tmp_path / "big.log"
    lines = []
    size = 0
    i = 0
    while size < 5 * 1024 * 1024:
        n = 1 + (i * 7919) % 300_000  # up to 300 kB per line
        line = f"{i:06d}" + chr(ord("a") + i % 26) * n
        lines.append(line)
        size += len(line) + 1
        i += 1
    p.write_text("\n".join(lines) + "\n")
    assert p.stat().st_size > LogTailer.CHUNK  # more than one read
    t, c = _tailer(_source(p))
    t.drain()
    got = c.of(p)
    assert len(got) == len(lines)
    assert got == lines


def _flood(p: Path, first: int, count: int) -> list[str]:
    lines = [f"line {i:07d} " + "x" * 88 for i in range(first, first + count)]
    with p.open("a") as fp:
        fp.write("\n".join(lines) + "\n")
    return lines


def test_tailer_lossy_sinks_skip_a_flood_to_its_last_lines(tmp_path):
    p = tmp_path / "flood.log"
    t = LogTailer()
    c = Collect()
    t.add_sink(c, lossy=True)
    t.add_sources([_source(p)])
    small = _flood(p, 0, 100)  # 10 kB behind: read in full
    t.drain()
    assert c.of(p) == small
    big = _flood(p, 100, 20_000)  # 2 MB behind: only the tail
    t.drain()
    got = c.of(p)[len(small) :]
    note, tail = got[0], got[1:]
    assert note.startswith("... ") and "MB not shown here" in note and str(p) in note
    # Whole lines only, the newest ones, in order, and no more than the kept bytes hold.
    assert tail == big[-len(tail) :]
    assert 0 < len(tail) * 100 <= LogTailer.SKIP_KEEP
    skipped_mb = float(note.split()[1])
    assert abs(skipped_mb - (len(big) - len(tail)) * 100 / 1e6) < 0.06
    more = _flood(p, 20_100, 50)  # caught up: back to every line
    t.drain()
    assert c.of(p)[-50:] == more


def test_tailer_never_skips_while_a_sink_needs_every_line(tmp_path):
    p = tmp_path / "flood.log"
    t = LogTailer()
    view, console = Collect(), Collect()
    t.add_sink(view, lossy=True)
    t.add_sink(console)  # e.g. the headless console taking over from a failed dashboard
    t.add_sources([_source(p)])
    big = _flood(p, 0, 20_000)
    t.drain()
    assert console.of(p) == big
    assert view.of(p) == big


def test_tailer_thread_follows_a_growing_file(tmp_path):
    p = tmp_path / "grow.log"
    t, c = _tailer(_source(p))
    t.start()
    try:
        with p.open("a", buffering=1) as fp:
            for i in range(500):
                fp.write(f"{i}\n")
                if i % 100 == 0:
                    fp.write("half-")
                    fp.flush()
                    fp.write("line\n")
        t0 = time.monotonic()
        while len(c.of(p)) < 505 and time.monotonic() - t0 < 5.0:
            time.sleep(0.02)
    finally:
        t.stop()
    expected = []
    for i in range(500):
        expected.append(str(i))
        if i % 100 == 0:
            expected.append("half-line")
    assert c.of(p) == expected


def test_tailer_backs_off_while_quiet_and_polls_views_slowly(tmp_path):
    """The tailer's poll returns its next delay: the fast interval while lines flow, doubling
    up to the idle interval while quiet, and the view interval when only views read."""
    p = tmp_path / "out.log"
    t = LogTailer(interval=0.05, idle_interval=0.2, view_interval=0.5)
    c = Collect()
    t.add_sink(c)
    t.add_sources([_source(p)])
    p.write_text("one\n")
    assert t._poll() == 0.05  # a line came: keep polling fast
    assert [t._poll() for _ in range(4)] == [0.1, 0.2, 0.2, 0.2]  # quiet: back off
    with p.open("a") as fp:
        fp.write("two\n")
    assert t._poll() == 0.05
    assert c.of(p) == ["one", "two"]
    views = LogTailer(interval=0.05, idle_interval=0.2, view_interval=0.5)
    views.add_sink(Collect(), lossy=True)
    views.add_sources([_source(p)])
    assert views._poll() == views._poll() == 0.5


def test_tailer_runs_on_one_named_low_priority_thread(tmp_path):
    p = tmp_path / "out.log"
    names: list[tuple[str, int]] = []

    def sink(src: object, lines: list[str]) -> None:
        names.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, 0)))

    t = LogTailer(interval=0.01)
    t.add_sink(sink)
    t.add_sources([_source(p)])
    before = os.getpriority(os.PRIO_PROCESS, 0)
    t.start()
    t.start()  # once
    try:
        p.write_text("hello\n")
        deadline = time.monotonic() + 10
        while not names and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        t.stop()
    assert names == [("tuilaunch-logs", min(before + 10, 19))]
    assert os.getpriority(os.PRIO_PROCESS, 0) == before  # the caller's thread is untouched


def test_tailer_close_attempt_reads_to_end_and_stops(tmp_path):
    a0_out, a0_err, a1_out = tmp_path / "a0.out", tmp_path / "a0.err", tmp_path / "a1.out"
    t, c = _tailer(_source(a0_out), _source(a0_err, stream=STDERR), _source(a1_out, attempt=1))
    a0_out.write_bytes(b"one\ntwo\nunfinished")
    a0_err.write_bytes(b"")
    a1_out.write_bytes(b"next attempt\npartial")
    t.close_attempt(0)
    # Everything of attempt 0, its partial line flushed; attempt 1 untouched until drained.
    assert c.of(a0_out) == ["one", "two", "unfinished"]
    assert c.of(a0_err) == []
    assert c.of(a1_out) == []
    with a0_out.open("ab") as fp:
        fp.write(b"\nwritten after the attempt ended\n")
    t.drain()
    assert c.of(a0_out) == ["one", "two", "unfinished"]  # no longer tailed
    assert c.of(a1_out) == ["next attempt"]
    t.drain()
    assert c.of(a1_out) == ["next attempt"]  # no duplicates
    t.stop()  # never started: still flushes what is left
    assert c.of(a1_out) == ["next attempt", "partial"]


def test_tailer_survives_a_broken_sink(tmp_path):
    p = tmp_path / "out.log"
    p.write_bytes(b"a\nb\n\xff\xfe bad utf-8\n")
    t = LogTailer()
    t.add_sink(lambda src, lines: (_ for _ in ()).throw(RuntimeError("sink bug")))
    c = Collect()
    t.add_sink(c)
    t.add_sources([_source(p)])
    t.drain()
    assert c.of(p)[:2] == ["a", "b"]
    assert c.of(p)[2].endswith(" bad utf-8") and "\ufffd" in c.of(p)[2]


def test_dumps_and_a_confirmed_hang_flag_the_ranks_until_the_next_attempt() -> None:
    from tui_launch.core.model.events import HangDetected
    from tui_launch.testing import scenarios
    from tui_launch.testing.builders import workers_started

    src = scenarios.hung()
    s = src.snapshot()
    assert [d.reason for d in s.dumps] == ["hang-suspected", "hang-confirm"]
    assert isinstance(s.hang, HangDetected) and s.hang.second_path == s.dumps[-1].path
    assert s.hung_ranks == (1,)  # the odd rank out, not every rank that waits for it
    assert s.dumps[-1].places[1] == "rank 1: data.py:41 in load_batch"
    s = reduce(s, workers_started(1, 4, 6000, at=120.0))
    assert s.hung_ranks == () and len(s.dumps) == 2  # a new attempt: no rank is suspect


def test_hung_flag_goes_when_the_ranks_move_again() -> None:
    from tui_launch.core.model.events import HangCleared
    from tui_launch.testing import scenarios

    s = scenarios.hung().snapshot()
    assert s.hung_ranks == (1,)
    stale = reduce(s, HangCleared(attempt=s.attempt + 1, ranks=(1,), why="output"))
    assert stale.hung_ranks == (1,) and stale.hang_cleared is None  # another attempt's
    cleared = HangCleared(attempt=s.attempt, ranks=(1,), why="stacks", detail="moved")
    s = reduce(s, cleared)
    assert s.hung_ranks == () and s.hang_cleared == cleared
    assert s.hang is not None  # the hang stays in the history (root cause, journal)


def test_replayed_progress_records_give_the_same_goodput():
    from tui_launch.core.model.progress import goodput
    from tui_launch.core.model.store import RunStore
    from tui_launch.testing.builders import progress, workers_started

    # Two attempts, the second resumed from step 200 after reaching 287: what the live store
    # folds (a sample a second) and what the journal replays (every 10 s, and each attempt's
    # last record) give the same goodput summary.
    events = [
        *progress(0, 2, 0.1, 30.0, 10.0, total=1000, fmt="plain", final=True),
        *progress(1, 2, 30.5, 90.0, 10.0, first_step=200, total=1000, fmt="plain", final=True),
    ]
    store = RunStore()
    store.post(workers_started(0, 2, 5100, at=0.1))
    for e in events:
        if e.attempt == 1 and store.snapshot().attempt == 0:
            store.post(workers_started(1, 2, 5200, at=30.5))
        store.post(e)
    live = store.snapshot()
    replayed = replay(store.events())
    assert any(not e.journaled for e in events)  # the journal holds fewer
    a = goodput(live.progress, live.attempts, 1_790_000_100.0)
    b = goodput(replayed.progress, replayed.attempts, 1_790_000_100.0)
    assert a == b and a is not None
    assert a.attempts[1].resumed_from == 200 and a.attempts[1].redone == 287 - 200


def test_the_history_clock_never_goes_back_when_two_threads_race_to_post() -> None:
    # A rank's exit (the agent thread) and a line of its traceback (the tailer) are stamped
    # microseconds apart on two threads and may be posted in the other order: the journal's
    # times still rise with its order (replay seeks by them), the later post taking the time
    # of the one before it.
    store = RunStore()
    first = ev.Notice(level="info", message="posted first", mono=100.000060, wall=1.0)
    late = ev.Notice(level="info", message="stamped first", mono=100.000001, wall=1.0)
    store.post(first)
    store.post(late)
    store.post(ev.Notice(level="info", message="later", mono=101.0, wall=2.0))
    monos = [e.mono for e in store.events()]
    assert monos == [100.000060, 100.000060, 101.0]
    notices = [e for e in store.events() if isinstance(e, ev.Notice)]
    assert [e.message for e in notices] == ["posted first", "stamped first", "later"]
