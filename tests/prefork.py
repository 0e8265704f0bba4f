"""A tuilaunch that has already imported torch, forked once per command line it must refuse.

Dozens of tests check that a bad command line is refused (one line, exit 2, nothing created,
nothing left behind). Started as ``python -m tui_launch ...``, each of them spends ~2.5 s of
CPU importing torch before it refuses, and that import is not what they test. Here one
interpreter imports the launcher (and torch through it) once; each case is a ``fork`` of it
that becomes the command: its own session, working directory, environment (``os.environ``
and the C library's), stdout and stderr files, ``sys.argv`` and ``sys.path[0]`` as
``python -m tui_launch`` sets them, then the console script's own ``main``. What differs
from a fresh interpreter is only what the import leaves behind, which the tests that start
a real ``tuilaunch`` (in ``test_bad_input.py`` too) still cover.

Run as a program, it reads one JSON request per line on stdin,
``{"argv": [...], "cwd": ..., "env": {...}, "stdout": path, "stderr": path, "timeout": s}``,
and answers each with one JSON line, ``{"pid": ..., "code": ...}`` once the case has exited,
or ``{"pid": ..., "error": ...}`` if it outlived its timeout (it is then killed, its whole
session with it).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback


def _become(request: dict) -> None:
    """In the forked child: turn into ``python -m tui_launch *argv`` and run to the end."""
    code = 1
    try:
        os.setsid()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # gettempdir() reads the new TMPDIR, as a fresh process would
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            new = os.open(path, flags, 0o600)
            os.dup2(new, fd)
            os.close(new)
        import tui_launch.__main__ as entry
        from tui_launch import cli

        sys.argv = [entry.__file__, *request["argv"]]
        sys.path[0] = os.getcwd()  # what `python -m` puts first
        cli.main()  # exits through os._exit with the run's code
    except SystemExit as e:  # argparse's exits
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # what the interpreter would print before exiting 1
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _reap(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"pid": pid, "code": os.waitstatus_to_exitcode(status)}
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return {"pid": pid, "error": f"did not exit within {timeout} s (killed)"}


def serve() -> None:
    """Answer requests from stdin until it closes."""
    # What a launch imports before it refuses its command line: torch's launcher and ours.
    for name in (
        "torch.distributed.run",
        "tui_launch.apps.launch",
        "tui_launch.core.model.store",
        "tui_launch.core.run.args",
        "tui_launch.core.run.handle",
    ):
        importlib.import_module(name)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become(request)
        out.write(json.dumps(_reap(pid, request.get("timeout", 120))) + "\n")
        out.flush()


class Forked:
    """One command line run by :class:`Prefork`: what the tests read of a ``Launch``."""

    def __init__(self, cmd: list[str], token: str, answer: dict, out: str, err: str) -> None:
        self.cmd = cmd
        self.token = token
        self.pid: int = answer["pid"]
        self.code: int | None = answer.get("code")
        self.error: str | None = answer.get("error")
        self.stdout = out
        self.stderr = err

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Prefork:
    """The client: start the pre-imported interpreter, run command lines in forks of it."""

    def __init__(self, python: str, env: dict[str, str], scratch: str) -> None:
        import subprocess

        self.scratch = scratch
        self.proc = subprocess.Popen(
            [python, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        ready = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(ready) == {"ready": True}, ready
        self.count = 0

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float = 120) -> Forked:
        """``python -m tui_launch *argv`` in ``cwd`` with exactly ``env``, to its end."""
        self.count += 1
        out = os.path.join(self.scratch, f"{self.count}.out")
        err = os.path.join(self.scratch, f"{self.count}.err")
        request: dict[str, object] = {
            "argv": argv,
            "cwd": cwd,
            "env": env,
            "stdout": out,
            "stderr": err,
            "timeout": timeout,
        }
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        with open(out) as o, open(err) as e:
            stdout, stderr = o.read(), e.read()
        cmd = [sys.executable, "-m", "tui_launch", *argv]
        return Forked(cmd, env["TUILAUNCH_TEST_TOKEN"], answer, stdout, stderr)

    def close(self) -> None:
        """End the server (end of its stdin) and reap it."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


if __name__ == "__main__":
    serve()
