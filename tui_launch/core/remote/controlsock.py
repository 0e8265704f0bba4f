"""The control socket: ``tuilaunch attach --control`` steers a running job from another terminal.

Off unless asked for: the launcher listens only when started with ``--control-socket`` or
``--detach``, or after ``D`` in its dashboard (detaching is asking to come back with a
cockpit). It is a Unix socket, never TCP: ``control.sock`` in the run directory, or, when that
path (or the private one it is first bound at, ~25 bytes longer) is too long for a Unix socket
address (108 bytes), ``ctl-<pid>.sock`` in the per-user run index directory (0700); either way
the path is recorded in the run index (``Entry.control``).

Who may connect:

- the file is bound inside a fresh 0700 directory, made 0600, then renamed into place, so
  nobody else can ever connect to it, not even in the instant after ``bind``;
- each peer's credentials are read with ``SO_PEERCRED``: only the launcher's own uid, and root,
  are served; anything else is told why, journaled, and dropped;
- a client checks the other way round before it sends anything (:func:`check_socket`): the
  file must be a socket of its own uid with no access for group or others, and the process
  behind it must run as its uid (or root).

The protocol is one JSON object per line. A connection starts with a hello naming its mode
(``control`` or ``read``); a ``read`` connection may ask ``status`` and nothing else: every
command it sends is refused (and journaled as refused). A command is data,
``{"cmd": {"kind": ..., ...}}`` (:mod:`tui_launch.core.model.commands`), executed by
:meth:`~tui_launch.core.run.handle.RunHandle.execute`: ``signal`` (kill, SIGTERM, SIGSTOP,
SIGCONT of a rank), ``restart``, ``inject``, ``dump`` and ``stop`` (the whole job); the answer
is its :class:`~tui_launch.core.model.commands.Outcome`. Each is journaled as a
:class:`~tui_launch.core.model.events.ControlAction` whose ``source`` names the client:
``attach pid <pid> uid <uid>`` (``ctl`` or ``mcp`` in place of ``attach`` when the hello names
that tool; the pid and uid from ``SO_PEERCRED``, never from anything the client says).

Nothing here can slow the agent: the socket carries commands and their answers only (an
attached dashboard reads what it shows from the journal, which the launcher writes whether or
not anyone reads it); every connection has its own thread with a send and receive timeout
(:data:`TIMEOUT`), lines are bounded (:data:`MAX_LINE`) and at most :data:`MAX_CLIENTS`
connections are served at once. The agent thread never touches a socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tui_launch.core.model.commands import (
    Command,
    DumpStacks,
    Inject,
    Outcome,
    SignalRank,
    StopRun,
    command_from_dict,
    command_to_dict,
    control_event,
    refused_event,
)
from tui_launch.core.model.events import ControlAction, Event, WorkersStarted
from tui_launch.core.model.layout import RunDirLayout
from tui_launch.core.model.progress import progress_rows

if TYPE_CHECKING:
    from tui_launch.core.run.handle import RunHandle

HELLO = "tuilaunch-control"
CLIENTS = ("attach", "ctl", "mcp")  # the tools that name themselves in their hello
MAX_PATH = 107  # sun_path is 108 bytes with its NUL
# bind_private binds at <dir>/<PRIVATE_PREFIX><8 random characters>/s first, then renames:
# that path, longer than control.sock's, is the one that must fit.
PRIVATE_PREFIX = ".tuilaunch-ctl-"
_PRIVATE_EXTRA = len("/" + PRIVATE_PREFIX + "12345678" + "/s")
MAX_CLIENTS = 16
MAX_LINE = 1 << 16
TIMEOUT = 5.0  # a client that neither sends nor reads for this long is dropped
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}
SIGNALS.update(SIGSTOP=signal.SIGSTOP, SIGCONT=signal.SIGCONT, SIGINT=signal.SIGINT)


class ControlError(Exception):
    """The control socket cannot be used (a one-line reason)."""


# ------------------------------------------------------------------ credentials


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return pid, uid, gid


def peer_allowed(uid: int, owner: int | None = None) -> bool:
    """Whether a peer running as ``uid`` may use a socket of ``owner`` (default: us): the same
    user, or root."""
    return uid == (os.getuid() if owner is None else owner) or uid == 0


def check_socket(path: str) -> None:
    """Refuse (ControlError) a socket file that is not ours alone: not a socket, a symlink,
    another uid's, or open to group or others."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise ControlError(f"no control socket at {path} ({e.strerror})") from e
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlError(f"{path} is not a socket: refusing it")
    if st.st_uid != os.getuid():
        raise ControlError(f"{path} belongs to uid {st.st_uid}, not to you: refusing it")
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise ControlError(f"{path} has mode {mode:04o}, open to others: refusing it")


# ------------------------------------------------------------------ where it lives


def socket_path(run_dir: str, fallback_dir: str | None, pid: int | None = None) -> str | None:
    """``run_dir/control.sock`` when short enough, else ``fallback_dir/ctl-<pid>.sock``;
    None when neither fits in a Unix socket address."""
    first = RunDirLayout(os.path.abspath(run_dir)).control_socket
    if _fits(first):
        return first
    if fallback_dir:
        second = os.path.join(fallback_dir, f"ctl-{pid or os.getpid()}.sock")
        if _fits(second):
            return second
    return None


def _fits(path: str) -> bool:
    """Whether :func:`bind_private` can bind ``path``: it and the private path beside it."""
    parent = len(os.fsencode(os.path.dirname(path)))
    return max(len(os.fsencode(path)), parent + _PRIVATE_EXTRA) <= MAX_PATH


def bind_private(path: str) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from the first instant (bound in a 0700
    directory beside it, then renamed into place)."""
    parent = os.path.dirname(path)
    private = tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=parent)  # 0700
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        tmp = os.path.join(private, "s")
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # a stale socket of ours (the same pid, reused)
        os.rename(tmp, path)
        sock.listen(MAX_CLIENTS)
    except OSError:
        sock.close()
        raise
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return sock


def prune_stale(directory: str) -> None:
    """Remove the ``ctl-<pid>.sock`` files of launchers that are gone (a SIGKILLed one
    cannot remove its own)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            pid = name[len("ctl-") : -len(".sock")]
            if not (name.startswith("ctl-") and name.endswith(".sock") and pid.isdigit()):
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
            except PermissionError:
                pass  # alive


# ------------------------------------------------------------------ the server


class ControlServer:
    """The launcher's end: serves the control API of ``run`` on a Unix socket.

    Args:
        run: the run's handle (commands go through its control API).
        fallback_dir: where the socket goes when the run directory's path is too long (the
            run index directory); None: nowhere.
        on_listen: called with the socket's path once it listens (the run index records it).
    """

    def __init__(
        self,
        run: RunHandle,
        fallback_dir: str | None = None,
        on_listen: Callable[[str], None] | None = None,
    ) -> None:
        self.run = run
        self.fallback_dir = fallback_dir
        self.on_listen = on_listen
        self.path: str | None = None
        self.wanted = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closed = False
        self._clients = threading.BoundedSemaphore(MAX_CLIENTS)

    def enable(self) -> None:
        """Listen as soon as the run directory is known (now, if it is)."""
        with self._lock:
            self.wanted = True
        run_dir = self.run.run_dir
        if run_dir:
            self.start(run_dir)

    def listener(self, event: Event) -> None:
        """A store listener: the run directory exists once workers start."""
        if isinstance(event, WorkersStarted) and self.wanted and self._sock is None:
            self.start(self.run.run_dir)

    def start(self, run_dir: str | None) -> str | None:
        """Bind and serve (once); returns the path, or None (no usable path, or an error: a
        ``Notice`` says why)."""
        from tui_launch.core.model.events import Notice

        with self._lock:
            if self._sock is not None or self._closed or not run_dir:
                return self.path
            path = socket_path(run_dir, self.fallback_dir)
            if self.fallback_dir and path and os.path.dirname(path) == self.fallback_dir:
                prune_stale(self.fallback_dir)
            if path is None:
                self.run.store.post(
                    Notice("warn", "no control socket: every candidate path is too long")
                )
                return None
            try:
                self._sock = bind_private(path)
            except OSError as e:
                self.run.store.post(Notice("warn", f"no control socket at {path}: {e}"))
                return None
            self.path = path
            thread = threading.Thread(target=self._accept, name="tuilaunch-control", daemon=True)
            thread.start()
        if self.on_listen is not None:
            self.on_listen(path)
        return path

    def close(self) -> None:
        """Stop listening and remove the socket file (idempotent)."""
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
            sock.close()
            if self.path:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)

    def _accept(self) -> None:
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            if not self._clients.acquire(blocking=False):
                _send(conn, {"ok": False, "error": f"more than {MAX_CLIENTS} clients"})
                conn.close()
                continue
            t = threading.Thread(
                target=self._serve, args=(conn,), name="tuilaunch-control-client", daemon=True
            )
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(TIMEOUT)
                self._session(conn)
        except (OSError, ValueError):
            pass  # a client gone, silent or garbled: only its own connection ends
        finally:
            self._clients.release()

    def _session(self, conn: socket.socket) -> None:
        pid, uid, _ = peer_cred(conn)
        lines = _lines(conn)
        first = next(lines, None)
        if first is None:
            return  # connected and left without a word
        # The hello first, even from a peer about to be refused: the refusal is then an
        # answer it reads, not a connection reset under its first write.
        hello = _request(first)
        if hello is None:
            _send(conn, {"ok": False, "error": "not a tuilaunch control client"})
            return
        # Which tool the client is only labels the journal line and names its dumps; who it
        # is (pid, uid) is read from SO_PEERCRED, never taken from what it says.
        client = next((c for c in CLIENTS if hello.get("client") == c), "attach")
        who = f"{client} pid {pid} uid {uid}"
        if not peer_allowed(uid):
            reason = f"refused: uid {uid} is not the run's owner (uid {os.getuid()})"
            self.run.store.post(ControlAction.on_run("connect", who, False, reason))
            _send(conn, {"ok": False, "error": reason})
            return
        mode = hello.get("mode") if hello.get("hello") == HELLO else None
        if mode not in ("control", "read"):
            _send(conn, {"ok": False, "error": "not a tuilaunch control client"})
            return
        if mode == "read":
            who = f"{client} (read-only) pid {pid} uid {uid}"
        _send(conn, {"ok": True, "pid": os.getpid(), "run_dir": self.run.run_dir, "mode": mode})
        for line in lines:
            request = _request(line)
            if request is None:  # answered, and the connection goes on: one bad line is not fatal
                _send(conn, {"ok": False, "detail": "bad request: not a JSON object"})
                continue
            _send(conn, self.handle(request, who, control=mode == "control", client=client))

    def handle(
        self, request: dict[str, Any], who: str, control: bool, client: str = "attach"
    ) -> dict[str, Any]:
        """Answer one request from ``who`` (the journaled source): ``{"cmd": "status"}``, or
        ``{"cmd": {...}}``, a command as :func:`command_to_dict` writes it. ``control``: the
        connection may act (else every command is refused, and journaled as refused).
        ``client``: the tool that asked (``attach``, ``ctl``, ``mcp``), the reason its dumps
        give (their directory's name ends with it)."""
        raw = request.get("cmd")
        run = self.run
        if raw == "status":
            snap = run.store.snapshot()
            stopped = [r.local_rank for r in snap.ranks if run.is_stopped(r.local_rank)]
            return {
                "ok": True,
                "pid": os.getpid(),
                "phase": snap.phase,
                "done": run.done,
                "stopped": stopped,
                # Fresher than the journal's progress records (one every 10 s): status reads it.
                "attempt": snap.attempt,
                "progress": progress_rows(snap.progress, snap.attempt),
                # When that reading was taken (status says how old it is).
                "progress_wall": snap.progress.latest.wall if snap.progress else None,
            }
        if not isinstance(raw, dict):
            return {"ok": False, "detail": f"unknown command {raw!r}"}
        try:
            cmd = command_from_dict(raw)
        except ValueError as e:
            return {"ok": False, "detail": f"bad command: {e}"}
        if not cmd.remote:
            return {"ok": False, "detail": f"unknown command {cmd.kind!r}"}
        # Who asked is read from SO_PEERCRED, never taken from what the client says.
        cmd = replace(cmd, source=who)
        if not control:
            detail = "refused: a read-only connection (attach without --control)"
            run.store.post(refused_event(cmd, detail))
            return {"ok": False, "detail": detail}
        if isinstance(cmd, SignalRank | StopRun) and cmd.sig not in SIGNALS.values():
            return {"ok": False, "detail": f"bad {cmd.kind} request: signal {cmd.sig}"}
        if isinstance(cmd, StopRun):  # the whole job, as q in the launcher's own dashboard
            cmd = replace(cmd, reason=f"stop from {who}")
        elif isinstance(cmd, DumpStacks):  # the dump's directory and event name the tool
            cmd = replace(cmd, reason=client)
        outcome = run.execute(cmd)
        if isinstance(cmd, Inject):
            # Scheduling journals nothing of its own (each firing is an Injected later): a
            # request from afar is journaled here, refused or not.
            detail = f"{cmd.spec}: {outcome.detail}"
            run.store.post(control_event(cmd, outcome.ok, detail))
        return outcome.to_dict()


def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")


def _request(line: str) -> dict[str, Any] | None:
    """A line a peer sent, as the JSON object every message is; None when it is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _lines(conn: socket.socket) -> Any:
    """The lines a peer sends (bounded: a longer one ends the connection)."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode("utf-8", "replace")
        if len(buf) > MAX_LINE:
            raise ValueError("line too long")
        data = conn.recv(65536)
        if not data:
            return
        buf += data


# ------------------------------------------------------------------ the client


class ControlClient:
    """The attaching end: one short connection per request, checked both ways.

    Args:
        path: the socket (checked with :func:`check_socket` before every connection).
        mode: ``control`` (may act) or ``read`` (status only).
        timeout: seconds to wait for an answer (a stack dump takes seconds).
        client: the tool asking (one of :data:`CLIENTS`), which the journaled source names.
    """

    def __init__(
        self, path: str, mode: str = "control", timeout: float = 30.0, client: str = "attach"
    ) -> None:
        self.path = path
        self.mode = mode
        self.timeout = timeout
        self.client = client

    def send(self, cmd: Command) -> Outcome:
        """Have the launcher execute ``cmd``; its outcome (ControlError: no answer, or the
        connection refused)."""
        return Outcome.from_dict(self.request({"cmd": command_to_dict(cmd)}))

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        """Send a request by name (``status``) and return the answer (ControlError: no
        answer, or refused)."""
        return self.request({"cmd": cmd, **args})

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return the answer (ControlError: no answer, or refused)."""
        check_socket(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            _, uid, _ = peer_cred(sock)
            if not peer_allowed(uid):
                raise ControlError(f"the process behind {self.path} runs as uid {uid}: refusing")
            _send(sock, {"hello": HELLO, "mode": self.mode, "client": self.client})
            lines = _lines(sock)
            hello = json.loads(next(lines))
            if not hello.get("ok"):
                raise ControlError(str(hello.get("error", "refused")))
            _send(sock, obj)
            answer: dict[str, Any] = json.loads(next(lines))
            return answer
        except (OSError, StopIteration, ValueError) as e:
            if isinstance(e, ControlError):
                raise
            raise ControlError(f"no answer from {self.path} ({e or type(e).__name__})") from e
        finally:
            sock.close()


def find(target: str | None) -> tuple[str, str | None]:
    """The (control socket, journal) of the live run ``target`` names (a run directory, a pid
    or a run id; default: the only live run); ControlError with a one-line reason."""
    from tui_launch.core.remote import runindex

    live = [e for e in runindex.sweep(runindex.entries()) if runindex.state(e) == runindex.LIVE]
    if target is not None:
        where = os.path.abspath(target) if os.path.isdir(target) else None
        live = [e for e in live if target in (str(e.pid), e.run_id) or e.run_dir == where]
    if not live:
        raise ControlError(f"no live run{'' if target is None else ' ' + repr(target)} here")
    if len(live) > 1:
        pids = ", ".join(str(e.pid) for e in live)
        raise ControlError(f"{len(live)} live runs (pids {pids}): name one (tuilaunch ls)")
    entry = live[0]
    if not entry.control:
        raise ControlError(
            f"run {entry.pid} does not listen for control: start it with --control-socket "
            "(or --detach, or press D in its dashboard); a read-only attach works without"
        )
    return entry.control, entry.journal
