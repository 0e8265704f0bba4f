"""Warm starts (``--warm-start``): workers forked from a spare interpreter with torch imported.

A restart costs every rank a fresh interpreter that imports torch (and, on a GPU node, a real
model's imports), which is most of a restart's time (bench/README.md has the figures).
:class:`WarmPool` keeps one spare interpreter per node (:mod:`.spare`) that has imported torch and
the ``--warm-import`` modules, and forks the workers from it. When torch starts an attempt's workers
(the first attempt too), the seam (:func:`tui_launch.core.seam.agent.warm_handlers`) asks
:meth:`WarmPool.hand_off` for each rank: the spare forks, and the child gets the rank's full
environment, argv, working directory and stdio, and becomes the worker. The imports are paid once
per node and run, not once per rank and attempt.

torch's handler holds a :class:`ForkedWorker` for it: a ``subprocess.Popen`` whose pid is the
forked worker and whose ``poll``/``wait`` read the exit status the spare (its parent, the only
process that can wait for it) reports. torch signals, polls and kills the process that runs the
user's code, exactly as with a cold worker. No spare (it died, or the command is not one a
spare can run): the worker starts cold, as torchrun would.

Life of the spare: started at the launch by :func:`prestart` (before the launcher itself
imports torch, so both import at once), told the worker's ``sys.path[0]`` and modules once
torchrun's configuration is known (:meth:`WarmPool.configure`, which also replaces a spare
started with an environment that no longer matches), forked from by every attempt, started
again at low priority if it died (:meth:`WarmPool.attempt_started`), killed at the end of the
run (:meth:`WarmPool.close`). The spare is never a worker in the rank table, the journal or
the telemetry; its forked children are, once torch started them as workers.
Standard library only: :func:`prestart` runs before torch is imported.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.workers import env as workerenv
from tui_launch.core.workers import reaper
from tui_launch.core.workers import spare as spare_mod

SPARE_MODULE = spare_mod.__name__
SHIM_MODULE = "tui_launch.core.workers.shim"
WARM_OPTION = "--warm-start"


def worker_python() -> str:
    """The interpreter torchrun starts workers with (``PYTHON_EXEC``, else this one)."""
    return os.getenv("PYTHON_EXEC", sys.executable)


def path0_for(bootstrap_args: Sequence[str]) -> str:
    """The worker's ``sys.path[0]`` for ``DIR script ...``, ``DIR -m mod ...`` or
    ``DIR --run-path script ...`` (the bootstrap's arguments)."""
    rest = list(bootstrap_args[1:])
    if not rest or rest[0] in ("-m", "--run-path"):
        return os.getcwd()  # `python -m` puts the working directory first
    return os.path.dirname(os.path.realpath(rest[0]))


# How long a hand-off waits for the spare to fork (it first finishes its imports, which a cold
# worker would have to do from the start); past it the spare is dropped and the rank starts cold.
FORK_TIMEOUT = 600.0


@dataclass
class Spare:
    """The spare interpreter and the agent's end of its socket."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    env: dict[str, str]
    python: str
    started: float = field(default_factory=time.time)
    ready: bool = False
    prepared: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass(frozen=True)
class Used:
    """A worker forked from the spare: its pid, when the spare started, whether it was ready."""

    pid: int
    started: float
    ready: bool


def _differs(a: dict[str, str], b: dict[str, str]) -> bool:
    return any(a.get(k) != b.get(k) for k in set(a) | set(b) if not spare_mod.late_safe(k))


class ForkedWorker(subprocess.Popen[bytes]):
    """torch's handle on a worker the spare forked: the launcher is not its parent, so its exit
    status comes from the spare (:meth:`WarmPool.exit_status`). ``pid``, ``poll``, ``wait``,
    ``send_signal``, ``terminate``, ``kill`` and ``returncode`` behave as ``Popen``'s."""

    def __init__(self, pid: int, args: Sequence[str], pool: WarmPool) -> None:
        # Not Popen.__init__: the process exists already. These are the attributes Popen's
        # methods (send_signal, __repr__, __del__, __exit__) read.
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # __del__: nothing of ours to reap
        self._pool = pool

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._pool.exit_status(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._pool.exit_status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode


class WarmPool:
    """This node's spare. Thread-safe; the agent thread uses it, any thread closes it.

    Args:
        count: the local world size (:meth:`configure` sets the real one).
        modules: the ``--warm-import`` modules.
    """

    def __init__(self, count: int = 0, modules: Sequence[str] = ()) -> None:
        self.count = count
        self.modules: tuple[str, ...] = tuple(modules)
        self._lock = threading.RLock()
        self._spare: Spare | None = None
        self._status: dict[int, int] = {}  # exit codes of forked workers (Popen's convention)
        self._forked: dict[int, Spare] = {}  # forked worker pid -> its spare
        self._used: list[Used] = []
        self._path0: str | None = None
        self._closed = threading.Event()
        self._watch: Callable[[int], None] | None = None
        self._forget: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ the spare

    def _spawn(self, env: dict[str, str], low: bool) -> Spare | None:
        python = worker_python()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # What the spare's imports print is not a worker's output (spare.py, _take_stdio).
            argv = [python, "-u", "-m", SPARE_MODULE, str(child.fileno()), str(os.getpid())]
            proc = subprocess.Popen(
                [*argv, "1" if low else "0", " " * spare_mod.ARG_ROOM],
                env={**env, spare_mod.ROOM_VAR: "x" * spare_mod.ROOM},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
                start_new_session=True,  # no terminal signal reaches it
            )
        except OSError:
            parent.close()
            return None
        finally:
            child.close()
        s = Spare(proc, parent, env, python)
        if self._watch is not None:
            self._watch(proc.pid)
        return s

    def _prepare(self, s: Spare) -> bool:
        if self._path0 is None:
            return True
        try:
            order = {"kind": "prepare", "path0": self._path0, "modules": list(self.modules)}
            spare_mod.send(s.sock, order)
        except OSError:
            return False
        s.prepared = True
        return True

    def _kill(self, s: Spare) -> None:
        with contextlib.suppress(OSError):
            os.killpg(s.proc.pid, signal.SIGKILL)  # its group only: forked workers have theirs
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=5)
        self._drop(s)

    def _drop(self, s: Spare) -> None:
        """``s`` is gone: what it could still report is read, its socket closed."""
        with contextlib.suppress(OSError, ValueError):
            while self._pump(s, 0.0) is not None:
                pass
        with contextlib.suppress(OSError):
            s.sock.close()
        if self._spare is s:
            self._spare = None
        if self._forget is not None:
            self._forget(s.proc.pid)

    def _pump(self, s: Spare, timeout: float | None) -> dict[str, Any] | None:
        """Read one message from ``s`` within ``timeout`` (None: none came); note exits and
        readiness. A spare whose socket ends is dropped."""
        if s.sock.fileno() < 0:
            return None
        readable, _, _ = select.select([s.sock], [], [], timeout)
        if not readable:
            return None
        try:
            got = spare_mod.receive(s.sock)
        except (OSError, ValueError):
            got = None
        if got is None:
            with contextlib.suppress(OSError):
                s.sock.close()
            if self._spare is s:
                self._spare = None
                if self._forget is not None:
                    self._forget(s.proc.pid)
            return None
        message, fds = got
        for fd in fds:
            os.close(fd)
        if message.get("kind") == "exit":
            pid = int(message["pid"])
            self._status[pid] = os.waitstatus_to_exitcode(int(message["status"]))
            self._forked.pop(pid, None)
        elif message.get("kind") == "ready":
            s.ready = True
        return message

    def _start(self, env: dict[str, str], low: bool) -> None:
        if self._spare is None and not self._closed.is_set():
            s = self._spawn(env, low)
            if s is not None:
                self._prepare(s)
                self._spare = s

    # ------------------------------------------------------------------ life cycle

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start the spare now (at normal priority: the first attempt needs it)."""
        with self._lock:
            self._start(dict(os.environ) if env is None else env, low=False)

    def set_watch(self, watch: Callable[[int], None], forget: Callable[[int], None]) -> None:
        """Register the spare, now and later, with the launcher's reaper."""
        with self._lock:
            self._watch, self._forget = watch, forget
            if self._spare is not None:
                watch(self._spare.proc.pid)

    def configure(self, count: int, bootstrap_args: Sequence[str]) -> str:
        """torchrun's configuration is known (agent thread, before the rendezvous): keep the
        spare if its environment matches the launcher's now (else start another), and tell it
        the worker's ``sys.path[0]`` and modules. Returns a line for the run's notes."""
        env = dict(os.environ)
        python = worker_python()
        with self._lock:
            self.count = count
            self._path0 = path0_for(bootstrap_args)
            s = self._spare
            if s is not None and not (
                s.alive() and s.python == python and not _differs(s.env, env)
            ):
                self._kill(s)
            if self._spare is not None and not self._prepare(self._spare):
                self._kill(self._spare)
            self._start(env, low=False)
        mods = ", ".join(("torch", *self.modules))
        return (
            f"warm start: a spare interpreter imports {mods} once; each attempt's {count} "
            "worker(s) are forked from it"
        )

    def hand_off(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        worker_keys: Sequence[str],
        stdout_fd: int,
        stderr_fd: int,
    ) -> subprocess.Popen[bytes] | None:
        """Fork the worker ``argv`` (torch's full command) from the spare; return its handle,
        or None (no spare, or a command a spare cannot run): torch starts it cold."""
        argv = [str(a) for a in argv]
        with self._lock:
            s = self._spare
            if s is None or self._closed.is_set() or argv[1:4] != ["-u", "-m", SHIM_MODULE]:
                return None
            if not (s.alive() and s.python == argv[0] and s.prepared):
                self._kill(s)
                return None
            order = {
                "kind": "run",
                "argv": argv,
                "env": env,
                "worker_keys": list(worker_keys),
                "cwd": os.getcwd(),
            }
            try:
                spare_mod.send(s.sock, order, (stdout_fd, stderr_fd))
            except OSError:
                self._kill(s)
                return None
            ready = s.ready
            # The spare finishes its imports first (a cold worker would start them now).
            deadline = time.monotonic() + FORK_TIMEOUT
            while not self._closed.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or self._spare is not s:
                    break
                message = self._pump(s, min(left, 0.5))
                if message is not None and message.get("kind") == "forked":
                    pid = int(message["pid"])
                    self._forked[pid] = s
                    # /proc shows the spare's start environment, not this one.
                    workerenv.record(pid, env)
                    self._used.append(Used(pid, s.started, ready))
                    return ForkedWorker(pid, argv, self)
            if self._spare is s:
                self._kill(s)
            return None

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """Forked worker ``pid``'s exit code (``Popen``'s convention: -N for signal N), waiting
        up to ``timeout`` seconds (None: for ever) for its spare to report it; None if not yet.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with self._lock:
                if pid in self._status:
                    return self._status[pid]
                owner = self._forked.get(pid)
                if owner is None:
                    return None  # not a worker of ours
                lost = owner.sock.fileno() < 0
                if not lost:
                    # Everything already sent first (other ranks' exits may be queued ahead).
                    while self._pump(owner, 0.0) is not None and pid not in self._status:
                        pass
                    if pid not in self._status and (left is None or left > 0):
                        self._pump(owner, 0.05 if left is None else min(left, 0.05))
                    if pid in self._status:
                        return self._status[pid]
                elif not _exists(pid):
                    # Its spare died first: nobody can have the status any more.
                    self._forked.pop(pid, None)
                    self._status[pid] = -signal.SIGKILL
                    return self._status[pid]
            if left is not None and left <= 0:
                return None
            if lost:
                time.sleep(0.05)  # looked at in /proc until it is gone

    def attempt_started(self, attempt: int, pids: dict[int, int]) -> str:
        """An attempt's workers run (``{local_rank: pid}``): start the spare again if it died
        (at low priority: workers are running). Returns a line saying which ranks are warm."""
        with self._lock:
            used, self._used = {u.pid for u in self._used}, []
            s = self._spare
            if s is not None and not s.alive():
                self._kill(s)
            self._start(dict(os.environ), low=True)
        warm = sorted(lr for lr, pid in pids.items() if int(pid) in used)
        cold = sorted(set(pids) - set(warm))
        line = f"warm start: attempt {attempt}: local rank(s) {_ranks(warm)} started in spares"
        return line + (f"; {_ranks(cold)} cold (no spare ready)" if cold else "")

    def pids(self) -> list[int]:
        """The pid of the waiting spare (none or one)."""
        with self._lock:
            return [self._spare.proc.pid] if self._spare is not None else []

    def close(self) -> None:
        """Kill the spare; start none again. Idempotent. Workers forked from it are torch's
        (stopped by then) and the reaper's."""
        self._closed.set()  # a hand-off waiting for a fork gives up
        s = self._spare
        if s is not None:
            with contextlib.suppress(OSError):
                os.killpg(s.proc.pid, signal.SIGKILL)
        with self._lock:
            if self._spare is not None:
                self._kill(self._spare)


def _exists(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            return fp.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if ranks else "none"


def guess_count(argv: Sequence[str]) -> int:
    """``--nproc-per-node`` from the raw command line, before torch's parser exists (1 when
    it is not a number: :meth:`WarmPool.configure` corrects any guess)."""
    value = os.environ.get("PET_NPROC_PER_NODE", "1")
    for i, tok in enumerate(argv):
        for name in ("--nproc-per-node", "--nproc_per_node"):
            if tok == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif tok.startswith(name + "="):
                value = tok.split("=", 1)[1]
    try:
        return max(1, int(value))
    except ValueError:
        return 1


def prestart(argv: Sequence[str]) -> WarmPool | None:
    """Start the spare at once when ``argv`` asks for warm starts, so that it imports torch
    while the launcher imports it too; None when it does not ask.

    The environment it starts with is the one torchrun will give its workers as far as it is
    known here (``OMP_NUM_THREADS=1`` for several ranks, as torchrun sets it); a wrong guess
    costs time, never correctness (:meth:`WarmPool.configure` replaces it).
    """
    if WARM_OPTION not in argv:
        return None
    count = guess_count(argv)
    # Without a cgroup, the run's token first: the spare's environment is what /proc shows for
    # the workers it forks, and the no-orphans sweep finds them by it. (Under a cgroup the
    # spare joins it before it forks, and the environment stays torchrun's.)
    if reaper.sweep_expected():
        reaper.export_token()
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env and count > 1:
        env["OMP_NUM_THREADS"] = "1"
    pool = WarmPool(count)
    pool.start(env)
    return pool
