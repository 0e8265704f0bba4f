"""Commands as data: every way a person, a client or an injection may act on a run.

A verb that acts on a run is defined once, as a frozen record here; the live run executes it
(:meth:`tui_launch.core.run.control.Control.execute`, behind
:meth:`~tui_launch.core.run.handle.RunHandle.execute`), the dashboard sends it
(``Source.send``), the control socket carries it as ``{"cmd": to_dict(cmd)}``, and the test
double simulates it. What a command may do in the run's current state is decided by one pure
function, :func:`allowed`, that the live run and the fake both call so that they cannot drift.

Every command carries ``source``: who asked ("dashboard", "api", "attach pid N uid M",
"inject, dashboard"...), journaled as the :class:`~tui_launch.core.model.events.ControlAction`'s
``source``. Those events are built here too (:func:`control_event`, :func:`refused_event`),
so a command and its journal line cannot disagree.

Pure: the standard library and the model only (no process is touched here).
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tui_launch.core.model.events import ControlAction, StacksDumped, from_dict, to_dict
from tui_launch.core.model.snapshot import LIVE_STATES, Phase

if TYPE_CHECKING:
    from tui_launch.core.model.store import Snapshot

NO_WORKER = "no running worker"
REPLAY_REFUSAL = "a replay acts on nothing"
# The runner's names for what a signal does to a rank (ControlAction.action); others: "signal".
SIGNAL_ACTIONS = {signal.SIGSTOP: "stop", signal.SIGCONT: "continue", signal.SIGKILL: "kill"}


@dataclass(frozen=True)
class Command:
    """The base of every command: ``kind`` names it on the wire (and in a refusal's
    ``ControlAction.action``); ``remote`` says whether the control socket accepts it."""

    kind: ClassVar[str] = "command"
    remote: ClassVar[bool] = True
    source: str = field(default="api", kw_only=True)

    @property
    def action(self) -> str:
        """The journaled ``ControlAction.action`` when the command is carried out."""
        return self.kind


@dataclass(frozen=True)
class RankCommand(Command):
    """A command aimed at one local rank of the current attempt."""

    local_rank: int


@dataclass(frozen=True)
class SignalRank(RankCommand):
    """Send ``sig`` to one local rank (SIGSTOP and SIGCONT go to its whole process group).
    Kill, terminate, stop and continue are all this command."""

    kind: ClassVar[str] = "signal"
    sig: int

    @property
    def action(self) -> str:
        """``kill``, ``stop``, ``continue``, or ``signal`` for any other signal."""
        return SIGNAL_ACTIONS.get(signal.Signals(self.sig), "signal")

    @property
    def signal_name(self) -> str:
        """The signal's name (``SIGKILL``), as journaled."""
        return signal.Signals(self.sig).name


@dataclass(frozen=True)
class ExitRank(RankCommand):
    """Make a Python worker exit with ``code`` (an order through the worker bootstrap)."""

    kind: ClassVar[str] = "exit"
    remote: ClassVar[bool] = False  # injections only: a client injects ``exit:...`` instead
    code: int


@dataclass(frozen=True)
class RaiseInRank(RankCommand):
    """Raise an exception with ``message`` in a Python worker's main thread (bootstrap)."""

    kind: ClassVar[str] = "exception"
    remote: ClassVar[bool] = False
    message: str


@dataclass(frozen=True)
class KillNode(Command):
    """SIGKILL this node's workers and the launcher itself, as if the machine had gone."""

    kind: ClassVar[str] = "node"
    remote: ClassVar[bool] = False


@dataclass(frozen=True)
class Restart(Command):
    """Restart the local worker group without spending the failure budget."""

    kind: ClassVar[str] = "restart"


@dataclass(frozen=True)
class Inject(Command):
    """Schedule an ``--inject`` spec now (its ``after`` counts from now)."""

    kind: ClassVar[str] = "inject"
    spec: str


@dataclass(frozen=True)
class DumpStacks(Command):
    """Dump every live local rank's stacks (takes seconds: never on a UI thread)."""

    kind: ClassVar[str] = "dump"
    reason: str = "api"


@dataclass(frozen=True)
class StopRun(Command):
    """Stop the whole job: ``sig`` to the workers, SIGKILL after the shutdown timeout."""

    kind: ClassVar[str] = "stop"
    sig: int = int(signal.SIGTERM)
    reason: str = "stop requested"


COMMAND_TYPES: dict[str, type[Command]] = {
    cls.kind: cls
    for cls in (SignalRank, ExitRank, RaiseInRank, KillNode, Restart, Inject, DumpStacks, StopRun)
}


@dataclass(frozen=True)
class Outcome:
    """What executing a command gave: ``ok``, a one-line ``detail`` (what was done or why
    not), and the dump a :class:`DumpStacks` produced."""

    ok: bool
    detail: str = ""
    dump: StacksDumped | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the control socket's answer); ``event``: the dump, as an event dict."""
        out: dict[str, Any] = {"ok": self.ok, "detail": self.detail}
        if self.dump is not None:
            out["event"] = to_dict(self.dump)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        """Rebuild an outcome from :meth:`to_dict` (an answer read off the socket)."""
        event = data.get("event")
        dump = from_dict(event) if isinstance(event, dict) else None
        return cls(
            ok=bool(data.get("ok")),
            detail=str(data.get("detail", "")),
            dump=dump if isinstance(dump, StacksDumped) else None,
        )


# ------------------------------------------------------------------ serialisation


def command_to_dict(cmd: Command) -> dict[str, Any]:
    """``cmd`` as a JSON-ready dict with its ``kind`` first (what the socket carries)."""
    return {"kind": cmd.kind, **dataclasses.asdict(cmd)}


_FIELD_TYPES: dict[str, type] = {"int": int, "str": str}


def command_from_dict(data: dict[str, Any]) -> Command:
    """Rebuild a command from :func:`command_to_dict`'s output. It may come from another
    process: ValueError names an unknown kind, a missing or unexpected field, a wrong type."""
    data = dict(data)
    kind = data.pop("kind", None)
    cls = COMMAND_TYPES.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown command {kind!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = set(data) - set(fields)
    if extra:
        raise ValueError(f"{kind}: unexpected field {sorted(extra)[0]!r}")
    for name, value in data.items():
        want = _FIELD_TYPES.get(str(fields[name].type))
        # bool is an int to isinstance, but a rank or a signal is never true or false.
        if want is not None and (not isinstance(value, want) or isinstance(value, bool)):
            raise ValueError(f"{kind}: {name} must be {want.__name__}, not {value!r}")
    try:
        return cls(**data)
    except TypeError as e:  # a field left out
        raise ValueError(f"{kind}: {e}") from None


# ------------------------------------------------------------------ permission


def allowed(snap: Snapshot, cmd: Command) -> str | None:
    """Whether ``cmd`` may act on a run in state ``snap``: None, or the one-line reason why
    not. The live run and the fake both ask this, so they refuse alike; the live run then
    still meets what the snapshot cannot know (a process already gone, no bootstrap)."""
    finished = snap.finished is not None
    if isinstance(cmd, RankCommand):
        row = snap.rank(cmd.local_rank)  # None: no such rank in this attempt
        if finished or row is None or row.state not in LIVE_STATES:
            return NO_WORKER
        return None
    if isinstance(cmd, Restart):
        if finished or snap.phase != Phase.RUNNING:
            return f"agent is {snap.phase}"
        return None
    if isinstance(cmd, DumpStacks):
        if finished or not any(r.state in LIVE_STATES for r in snap.ranks):
            return NO_WORKER
        return None
    # Inject (checked by parsing its spec), StopRun (a second one escalates; a finished run
    # ignores it) and KillNode (an injection's) are never refused for the run's state.
    return None


# ------------------------------------------------------------------ the journal


def control_event(
    cmd: Command,
    ok: bool,
    detail: str = "",
    *,
    global_rank: int | None = None,
    pid: int | None = None,
    stamp: dict[str, float] | None = None,
) -> ControlAction:
    """The :class:`ControlAction` that says ``cmd`` was carried out (or failed doing so);
    ``stamp``: its ``mono`` and ``wall`` (default: now; a fake's fixed clock)."""
    sig: str | None = None
    if isinstance(cmd, SignalRank):
        sig = cmd.signal_name
    elif isinstance(cmd, KillNode):
        sig = "SIGKILL"
    return ControlAction(
        action=cmd.action,
        local_rank=cmd.local_rank if isinstance(cmd, RankCommand) else None,
        global_rank=global_rank,
        pid=pid,
        signal=sig,
        source=cmd.source,
        ok=ok,
        detail=detail,
        **(stamp or {}),
    )


def refused_event(cmd: Command, reason: str, **stamp: float) -> ControlAction:
    """The :class:`ControlAction` of a command refused before it was looked into (a
    read-only connection): the whole run, named by the command's kind."""
    return ControlAction.on_run(cmd.kind, cmd.source, False, reason, **stamp)
