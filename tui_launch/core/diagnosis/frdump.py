"""Flight Recorder dumps from anywhere, read as plain data: NCCL's pickles, JSON, tuilaunch's.

A dump is one rank's Flight Recorder as torch wrote it: NCCL's dump-on-timeout files
(``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank: a pickle), the same dictionary as JSON
(``_dump_nccl_trace_json``, ``_dump_fr_trace_json``), and the records tuilaunch's responders
keep in a stack dump (``stacks/<dump>/flightrec/rank<N>.json``). Every version torch 2.4-2.13
writes (``version`` "2.2" to "2.10") has the same three parts, each read here with a fallback
for the keys older versions lack:

- ``pg_config``: each process group by name: its description (``TENSOR_MODEL_PARALLEL_GROUP``)
  and its global ranks (a string ``"[0, 1]"`` or a list);
- ``pg_status``: by the group's *local* id (``ProcessGroupNCCL::uid_``): the last collective
  enqueued, started and completed (absent before 2.5; the group's name is found from the
  entries, else from the order of creation, which both numberings follow);
- ``entries``: the ring of collectives and point-to-point operations (op, sizes, dtypes, state,
  ``collective_seq_id`` or the old ``seq_id``).

Pickles come from other machines: :class:`PlainUnpickler` refuses every global and every
persistent id, so a dump can only ever be dicts, lists, strings and numbers; a pickle that
names one (``os.system``) raises :class:`HostileDump`. No torch import: pure standard library.
:func:`load_dir` reads a directory (a rank is the number a file's name ends with, as torch's
own loader infers it); :func:`load_file` one file.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.model.layout import RunDirLayout, dump_records_dir

__all__ = [
    "MAX_BYTES",
    "MAX_RANK",
    "BadDump",
    "DumpSet",
    "Entry",
    "GroupInfo",
    "HostileDump",
    "NotADump",
    "PgStatus",
    "PlainUnpickler",
    "RankDump",
    "dump_from_dict",
    "entry_from_dict",
    "is_run_dir",
    "load_dir",
    "load_file",
    "load_run",
    "loads",
    "rank_of",
]

# Larger than any ring torch keeps (20,000 entries of a few hundred bytes each): a file larger
# than this is not a Flight Recorder dump, and is not read into memory.
MAX_BYTES = 256 << 20
# A rank is the number a file's name ends with (``nccl_trace_rank_12``, ``_dump_12``,
# ``rank12.json``), before an optional extension.
# The newest stack dumps of a run looked at for records.
RUN_DUMPS = 20
# No job has this many ranks: a longer number ending a file's name is a timestamp or an id.
MAX_RANK = 1 << 22
# Files that end in a number and are never dumps (logs, sockets beside the dumps).
_NOT_DUMPS = (".log", ".txt", ".sock", ".lock")
_RANK = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")


class BadDump(ValueError):
    """A file that is not a readable Flight Recorder dump (truncated, not a dump at all)."""


class NotADump(BadDump):
    """Data that is no Flight Recorder dump at all (another program's JSON)."""


class HostileDump(BadDump):
    """A pickle that names a global (a class or a function): never plain data, never loaded."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler for plain data only: every global and persistent id is refused.

    A Flight Recorder dump is dicts, lists, tuples, strings, numbers, booleans and None;
    none of those needs a global, so refusing them all refuses every way a pickle can run
    code (``REDUCE`` needs a callable, which only a global provides)."""

    def find_class(self, module: str, name: str) -> Any:
        """Refuse: a dump names no class or function."""
        raise HostileDump(f"refused a pickle global {module}.{name} (a dump is plain data)")

    def persistent_load(self, pid: Any) -> Any:
        """Refuse: a dump has no persistent ids."""
        raise HostileDump("refused a pickle persistent id (a dump is plain data)")


def loads(data: bytes) -> dict[str, Any]:
    """A dump's bytes (pickle or JSON) as a dictionary; BadDump (HostileDump) when not one."""
    if data[:1] == b"\x80":
        try:
            obj = PlainUnpickler(io.BytesIO(data)).load()
        except HostileDump:
            raise
        except Exception as e:  # a truncated or corrupt pickle raises many kinds
            raise BadDump(f"not a readable pickle ({type(e).__name__}: {e})") from None
    else:
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise BadDump("neither a pickle nor JSON") from None
    if not isinstance(obj, dict) or not (
        "entries" in obj or "pg_config" in obj or "pg_status" in obj
    ):
        raise NotADump("not a Flight Recorder dump (no entries, pg_config or pg_status)")
    return obj


@dataclass(frozen=True, slots=True)
class Entry:
    """One operation of a rank's ring: a collective (``seq`` counts per group) or a
    point-to-point one (``p2p``; ``p2p_seq`` counts per group, ``peer`` its global rank)."""

    group: str
    desc: str
    op: str
    seq: int
    p2p: bool
    p2p_seq: int
    state: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...] | str
    output_dtypes: tuple[str, ...] | str
    record_id: int = -1
    created_ns: int = 0
    pg_id: int = -1
    # "send 0->3": the group-local source and destination.
    src: int = -1
    dst: int = -1
    frame: str = ""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group as a dump's ``pg_config`` says it (``members``: its ranks as a set,
    shared by every dump that lists the same ranks)."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    members: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class PgStatus:
    """A group's last collective enqueued and completed on one rank (-1: not known)."""

    enqueued: int
    completed: int


@dataclass
class RankDump:
    """One rank's dump: its groups, their status by group name, its entries."""

    rank: int
    path: str
    version: str
    groups: dict[str, GroupInfo]
    status: dict[str, PgStatus]
    entries: list[Entry]


@dataclass
class DumpSet:
    """Every rank's dump found under a path; ``unreadable`` the files that are not dumps."""

    path: str
    dumps: dict[int, RankDump] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def world(self) -> tuple[int, ...]:
        """Every global rank a dump's groups name (so a rank with no dump is seen too)."""
        ranks: set[int] = set(self.dumps) | set(self.unreadable)
        seen: set[int] = set()
        for d in self.dumps.values():
            for g in d.groups.values():
                if id(g.ranks) not in seen:  # one shared list per group, read once
                    seen.add(id(g.ranks))
                    ranks.update(g.ranks)
        return tuple(sorted(ranks))


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list | tuple):
        return ()
    out = []
    for shape in value:
        if isinstance(shape, list | tuple):
            out.append(tuple(_int(d, 0) for d in shape))
    return tuple(out)


def _dtypes(value: Any) -> tuple[str, ...] | str:
    # torch writes a list; torch's own tests write one string (and compare ``set()`` of it):
    # kept as given, so the comparison is torch's.
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return ()


def _frame(frames: Any) -> str:
    if isinstance(frames, list) and frames and isinstance(frames[0], dict):
        f = frames[0]
        where = os.path.basename(str(f.get("filename", "?")))
        return f"{f.get('name', '?')} ({where}:{f.get('line', '?')})"
    return ""


# Every member of a job's big groups lists the same ranks (the default group's 4,096 ranks, in
# every one of 4,096 dumps): parsed once, one tuple and one frozenset shared by all.
_RANKS_SEEN: dict[str, tuple[tuple[int, ...], frozenset[int]]] = {}


def _ranks(value: Any) -> tuple[tuple[int, ...], frozenset[int]]:
    key = value if isinstance(value, str) else repr(value)
    hit = _RANKS_SEEN.get(key)
    if hit is not None:
        return hit
    if isinstance(value, str):
        ranks = tuple(int(n) for n in re.findall(r"-?\d+", value))
    elif isinstance(value, list | tuple):
        ranks = tuple(_int(n) for n in value)
    else:
        ranks = ()
    if len(_RANKS_SEEN) > 100_000:
        _RANKS_SEEN.clear()
    hit = _RANKS_SEEN[key] = (ranks, frozenset(ranks))
    return hit


def entry_from_dict(e: dict[str, Any]) -> Entry:
    """One ring entry as an :class:`Entry` (every version's keys; torch's tests' strings)."""
    name = str(e.get("profiling_name", "") or "")
    op = name.split(":", 1)[1] if ":" in name else name
    src = dst = -1
    kind, _, meta = op.partition(" ")
    if kind == "send" and "->" in meta:
        s, _, d = meta.partition("->")
        src, dst = _int(s), _int(d)
    elif kind == "recv" and "<-" in meta:
        d, _, s = meta.partition("<-")
        src, dst = _int(s), _int(d)
    pg = e.get("process_group")
    if isinstance(pg, list | tuple) and len(pg) == 2:
        group, desc = str(pg[0]), str(pg[1])
    else:
        group, desc = str(e.get("pg_id", "0")), "undefined"
    p2p = bool(e.get("is_p2p", kind in ("send", "recv")))
    seq = e.get("collective_seq_id", e.get("seq_id", -1))
    return Entry(
        group=group,
        desc=desc,
        op=kind,
        seq=_int(seq),
        p2p=p2p,
        p2p_seq=_int(e.get("p2p_seq_id", -1)),
        state=str(e.get("state", "") or ""),
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        input_dtypes=_dtypes(e.get("input_dtypes")),
        output_dtypes=_dtypes(e.get("output_dtypes")),
        record_id=_int(e.get("record_id", -1)),
        created_ns=_int(e.get("time_created_ns", 0), 0),
        pg_id=_int(e.get("pg_id", -1)),
        src=src,
        dst=dst,
        frame=_frame(e.get("frames")),
    )


def _status_by_name(
    raw: dict[str, Any], groups: dict[str, GroupInfo], entries: list[Entry]
) -> dict[str, PgStatus]:
    """``pg_status`` (keyed by local id) by group name: the entries name the ids they carry;
    the rest follow the order of creation (local ids and global names both count up as the
    groups are made), used only when it agrees with every id the entries name."""
    status: dict[str, PgStatus] = {}
    if not isinstance(raw, dict) or not raw:
        return status
    named: dict[str, str] = {}
    for e in entries:
        if e.pg_id >= 0:
            named[str(e.pg_id)] = e.group
    ids = sorted((k for k in raw if _int(k) >= 0), key=_int)
    names = sorted(groups, key=lambda n: (_int(n, 1 << 62), n))
    if len(ids) == len(names) and all(
        named.get(i, n) == n for i, n in zip(ids, names, strict=True)
    ):
        named.update(zip(ids, names, strict=True))
    for pid, name in named.items():
        s = raw.get(pid)
        if isinstance(s, dict):
            status[name] = PgStatus(
                _int(s.get("last_enqueued_collective", -1)),
                _int(s.get("last_completed_collective", -1)),
            )
    return status


def dump_from_dict(rank: int, path: str, obj: dict[str, Any]) -> RankDump:
    """A loaded dump dictionary as rank ``rank``'s :class:`RankDump`."""
    groups: dict[str, GroupInfo] = {}
    config = obj.get("pg_config") or {}
    if isinstance(config, dict):
        for key, g in config.items():
            if isinstance(g, dict):
                name = str(g.get("name", key))
                ranks, members = _ranks(g.get("ranks"))
                groups[name] = GroupInfo(name, str(g.get("desc", "undefined")), ranks, members)
    raw_entries = obj.get("entries") or []
    entries = [entry_from_dict(e) for e in raw_entries if isinstance(e, dict)]
    # torch's generic recorder (gloo, 2.13) writes its one group's config with an empty name
    # while its entries say ("0", "default_pg"): one nameless group and one unnamed in the
    # config are the same group.
    unnamed = [n for n in dict.fromkeys(e.group for e in entries) if n not in groups]
    if len(unnamed) == 1 and "" in groups and len(groups) == 1:
        blank = groups.pop("")
        desc = next(e.desc for e in entries if e.group == unnamed[0])
        groups[unnamed[0]] = GroupInfo(unnamed[0], desc, blank.ranks, blank.members)
    status = _status_by_name(obj.get("pg_status") or {}, groups, entries)
    return RankDump(rank, path, str(obj.get("version", "")), groups, status, entries)


def rank_of(filename: str) -> int | None:
    """The rank a dump file's name ends with (None: not a rank's file)."""
    m = _RANK.search(os.path.basename(filename))
    return int(m.group(1)) if m else None


def load_file(path: str, rank: int | None = None) -> RankDump:
    """One dump file; BadDump (HostileDump) when it is not one, OSError when unreadable."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotADump("not a regular file")
    if st.st_size > MAX_BYTES:
        raise BadDump(f"{st.st_size} bytes: larger than any Flight Recorder dump")
    with open(path, "rb") as fp:
        data = fp.read()
    obj = loads(data)
    if rank is None:
        rank = rank_of(path)
    if rank is None:
        rank = _int(obj.get("rank", -1))
    return dump_from_dict(rank, path, obj)


def _candidates(directory: str) -> Iterable[tuple[int, str]]:
    # A run's dumps sit in one directory (NCCL's) or one below it (a stack dump's): deeper
    # is somebody else's tree.
    top = directory.rstrip(os.sep).count(os.sep)
    for root, dirs, files in os.walk(directory):
        if root.rstrip(os.sep).count(os.sep) - top >= 2:
            dirs[:] = []
        dirs.sort()
        for f in sorted(files):
            rank = rank_of(f)
            if rank is not None and rank < MAX_RANK and not f.endswith(_NOT_DUMPS):
                yield rank, os.path.join(root, f)


def _looks_like_dump(path: str) -> bool:
    """Whether a file starts as a dump does (a pickle, a JSON object) and is not too large:
    anything else beside the dumps is not one, and is passed over."""
    try:
        st = os.stat(path)
        # NCCL's dump pipe (a FIFO) sits beside its dumps: opening it would wait for a writer.
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return False
        with open(path, "rb") as fp:
            head = fp.read(1)
    except OSError:
        return False
    return head in (b"\x80", b"{")


def load_dir(directory: str, prefix: str = "") -> DumpSet:
    """Every rank's dump under ``directory`` (and one level below); with ``prefix``, only the
    files whose names start with it (one attempt's NCCL dumps beside another's). Files that
    are not dumps are passed over; a dump that cannot be read (truncated, not a Flight
    Recorder's) is kept in ``unreadable`` with its reason (its rank a suspect, not a gap).
    HostileDump propagates: a directory holding a pickle that names a global is not judged."""
    found = DumpSet(directory)
    for rank, path in _candidates(directory):
        if not os.path.basename(path).startswith(prefix):
            continue
        if not _looks_like_dump(path):
            found.skipped.append(path)
            continue
        try:
            dump = load_file(path, rank)
        except HostileDump as e:
            raise HostileDump(f"{path}: {e}") from None
        except NotADump:
            found.skipped.append(path)
            continue
        except BadDump as e:
            if rank not in found.dumps:
                found.unreadable[rank] = str(e)
            found.skipped.append(path)
            continue
        except OSError as e:
            found.unreadable.setdefault(rank, e.strerror or str(e))
            continue
        # Two files for one rank (an older dump beside a newer one): the newer wins.
        if rank in found.dumps and os.path.getmtime(found.dumps[rank].path) > os.path.getmtime(
            path
        ):
            continue
        found.dumps[rank] = dump
        found.unreadable.pop(rank, None)
    return found


def is_run_dir(path: str) -> bool:
    """Whether ``path`` is a run directory (it holds a journal)."""
    return os.path.isfile(RunDirLayout(path).journal)


def load_run(run_dir: str) -> DumpSet:
    """A run's dumps: NCCL's own in ``<run dir>/flightrec/`` when there are any, else the
    records of the stack dump (``stacks/<dump>/flightrec/``, the responders' answers) that
    has the most ranks, the newest of those: a rank that did not answer the last dump before
    the teardown is no suspect when an earlier dump of the hang has its answer."""
    layout = RunDirLayout(run_dir)
    if os.path.isdir(layout.flightrec_dir):
        found = load_dir(layout.flightrec_dir)
        if found.dumps or found.unreadable:
            return found
    try:
        names = sorted(os.listdir(layout.stacks_dir), reverse=True)[:RUN_DUMPS]
    except OSError:
        names = []
    best = DumpSet(layout.flightrec_dir)
    for name in names:
        records = dump_records_dir(layout.dump_dir(name))
        if os.path.isdir(records):
            found = load_dir(records)
            if len(found.dumps) > len(best.dumps):
                best = found
    return best
