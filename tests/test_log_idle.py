"""A quiet stream costs the log tailer one ``fstat`` a poll, not a read (issue 34).

At idle the tailer polls every rank's stdout and stderr five times a second (a console makes
it poll fast); reading each file to find nothing was most of the launcher's CPU with 8 ranks
asleep (bench/README.md, ``bootstrap.py idle``). A stream whose size has not changed since
every sink had all of it is skipped; one that grows is read as before, and a sink added later
still gets what the others had.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tui_launch.core.logs.tail import LogSource, LogTailer


class CountingFile:
    """The tailer's file, counting its reads (the tailer keeps it open across polls)."""

    def __init__(self, fp: Any) -> None:
        self._fp = fp
        self.reads = 0

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        data: bytes = self._fp.read(size)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fp, name)


def _tailer(path: Path) -> tuple[LogTailer, LogSource, list[str], list[int]]:
    tailer = LogTailer()
    lines: list[str] = []
    raw: list[int] = []
    tailer.add_raw_sink(lambda src, fd, start, end, final: raw.append(end - start))
    tailer.add_sink(lambda src, got: lines.extend(got))
    src = LogSource(0, 0, 0, "stdout", str(path), True, None)
    tailer.add_sources([src])
    return tailer, src, lines, raw


def test_a_quiet_stream_is_not_read_at_a_poll(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"one\n")
    tailer, src, lines, raw = _tailer(path)
    tailer.drain(polled=True)
    assert lines == ["one"] and raw == [4]
    counting = CountingFile(src.fp)
    src.fp = counting
    for _ in range(5):
        tailer.drain(polled=True)
    assert counting.reads == 0, "a stream that did not grow was read"
    assert raw == [4]
    with open(path, "ab") as out:
        out.write(b"two\nthr")
    tailer.drain(polled=True)
    assert lines == ["one", "two"] and raw == [4, 7]
    assert counting.reads > 0
    tailer.stop()  # the final read flushes the unended line
    assert lines == ["one", "two", "thr"]


def test_a_sink_added_later_gets_what_the_others_had(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"one\n")
    tailer = LogTailer()
    raw: list[int] = []
    tailer.add_raw_sink(lambda src, fd, start, end, final: raw.append(end - start))
    tailer.add_sources([LogSource(0, 0, 0, "stdout", str(path), True, None)])
    tailer.drain(polled=True)
    tailer.drain(polled=True)
    assert raw == [4]
    late: list[str] = []
    tailer.add_sink(lambda src, got: late.extend(got))
    tailer.drain(polled=True)  # the file did not grow: the new sink is owed its lines
    assert late == ["one"]
    tailer.stop()


def test_a_held_raw_sink_is_called_again_on_a_quiet_stream(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"no end yet")
    tailer = LogTailer()
    calls: list[tuple[int, int]] = []

    def holding(src: LogSource, fd: int, start: int, end: int, final: bool) -> bool:
        calls.append((start, end))
        return len(calls) < 3  # holds the unended line back twice, then lets it out

    tailer.add_raw_sink(holding)
    tailer.add_sources([LogSource(0, 0, 0, "stdout", str(path), True, None)])
    for _ in range(4):
        tailer.drain(polled=True)
    assert calls == [(0, 10), (10, 10), (10, 10)]
    tailer.stop()


def test_a_quiet_poll_asks_no_sink_which_streams_it_wants(tmp_path: Path) -> None:
    # Whether only views read the output was asked of every sink and stream at every poll
    # (the headless console's filter, 16 calls five times a second at 8 ranks): now once per
    # change of the sinks or the streams.
    paths = [tmp_path / f"{r}.log" for r in range(4)]
    for p in paths:
        p.write_bytes(b"up\n")
    tailer = LogTailer()
    asked: list[int] = []

    def accepts(src: LogSource) -> bool:
        asked.append(src.local_rank)
        return True

    tailer.add_raw_sink(lambda src, fd, start, end, final: None, accepts)
    tailer.add_sources(
        [LogSource(0, r, r, "stdout", str(p), True, None) for r, p in enumerate(paths)]
    )
    tailer._poll()
    first = len(asked)
    assert first > 0
    delays = [tailer._poll() for _ in range(5)]
    assert len(asked) == first, "a quiet poll asked the sink again"
    assert delays == sorted(delays) and delays[-1] == tailer._idle_interval  # backs off
    paths[2].write_bytes(b"up\nmore\n")
    assert tailer._poll() == tailer._interval  # output: poll fast again
    assert len(asked) > first
    tailer.add_sources([LogSource(1, 0, 0, "stdout", str(tmp_path / "a1.log"), True, None)])
    before = len(asked)
    tailer._poll()
    assert len(asked) > before  # a new stream: asked again
    tailer.stop()


def test_caught_up_waits_for_the_tailers_thread_and_gives_up_on_a_blocked_console(
    tmp_path: Path,
) -> None:
    # The agent sees an exit the moment it happens; before it says so it waits for the tailer
    # to hand on what the rank wrote (its last lines come first), on the tailer's own thread:
    # a console nobody reads blocks the tailer, and must not block the agent too.
    import threading

    path = tmp_path / "stdout.log"
    path.write_bytes(b"")
    tailer = LogTailer(quiet_interval=30.0)
    console = threading.Event()  # the console's reader: set = it reads
    shown: list[int] = []

    def to_console(src: LogSource, fd: int, start: int, end: int, final: bool) -> None:
        if end > start:
            console.wait()  # a full pipe nobody reads
            shown.append(end - start)

    tailer.add_raw_sink(to_console)
    tailer.add_sources([LogSource(0, 0, 0, "stdout", str(path), True, None)])
    tailer.start()
    try:
        assert tailer.caught_up(0, {0}, 5.0)  # nothing written: nothing to wait for
        with open(path, "ab") as out:
            out.write(b"the last line before the exit\n")
        assert not tailer.caught_up(0, {0}, 0.3)  # blocked: the caller goes on
        assert shown == []
        console.set()
        assert tailer.caught_up(0, {0}, 30.0)
        assert shown == [30]
        assert tailer.caught_up(1, {0}, 5.0) and tailer.caught_up(0, {1}, 5.0)  # not tailed
    finally:
        console.set()
        tailer.stop()
