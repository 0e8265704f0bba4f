"""A full disk under --log-dir (issue 23, item 2): named, the run ends, the journal is whole.

Real 2 MB tmpfs mounts (root only; skipped with the reason elsewhere), real launches. Two ways
to fill it: the workers' own output, and ``dd`` while healthy workers run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import needs_shutdown_timeout, wait_for

from tui_launch.core.journal.writer import Journal
from tui_launch.core.model import diskspace
from tui_launch.core.model.events import Notice

SHUTDOWN = 3

# Each rank prints 200-byte lines as fast as it can: 2 MB last well under a second.
FILLER = """
import os, time
r = os.environ["RANK"]
for i in range(1_000_000):
    print(f"rank {r} line {i} " + "x" * 200, flush=True)
    if i % 200 == 0:
        time.sleep(0.01)
"""

# A healthy rank: a short line every 50 ms (for minutes), until its disk is full.
STEADY = """
import os, time
r = os.environ["RANK"]
for i in range(100_000):
    print(f"rank {r} step {i} " + "." * 500, flush=True)
    time.sleep(0.05)
"""


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted under ``tmp_path`` (skips where mounting is not allowed)."""
    where = tmp_path / "fs"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(path: Path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


def _check_whole(journal: Path) -> list[dict]:
    """Every line of the journal is one whole JSON event, and the file ends with a newline."""
    data = journal.read_bytes()
    assert data, "the journal is empty"
    assert data.endswith(b"\n"), f"the journal ends mid-line: {data[-200:]!r}"
    return [json.loads(line) for line in data.decode().splitlines()]


def _check_named(out: str, fs: Path) -> None:
    assert "no space left on device" in out, out[-4000:]
    assert f"the file system of its logs, {fs}" in out, out[-4000:]
    assert "stderr.log" in out  # the file that could not hold the rank's traceback
    assert "Traceback" not in out, out[-4000:]  # nothing raised through the launcher


@needs_shutdown_timeout
def test_workers_fill_the_log_dir(tuilaunch, tmp_path, tmpfs):
    script = tmp_path / "filler.py"
    script.write_text(FILLER)
    run = tuilaunch(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmpfs / "logs"),
        "--shutdown-timeout",
        str(SHUTDOWN),
        str(script),
    )
    # Before the fix: journal.close() raised ENOSPC on the agent thread and the launcher
    # never exited (SIGTERM and ^C ignored).
    rc = run.wait(timeout=60)
    assert rc == 1, run.output[-4000:]
    _check_named(run.output, tmpfs)
    journal = next((tmpfs / "logs").glob("*/journal.jsonl"))
    events = _check_whole(journal)
    assert events[0]["kind"] in ("connecting", "run_started")
    assert any(e["kind"] == "attempt_failed" for e in events) or os.path.getsize(journal) > 0


@needs_shutdown_timeout
def test_dd_fills_the_log_dir_while_workers_run(tuilaunch, tmp_path, tmpfs):
    script = tmp_path / "steady.py"
    script.write_text(STEADY)
    run = tuilaunch(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmpfs / "logs"),
        "--shutdown-timeout",
        str(SHUTDOWN),
        str(script),
    )
    journal = wait_for(
        lambda: next((tmpfs / "logs").glob("*/journal.jsonl"), None), 60, what="the journal"
    )
    wait_for(lambda: b'"workers_started"' in journal.read_bytes(), 60, what="workers")

    def both_wrote() -> bool:
        outs = list((tmpfs / "logs").glob("*/attempt_0/*/stdout.log"))
        return len(outs) == 2 and all(p.stat().st_size > 0 for p in outs)

    wait_for(both_wrote, 30, what="the ranks' output")
    assert run.proc.poll() is None, run.output
    filled = subprocess.run(
        ["dd", "if=/dev/zero", f"of={tmpfs / 'fill'}", "bs=64k"], capture_output=True, text=True
    )
    assert "No space left" in filled.stderr
    t0 = time.monotonic()
    rc = run.wait(timeout=60)
    took = time.monotonic() - t0
    assert rc == 1, run.output[-4000:]
    # The ranks die at their next print; torch ends the others within the shutdown timeout.
    assert took < SHUTDOWN + 15, f"the launcher took {took:.1f}s to exit"
    _check_named(run.output, tmpfs)
    _check_whole(journal)


def test_journal_on_a_full_disk_ends_on_a_whole_event_and_catches_up(tmpfs):
    heard: list[str] = []
    path = tmpfs / "journal.jsonl"
    journal = Journal(str(path), on_error=heard.append)
    big = "y" * 3000  # lines of ~3 kB: the last one fits only in part
    journal.write(Notice(level="info", message="first"))
    fill = tmpfs / "fill"
    _fill(fill)
    for _ in range(20):
        journal.write(Notice(level="info", message=big))  # never raises
    assert len(heard) == 1, heard  # said once
    assert "no space left on device" in heard[0] and str(tmpfs) in heard[0]
    assert str(path) in heard[0]
    assert journal.unwritten > 0
    written = _check_whole(path)
    fill.unlink()  # room again: the lines kept in memory go out, in order
    journal.write(Notice(level="info", message="last"))
    journal.close()
    journal.close()  # twice: no error
    events = _check_whole(path)
    assert len(events) == 22 > len(written)
    assert [e["seq"] for e in events] == list(range(22))
    assert events[-1]["message"] == "last"


def test_full_filesystem_names_the_mount(tmpfs):
    (tmpfs / "sub").mkdir()
    assert diskspace.full_filesystem(str(tmpfs / "sub" / "missing.log")) is None
    _fill(tmpfs / "fill")
    said = diskspace.full_filesystem(str(tmpfs / "sub" / "missing.log"))
    assert said is not None and said.startswith(f"{tmpfs} (2.0 MB, ")
    assert diskspace.mount_point(str(tmpfs / "sub")) == str(tmpfs)
    line = diskspace.write_error(OSError(errno.ENOSPC, "x"), str(tmpfs / "sub" / "a.log"))
    assert line.startswith(f"no space left on device: the file system at {tmpfs} ")
