"""A report's marks: which events are moments on its time axis, and what each says.

A mark is made by the event type's mark maker, registered with :func:`marks` (as a reducer is
with ``@reduces`` and a line with ``@describes``); an event type without one is no mark. A
maker may still decline one event (a notice that is only information). The HTML and Markdown
renderers (:mod:`tui_launch.report`) draw and list them; :mod:`.report` collects them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tui_launch.core.model.events import (
    AttemptFailed,
    ControlAction,
    Event,
    EventTable,
    FlightRecorderVerdict,
    HangCleared,
    HangDetected,
    Injected,
    Notice,
    Restart,
    RunFinished,
    Shutdown,
    Slowdown,
    StacksDumped,
)
from tui_launch.core.model.progress import describe_slowdown
from tui_launch.core.model.text import failure_headline, fr_source

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Mark:
    """Something that happened, on the time axis: ``kind`` is ``failure``, ``restart``,
    ``injection``, ``hang``, ``hang-cleared``, ``control``, ``slowdown``, ``stacks``,
    ``shutdown``, ``notice`` or ``finished``; ``wall`` its wall-clock time."""

    wall: float
    kind: str
    attempt: int | None
    text: str


MarkMaker = Callable[[Any], Mark | None]
MARKS: EventTable[MarkMaker] = EventTable("mark maker")


def marks(
    kind: type[E],
) -> Callable[[Callable[[E], Mark | None]], Callable[[E], Mark | None]]:
    """Register the decorated function as the mark maker of ``kind``."""

    def register(fn: Callable[[E], Mark | None]) -> Callable[[E], Mark | None]:
        MARKS.add(kind, fn)
        return fn

    return register


def mark_of(e: Event) -> Mark | None:
    """The event as a mark on the time axis, if it is one."""
    fn = MARKS.get(type(e))
    return None if fn is None else fn(e)


@marks(AttemptFailed)
def _failure(e: AttemptFailed) -> Mark:
    real = [f for f in e.failures if not f.collateral] or list(e.failures)
    text = "; ".join(failure_headline(f) for f in real[:4])
    if len(real) > 4:
        text += f"; and {len(real) - 4} more"
    return Mark(e.wall, "failure", e.attempt, text)


@marks(Restart)
def _restart(e: Restart) -> Mark:
    text = (
        f"restart ({e.cause}): attempt {e.from_attempt} -> {e.to_attempt}, "
        f"{e.restarts_used} used, {e.budget_left} left"
    )
    return Mark(e.wall, "restart", e.to_attempt, text)


@marks(Injected)
def _injection(e: Injected) -> Mark:
    done = "" if e.ok else f" (not done: {e.detail})"
    who = f" on rank {e.global_rank}" if e.global_rank is not None else ""
    return Mark(
        e.wall, "injection", e.attempt, f"injected {e.spec}{who} ({e.count}/{e.times}){done}"
    )


@marks(HangDetected)
def _hang(e: HangDetected) -> Mark:
    return Mark(e.wall, "hang", e.attempt, f"hang: {e.confirmation}; {e.verdict}")


@marks(HangCleared)
def _hang_cleared(e: HangCleared) -> Mark:
    return Mark(e.wall, "hang-cleared", e.attempt, f"hang cleared ({e.why}) {e.detail}")


@marks(ControlAction)
def _control(e: ControlAction) -> Mark:
    who = f" rank {e.global_rank}" if e.global_rank is not None else ""
    ok = "" if e.ok else " (refused)"
    detail = f": {e.detail}" if e.detail else ""
    return Mark(e.wall, "control", None, f"{e.action}{who} by {e.source}{ok}{detail}")


@marks(Slowdown)
def _slowdown(e: Slowdown) -> Mark:
    return Mark(e.wall, "slowdown", e.attempt, describe_slowdown(e))


@marks(StacksDumped)
def _stacks(e: StacksDumped) -> Mark:
    return Mark(e.wall, "stacks", e.attempt, f"stacks dumped ({e.reason}): {e.verdict}")


@marks(FlightRecorderVerdict)
def _flight_recorder(e: FlightRecorderVerdict) -> Mark:
    return Mark(e.wall, "stacks", e.attempt, f"flight recorder ({fr_source(e)}): {e.verdict}")


@marks(Shutdown)
def _shutdown(e: Shutdown) -> Mark:
    sig = f" ({e.signal})" if e.signal else ""
    return Mark(e.wall, "shutdown", None, f"shutdown: {e.reason}{sig}")


@marks(Notice)
def _notice(e: Notice) -> Mark | None:
    if e.level not in ("warning", "error"):
        return None  # information: said in the event list, not a moment of the run
    return Mark(e.wall, "notice", None, f"{e.level}: {e.message}")


@marks(RunFinished)
def _finished(e: RunFinished) -> Mark:
    text = f"run {e.outcome}, exit code {e.exit_code}"
    return Mark(e.wall, "finished", None, text + (f": {e.message}" if e.message else ""))


__all__ = ["MARKS", "Mark", "MarkMaker", "mark_of", "marks"]
