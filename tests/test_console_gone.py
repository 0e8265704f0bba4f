"""A console that goes away (``tuilaunch ... | head -2``) costs nothing but the console.

The launcher's stdout and stderr are real pipes whose read end the test closes, as ``head``
does when it has its lines: the run must go on to its end, with its own exit status, a
complete journal and run index entry, no traceback and nothing left behind.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, WORKERS, launch_env, read_journal, tuilaunch_cmd, wait_gone

pytestmark = pytest.mark.slow


def _read_lines(fd: int, n: int, timeout: float, until: str | None = None) -> list[str]:
    """Read from ``fd`` until ``n`` whole lines (or one containing ``until``) came; fail after
    ``timeout``."""
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        lines = data.decode(errors="replace").splitlines(keepends=True)
        whole = [ln for ln in lines if ln.endswith("\n")]
        if (until is None and len(whole) >= n) or (until and any(until in ln for ln in whole)):
            return whole
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    raise AssertionError(f"not the lines asked for within {timeout}s: {data[-2000:]!r}")


def _index_entry(pid: int) -> dict:
    """This launcher's entry in the run index (the suite's XDG_RUNTIME_DIR, see conftest)."""
    folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "tuilaunch"
    for path in folder.glob("*.json"):
        entry = json.loads(path.read_text())
        if entry.get("pid") == pid:
            return entry
    raise AssertionError(f"no run index entry for pid {pid} in {folder}")


def _finished(journal: Path) -> dict:
    ends = [e for e in read_journal(journal) if e["kind"] == "run_finished"]
    assert len(ends) == 1, f"run_finished events: {ends}"
    return ends[0]


@pytest.mark.parametrize(
    ("worker", "code", "outcome"),
    [
        (["ticker.py", "--ticks", "15", "--interval", "0.1"], 0, "succeeded"),
        (["crash.py", "--rank", "0", "--mode", "exit", "--after", "1"], 1, "failed"),
    ],
    ids=["succeeds", "fails"],
)
def test_closed_console_pipe_before_start(
    tmp_path: Path, worker: list[str], code: int, outcome: str
) -> None:
    """`2>&1 | head -2`: the pipe closes after the launcher's first two lines, before any
    worker starts. The run still runs to its end and exits with the run's status."""
    journal = tmp_path / "run.jsonl"
    env = launch_env()
    r, w = os.pipe()
    cmd = tuilaunch_cmd(
        "--nproc-per-node", "1", "--journal", str(journal), str(WORKERS / worker[0])
    )
    proc = subprocess.Popen(
        [*cmd, *worker[1:]],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=w,
        stderr=w,
        start_new_session=True,
    )
    os.close(w)
    try:
        first = _read_lines(r, 2, 60)
        os.close(r)  # head -2 has its lines and exits
        r = -1
        rc = proc.wait(120)
    finally:
        if r >= 0:
            os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first[0].startswith("[tuilaunch] launch "), first
    assert rc == code
    end = _finished(journal)
    assert (end["outcome"], end["exit_code"]) == (outcome, code)
    notices = [e["message"] for e in read_journal(journal) if e["kind"] == "notice"]
    assert any(m.startswith("stderr went away (Broken pipe)") for m in notices), notices
    entry = _index_entry(proc.pid)
    assert (entry["outcome"], entry["exit_code"]) == (outcome, code)
    assert not wait_gone(env["TUILAUNCH_TEST_TOKEN"], 10)


def test_closed_console_pipe_mid_run(tmp_path: Path) -> None:
    """The pipe closes while a worker prints: the worker prints on to its end, into its log
    file, and the launcher exits 0 with the run finished in its journal."""
    journal = tmp_path / "run.jsonl"
    env = launch_env()
    r, w = os.pipe()
    cmd = tuilaunch_cmd(
        "--nproc-per-node",
        "1",
        "--journal",
        str(journal),
        str(WORKERS / "ticker.py"),
        "--ticks",
        "30",
        "--interval",
        "0.1",
    )
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=w,
        stderr=w,
        start_new_session=True,
    )
    os.close(w)
    try:
        _read_lines(r, 0, 60, until="tick 2")
        os.close(r)
        r = -1
        rc = proc.wait(120)
    finally:
        if r >= 0:
            os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0
    assert (_finished(journal)["outcome"]) == "succeeded"
    started = next(e for e in read_journal(journal) if e["kind"] == "workers_started")
    assert "tick 29\n" in (Path(started["log_dir"]) / "0" / "stdout.log").read_text()
    assert not wait_gone(env["TUILAUNCH_TEST_TOKEN"], 10)


def test_closed_stdout_alone(tmp_path: Path) -> None:
    """`| head -2` with stderr on the console: one line says stdout went away; no traceback
    (185 "raw log sink failed" ones before)."""
    env = launch_env()
    r, w = os.pipe()
    cmd = tuilaunch_cmd(
        "--nproc-per-node", "1", str(WORKERS / "ticker.py"), "--ticks", "30", "--interval", "0.05"
    )
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    os.close(w)
    try:
        assert _read_lines(r, 2, 60)[:2] == ["tick 0\n", "tick 1\n"]
        os.close(r)
        r = -1
        _, err = proc.communicate(timeout=120)
    finally:
        if r >= 0:
            os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "sink failed" not in err, err
    gone = [ln for ln in err.splitlines() if "stdout went away" in ln]
    assert gone == [
        "[tuilaunch] stdout went away (Broken pipe): the run goes on; what it showed is in "
        "the run directory (the ranks' log files, agent.log, the journal)"
    ], err
    assert "tuilaunch summary: SUCCEEDED" in err
    assert not wait_gone(env["TUILAUNCH_TEST_TOKEN"], 10)
