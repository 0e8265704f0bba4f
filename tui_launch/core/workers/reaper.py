"""No orphans: everything the workers started is gone when the run ends, however it ends.

Two parts:

- **Containment** (:class:`Containment`, chosen once per run by :func:`contain`). Where the
  launcher can create a cgroup v2 (root, or a delegated subtree under systemd) and the kernel
  has ``cgroup.kill`` (Linux >= 5.14), the run gets its own cgroup: every cold worker joins it
  before it execs (:meth:`Containment.wrap`), the ``--warm-start`` spare joins it before it
  forks any worker (:meth:`Containment.adopt`), and whatever they start stays in it, whether
  it changes session (``setsid``), ignores SIGTERM or outlives its worker. At the end of the
  run one write to ``cgroup.kill`` ends all of it (:meth:`Containment.sweep`). Elsewhere the
  launcher becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``: orphaned descendants are
  re-parented to it, not to init, and it reaps them) and the sweep kills every process whose
  environment carries this run's token (``TUILAUNCH_RUN_TOKEN``, which every worker and its
  children inherit; a process that clears its environment escapes this fallback).
- **The reaper** (:class:`Reaper`): torch starts each worker in a new session and sets no
  parent-death signal, so when the launcher is SIGKILLed its workers train on. One small
  process, told over a pipe the containment and every worker's pid and process group, does the
  sweep when the pipe reaches end-of-file without a goodbye. If the reaper itself dies while
  the run goes on, the launcher starts another, tells it everything again and posts a notice
  (:class:`Reaper` ``on_lost``), so a later SIGKILL of the launcher still leaves nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from tui_launch.core.workers.env import start_time

TOKEN_VAR = "TUILAUNCH_RUN_TOKEN"
CONTAINMENT_VAR = "TUILAUNCH_CONTAINMENT"
# The launcher's pid and its start time (clock ticks since boot): a later tuilaunch can tell
# the cgroup of a dead launcher from a live one's (core/workers/stale.py).
CGROUP_NAME = "tuilaunch-{pid}-{start}-{tag}"
_PR_SET_CHILD_SUBREAPER = 36

# The cold worker's first instructions: join the run's cgroup (writing "0" to cgroup.procs
# moves the writer, here the shell), then become the worker, same pid. A worker that cannot
# join (the cgroup was removed) still runs: the token sweep is the fallback. The shell sets
# PWD on start (dash and bash both do); $1 carries the worker environment's own PWD ("=value")
# or its absence ("-"), restored before the exec so that the worker's environment is exactly
# the one torch built, as under torchrun.
_JOIN = (
    'echo 0 >"$0" 2>/dev/null; case $1 in =*) PWD=${1#=}; export PWD;; *) unset PWD;; esac; '
    'shift; exec "$@"'
)


_TOKEN: list[str] = []


def run_token() -> str:
    """This launcher's run token (made once; its first part is the launcher's pid)."""
    if not _TOKEN:
        _TOKEN.append(f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    return _TOKEN[0]


def export_token() -> str:
    """Put the run token in this process's environment, so that workers inherit it.

    Only the sweep (the fallback without a cgroup) needs it: under a cgroup the workers'
    environment stays exactly the one torchrun gives them. A token inherited from another
    launcher (tuilaunch started inside a worker) is replaced.
    """
    tok = run_token()
    os.environ[TOKEN_VAR] = tok
    return tok


def sweep_expected() -> bool:
    """Whether this run will fall back to the token sweep (no cgroup v2 to create one in)."""
    return os.environ.get(CONTAINMENT_VAR) == "sweep" or cgroup2_dir()[0] is None


def cgroup2_dir() -> tuple[str | None, str]:
    """This process's cgroup v2 directory, or None and why not."""
    try:
        with open("/proc/self/cgroup") as fp:
            rel = next((ln.strip()[3:] for ln in fp if ln.startswith("0::")), None)
        with open("/proc/self/mountinfo") as fp:
            mounts = [ln.split() for ln in fp]
    except OSError as e:
        return None, f"no /proc/self/cgroup ({e.strerror})"
    if rel is None:
        return None, "this process is in no cgroup v2 hierarchy"
    for f in mounts:
        sep = f.index("-") if "-" in f else -1
        if sep < 0 or f[sep + 1] != "cgroup2":
            continue
        root, point = f[3], f[4]
        if root != "/" and not (rel == root or rel.startswith(root + "/")):
            continue
        sub = rel[len(root) :] if root != "/" else rel
        return os.path.join(point, sub.lstrip("/")), ""
    return None, "no cgroup2 file system is mounted"


class Containment:
    """How this run keeps what its workers start from outliving it (see the module)."""

    def __init__(self, token: str, cgroup: str | None, reason: str = "") -> None:
        self.token = token
        self.cgroup = cgroup
        self.reason = reason  # why there is no cgroup (empty when there is one)
        self.subreaper = False
        if cgroup is None:
            self.subreaper = _become_subreaper()

    @property
    def _procs(self) -> str:
        return os.path.join(self.cgroup or "", "cgroup.procs")

    @property
    def kind(self) -> str:
        """``cgroup`` or ``sweep``."""
        return "cgroup" if self.cgroup else "sweep"

    def describe(self) -> str:
        """One line for the run's notes: which mechanism this run uses."""
        if self.cgroup:
            return (
                f"no orphans: the workers run in cgroup {self.cgroup}; cgroup.kill ends "
                f"everything they started when the run ends"
            )
        sub = "child subreaper, " if self.subreaper else ""
        return (
            f"no orphans: {sub}sweep by {TOKEN_VAR}={self.token} when the run ends "
            f"(no cgroup v2: {self.reason})"
        )

    def wrap(self, args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        """A cold worker's command line: join the cgroup first (same pid after ``exec``, and
        the environment ``env`` unchanged)."""
        if not self.cgroup:
            return tuple(args)
        pwd = "=" + env["PWD"] if "PWD" in env else "-"
        return ("/bin/sh", "-c", _JOIN, os.path.join(self.cgroup, "cgroup.procs"), pwd, *args)

    def adopt(self, pid: int) -> None:
        """Move ``pid`` (the spare, before it forks) into the run's cgroup."""
        if self.cgroup:
            with contextlib.suppress(OSError), open(self._procs, "w") as fp:
                fp.write(str(pid))

    def members(self) -> list[int]:
        """Live processes of the run that the sweep would kill (never this process)."""
        me = os.getpid()
        if self.cgroup:
            try:
                with open(os.path.join(self.cgroup, "cgroup.procs")) as fp:
                    return [int(x) for x in fp.read().split() if int(x) != me]
            except OSError:
                return []
        return [p for p in token_pids(self.token) if p != me]

    def sweep(self, timeout: float = 5.0) -> int:
        """Kill everything of the run still there; returns how many processes that was."""
        left = self.members()
        if not left:
            return 0
        kill_contained(self.cgroup, self.token, os.getpid())
        deadline = time.monotonic() + timeout
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.02)
        # Zombies are not waited for here: a worker's Popen (torch's) may still want its
        # status. As a subreaper the launcher's orphaned zombies go when it exits.
        return len(left)

    def remove(self) -> None:
        """Remove the run's (empty) cgroup."""
        if self.cgroup:
            with contextlib.suppress(OSError):
                os.rmdir(self.cgroup)


def contain(token: str) -> Containment:
    """This run's containment: its own cgroup v2 where possible, else subreaper + token sweep
    (the token then goes into the environment the workers inherit)."""
    cgroup, why = _make_cgroup()
    if cgroup is None:
        export_token()
        return Containment(token, None, why)
    return Containment(token, cgroup)


def _make_cgroup() -> tuple[str | None, str]:
    if os.environ.get(CONTAINMENT_VAR) == "sweep":  # the fallback, on purpose (tests, odd hosts)
        return None, f"{CONTAINMENT_VAR}=sweep"
    parent, why = cgroup2_dir()
    if parent is None:
        return None, why
    start = start_time(os.getpid())
    if start is None:
        return None, "cannot read this process's start time from /proc/self/stat"
    name = CGROUP_NAME.format(pid=os.getpid(), start=start, tag=uuid.uuid4().hex[:8])
    path = os.path.join(parent, name)
    try:
        os.mkdir(path)
    except OSError as e:
        return None, f"cannot create a cgroup in {parent}: {e.strerror}"
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None, "the kernel has no cgroup.kill (Linux < 5.14)"
    return path, ""


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


# token_pids and kill_contained run in the launcher and, as source text, in the reaper's bare
# interpreter (-I -S): stdlib only (os, signal), nothing from this package.


def token_pids(token: str) -> list[int]:
    """Live processes whose environment carries ``TUILAUNCH_RUN_TOKEN=token``."""
    needle = f"TUILAUNCH_RUN_TOKEN={token}".encode() + b"\0"
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fp:
                if needle in fp.read() + b"\0":
                    with open(f"/proc/{entry}/stat") as st:
                        if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(entry))
        except OSError:
            continue
    return out


def kill_contained(cgroup: str | None, token: str, me: int) -> None:
    """SIGKILL the run's cgroup (``cgroup.kill``) or every holder of its token but ``me``."""
    if cgroup:
        try:
            with open(os.path.join(cgroup, "cgroup.kill"), "w") as fp:
                fp.write("1")
            return
        except OSError:
            pass
    for _ in range(3):  # a process forking while we kill: look again
        pids = [p for p in token_pids(token) if p != me]
        if not pids:
            return
        for p in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(OSError):
                    os.kill(p, sig)


_REAPER = (
    "from __future__ import annotations\nimport contextlib, os, signal, sys, time\n"
    + inspect.getsource(token_pids)
    + inspect.getsource(kill_contained)
    + r"""
groups = {}
cgroup = token = None
for line in sys.stdin.buffer:
    parts = line.split()
    if not parts:
        continue
    if parts[0] == b"bye":
        sys.exit(0)
    if parts[0] == b"add" and len(parts) == 3:
        groups[int(parts[1])] = int(parts[2])
    elif parts[0] == b"del" and len(parts) == 2:
        groups.pop(int(parts[1]), None)
    elif parts[0] == b"cg" and len(parts) == 2:
        cgroup = os.fsdecode(parts[1])
    elif parts[0] == b"tok" and len(parts) == 2:
        token = parts[1].decode()
for pid, pgid in groups.items():
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            if pgid == pid:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        except OSError:
            pass
if cgroup or token:
    kill_contained(cgroup, token or "-", os.getpid())
    if cgroup:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.rmdir(cgroup)
                break
            except OSError:
                time.sleep(0.02)
"""
)


class Reaper:
    """Handle on the reaper process. All methods are safe to call from any thread.

    Args:
        containment: the run's containment (None: only the registered process groups).
        on_lost: called (on the ``tuilaunch-reaper`` thread) with one line when the reaper
            process died while the run went on and was started again.
    """

    def __init__(
        self,
        containment: Containment | None = None,
        on_lost: Callable[[str], object] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._containment = containment
        self._on_lost = on_lost
        self._groups: dict[int, int] = {}
        self._closed = False
        self._proc: subprocess.Popen[bytes] | None = self._spawn()
        threading.Thread(target=self._guard, name="tuilaunch-reaper", daemon=True).start()

    @property
    def cgroup(self) -> str | None:
        """The run's cgroup directory (None: no cgroup, the token sweep)."""
        return self._containment.cgroup if self._containment is not None else None

    def _spawn(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            # The argument after the code names it in ps (and for tests): tuilaunch-reaper.
            [sys.executable, "-I", "-S", "-c", _REAPER, "tuilaunch-reaper", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Without the run token: the sweep must not find the reaper itself.
            env={k: v for k, v in os.environ.items() if k != TOKEN_VAR},
            # Its own session: a ^C on the terminal or a signal to our group must not take
            # the watchdog down before the workers.
            start_new_session=True,
        )
        c = self._containment
        lines = []
        if c is not None:
            lines += [f"tok {c.token}"] + ([f"cg {c.cgroup}"] if c.cgroup else [])
        lines += [f"add {pid} {pgid}" for pid, pgid in self._groups.items()]
        if lines and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.write("".join(x + "\n" for x in lines).encode())
                proc.stdin.flush()
        return proc

    def _guard(self) -> None:
        # The reaper must outlive the launcher: if it dies first (killed, OOM), start another
        # and tell it everything, else a later SIGKILL of the launcher would leave the
        # workers running with nobody noticing.
        while True:
            with self._lock:
                proc = self._proc
            if proc is None:
                return
            code = proc.wait()
            with self._lock:
                if self._closed or self._proc is not proc:
                    return
                try:
                    self._proc = self._spawn()
                except OSError as e:
                    self._proc = None
                    line = (
                        f"reaper: the reaper process (pid {proc.pid}) died ({_how(code)}) and "
                        f"could not be restarted ({e.strerror}): if the launcher is killed now, "
                        f"its workers outlive it"
                    )
                else:
                    line = (
                        f"reaper: the reaper process (pid {proc.pid}) died ({_how(code)}); "
                        f"restarted as pid {self._proc.pid}"
                    )
            if self._on_lost is not None:
                self._on_lost(line)

    @property
    def pid(self) -> int | None:
        """The reaper's pid (None once it has been told goodbye)."""
        with self._lock:
            return self._proc.pid if self._proc else None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def watch(self, pid: int) -> None:
        """Kill ``pid`` (and its process group when it leads one) if the launcher dies; with a
        cgroup, ``pid`` (the spare, a worker) is moved into it too."""
        if self._containment is not None:
            self._containment.adopt(pid)
        try:
            pgid = os.getpgid(pid)
        except OSError:
            return
        if pgid == os.getpgid(0):
            pgid = -1  # never our own group: that would kill the launcher's terminal peers
        with self._lock:
            self._groups[pid] = pgid
        self._send(f"add {pid} {pgid}")

    def forget(self, pid: int) -> None:
        """``pid`` has exited and was reaped: do not kill its (possibly reused) id later."""
        with self._lock:
            self._groups.pop(pid, None)
        self._send(f"del {pid}")

    def wrap_worker(self, args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        """A cold worker's command line, with the containment's first step."""
        if self._containment is None:
            return tuple(args)
        return self._containment.wrap(args, env)

    def sweep(self) -> int:
        """The run has ended: kill what its workers left behind (how many processes)."""
        return self._containment.sweep() if self._containment is not None else 0

    def close(self) -> None:
        """Say goodbye: the launcher cleaned up itself, the reaper exits killing nothing."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if self._containment is not None:
            self._containment.remove()
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"bye\n")
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def _how(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


__all__ = [
    "TOKEN_VAR",
    "Containment",
    "Reaper",
    "cgroup2_dir",
    "contain",
    "export_token",
    "kill_contained",
    "run_token",
    "sweep_expected",
    "token_pids",
]
