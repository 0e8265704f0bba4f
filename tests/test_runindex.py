"""The per-user run index and ``tuilaunch ls``: registration, clean-up, stale entries, privacy."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PY, WORKERS, base_env, wait_for

from tui_launch.core.remote import runindex
from tui_launch.core.remote.controlsock import ControlClient
from tui_launch.core.remote.runindex import Entry, Registration


@pytest.fixture
def runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $XDG_RUNTIME_DIR whose parent others may traverse (so only the index's own
    permissions keep them out)."""
    parent = Path(tempfile.mkdtemp(prefix="tl-index-"))
    parent.chmod(0o711)
    rt = parent / "run"
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(rt))
    yield rt
    shutil.rmtree(parent)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_register_update_and_end(runtime_dir: Path) -> None:
    reg = Registration.register(["tuilaunch", "train.py"], "job1")
    index = runtime_dir / "tuilaunch"
    assert _mode(index) == 0o700
    (live,) = index.iterdir()
    assert live.name.startswith("live-") and _mode(live) == 0o600
    (entry,) = runindex.entries()
    assert (entry.pid, entry.run_id, entry.argv) == (os.getpid(), "job1", ("tuilaunch", "train.py"))
    assert runindex.state(entry) == runindex.LIVE and entry.run_dir is None

    reg.set_run_dir("/tmp/some-run", "/tmp/some-run/journal.jsonl")
    (entry,) = runindex.entries()
    assert entry.run_dir == "/tmp/some-run" and entry.journal == "/tmp/some-run/journal.jsonl"

    reg.close("failed", 1)
    reg.close("succeeded", 0)  # idempotent: the first end counts
    (ended,) = index.iterdir()
    assert ended.name.startswith("ended-") and _mode(ended) == 0o600
    (entry,) = runindex.entries()
    assert runindex.state(entry) == runindex.ENDED
    assert (entry.outcome, entry.exit_code) == ("failed", 1)
    assert not list(index.glob(".*"))  # no temporary file left


def test_ended_records_are_pruned(runtime_dir: Path) -> None:
    for i in range(runindex.KEEP_ENDED + 5):
        reg = Registration.register(["tuilaunch", f"run{i}.py"], "x")
        reg._name = f"live-{i}.json"  # distinct runs of one process
        reg.close("succeeded", 0)
    ended = [e for e in runindex.entries() if runindex.state(e) == runindex.ENDED]
    assert len(ended) == runindex.KEEP_ENDED
    assert ended[0].argv[-1] == f"run{runindex.KEEP_ENDED + 4}.py"  # the newest are kept


def test_dead_pid_and_reused_pid_are_stale(runtime_dir: Path) -> None:
    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    dead = Entry(proc.pid, os.uname().nodename, "x", ("a",), 0.0, 1)
    assert runindex.state(dead, host=dead.host) == runindex.STALE
    me = runindex.proc_start_time(os.getpid())
    assert me is not None
    alive = Entry(os.getpid(), "h", "x", ("a",), 0.0, me)
    assert runindex.state(alive, host="h") == runindex.LIVE
    reused = Entry(os.getpid(), "h", "x", ("a",), 0.0, me + 1)  # same pid, other process
    assert runindex.state(reused, host="h") == runindex.STALE
    assert runindex.state(alive, host="another") == runindex.ELSEWHERE


def test_unsafe_directories_are_refused(runtime_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (runtime_dir / "tuilaunch").symlink_to(target)
    with pytest.raises(runindex.UnsafeIndexDir):
        runindex.index_dir()
    reg = Registration.register(["tuilaunch", "x.py"], "x")  # never raises: no entry
    assert reg.path is None and not list(target.iterdir())
    (runtime_dir / "tuilaunch").unlink()
    (runtime_dir / "tuilaunch").mkdir(mode=0o755)
    (runtime_dir / "tuilaunch").chmod(0o755)
    assert _mode(runindex.index_dir()) == 0o700  # ours but open: closed before use


def test_a_planted_symlink_is_not_written_through(runtime_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    index = runindex.index_dir()
    pid, start = os.getpid(), runindex.proc_start_time(os.getpid())
    (index / f"live-{pid}-{start}.json").symlink_to(victim)
    Registration.register(["tuilaunch", "x.py"], "x")
    assert victim.read_text() == "keep"
    assert not (index / f"live-{pid}-{start}.json").is_symlink()


def _ls(env: dict[str, str], *args: str, user: int | None = None) -> subprocess.CompletedProcess:
    cmd = [PY, "-m", "tui_launch", "ls", *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv"
)
def test_another_user_cannot_read_the_index(runtime_dir: Path) -> None:
    Registration.register(["tuilaunch", "secret.py"], "x")
    env = base_env(XDG_RUNTIME_DIR=str(runtime_dir), HOME="/nonexistent")
    env.pop("XDG_STATE_HOME", None)  # nobody's own index: under its (absent) home
    # As nobody: the entry's file cannot be opened, and `ls` refuses an index it does not own.
    entry = next((runtime_dir / "tuilaunch").iterdir())
    cat = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(entry)],
        capture_output=True,
        text=True,
    )
    assert cat.returncode != 0 and "Permission denied" in cat.stderr
    out = _ls(env, user=65534)
    assert "secret.py" not in out.stdout + out.stderr
    assert out.returncode == 0 and "no runs" in out.stdout  # its own (absent) index


@pytest.mark.slow
def test_ls_bad_input(runtime_dir: Path) -> None:
    out = _ls(base_env(XDG_RUNTIME_DIR=str(runtime_dir)), "--bogus")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert "unexpected argument" in out.stderr


def test_ls_shows_live_ended_and_stale_runs(runtime_dir: Path, tuilaunch) -> None:
    env = base_env(XDG_RUNTIME_DIR=str(runtime_dir))
    ticker = str(WORKERS / "ticker.py")
    ended = tuilaunch("--standalone", "--nproc-per-node", "1", ticker, "--ticks", "2", env=env)
    assert ended.wait() == 0
    args = ("--standalone", "--control-socket", "--nproc-per-node", "1", ticker, "--ticks")
    live = tuilaunch(*args, "600", env=env)
    doomed = tuilaunch(*args, "601", env=env)

    def registered() -> dict[int, Entry]:
        found = {e.pid: e for e in runindex.entries() if e.run_dir and e.control}
        return found if {live.pid, doomed.pid} <= set(found) else {}

    entries = wait_for(registered, 60, what="both launchers registered, listening for control")
    assert Path(entries[live.pid].run_dir or "").is_dir()
    assert Path(entries[live.pid].journal or "").is_file()
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    # A SIGKILLed launcher cannot remove its control socket; the next ls finds the run
    # stale, nobody answering on it, and removes it. The live run's socket stays.
    sockets = {pid: entries[pid].control or "" for pid in (live.pid, doomed.pid)}
    assert all(stat.S_ISSOCK(os.lstat(p).st_mode) for p in sockets.values())

    out = _ls(env)
    assert not os.path.exists(sockets[doomed.pid])
    assert stat.S_ISSOCK(os.lstat(sockets[live.pid]).st_mode)
    assert ControlClient(sockets[live.pid]).call("status")["ok"]
    # The stale entry is listed this once, marked pruned, and is gone from the index; its
    # run directory stays.
    assert [e for e in runindex.entries() if e.pid == doomed.pid] == []
    assert Path(entries[doomed.pid].run_dir or "").is_dir()
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert f" {live.pid} " in rows["live"] and "--ticks 600" in rows["live"]
    assert f" {doomed.pid} " in rows["stale"] and "--ticks 601" in rows["stale"]
    assert "stale (pruned)" in rows["stale"]
    assert f" {ended.pid} " in rows["ended"] and "(succeeded, exit 0)" in rows["ended"]
    assert entries[live.pid].run_dir in rows["live"]
    again = _ls(env)
    assert f" {doomed.pid} " not in again.stdout and f" {live.pid} " in again.stdout
    live.proc.send_signal(signal.SIGTERM)
    live.wait()
    assert [runindex.state(e) for e in runindex.entries() if e.pid == live.pid] == ["ended"]
    record = json.loads(next((runtime_dir / "tuilaunch").glob(f"ended-*-{live.pid}-*")).read_text())
    assert record["outcome"] == "preempted"  # SIGTERM: a preemption


def test_sweep_removes_only_sockets_of_stale_runs_that_nobody_answers(tmp_path: Path) -> None:
    from tui_launch.core.remote.controlsock import bind_private

    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    host = os.uname().nodename
    me = runindex.proc_start_time(os.getpid())
    listening = bind_private(str(tmp_path / "listening.sock"))
    listening.listen(1)
    for name in ("stale.sock", "mine.sock"):
        bind_private(str(tmp_path / name)).close()  # the file stays, nobody listens
    (tmp_path / "plain.sock").write_text("")
    try:
        found = runindex.sweep(
            [
                Entry(gone.pid, host, "a", ("x",), 0.0, 1, control=str(tmp_path / "stale.sock")),
                Entry(
                    gone.pid, host, "b", ("x",), 0.0, 1, control=str(tmp_path / "listening.sock")
                ),
                Entry(gone.pid, host, "c", ("x",), 0.0, 1, control=str(tmp_path / "plain.sock")),
                Entry(os.getpid(), host, "d", ("x",), 0.0, me, control=str(tmp_path / "mine.sock")),
            ],
            host=host,
        )
        assert [e.control is None for e in found] == [True, False, False, False]
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == ["listening.sock", "mine.sock", "plain.sock"]
    finally:
        listening.close()


def test_attach_finds_a_relative_log_dir_run_by_pid_and_standalone_run_id(
    runtime_dir: Path, tuilaunch, tmp_path: Path
) -> None:
    """A run started with a relative --log-dir in one directory is found from another (the
    entry's paths are absolute, from the launcher's cwd), by pid and by the run id the
    launcher shows (--standalone's random one, not the "none" torch's parser gives)."""
    from tui_launch.apps.attach import resolve_attach
    from tui_launch.core.remote.controlsock import find

    env = base_env(XDG_RUNTIME_DIR=str(runtime_dir))
    here = tmp_path / "launched-here"
    here.mkdir()
    job = tuilaunch(
        "--standalone", "--control-socket", "--log-dir", "logs", "--nproc-per-node", "1",
        str(WORKERS / "ticker.py"), "--ticks", "6000", cwd=here, env=env,
    )  # fmt: skip

    def registered() -> Entry | None:
        found = [e for e in runindex.entries() if e.pid == job.pid and e.journal and e.control]
        return found[0] if found else None

    entry = wait_for(registered, 120, what="the launcher's entry with its journal")
    journal = entry.journal or ""
    assert os.path.isabs(journal) and journal.startswith(str(here / "logs") + os.sep)
    wait_for(lambda: os.path.isfile(journal), 60, what="the journal")
    assert entry.run_dir == os.path.dirname(journal)
    assert os.getcwd() != str(here)  # resolved from elsewhere: this process's cwd
    assert resolve_attach(str(job.pid)) == journal
    shown = next(
        e["run_id"] for e in map(json.loads, Path(journal).read_text().splitlines())
        if e["kind"] == "run_started"
    )  # fmt: skip
    assert shown not in ("", "none") and entry.run_id == shown
    assert resolve_attach(shown) == journal
    assert find(shown) == (entry.control, journal)
    # The journal names the attempt's directory relative to the launcher (logs/...): the
    # attached dashboard, from here, still reads the ranks' lines.
    from tui_launch.core.journal.timeline import Timeline
    from tui_launch.tui.sources.attach import AttachSource

    def attached_lines() -> list[str]:
        src = AttachSource(Timeline(journal))
        return [t for t in src.logs.lines(0, "stdout") if t.startswith("tick ")]

    assert wait_for(attached_lines, 60, what="rank 0's lines in the attached dashboard")
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143


def test_attach_prunes_entries_of_dead_and_reused_pids(runtime_dir: Path) -> None:
    """``attach``'s sweep removes a live entry whose pid is gone or belongs to another
    process now (another start time), and keeps its run directory; a live run's stays."""
    from tui_launch.apps.attach import resolve_attach

    gone = subprocess.Popen([PY, "-c", "pass"])
    gone.wait()
    index = runindex.index_dir()
    me, start = os.getpid(), runindex.proc_start_time(os.getpid())
    assert start is not None
    run_dir = runtime_dir / "a-run"
    run_dir.mkdir()
    host = os.uname().nodename
    dead = Entry(gone.pid, host, "r1", ("x",), 1.0, 1, run_dir=str(run_dir))
    reused = Entry(me, host, "r2", ("x",), 2.0, start + 1, run_dir=str(run_dir))
    for e in (dead, reused):
        (index / f"live-{e.pid}-{e.proc_start}.json").write_text(e.to_json())
    mine = Registration.register(["tuilaunch", "x.py"], "r3")
    assert len(runindex.entries()) == 3
    with pytest.raises(ValueError, match="no live run 'r1' here"):
        resolve_attach("r1")
    assert [e.run_id for e in runindex.entries()] == ["r3"]
    assert run_dir.is_dir() and mine.path and os.path.exists(mine.path)
