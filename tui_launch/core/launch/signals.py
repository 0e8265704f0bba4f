"""Signal names on the command line (``--preempt-signals``) as signals."""

from __future__ import annotations

import signal


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _signal(name: str) -> signal.Signals | None:
    """``SIGUSR1``, ``USR1`` or ``10`` as a signal that can be handled (never KILL, STOP)."""
    upper = name.upper()
    try:
        sig = (
            signal.Signals(int(name))
            if name.isdigit()
            else signal.Signals[upper if upper.startswith("SIG") else "SIG" + upper]
        )
    except (KeyError, ValueError):
        return None
    return None if sig in (signal.SIGKILL, signal.SIGSTOP) else sig


def preempt_signals(text: str) -> tuple[signal.Signals, ...]:
    """``--preempt-signals`` as signals (checked by :func:`parse`)."""
    return tuple(s for s in (_signal(n) for n in _names(text)) if s is not None)


def unknown_signals(text: str) -> list[str]:
    """The names in ``--preempt-signals`` that are not a signal the launcher can handle."""
    return [n for n in _names(text) if _signal(n) is None]
