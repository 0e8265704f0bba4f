"""Failure injection: the ``--inject`` spec language and the scheduler that fires it.

A spec is ``KIND[:key=value,...]``::

    kill:rank=1,after=10s                 SIGKILL global rank 1, 10 s into the attempt
    hang:rank=0,after=5s,for=20s          SIGSTOP it, SIGCONT 20 s later
    slow:rank=0,duty=50,period=1s         stopped half of every second: a straggler
    exit:rank=1,code=3                    the worker exits with status 3
    exception:rank=1,after=2s,message=x   RuntimeError("x") raised in its main thread
    node:after=30s                        this node's workers and its agent die at once

Keys common to every kind: ``rank`` (a global rank or ``random``; default 0), ``after`` (time
since the start of the attempt: ``500ms``, ``10s``, ``2m``; default 0s), ``attempt`` (only in that
attempt; default any), ``times`` (how many times in all, at most once per attempt; default 1).

:func:`parse_spec` checks a spec completely before anything starts (one :class:`InjectError`
naming the bad field); :class:`Injector` schedules the specs against each attempt and fires them
through its target, the run's fault executor (:mod:`.faults`, built before it, acting through
the control API's actions), so every injection is an event in the store and the journal;
:meth:`Injector.schedule` adds a spec given while the run goes on (the ``Inject`` command).
``exit`` and ``exception`` need the worker's cooperation, which :mod:`tui_launch.core.workers.shim`
provides without any change to the user's program (see there).
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tui_launch.core.launch.validate import MAX_SECONDS, UsageError, min_max_nodes

KINDS = ("kill", "hang", "slow", "exit", "exception", "node")
COMMON_KEYS: dict[str, str] = {"rank": "0", "after": "0s", "attempt": "any", "times": "1"}
# Each kind's own keys and their defaults, as shown in --help and the dashboard's menu.
KIND_KEYS: dict[str, dict[str, str]] = {
    "kill": {"signal": "SIGKILL"},
    "hang": {"for": "until continued"},
    "slow": {"duty": "50", "period": "1s", "for": "until the end"},
    "exit": {"code": "1"},
    "exception": {"message": "injected by tuilaunch"},
    "node": {},
}
KIND_HELP: dict[str, str] = {
    "kill": "send the rank a signal",
    "hang": "SIGSTOP the rank, SIGCONT after `for`",
    "slow": "stop the rank `duty` % of every `period`: a straggler",
    "exit": "the worker process exits with `code`",
    "exception": "raise a Python exception in the worker's main thread",
    "node": "this node's worker group and its agent die at once",
}
# Kinds that need tuilaunch's bootstrap in the worker (Python workers only).
SHIM_KINDS = frozenset({"exit", "exception"})
DEFAULT_MESSAGE = "injected by tuilaunch"
RANDOM = -1

_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class InjectError(ValueError):
    """A spec that cannot be used; the message names the spec and the field."""


@dataclass(frozen=True)
class InjectSpec:
    """One parsed ``--inject`` spec. ``rank`` is :data:`RANDOM` for ``rank=random``."""

    kind: str
    rank: int = 0
    after: float = 0.0
    attempt: int | None = None
    times: int = 1
    signal: str = "SIGKILL"
    duration: float | None = None  # the `for` key
    duty: float = 50.0
    period: float = 1.0
    code: int = 1
    message: str = DEFAULT_MESSAGE
    text: str = field(default="", compare=False)

    def canonical(self) -> str:
        """The spec written back with every key that differs from its default."""
        parts: list[str] = []
        parts.append("rank=random" if self.rank == RANDOM else f"rank={self.rank}")
        if self.after:
            parts.append(f"after={format_duration(self.after)}")
        if self.attempt is not None:
            parts.append(f"attempt={self.attempt}")
        if self.times != 1:
            parts.append(f"times={self.times}")
        if self.kind == "kill" and self.signal != "SIGKILL":
            parts.append(f"signal={self.signal}")
        if self.kind in ("hang", "slow") and self.duration is not None:
            parts.append(f"for={format_duration(self.duration)}")
        if self.kind == "slow":
            parts.append(f"duty={self.duty:g}")
            if self.period != 1.0:
                parts.append(f"period={format_duration(self.period)}")
        if self.kind == "exit":
            parts.append(f"code={self.code}")
        if self.kind == "exception" and self.message != DEFAULT_MESSAGE:
            parts.append(f"message={self.message}")  # last: it may hold commas
        return f"{self.kind}:{','.join(parts)}"


def format_duration(seconds: float) -> str:
    """``0.5`` -> ``500ms``, ``10`` -> ``10s``, ``120`` -> ``2m``."""
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def parse_duration(value: str) -> float:
    """``500ms``, ``10s``, ``2m``, ``1h`` or a bare number of seconds; ValueError otherwise."""
    m = _DURATION.match(value.strip().lower())
    if not m:
        raise ValueError(value)
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    # A timer given 1e20 s dies with an OverflowError in its thread: the injection would
    # silently never fire. Nothing a rehearsal means lies more than a year away.
    if not seconds <= MAX_SECONDS:
        raise ValueError(value)
    return seconds


def parse_signal(value: str) -> signal.Signals:
    """``SIGTERM``, ``TERM``, ``sigterm`` or ``15``; ValueError otherwise."""
    v = value.strip()
    if v.isdigit():
        return signal.Signals(int(v))
    name = v.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    sig = getattr(signal, name, None)
    if not isinstance(sig, signal.Signals):
        raise ValueError(value)
    return sig


def _split(body: str) -> list[tuple[str, str]]:
    # `message` may contain commas: a part without "=" continues the previous value.
    pairs: list[tuple[str, str]] = []
    for part in body.split(","):
        if "=" not in part and pairs and pairs[-1][0] == "message":
            key, value = pairs[-1]
            pairs[-1] = (key, f"{value},{part}")
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq:
            raise InjectError(f"'{key}' needs a value (key=value)")
        pairs.append((key, value if key == "message" else value.strip()))
    return pairs


def parse_spec(text: str) -> InjectSpec:
    """Parse and check one spec; :class:`InjectError` names the spec and the bad field."""
    try:
        return _parse(text)
    except InjectError as e:
        raise InjectError(f"--inject {text!r}: {e}") from None


def _parse(text: str) -> InjectSpec:
    kind, _, body = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise InjectError(f"unknown kind {kind!r} (choose from {', '.join(KINDS)})")
    allowed = [*COMMON_KEYS, *KIND_KEYS[kind]]
    values: dict[str, Any] = {}
    seen: set[str] = set()
    for key, value in _split(body) if body.strip() else []:
        if key not in allowed:
            raise InjectError(f"unknown key {key!r} for {kind} (keys: {', '.join(allowed)})")
        if key in seen:
            raise InjectError(f"key {key!r} given twice")
        seen.add(key)
        values.update(_value(key, value))
    if kind == "slow" and not 0 < values.get("duty", 50.0) < 100:
        raise InjectError(f"duty must be a percentage between 0 and 100, got {values['duty']:g}")
    return InjectSpec(kind=kind, text=text.strip(), **values)


def _value(key: str, value: str) -> dict[str, Any]:
    """One key's checked value, as InjectSpec's field(s)."""
    try:
        if key == "rank":
            if value.lower() == "random":
                return {"rank": RANDOM}
            rank = int(value)
            if rank < 0:
                raise ValueError(value)
            return {"rank": rank}
        if key in ("after", "for", "period"):
            seconds = parse_duration(value)
            if key == "period" and seconds <= 0:
                raise ValueError(value)
            return {"duration" if key == "for" else key: seconds}
        if key == "attempt":
            if value.lower() == "any":
                return {"attempt": None}
            n = int(value)
            if n < 0:
                raise ValueError(value)
            return {"attempt": n}
        if key == "times":
            n = int(value)
            if n < 1:
                raise ValueError(value)
            return {"times": n}
        if key == "signal":
            return {"signal": parse_signal(value).name}
        if key == "duty":
            return {"duty": float(value.rstrip("%"))}
        if key == "code":
            code = int(value)
            if not 0 <= code <= 255:
                raise ValueError(value)
            return {"code": code}
        if key == "message":
            if not value.strip():
                raise ValueError(value)
            return {"message": value}
    except ValueError:
        pass
    raise InjectError(f"bad {key} {value!r} ({_EXPECTED[key]})")


_EXPECTED = {
    "rank": "a global rank >= 0, or random",
    "after": "a duration such as 500ms, 10s, 2m; at most a year",
    "for": "a duration such as 500ms, 10s, 2m; at most a year",
    "period": "a duration > 0 such as 500ms, 1s; at most a year",
    "attempt": "an attempt number >= 0, or any",
    "times": "a count >= 1",
    "signal": "a signal name such as SIGTERM, SIGSEGV, SIGABRT, SIGINT",
    "duty": "a percentage between 0 and 100",
    "code": "an exit status 0-255",
    "message": "a non-empty text",
}


def parse_specs(texts: Iterable[str]) -> tuple[InjectSpec, ...]:
    """Parse every ``--inject``; the first bad one raises :class:`InjectError`."""
    return tuple(parse_spec(t) for t in texts)


def check_world_size(specs: Iterable[InjectSpec], world_size: int) -> None:
    """Raise :class:`InjectError` when a spec names a rank outside ``0..world_size-1``."""
    for s in specs:
        if s.rank != RANDOM and s.rank >= world_size:
            raise InjectError(
                f"--inject {s.text or s.canonical()!r}: rank {s.rank} is out of range "
                f"(world size {world_size}: ranks 0-{world_size - 1})"
            )


def validate_injections(args: argparse.Namespace, texts: tuple[str, ...]) -> None:
    """Check every ``--inject`` before anything starts. Raises
    :class:`~tui_launch.core.launch.validate.UsageError`.

    Ranks are checked against the world size here when it is already certain (a fixed
    number of nodes and workers); otherwise the runner checks them once the rendezvous is done.
    """
    try:
        specs = parse_specs(texts)
        if args.no_python:
            for s in specs:
                if s.kind in SHIM_KINDS:
                    raise InjectError(
                        f"--inject {s.text!r}: {s.kind} needs a Python worker, and --no-python "
                        f"runs {args.training_script} as a plain program (use kill, hang, slow "
                        f"or node)"
                    )
        lo, hi = min_max_nodes(args.nnodes)
        if lo == hi and str(args.nproc_per_node).isdigit():
            check_world_size(specs, hi * int(args.nproc_per_node))
    except InjectError as e:
        raise UsageError(str(e)) from None


def needs_shim(specs: Iterable[InjectSpec]) -> bool:
    """Whether any spec needs the worker bootstrap (``exit``, ``exception``)."""
    return any(s.kind in SHIM_KINDS for s in specs)


# ----------------------------------------------------------------------------- scheduler


class Target(Protocol):
    """What the scheduler acts on: :class:`~tui_launch.core.run.faults.FaultExecutor`."""

    def inject_fault(self, spec: InjectSpec, local_rank: int, fired: Fired) -> bool:
        """Fire ``spec`` on ``local_rank`` now; False if it could not (the rank is not running)."""
        ...

    def attempt_alive(self, attempt: int) -> bool:
        """Whether ``attempt`` is current and monitored (faults of an ended attempt are dropped)."""
        ...


@dataclass(frozen=True)
class Fired:
    """One firing of a spec: which spec, where and when (what the Injection event records)."""

    spec: InjectSpec
    attempt: int
    global_rank: int
    count: int  # 1 for the first firing of this spec
    source: str


@dataclass
class _Entry:
    spec: InjectSpec
    source: str
    from_now: float | None = None  # added live: the first firing counts `after` from here
    fired: int = 0
    last_attempt: int = -1


class Injector:
    """Schedules specs against each attempt; fires each at most once per attempt.

    The runner calls :meth:`attempt_started` when an attempt's workers are up and
    :meth:`attempt_ended` when they go; firing goes through ``target.inject_fault`` on a timer
    thread. ``rank=random`` draws come from one ``random.Random(seed)`` in a fixed order (spec
    order, at each attempt's start), so the same seed gives the same schedule.

    Args:
        specs: the ``--inject`` specs.
        seed: the seed of ``rank=random`` draws (None: a fresh one).
        target: what the injections act on (the run's fault executor, built before the
            injector; None: a schedule that fires nothing).
    """

    def __init__(
        self,
        specs: Sequence[InjectSpec] = (),
        seed: int | None = None,
        *,
        target: Target | None = None,
    ) -> None:
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._entries = [_Entry(s, "--inject") for s in specs]
        self._timers: list[threading.Timer] = []
        self._target = target
        self._attempt = -1
        self._t0 = 0.0
        self._ranks: dict[int, int] = {}  # global rank -> local rank on this node
        self._world_size = 0
        self._closed = False

    @property
    def specs(self) -> tuple[InjectSpec, ...]:
        """Every spec, command line first, then those added live."""
        with self._lock:
            return tuple(e.spec for e in self._entries)

    @property
    def cli_specs(self) -> tuple[InjectSpec, ...]:
        """The specs given on the command line (checked against the world size)."""
        with self._lock:
            return tuple(e.spec for e in self._entries if e.source == "--inject")

    @property
    def uses_random(self) -> bool:
        """Whether any spec draws its rank (and so depends on the seed)."""
        return any(s.rank == RANDOM for s in self.specs)

    def attempt_started(self, attempt: int, ranks: dict[int, int], world_size: int) -> None:
        """An attempt's workers are running: schedule every spec that applies to it."""
        with self._lock:
            self._cancel_locked()
            self._attempt, self._t0 = attempt, time.monotonic()
            self._ranks, self._world_size = dict(ranks), world_size
            for entry in self._entries:
                self._plan_locked(entry)

    def attempt_ended(self, attempt: int) -> None:
        """The attempt is over: pending firings for it are dropped."""
        with self._lock:
            if attempt == self._attempt:
                self._cancel_locked()
                self._attempt = -1

    def add(self, spec: InjectSpec, source: str = "dashboard") -> None:
        """Add a spec while the run goes on; its first ``after`` counts from now."""
        with self._lock:
            entry = _Entry(spec, source, from_now=time.monotonic())
            self._entries.append(entry)
            if self._attempt >= 0 and not self._closed:
                self._plan_locked(entry)

    def schedule(
        self,
        text: str,
        source: str,
        world_size: int,
        refusal: Callable[[str], str | None],
    ) -> tuple[bool, str]:
        """Parse ``text`` (an ``--inject`` spec) and schedule it now; ``after`` counts from now.

        ``world_size`` (0: not known yet) bounds its rank; ``refusal(kind)`` says why this run
        can never inject ``kind`` (None: it can). Returns (ok, message): the message says what
        was scheduled or why it was refused.
        """
        try:
            spec = parse_spec(text)
            if world_size:
                check_world_size([spec], world_size)
        except InjectError as e:
            return False, str(e)
        refused = refusal(spec.kind)
        if refused is not None:
            return False, refused
        self.add(spec, source)
        return True, f"scheduled {spec.canonical()}"

    def close(self) -> None:
        """The run is over: nothing fires any more."""
        with self._lock:
            self._closed = True
            self._cancel_locked()

    def _cancel_locked(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def _plan_locked(self, entry: _Entry) -> None:
        spec = entry.spec
        if self._closed or entry.fired >= spec.times or entry.last_attempt >= self._attempt:
            return
        if spec.attempt is not None and spec.attempt != self._attempt:
            return
        grank = spec.rank
        if grank == RANDOM:
            grank = self._rng.randrange(max(1, self._world_size))
        start = self._t0 if entry.from_now is None else max(self._t0, entry.from_now)
        delay = max(0.0, start + spec.after - time.monotonic())
        timer = threading.Timer(delay, self._fire, (entry, self._attempt, grank))
        timer.daemon = True
        timer.name = f"tuilaunch-inject-{spec.kind}"
        self._timers.append(timer)
        timer.start()

    def _fire(self, entry: _Entry, attempt: int, grank: int) -> None:
        with self._lock:
            if self._closed or attempt != self._attempt or entry.last_attempt >= attempt:
                return
            target = self._target
            if target is None or not target.attempt_alive(attempt):
                return
            entry.last_attempt = attempt
            entry.fired += 1
            fired = Fired(entry.spec, attempt, grank, entry.fired, entry.source)
            local = self._ranks.get(grank)
        if local is None:
            return  # the rank lives on another node, whose agent fires it
        target.inject_fault(entry.spec, local, fired)
