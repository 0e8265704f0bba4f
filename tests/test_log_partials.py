"""Unterminated output is output: a tqdm bar (``\\r`` updates, ``\\n`` only at close) is seen live.

A real worker (``workers/bar.py``, tqdm's exact bytes) draws a bar and holds mid-way until the
test lets it go, so each check looks at a bar that is still being drawn:

- the tailer's partial sinks get its updates before the ``\\n``, without a line sink seeing it;
- the dashboard's log view shows it as one line that changes in place, never as fragments;
- a headless run on a pty passes the ``\\r`` updates through as they come (the bar moves in
  place, as under torchrun), and on a pipe writes the worker's bytes as torchrun's console gets
  them; with ``--tee``, one prefixed line per update, as torch's tail writes them;
- the rank's log file holds every byte the worker wrote, unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    PY,
    WORKERS,
    base_env,
    journal_path,
    read_journal,
    tuilaunch_cmd,
    wait_for,
    wait_gone,
)
from textual.app import App, ComposeResult

from tui_launch.core.logs.console import PrefixedLines, copy_range, is_devnull
from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.logs.tail import STDERR, LogSource, LogTailer, last_segment
from tui_launch.core.progress.parse import parse_line
from tui_launch.tui.widgets.logpane import LogPane

BAR = str(WORKERS / "bar.py")


def _bar(tmp: Path, *args: str, hold_at: int = 37) -> tuple[subprocess.Popen[bytes], Path]:
    """Start bar.py alone, its stderr to a file; it holds after update ``hold_at`` until the
    returned path exists."""
    go = tmp / "go"
    with open(tmp / "stderr.log", "wb") as fp:
        hold = ("--hold", str(go), "--hold-at", str(hold_at))
        proc = subprocess.Popen(
            [PY, BAR, *hold, "--copy", str(tmp / "copy"), *args],
            stdout=subprocess.DEVNULL,
            stderr=fp,
            env=base_env(RANK="0"),
        )
    return proc, go


def _source(path: Path) -> LogSource:
    return LogSource(0, 0, 0, STDERR, str(path), console=False, prefix=None)


def test_partial_sink_gets_bar_updates_before_the_newline(tmp_path: Path) -> None:
    proc, go = _bar(tmp_path)
    tailer = LogTailer(interval=0.02)
    partials: list[tuple[str, float]] = []
    lines: list[str] = []
    tailer.add_sink(lambda src, batch: lines.extend(batch))
    tailer.add_partial_sink(lambda src, text, t: partials.append((text, t)))
    tailer.add_sources([_source(tmp_path / "stderr.log")])
    tailer.start()
    try:
        wait_for(
            lambda: partials and "37/100" in last_segment(partials[-1][0]),
            30,
            what="the bar at 37/100 reached the partial sink",
        )
        # Mid-bar: the line sinks got the line before the bar, and no piece of the bar.
        assert lines == ["rank 0 starting"]
        text = partials[-1][0]
        assert text.startswith("\rtrain:   0%|") and "\n" not in text
        assert last_segment(text).startswith("train:  37%|███▋      | 37/100 [")
        assert all(t1 <= t2 for (_, t1), (_, t2) in itertools.pairwise(partials))
        go.touch()
        assert proc.wait(30) == 0
        wait_for(lambda: "rank 0 done" in lines, 30, what="the closed bar went to the line sinks")
    finally:
        tailer.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The whole line (every \r state) went to the line sinks once; the partial was then "".
    bar_lines = [ln for ln in lines if "train:" in ln]
    assert len(bar_lines) == 1
    assert last_segment(bar_lines[0]).startswith("train: 100%|██████████| 100/100 [")
    assert "" in [text for text, _ in partials]


def test_partial_of_a_stream_no_line_sink_reads_comes_from_its_tail(tmp_path: Path) -> None:
    # Held at 3000 of 5000: ~190 kB of \r states on one line, more than the tailer reads.
    proc, go = _bar(tmp_path, "--total", "5000", hold_at=3000)
    tailer = LogTailer(interval=0.02)
    partials: list[str] = []
    tailer.add_partial_sink(lambda src, text, t: partials.append(text))
    tailer.add_sources([_source(tmp_path / "stderr.log")])
    tailer.start()
    try:
        wait_for(
            lambda: partials and "3000/5000" in last_segment(partials[-1]),
            30,
            what="the bar at 3000/5000 reached the partial sink",
        )
        assert (tmp_path / "stderr.log").stat().st_size > LogTailer.TAIL
        assert len(partials[-1].encode()) <= LogTailer.TAIL
        assert last_segment(partials[-1]).startswith("train:  60%|██████    | 3000/5000 [")
        go.touch()
        assert proc.wait(30) == 0
        wait_for(lambda: partials[-1] == "", 30, what="the closed bar's partial to end")
    finally:
        tailer.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _Pane(App[None]):
    CSS = "LogView { scrollbar-size: 0 0; }"

    def __init__(self, logs: LogBuffer) -> None:
        super().__init__()
        self.logs = logs

    def compose(self) -> ComposeResult:
        yield LogPane(lambda: self.logs, id="pane")


def test_log_view_shows_a_bar_as_one_line_that_changes(tmp_path: Path) -> None:
    proc, go = _bar(tmp_path)
    logs = LogBuffer()
    tailer = LogTailer(interval=0.02)
    tailer.add_sink(logs, lossy=True)
    tailer.add_partial_sink(logs.partial)
    tailer.add_sources([_source(tmp_path / "stderr.log")])

    async def main() -> list[list[str]]:
        app = _Pane(logs)
        seen: list[list[str]] = []
        async with app.run_test(size=(100, 20)) as pilot:
            pane = app.query_one("#pane", LogPane)
            pane.show_rank(0)

            async def until(text: str) -> None:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    pane.write_new(due=True)
                    await pilot.pause()
                    shown = list(pane.view.lines)
                    if shown != (seen[-1] if seen else None):
                        seen.append(shown)
                    if any(text in ln for ln in shown):
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"{text!r} never shown; last view: {seen[-1:]}")

            await until("37/100")
            mid = list(pane.view.lines)
            # One line for the bar, in its last state, below the line before it.
            assert mid[0] == "rank 0 starting"
            assert [ln for ln in mid if "train:" in ln] == [mid[-1]]
            assert mid[-1].startswith("train:  37%|███▋      | 37/100 [")
            go.touch()
            await until("rank 0 done")
            end = list(pane.view.lines)
            assert end[0] == "rank 0 starting" and end[-1] == "rank 0 done"
            assert [ln for ln in end if "train:" in ln] == [end[1]]
            assert end[1].startswith("train: 100%|██████████| 100/100 [")
        return seen

    tailer.start()
    try:
        seen = asyncio.run(main())
    finally:
        tailer.stop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    # The bar changed in place: every view the test saw had at most one bar line.
    assert len(seen) >= 2
    for shown in seen:
        assert sum("train:" in ln for ln in shown) <= 1, shown


def _read_pty(fd: int, stop: threading.Event, into: bytearray) -> None:
    while not stop.is_set():
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not data:
                return
            into += data


def _ours_removed(shown: bytes) -> bytes:
    """Terminal bytes without tuilaunch's own: line clears, event lines, the status line."""
    shown = shown.replace(b"\r\x1b[2K", b"")
    return re.sub(rb"\[tuilaunch\][^\r\n]*(\r?\n)?", b"", shown)


def _rank_file(output: str, name: str) -> Path:
    """The attempt's rank 0 file ``name`` (from the journal the summary names)."""
    started = [e for e in read_journal(journal_path(output)) if e["kind"] == "workers_started"]
    return Path(started[0]["log_dir"]) / "0" / name


@pytest.mark.slow
@pytest.mark.parametrize("status_line", [False, True], ids=["stdout-pty", "both-pty"])
def test_headless_on_a_pty_moves_the_bar_in_place(tmp_path: Path, status_line: bool) -> None:
    """The bar (on stdout) moves in place; with stderr on the terminal too, the live status
    line is there but never drawn onto the bar while it is being drawn."""
    go = tmp_path / "go"
    copy = tmp_path / "copy"
    master, slave = pty.openpty()
    cmd = tuilaunch_cmd(
        "--standalone",
        "--nproc-per-node",
        "1",
        BAR,
        "--stdout",
        "--hold",
        str(go),
        "--hold-at",
        "37",
        "--copy",
        str(copy),
    )
    token = os.urandom(8).hex()
    env = base_env(TUILAUNCH_TEST_TOKEN=token)
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave if status_line else subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    out = bytearray()
    stop = threading.Event()
    reader = threading.Thread(target=_read_pty, args=(master, stop, out), daemon=True)
    reader.start()
    try:
        # The bar reaches the terminal while it is being drawn (no newline yet), in place.
        wait_for(lambda: b"37/100" in out, 60, what="the bar at 37/100 on the terminal")
        seen = _ours_removed(bytes(out))
        bar = seen[seen.index(b"\rtrain:") :]
        assert b"\n" not in bar and bar.count(b"\r") == 38
        go.touch()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (err or bytes(out))[-3000:]
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        os.close(master)
        assert not wait_gone(token, 10)
    worker = (Path(f"{copy}.0")).read_bytes()
    shown = bytes(out).replace(b"\r\n", b"\n")  # the pty turns "\n" into "\r\n"
    if status_line:
        assert b"[tuilaunch] " in shown  # event lines, and the status line, on the terminal
        bar = worker[worker.index(b"\rtrain:") : worker.index(b"\n", worker.index(b"\r"))]
        # Only tuilaunch's own lines (an event may come mid-bar: it clears the line, and the
        # bar is drawn again at its next update) come between the worker's bytes.
        assert bar in _ours_removed(shown)
        text = shown.decode()
    else:
        assert shown == worker  # exactly the worker's bytes
        text = err.decode()
    # The log file holds every byte, unchanged.
    assert _rank_file(text, "stdout.log").read_bytes() == worker


def _run_bytes(*args: str) -> tuple[int, bytes]:
    """Run ``tuilaunch --no-tui ARGS`` to pipes; its exit code and stderr, as bytes (the
    fixtures read text, where \r would already be a newline)."""
    token = os.urandom(8).hex()
    proc = subprocess.Popen(
        tuilaunch_cmd(*args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=base_env(TUILAUNCH_TEST_TOKEN=token),
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert not wait_gone(token, 10)
    return proc.returncode, err


@pytest.mark.slow
def test_headless_on_a_pipe_writes_what_torchrun_writes(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    args = ("--standalone", "--nproc-per-node", "1")
    bar = (BAR, "--total", "40", "--copy", str(copy))
    # Default mode: torchrun leaves the worker's stderr on its own; the pipe gets its bytes.
    rc, err = _run_bytes(*args, *bar)
    assert rc == 0, err[-3000:]
    worker = Path(f"{copy}.0").read_bytes()
    assert worker.count(b"\r") == 41 and worker.count(b"\n") == 3
    assert worker in err
    assert _rank_file(err.decode(), "stderr.log").read_bytes() == worker

    # --tee: torch's tail reads the file in text mode: every \r or \n ends a prefixed line.
    rc, err = _run_bytes(*args, "--tee", "3", *bar)
    assert rc == 0, err[-3000:]
    worker = Path(f"{copy}.0").read_bytes()
    with open(f"{copy}.0", newline=None) as fp:  # what torch's readline() returns
        expected = "".join(f"[default0]:{line}" for line in fp).encode()
    assert expected.count(b"\n") == 44  # the start line, an empty one, 41 updates, the end
    assert b"\r" not in expected
    # Every prefixed line, in order and nothing else prefixed (the launcher's own lines may
    # fall between them, under torchrun too: they are not the worker's).
    prefixed = [ln for ln in err.splitlines(keepends=True) if ln.startswith(b"[default0]:")]
    assert b"".join(prefixed) == expected, err[-6000:]
    assert _rank_file(err.decode(), "stderr.log").read_bytes() == worker


if sys.platform != "linux":  # pragma: no cover - the pty test needs Linux's pty
    del test_headless_on_a_pty_moves_the_bar_in_place


def test_prefixed_lines_match_torchs_text_mode_reading_in_any_chunking(tmp_path: Path) -> None:
    data = b"a\r\nb\rc\n\rtrain:  1%\rtrain:  2%\r\n\r\rend\r"
    path = tmp_path / "f"
    path.write_bytes(data)
    with open(path, newline=None) as fp:  # torch's tail: readline() in text mode
        expected = "".join(f"[w0]:{line}" for line in fp).encode()
    for step in range(1, len(data) + 1):
        tee = PrefixedLines("[w0]:")
        out = b"".join(tee.feed(data[i : i + step]) for i in range(0, len(data), step))
        out += tee.feed(b"", final=True)
        assert out == expected, step


def test_copy_range_moves_file_bytes_to_a_pipe(tmp_path: Path) -> None:
    path = tmp_path / "f"
    payload = os.urandom(300_000)
    path.write_bytes(payload)
    r, w = os.pipe()
    got = bytearray()
    reader = threading.Thread(target=lambda: got.extend(iter_read(r)), daemon=True)
    reader.start()
    with open(path, "rb") as fp:
        copy_range(fp.fileno(), w, 1000, 250_000)
        assert fp.tell() == 0  # the file's position did not move
    os.close(w)
    reader.join(10)
    os.close(r)
    assert bytes(got) == payload[1000:250_000]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        assert is_devnull(null) and not is_devnull(r + 10_000)
    finally:
        os.close(null)


def iter_read(fd: int) -> bytes:
    chunks = []
    while data := os.read(fd, 65536):
        chunks.append(data)
    return b"".join(chunks)


def test_a_partial_cut_inside_a_character_drops_the_pieces() -> None:
    from tui_launch.core.logs.tail import _decode_partial

    bar = "\r 60%|██████    | 3000/5000".encode()
    # A tail read may start inside a 3-byte block character and end inside another: neither
    # piece is shown (no replacement characters, so the text never grows past the bytes read).
    for start in (1, 2, 3):
        for cut in (0, 1, 2):
            data = bar[bar.index("█".encode()) + start : len(bar) - cut if cut else len(bar)]
            text = _decode_partial(data)
            assert "\ufffd" not in text and len(text.encode()) <= len(data), (start, cut, text)


RICHBAR = str(WORKERS / "richbar.py")


@pytest.mark.parametrize(
    "user_setting", [None, "1", ""], ids=["unset", "TTY_COMPATIBLE=1", "TTY_COMPATIBLE="]
)
def test_a_rich_bar_is_live_in_the_rank_log_unless_the_user_opts_out(
    tuilaunch, tmp_path: Path, user_setting: str | None
) -> None:
    """rich draws a Progress live only on a terminal; a rank's stdout is a file under tuilaunch.
    The workers get ``TTY_COMPATIBLE=1`` (rich >= 14 honours it) unless the user set it, so
    rich draws into the file anyway, where the tailer and the progress parser see it (Lightning's
    default RichProgressBar; docs/dashboard.md). ``TTY_COMPATIBLE=`` (rich's own detection, as
    under torchrun) opts out: then nothing before the end."""
    env = {k: v for k, v in base_env().items() if k not in ("FORCE_COLOR", "TTY_INTERACTIVE")}
    env.pop("TTY_COMPATIBLE", None)
    if user_setting is not None:
        env["TTY_COMPATIBLE"] = user_setting
    live = user_setting != ""
    go = tmp_path / "go"
    logs = tmp_path / "logs"
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "1", "--redirects", "3", "--log-dir", str(logs),
        RICHBAR, "--hold", str(go), env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: Path(f"{go}.reached").exists(), 60, what="the bar held at 37/100")
        (log,) = logs.rglob("stdout.log")
        if live:
            wait_for(lambda: "37/100" in log.read_text(), 30, what="the live bar in the log")
            reading = parse_line(last_segment(log.read_text().rsplit("\n", 1)[-1]))
            assert reading is not None and (reading.step, reading.total) == (37, 100)
            assert reading.fmt == "lightning_rich" and reading.epoch == 0
        else:
            # rich's refresh thread would have drawn it by now on a terminal (10 Hz); on a
            # file it draws nothing before the end
            assert "/100" not in log.read_text()
    finally:
        go.touch()
    assert launch.wait(60) == 0, launch.output
    assert "100/100" in log.read_text()
