"""The restart policy: after a failed attempt, restart or stop, and why (pure).

torchrun restarts every failure until ``--max-restarts`` is spent. The ``smart`` policy (the
default) stops early where a restart cannot help, in this order:

1. ``teardown``: every rank of the node either exited 0 or had its ``main`` return before it
   died: the work is done; the run ends "completed; rank N crashed in teardown" (exit 0).
2. ``startup``: a startup error (ImportError, SyntaxError, a missing script or module, bad
   arguments) before the first step: the next attempt would fail the same way.
3. injected or controlled failures (tuilaunch sent the signal) are restarted and not counted.
4. ``same-failure``: the same exception (its last line and innermost frame) at the same step
   as the attempt before, with no step gained between.
5. ``storm``: ``storm_failures`` failures within ``storm_minutes`` minutes with no step gained
   over them: every one of those attempts printed steps, and none got further than the first
   (without progress lines there is no evidence, and ``--max-restarts`` alone bounds it).

``--restart-policy torchrun`` restarts as torchrun does. Every decision becomes a
:class:`~tui_launch.core.model.events.PolicyDecision` with the restarts it saved.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tui_launch.core.model import failclass

SMART = "smart"
TORCHRUN = "torchrun"
POLICIES = (SMART, TORCHRUN)
STORM_FAILURES = 3
STORM_MINUTES = 10.0


@dataclass(frozen=True)
class PolicyConfig:
    """``--restart-policy`` and ``--restart-storm N,MINUTES`` (N 0: no storm rule)."""

    mode: str = SMART
    storm_failures: int = STORM_FAILURES
    storm_minutes: float = STORM_MINUTES


@dataclass(frozen=True)
class AttemptRecord:
    """What the policy keeps of one failed attempt.

    ``cls``, ``signature`` and ``fail_step`` (the step its rank was at) are the root cause's;
    ``step`` the furthest step the attempt reached (None: none seen); ``deliberate``: tuilaunch
    itself caused it (an injection, a control); ``all_returned``: every rank's ``main``
    returned (or it exited 0).
    """

    attempt: int
    time: float
    cls: str
    signature: str
    step: int | None
    deliberate: bool = False
    all_returned: bool = False
    fail_step: int | None = None


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
        if rec.cls == failclass.TEARDOWN and rec.all_returned:
            return Decision(
                "stop", "teardown", "every rank's main returned: the work is done, not redone"
            )
        if rec.cls == failclass.STARTUP:
            return Decision(
                "stop", "startup", "a startup error: the next attempt would fail the same way"
            )
        if budget_left <= 0:
            return Decision("stop", "budget", "--max-restarts spent")
        if rec.deliberate:
            return Decision("restart", "deliberate", "tuilaunch caused this failure itself")
        prev = self._history[-1] if self._history else None
        if (
            prev is not None
            and rec.cls in failclass.PROGRAM | {failclass.OOM}
            and prev.signature == rec.signature
            and prev.fail_step == rec.fail_step
        ):
            at = f"step {rec.fail_step}" if rec.fail_step is not None else "no step seen"
            return Decision(
                "stop",
                "same-failure",
                f"the same failure as attempt {prev.attempt} ({at}), no progress between",
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
