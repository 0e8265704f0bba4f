"""The warm spare: one interpreter per node that imports torch ahead of need and forks workers.

With ``--warm-start``, :mod:`.warm` starts one of these as::

    python -u -m tui_launch.core.workers.spare SOCKFD PARENT_PID LOW

It imports torch (and ``--warm-import`` modules) once, and serves its orders on a Unix socket
(length-prefixed JSON, :func:`send` / :func:`receive`):

- ``prepare`` (``path0``, ``modules``): put the worker's ``sys.path[0]`` in place and import
  the ``--warm-import`` modules; then say ``ready``.
- ``run`` (``argv``, ``env``, ``worker_keys``, ``cwd``, and the rank's stdout and stderr as
  passed file descriptors): finish the imports, ``fork``, and answer ``forked`` with the
  child's pid. The child becomes the worker: a session of its own (as torch's workers), the
  rank's files as fds 1 and 2, the worker's environment
  applied, the working directory, and the same bootstrap a cold worker runs
  (:func:`tui_launch.core.workers.shim.main`: the script or module as ``__main__``, same
  ``sys.argv``
  and ``sys.path[0]``). Its pid is the one torch's handler signals and waits for (through
  :class:`tui_launch.core.workers.warm.ForkedWorker`), py-spy and the telemetry look at.
- the spare reaps its children and reports each exit (``exit``: pid, wait status), since only
  a parent can have it.

So the imports are paid once per node, not once per rank and attempt: a restart forks again
from the same spare. ``import torch`` starts no thread (the import thread is joined before
every fork, so the spare forks single-threaded), CUDA is never initialised by torch's import,
and Python's ``random`` reseeds itself in a forked child; NumPy's global generator is reseeded
here, as a fresh interpreter would seed it. What a forked worker shares with its siblings that
cold workers would not: ``str`` hashing's random seed (``PYTHONHASHSEED`` unset), so set
iteration order is the same in every rank.

Nothing imported before the environment is applied may have read it. The spare was started
with the launcher's environment, so only the variables torch sets per worker can differ; if
one of them is read at import (:func:`import_time`), or CUDA was initialised by a
``--warm-import`` module (a forked process cannot use it), or such a module left threads running
(a fork could copy a lock one of them held), or anything else differs, the child
says so in one line on the rank's stderr and ``exec``\\ s the cold command instead (same pid:
torch sees no difference).

The spare dies with the launcher: a parent-death signal, and end-of-file on its socket. Its
forked workers are workers: the launcher's reaper covers them like any other. ``LOW`` = 1 runs
the imports on a thread at nice 19 (the main thread keeps its priority, which an unprivileged
process could not get back, and the workers are forked from the main thread), so a spare
started while workers train does not slow them. Standard library only until the imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

HEADER = struct.Struct("!Q")
# The spare starts with this variable holding ROOM bytes, and drops it at once: its start
# environment block (what /proc/<pid>/environ shows) then has room for a worker's, which holds
# torch's per-worker variables besides the launcher's (:func:`show_environ`).
ROOM_VAR = "TUILAUNCH_SPARE_ENV_ROOM"
ROOM = 16384
# Likewise its command line ends with an argument of ARG_ROOM spaces: room for a worker's
# command line in its argv area (what /proc/<pid>/cmdline, ps and pkill -f show).
ARG_ROOM = 4096
# What the spare's imports could not do, said on each forked worker's stderr.
NOTES: list[str] = []
MAX_FDS = 2
# Always imported: what every torch worker imports first, and what @record needs.
BASE_MODULES = ("torch", "torch.distributed", "torch.distributed.elastic.multiprocessing.errors")
# Set by tuilaunch or torchrun after a spare may have started, and read only later (by the
# agent's rendezvous, by torchelastic at run time, or by the bootstrap when the worker starts):
# never at import. torchrun sets TORCHELASTIC_SIGNALS_TO_HANDLE just before its agent starts.
LATE_SAFE = frozenset(
    {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TUILAUNCH_FAULTHANDLER_SIGNAL", "TUILAUNCH_RUN_TOKEN"}
)
LATE_SAFE_PREFIXES = ("TORCHELASTIC_",)
# Read when the interpreter, the dynamic loader or a runtime library (OpenMP, MKL, glibc's
# allocator, torch's C++ logging) starts: a value that changes after the spare started cannot
# be applied to it.
IMPORT_TIME_NAMES = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_LOGS",
        "NUMEXPR_MAX_THREADS",
    }
)
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "MALLOC_", "GLIBC_")
_PR_SET_PDEATHSIG = 1


def import_time(name: str) -> bool:
    """Whether the variable ``name`` is read when torch is imported (or earlier)."""
    return name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)


def late_safe(name: str) -> bool:
    """Whether ``name`` may be set after a spare started (it is read only at run time)."""
    return name in LATE_SAFE or name.startswith(LATE_SAFE_PREFIXES)


def unsafe_change(
    env0: dict[str, str], env: dict[str, str], worker_keys: set[str], cuda_initialized: bool
) -> str | None:
    """Why the environment ``env`` cannot be applied to a spare started with ``env0``
    (None: it can)."""
    for key in sorted(set(env0) | set(env)):
        before, after = env0.get(key), env.get(key)
        if before == after:
            continue
        shown = f"{key} ({before!r} when the spare started, {after!r} now)"
        if key == "CUDA_VISIBLE_DEVICES":
            if cuda_initialized:
                return f"{shown}: CUDA was initialised by the warm imports"
            continue  # read when CUDA initialises, on first use
        if import_time(key):
            return f"{shown} is read when torch is imported"
        if key not in worker_keys and not late_safe(key):
            return f"{shown} changed after the spare started"
    return None


_send_lock = threading.Lock()  # the spare's import thread and main thread both send


def send(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """One message: its length (with ``fds`` attached), then JSON."""
    body = json.dumps(message).encode()
    with _send_lock:
        socket.send_fds(sock, [HEADER.pack(len(body))], list(fds))
        sock.sendall(body)


def _recv_exact(sock: socket.socket, n: int, data: bytes = b"") -> bytes | None:
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and its fds (None at end-of-file: the launcher is gone)."""
    head, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    if not head:
        return None
    full = _recv_exact(sock, HEADER.size, head)
    if full is None:
        return None
    (length,) = HEADER.unpack(full)
    body = _recv_exact(sock, length)
    if body is None:
        return None
    message: dict[str, Any] = json.loads(body)
    return message, fds


def _pdeathsig(sig: int) -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


class _Importer:
    """Imports on a thread (at nice 19 when ``low``); the main thread keeps its priority."""

    def __init__(self, sock: socket.socket, low: bool) -> None:
        self._sock = sock
        self._low = low
        self._thread: threading.Thread | None = None
        self._tid: int | None = None

    def start(self, modules: tuple[str, ...] | list[str], say_ready: bool) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(tuple(modules), say_ready), name="spare-import", daemon=True
        )
        self._thread.start()

    def join(self, urgent: bool = False) -> None:
        """Wait for the imports; ``urgent`` (the spare is a worker now): first give the import
        thread the main thread's priority back where that is allowed (CAP_SYS_NICE)."""
        if self._thread is not None:
            if urgent and self._low and self._thread.is_alive() and self._tid is not None:
                with contextlib.suppress(OSError):
                    nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
                    os.setpriority(os.PRIO_PROCESS, self._tid, nice)
            self._thread.join()
            self._thread = None
            if self._tid is not None:
                _wait_thread_gone(self._tid)
                self._tid = None

    def _run(self, modules: tuple[str, ...], say_ready: bool) -> None:
        self._tid = threading.get_native_id()
        if self._low:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        for name in modules:
            try:
                __import__(name)
            except BaseException as e:  # the worker imports it again and sees the error itself
                why = f"{type(e).__name__}: {e}"
                NOTES.append(f"tuilaunch: --warm-import {name}: not imported ahead ({why})\n")
        if say_ready:
            with contextlib.suppress(OSError):
                send(self._sock, {"kind": "ready"})


def _take_stdio(stdout_fd: int, stderr_fd: int) -> None:
    """Make the rank's files the process's fds 1 and 2, and say there what the imports could
    not do. What the imports themselves printed (the spare's own output) is not copied: a cold
    worker prints only what its program's imports print, and a program that never imports
    torch prints none of torch's import-time warnings."""
    os.dup2(stdout_fd, 1)
    os.close(stdout_fd)
    os.dup2(stderr_fd, 2)
    os.close(stderr_fd)
    for note in NOTES:
        with contextlib.suppress(OSError):
            os.write(2, note.encode())


def become_worker(
    sock: socket.socket, order: dict[str, Any], fds: list[int], env0: dict[str, str]
) -> None:
    """Take the rank's stdio, environment and directory, and run the bootstrap as ``__main__``
    (or ``exec`` the cold command when the environment cannot be applied)."""
    _pdeathsig(0)  # a worker now: the reaper covers it, as every other worker
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if len(fds) == 2:
        _take_stdio(fds[0], fds[1])
    sock.close()
    argv: list[str] = order["argv"]
    env: dict[str, str] = order["env"]
    os.chdir(order["cwd"])
    torch_mod = sys.modules.get("torch")
    cuda = False
    with contextlib.suppress(Exception):
        cuda = bool(torch_mod is not None and torch_mod.cuda.is_initialized())
    why = unsafe_change(env0, env, set(order["worker_keys"]), cuda)
    if why is None and cuda:
        why = "CUDA was initialised by the warm imports, and a forked process cannot use it"
    if why is None and order.get("threads", 1) > 1:
        why = (
            f"the spare ran {order['threads']} threads after its imports (a --warm-import "
            "module started some), and a forked copy of it could deadlock"
        )
    if why is not None:
        sys.stderr.write(f"tuilaunch: warm start: {why}; this rank starts cold\n")
        sys.stderr.flush()
        os.execvpe(argv[0], argv, env)
    os.environ.clear()
    os.environ.update(env)
    show_environ(env)
    if argv[0] == sys.orig_argv[0]:
        show_cmdline(argv)
    _reseed()
    from tui_launch.core.workers import shim

    shim.main(argv[4:])  # argv: python -u -m tui_launch.core.workers.shim DIR ...


def _block_bounds(which: str) -> tuple[int, int] | None:
    """Where this process's start ``"args"`` or ``"env"`` strings lie (``/proc/self/stat``
    fields 48-49 and 50-51)."""
    try:
        with open("/proc/self/stat", "rb") as fp:
            raw = fp.read()
        fields = raw[raw.rindex(b")") + 2 :].split()  # fields[0] is field 3
        first = 45 if which == "args" else 47
        return int(fields[first]), int(fields[first + 1])
    except (OSError, ValueError, IndexError):
        return None


def _overwrite(which: str, strings: list[bytes]) -> bool:
    bounds = _block_bounds(which)
    if bounds is None:
        return False
    start, end = bounds
    block = b"".join(x + b"\0" for x in strings)
    room = end - start
    if room <= 0 or len(block) >= room:
        return False
    ctypes.memmove(start, block + b"\0" * (room - len(block)), room)
    return True


def show_cmdline(argv: list[str]) -> bool:
    """Write ``argv`` (torch's command for this worker) over this process's start argument
    strings, so that ``/proc/<pid>/cmdline`` (``ps``, ``pkill -f script.py``) names the
    worker's program, not the spare's (the rest of the room reads as empty arguments).
    ``argv[0]`` is the spare's own interpreter, byte for byte, so libc's pointers into it
    (``program_invocation_name``) still read the same. False when it does not fit."""
    return _overwrite("args", [os.fsencode(a) for a in argv])


def show_environ(env: dict[str, str]) -> bool:
    """Write ``env`` over this process's start environment strings, so that
    ``/proc/<pid>/environ`` (``ps e``, psutil, monitoring agents, scripts that look for
    ``LOCAL_RANK``) shows the worker's environment, as it would for a cold worker. Only after
    ``os.environ`` was replaced: the C ``environ`` then points at copies on the heap, never at
    these strings (setproctitle relies on the same). False when it does not fit."""
    return _overwrite("env", [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()])


def _wait_thread_gone(tid: int, limit: float = 2.0) -> None:
    """Wait (at most ``limit`` seconds) until thread ``tid`` has left ``/proc/self/task``.
    ``Thread.join`` returns once the thread's Python state is released, a moment before the
    OS thread exits: on a loaded machine a fork at once counted it and sent the worker cold."""
    deadline = time.monotonic() + limit
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.001)


def _thread_count() -> int:
    """This process's threads (1 when it cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _reseed() -> None:
    """A fresh interpreter seeds NumPy's global generator from the OS; a forked one would
    share the spare's stream with its siblings (Python's ``random`` reseeds itself at fork)."""
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None:
        with contextlib.suppress(Exception):
            nprandom.seed()


class _Children:
    """The spare's forked workers: SIGCHLD wakes the loop (a self-pipe), exits are reaped and
    reported to the launcher."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

    def reap(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.wake_r, 512):
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            with contextlib.suppress(OSError):
                send(self._sock, {"kind": "exit", "pid": pid, "status": status})

    def in_child(self) -> None:
        """Undo all of this in a forked worker: the user's program gets a plain process."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.wake_r)
        os.close(self.wake_w)


def serve(sock: socket.socket, low: bool, env0: dict[str, str]) -> bool:
    """Import, then serve orders until end-of-file (False) or until this process is a forked
    worker whose program has run (True)."""
    importer = _Importer(sock, low)
    importer.start(BASE_MODULES, say_ready=False)
    children = _Children(sock)
    while True:
        readable, _, _ = select.select([sock.fileno(), children.wake_r], [], [])
        if children.wake_r in readable:
            children.reap()
        if sock.fileno() not in readable:
            continue
        got = receive(sock)
        if got is None:
            return False
        order, fds = got
        importer.join(urgent=order.get("kind") == "run")
        if order.get("kind") == "prepare":
            sys.path.insert(0, str(order["path0"]))
            importer.start(list(order.get("modules") or ()), say_ready=True)
            continue
        if order.get("kind") != "run":
            continue
        # Single-threaded here (the import thread was joined) unless an imported module started
        # threads of its own: a fork could then copy a lock one of them held; the child execs.
        order["threads"] = _thread_count()
        pid = os.fork()
        if pid == 0:
            children.in_child()
            os.setsid()  # a session of its own, as torch's workers
            become_worker(sock, order, fds, env0)  # the user's program, as __main__
            return True
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            send(sock, {"kind": "forked", "pid": pid})


def main(argv: list[str]) -> None:
    """``SOCKFD PARENT_PID LOW``: import, serve orders, fork workers."""
    fd, parent, low = int(argv[0]), int(argv[1]), argv[2] == "1"
    _pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # the launcher died before the signal was armed
        os._exit(0)
    os.environ.pop(ROOM_VAR, None)  # its bytes stay in the start block: room for the worker's
    env0 = dict(os.environ)
    sock = socket.socket(fileno=fd)
    # `python -m` put the working directory first: torch comes from the installation, as it
    # would for a script elsewhere; the worker's own sys.path[0] arrives with `prepare`.
    if sys.path:
        sys.path.pop(0)
    if not serve(sock, low, env0):
        os._exit(0)  # the launcher closed the socket: its workers are its reaper's


if __name__ == "__main__":
    from tui_launch.core.workers import spare as _spare

    _spare.main(sys.argv[1:])
