"""The environment a worker process really runs with, read from outside it.

A cold worker is started by ``execve`` with the environment torch built, so
``/proc/<pid>/environ`` shows it. A ``--warm-start`` spare (:mod:`.spare`) was started earlier
with the launcher's environment and *applies* the worker's when it becomes one (``os.environ``
in-process): ``/proc/<pid>/environ`` still shows the block it started with, without
``LOCAL_RANK``, ``RANK`` or anything else torch sets per worker. So the warm pool records here
what it handed each spare (:func:`record`), keyed by pid and the process's start time (a pid
reused by another process is not taken for the spare), and :func:`environ` answers from that
record first, from ``/proc`` otherwise.

Readers: the telemetry's GPU inference (``CUDA_VISIBLE_DEVICES`` and ``LOCAL_RANK`` of a rank
whose GPU NVML cannot list) and the fake NVML, which places each worker on a GPU from its
``LOCAL_RANK`` as a training script calling ``torch.cuda.set_device`` would. Process-wide and
thread-safe: the agent thread records, the telemetry thread reads. Standard library only.
"""

from __future__ import annotations

import threading

# At most this many handed environments are kept (the oldest go first): a long elastic run
# hands off one per rank per attempt, and only the current attempt's can still be asked for.
_KEEP = 4096

_lock = threading.Lock()
_handed: dict[int, tuple[int | None, dict[str, str]]] = {}


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            raw = fp.read()
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        return int(raw[raw.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def record(pid: int, env: dict[str, str]) -> None:
    """Process ``pid`` now runs with ``env`` (a spare that became a worker)."""
    began = start_time(pid)
    with _lock:
        _handed.pop(pid, None)
        _handed[pid] = (began, dict(env))
        while len(_handed) > _KEEP:
            del _handed[next(iter(_handed))]


def forget(pid: int) -> None:
    """Drop what :func:`record` kept for ``pid``."""
    with _lock:
        _handed.pop(pid, None)


def handed(pid: int) -> dict[str, str] | None:
    """The environment a spare was handed when it became worker ``pid`` (None: not a spare,
    or that process is gone and the pid belongs to another now)."""
    with _lock:
        got = _handed.get(pid)
    if got is None:
        return None
    began, env = got
    if began is not None and start_time(pid) != began:
        forget(pid)
        return None
    return env


def read_proc(pid: int) -> dict[bytes, bytes]:
    """``/proc/<pid>/environ`` as bytes (raises ``OSError`` when it cannot be read)."""
    with open(f"/proc/{pid}/environ", "rb") as fp:
        return dict(kv.split(b"=", 1) for kv in fp.read().split(b"\0") if b"=" in kv)


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` runs with: what a spare was handed, else its start
    environment from ``/proc`` (raises ``OSError`` when neither can be had)."""
    env = handed(pid)
    if env is not None:
        return dict(env)
    return {
        k.decode(errors="replace"): v.decode(errors="replace") for k, v in read_proc(pid).items()
    }


__all__ = ["environ", "forget", "handed", "read_proc", "record", "start_time"]
