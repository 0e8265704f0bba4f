"""The misbehaviour hooks every corpus program calls once per training step.

Environment (read once, at import):

* ``CORPUS_HANG_RANK=r CORPUS_HANG_STEP=k``: rank ``r`` hangs at step ``k`` while the other
  ranks go on into the step's collective; ``CORPUS_HANG_KIND`` says how (:data:`HANG_KINDS`,
  default ``sleep``: it enters :func:`wandered_off` and sleeps there forever), and
  ``CORPUS_HANG_MARK=path`` has the rank write when the hang starts (one JSON object: rank,
  kind, step, ``wall`` = ``time.time()``) just before it does, for ``bench/hangzoo.py``.
* ``CORPUS_RAISE_RANK=r CORPUS_RAISE_STEP=k``: rank ``r`` raises ``RuntimeError`` at step ``k``.
* ``CORPUS_KILL_RANK=r CORPUS_KILL_STEP=k``: rank ``r`` dies of ``SIGKILL`` at step ``k`` (what
  the OOM killer or a lost node does to a rank: no exception, no last words).
* ``CORPUS_STEP_SECONDS=s``: every step takes at least ``s`` seconds, the rest of it asleep (a
  slow input pipeline): a run long enough to be watched mid-run costs few steps of compute.

A step is the program's global optimizer step, counted from 0 (across epochs). ``RANK`` is the
global rank torchrun (or tuilaunch) set; without it the program is rank 0.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time


def _target(prefix: str) -> tuple[int, int] | None:
    rank = os.environ.get(f"{prefix}_RANK")
    step = os.environ.get(f"{prefix}_STEP")
    if rank is None or step is None:
        return None
    return int(rank), int(step)


_HANG = _target("CORPUS_HANG")
_HANG_KIND = os.environ.get("CORPUS_HANG_KIND") or "sleep"
_HANG_MARK = os.environ.get("CORPUS_HANG_MARK")
_RAISE = _target("CORPUS_RAISE")
_KILL = _target("CORPUS_KILL")
RANK = int(os.environ.get("RANK", "0"))
_STEP_SECONDS = float(os.environ.get("CORPUS_STEP_SECONDS") or 0)
_last_step_at: float | None = None


def wandered_off() -> None:
    """Where a hung rank is: outside any collective, in the program's own code, forever."""
    while True:
        time.sleep(3600)


def _stop_self() -> None:
    """SIGSTOPped: the kernel stops the process, every thread; nothing of it runs."""
    os.kill(os.getpid(), signal.SIGSTOP)
    wandered_off()  # a SIGCONT (the launcher's stop) lets it go no further


def _other_collective() -> None:
    """A collective the others do not call: an ``all_gather`` of 1 MB where they all-reduce
    their gradients (gloo matches collectives by order, not by kind: they wait forever)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(256 * 1024)
    dist.all_gather([torch.empty_like(t) for _ in range(dist.get_world_size())], t)
    wandered_off()


def _hold_gil() -> None:
    """A C call made with the GIL held (``ctypes.PyDLL``: libc's ``sleep``): no thread of the
    interpreter runs, faulthandler's and signal handlers included."""
    ctypes.PyDLL(None).sleep(1 << 30)
    wandered_off()


class _DeadlockedDataset:
    """A map-style dataset whose item takes a lock it already holds: its DataLoader worker
    deadlocks, and the rank waits for the batch forever."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # never returns
        return index


def _loader_deadlock() -> None:
    """The rank asks a DataLoader with one worker process for a batch the worker never makes."""
    from torch.utils.data import DataLoader

    loader = DataLoader(_DeadlockedDataset(), batch_size=2, num_workers=1)
    next(iter(loader))
    wandered_off()


def _chatter() -> None:
    """A background thread that prints every 2 s all the run long (a heartbeat, a metrics
    logger): the rank's output never stops, even once its main thread is stuck."""
    n = 0
    while True:
        time.sleep(2.0)
        n += 1
        print(f"[corpus] rank {RANK} heartbeat {n}", flush=True)


_LOCK = threading.Lock()


def _lock_wait() -> None:
    """Another thread of the rank takes a lock and keeps it; the main thread waits for it."""
    held = threading.Event()

    def holder() -> None:
        with _LOCK:
            held.set()
            wandered_off()

    threading.Thread(target=holder, name="lock-holder", daemon=True).start()
    held.wait()
    _LOCK.acquire()
    wandered_off()


HANG_KINDS = {
    "sleep": wandered_off,
    "sigstop": _stop_self,
    "collective": _other_collective,
    "gil": _hold_gil,
    "dataloader": _loader_deadlock,
    "chatty": wandered_off,
    "lock": _lock_wait,
}
"""How a rank hangs (``CORPUS_HANG_KIND``): sleeping in its own code, stopped by SIGSTOP, in a
collective the others do not call, in a C call holding the GIL, waiting for a deadlocked
DataLoader worker, in its own code while a background thread goes on printing, waiting for a
lock another thread holds."""

if _HANG is not None and _HANG_KIND not in HANG_KINDS:
    sys.exit(f"CORPUS_HANG_KIND={_HANG_KIND}: not one of {', '.join(HANG_KINDS)}")
if _HANG is not None and _HANG_KIND == "chatty" and _HANG[0] == RANK:
    threading.Thread(target=_chatter, name="heartbeat", daemon=True).start()


def _hang(step: int) -> None:
    """Hang the way ``CORPUS_HANG_KIND`` says, after writing the mark."""
    if _HANG_KIND == "sleep":
        print(f"[corpus] rank {RANK} wanders off at step {step}", flush=True)
    else:
        print(f"[corpus] rank {RANK} hangs ({_HANG_KIND}) at step {step}", flush=True)
    if _HANG_MARK:
        mark = {"rank": RANK, "kind": _HANG_KIND, "step": step, "wall": time.time()}
        with open(_HANG_MARK, "w") as fp:
            fp.write(json.dumps(mark) + "\n")
    HANG_KINDS[_HANG_KIND]()


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
        _hang(step)
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
