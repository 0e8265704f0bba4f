"""The restart policy: after a failed attempt, restart or stop, and why (pure).

torchrun restarts every failure until ``--max-restarts`` is spent. The ``smart`` policy (the
default) stops early where a restart cannot help, in this order:

1. ``teardown``: every rank of the node either exited 0 or had its ``main`` return before it
   died: the work is done; the run ends "completed; rank N crashed in teardown" (exit 0).
2. ``startup``: a startup error before the first step: an ImportError, a SyntaxError, a
   missing script or module, bad arguments stop at once (the next attempt would fail the same
   way); a ``FileNotFoundError`` stops when the same one repeats on the next attempt (another
   rank may have been about to write the file).
3. injected or controlled failures (tuilaunch sent the signal) are restarted and not counted.
4. ``same-failure``: proof that a restart cannot help: the same exception as the attempt
   before (:func:`~tui_launch.core.model.failclass.fingerprint`: its type, its message with
   numbers and addresses masked, the innermost frame of the program's own code), at the same
   step, with no step gained between. Both attempts must have shown a step: "no step seen"
   is never "no progress". An exit code or a signal without a traceback, a backend or store
   error, a hang, an OOM is never "the same failure".
5. ``gpu-fault``: a GPU hardware fault (an uncorrectable ECC or NVLink error, a GPU fallen
   off the bus) in this attempt and in the one before it: the GPU did not recover across a
   restart, so the next attempt on this node fails the same way; the run ends with exit 75
   (infrastructure), and the scheduler can run it on a healthy node. One GPU fault is
   restarted: an ECC error the driver contained (Xid 94) needs only a new process.
6. ``storm`` (off unless ``--restart-storm N,MINUTES`` asks for it): N failures within MINUTES
   minutes with no step gained over them (every one of those attempts printed steps, and none
   got further than the first). It stops on a pattern, not on proof, so only on request.

``--restart-policy torchrun`` restarts as torchrun does. Every decision becomes a
:class:`~tui_launch.core.model.events.PolicyDecision` with the restarts it saved.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from tui_launch.core.model import failclass
from tui_launch.core.model.events import Failure
from tui_launch.core.model.failclass import FailureClass
from tui_launch.core.model.snapshot import pick_root_cause
from tui_launch.core.model.words import Word


class Policy(Word):
    """``--restart-policy``: tuilaunch's rules, or torchrun's (restart until the budget ends)."""

    SMART = "smart"
    TORCHRUN = "torchrun"


SMART, TORCHRUN = Policy.SMART, Policy.TORCHRUN
# The option's choices, in words.
POLICIES: tuple[str, ...] = tuple(p.value for p in Policy)
# Which of the smart policy's rules may stop a failure of each class before its budget is
# spent ("restart": none of them; the budget and the storm rule apply to every class).
# Every class has its row: tests/test_failclass.py goes through the enum.
RULES: dict[FailureClass, str] = {
    FailureClass.STARTUP: "startup",
    FailureClass.EXCEPTION: "same-failure",
    FailureClass.TEARDOWN: "teardown",
    FailureClass.CRASH: "restart",
    FailureClass.OOM: "restart",
    FailureClass.OOM_OUTSIDE: "restart",
    FailureClass.GPU_FAULT: "gpu-fault",
    FailureClass.SIGNAL: "restart",
    FailureClass.BACKEND: "restart",
    FailureClass.HANG: "restart",
    FailureClass.NODE_LOST: "restart",
    FailureClass.PREEMPTED: "restart",
    FailureClass.COLLATERAL: "restart",
}
STORM_FAILURES = 0  # the storm rule is off unless --restart-storm asks for it
STORM_MINUTES = 10.0
# A startup error that another rank or process may be about to fix (a file it writes): it
# stops only when the same one repeats.
RETRYABLE_STARTUP = frozenset({"FileNotFoundError"})


@dataclass(frozen=True)
class PolicyConfig:
    """``--restart-policy`` and ``--restart-storm N,MINUTES`` (N 0: no storm rule)."""

    mode: str = SMART
    storm_failures: int = STORM_FAILURES
    storm_minutes: float = STORM_MINUTES


@dataclass(frozen=True)
class AttemptRecord:
    """What the policy keeps of one failed attempt.

    ``cls``, ``signature`` (its :func:`~tui_launch.core.model.failclass.fingerprint`, "" when
    the evidence cannot prove sameness), ``etype`` (its exception's type, "" when none) and
    ``fail_step`` (the step its rank was at) are the root cause's; ``step`` the furthest step
    the attempt reached (None: none seen); ``deliberate``: tuilaunch itself caused it (an
    injection, a control); ``all_returned``: every rank's ``main`` returned (or it exited 0).
    """

    attempt: int
    time: float
    cls: str
    signature: str
    step: int | None
    deliberate: bool = False
    all_returned: bool = False
    fail_step: int | None = None
    etype: str = ""


@dataclass(frozen=True)
class Decision:
    """``restart`` or ``stop``, the rule that decided, and the reason in words."""

    action: str
    rule: str
    reason: str


class RestartPolicy:
    """Decides after each failed attempt (one instance per run, used on the agent thread)."""

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config or PolicyConfig()
        self._history: deque[AttemptRecord] = deque(maxlen=64)

    def decide(self, rec: AttemptRecord, budget_left: int) -> Decision:
        """The decision for the attempt ``rec`` with ``budget_left`` restarts left."""
        try:
            return self._decide(rec, budget_left)
        finally:
            if not rec.deliberate:
                self._history.append(rec)

    def _decide(self, rec: AttemptRecord, budget_left: int) -> Decision:
        if self.config.mode == TORCHRUN:
            if budget_left > 0:
                return Decision("restart", "torchrun", "torchrun's policy: restart every failure")
            return Decision("stop", "budget", "--max-restarts spent")
        rule = rule_of(rec.cls)
        if rule == "teardown" and rec.all_returned:
            return Decision(
                "stop", "teardown", "every rank's main returned: the work is done, not redone"
            )
        prev = self._history[-1] if self._history else None
        if rule == "startup":
            if rec.etype not in RETRYABLE_STARTUP:
                return Decision(
                    "stop", "startup", "a startup error: the next attempt would fail the same way"
                )
            if prev is not None and prev.cls == rec.cls and _same(prev, rec):
                return Decision(
                    "stop",
                    "startup",
                    f"the same {rec.etype} before the first step as attempt {prev.attempt}",
                )
        if budget_left <= 0:
            return Decision("stop", "budget", "--max-restarts spent")
        if rec.deliberate:
            return Decision("restart", "deliberate", "tuilaunch caused this failure itself")
        if rule == "gpu-fault" and prev is not None and prev.cls == rec.cls:
            return Decision(
                "stop",
                "gpu-fault",
                f"a GPU hardware fault again, as in attempt {prev.attempt}: the GPU did not "
                "recover across a restart (exit 75: run the job on another node)",
            )
        if prev is not None and _proven_same(prev, rec):
            return Decision(
                "stop",
                "same-failure",
                f"the same exception as attempt {prev.attempt} at step {rec.fail_step} "
                f"({_short(rec.signature)}), no step gained between",
            )
        n, minutes = self.config.storm_failures, self.config.storm_minutes
        if n > 0:
            recent = [r for r in self._history if rec.time - r.time <= minutes * 60] + [rec]
            steps = [r.step for r in recent[-n:]]
            # Only on evidence: every attempt of the window printed steps, and none got
            # further than the first (without progress lines, --max-restarts bounds it).
            if len(recent) >= n and None not in steps:
                known = [s for s in steps if s is not None]
                if max(known[1:]) <= known[0]:
                    return Decision(
                        "stop",
                        "storm",
                        f"{n} failures within {minutes:g} min with no step gained "
                        f"(steps reached: {', '.join(map(str, known))})",
                    )
        return Decision("restart", "restart", "a restart may fix it")


def attempt_record(
    attempt: int,
    failures: tuple[Failure, ...],
    *,
    time: float,
    step: int | None,
    exits: Mapping[int, int],
    local_ranks: Collection[int],
) -> AttemptRecord | None:
    """What the policy keeps of a failed attempt, from its classified failures (None: none).

    Args:
        attempt: the attempt.
        failures: its failures, classified (``failure_class`` and ``step`` set).
        time: when it failed (wall clock).
        step: the furthest step any rank reached in it (None: none seen).
        exits: the exit code of every local rank seen to exit.
        local_ranks: this node's local ranks in the attempt.
    """
    root = pick_root_cause(failures)
    if root is None:
        return None
    real = [f for f in failures if not f.collateral]
    # Every rank of this node finished its work: it exited 0, or it failed after its main
    # returned (a rank the agent killed before its main returned has not).
    failed = {f.local_rank for f in failures}
    all_returned = (
        bool(real)
        and all(f.failure_class == failclass.TEARDOWN for f in failures)
        and all(lr in failed or code == 0 for lr, code in exits.items())
        and set(local_ranks) <= set(exits) | failed
    )
    last = failclass.last_line(root.message, root.traceback, root.stderr_tail)
    return AttemptRecord(
        attempt=attempt,
        time=time,
        cls=failclass.TEARDOWN if all_returned else root.failure_class,
        signature=failclass.fingerprint(root.message, root.traceback, root.stderr_tail),
        # The step its rank was at; a rank that prints none fails where the attempt was.
        step=step,
        deliberate=bool(root.caused_by) and not root.hung,
        all_returned=all_returned,
        fail_step=root.step if root.step is not None else step,
        etype=failclass.exception_type(last),
    )


def rule_of(cls: str) -> str:
    """The rule of :data:`RULES` for a failure class ("restart" for none, or a word a newer
    journal has and this table does not)."""
    return RULES[FailureClass(cls)] if cls in failclass.CLASSES else "restart"


def _same(a: AttemptRecord, b: AttemptRecord) -> bool:
    """Both failed with the same exception, proven by a traceback of the program's code."""
    return bool(a.signature) and a.signature == b.signature


def _short(signature: str) -> str:
    """A fingerprint for the reason line: the frame's file without its directory."""
    return re.sub(r" @ .*/", " @ ", signature)[:200]


def _proven_same(prev: AttemptRecord, rec: AttemptRecord) -> bool:
    """``rec`` repeats ``prev``: the same exception at the same step, no step gained between.

    Only an exception proves it (an exit code, a signal, a backend or store error, a hang or an
    OOM is never "the same failure"), and only with a step seen in both attempts.
    """
    return (
        rec.cls == prev.cls
        and rule_of(rec.cls) == "same-failure"
        and _same(prev, rec)
        # The failed rank's step (its peers may run on by a few steps before they are stopped,
        # more or fewer each time): the same step, no step gained by it between.
        and rec.fail_step is not None
        and rec.fail_step == prev.fail_step
    )


def parse_storm(text: str) -> tuple[int, float]:
    """``N,MINUTES`` (or ``0``: off) as (failures, minutes); raises ValueError."""
    text = text.strip()
    if text in ("0", "off"):
        return 0, STORM_MINUTES
    n_text, sep, m_text = text.partition(",")
    n = int(n_text)
    minutes = float(m_text) if sep else STORM_MINUTES
    if n < 2 or minutes <= 0:
        raise ValueError(f"--restart-storm {text!r}: N must be >= 2 and MINUTES > 0 (or 0: off)")
    return n, minutes
