"""The Flight Recorder's responder: the thread in each worker that answers the launcher.

:func:`serve` starts a daemon thread (``tuilaunch-responder``) listening on a Unix socket
(``<dir>/<RANK>.sock``, owner-only) that answers one request per connection with the rank's
Flight Recorder (``_dump_fr_trace_json``) and every thread's Python stack
(``sys._current_frames``), and with the records every process group it is in
(:func:`group_config`: gloo's recorder lists none). torch releases the GIL while a collective
blocks in C++ (gloo, ``Work.wait``, autograd's engine), so the thread answers while the main
thread waits; a stopped rank, or one whose main thread holds the GIL in native code, does not,
and the launcher falls back to py-spy.

It runs in the worker, not the launcher, so it lives with the worker bootstrap
(:mod:`tui_launch.core.workers.shim` starts it when ``TUILAUNCH_RESPONDER_DIR`` names a
directory), which imports it as any module: the import contracts see the edge. It is the one
module outside :mod:`tui_launch.core.seam` that uses torch's private API: its names are in
:data:`PRIVATE_NAMES`, and ``tests/test_torch_seam.py`` checks them with the seam's. The
launcher's side (the variables that arm the recorder, this directory among them) is
:mod:`tui_launch.core.seam.flightrec`; the wire format (one JSON object) is read by
:mod:`tui_launch.core.diagnosis.records`. Standard library only, except torch when the program
has already imported it: the responder never imports torch into a program that did not.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any

_C10D = "torch._C._distributed_c10d"
# (module, owner, name) in the order of the seam's ``TorchName`` record, which this package,
# below the seam, cannot import; ``tests/test_torch_seam.py`` reads them as ``TorchName``.
_DC10D = "torch.distributed.distributed_c10d"
PRIVATE_NAMES: tuple[tuple[str, str | None, str], ...] = (
    (_C10D, None, "_dump_fr_trace_json"),
    (_DC10D, None, "_world"),
    (_DC10D, "_World", "pg_config_info"),
)
# Bytes one answer may have (a ring of 2000 entries is about 1 MB of JSON).
MAX_ANSWER = 16 << 20


def _dump_json(collectives: bool) -> dict[str, Any]:
    from torch._C import _distributed_c10d as c10d
    from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
        _dump_fr_trace_json,
    )

    # Every entry, completed ones too: the newest sequence number is what the verdict reads.
    data: dict[str, Any] = json.loads(_dump_fr_trace_json(collectives, False))
    # CUDA builds keep NCCL's collectives in a recorder of their own (absent from CPU wheels,
    # so not in PRIVATE_NAMES: looked up, and merged when there).
    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    if nccl is not None:
        more = json.loads(nccl(collectives, False))
        data.setdefault("entries", []).extend(more.get("entries", ()))
        for pg, status in more.get("pg_status", {}).items():
            data.setdefault("pg_status", {}).setdefault(pg, status)
    return data


def fr_trace(full: bool = True) -> tuple[dict[str, Any] | None, str | None]:
    """This process's Flight Recorder as data, or None and why not. ``full`` False: only each
    process group's status (last sequence numbers enqueued and completed), which costs
    microseconds where the whole ring costs tens of milliseconds."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None, "torch.distributed is not imported"
    try:
        if not dist.is_initialized():
            return None, "no process group yet"
        return _dump_json(full), None
    except ImportError:
        return None, "this torch has no Flight Recorder dump"
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


def group_config() -> dict[str, dict[str, Any]] | None:
    """Every process group this rank is a member of, as NCCL's recorder writes its
    ``pg_config``: ``{name: {"name", "desc", "ranks"}}``, the ranks global, as a string.

    gloo's recorder (torch 2.13) writes no group but a nameless one with no ranks, so a job
    with several groups (Megatron's tensor, pipeline, data-parallel ones) could not be judged
    per group: the launcher fills in what it lacks from this (c10d's own table, which torch's
    NCCL recorder is written from). None when there is no table to read."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return None
        from torch.distributed.distributed_c10d import _world

        out: dict[str, dict[str, Any]] = {}
        for info in _world.pg_config_info:
            size = int(info.get("group_size", 0))
            # torch leaves the ranks out of a group of every rank.
            ranks = list(info.get("ranks") or ()) or list(range(size))
            name = str(info.get("pg_name", ""))
            desc = str(info.get("pg_desc", "") or "undefined")
            out[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
        return out
    except Exception:
        return None


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack, innermost frame first, the main thread marked."""
    import traceback  # on the first answer, not at every worker's start

    names = {t.ident: t.name for t in threading.enumerate()}
    natives = {t.ident: getattr(t, "native_id", None) for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the responder itself
        frames = [
            [fs.name, fs.filename, fs.lineno or 0]
            for fs in reversed(traceback.extract_stack(frame))
        ]
        out.append(
            {
                "thread_id": ident,
                "native_id": natives.get(ident),
                "name": names.get(ident),
                "main": ident == main,
                "frames": frames,
            }
        )
    out.sort(key=lambda t: not t["main"])
    return out


# Entries a ``poll`` answer carries (the newest): the live view needs the last few, and a full
# ring is about a megabyte of JSON.
POLL_ENTRIES = 64
# The poll's memory: every group's last enqueued sequence number at the previous poll,
# the newest entries read for it (None: not read), and where the rank was (``poll-since``).
_polled: dict[str, Any] = {"seq": None, "entries": None, "where": None}


def _seq(fr: dict[str, Any]) -> str | None:
    """Every group's last enqueued sequence number, in one string (None: no group has one):
    a rank whose collectives are all in groups other than the default one (Megatron's) moves
    too."""
    status = fr.get("pg_status") or {}
    seqs = [
        f"{pg}:{s.get('last_enqueued_collective')}"
        for pg, s in sorted(status.items())
        if isinstance(s, dict)
    ]
    return ",".join(seqs) or None


def _main_fingerprint() -> tuple[tuple[int, int], ...]:
    """Where the main thread is, cheaply: each frame's code and line, innermost first."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    out = []
    while frame is not None:
        out.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def answer(what: str) -> dict[str, Any]:
    """The answer to one request, the rank's records and every thread's stack.

    ``dump``: every entry of the ring. ``status``: only the groups' status, without stacks (a
    dump's second look: did the rank move on). ``poll`` (the live view, every couple of
    seconds): only the groups' status while the rank moves on, so a poll costs microseconds;
    once no group's sequence number has moved since the previous poll (the rank
    waits, or is elsewhere), the newest :data:`POLL_ENTRIES` entries are read, once for that
    number. ``poll-since``: the same, or only ``{"same": true}`` when neither the sequence
    number nor the main thread's stack moved since the previous poll's answer and its entries
    were sent: a rank that sits still (a hang, a long wait) costs the launcher nothing to read.
    """
    t0 = time.perf_counter()
    if what == "status":
        # A second look during a dump: has the rank moved on? No stacks, and the poll's memory
        # is left alone.
        fr, why = fr_trace(full=False)
        return {"pid": os.getpid(), "fr": fr, "fr_error": why, "duration": time.perf_counter() - t0}
    if what == "dump":
        fr, why = fr_trace(full=True)
    else:
        fr, why = fr_trace(full=False)
        seq = _seq(fr) if fr is not None else None
        where = (seq, why, _main_fingerprint())
        unchanged = what == "poll-since" and where == _polled.get("where")
        if unchanged and (fr is None or _polled["entries"] is not None):
            return {"pid": os.getpid(), "same": True, "duration": time.perf_counter() - t0}
        _polled["where"] = where
        if fr is not None:
            if seq != _polled["seq"]:
                _polled["seq"], _polled["entries"] = seq, None
            elif _polled["entries"] is None:
                full, _ = fr_trace(full=True)
                _polled["entries"] = (full or {}).get("entries", [])[-POLL_ENTRIES:]
            if _polled["entries"] is not None:
                fr["entries"] = _polled["entries"]
    out: dict[str, Any] = {"pid": os.getpid(), "fr": fr, "fr_error": why}
    if fr is not None and fr.get("entries"):
        out["groups"] = group_config()
    out["threads"] = thread_stacks()
    out["duration"] = time.perf_counter() - t0
    return out


def raw_dump_answer() -> bytes | None:
    """A ``dump`` answer with torch's JSON spliced in as it is, never parsed here: a full ring
    is about a megabyte, and parsing and writing it again would double the rank's cost. None
    where this does not apply (no process group, a CUDA build whose NCCL recorder must be
    merged): :func:`answer` then does it the slow way."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return None
        from torch._C import _distributed_c10d as c10d
        from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
            _dump_fr_trace_json,
        )

        if getattr(c10d, "_dump_nccl_trace_json", None) is not None:
            return None
        t0 = time.perf_counter()
        raw = _dump_fr_trace_json(True, False)
    except Exception:
        return None
    rest: dict[str, Any] = {"pid": os.getpid(), "fr_error": None, "threads": thread_stacks()}
    rest["groups"] = group_config()
    rest["duration"] = time.perf_counter() - t0
    return b'{"fr":' + bytes(raw) + b"," + json.dumps(rest).encode()[1:]


def _serve_one(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(5.0)
        what = conn.recv(64).decode("ascii", "replace").strip() or "dump"
        data = raw_dump_answer() if what == "dump" else None
        if data is None:
            data = json.dumps(answer(what)).encode()
        conn.sendall(data[:MAX_ANSWER])


def _loop(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with contextlib.suppress(OSError, ValueError):
            _serve_one(conn)


def serve(directory: str, rank: str) -> str | None:
    """Start the responder on ``<directory>/<rank>.sock``; its path, or None when it cannot
    (the reason goes to stderr once: the program runs on regardless)."""
    path = os.path.join(directory, f"{rank}.sock")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket file: owner-only
        try:
            server.bind(path)
        finally:
            os.umask(old)
        server.listen(8)
    except OSError as e:
        sys.stderr.write(f"tuilaunch: no responder for rank {rank} ({e})\n")
        return None
    thread = threading.Thread(target=_loop, args=(server,), name="tuilaunch-responder")
    thread.daemon = True
    thread.start()
    return path
