"""The misbehaviour hooks every corpus program calls once per training step.

Environment (read once, at import):

* ``CORPUS_HANG_RANK=r CORPUS_HANG_STEP=k``: rank ``r`` enters :func:`wandered_off` at step
  ``k`` and sleeps there forever, while the other ranks go on into the step's collective.
* ``CORPUS_RAISE_RANK=r CORPUS_RAISE_STEP=k``: rank ``r`` raises ``RuntimeError`` at step ``k``.
* ``CORPUS_KILL_RANK=r CORPUS_KILL_STEP=k``: rank ``r`` dies of ``SIGKILL`` at step ``k`` (what
  the OOM killer or a lost node does to a rank: no exception, no last words).
* ``CORPUS_STEP_SECONDS=s``: every step takes at least ``s`` seconds, the rest of it asleep (a
  slow input pipeline): a run long enough to be watched mid-run costs few steps of compute.

A step is the program's global optimizer step, counted from 0 (across epochs). ``RANK`` is the
global rank torchrun (or tuilaunch) set; without it the program is rank 0.
"""

from __future__ import annotations

import os
import signal
import time


def _target(prefix: str) -> tuple[int, int] | None:
    rank = os.environ.get(f"{prefix}_RANK")
    step = os.environ.get(f"{prefix}_STEP")
    if rank is None or step is None:
        return None
    return int(rank), int(step)


_HANG = _target("CORPUS_HANG")
_RAISE = _target("CORPUS_RAISE")
_KILL = _target("CORPUS_KILL")
RANK = int(os.environ.get("RANK", "0"))
_STEP_SECONDS = float(os.environ.get("CORPUS_STEP_SECONDS") or 0)
_last_step_at: float | None = None


def wandered_off() -> None:
    """Where a hung rank is: outside any collective, in the program's own code, forever."""
    while True:
        time.sleep(3600)


def misbehave(step: int) -> None:
    """Hang, raise or die on this rank at ``step`` when the environment asks for it (and
    stretch the step to ``CORPUS_STEP_SECONDS``)."""
    global _last_step_at
    if _STEP_SECONDS > 0:
        now = time.monotonic()
        if _last_step_at is not None and now - _last_step_at < _STEP_SECONDS:
            time.sleep(_STEP_SECONDS - (now - _last_step_at))
        _last_step_at = time.monotonic()
    if _HANG is not None and (RANK, step) == _HANG:
        print(f"[corpus] rank {RANK} wanders off at step {step}", flush=True)
        wandered_off()
    if _RAISE is not None and (RANK, step) == _RAISE:
        raise RuntimeError(f"corpus: rank {RANK} raises at step {step} (CORPUS_RAISE_RANK/STEP)")
    if _KILL is not None and (RANK, step) == _KILL:
        _die(step)


def env_int(name: str, default: int) -> int:
    """An integer sizing knob from the environment (``CORPUS_STEPS``, ``CORPUS_EPOCHS``)."""
    value = os.environ.get(name)
    return int(value) if value else default


def _die(step: int) -> None:
    print(f"[corpus] rank {RANK} is killed at step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
