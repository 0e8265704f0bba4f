"""Issue 32: what ``tuilaunch status`` says is true.

A file that holds no event (an empty file, ``/etc/passwd``) is an error, exit 3, not a
``lost`` run; a journal this user may not read says ``permission denied`` (exit 3), not "no
journal"; after the launcher was SIGKILLed the ranks it ran are ``lost`` like the run, not
``running``; each progress reading carries its age (``age_s``; "N s ago" in the text), the
journal's as well as the live socket's; after a full disk cut the journal short, ``status``
says the outcome ``ls`` says (the run index's).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, ROOT, WORKERS, base_env, live_journal, wait_for

from tui_launch import cli
from tui_launch.core.remote import runindex

NOBODY = 65534


def _tuilaunch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tui_launch", *args],
        env=env or base_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _status(*args: str) -> dict[str, Any]:
    out = _tuilaunch("status", *args, "--json")
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


@pytest.mark.parametrize("name", ["empty.jsonl", "passwd"])
def test_a_file_with_no_event_is_an_error(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    if name == "passwd":
        shutil.copy("/etc/passwd", path)
    else:
        path.write_text("")
    assert cli.run(["status", str(path), "--json"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"tuilaunch status: error: {path} holds no tuilaunch event: not a run's journal\n"


@pytest.mark.slow
@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv to read as another user",
)
def test_an_unreadable_journal_says_permission_denied() -> None:
    # Outside pytest's temp directory, which is closed to others: only the run's own modes
    # keep nobody out.
    tmp_path = Path(tempfile.mkdtemp(prefix="tuilaunch-eacces-", dir="/tmp"))
    try:
        _unreadable(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _unreadable(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal = run_dir / "journal.jsonl"
    journal.write_text('{"seq": 0, "kind": "notice", "level": "info", "message": "x"}\n')
    journal.chmod(0o600)
    tmp_path.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    env = base_env(XDG_RUNTIME_DIR=str(home), XDG_STATE_HOME=str(home), HOME=str(home))
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

    def status(target: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*as_nobody, PY, "-m", "tui_launch", "status", str(target)],
            env=env, cwd="/", capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    # The run directory is open, its journal is not: by the journal and by the directory.
    run_dir.chmod(0o755)
    for target in (journal, run_dir):
        out = status(target)
        assert out.returncode == 3 and out.stdout == "", out
        want = f"tuilaunch status: error: permission denied: cannot read {journal}\n"
        assert out.stderr == want, out
    # The directory itself is closed: the journal in it cannot even be looked for.
    run_dir.chmod(0o700)
    out = status(journal)
    assert out.returncode == 3, out
    assert out.stderr == f"tuilaunch status: error: permission denied: cannot read {journal}\n"


def _wait_listening(pid: int) -> runindex.Entry:
    def listening() -> runindex.Entry | None:
        for e in runindex.entries():
            if e.pid == pid and e.control and e.journal and os.path.exists(e.control):
                return e
        return None

    return wait_for(listening, 180, what="the run's control socket in the index")


@pytest.mark.timeout(600)
def test_progress_has_its_age_and_a_killed_launchers_ranks_are_lost(tuilaunch) -> None:
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "2",
        str(WORKERS / "stepper.py"), "--steps", "100000", "--interval", "0.05",
    )  # fmt: skip
    journal = str(_wait_listening(job.pid).journal)

    def records() -> list[dict[str, Any]]:
        return [e for e in live_journal(journal) if e["kind"] == "progress"]

    wait_for(records, 120, what="a progress record in the journal")
    # From the live run's socket: a sample of the last second or so.
    live = wait_for(
        lambda: (d := _status(str(job.pid)))["ranks"][0]["step"] and d, 60, what="a step"
    )
    assert live["source"] == "journal+socket"
    rank0 = live["ranks"][0]
    assert rank0["age_s"] is not None and 0 <= rank0["age_s"] < 5, rank0
    assert live["progress"]["age_s"] == rank0["age_s"]
    assert live["ranks"][1]["step"] is None and live["ranks"][1]["age_s"] is None
    # From the journal only: the last record's age, as old as that record is.
    before = time.time()
    doc = _status(str(job.pid), "--no-socket")
    after = time.time()
    last = records()[-1]
    mine = next(r for r in last["ranks"] if r["global_rank"] == 0)
    got = doc["ranks"][0]
    assert doc["source"] == "journal" and got["step"] == mine["step"]
    assert before - last["wall"] - 0.1 <= got["age_s"] <= after - last["wall"] + 0.1
    text = _tuilaunch("status", str(job.pid), "--no-socket")
    assert text.returncode == 0, text.stderr
    progress = next(line for line in text.stdout.splitlines() if "progress: step" in line)
    assert progress.endswith(" s ago)"), text.stdout
    assert f"step {mine['step']}/100000" in progress

    # The launcher SIGKILLed: the run is lost, and so are its ranks.
    pids = {r["local_rank"]: r["pid"] for r in doc["ranks"]}
    job.proc.send_signal(signal.SIGKILL)
    job.wait(60)
    doc = wait_for(lambda: (d := _status(os.path.dirname(journal)))["live"] is False and d, 60)
    assert doc["state"] == "lost" and doc["outcome"] is None
    assert [(r["pid"], r["state"]) for r in doc["ranks"]] == [(pids[0], "lost"), (pids[1], "lost")]
    text = _tuilaunch("status", os.path.dirname(journal))
    lines = text.stdout.splitlines()
    rows = lines[next(i for i, line in enumerate(lines) if "RANK" in line) + 1 :]
    assert [row.split()[3] for row in rows] == ["lost", "lost"], text.stdout


STEADY = """
import os, time
for i in range(100_000):
    print(f"step {i} " + "." * 500, flush=True)
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


@pytest.mark.timeout(300)
def test_after_a_full_disk_status_and_ls_agree(tuilaunch, tmp_path: Path, tmpfs: Path) -> None:
    script = tmp_path / "steady.py"
    script.write_text(STEADY)
    job = tuilaunch("--nproc-per-node", "1", "--log-dir", str(tmpfs / "logs"), str(script))
    journal = wait_for(
        lambda: next((tmpfs / "logs").glob("*/journal.jsonl"), None), 60, what="the journal"
    )
    wait_for(lambda: b'"workers_started"' in journal.read_bytes(), 60, what="workers")
    fill = subprocess.run(
        ["dd", "if=/dev/zero", f"of={tmpfs / 'fill'}", "bs=64k"], capture_output=True, text=True
    )
    assert "No space left" in fill.stderr
    assert job.wait(120) == 1, job.output[-3000:]
    assert b'"run_finished"' not in journal.read_bytes()  # the disk is still full
    entry = next(e for e in runindex.entries() if e.pid == job.pid)
    assert entry.ended is not None and entry.outcome == "failed" and entry.exit_code == 1
    listed = _tuilaunch("ls")
    assert listed.returncode == 0
    row = next(line for line in listed.stdout.splitlines() if f" {job.pid} " in line)
    assert row.startswith("ended (failed, exit 1)"), listed.stdout
    doc = _status(str(journal.parent))
    assert doc["live"] is False and doc["state"] == "failed", doc
    assert doc["outcome"]["outcome"] == "failed" and doc["outcome"]["exit_code"] == 1
    assert all(r["state"] in ("exited", "failed", "unknown") for r in doc["ranks"]), doc["ranks"]
    with contextlib.suppress(OSError):
        (tmpfs / "fill").unlink()
