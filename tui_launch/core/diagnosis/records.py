"""Every rank's Flight Recorder, gathered through its responder, and the collective-level verdict.

:func:`gather` asks each local rank's responder (a thread of the worker bootstrap, see
:mod:`tui_launch.core.workers.responder`) over its Unix socket, all ranks in parallel
(non-blocking sockets on the caller's thread), under a short time limit: a stopped rank, or
one whose main thread holds the GIL, does not answer and gets a record that says so.
:func:`parse_record` turns torch's Flight Recorder JSON into a
:class:`~tui_launch.core.diagnosis.stacks.model.RankRecord`.

The verdict on the records is :mod:`tui_launch.core.diagnosis.stacks.collective` (pure).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tui_launch.core.diagnosis.stacks.model import (
    Collective,
    Frame,
    ProcessStack,
    RankRecord,
    ThreadStack,
    short_file,
)

# The newest entries kept per rank (the verdict needs the last few; the file keeps them all).
KEPT = 8
# Bytes per element of the dtypes torch names in the record.
_DTYPE_BYTES = {
    "Float": 4, "Int": 4, "UInt32": 4, "Double": 8, "Long": 8, "UInt64": 8, "ComplexFloat": 8,
    "Half": 2, "BFloat16": 2, "Short": 2, "UInt16": 2, "Byte": 1, "Char": 1, "Bool": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexDouble": 16,
}  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """One rank's answer: its record, its threads (None without them) and the raw JSON."""

    record: RankRecord
    threads: tuple[ThreadStack, ...] | None
    raw: dict[str, Any] | None
    duration: float


def _bytes(sizes: Iterable[Iterable[int]], dtypes: Iterable[str]) -> int:
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        n = 1
        for d in shape:
            n *= int(d)
        total += n * _DTYPE_BYTES.get(str(dtype), 4)
    return total


def _op(name: str) -> str:
    # "gloo:all_reduce", "nccl:all_reduce" -> "all_reduce"
    return name.rsplit(":", 1)[-1] if name else "?"


def _group(e: dict[str, Any]) -> tuple[str, str]:
    """An entry's process group: its name (global: every rank numbers the groups it makes in
    one order) and description; the local id (``pg_id``) where the entry names none."""
    pg = e.get("process_group")
    if isinstance(pg, list | tuple) and len(pg) == 2:
        return str(pg[0]), str(pg[1] or "")
    return str(e.get("pg_id", "0")), ""


def parse_record(global_rank: int, fr: dict[str, Any] | None, error: str | None) -> RankRecord:
    """torch's Flight Recorder JSON (``_dump_fr_trace_json``) as a :class:`RankRecord`.

    Entries are keyed by their group's name, which is the same on every member (the local id
    ``pg_id`` is not: Megatron's four data-parallel groups are each member's id 2). The
    sequence numbers enqueued and completed are every group's together: in a job of one group,
    the default group's; in one of many (Megatron's tensor, pipeline and data-parallel groups,
    the default one idle after the start), a count that moves whenever any group moves."""
    if fr is None:
        return RankRecord(global_rank, error=error or "no Flight Recorder")
    colls: list[Collective] = []
    for i, e in enumerate(fr.get("entries", ())):
        if e.get("is_p2p"):
            continue
        name, desc = _group(e)
        colls.append(
            Collective(
                seq=int(e.get("collective_seq_id", -1)),
                op=_op(str(e.get("profiling_name", ""))),
                pg=name,
                in_bytes=_bytes(e.get("input_sizes", ()), e.get("input_dtypes", ())),
                out_bytes=_bytes(e.get("output_sizes", ()), e.get("output_dtypes", ())),
                state=str(e.get("state", "")),
                desc=desc if desc != "undefined" else "",
                order=int(e.get("record_id", i)),
            )
        )
    colls.sort(key=lambda c: (c.pg, c.seq))
    # The newest entries of each process group (sequence numbers count per group).
    groups: dict[str, list[Collective]] = {}
    for c in colls:
        groups.setdefault(c.pg, []).append(c)
    colls = [c for pg in sorted(groups) for c in groups[pg][-KEPT:]]
    statuses = [s for s in (fr.get("pg_status") or {}).values() if isinstance(s, dict)]

    def num(status: dict[str, Any], key: str) -> int:
        try:
            return int(status.get(key, -1))
        except (TypeError, ValueError):
            return -1

    active = [s for s in statuses if num(s, "last_enqueued_collective") >= 0]
    if not colls and not active:
        return RankRecord(global_rank, error="no collective recorded")
    enqueued = sum(num(s, "last_enqueued_collective") for s in active) if active else -1
    completed = sum(max(num(s, "last_completed_collective"), -1) for s in active) if active else -1
    return RankRecord(
        global_rank,
        collectives=tuple(colls),
        last_enqueued=enqueued,
        last_completed=completed,
        groups=len(active),
    )


def with_groups(fr: dict[str, Any], groups: Any) -> dict[str, Any]:
    """``fr`` with the groups its ``pg_config`` lacks, from the responder's ``groups`` (c10d's
    own table: gloo's recorder writes none but a nameless one without ranks, which then
    goes). Groups the recorder did write are kept as it wrote them."""
    if not isinstance(groups, dict) or not groups:
        return fr
    config = dict(fr.get("pg_config") or {})
    added = False
    for name, g in groups.items():
        if isinstance(g, dict) and str(name) not in config:
            config[str(name)] = g
            added = True
    if not added:
        return fr
    blank = config.get("")
    if isinstance(blank, dict) and not _lists_ranks(blank.get("ranks")):
        del config[""]
    return {**fr, "pg_config": config}


def _lists_ranks(value: Any) -> bool:
    """Whether a ``pg_config`` entry's ``ranks`` lists any rank (``"[]"`` does not)."""
    if isinstance(value, str):
        return any(ch.isdigit() for ch in value)
    return bool(value)


def analyser_record(fr: dict[str, Any]) -> dict[str, Any]:
    """A rank's Flight Recorder (torch's JSON) as torch's analyser ``torchfrtrace`` reads it
    (pickled by the caller: its format is ``_dump_fr_trace``'s, the same keys).

    gloo's recorder (torch 2.13) keys the default group's configuration by an empty name
    while its entries name the group ``"0"``, and the analyser then fails on its own dump
    (``KeyError: ('0', rank)``): the configuration is given that name too.
    """
    config = dict(fr.get("pg_config") or {})
    unnamed = config.get("")
    if unnamed is not None and "0" not in config:
        desc = next(
            (
                str(e["process_group"][1])
                for e in fr.get("entries", ())
                if (e.get("process_group") or [None])[0] == "0"
            ),
            "default_pg",
        )
        config["0"] = {**unnamed, "name": "0", "desc": desc}
        del config[""]
    return {**fr, "pg_config": config}


def parse_threads(data: list[dict[str, Any]]) -> tuple[ThreadStack, ...]:
    """The responder's thread stacks as :class:`ThreadStack` records (main thread first)."""
    out = []
    for t in data:
        frames = tuple(
            Frame(function=str(f), file=short_file(str(p)), line=int(n), path=str(p))
            for f, p, n in t.get("frames", ())
        )
        out.append(
            ThreadStack(
                thread_id=int(t.get("thread_id", 0)),
                name=t.get("name"),
                frames=frames,
                native_id=t.get("native_id"),
                main=bool(t.get("main")),
            )
        )
    return tuple(out)


def socket_path(directory: str, global_rank: int) -> str:
    """Where rank ``global_rank``'s responder listens."""
    return os.path.join(directory, f"{global_rank}.sock")


def ask(path: str, what: str = "dump", timeout: float = 1.0) -> dict[str, Any]:
    """One request to a responder: its JSON answer; raises OSError or ValueError."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(what.encode() + b"\n")
        chunks = []
        deadline = time.monotonic() + timeout
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    data = json.loads(b"".join(chunks))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def query(directory: str, global_rank: int, what: str = "dump", timeout: float = 1.0) -> Answer:
    """Ask one rank; an answer that says why when it did not answer."""
    t0 = time.monotonic()
    try:
        data: dict[str, Any] | BaseException = ask(
            socket_path(directory, global_rank), what, timeout
        )
    except (OSError, ValueError) as e:
        data = e
    return _answer(global_rank, data, timeout, time.monotonic() - t0)


def _answer(
    global_rank: int, data: dict[str, Any] | BaseException, timeout: float, took: float
) -> Answer:
    """A rank's answer from its JSON, or the record that says why there is none."""
    if isinstance(data, TimeoutError):
        return Answer(
            RankRecord(global_rank, error=f"no answer in {timeout:g} s"), None, None, took
        )
    if isinstance(data, BaseException):
        why = (
            "no responder"
            if isinstance(data, FileNotFoundError | ConnectionRefusedError)
            else str(data)
        )
        return Answer(RankRecord(global_rank, error=why), None, None, took)
    if data.get("same"):  # poll-since: nothing moved; the caller holds the previous answer
        return Answer(RankRecord(global_rank, error="unchanged"), None, data, took)
    fr = data.get("fr")
    if isinstance(fr, dict) and data.get("groups"):
        fr = data["fr"] = with_groups(fr, data["groups"])
    record = parse_record(global_rank, fr, data.get("fr_error"))
    threads = parse_threads(data["threads"]) if isinstance(data.get("threads"), list) else None
    return Answer(record, threads, data, took)


def gather(
    directory: str,
    ranks: Iterable[int],
    what: str = "dump",
    timeout: float = 1.0,
    asks: dict[int, str] | None = None,
) -> dict[int, Answer]:
    """Every rank's answer, asked in parallel on this thread (non-blocking sockets, one
    ``select``); ``asks``: a request other than ``what`` for some ranks.

    One thread for all: a thread started per rank and poll (as before) was a third of the
    live poll's CPU at idle with 8 ranks (``bench/bootstrap.py idle``).
    """
    asks = asks or {}
    t0 = time.monotonic()
    deadline = t0 + timeout
    results: dict[int, dict[str, Any] | BaseException] = {}
    took: dict[int, float] = {}
    sel = selectors.DefaultSelector()
    # rank -> (socket, request bytes left to send, chunks read)
    open_: dict[int, tuple[socket.socket, bytearray, list[bytes]]] = {}

    def done(rank: int, result: dict[str, Any] | BaseException) -> None:
        results[rank] = result
        took[rank] = time.monotonic() - t0
        entry = open_.pop(rank, None)
        if entry is not None:
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(entry[0])
            entry[0].close()

    try:
        for rank in ranks:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(socket_path(directory, rank))
            except BlockingIOError:  # the backlog is full: connected once writable
                pass
            except OSError as e:
                s.close()
                results[rank], took[rank] = e, time.monotonic() - t0
                continue
            open_[rank] = (s, bytearray(asks.get(rank, what).encode() + b"\n"), [])
            sel.register(s, selectors.EVENT_WRITE, rank)
        while open_:
            left = deadline - time.monotonic()
            if left <= 0:
                for rank in list(open_):
                    done(rank, TimeoutError())
                break
            for key, _ in sel.select(left):
                rank = key.data
                s, request, chunks = open_[rank]
                try:
                    if request:
                        del request[: s.send(request)]
                        if not request:
                            sel.modify(s, selectors.EVENT_READ, rank)
                        continue
                    chunk = s.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    done(rank, e)
                    continue
                if chunk:
                    chunks.append(chunk)
                    continue
                try:
                    data = json.loads(b"".join(chunks))
                    if not isinstance(data, dict):
                        raise ValueError("not a JSON object")
                    done(rank, data)
                except ValueError as e:
                    done(rank, e)
    finally:
        for rank in list(open_):
            done(rank, TimeoutError())
        sel.close()
    return {r: _answer(r, results[r], timeout, took[r]) for r in results}


def poke_nccl_pipes(directory: str) -> int:
    """Ask NCCL's own Flight Recorder of every rank with a dump pipe in ``directory`` (the
    FIFOs ``<stem><rank>.pipe`` torch's watchdog reads, ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``)
    to dump into its file in the run directory: one byte each, never blocking. Returns how
    many were asked (none without NCCL: gloo and CPU builds make no pipe)."""
    asked = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            if not name.endswith(".pipe") or not stat.S_ISFIFO(os.stat(path).st_mode):
                continue
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: nobody reads it
        except OSError:
            continue
        try:
            os.write(fd, b"1")
            asked += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def responder_stack(pid: int, threads: tuple[ThreadStack, ...], state: str) -> ProcessStack:
    """A process stack built from a responder's threads (when py-spy could not take one)."""
    return ProcessStack(pid=pid, state=state, method="responder", threads=threads)
