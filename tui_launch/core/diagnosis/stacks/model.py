"""The typed shape of a stack dump: frames, threads, processes, ranks, and the dump itself.

Every dump path (py-spy, the kernel wait channel of a rank in ``D``, faulthandler text cut out
of a rank's stderr) produces the same frozen records, so the verdict, the grouping and the
files written to the run directory never care how a stack was taken. Records hold only str,
int, float, bool, None and tuples, so :func:`dump_to_dict` / :func:`dump_from_dict` round-trip
them through JSON.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

# How a process's stack was taken (ProcessStack.method).
PYSPY = "py-spy"
PYSPY_NONBLOCKING = "py-spy --nonblocking"
WCHAN = "wchan"
FAULTHANDLER = "faulthandler"
NONE = "none"  # nothing could be taken: see ProcessStack.error


@dataclass(frozen=True)
class Frame:
    """One Python frame: ``file`` is short (``torch/distributed/distributed_c10d.py``,
    ``train.py``), ``path`` the full file name as the interpreter knows it."""

    function: str
    file: str
    line: int
    path: str = ""

    @property
    def where(self) -> str:
        """``train.py:87 in load_batch``."""
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    """One Python thread; ``frames`` innermost first (most recent call first). ``native``: the
    C/C++ frames the thread is in above its innermost Python frame, innermost first, when
    they were read (``py-spy --native``, taken when a hang is confirmed)."""

    thread_id: int
    name: str | None
    frames: tuple[Frame, ...]
    native_id: int | None = None
    active: bool | None = None
    owns_gil: bool | None = None
    main: bool = False
    native: tuple[Frame, ...] = ()


def native_summary(frames: tuple[Frame, ...]) -> str:
    """Native frames in one line, innermost first, the library's own ones rather than the
    C library's and the C++ runtime's: ``c10d::Reducer::finalize_backward <
    c10d::Reducer::mark_variable_ready`` ("" when none were read)."""
    own = [f.function for f in frames if "::" in f.function and not f.function.startswith("std::")]
    return " < ".join(own[:2] or [f.function for f in frames[:1]])


@dataclass(frozen=True)
class ProcessStack:
    """Every Python thread of one process, the main thread first.

    ``state`` is the one-letter state from ``/proc/<pid>/stat`` when the dump started (``R``,
    ``S``, ``D``, ``T``, ...; empty when the process was gone). ``wchan`` is the kernel wait
    channel, read instead of attaching to a process in ``D``. ``error`` says in one line why
    there are no threads (py-spy's own words when it failed). ``raised``: the exception line
    of the traceback the stack was read from, when it is the rank's last words rather than a
    live read (:mod:`.lastwords`).
    """

    pid: int
    state: str
    method: str
    threads: tuple[ThreadStack, ...] = ()
    wchan: str | None = None
    error: str | None = None
    duration: float = 0.0
    cmdline: str = ""
    raised: str | None = None

    @property
    def main_thread(self) -> ThreadStack | None:
        """The main thread, or None when no stack was taken."""
        for t in self.threads:
            if t.main:
                return t
        return self.threads[0] if self.threads else None


@dataclass(frozen=True)
class RankStack:
    """One local rank: its own process and its child processes (data-loader workers, ...);
    ``more_children`` counts descendants beyond the dump's limit, not dumped."""

    local_rank: int
    global_rank: int
    process: ProcessStack
    children: tuple[ProcessStack, ...] = ()
    more_children: int = 0

    @property
    def pid(self) -> int:
        """The rank's pid."""
        return self.process.pid


@dataclass(frozen=True)
class Collective:
    """One Flight Recorder entry: collective ``seq`` of process group ``pg``, ``op``
    (``all_reduce``), the bytes in and out, torch's ``state`` (gloo's stay ``scheduled``)."""

    seq: int
    op: str
    pg: str
    in_bytes: int
    out_bytes: int
    state: str = ""
    # The group's description (``TENSOR_MODEL_PARALLEL_GROUP``; "" when the entry has none)
    # and the entry's place in the ring (torch's ``record_id``: the newest is the largest).
    desc: str = ""
    order: int = 0


@dataclass(frozen=True)
class RankRecord:
    """One rank's Flight Recorder, as its responder gave it: the newest collectives of each
    process group (oldest first), the last sequence numbers torch enqueued and completed
    (every group's together: the default group's in a job of one group) and in how many
    groups; ``error`` says why there is no record (no responder, stopped rank, recorder off)."""

    global_rank: int
    collectives: tuple[Collective, ...] = ()
    last_enqueued: int = -1
    last_completed: int = -1
    error: str | None = None
    groups: int = 1
    # The last enqueued sequence number (every group's) at other looks taken around this one
    # (the live poll's before it, a status request after the stacks): a rank whose number
    # differs between looks is moving, whatever a single look shows.
    looks: tuple[int, ...] = ()

    @property
    def moved(self) -> bool:
        """Whether the rank's sequence number advanced between two looks."""
        seen = {n for n in (*self.looks, self.last_enqueued) if n >= 0}
        return len(seen) > 1

    @property
    def last(self) -> Collective | None:
        """The newest collective of the default group (else of any group), or None; in a job
        of several groups, the newest the rank issued in any (by its place in the ring)."""
        if self.groups > 1 and self.collectives:
            return max(self.collectives, key=lambda c: (c.order, c.seq))
        default = [c for c in self.collectives if c.pg == "0"]
        pool = default or list(self.collectives)
        return max(pool, key=lambda c: c.seq) if pool else None

    def last_in(self, pg: str) -> Collective | None:
        """The newest collective of process group ``pg``, or None."""
        pool = [c for c in self.collectives if c.pg == pg]
        return max(pool, key=lambda c: c.seq) if pool else None


@dataclass(frozen=True)
class StackDump:
    """Every local rank at (nearly) one instant.

    ``wall`` is when the dump started (wall clock), ``duration`` how long it took in seconds.
    ``note`` is one line for the user when the dump is incomplete for a reason that has a fix
    (ptrace not permitted, no py-spy), else None.
    """

    reason: str
    wall: float
    duration: float
    ranks: tuple[RankStack, ...]
    method: str = PYSPY
    note: str | None = None
    records: tuple[RankRecord, ...] = ()

    def rank(self, global_rank: int) -> RankStack | None:
        """The entry of one global rank, or None."""
        for r in self.ranks:
            if r.global_rank == global_rank:
                return r
        return None


# --------------------------------------------------------------------------- file names

_SITE = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/")


def short_file(path: str) -> str:
    """A file name short enough to read: relative to site-packages or the standard library,
    else the base name. Both dump paths use it, so that py-spy and faulthandler stacks of the
    same code compare equal."""
    # The last one: a venv inside a site-packages tree still gives the package path.
    ends = [m.end() for m in _SITE.finditer(path)]
    if ends:
        return path[ends[-1] :]
    m = _STDLIB.search(path)
    if m is not None:
        return path[m.end() :]
    return path.rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- JSON


def dump_to_dict(dump: StackDump) -> dict[str, Any]:
    """``dump`` as JSON-ready data (nested dicts and lists)."""
    return dataclasses.asdict(dump)


def dump_from_dict(data: dict[str, Any]) -> StackDump:
    """Rebuild a :class:`StackDump` from :func:`dump_to_dict`'s output (read back from JSON)."""

    def frame(d: dict[str, Any]) -> Frame:
        return Frame(**d)

    def thread(d: dict[str, Any]) -> ThreadStack:
        native = tuple(frame(f) for f in d.get("native", ()))
        return ThreadStack(
            **{**d, "frames": tuple(frame(f) for f in d["frames"]), "native": native}
        )

    def process(d: dict[str, Any]) -> ProcessStack:
        return ProcessStack(**{**d, "threads": tuple(thread(t) for t in d["threads"])})

    def rank(d: dict[str, Any]) -> RankStack:
        return RankStack(
            local_rank=d["local_rank"],
            global_rank=d["global_rank"],
            process=process(d["process"]),
            children=tuple(process(c) for c in d["children"]),
            more_children=d.get("more_children", 0),
        )

    def record(d: dict[str, Any]) -> RankRecord:
        colls = tuple(Collective(**c) for c in d.get("collectives", ()))
        return RankRecord(**{**d, "collectives": colls, "looks": tuple(d.get("looks", ()))})

    return StackDump(
        **{
            **data,
            "ranks": tuple(rank(r) for r in data["ranks"]),
            "records": tuple(record(r) for r in data.get("records", ())),
        }
    )
