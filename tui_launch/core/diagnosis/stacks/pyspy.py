"""Dump every local rank's Python stacks with py-spy, all ranks in parallel.

One ``py-spy dump --pid P --json`` per process (the rank and each of its child processes, such
as data-loader workers), all started at once, each with a hard time limit after which it is
killed. How a process is dumped depends on its state in ``/proc/P/stat``:

- ``T``/``t`` (stopped, e.g. tuilaunch's ``hang`` injection sent SIGSTOP): ``--nonblocking``,
  because a blocking dump cannot suspend a stopped process and fails at once;
- ``D`` (uninterruptible kernel wait): not attached to at all (ptrace would wait with it);
  ``/proc/P/wchan`` says where in the kernel it waits;
- gone or zombie: nothing to dump, said so.

When a hang is confirmed, :func:`with_native` adds the C/C++ frames each running rank's main
thread is in (``py-spy dump --native``: ``c10d::Work::wait``, ``gloo::...::waitRecv``,
``cudaStreamSynchronize``): where a Python stack ends in a call into torch's C++ they say
what it waits for. Reading them pauses the rank for about a second (symbols of torch's
libraries), which a hung rank can spare and a running one should not, so ``d`` and the first
hang dump do without.

Standard library only; py-spy is a static binary from the ``py-spy`` wheel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tui_launch.core.diagnosis.stacks.model import (
    NONE,
    PYSPY,
    PYSPY_NONBLOCKING,
    WCHAN,
    Frame,
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
    short_file,
)

# A target: (local rank, global rank, pid).
Target = tuple[int, int, int]

DEFAULT_TIMEOUT = 5.0
# Children per rank that are dumped (data-loader workers, compile workers): enough to show the
# pattern without letting a rank with 64 workers turn one dump into 64 attaches. Every py-spy
# costs CPU, and 8 ranks x 8 children is already 72 of them.
MAX_CHILDREN = 8
# How many descendants are counted at most (the rest of a huge tree is not even listed).
_COUNT_CHILDREN = 1024

# A native read's time limit (seconds): the first read of torch's symbols from a cold disk took
# 3.5 s here, a warm one 0.8 s.
NATIVE_TIMEOUT = 8.0
# Native frames that say nothing of what a thread waits in: raw addresses, the glue between
# the interpreter and C++ (pybind11's dispatch, CPython's call machinery).
_NATIVE_NOISE = re.compile(
    r"^(0x[0-9a-f]+|pybind11::.*|_?Py[A-Z_].*|cfunction_.*|method_vectorcall.*)$"
)
# Native frames kept per thread, innermost first.
_NATIVE_KEPT = 8

# Words in py-spy's error output that mean the kernel refused ptrace.
_PTRACE_DENIED = ("permission denied", "operation not permitted", "eperm", "os error 1)")


def find_pyspy() -> str | None:
    """The py-spy binary: the one installed beside this interpreter (the ``py-spy`` wheel puts
    it in the venv's bin), else the first on PATH; None when there is none."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def proc_state(pid: int) -> str:
    """The one-letter state of ``pid`` from ``/proc/<pid>/stat``; empty when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fp:
            # The command name is in parentheses and may itself hold spaces or ')'.
            return fp.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def proc_wchan(pid: int) -> str | None:
    """The kernel function ``pid`` sleeps in (``/proc/<pid>/wchan``), or None."""
    try:
        with open(f"/proc/{pid}/wchan") as fp:
            text = fp.read().strip()
    except OSError:
        return None
    return text if text and text != "0" else None


def proc_cmdline(pid: int) -> str:
    """``pid``'s command line, space separated (empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return fp.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def proc_children(pid: int, limit: int = _COUNT_CHILDREN) -> list[int]:
    """``pid``'s descendants, breadth first (children before grandchildren), at most ``limit``.

    Read from ``/proc/<pid>/task/*/children``: a child started by any thread of the rank
    (a data-loader's worker started from a helper thread) counts.
    """
    found: list[int] = []
    queue = [pid]
    while queue and len(found) < limit:
        parent = queue.pop(0)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fp:
                    kids = [int(k) for k in fp.read().split()]
            except (OSError, ValueError):
                continue
            for kid in kids:
                if kid not in found and len(found) < limit:
                    found.append(kid)
                    queue.append(kid)
    return found


def ptrace_fix() -> str:
    """The one line that says py-spy cannot attach, and how to fix it here."""
    scope = None
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fp:
            scope = fp.read().strip()
    except OSError:
        pass
    yama = (
        f"Yama ptrace_scope={scope} here: ptrace_scope=1 needs root or CAP_SYS_PTRACE "
        "(or sysctl kernel.yama.ptrace_scope=0)"
        if scope not in (None, "0")
        else "Yama ptrace_scope=1 needs root, CAP_SYS_PTRACE or sysctl kernel.yama.ptrace_scope=0"
    )
    return (
        "py-spy cannot attach: ptrace is not permitted (containers need --cap-add SYS_PTRACE; "
        f"{yama}); use --dump-via-faulthandler"
    )


NO_PYSPY = "py-spy not found (pip install py-spy); use --dump-via-faulthandler"


def parse_pyspy_json(text: str, pid: int) -> tuple[ThreadStack, ...]:
    """py-spy's ``dump --json`` output as threads, the main thread first.

    The main thread is the one whose OS thread id is the pid (Linux), else the one named
    ``MainThread``; py-spy's own order is kept for the others.
    """
    data = _threads_of(json.loads(text))
    threads: list[ThreadStack] = []
    for t in data:
        frames = tuple(
            Frame(
                function=str(f.get("name", "?")),
                file=short_file(str(f.get("filename", "?"))),
                line=int(f.get("line") or 0),
                path=str(f.get("filename", "")),
            )
            for f in t.get("frames", ())
        )
        native = t.get("os_thread_id")
        threads.append(
            ThreadStack(
                thread_id=int(t.get("thread_id") or 0),
                name=t.get("thread_name"),
                frames=frames,
                native_id=int(native) if native is not None else None,
                active=t.get("active"),
                owns_gil=t.get("owns_gil"),
            )
        )
    main = _main_index(data, pid)
    if main is None:
        return ()
    first = threads.pop(main)
    return (dataclasses.replace(first, main=True), *threads)


def _threads_of(data: Any) -> list[dict[str, Any]]:
    """py-spy's ``--json`` threads (a single process's object in some versions)."""
    if isinstance(data, dict):
        data = data.get("threads", [data])
    return data if isinstance(data, list) else []


def _main_index(threads: list[dict[str, Any]], pid: int) -> int | None:
    """The main thread among py-spy's: the one whose OS thread id is the pid (Linux), else the
    one named ``MainThread``, else the first (None: no thread)."""
    for i, t in enumerate(threads):
        if t.get("os_thread_id") == pid:
            return i
    named = (i for i, t in enumerate(threads) if t.get("thread_name") == "MainThread")
    return next(named, 0 if threads else None)


def run_pyspy(
    pyspy: str, pid: int, *flags: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``py-spy dump --pid PID --json FLAGS``; killed (SIGKILL) and reaped when ``timeout``
    passes (:class:`subprocess.TimeoutExpired`)."""
    return subprocess.run(
        [pyspy, "dump", "--pid", str(pid), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _error_line(stderr: str, stdout: str, rc: int) -> str:
    lines = [ln.strip() for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
    # py-spy prints "Error: <what>" and then the causes; the last cause is the most specific.
    return " / ".join(lines[-2:]) if lines else f"py-spy exited with code {rc}"


def dump_process(pid: int, pyspy: str | None, timeout: float = DEFAULT_TIMEOUT) -> ProcessStack:
    """Dump one process: py-spy (nonblocking when stopped), or its wait channel in ``D``."""
    start = time.monotonic()
    state = proc_state(pid)
    cmdline = proc_cmdline(pid)

    def done(method: str, **kw: Any) -> ProcessStack:
        return ProcessStack(
            pid=pid,
            state=state,
            method=method,
            cmdline=cmdline,
            duration=round(time.monotonic() - start, 4),
            **kw,
        )

    if state in ("", "Z", "X", "x"):
        return done(NONE, error="process is gone")
    if state == "D":
        # Attaching would block with it: the kernel wait channel is the useful fact here.
        error = "in D state (uninterruptible); not attached"
        return done(WCHAN, wchan=proc_wchan(pid), error=error)
    if pyspy is None:
        return done(NONE, error=NO_PYSPY)
    nonblocking = state in ("T", "t")
    method = PYSPY_NONBLOCKING if nonblocking else PYSPY
    try:
        p = run_pyspy(pyspy, pid, *(("--nonblocking",) if nonblocking else ()), timeout=timeout)
        if p.returncode != 0 and not nonblocking and proc_state(pid) in ("T", "t"):
            # Stopped meanwhile (a SIGSTOP between reading the state and attaching): a blocking
            # dump cannot suspend it, a nonblocking one can read it.
            state, method = proc_state(pid), PYSPY_NONBLOCKING
            left = max(0.1, timeout - (time.monotonic() - start))
            p = run_pyspy(pyspy, pid, "--nonblocking", timeout=left)
    except subprocess.TimeoutExpired:
        return done(method, error=f"py-spy did not answer in {timeout:g}s; killed")
    except OSError as e:
        return done(NONE, error=f"cannot run py-spy: {e}")
    if p.returncode != 0:
        err = _error_line(p.stderr, p.stdout, p.returncode)
        if proc_state(pid) in ("", "Z"):
            err = "process is gone"
        return done(method, error=err, wchan=proc_wchan(pid))
    try:
        threads = parse_pyspy_json(p.stdout, pid)
    except (ValueError, TypeError, AttributeError) as e:
        return done(method, error=f"cannot read py-spy's output: {e}")
    return done(method, threads=threads)


def ptrace_denied(error: str | None) -> bool:
    """True when a py-spy error says the kernel refused to let it attach."""
    low = (error or "").lower()
    return any(w in low for w in _PTRACE_DENIED)


def dump_ranks(
    targets: list[Target],
    reason: str,
    timeout: float = DEFAULT_TIMEOUT,
    *,
    max_children: int = MAX_CHILDREN,
    pyspy: str | None = "",
) -> StackDump:
    """Dump every rank in ``targets`` (``(local_rank, global_rank, pid)``) in parallel.

    Each process (rank, and up to ``max_children`` of its descendants, 0 for none) gets its own
    py-spy call, all started at once, each killed after ``timeout`` seconds, so the whole dump
    takes about the slowest single call. ``pyspy`` is the binary to use: empty means
    :func:`find_pyspy`, None means there is none.
    """
    wall, start = time.time(), time.monotonic()
    binary = find_pyspy() if pyspy == "" else pyspy
    if binary is not None and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        binary = None  # a configured path that is not there: say "no py-spy" once, not per rank
    tree = {pid: (proc_children(pid) if max_children > 0 else []) for _, _, pid in targets}
    kids = {pid: found[:max_children] for pid, found in tree.items()}
    pids = [pid for _, _, pid in targets] + [k for ks in kids.values() for k in ks]
    results: dict[int, ProcessStack] = {}
    if pids:
        with ThreadPoolExecutor(max_workers=len(pids), thread_name_prefix="stacks") as pool:
            futures: dict[int, Future[ProcessStack]] = {
                pid: pool.submit(dump_process, pid, binary, timeout) for pid in dict.fromkeys(pids)
            }
            results = {pid: f.result() for pid, f in futures.items()}
    ranks = tuple(
        RankStack(
            local_rank=lr,
            global_rank=gr,
            process=results[pid],
            children=tuple(results[k] for k in kids[pid]),
            more_children=len(tree[pid]) - len(kids[pid]),
        )
        for lr, gr, pid in targets
    )
    note = None
    errors = [r.process.error for r in ranks]
    if binary is None and ranks:
        note = NO_PYSPY
    elif any(ptrace_denied(e) for e in errors):
        note = ptrace_fix()
    return StackDump(
        reason=reason,
        wall=wall,
        duration=round(time.monotonic() - start, 4),
        ranks=ranks,
        method=PYSPY,
        note=note,
    )


def native_frames(pid: int, pyspy: str, timeout: float = NATIVE_TIMEOUT) -> tuple[Frame, ...]:
    """The C/C++ frames ``pid``'s main thread is in above its innermost Python frame,
    innermost first (``py-spy dump --native``; the process is paused while it is read); ()
    when they could not be read (no native support, the process gone, the time limit)."""
    try:
        p = run_pyspy(pyspy, pid, "--native", timeout=timeout)
        threads = _threads_of(json.loads(p.stdout)) if p.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return ()
    main = _main_index(threads, pid)
    if main is None:
        return ()
    out: list[Frame] = []
    for f in threads[main].get("frames", ()):
        module = f.get("module")
        if not module:  # the innermost Python frame: what is below it, the Python stack shows
            break
        name = str(f.get("name") or "?")
        if not _NATIVE_NOISE.match(name):
            out.append(Frame(name[:160], os.path.basename(str(module)), 0, str(module)))
    return tuple(out[:_NATIVE_KEPT])


def with_native(dump: StackDump, pyspy: str | None = "") -> StackDump:
    """``dump`` with the native frames of every rank whose main thread was read running (not
    stopped: a stopped process cannot be paused for a native read), read in parallel."""
    binary = find_pyspy() if pyspy == "" else pyspy
    todo = [
        r for r in dump.ranks if r.process.method == PYSPY and r.process.main_thread is not None
    ]
    if binary is None or not todo:
        return dump
    with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="native") as pool:
        found = dict(
            zip(
                (r.pid for r in todo),
                pool.map(lambda r: native_frames(r.pid, binary), todo),
                strict=True,
            )
        )
    ranks = []
    for r in dump.ranks:
        native = found.get(r.pid, ())
        main = r.process.main_thread
        if native and main is not None:
            threads = tuple(
                dataclasses.replace(t, native=native) if t is main else t for t in r.process.threads
            )
            r = dataclasses.replace(r, process=dataclasses.replace(r.process, threads=threads))
        ranks.append(r)
    return dataclasses.replace(dump, ranks=tuple(ranks))
