"""One owner of this node's rank state: :class:`RankTable`.

Per attempt: each local rank's pid and global rank, the exits seen (and whether torch had
already begun terminating the group when each was seen), the ranks tuilaunch stopped and has
not continued, and the notes ("SIGKILL sent by tuilaunch") that make a failure's
``caused_by``. Control, fault injection, failure collection and shutdown all read and change
it here, under its one lock; nothing else keeps a copy.

Also the two process helpers they share: :func:`signal_group` and :func:`process_alive`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``'s process group if it leads one (workers do), else to ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass


def stopped_by_signal(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (``/proc`` state ``T``: SIGSTOP, SIGTSTP, ...).

    Not a process stopped by its tracer (``t``: a debugger's), which only its tracer resumes.
    """
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[-1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def process_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


@dataclass(frozen=True)
class RankInfo:
    """One local rank of the current attempt, read at one instant."""

    pid: int | None
    global_rank: int | None
    alive: bool  # started in this attempt, and no exit seen yet
    stopped: bool  # stopped by tuilaunch and not continued


@dataclass(frozen=True)
class RankExit:
    """A rank's exit, as first recorded."""

    local_rank: int
    global_rank: int
    pid: int
    exit_code: int
    by_agent: bool  # first seen once torch had begun terminating the group
    wall: float


@dataclass(frozen=True)
class RanksView:
    """A copy of the table for one attempt (what failure collection needs)."""

    attempt: int
    pids: Mapping[int, int] = field(default_factory=dict)
    global_ranks: Mapping[int, int] = field(default_factory=dict)
    exits: Mapping[int, int] = field(default_factory=dict)
    exit_times: Mapping[int, float] = field(default_factory=dict)
    by_agent: frozenset[int] = frozenset()
    marks: Mapping[int, str] = field(default_factory=dict)  # by pid


class RankTable:
    """The ranks of this node's current attempt, and what tuilaunch did to them."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._attempt = -1
        self._world_size = 0
        self._pids: dict[int, int] = {}
        self._global_ranks: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._exit_times: dict[int, float] = {}
        self._by_agent: set[int] = set()
        self._stopped: set[int] = set()
        self._marks: dict[int, str] = {}  # by pid: kept across attempts (pids are not reused)
        self._thaw_attempt = -1  # the attempt whose stopped ranks were let go for good

    # ------------------------------------------------------------------ reading

    @property
    def attempt(self) -> int:
        """The current attempt (-1 before the first workers start)."""
        with self._lock:
            return self._attempt

    @property
    def world_size(self) -> int:
        """The job's world size in the current attempt (0 before the first)."""
        with self._lock:
            return self._world_size

    def info(self, local_rank: int) -> RankInfo:
        """``local_rank``'s pid, global rank, and whether it runs or is stopped, at once."""
        with self._lock:
            pid = self._pids.get(local_rank)
            return RankInfo(
                pid=pid,
                global_rank=self._global_ranks.get(local_rank),
                alive=pid is not None and local_rank not in self._exits,
                stopped=local_rank in self._stopped,
            )

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch has stopped this rank and not continued it."""
        with self._lock:
            return local_rank in self._stopped

    def pids(self) -> list[int]:
        """Every worker pid of the current attempt, exited or not."""
        with self._lock:
            return list(self._pids.values())

    def current(self, attempt: int) -> bool:
        """Whether ``attempt`` is the current one and its stopped ranks were not let go."""
        with self._lock:
            return attempt == self._attempt and self._thaw_attempt != attempt

    def exits(self) -> dict[int, int]:
        """Local rank -> exit code of the current attempt's ranks seen exiting so far."""
        with self._lock:
            return dict(self._exits)

    def view(self) -> RanksView:
        """A copy of the current attempt's state."""
        with self._lock:
            return RanksView(
                attempt=self._attempt,
                pids=dict(self._pids),
                global_ranks=dict(self._global_ranks),
                exits=dict(self._exits),
                exit_times=dict(self._exit_times),
                by_agent=frozenset(self._by_agent),
                marks=dict(self._marks),
            )

    # ------------------------------------------------------------------ changing

    def begin_attempt(
        self, pids: Mapping[int, int], global_ranks: Mapping[int, int], world_size: int
    ) -> int:
        """A new attempt's workers run: forget the last one's. Returns the new number."""
        with self._lock:
            self._attempt += 1
            self._world_size = world_size
            self._pids = dict(pids)
            self._global_ranks = dict(global_ranks)
            self._exits = {}
            self._exit_times = {}
            self._by_agent = set()
            self._stopped = set()
            return self._attempt

    def record_exits(
        self, codes: Mapping[int, int | None], by_agent: bool
    ) -> tuple[list[RankExit], dict[int, int]]:
        """Record the exit codes of ranks not seen exiting before.

        Returns the exits new in this call (each rank's exit is recorded once, with the
        ``by_agent`` of the call that first saw it) and every exit seen so far.
        """
        now = time.time()
        new: list[RankExit] = []
        with self._lock:
            for lr, code in codes.items():
                if code is None or lr in self._exits:
                    continue
                self._exits[lr] = code
                self._exit_times[lr] = now
                if by_agent:
                    self._by_agent.add(lr)
                new.append(
                    RankExit(
                        local_rank=lr,
                        global_rank=self._global_ranks.get(lr, lr),
                        pid=self._pids.get(lr, -1),
                        exit_code=code,
                        by_agent=by_agent,
                        wall=now,
                    )
                )
            return new, dict(self._exits)

    def mark(self, pid: int, note: str) -> None:
        """Note that tuilaunch did something to ``pid`` (a failure's ``caused_by``)."""
        with self._lock:
            self._marks[pid] = note

    def set_stopped(self, local_rank: int, stopped: bool) -> None:
        """Record that tuilaunch stopped (or continued) this rank."""
        with self._lock:
            if stopped:
                self._stopped.add(local_rank)
            else:
                self._stopped.discard(local_rank)

    def continue_stopped(self) -> None:
        """SIGCONT every stopped rank, and stop no rank of this attempt again.

        A SIGSTOPped rank leaves torch's SIGTERM pending and would cost the whole shutdown
        timeout: let it run again so that it can die (and a ``slow`` injection may not stop it
        again). That is every rank tuilaunch stopped, and every live rank stopped by someone
        else (``kill -STOP``, a debugger's SIGSTOP): torch is about to terminate them all.
        """
        with self._lock:
            self._thaw_attempt = self._attempt
            ours = {self._pids[lr] for lr in self._stopped if lr in self._pids}
            live = [p for lr, p in self._pids.items() if lr not in self._exits]
            self._stopped.clear()
        for pid in [*ours, *(p for p in live if p not in ours and stopped_by_signal(p))]:
            signal_group(pid, signal.SIGCONT)

    def still_hung(self, local_rank: int, pid: int, attempt: int) -> bool:
        """Whether a ``hang`` of ``pid`` in ``attempt`` still holds (not continued, no restart)."""
        with self._lock:
            return (
                self._attempt == attempt
                and self._pids.get(local_rank) == pid
                and local_rank in self._stopped
            )

    def pause(
        self, local_rank: int, pid: int, attempt: int, stop: bool, monitored: Callable[[], bool]
    ) -> bool:
        """Stop (or continue) a rank for a ``slow`` injection; False once that must end.

        The lock is held while signalling, so :meth:`continue_stopped` cannot slip in between
        the check and the SIGSTOP. ``monitored`` says whether the runner still watches the
        attempt (it takes the runner's lock: always this lock first, then that one).
        """
        with self._lock:
            if stop and not (
                attempt == self._attempt
                and self._thaw_attempt != attempt
                and monitored()
                and self._pids.get(local_rank) == pid
                and local_rank not in self._exits
            ):
                return False
            if not stop and local_rank not in self._stopped:
                return False
            signal_group(pid, signal.SIGSTOP if stop else signal.SIGCONT)
            if stop:
                self._stopped.add(local_rank)
            else:
                self._stopped.discard(local_rank)
            return True

    def kill_all(self, sig: int, grace: float = 0.0) -> None:
        """Send ``sig`` (and SIGCONT) to every running rank's group; SIGKILL what is left
        after ``grace`` seconds."""
        with self._lock:
            pids = [p for lr, p in self._pids.items() if lr not in self._exits]
        for pid in pids:
            signal_group(pid, sig)
            signal_group(pid, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while grace and time.monotonic() < deadline and any(process_alive(p) for p in pids):
            time.sleep(0.05)
        for pid in pids:
            if process_alive(pid):
                signal_group(pid, signal.SIGKILL)
