"""Warm starts (``--warm-start``): spare interpreters with torch imported, one per local rank.

A restart costs every rank a fresh interpreter that imports torch (about a second of CPU
each, several on a GPU node with a real model's imports). :class:`WarmPool` keeps one spare
per local rank (:mod:`.spare`) that has imported torch and the ``--warm-import`` modules and
waits. When torch starts an attempt's workers (the first attempt too), the seam
(:func:`tui_launch.core.agent.warm_handlers`) asks :meth:`WarmPool.hand_off` for each rank: a
spare gets the rank's full environment, argv, working directory and stdio, and becomes the
worker. torch's handler holds the spare's own ``Popen`` (the agent made it), so torch signals,
polls and kills the process that runs the user's code, exactly as with a cold worker. No spare
ready: the worker starts cold, as torchrun would.

Life of a spare: started at the launch by :func:`prestart` (before the launcher itself imports
torch, so both import at once), told the worker's ``sys.path[0]`` and modules once torchrun's
configuration is known (:meth:`WarmPool.configure`, which also replaces spares started with an
environment that no longer matches), used by an attempt, replaced at low priority right after
(:meth:`WarmPool.refill`), killed at the end of the run (:meth:`WarmPool.close`). Spares are
never workers in the rank table, the journal or the telemetry until torch starts them as one.
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
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tui_launch.core import spare as spare_mod
from tui_launch.core import workerenv

SPARE_MODULE = spare_mod.__name__
SHIM_MODULE = "tui_launch.core.shim"
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


@dataclass
class Spare:
    """One spare interpreter and the agent's end of its socket."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    env: dict[str, str]
    python: str
    started: float = field(default_factory=time.time)
    ready: bool = False
    prepared: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def poll_ready(self) -> bool:
        """Whether the spare has said it finished its imports (reads its one byte)."""
        if not self.ready:
            with contextlib.suppress(OSError, ValueError):
                readable, _, _ = select.select([self.sock], [], [], 0)
                if readable and self.sock.recv(1) == spare_mod.READY:
                    self.ready = True
        return self.ready


@dataclass(frozen=True)
class Used:
    """A spare that became a worker: its pid, when it started, whether it was ready."""

    pid: int
    started: float
    ready: bool


def _differs(a: dict[str, str], b: dict[str, str]) -> bool:
    return any(a.get(k) != b.get(k) for k in set(a) | set(b) if not spare_mod.late_safe(k))


class WarmPool:
    """The spares of this node. Thread-safe; the agent thread uses it, any thread closes it.

    Args:
        count: spares to keep (the local world size; :meth:`configure` sets the real one).
        modules: the ``--warm-import`` modules.
    """

    def __init__(self, count: int = 0, modules: Sequence[str] = ()) -> None:
        self.count = count
        self.modules: tuple[str, ...] = tuple(modules)
        self._lock = threading.Lock()
        self._spares: list[Spare] = []
        self._used: list[Used] = []
        self._path0: str | None = None
        self._closed = False
        self._watch: Callable[[int], None] | None = None
        self._forget: Callable[[int], None] | None = None

    # ------------------------------------------------------------------ spares

    def _spawn(self, env: dict[str, str], low: bool) -> Spare | None:
        python = worker_python()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # What the spare prints while it imports (torch's warnings) is kept in files of its
            # own and goes first into the rank's files once it is a worker.
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                argv = [python, "-u", "-m", SPARE_MODULE, str(child.fileno()), str(os.getpid())]
                proc = subprocess.Popen(
                    [*argv, "1" if low else "0"],
                    env=env,
                    stdout=out,
                    stderr=err,
                    pass_fds=(child.fileno(),),
                    # Its own process group, as torch's workers: torch kills the group.
                    start_new_session=True,
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
            os.killpg(s.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            s.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            s.proc.wait(timeout=5)
        if self._forget is not None:
            self._forget(s.proc.pid)

    def _fill(self, low: bool) -> None:
        env = dict(os.environ)
        while len(self._spares) < self.count and not self._closed:
            s = self._spawn(env, low)
            if s is None:
                return
            self._prepare(s)
            self._spares.append(s)

    # ------------------------------------------------------------------ life cycle

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start ``count`` spares now (at normal priority: the first attempt needs them)."""
        with self._lock:
            if env is None:
                self._fill(low=False)
                return
            while len(self._spares) < self.count and not self._closed:
                s = self._spawn(env, low=False)
                if s is None:
                    return
                self._spares.append(s)

    def set_watch(self, watch: Callable[[int], None], forget: Callable[[int], None]) -> None:
        """Register every spare, now and later, with the launcher's reaper."""
        with self._lock:
            self._watch, self._forget = watch, forget
            for s in self._spares:
                watch(s.proc.pid)

    def configure(self, count: int, bootstrap_args: Sequence[str]) -> str:
        """torchrun's configuration is known (agent thread, before the rendezvous): keep
        ``count`` spares whose environment matches the launcher's now, and tell them the
        worker's ``sys.path[0]`` and modules. Returns a line for the run's notes."""
        env = dict(os.environ)
        python = worker_python()
        with self._lock:
            self.count = count
            self._path0 = path0_for(bootstrap_args)
            keep: list[Spare] = []
            for s in self._spares:
                same = s.python == python and not _differs(s.env, env)
                if len(keep) < count and s.alive() and same:
                    keep.append(s)
                else:
                    self._kill(s)
            self._spares = [s for s in keep if self._prepare(s)]
            self._fill(low=False)
        mods = ", ".join(("torch", *self.modules))
        return (
            f"warm start: {count} spare interpreter(s) import {mods} ahead of each attempt; "
            "workers start in them"
        )

    def hand_off(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        worker_keys: Sequence[str],
        stdout_fd: int,
        stderr_fd: int,
    ) -> subprocess.Popen[bytes] | None:
        """Make a spare the worker ``argv`` (torch's full command); return its ``Popen``, or
        None (no spare, or a command a spare cannot run): torch starts it cold."""
        argv = [str(a) for a in argv]
        with self._lock:
            if self._closed or argv[1:4] != ["-u", "-m", SHIM_MODULE]:
                return None
            order = {
                "kind": "run",
                "argv": argv,
                "env": env,
                "worker_keys": list(worker_keys),
                "cwd": os.getcwd(),
            }
            # Ready spares first; one still importing is still faster than a cold start.
            candidates = sorted(self._spares, key=lambda s: not s.poll_ready())
            for s in candidates:
                self._spares.remove(s)
                if not (s.alive() and s.python == argv[0] and s.prepared):
                    self._kill(s)
                    continue
                try:
                    spare_mod.send(s.sock, order, (stdout_fd, stderr_fd))
                except OSError:
                    self._kill(s)
                    continue
                with contextlib.suppress(OSError):
                    s.sock.close()
                # /proc shows the spare's start environment, not this one: say what it runs with.
                workerenv.record(s.proc.pid, env)
                self._used.append(Used(s.proc.pid, s.started, s.ready))
                return s.proc
            return None

    def attempt_started(self, attempt: int, pids: dict[int, int]) -> str:
        """An attempt's workers run (``{local_rank: pid}``): replace the spares it used, at
        low priority (workers are running). Returns a line saying which ranks are warm."""
        with self._lock:
            used, self._used = {u.pid for u in self._used}, []
            self._fill(low=True)
        warm = sorted(lr for lr, pid in pids.items() if int(pid) in used)
        cold = sorted(set(pids) - set(warm))
        line = f"warm start: attempt {attempt}: local rank(s) {_ranks(warm)} started in spares"
        return line + (f"; {_ranks(cold)} cold (no spare ready)" if cold else "")

    def pids(self) -> list[int]:
        """The pids of the waiting spares."""
        with self._lock:
            return [s.proc.pid for s in self._spares]

    def close(self) -> None:
        """Kill every waiting spare; start none again. Idempotent."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
            for s in spares:
                self._kill(s)


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
    """Start spares at once when ``argv`` asks for warm starts, so that they import torch
    while the launcher imports it too; None when it does not ask.

    The environment they start with is the one torchrun will give its workers as far as it is
    known here (``OMP_NUM_THREADS=1`` for several ranks, as torchrun sets it); a wrong guess
    costs time, never correctness (:meth:`WarmPool.configure` replaces them).
    """
    if WARM_OPTION not in argv:
        return None
    count = guess_count(argv)
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env and count > 1:
        env["OMP_NUM_THREADS"] = "1"
    pool = WarmPool(count)
    pool.start(env)
    return pool
