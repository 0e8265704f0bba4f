"""The FakeSource's control API answers as a live run does.

:class:`~tui_launch.testing.fake_source.FakeSource` simulates the runner's commands (which
signal is which action, a hang as a stop) so that the pilot and snapshot tests need no
processes; what each command may do it asks the same pure rule as the runner,
:func:`~tui_launch.core.model.commands.allowed`. This test keeps the two in step: the same
commands go to a :class:`~tui_launch.tui.sources.live.LiveSource` over a real
:class:`~tui_launch.core.run.runner.Runner` (two real CPU ranks of steady.py) and to a
FakeSource that is fed the live run's own events (so both see the same ranks in the same
states); ``allowed`` must judge both alike, and the
:class:`~tui_launch.core.model.events.ControlAction` events they post must agree on action,
signal, outcome, rank and source. Pids are not compared.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKEN_VAR, WORKERS, wait_for, wait_gone

from tui_launch.core.launch.args import parse
from tui_launch.core.model.commands import Command, DumpStacks, Restart, SignalRank, allowed
from tui_launch.core.model.events import ControlAction, Event
from tui_launch.core.model.store import RunStore, Snapshot
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner
from tui_launch.testing.fake_source import FakeSource
from tui_launch.tui.sources.live import LiveSource

STEADY = str(WORKERS / "steady.py")


class Mirror:
    """A FakeSource kept at the live run's state: it folds every event the live store has
    (except the live ControlActions: the fake posts its own)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.fake = FakeSource()
        self._seen = 0

    def sync(self) -> FakeSource:
        events = self.store.events(self._seen)
        self._seen += len(events)
        for event in events:
            if not isinstance(event, ControlAction):
                self.fake.post(event)
        return self.fake


def _controls(events: list[Event]) -> list[tuple[object, ...]]:
    return [
        (e.action, e.signal, e.ok, e.local_rank, e.source)
        for e in events
        if isinstance(e, ControlAction)
    ]


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Runner, RunStore]]:
    """A real Runner on two steady.py ranks, no failure budget; cleaned up afterwards."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_VAR, token)
    monkeypatch.setenv(SHARE_STORE_ENV, "x")  # restored afterwards, whatever the Runner sets
    monkeypatch.delenv(SHARE_STORE_ENV)
    argv = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0"]
    args, _ = parse([*argv, STEADY, "--seconds", "120"])
    store = RunStore()
    runner = Runner(args, store, RunConfig(echo=False, journal_path=str(tmp_path / "j.jsonl")))
    try:
        yield runner, store
    finally:
        if not runner.done:
            runner.stop()
            runner.wait(30)
        left = wait_gone(token, 10)
        assert left == [], f"workers left behind: {left}"


def _running(store: RunStore, runner: Runner, attempt: int) -> Snapshot:
    def ready() -> Snapshot | None:
        s = store.snapshot()
        if s.phase != "running" or s.attempt != attempt or len(s.ranks) != 2:
            return None
        if any(r.state != "running" for r in s.ranks) or runner.phase != "running":
            return None
        return s

    return wait_for(ready, 120, what=f"attempt {attempt} running")


def test_fake_and_live_sources_post_the_same_control_actions(
    live: tuple[Runner, RunStore],
) -> None:
    runner, store = live
    source = LiveSource(runner)
    mirror = Mirror(store)
    runner.start()
    _running(store, runner, 0)

    def both(cmd: Command) -> None:
        fake = mirror.sync()
        # One permission rule: judged on the same state, the two sources agree before acting.
        assert allowed(store.snapshot(), cmd) == allowed(fake.snapshot(), cmd), cmd
        got_live = source.send(cmd)
        got_fake = fake.send(cmd)
        assert (got_live.ok, got_live.detail) == (got_fake.ok, got_fake.detail), (
            cmd,
            got_live,
            got_fake,
        )

    both(SignalRank(0, signal.SIGSTOP, source="dashboard"))
    assert source.is_stopped(0) and mirror.fake.is_stopped(0)
    both(SignalRank(0, signal.SIGCONT, source="dashboard"))
    assert not source.is_stopped(0) and not mirror.fake.is_stopped(0)
    both(SignalRank(7, signal.SIGTERM, source="dashboard"))  # no such rank
    both(Restart(source="dashboard"))  # while the workers run: accepted, no budget spent
    _running(store, runner, 1)
    both(SignalRank(0, signal.SIGTERM, source="dashboard"))
    both(SignalRank(1, signal.SIGKILL, source="dashboard"))
    # No budget: the run fails. A rank that has exited is refused, and so is a restart.
    wait_for(lambda: runner.done, 120, what="the run to end")
    both(SignalRank(1, signal.SIGTERM, source="dashboard"))
    both(Restart(source="dashboard"))
    both(DumpStacks("key", source="dashboard"))  # no rank runs: refused by both

    live_actions = _controls(store.events())
    fake_actions = _controls(mirror.fake.events)
    assert live_actions == fake_actions
    assert [a[:3] for a in live_actions] == [
        ("stop", "SIGSTOP", True),
        ("continue", "SIGCONT", True),
        ("signal", "SIGTERM", False),
        ("restart", None, True),
        ("signal", "SIGTERM", True),
        ("kill", "SIGKILL", True),
        ("signal", "SIGTERM", False),
        ("restart", None, False),
        ("dump", None, False),
    ]


def test_fake_and_live_sources_stop_alike(live: tuple[Runner, RunStore]) -> None:
    """Quitting stops the run: outcome ``stopped``, exit code 128 + the signal, from both."""
    runner, store = live
    source = LiveSource(runner)
    mirror = Mirror(store)
    runner.start()
    _running(store, runner, 0)
    fake = mirror.sync()
    source.stop(signal.SIGTERM, "quit from the dashboard")
    fake.stop(signal.SIGTERM, "quit from the dashboard")
    code = source.wait(60)
    assert code == fake.wait() == 128 + signal.SIGTERM
    live_end, fake_end = store.snapshot().finished, fake.snapshot().finished
    assert live_end is not None and fake_end is not None
    assert (live_end.outcome, live_end.exit_code) == (fake_end.outcome, fake_end.exit_code)
    assert source.done and fake.done
