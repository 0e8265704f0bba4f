"""The Runner's control API, in-process: stop/continue/kill one rank, restart, stop the run.

Each test runs torch's real agent on the Runner's thread with real steady.py workers. The test
process gets a unique token in its environment so that the workers can be found afterwards.
"""

from __future__ import annotations

import signal
import threading
import time
import types
import uuid
from pathlib import Path

import pytest
from conftest import (
    TOKEN_VAR,
    WORKERS,
    leftovers,
    needs_shutdown_timeout,
    read_journal,
    wait_for,
    wait_gone,
)

from tui_launch.core.launch.args import parse
from tui_launch.core.model import commands
from tui_launch.core.model.commands import SignalRank
from tui_launch.core.model.events import RankExited, Restart, WorkersStarted
from tui_launch.core.model.store import RunStore
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner

# Every test drives a real Runner with worker processes.
pytestmark = pytest.mark.slow

STEADY = str(WORKERS / "steady.py")


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fp:
        return fp.read().rsplit(")", 1)[1].split()[0]


def _restart_log(path: Path) -> list[tuple[int, int, int]]:
    if not path.exists():
        return []
    return [
        tuple(int(x) for x in ln.split())  # type: ignore[misc]
        for ln in path.read_text().splitlines()
        if len(ln.split()) == 3
    ]


def _last_step(h: Harness, local_rank: int) -> int:
    """The last ``rank R step N`` that ``local_rank`` wrote to its stdout log (-1: none yet)."""
    started = h.events(WorkersStarted)
    if not started:
        return -1
    path = Path(started[-1].log_dir) / str(local_rank) / "stdout.log"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return -1
    steps = [int(ln.split()[-1]) for ln in lines if ln.startswith("rank ") and " step " in ln]
    return steps[-1] if steps else -1


class Harness:
    """A Runner on steady.py with its store, journal and restart log."""

    def __init__(self, tmp_path: Path, *launch_args: str, seconds: int = 60) -> None:
        self.rlog = tmp_path / "restarts.log"
        self.journal = tmp_path / "j.jsonl"
        args, _ = parse(
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                *launch_args,
                STEADY,
                "--seconds",
                str(seconds),
                "--restart-log",
                str(self.rlog),
            ]
        )
        self.args = args
        self.store = RunStore()
        self.runner = Runner(
            args, self.store, RunConfig(echo=False, journal_path=str(self.journal))
        )

    def start(self) -> None:
        self.runner.start()

    def running_attempt(self, attempt: int, timeout: float = 90):
        """Wait until ``attempt``'s two ranks run and both wrote their restart-log line."""

        def ready():
            s = self.store.snapshot()
            if s.phase != "running" or s.attempt != attempt or len(s.ranks) != 2:
                return None
            if any(r.state != "running" for r in s.ranks):
                return None
            lines = [ln for ln in _restart_log(self.rlog) if ln[1] == attempt]
            return s if len(lines) == 2 else None

        return wait_for(ready, timeout, what=f"attempt {attempt} running")

    def events(self, cls):
        return [e for e in self.store.events() if isinstance(e, cls)]


@pytest.fixture
def harness_env(monkeypatch):
    """Isolate what Runner.start() changes in this process's environment."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    # Record the variable's current state, then remove it so the Runner sets it itself;
    # monkeypatch restores the original state (set or unset) afterwards.
    monkeypatch.setenv(SHARE_STORE_ENV, "x")
    monkeypatch.delenv(SHARE_STORE_ENV)
    made: list[Harness] = []
    yield token, made
    for h in made:
        if not h.runner.done:
            h.runner.stop()
            h.runner.stop()
            h.runner.wait(30)
    left = wait_gone(token, 10)
    assert left == [], f"workers left behind: {left}"


def test_stop_continue_restart_and_stop(tmp_path, harness_env):
    token, made = harness_env
    h = Harness(tmp_path, "--max-restarts", "2")
    made.append(h)
    h.start()
    snap = h.running_attempt(0)
    assert snap.budget_left == 2
    pid0 = snap.rank(0).pid
    pid1 = snap.rank(1).pid
    import os

    assert os.environ[SHARE_STORE_ENV] == "1"

    # SIGSTOP one rank: the snapshot shows it stopped, and so does the kernel.
    assert h.runner.execute(SignalRank(0, signal.SIGSTOP)).ok is True
    assert h.store.snapshot().rank(0).state == "stopped"
    assert h.store.snapshot().rank(1).state == "running"
    wait_for(lambda: _proc_state(pid0) == "T", 5, what="rank 0 in state T")
    assert h.runner.is_stopped(0)

    # SIGCONT: running again, in the snapshot and in the kernel.
    assert h.runner.execute(SignalRank(0, signal.SIGCONT)).ok is True
    assert h.store.snapshot().rank(0).state == "running"
    wait_for(lambda: _proc_state(pid0) != "T", 5, what="rank 0 continued")
    assert not h.runner.is_stopped(0)
    # Nothing failed: rank 0 takes more all_reduce steps after SIGCONT (so rank 1 is alive
    # and in step with it), and the group is still running with no rank exited.
    after = _last_step(h, 0)
    wait_for(lambda: _last_step(h, 0) >= after + 2, 30, what="rank 0 stepping again")
    assert h.store.snapshot().phase == "running"
    assert h.events(RankExited) == []

    # A manual restart: new processes with the next restart count, no budget spent.
    assert h.runner.execute(commands.Restart()).ok is True
    snap = h.running_attempt(1)
    restarts = h.events(Restart)
    assert len(restarts) == 1
    assert restarts[0].cause == "manual"
    assert restarts[0].budget_left == 2
    assert snap.manual_restarts == 1
    assert snap.failure_restarts == 0
    assert snap.budget_left == snap.max_restarts == 2
    new_pids = {snap.rank(0).pid, snap.rank(1).pid}
    assert new_pids.isdisjoint({pid0, pid1})
    counts = sorted((r, c) for r, c, _ in _restart_log(h.rlog))
    assert counts == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {p for _, c, p in _restart_log(h.rlog) if c == 1} == new_pids

    # Stop the run: 128 + SIGTERM, and nothing is left.
    h.runner.stop()
    assert h.runner.wait(30) == 143
    assert h.store.snapshot().finished.outcome == "stopped"
    assert wait_gone(token, 10) == []
    kinds = [e["kind"] for e in read_journal(h.journal)]
    assert kinds.count("control") == 3  # stop, continue, restart
    assert kinds[-1] == "run_finished"


def test_kill_rank_spends_budget_and_names_tuilaunch(tmp_path, harness_env):
    token, made = harness_env
    h = Harness(tmp_path, "--max-restarts", "1")
    made.append(h)
    h.start()
    snap = h.running_attempt(0)
    pid0, pid1 = snap.rank(0).pid, snap.rank(1).pid

    # Nothing to signal on a rank that does not exist.
    assert h.runner.execute(SignalRank(5, signal.SIGUSR1)).ok is False
    assert h.store.snapshot().controls[-1].ok is False

    # Rank 0 is SIGSTOPped when rank 1 dies: torch's SIGTERM to it must not wait for the
    # 30 s shutdown timeout (the runner continues stopped ranks before torch tears down).
    assert h.runner.execute(SignalRank(0, signal.SIGSTOP)).ok
    wait_for(lambda: _proc_state(pid0) == "T", 5, what="rank 0 stopped")
    t0 = time.monotonic()
    assert h.runner.execute(SignalRank(1, signal.SIGKILL)).ok is True
    snap = h.running_attempt(1)
    assert time.monotonic() - t0 < 25
    restarts = h.events(Restart)
    assert [(r.cause, r.budget_left) for r in restarts] == [("failure", 0)]
    assert snap.failure_restarts == 1 and snap.manual_restarts == 0
    assert snap.budget_left == 0
    rc = snap.root_cause
    assert rc is not None
    assert rc.global_rank == 1 and rc.pid == pid1
    assert rc.exit_code == -9 and rc.signal == "SIGKILL"
    assert rc.caused_by and "SIGKILL" in rc.caused_by and "tuilaunch" in rc.caused_by
    assert not rc.collateral
    peer = next((f for f in snap.failures if f.global_rank == 0), None)
    assert peer is not None, (snap.failures, snap.ranks)
    assert peer.collateral and peer.pid == pid0
    assert {pid0, pid1}.isdisjoint({r.pid for r in snap.ranks})
    assert not h.runner.is_stopped(0)  # the new attempt's rank 0 is not stopped
    assert len(h.events(WorkersStarted)) == 2

    h.runner.stop()
    assert h.runner.wait(30) == 143
    assert wait_gone(token, 10) == []


@needs_shutdown_timeout
def test_restart_and_stop_while_a_rank_is_stopped_are_prompt(tmp_path, harness_env):
    """Ranks paused with a SIGSTOP command are continued before torch's own SIGTERM.

    Otherwise the SIGTERM stays pending: a restart would wait torch's hard-coded 30 s and
    stop() the whole --shutdown-timeout before SIGKILL (a bug fixed in 66d7f22).
    """
    token, made = harness_env
    h = Harness(tmp_path, "--max-restarts", "1", "--shutdown-timeout", "12")
    made.append(h)
    h.start()
    snap = h.running_attempt(0)
    pid0 = snap.rank(0).pid
    assert h.runner.execute(SignalRank(0, signal.SIGSTOP)).ok
    wait_for(lambda: _proc_state(pid0) == "T", 5, what="rank 0 stopped")
    assert h.runner.execute(commands.Restart()).ok
    # steady.py dies at once on SIGTERM when it can run: a new attempt in seconds, not 30.
    snap = h.running_attempt(1, timeout=15)

    pid0 = snap.rank(0).pid
    assert h.runner.execute(SignalRank(0, signal.SIGSTOP)).ok
    wait_for(lambda: _proc_state(pid0) == "T", 5, what="rank 0 stopped")
    t0 = time.monotonic()
    h.runner.stop()
    code = h.runner.wait(40)
    elapsed = time.monotonic() - t0
    assert code == 143
    assert wait_gone(token, 10) == []
    assert elapsed < 8, f"stop took {elapsed:.1f}s with a SIGSTOPped rank"


@needs_shutdown_timeout
def test_stop_during_a_slow_restart_starts_no_new_workers(tmp_path, harness_env):
    """stop() while the agent is blocked inside torch (a restart waiting for workers that
    ignore SIGTERM): the stop watchdog ends the run, and the agent thread must not go on to
    spawn a new attempt's workers afterwards (in the CLI those were orphans: the reaper had
    already said goodbye; fixed in 66d7f22).
    """
    token, made = harness_env
    ready = tmp_path / "ready.log"
    args, _ = parse(
        [
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--shutdown-timeout",
            "2",
            str(WORKERS / "stubborn.py"),
            "--ready",
            str(ready),
        ]
    )
    store = RunStore()
    runner = Runner(args, store, RunConfig(echo=False, journal_path=str(tmp_path / "j.jsonl")))
    h = types.SimpleNamespace(runner=runner)
    made.append(h)
    runner.start()

    def ready_pids():
        s = store.snapshot()
        lines = ready.read_text().splitlines() if ready.exists() else []
        return s.phase == "running" and len(lines) == 2 and [r.pid for r in s.ranks]

    first = wait_for(ready_pids, 60, what="stubborn workers ready")
    # The workers ignore SIGTERM: torch's restart waits (30 s) in its own shutdown.
    assert runner.execute(commands.Restart()).ok
    wait_for(lambda: store.snapshot().phase == "restarting", 10, what="restart under way")
    time.sleep(1.0)
    runner.stop()
    assert runner.wait(30) == 143
    finished_at = len(store.events())
    # The agent thread leaves torch's restart once the workers are gone; from then on it can
    # spawn nothing. Wait for that end, not for a guessed time.
    agent = next((t for t in threading.enumerate() if t.name == "tuilaunch-agent"), None)
    if agent is not None:
        agent.join(60)
        assert not agent.is_alive(), "the agent thread is still inside torch"
    late = [e for e in store.events()[finished_at:] if isinstance(e, WorkersStarted)]
    assert late == [], f"workers started after the run finished: {late}"
    assert set(first).isdisjoint(leftovers(token))
