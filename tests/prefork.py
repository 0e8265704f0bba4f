"""Launchers forked from an interpreter that has already imported torch.

Most of the suite's CPU went into ``import torch``: each of its ~230 tuilaunch launchers and
its torchrun launchers spent ~2.5-3 s of CPU importing it before doing what the test looks at.
Here one interpreter per pytest process (the *zygote*) imports torch's launcher and ours once;
each launch the ``Launch`` helper asks it for is a ``fork`` of it that becomes the command, as
a ``--warm-start`` spare becomes a worker (and with that module's means):

- its own session; stdin from /dev/null; stdout and stderr the pipes the test reads (passed
  over a Unix socket); the working directory, ``os.environ`` and the C library's environment;
  ``tempfile``'s cache reset; ``sys.argv``, ``sys.orig_argv`` and ``sys.path[0]`` as
  ``python -m tui_launch`` (or ``python -m torch.distributed.run``) sets them;
- ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` showing the command and the environment
  (written over the zygote's start blocks, which were started with room for them), so that
  ``ps``, ``pkill -f`` and the suite's token search see what a fresh launcher shows;
- then the entry point's own ``main``; at its end what the interpreter would do (join
  non-daemon threads, run ``atexit``), an uncaught exception printed and exit 1.

A launch is forked only when nothing read while importing can differ: the same interpreter,
and no variable that torch, Python, the loader or a runtime library reads at import time
(``PYTHON*``, ``LD_*``, ``OMP_*``, ``TORCH*``, ``LOGLEVEL`` ...) differs from the zygote's.
Otherwise, or with ``TUILAUNCH_TEST_FORK=0``, or when the zygote cannot (it runs threads, it
is gone), the launch is a fresh ``subprocess.Popen`` as before, and the tests that start a
launcher from a shell (tmux, ``--detach``, the README's commands) always are.

The zygote reports each launcher's exit status and the CPU it and its reaped descendants
used (``wait4``), which the suite's CPU log adds to the test's.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

from tui_launch.core.workers import spare

# The modules a launch may name after ``python -m``, and what to import ahead for them.
ENTRIES = ("tui_launch", "torch.distributed.run")
PRELOAD = (
    "torch.distributed.run",
    "tui_launch.cli",
    "tui_launch.apps.launch",
    "tui_launch.core.model.store",
    "tui_launch.core.launch.args",
    "tui_launch.core.run.handle",
)
# Read while Python, the loader or torch start (the spare's list, and torch's own variables,
# which its modules read at import: TORCH_LOGS, TORCH_CPP_LOG_LEVEL, LOGLEVEL for elastic's
# loggers ...): a launch whose value differs from the zygote's starts fresh.
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "CUDA", "NCCL", "GLOO", "KINETO", "NVIDIA")
IMPORT_TIME_NAMES = frozenset({"LOGLEVEL"})
OFF_VAR = "TUILAUNCH_TEST_FORK"


def read_at_import(name: str) -> bool:
    """Whether the variable ``name`` may be read before a launch's ``main`` runs."""
    return (
        spare.import_time(name)
        or name in IMPORT_TIME_NAMES
        or name.startswith(IMPORT_TIME_PREFIXES)
    )


def _block(strings: list[str]) -> int:
    return sum(len(os.fsencode(s)) + 1 for s in strings)


# ------------------------------------------------------------------------------ the zygote


def _become(request: dict[str, Any], fds: list[int], started: int, keep_closed: list[int]) -> None:
    """In the forked child: turn into ``python -m ENTRY *argv`` and run to the end; close
    ``started`` once ``/proc`` shows the command (as ``Popen`` returns once ``exec`` did)."""
    code = 1
    try:
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        for target, fd in zip((0, 1, 2), [null, *fds], strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        spare.show_environ(env)
        cmd: list[str] = request["cmd"]
        spare.show_cmdline(cmd)
        os.close(started)
        tempfile.tempdir = None  # gettempdir() reads the new TMPDIR, as a fresh process would
        sys.argv = [cmd[2], *cmd[3:]]
        sys.orig_argv = list(cmd)
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        # What `python -m` runs: the module (a package's __main__) as __main__, not imported
        # before (torchrun's loggers are then __main__'s, as its warnings show); sys.argv[0]
        # its file. tuilaunch ends through os._exit.
        module = sys.modules.get(cmd[2])
        if module is not None and not hasattr(module, "__path__"):
            del sys.modules[cmd[2]]
        runpy._run_module_as_main(cmd[2], alter_argv=True)  # type: ignore[attr-defined]
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print before exiting 1
        traceback.print_exc()
    # What the interpreter does at its end: wait for non-daemon threads, run atexit.
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def serve(sock: socket.socket) -> None:
    """Fork a launcher per request until the socket ends; report each one's exit."""
    for name in PRELOAD:
        importlib.import_module(name)
    children: dict[int, int] = {}  # pidfd -> pid
    spare.send(sock, {"ready": True})
    while True:
        readable, _, _ = select.select([sock.fileno(), *children], [], [])
        for pidfd in [fd for fd in readable if fd in children]:
            pid = children.pop(pidfd)
            os.close(pidfd)
            _, status, usage = os.wait4(pid, 0)
            cpu = usage.ru_utime + usage.ru_stime
            code = os.waitstatus_to_exitcode(status)
            spare.send(sock, {"exit": pid, "code": code, "cpu": cpu})
        if sock.fileno() not in readable:
            continue
        got = spare.receive(sock)
        if got is None:
            return
        request, fds = got
        # Python threads only: a fork copies the calling thread, and one holding a lock
        # would leave it held. numpy's OpenBLAS starts a native pool at import (torch
        # imports numpy); it stops and restarts it around a fork itself (pthread_atfork).
        threads = threading.active_count()
        if threads != 1 or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            spare.send(sock, {"seq": request["seq"], "refused": f"{threads} threads"})
            continue
        wait_r, wait_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _become(request, fds, wait_w, [wait_r, sock.fileno(), *children])
        for fd in (*fds, wait_w):
            os.close(fd)
        os.read(wait_r, 1)  # end of file: the child shows its command (or it died)
        os.close(wait_r)
        children[os.pidfd_open(pid)] = pid
        spare.send(sock, {"seq": request["seq"], "pid": pid})


def main(argv: list[str]) -> None:
    """``SOCKFD ROOM``: the zygote (``ROOM`` is the argument that makes room for a command)."""
    os.environ.pop(spare.ROOM_VAR, None)  # its bytes stay in the start block: room for env
    sock = socket.socket(fileno=int(argv[0]))
    serve(sock)  # sys.path[0] (this folder) becomes each launch's own when it becomes one


# ------------------------------------------------------------------------------ the client


class Forked:
    """``subprocess.Popen``'s face (text mode, as ``Launch`` opens its launchers) on a
    launcher the zygote forked: ``pid``, ``args``, ``stdout``, ``stderr``, ``returncode``,
    ``poll``, ``wait``, ``communicate``, ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str], out_fd: int, err_fd: int):
        self._zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self.stdin = None
        self.stdout = open(out_fd)  # noqa: SIM115 - closed by communicate, as Popen's
        self.stderr = open(err_fd)  # noqa: SIM115
        self._read: dict[str, str] = {}
        self._readers: list[threading.Thread] = []

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(
        self, input: str | None = None, timeout: float | None = None
    ) -> tuple[str, str]:
        """Read both pipes to their end, then wait; a timeout leaves the reading going on, as
        ``Popen``'s does, for the next call."""
        assert input is None
        if not self._readers:
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):

                def read(name: str = name, stream: Any = stream) -> None:
                    self._read[name] = stream.read()
                    stream.close()

                self._readers.append(threading.Thread(target=read, daemon=True))
                self._readers[-1].start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._read.get("stdout", ""), self._read.get("stderr", "")


class Zygote:
    """The client: start the zygote; fork launchers from it (:meth:`spawn`)."""

    def __init__(self, python: str, env: dict[str, str], log: str) -> None:
        self.python = python
        self.env = dict(env)
        self.log = log  # the zygote's stderr
        self.refused: str | None = None  # why the last launch was not forked
        self.tally: collections.Counter[str] = collections.Counter()  # "forked" or why not
        self.cpu = 0.0  # CPU seconds of the launchers it reaped
        self._room = _block([f"{k}={v}" for k, v in env.items()]) + len(spare.ROOM_VAR) + 2
        self._room += spare.ROOM
        self._args_room = _block([python, __file__, "0"]) + spare.ARG_ROOM + 1
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._status: dict[int, int] = {}
        self._seq = 0
        self.alive = True
        stderr = open(log, "ab")  # noqa: SIM115 - the zygote's from here on
        try:
            self.proc = subprocess.Popen(
                [python, __file__, str(theirs.fileno()), " " * spare.ARG_ROOM],
                env={**env, spare.ROOM_VAR: "x" * spare.ROOM},
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # no terminal signal reaches it
            )
        finally:
            theirs.close()
            stderr.close()
        ready = spare.receive(self._sock)
        if ready is None or ready[0] != {"ready": True}:
            raise RuntimeError(f"the zygote did not start: {ready}")
        threading.Thread(target=self._listen, name="zygote-listen", daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                got = spare.receive(self._sock)
            except (OSError, ValueError):
                got = None
            with self._changed:
                if got is None:
                    self.alive = False
                    self._changed.notify_all()
                    return
                message = got[0]
                if "exit" in message:
                    self._status[int(message["exit"])] = int(message["code"])
                    self.cpu += float(message["cpu"])
                else:
                    self._replies[int(message["seq"])] = message
                self._changed.notify_all()

    def why_not(self, cmd: list[str], env: dict[str, str]) -> str | None:
        """Why ``cmd`` with ``env`` must start fresh (module doc); None: it may be forked."""
        if os.environ.get(OFF_VAR) == "0":
            return f"{OFF_VAR}=0"
        if not self.alive:
            return f"the zygote is gone: {self.gone()}"
        if len(cmd) < 3 or cmd[0] != self.python or cmd[1] != "-m" or cmd[2] not in ENTRIES:
            return "not python -m tui_launch or torch.distributed.run"
        differs = self.differs(env)
        if differs is not None:
            return differs
        if _block([f"{k}={v}" for k, v in env.items()]) >= self._room:
            return "its environment does not fit the zygote's start block"
        if _block(cmd) >= self._args_room:
            return "its command line does not fit the zygote's start block"
        return None

    def differs(self, env: dict[str, str]) -> str | None:
        """Which variable read at import ``env`` gives another value than the zygote's."""
        for k in sorted(set(env) | set(self.env)):
            if read_at_import(k) and env.get(k) != self.env.get(k):
                return f"{k} is read at import ({self.env.get(k)!r} in the zygote, {env.get(k)!r})"
        return None

    def gone(self) -> str:
        """The zygote's exit and the end of its stderr (why it stopped forking)."""
        code = self.proc.poll()
        with contextlib.suppress(OSError), open(self.log, errors="replace") as fp:
            return f"exit code {code}; stderr: {fp.read()[-2000:]!r}"
        return f"exit code {code}"

    def spawn(self, cmd: list[str], cwd: str, env: dict[str, str]) -> Forked | None:
        """Fork ``cmd`` in ``cwd`` with exactly ``env``; None when it must start fresh
        (``refused`` says why)."""
        forked = self._spawn(cmd, cwd, env)
        self.tally[self.refused.split(":")[0] if forked is None and self.refused else "forked"] += 1
        return forked

    def _spawn(self, cmd: list[str], cwd: str, env: dict[str, str]) -> Forked | None:
        self.refused = self.why_not(cmd, env)
        if self.refused is not None:
            return None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with self._lock:
            self._seq += 1
            seq = self._seq
            request = {"seq": seq, "cmd": cmd, "cwd": cwd, "env": env}
            try:
                spare.send(self._sock, request, (out_w, err_w))
            except OSError as e:
                self.alive = False
                self.refused = f"the request did not reach the zygote: {e}"
            finally:
                for fd in (out_w, err_w):
                    os.close(fd)
            with self._changed:
                # No time limit: a reply always comes (or the zygote's end), and a launch
                # started fresh after giving up on one could then run twice.
                self._changed.wait_for(lambda: seq in self._replies or not self.alive)
                reply = self._replies.pop(seq, None)
        if reply is None or "pid" not in reply:
            os.close(out_r)
            os.close(err_r)
            if reply is not None:
                self.refused = f"the zygote refused: {reply.get('refused')}"
            elif self.refused is None:
                self.refused = f"the zygote is gone: {self.gone()}"
            return None
        return Forked(self, int(reply["pid"]), cmd, out_r, err_r)

    def status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit code (Popen's convention), waiting up to ``timeout`` (None: for
        ever); None if it has not exited by then."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._status or not self.alive, timeout)
            return self._status.get(pid)

    def close(self) -> None:
        """End the zygote (end of its socket); launchers it forked are their tests'."""
        self.alive = False
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


if __name__ == "__main__":
    main(sys.argv[1:])
