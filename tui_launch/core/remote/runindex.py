"""The per-user index of runs: which tuilaunch runs live (or lived) on this node, and where.

Every run, dashboard or ``--no-tui``, registers itself while it runs: one JSON file per run,
``live-<pid>-<start>.json``, in a directory only its user can read:
``$XDG_RUNTIME_DIR/tuilaunch/`` (a per-user tmpfs), else ``$XDG_STATE_HOME/tuilaunch/``
(``~/.local/state/tuilaunch/``). The directory is created 0700 and refused when it is a
symlink, belongs to another user, or is open to others; entries are 0600, written to a
temporary name opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and renamed into place (a reader
never sees half an entry, and no name is followed through a planted symlink, CWE-61).

The launch (``apps/launch.py``, on the main thread) registers the run (:class:`Registration`),
adds its run directory from a store listener once workers start, and closes the entry in its
``finally`` (and before a ``node`` injection's SIGKILL).

When the run ends (normally, with an error, or by a handled signal) its live entry is removed
and an ``ended-`` record with the outcome takes its place; only the most recent
:data:`KEEP_ENDED` records are kept. A SIGKILLed launcher cannot clean up: its live entry stays,
and :func:`state` calls it stale because its pid is gone, or now belongs to another process
(the process start time, from ``/proc/<pid>/stat``, differs from the one recorded).
:func:`sweep` (``ls``, ``attach``) removes such an entry (and its dead control socket); the
run directory stays where it is. It also ends and removes the run cgroups of dead launchers
(``core/workers/stale.py``).

Paths in an entry are absolute, resolved against the launcher's working directory when it
writes them (a relative ``--log-dir`` names a directory relative to the launcher, not to the
``attach`` run from elsewhere). The run id is the one the launcher shows: ``--standalone``
runs get a random one from torch once the agent starts, and the entry follows it
(:func:`follow`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tui_launch.core.model.events import (
    Event,
    RendezvousCompleted,
    RendezvousStarted,
    RunStarted,
    WorkersStarted,
)
from tui_launch.core.model.redact import redact_args
from tui_launch.core.workers import stale
from tui_launch.core.workers.env import start_time as proc_start_time

KEEP_ENDED = 20
# The events that carry the run id the launcher shows.
RUN_ID_EVENTS = (RunStarted, RendezvousStarted, RendezvousCompleted)
LIVE, ENDED, STALE, ELSEWHERE = "live", "ended", "stale", "other node"


class UnsafeIndexDir(Exception):
    """The index directory cannot be used safely (symlink, another owner, open to others)."""


@dataclass(frozen=True)
class Entry:
    """One run in the index."""

    pid: int
    host: str
    run_id: str
    argv: tuple[str, ...]
    started: float  # wall clock
    proc_start: int | None  # the pid's start time in clock ticks since boot (pid reuse check)
    run_dir: str | None = None
    journal: str | None = None
    ended: float | None = None
    outcome: str | None = None
    exit_code: int | None = None
    control: str | None = None  # the control socket, while the run listens on one
    detached: bool = False  # the run has no terminal (--detach, or D in its dashboard)
    slurm_job: str | None = None  # SLURM_JOB_ID when the run is part of a Slurm job
    path: str = field(default="", compare=False)  # where the entry was read from
    pruned: bool = field(default=False, compare=False)  # stale: removed by this sweep

    def to_json(self) -> str:
        """The entry as written to disk (without ``path``)."""
        data = asdict(self)
        data.pop("path")
        data.pop("pruned")
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str, path: str = "") -> Entry:
        """Parse an entry (``ValueError``/``TypeError``/``KeyError`` on a bad one)."""
        data: dict[str, Any] = json.loads(text)
        # Redacted on reading too: a record written by an older version kept secrets.
        data["argv"] = redact_args([str(a) for a in data["argv"]])
        known = {f for f in cls.__dataclass_fields__ if f not in ("path", "pruned")}
        return cls(**{k: v for k, v in data.items() if k in known}, path=path)


def index_dir(create: bool = True) -> Path:
    """The current user's index directory (created 0700 when ``create``); checked safe."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and _owned_private(runtime):
        base = Path(runtime)
    else:
        state = os.environ.get("XDG_STATE_HOME") or os.path.join(
            os.path.expanduser("~"), ".local", "state"
        )
        base = Path(state)
        if create:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = base / "tuilaunch"
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    _check_dir(path)
    return path


def _owned_private(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def _check_dir(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:  # e.g. a parent directory of another user's: say so, no traceback
        raise UnsafeIndexDir(f"{path} cannot be read ({e.strerror}): refusing to use it") from e
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeIndexDir(f"{path} is not a directory (a symlink?): refusing to use it")
    if st.st_uid != os.getuid():
        raise UnsafeIndexDir(f"{path} belongs to uid {st.st_uid}, not to you: refusing to use it")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, but made with a loose umask: close it before use


def _write_atomic(directory: Path, name: str, text: str) -> str:
    final = directory / name
    tmp = directory / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # our own leftover (same pid and thread): never another's
    fd = os.open(tmp, flags, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, final)  # rename replaces a symlink itself, never writes through it
    return str(final)


def _read_entry(path: Path) -> Entry | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > 1 << 20:
            return None
        text = os.read(fd, st.st_size + 1).decode("utf-8", "replace")
    finally:
        os.close(fd)
    try:
        return Entry.from_json(text, str(path))
    except (KeyError, TypeError, ValueError):
        return None


class Registration:
    """This process's entry: written by :meth:`register`, updated, closed at the end.

    Every method swallows ``OSError``: the index is a convenience, it never stops a run.
    """

    def __init__(self, entry: Entry, directory: Path | None) -> None:
        self._lock = threading.Lock()
        self.entry = entry
        self.directory = directory
        self.path: str | None = None
        self._closed = False
        self._name = f"live-{entry.pid}-{entry.proc_start or 0}.json"

    @classmethod
    def register(
        cls,
        argv: list[str],
        run_id: str,
        journal: str | None = None,
        slurm_job: str | None = None,
    ) -> Registration:
        """Register the calling process as a run; never raises (a broken index: no entry)."""
        pid = os.getpid()
        entry = Entry(
            pid=pid,
            host=socket.gethostname(),
            run_id=run_id,
            argv=redact_args(argv),  # the record is read by ls, status, mcp: no secrets in it
            started=time.time(),
            proc_start=proc_start_time(pid),
            journal=os.path.abspath(journal) if journal else None,
            slurm_job=slurm_job,
        )
        try:
            directory: Path | None = index_dir()
        except (OSError, UnsafeIndexDir):
            directory = None
        reg = cls(entry, directory)
        reg._write()
        return reg

    def _write(self) -> None:
        if self.directory is None:
            return
        with contextlib.suppress(OSError):
            self.path = _write_atomic(self.directory, self._name, self.entry.to_json())

    def set_run_dir(self, run_dir: str, journal: str | None) -> None:
        """The run directory is known now (torch made it): record it and the journal."""
        with self._lock:
            if self._closed or (run_dir == self.entry.run_dir and journal == self.entry.journal):
                return
            # Absolute here, in the launcher (its cwd): a relative --log-dir gives relative
            # paths, which an attach from another directory would resolve wrongly.
            journal = os.path.abspath(journal) if journal else self.entry.journal
            self.entry = replace(self.entry, run_dir=os.path.abspath(run_dir), journal=journal)
            self._write()

    def set_run_id(self, run_id: str) -> None:
        """The run id the launcher shows (torch picks a random one for ``--standalone``
        after the entry was written): ``attach RUN_ID`` finds the run by it."""
        with self._lock:
            if not self._closed and run_id and run_id != self.entry.run_id:
                self.entry = replace(self.entry, run_id=run_id)
                self._write()

    def set_control(self, path: str | None) -> None:
        """The run listens on a control socket at ``path`` (None: no longer)."""
        with self._lock:
            if not self._closed and path != self.entry.control:
                self.entry = replace(self.entry, control=path)
                self._write()

    def set_detached(self) -> None:
        """The run left its terminal (``tuilaunch ls`` says so)."""
        with self._lock:
            if not self._closed and not self.entry.detached:
                self.entry = replace(self.entry, detached=True)
                self._write()

    def close(self, outcome: str | None = None, exit_code: int | None = None) -> None:
        """The run ended: remove the live entry, keep an ``ended-`` record (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.directory is None:
                return
            self.entry = replace(
                self.entry, ended=time.time(), outcome=outcome, exit_code=exit_code, control=None
            )
            name = f"ended-{int(self.entry.ended or 0)}-{self._name[len('live-') :]}"
            with contextlib.suppress(OSError):
                _write_atomic(self.directory, name, self.entry.to_json())
            with contextlib.suppress(OSError):
                os.unlink(self.directory / self._name)
            with contextlib.suppress(OSError):
                _prune(self.directory)


def _prune(directory: Path) -> None:
    ended = sorted(p for p in directory.iterdir() if p.name.startswith("ended-"))
    for old in ended[:-KEEP_ENDED]:
        with contextlib.suppress(OSError):
            old.unlink()


def state(entry: Entry, host: str | None = None) -> str:
    """``live``, ``ended``, ``stale`` (its launcher died without cleaning up) or ``other node``."""
    if entry.ended is not None:
        return ENDED
    if entry.host != (host or socket.gethostname()):
        return ELSEWHERE
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return STALE
    except PermissionError:
        pass  # alive, someone else's now: the start time decides
    if entry.proc_start is not None and proc_start_time(entry.pid) != entry.proc_start:
        return STALE  # the pid was reused
    return LIVE


def sweep(found: list[Entry], host: str | None = None) -> list[Entry]:
    """Prune the stale runs among ``found`` (their launcher died without cleaning up: the pid
    is gone, or was reused by another process); ``found`` with those entries marked pruned.

    A stale run's live entry is removed from the index (``ls`` shows it this once, as
    ``stale (pruned)``; its run directory is kept), and so is its control socket once
    nothing answers on it (``connect`` is refused): a live run's socket, and a socket
    someone still answers on, are never touched. A run of another node is left alone (its
    pid means nothing here).

    The run cgroups of this user's dead launchers go too, with whatever still runs in them:
    a launcher SIGKILLed together with its reaper leaves its workers there
    (:func:`~tui_launch.core.workers.stale.sweep_stale`; a live launcher's is never touched).
    """
    stale.sweep_stale()
    out = []
    for e in found:
        st = state(e, host)
        if st == LIVE:
            e = _absolute(e)
        if st != STALE:
            out.append(e)
            continue
        if e.control and _dead_socket(e.control):
            with contextlib.suppress(OSError):
                os.unlink(e.control)
            e = replace(e, control=None)
        if e.path and Path(e.path).name.startswith("live-"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
            e = replace(e, path="", pruned=True)
        out.append(e)
    return out


def _absolute(e: Entry) -> Entry:
    """``e`` with relative paths (an entry of an older version) made absolute against its
    live launcher's working directory (``/proc/<pid>/cwd``), where they were meant."""
    if all(p is None or os.path.isabs(p) for p in (e.run_dir, e.journal)):
        return e
    try:
        cwd = os.readlink(f"/proc/{e.pid}/cwd")
    except OSError:
        return e
    run_dir = os.path.join(cwd, e.run_dir) if e.run_dir else None
    journal = os.path.join(cwd, e.journal) if e.journal else None
    return replace(e, run_dir=run_dir, journal=journal)


def _dead_socket(path: str) -> bool:
    """Whether ``path`` is a socket of ours that nobody listens on."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def entries(directory: Path | None = None) -> list[Entry]:
    """Every readable entry, newest first (live ones and ended records)."""
    try:
        d = directory or index_dir(create=False)
        names = [p for p in d.iterdir() if p.name.endswith(".json") and not p.name.startswith(".")]
    except (OSError, UnsafeIndexDir):
        return []
    found = [e for e in map(_read_entry, names) if e is not None]
    return sorted(found, key=lambda e: e.started, reverse=True)


def follow(
    reg: Registration,
    subscribe: Callable[[Callable[[Event], None]], None],
    where: Callable[[], tuple[str | None, str | None]],
) -> None:
    """Keep ``reg`` up to date with a run: ``subscribe`` is the store's (``replay=False``),
    ``where`` returns the run directory and journal path as far as they are known."""

    def listener(event: Event) -> None:
        # The run id the launcher shows (the header, the summary): --standalone's is torch's
        # random one, known only once the agent runs; the entry was written before.
        run_id = getattr(event, "run_id", None)
        if isinstance(event, RUN_ID_EVENTS) and isinstance(run_id, str):
            reg.set_run_id(run_id)
        if isinstance(event, WorkersStarted) and reg.entry.run_dir is None:
            run_dir, journal = where()
            if run_dir:
                reg.set_run_dir(run_dir, journal)

    subscribe(listener)


def age(seconds: float) -> str:
    """A short age: ``42s``, ``7m``, ``3h05``, ``2d04``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}"
    return f"{s // 86400}d{s % 86400 // 3600:02d}"


def format_table(found: list[Entry], now: float | None = None, host: str | None = None) -> str:
    """``tuilaunch ls``'s table: state, age, node, (the Slurm job, when a run has one,) pid,
    command, run directory."""
    now = time.time() if now is None else now
    slurm = any(e.slurm_job for e in found)
    rows: list[tuple[str, ...]] = [
        ("STATE", "AGE", "NODE", *(("SLURM JOB",) if slurm else ()), "PID", "COMMAND", "RUN DIR")
    ]
    for e in found:
        st = state(e, host)
        if st == ENDED:
            st = f"ended ({e.outcome}, exit {e.exit_code})"
        elif st == STALE and e.pruned:
            st = "stale (pruned)"  # its launcher died: this is the last ls that lists it
        elif st == LIVE and (e.detached or e.control):
            # How to come back to it: detached (no terminal) and/or listening for control.
            how = [w for w, on in (("detached", e.detached), ("control", e.control)) if on]
            st += f" ({', '.join(how)})"
        rows.append(
            (
                st,
                age(now - e.started),
                e.host,
                *((e.slurm_job or "-",) if slurm else ()),
                str(e.pid),
                _shorten(" ".join(e.argv), 70),
                e.run_dir or "(not made yet)",
            )
        )
    last = len(rows[0]) - 1  # the run directory: not padded
    widths = [max(len(r[i]) for r in rows) for i in range(last)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:last], widths, strict=True)) + "  " + r[last]
        for r in rows
    )


def _shorten(text: str, width: int) -> str:
    # The head says which launcher, the tail which script and arguments: cut the middle.
    return text if len(text) <= width else text[:20] + "…" + text[-(width - 21) :]
