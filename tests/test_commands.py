"""Commands as data (:mod:`tui_launch.core.model.commands`): their wire form, the one
permission rule, and the control socket's handling of them, with no process started.

The live run and the fake are compared on the same commands in ``test_fake_conformance.py``;
the socket end to end in ``test_attach_control.py``.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any

import pytest

from tui_launch.core.model import commands as cmds
from tui_launch.core.model.commands import (
    COMMAND_TYPES,
    NO_WORKER,
    Command,
    DumpStacks,
    ExitRank,
    Inject,
    KillNode,
    Outcome,
    RaiseInRank,
    Restart,
    SignalRank,
    StopRun,
    allowed,
    command_from_dict,
    command_to_dict,
    control_event,
)
from tui_launch.core.model.events import ControlAction
from tui_launch.core.model.store import RunStore
from tui_launch.core.remote.controlsock import ControlServer
from tui_launch.testing import scenarios
from tui_launch.testing.builders import fake_dump, fake_dumped

# One of each command type, with every field away from its default.
SAMPLES: list[Command] = [
    SignalRank(1, signal.SIGSTOP, source="dashboard"),
    ExitRank(0, 7, source="inject"),
    RaiseInRank(2, "boom", source="inject, dashboard"),
    KillNode(source="inject"),
    Restart(source="attach pid 12 uid 1000"),
    Inject("hang:rank=1,for=10s", source="dashboard"),
    DumpStacks("key", source="dashboard"),
    StopRun(int(signal.SIGINT), "quit", source="api"),
]


def test_every_command_type_round_trips() -> None:
    assert {type(c) for c in SAMPLES} == set(COMMAND_TYPES.values()), "a sample per type"
    for cmd in SAMPLES:
        data = command_to_dict(cmd)
        assert next(iter(data)) == "kind" and data["kind"] == cmd.kind
        assert command_from_dict(data) == cmd
        assert hash(cmd) == hash(command_from_dict(data))  # frozen records


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"kind": "reboot"}, "unknown command 'reboot'"),
        ({}, "unknown command None"),
        ({"kind": "signal", "local_rank": "0", "sig": 9}, "local_rank must be int"),
        ({"kind": "signal", "local_rank": True, "sig": 9}, "local_rank must be int"),
        ({"kind": "signal", "local_rank": 0}, "sig"),
        ({"kind": "restart", "pid": 1}, "unexpected field 'pid'"),
        ({"kind": "inject", "spec": 3}, "spec must be str"),
    ],
)
def test_a_bad_command_is_a_value_error(data: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        command_from_dict(data)


def test_outcome_round_trips_with_its_dump() -> None:
    dump = fake_dump("key", [(0, 0, 100), (1, 1, 101)])
    event = fake_dumped(dump, "/runs/demo/stacks/000-key", "dashboard")
    for outcome in (Outcome(True), Outcome(False, "no running worker"), Outcome(True, "", event)):
        assert Outcome.from_dict(outcome.to_dict()) == outcome


def test_the_journaled_action_of_each_command() -> None:
    actions = {
        signal.SIGKILL: "kill",
        signal.SIGSTOP: "stop",
        signal.SIGCONT: "continue",
        signal.SIGTERM: "signal",
    }
    for sig, action in actions.items():
        event = control_event(SignalRank(3, sig, source="api"), True, global_rank=5, pid=9)
        assert (event.action, event.signal, event.local_rank, event.global_rank) == (
            action,
            sig.name,
            3,
            5,
        )
    node = control_event(KillNode(source="inject"), True, pid=4)
    assert (node.action, node.signal, node.pid) == ("node", "SIGKILL", 4)
    whole = control_event(Restart(source="dashboard"), False, "agent is restarting")
    assert whole == ControlAction.on_run(
        "restart", "dashboard", False, "agent is restarting", mono=whole.mono, wall=whole.wall
    )


# ------------------------------------------------------------------ the permission rule


def test_allowed_on_a_running_run() -> None:
    snap = scenarios.healthy(4).snapshot()
    assert allowed(snap, SignalRank(0, signal.SIGKILL)) is None
    assert allowed(snap, ExitRank(1, 3)) is None
    assert allowed(snap, Restart()) is None
    assert allowed(snap, DumpStacks()) is None
    assert allowed(snap, Inject("kill:rank=0")) is None
    assert allowed(snap, StopRun()) is None
    # No such rank.
    assert allowed(snap, SignalRank(9, signal.SIGTERM)) == NO_WORKER
    assert allowed(snap, RaiseInRank(9, "x")) == NO_WORKER


def test_allowed_on_a_failed_rank_a_restart_and_a_finished_run() -> None:
    failed = scenarios.failed_with_traceback().snapshot()
    gone = [r for r in failed.ranks if r.state not in cmds.LIVE_STATES]
    assert gone, "the scenario has a rank that is not running"
    assert allowed(failed, SignalRank(gone[0].local_rank, signal.SIGTERM)) == NO_WORKER

    restarting = scenarios.restarting().snapshot()
    assert restarting.phase != "running"
    assert allowed(restarting, Restart()) == f"agent is {restarting.phase}"

    done = scenarios.finished().snapshot()
    assert done.finished is not None
    assert allowed(done, SignalRank(0, signal.SIGTERM)) == NO_WORKER
    assert allowed(done, Restart()) == f"agent is {done.phase}"
    assert allowed(done, DumpStacks()) == NO_WORKER
    assert allowed(done, StopRun()) is None  # a finished run ignores it


def test_the_fake_refuses_what_allowed_refuses() -> None:
    src = scenarios.finished()
    outcome = src.send(SignalRank(0, signal.SIGKILL, source="dashboard"))
    assert outcome == Outcome(False, NO_WORKER)
    refusal = src.events[-1]
    assert isinstance(refusal, ControlAction)
    assert (refusal.action, refusal.ok, refusal.detail) == ("kill", False, NO_WORKER)
    assert src.send(DumpStacks("key", source="dashboard")) == Outcome(False, NO_WORKER)


# ------------------------------------------------------------------ the control socket


class StubRun:
    """The parts of a RunHandle the socket server uses; records what it executes."""

    def __init__(self) -> None:
        self.store = RunStore()
        self.executed: list[Command] = []
        self.run_dir = None
        self.done = False

    def execute(self, cmd: Command) -> Outcome:
        self.executed.append(cmd)
        return Outcome(
            not isinstance(cmd, Inject), "refused spec" if isinstance(cmd, Inject) else ""
        )

    def is_stopped(self, local_rank: int) -> bool:
        return False


def _controls(run: StubRun) -> list[ControlAction]:
    return [e for e in run.store.events() if isinstance(e, ControlAction)]


def test_the_socket_executes_a_command_as_the_peer_it_read() -> None:
    run = StubRun()
    server = ControlServer(run)  # type: ignore[arg-type]
    who = "attach pid 5 uid 1000"
    kill = SignalRank(1, signal.SIGKILL, source="dashboard")  # what the client says is ignored
    answer = server.handle({"cmd": command_to_dict(kill)}, who, control=True)
    assert answer == {"ok": True, "detail": ""}
    assert run.executed == [replace(kill, source=who)]
    # A stop and a dump are the socket's own: SIGTERM from the peer, a dump for "attach".
    server.handle({"cmd": command_to_dict(StopRun(source="x"))}, who, control=True)
    server.handle({"cmd": command_to_dict(DumpStacks("key"))}, who, control=True)
    assert run.executed[1:] == [
        StopRun(int(signal.SIGTERM), f"stop from {who}", source=who),
        DumpStacks("attach", source=who),
    ]
    # An injection is journaled here, refused or not (scheduling posts nothing itself).
    answer = server.handle({"cmd": command_to_dict(Inject("bogus"))}, who, control=True)
    assert answer == {"ok": False, "detail": "refused spec"}
    inject = _controls(run)[-1]
    assert (inject.action, inject.source, inject.ok) == ("inject", who, False)
    assert inject.detail == "bogus: refused spec"


def test_the_socket_refuses_read_only_bad_and_local_only_commands() -> None:
    run = StubRun()
    server = ControlServer(run)  # type: ignore[arg-type]
    who = "attach (read-only) pid 6 uid 1000"
    kill = command_to_dict(SignalRank(1, signal.SIGKILL))
    answer = server.handle({"cmd": kill}, who, control=False)
    assert answer["ok"] is False and "read-only" in answer["detail"]
    refusal = _controls(run)[-1]
    assert (refusal.action, refusal.source, refusal.ok) == ("signal", who, False)
    assert refusal.local_rank is None  # refused before it was looked into
    assert server.handle({"cmd": "status"}, who, control=False)["ok"] is True
    # Injections' own commands, a signal outside the socket's few, garbage: not executed.
    for bad in (
        {"cmd": command_to_dict(KillNode())},
        {"cmd": command_to_dict(ExitRank(0, 1))},
        {"cmd": command_to_dict(SignalRank(0, signal.SIGUSR1))},
        {"cmd": {"kind": "signal", "local_rank": "0", "sig": 9}},
        {"cmd": "signal"},
        {"cmd": 3},
    ):
        assert server.handle(bad, "attach pid 7 uid 1000", control=True)["ok"] is False, bad
    assert run.executed == []
