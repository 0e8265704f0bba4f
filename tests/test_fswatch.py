"""The file watch (``core/fswatch.py``): a loop sleeps until a file it tails is written.

With 8 ranks asleep the log tailer and the NCCL dump watch found nothing at nearly every poll
(bench/README.md, ``bootstrap.py idle``); with inotify they sleep until a write wakes them.
Real files, real writes, the real tailer thread.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from conftest import wait_for

from tui_launch.core.fswatch import FsWatch
from tui_launch.core.logs.tail import LogSource, LogTailer


def test_a_write_wakes_the_callback_and_a_flood_is_coalesced(tmp_path: Path) -> None:
    watch = FsWatch()
    woken = threading.Event()
    assert watch.watch(str(tmp_path), woken.set)
    assert not woken.wait(0.3), "woken with nothing written"
    (tmp_path / "a.log").write_text("one\n")
    assert woken.wait(5), "a write did not wake the callback"
    woken.clear()
    before = watch.wakeups
    with open(tmp_path / "a.log", "a") as fp:
        for i in range(20000):
            fp.write(f"line {i}\n")
            fp.flush()
    wait_for(woken.is_set, 5, what="the flood's wake-up")
    # 20,000 writes, each an inotify event: a handful of wake-ups, not one per write.
    assert watch.wakeups - before < 200, watch.wakeups - before
    watch.stop()
    assert not watch.watch(str(tmp_path), woken.set)  # stopped: the caller polls


def test_what_cannot_be_watched_is_said(tmp_path: Path) -> None:
    watch = FsWatch()
    calls: list[int] = []
    assert not watch.watch(str(tmp_path / "not-there"), lambda: calls.append(1))
    assert watch.watch(str(tmp_path), lambda: calls.append(1))
    watch.unwatch(str(tmp_path))
    (tmp_path / "x").write_text("x")
    time.sleep(0.3)  # nothing may come: there is no condition to wait for but time
    assert calls == []
    watch.stop()


def test_the_tailer_sleeps_while_files_are_quiet_and_a_line_wakes_it(tmp_path: Path) -> None:
    path = tmp_path / "0" / "stdout.log"
    path.parent.mkdir()
    path.write_bytes(b"")
    watch = FsWatch()
    # A quiet poll every 30 s at most: only the file watch can deliver the line in time.
    tailer = LogTailer(fswatch=watch, quiet_interval=30.0)
    got: list[tuple[float, list[str]]] = []
    tailer.add_sink(lambda src, lines: got.append((time.monotonic(), lines)))
    tailer.add_sources([LogSource(0, 0, 0, "stdout", str(path), False, None)])
    tailer.start()
    loop = tailer._loop
    assert loop is not None
    wait_for(lambda: loop.ticks >= 1, 10, what="the tailer's first poll")
    quiet = loop.ticks
    time.sleep(1.5)  # quiet files: the tailer must not poll meanwhile
    assert loop.ticks - quiet <= 1, loop.ticks - quiet
    t0 = time.monotonic()
    with open(path, "a") as fp:
        fp.write("step 1\n")
    wait_for(lambda: got, 5, what="the line")
    assert got[0][1] == ["step 1"]
    assert got[0][0] - t0 < 2.0  # woken by the write, not by a 30 s poll
    tailer.stop()
    watch.stop()
    assert tailer._watched == {}  # the attempt's directories are no longer watched


def test_without_a_watch_the_tailer_polls_as_before(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"")
    tailer = LogTailer(fswatch=None, quiet_interval=30.0)
    got: list[str] = []
    tailer.add_sink(lambda src, lines: got.extend(lines))
    tailer.add_sources([LogSource(0, 0, 0, "stdout", str(path), False, None)])
    tailer.start()
    time.sleep(0.5)
    path.write_text("late\n")
    wait_for(lambda: got, 5, what="the line, by polling")  # the idle poll: 0.5 s at most
    tailer.stop()
