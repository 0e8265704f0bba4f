"""Stacks without ptrace: faulthandler in the rank, cut out of the rank's stderr log.

When py-spy cannot attach (no ptrace permission, no binary), Python workers started through
tuilaunch's bootstrap (:mod:`tui_launch.core.workers.shim`, with ``TUILAUNCH_FAULTHANDLER_SIGNAL``
set)
have ``faulthandler.register(signum, all_threads=True, chain=False)`` on a real-time signal.
Sending that signal makes the rank print every thread to its stderr and carry on. This module
sends it, then cuts the ``Thread 0x... (most recent call first):`` blocks out of the stderr log,
reading from a byte offset taken before the signal, into the same :class:`StackDump` shape that
py-spy gives.

Only ranks known to have the handler may get the signal: an unhandled real-time signal kills a
process (its default action is to terminate).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time

from tui_launch.core.diagnosis.stacks.model import (
    FAULTHANDLER,
    NONE,
    WCHAN,
    Frame,
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
    short_file,
)
from tui_launch.core.diagnosis.stacks.pyspy import Target, proc_cmdline, proc_state, proc_wchan
from tui_launch.core.workers.shim import FAULTHANDLER_SIGNAL

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*?)\s*$')
# Lines a block may hold besides frames: no Python frame at all, or a truncated stack.
_OTHER = re.compile(r"^  (<no Python frame>|\.\.\.)\s*$")

# How long the log must stay the same size before a dump found in it counts as complete.
_SETTLE = 0.05


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """The first faulthandler dump in ``text``: every thread, the main thread first.

    A dump is a run of thread blocks. Lines of other output (the rank's own stderr, written by
    another thread meanwhile) end a block and are skipped. The dump ends where a thread id
    comes again: that is the next dump. CPython lists threads newest first, so the main
    thread, the oldest, is the last block.
    """
    blocks: list[ThreadStack] = []
    current: tuple[int, list[Frame]] | None = None

    def close() -> None:
        nonlocal current
        if current is not None:
            tid, frames = current
            blocks.append(ThreadStack(thread_id=tid, name=None, frames=tuple(frames)))
            current = None

    for raw in text.splitlines():
        head = _HEADER.match(raw)
        if head:
            close()
            tid = int(head.group(2), 16)
            if any(b.thread_id == tid for b in blocks):
                break  # a second dump: keep the first only
            current = (tid, [])
            continue
        if current is None:
            continue
        frame = _FRAME.match(raw)
        if frame:
            path, line, func = frame.groups()
            current[1].append(
                Frame(
                    function=func,
                    file=short_file(path),
                    line=int(line) if line.isdigit() else 0,
                    path=path,
                )
            )
        elif not _OTHER.match(raw):
            close()
    close()
    if not blocks:
        return ()
    main = blocks.pop()
    return (dataclasses.replace(main, main=True), *blocks)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as fp:
            fp.seek(offset)
            return fp.read().decode(errors="replace")
    except OSError:
        return ""


def dump_via_faulthandler(
    targets: list[Target],
    stderr_logs: dict[int, str],
    reason: str,
    timeout: float = 2.0,
    *,
    signum: int = FAULTHANDLER_SIGNAL,
) -> StackDump:
    """Signal every rank in ``targets`` and cut its stacks out of its stderr log.

    ``stderr_logs`` maps a local rank to the file its stderr goes to. Every rank is signalled
    first and then all logs are read, so the dump takes about one rank's time, at most
    ``timeout`` seconds. A rank in ``D`` or stopped (``T``) is not signalled (it could not run
    the handler now and would print later, into some other dump's window); a rank in ``D``
    gets its kernel wait channel instead.
    """
    wall, start = time.time(), time.monotonic()
    pending: dict[int, tuple[str, int]] = {}  # pid -> (log, offset)
    early: dict[int, ProcessStack] = {}
    states: dict[int, str] = {}
    for local, _, pid in targets:
        state = states[pid] = proc_state(pid)
        log = stderr_logs.get(local)

        def fail(method: str, error: str, wchan: str | None = None, pid: int = pid) -> None:
            early[pid] = ProcessStack(
                pid=pid,
                state=states[pid],
                method=method,
                error=error,
                wchan=wchan,
                cmdline=proc_cmdline(pid),
            )

        if state in ("", "Z", "X", "x"):
            fail(NONE, "process is gone")
        elif state == "D":
            fail(WCHAN, "in D state (uninterruptible); not signalled", proc_wchan(pid))
        elif state in ("T", "t"):
            fail(NONE, "stopped (T): faulthandler runs only once it continues")
        elif log is None:
            fail(NONE, "no stderr log known for this rank")
        else:
            offset = _size(log)
            try:
                os.kill(pid, signum)
            except OSError as e:
                fail(NONE, f"cannot signal: {e.strerror}")
                continue
            pending[pid] = (log, offset)

    found: dict[int, tuple[ThreadStack, ...]] = {}
    sizes: dict[int, tuple[int, float]] = {}
    deadline = start + timeout
    while pending.keys() - found.keys() and time.monotonic() < deadline:
        now = time.monotonic()
        for pid, (log, offset) in pending.items():
            if pid in found:
                continue
            size = _size(log)
            last = sizes.get(pid)
            if last is None or last[0] != size:
                sizes[pid] = (size, now)
                continue
            # faulthandler writes the whole dump from its signal handler at once; a log that
            # stopped growing and holds a dump holds all of it.
            if size > offset and now - last[1] >= _SETTLE:
                threads = parse_faulthandler(_read_from(log, offset))
                if threads:
                    found[pid] = threads
        time.sleep(0.01)

    ranks = []
    for local, global_, pid in targets:
        if pid in early:
            proc = early[pid]
        elif pid in found:
            proc = ProcessStack(
                pid=pid,
                state=states[pid],
                method=FAULTHANDLER,
                threads=found[pid],
                cmdline=proc_cmdline(pid),
            )
        else:
            proc = ProcessStack(
                pid=pid,
                state=states[pid],
                method=FAULTHANDLER,
                error=f"no faulthandler output in its stderr log within {timeout:g}s",
                cmdline=proc_cmdline(pid),
            )
        ranks.append(RankStack(local_rank=local, global_rank=global_, process=proc))
    return StackDump(
        reason=reason,
        wall=wall,
        duration=round(time.monotonic() - start, 4),
        ranks=tuple(ranks),
        method=FAULTHANDLER,
    )
