"""No orphans: whatever the workers started is gone when the run ends, however it ends.

Each case runs with the run's cgroup v2 (where this machine lets the launcher create one) and
with the fallback (``TUILAUNCH_CONTAINMENT=sweep``: child subreaper + sweep by the run token),
and finds what is left by the test token every process of the launch inherits.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import (
    PY,
    ROOT,
    WORKERS,
    Launch,
    _launch,
    base_env,
    leftovers,
    read_journal,
    tuilaunch_cmd,
    wait_for,
    wait_gone,
)

from tui_launch.core.workers import reaper

ORPHANER = str(WORKERS / "orphaner.py")


def _cgroup_ok() -> str | None:
    """None when this machine gives a launch its own cgroup, else why not."""
    c = reaper.contain("probe")
    c.remove()
    return None if c.cgroup else c.reason


@pytest.fixture(params=["cgroup", "sweep"])
def mode_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The launch's environment for one containment."""
    if request.param == "cgroup":
        why = _cgroup_ok()
        if why:
            pytest.skip(f"no cgroup v2 for the launcher here: {why}")
        return base_env()
    return base_env(**{reaper.CONTAINMENT_VAR: "sweep"})


def _children(out: Path, n: int) -> list[int]:
    return wait_for(
        lambda: (
            [int((out / f"child_{r}").read_text()) for r in range(n)]
            if all((out / f"child_{r}").exists() for r in range(n))
            else None
        ),
        60,
        what="the workers' children",
    )


def _note(journal: Path, needle: str) -> str | None:
    if not journal.exists():
        return None
    for rec in read_journal(journal) if journal.read_text().endswith("\n") else []:
        for text in [rec.get("message", ""), *rec.get("notes", [])]:
            if needle in str(text):
                return str(text)
    return None


def test_child_ignoring_sigterm_is_gone_after_a_normal_end(tuilaunch, tmp_path, mode_env):
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "2", ORPHANER, str(tmp_path), "term", "exit",
        env=mode_env,
    )  # fmt: skip
    assert launch.wait() == 0, launch.output
    kids = _children(tmp_path, 2)
    assert wait_gone(launch.token, 10) == [], f"children {kids} outlived the run"
    assert "no orphans:" in launch.output
    assert "killed 2 process(es) left by the workers" in launch.output, launch.output[-3000:]


def test_child_ignoring_sigterm_is_gone_after_a_sigterm_stop(tuilaunch, tmp_path, mode_env):
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "2", ORPHANER, str(tmp_path), "term", "sleep",
        env=mode_env,
    )  # fmt: skip
    kids = _children(tmp_path, 2)
    os.kill(launch.pid, signal.SIGTERM)
    assert launch.wait() != 0
    assert wait_gone(launch.token, 10) == [], f"children {kids} outlived the stop"


def test_setsid_child_is_gone_after_sigkill_of_the_launcher(tuilaunch, tmp_path, mode_env):
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "2", ORPHANER, str(tmp_path), "setsid", "sleep",
        env=mode_env,
    )  # fmt: skip
    kids = _children(tmp_path, 2)
    os.kill(launch.pid, signal.SIGKILL)
    launch.wait()
    assert wait_gone(launch.token, 15) == [], f"setsid children {kids} outlived the launcher"


def _reaper_pid(launcher: int) -> int | None:
    for pid in leftovers_children(launcher):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tuilaunch-reaper" in cmd:
            return pid
    return None


def leftovers_children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def test_killed_reaper_is_restarted_and_a_later_sigkill_leaves_nothing(
    tuilaunch, tmp_path, mode_env
):
    journal = tmp_path / "journal.jsonl"
    launch = tuilaunch(
        "--journal", str(journal), "--standalone", "--nproc-per-node", "2",
        ORPHANER, str(tmp_path), "setsid", "sleep",
        env=mode_env,
    )  # fmt: skip
    kids = _children(tmp_path, 2)
    first = wait_for(lambda: _reaper_pid(launch.pid), 30, what="the reaper")
    os.kill(first, signal.SIGKILL)
    line = wait_for(lambda: _note(journal, "restarted as pid"), 30, what="the reaper's notice")
    assert f"pid {first}" in line
    second = _reaper_pid(launch.pid)
    assert second is not None and second != first
    os.kill(launch.pid, signal.SIGKILL)
    launch.wait()
    assert wait_gone(launch.token, 15) == [], f"workers/children {kids} outlived the launcher"


def _pids_cgroup(tmp_name: str) -> Path | None:
    base = Path("/sys/fs/cgroup/pids")
    if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        return None
    path = base / tmp_name
    try:
        path.mkdir()
    except OSError:
        return None
    return path


def test_partial_start_under_a_pids_limit_leaves_no_worker(launches, tmp_path, mode_env):
    # A pids limit of 60 and 100 workers: torch's start fails part way, with dozens of
    # workers running already; the launcher's end must take them with it.
    cg = _pids_cgroup(f"tuilaunch-test-{os.getpid()}-{tmp_path.name}")
    if cg is None:
        pytest.skip("no writable cgroup v1 pids controller (/sys/fs/cgroup/pids) for a limit")
    try:
        (cg / "pids.max").write_text("60")
        cmd = [
            "/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cg / "cgroup.procs"),
            *tuilaunch_cmd("--standalone", "--nproc-per-node", "100", "--no-python",
                           PY, "-S", "-c", "import time; time.sleep(600)"),
        ]  # fmt: skip
        launch: Launch = _launch(cmd, ROOT, mode_env)
        launches.append(launch)
        assert launch.wait(180) != 0, launch.output
        assert wait_gone(launch.token, 15) == [], launch.output[-2000:]
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip(), 10, what="empty")
        cg.rmdir()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_launcher_killed_with_its_reaper_leaves_a_cgroup_the_next_ls_ends(tuilaunch, tmp_path):
    """Issue 32: the launcher and its reaper SIGKILLed together leave the workers in the run's
    cgroup; the next ``tuilaunch ls`` kills them and removes the cgroup (and, while the
    launcher lived, left both alone)."""
    why = _cgroup_ok()
    if why:
        pytest.skip(f"no cgroup v2 for the launcher here: {why}")
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "2", ORPHANER, str(tmp_path), "term", "sleep",
        env=base_env(),
    )  # fmt: skip
    kids = _children(tmp_path, 2)
    reaper_pid = wait_for(lambda: _reaper_pid(launch.pid), 30, what="the reaper")
    parent = Path(str(reaper.cgroup2_dir()[0]))
    cgroup = wait_for(
        lambda: next(iter(parent.glob(f"tuilaunch-{launch.pid}-*")), None), 30, what="cgroup"
    )

    def ls() -> None:
        done = subprocess.run(
            [PY, "-m", "tui_launch", "ls"], env=base_env(), cwd=ROOT, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    ls()  # a live launcher's cgroup: untouched
    assert cgroup.is_dir() and all(_running(k) for k in kids)
    # Both stopped first: neither sees the other die (the launcher would start a new reaper,
    # the reaper would sweep).
    for pid in (launch.pid, reaper_pid):
        os.kill(pid, signal.SIGSTOP)
    for pid in (reaper_pid, launch.pid):
        os.kill(pid, signal.SIGKILL)
    launch.wait()
    wait_for(lambda: not _running(reaper_pid), 30, what="the reaper's end")
    left = leftovers(launch.token)
    assert set(kids) <= set(left) and len(left) >= 4, left  # 2 workers and their children
    assert cgroup.is_dir()
    ls()
    assert wait_gone(launch.token, 15) == [], "the next ls left the dead launcher's workers"
    assert not cgroup.exists()
