"""Failure classes: what kind of failure a rank's end was, from the evidence alone.

:func:`classify` is pure: it reads one :class:`~tui_launch.core.model.events.Failure` (its exit
code, message, traceback and stderr tail, who sent its signal, whether it hung) plus what the
run knows beside it (the step the rank had reached, whether its ``main`` had returned, whether
the kernel's OOM killer was seen) and returns a class and a short detail. The restart policy
(:mod:`tui_launch.core.model.policy`) decides from the class; the exit code a scheduler sees
(:mod:`tui_launch.core.model.exitcodes`) comes from it; the summary, the journal and the
metrics name it. See ``docs/restart-policy.md`` for the table.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass

from tui_launch.core.model import errors
from tui_launch.core.model.words import Word


class FailureClass(Word):
    """The classes, in the words the journal, the summary and the metrics use.

    A new class needs its rule in :data:`tui_launch.core.model.policy.RULES`, its row in
    :data:`tui_launch.core.model.exitcodes.CLASS_MEANINGS` and its words in :data:`WORDS`;
    ``tests/test_failclass.py`` goes through every member.
    """

    STARTUP = "startup"  # before the first step: ImportError, SyntaxError, a missing file
    EXCEPTION = "exception"  # an exception (or an exit code) in the program
    CRASH = "crash"  # the program died of its own native fault (SIGSEGV, SIGABRT, ...)
    OOM = "oom"  # out of memory: the kernel's OOM killer, or CUDA's allocator
    SIGNAL = "signal"  # a signal from outside the program (the sender named when known)
    BACKEND = "backend"  # NCCL, gloo, the store: a collective or the store broke
    HANG = "hang"  # a confirmed hang (--on-hang restart|stop)
    NODE_LOST = "node-lost"  # another node went away
    PREEMPTED = "preempted"  # SIGTERM (or the scheduler's warning signal) to the launcher
    TEARDOWN = "teardown"  # main returned, then the process died on its way out
    COLLATERAL = "collateral"  # a peer the agent terminated because another rank failed
    # An OOM kill the job's own cgroup did not count: the node ran out, not the job.
    OOM_OUTSIDE = "oom-outside"
    # The GPU itself failed (an uncorrectable ECC or NVLink error, fallen off the bus): not the
    # program, and not something a restart on the same GPU is sure to fix.
    GPU_FAULT = "gpu-fault"


# The module's names for the classes, as the rest of the launcher has always used them.
STARTUP = FailureClass.STARTUP
EXCEPTION = FailureClass.EXCEPTION
CRASH = FailureClass.CRASH
OOM = FailureClass.OOM
SIGNAL = FailureClass.SIGNAL
BACKEND = FailureClass.BACKEND
HANG = FailureClass.HANG
NODE_LOST = FailureClass.NODE_LOST
PREEMPTED = FailureClass.PREEMPTED
TEARDOWN = FailureClass.TEARDOWN
COLLATERAL = FailureClass.COLLATERAL
OOM_OUTSIDE = FailureClass.OOM_OUTSIDE
GPU_FAULT = FailureClass.GPU_FAULT

# Every class's word, in the enum's order (the choices of an option that names a class).
CLASSES: tuple[str, ...] = tuple(c.value for c in FailureClass)

# What a retry cannot fix (the program's own failures) and what it may (the infrastructure's).
PROGRAM = frozenset({STARTUP, EXCEPTION, CRASH})
INFRASTRUCTURE = frozenset({SIGNAL, BACKEND, HANG, NODE_LOST, GPU_FAULT})

_STARTUP_TYPES = re.compile(
    r"^(?:[\w.]*\.)?(ImportError|ModuleNotFoundError|SyntaxError|IndentationError|TabError"
    r"|FileNotFoundError)\b"
)
# What python itself prints for a script or a module it cannot find (no traceback).
_NO_SCRIPT = re.compile(r"can't open file|^\S*python\S*: No module named ", re.M)
_ARGPARSE = re.compile(r"(^|\s)error: ")
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I)
_HOST_OOM = re.compile(r"^(?:[\w.]*\.)?MemoryError\b")
# torch's CPU allocator, when the host cannot give it the memory.
_CPU_OOM = re.compile(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)")
_BACKEND = re.compile(
    r"\bNCCL\b|ProcessGroupNCCL|ProcessGroupGloo|\bgloo\b|DistBackendError|DistStoreError"
    r"|DistNetworkError|TCPStore|c10d",
    re.I,
)
# What the CUDA runtime, the driver and NCCL say when the GPU itself failed (CUDA's own words,
# so that a program logging its "uncorrectable ECC errors: 0" is not one): an uncorrectable
# ECC error (the kernel log's Xid 48, 94 or 95), an uncorrectable NVLink error (Xid 74), a GPU
# fallen off the bus (Xid 79), and the kernel log's Xid line for those, where a job's output
# carries it (Xid 13, 31 and 43 are the program's own faults, and are not here).
_GPU_FAULT = re.compile(
    r"uncorrectable ECC error encountered|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable"
    r"|uncorrectable NVLink error detected|NVLINK_UNCORRECTABLE|cudaErrorNvlinkUncorrectable"
    r"|fallen off the bus|GPU is lost"
    r"|\bXid\b(?:\s*\([^)]*\))?:?\s*(?:48|61|62|74|79|94|95|119|120)\b",
    re.I,
)
# A DataLoader worker the kernel killed (its OOM killer's SIGKILL) or that ran out of shared
# memory (a bus error in /dev/shm): the host's memory, raised in the rank as a RuntimeError.
_WORKER_OOM = re.compile(
    r"DataLoader worker \(pid[^)]*\) is killed by signal: Killed"
    r"|out of shared memory|insufficient shared memory"
)
# A fault of the program's own GPU code, whoever reports it: the CUDA runtime in the program's
# thread, or NCCL's watchdog, which only finds the broken CUDA context and aborts the process.
_CUDA_FAULT = re.compile(
    r"(?:CUDA error|Triton Error \[CUDA\]|cuda runtime error \(\d+\))\s*:\s*"
    r"(?:an illegal memory access|device-side assert|unspecified launch failure"
    r"|misaligned address|an illegal instruction)",
    re.I,
)
# NCCL's own errors (its result codes, torch's "NCCL error in: ...", its WARN lines), named
# anywhere in the rank's last words: the line that ends them is often NCCL's "Last error:".
_NCCL_FAILURE = re.compile(
    r"\bnccl(?:UnhandledCuda|System|Internal|Remote|InvalidArgument|InvalidUsage)Error\b"
    r"|\bNCCL error\b|\bNCCL WARN\b",
    re.I,
)
# torch's words for a collective that did not finish within the process group's timeout.
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|timed out in blocking wait", re.I
)
# A native backtrace through NCCL's library: a segfault or an abort inside NCCL.
_NCCL_NATIVE = re.compile(r"libnccl\.so|\bpnccl\w*\(")
_EXC_TYPE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Warning))\b")
_OWN_SIGNALS = {
    signal.SIGSEGV,
    signal.SIGABRT,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
}


@dataclass(frozen=True)
class Classified:
    """A failure's class, a short detail (the exception type, the OOM's source, the sender)."""

    cls: FailureClass
    detail: str = ""


def exception_type(line: str) -> str:
    """The exception's name at the start of ``line`` (``ValueError: x`` -> ``ValueError``)."""
    m = _EXC_TYPE.match(line.strip())
    return m.group(1).rsplit(".", 1)[-1] if m else ""


def last_line(message: str, traceback: str | None, tail: tuple[str, ...]) -> str:
    """The line that says what went wrong: the traceback's exception line, else the stderr
    tail's last error line, else the message."""
    if traceback:
        last = errors.last_error_line(traceback.splitlines())
        if last:
            return last
    return errors.last_error_line(tail) or message


def classify(
    *,
    exit_code: int,
    message: str,
    traceback: str | None,
    stderr_tail: tuple[str, ...],
    caused_by: str | None = None,
    collateral: bool = False,
    hung: bool = False,
    step: int | None = None,
    main_returned: bool = False,
    oom_kill: str | None = None,
) -> Classified:
    """The class of one rank's failure.

    Args:
        exit_code: the rank's exit code (negative: the signal it died of).
        message, traceback, stderr_tail: the evidence (``@record`` file, else stderr).
        caused_by: who sent the rank's signal, when tuilaunch knows (its own injections and
            controls).
        collateral: the agent terminated the rank after another one failed.
        hung: a confirmed hang, not an exit.
        step: the last training step the rank was seen at (None: none seen, or no progress
            lines).
        main_returned: the worker bootstrap saw the program's ``main`` return.
        oom_kill: where the kernel's OOM killer was seen for this attempt ("the run's cgroup
            (memory.events)", "the kernel log"), None when it was not.
    """
    if hung:
        return Classified(HANG)
    if main_returned:
        what = errors.describe_exit(exit_code)
        return Classified(TEARDOWN, f"after main returned: {what}")
    if collateral:
        return Classified(COLLATERAL)
    last = last_line(message, traceback, stderr_tail)
    text = "\n".join([message, traceback or "", *stderr_tail])
    etype = exception_type(last)
    sig = -exit_code if exit_code < 0 else None
    gpu = _GPU_FAULT.search(text)
    if gpu:
        return Classified(GPU_FAULT, _line_of(text, gpu)[:200])
    if _CUDA_OOM.search(text):
        return Classified(OOM, "CUDA out of memory")
    if sig == signal.SIGKILL and oom_kill:
        # Counted by the run's own cgroup: the job outgrew its limit (a retry will not fix
        # it); seen only in the kernel log: the node ran out, outside the job.
        cls = OOM if "cgroup" in oom_kill else OOM_OUTSIDE
        return Classified(cls, f"killed by the kernel's OOM killer ({oom_kill})")
    if _HOST_OOM.match(last):
        return Classified(OOM, "MemoryError (host memory)")
    if _CPU_OOM.search(last):
        return Classified(OOM, "torch's CPU allocator (host memory)")
    worker = _WORKER_OOM.search(text)
    if worker:
        return Classified(OOM, f"a DataLoader worker (host memory): {_line_of(text, worker)[:160]}")
    if sig is not None and caused_by:
        # sig is set, so the exit code names a signal
        name = errors.signal_name(exit_code) or f"signal {sig}"
        # "SIGKILL sent by tuilaunch (inject)" already names it; "hang injected by ..." does not
        detail = caused_by if caused_by.startswith(name) else f"{name} {caused_by}"
        return Classified(SIGNAL, detail)
    if sig is not None and sig not in _OWN_SIGNALS:
        return Classified(SIGNAL, f"{errors.signal_name(exit_code)} from outside (sender unknown)")
    fault = _CUDA_FAULT.search(text)
    if fault:
        # Before the peer signs below: NCCL's watchdog reports the program's own CUDA fault
        # as "Process group watchdog thread terminated with exception: CUDA error: ...".
        what = _line_of(text, fault)[:200]
        if sig is not None:
            return Classified(CRASH, f"{errors.signal_name(exit_code)}: {what}")
        return Classified(EXCEPTION, what)
    # An exception of the program's own (not torch's backend errors) that ends the last words.
    own_exception = bool(etype) and not _BACKEND.search(last) and not _NCCL_FAILURE.search(last)
    nccl = _NCCL_FAILURE.search(text)
    if (
        errors.peer_failure(message, traceback, *stderr_tail)
        or _BACKEND.search(last)
        or (nccl and not own_exception)
        or (sig is not None and sig in _OWN_SIGNALS and _NCCL_NATIVE.search(text))
    ):
        timeout = _NCCL_TIMEOUT.search(text)
        if timeout:  # the line that says which collective, not the C++ frame below it
            return Classified(BACKEND, _line_of(text, timeout)[:200])
        if nccl and not _BACKEND.search(last):
            return Classified(BACKEND, _line_of(text, nccl)[:200])
        if sig is not None and not _BACKEND.search(last) and _NCCL_NATIVE.search(text):
            return Classified(BACKEND, f"{errors.signal_name(exit_code)} in NCCL (libnccl)")
        return Classified(BACKEND, last[:200])
    if step is None and (_STARTUP_TYPES.match(last) or _NO_SCRIPT.search(text)):
        return Classified(STARTUP, last[:200])
    if step is None and exit_code == 2 and _ARGPARSE.search(last):
        return Classified(STARTUP, f"bad arguments: {last[:200]}")
    if sig is not None:
        return Classified(CRASH, errors.signal_name(exit_code) or "")
    where = f" at step {step}" if step is not None else ""
    return Classified(EXCEPTION, f"{etype or errors.describe_exit(exit_code)}{where}")


def _line_of(text: str, match: re.Match[str]) -> str:
    """The whole line of ``text`` that ``match`` is on, stripped (torch's rank prefix too)."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    line = text[start : end if end >= 0 else len(text)]
    return re.sub(r"^\[rank\d+\]:\s*", "", line.strip())


# A frame line of a traceback, torch's "[rankN]: " prefix allowed: file, line, function.
_FRAME = re.compile(r'^\s*(?:\[rank\d+\]:)?\s*File "([^"]*)", line (\d+), in (.+?)\s*$')
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
# The exception line after the frames: its (dotted) type, then its message.
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
# Exceptions a rank ends with when something outside stops it: never the program's own bug.
_STOPPED = frozenset({"KeyboardInterrupt", "SystemExit", "SignalException"})
# Code that is not the program's: the standard library, installed packages, Python's frozen
# modules and strings, and tuilaunch's own worker bootstrap.
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python\d+(?:\.\d+)?t?/")
_TUILAUNCH = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def own_code(path: str) -> bool:
    """Whether a traceback's file is the program's own code (not the standard library, not an
    installed package, not ``<frozen ...>`` or ``<string>``, not tuilaunch's bootstrap)."""
    p = path.replace("\\", "/")
    if p.startswith("<") or _LIBRARY.search(p):
        return False
    return not p.startswith(_TUILAUNCH + "/")


def mask(text: str) -> str:
    """``text`` with what differs between two runs of the same bug masked: addresses, then
    every number (steps, ranks, pids, ports, attempts, times, sizes)."""
    return re.sub(r"\d+", "#", re.sub(r"0x[0-9a-fA-F]+", "#", text))


def fingerprint(message: str, traceback: str | None, stderr_tail: tuple[str, ...]) -> str:
    """What makes two failures "the same exception", or "" when the evidence cannot prove it.

    The exception's type, its message with :func:`mask` applied, and the innermost frame of the
    program's own code (file, line, function) of the last traceback, from the ``@record`` error
    file, else the stderr tail. "" without a traceback (an exit code, a signal, a line the
    program printed), without a frame of the program's own code, or for an exception that
    says the rank was stopped from outside (``KeyboardInterrupt``, ``SystemExit``).
    """
    lines = traceback.splitlines() if traceback else list(stderr_tail)
    starts = [i for i, ln in enumerate(lines) if _TRACEBACK.search(ln)]
    block = lines[starts[-1] :] if starts else lines
    frames = [m for m in (_FRAME.match(ln) for ln in block) if m]
    own = [m for m in frames if own_code(m.group(1))]
    if not own:
        return ""
    m = _EXC_LINE.match(last_line(message, traceback, stderr_tail))
    if m is None:
        return ""
    etype = m.group(1)
    if etype.rsplit(".", 1)[-1] in _STOPPED:
        return ""
    path, line, func = own[-1].groups()
    return f"{etype}: {mask(m.group(2) or '')} @ {path}:{line} in {func}"


# Each class in words, for the summary and the log line.
WORDS: dict[FailureClass, str] = {
    STARTUP: "startup error",
    EXCEPTION: "exception in the program",
    CRASH: "native crash",
    OOM: "out of memory",
    OOM_OUTSIDE: "out of memory on the node (outside the job)",
    GPU_FAULT: "GPU hardware fault",
    SIGNAL: "signal from outside",
    BACKEND: "backend error",
    HANG: "hang",
    NODE_LOST: "node lost",
    PREEMPTED: "preempted",
    TEARDOWN: "crash after the program finished",
    COLLATERAL: "terminated by the agent",
}


def describe(cls: str, detail: str) -> str:
    """A failure class in words, for the summary and the log line (a word it does not know,
    from a newer journal, as itself)."""
    words = WORDS[FailureClass(cls)] if cls in CLASSES else cls
    return f"{words} ({detail})" if detail else words
