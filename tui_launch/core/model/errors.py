"""Explaining failures: signal names and hints, error files, and the stderr tail.

torch's ``@record`` writes ``error.json`` with the exception message and traceback; without it
there is only an exit code, so the last lines of the rank's stderr are the best evidence.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

_HINTS: dict[int, str] = {
    signal.SIGKILL: "killed: often the kernel's OOM killer (check `dmesg`), or a scheduler",
    signal.SIGSEGV: "segmentation fault in native code (an extension, CUDA, a driver)",
    signal.SIGABRT: "abort: a C++ exception, an assertion, or a NCCL/gloo error",
    signal.SIGBUS: "bus error: often shared memory (/dev/shm) too small for data loaders",
    signal.SIGFPE: "floating-point exception in native code",
    signal.SIGILL: "illegal instruction: a binary built for another CPU",
    signal.SIGTERM: "terminated by a signal from outside (a scheduler, a user, the agent)",
    signal.SIGINT: "interrupted (^C or SIGINT)",
    signal.SIGHUP: "hang-up: the terminal or session went away",
    signal.SIGQUIT: "quit signal",
    signal.SIGPIPE: "broken pipe: wrote to a closed pipe or socket",
}


def signal_name(exit_code: int | None) -> str | None:
    """The signal name for a negative exit code (``-9`` -> ``SIGKILL``), else None."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def hint_for(exit_code: int | None) -> str | None:
    """A one-line human hint for an exit code, or None when there is nothing useful to say."""
    if exit_code is None or exit_code == 0:
        return None
    if exit_code < 0:
        return _HINTS.get(-exit_code)
    if exit_code > 128 and (exit_code - 128) in _HINTS:
        # A shell or wrapper reports a signalled child as 128 + signal.
        sig = exit_code - 128
        return f"128+{sig}: a child died of {signal.Signals(sig).name}; " + _HINTS[sig]
    return None


def read_error_file(path: str | None) -> tuple[str, str | None, float | None] | None:
    """Read a torch ``@record`` error file: (message, traceback, timestamp), or None."""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as fp:
            data: Any = json.load(fp)
    except (OSError, ValueError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") or {}
        ts = extra.get("timestamp")
        return (
            str(msg.get("message", "")),
            extra.get("py_callstack"),
            float(ts) if ts not in (None, "") else None,
        )
    if isinstance(msg, str):
        ts = data.get("timestamp")
        return msg, None, float(ts) if ts not in (None, "") else None
    return None


def tail_lines(path: str | None, n: int = 30, max_bytes: int = 256 * 1024) -> tuple[str, ...]:
    """The last ``n`` lines of a text file, reading at most ``max_bytes`` from its end."""
    if not path or not os.path.isfile(path):
        return ()
    try:
        with open(path, "rb") as fp:
            fp.seek(0, os.SEEK_END)
            size = fp.tell()
            fp.seek(max(0, size - max_bytes))
            data = fp.read()
    except OSError:
        return ()
    lines = data.decode("utf-8", "replace").splitlines()
    return tuple(lines[-n:])


# Warnings printed at start that say nothing about how a rank ended: torch's NumPy warning
# (numpy missing or broken; torch works without it). Each is followed by the source line
# Python's warnings module quotes, which goes with it.
_HARMLESS = re.compile(r"UserWarning: Failed to initialize NumPy")


def drop_harmless(lines: tuple[str, ...] | list[str]) -> list[str]:
    """``lines`` without the known harmless warnings (and the source line quoted under each)."""
    out: list[str] = []
    skip_quote = False
    for ln in lines:
        plain = _RANK_TAG.sub("", ln)
        if _HARMLESS.search(plain):
            skip_quote = True
            continue
        if skip_quote and plain.startswith(("  ", "\t")) and not _FRAME_LINE.match(ln):
            skip_quote = False
            continue
        skip_quote = False
        out.append(ln)
    return out


# A frame of a native backtrace printed after a fatal signal, which says where the process
# died (in libnccl, say): Open MPI's and glibc's "[ 4] /lib/libnccl.so.2(+0xbd72c)[0x...]",
# UCX's " 1 0x00000000000bde56 pncclReduceScatter()  ???:0" and " 3  /lib/libnccl.so(+0x..)",
# c10's "frame #3: ...".
_NATIVE_FRAME = re.compile(
    r"\[\s*\d+\]\s+/\S+\(|^\s*\d+\s+(?:0x[0-9a-fA-F]+\s+\S+\(|/\S+\()|^\s*frame #\d+:"
)


def evidence_tail(path: str | None, n: int = 30) -> tuple[str, ...]:
    """A failed rank's last stderr lines as evidence: known harmless warnings left out; with
    no traceback, the lines up to its last error line, or to the end of the native backtrace
    printed after it (what follows is not why it died)."""
    lines = drop_harmless(tail_lines(path, n + 20))
    if not any("Traceback (most recent call last)" in ln or _FRAME_LINE.match(ln) for ln in lines):
        last = next((i for i in range(len(lines) - 1, -1, -1) if is_error_line(lines[i])), None)
        if last is not None:
            frames = [i for i in range(last + 1, len(lines)) if _NATIVE_FRAME.search(lines[i])]
            lines = lines[: (frames[-1] if frames else last) + 1]
    return tuple(lines[-n:])


# What makes a stderr line evidence of an error: a traceback, an exception line, or the words
# native code and the C++ runtime die with. A warning is never evidence (torch's NumPy warning
# was once shown as the "cause" of a SIGKILL), nor is ordinary progress output.
_ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)"
    r"|^\s*(\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b"
    r"|\b(error|fatal|abort(ed)?|terminate called|segmentation fault|core dumped"
    r"|out of memory)\b",
    re.IGNORECASE,
)
_WARNING = re.compile(r"warning", re.IGNORECASE)
# A traceback's frame line, as Python prints it (faulthandler's dumps, "line N in f" with no
# comma, are not tracebacks).
_FRAME_LINE = re.compile(r'^\s*(\[rank\d+\]:\s*)?\s+File "[^"]*", line \d+, in ')


def is_error_line(line: str) -> bool:
    """Whether one stderr line is a traceback (or one of its frames), an exception or an error
    (never a warning)."""
    if _FRAME_LINE.match(line):
        return True
    return not _WARNING.search(line) and bool(_ERROR_LINE.search(line))


def has_error_signature(lines: tuple[str, ...] | list[str]) -> bool:
    """Whether a stderr tail holds a traceback or an error, and so counts as evidence."""
    return any(is_error_line(ln) for ln in lines)


_RANK_TAG = re.compile(r"^\[rank\d+\]: ?")  # torch's worker excepthook prefixes its lines


def last_error_line(lines: tuple[str, ...] | list[str]) -> str:
    """The line that says what went wrong: after the last traceback, its exception line
    (whatever the exception's name); otherwise the last error line; "" when there is none."""
    plain = [_RANK_TAG.sub("", ln) for ln in lines]
    start = 0
    for i, line in enumerate(plain):
        # A frame line counts as much as the header: a deep traceback (a framework's training
        # loop) has its header far above a 30-line tail, and only its last frames are left.
        if "Traceback (most recent call last)" in line or _FRAME_LINE.match(line):
            start = i + 1
    if start:
        # The exception line: the first line after the frames that is not indented.
        for ln in plain[start:]:
            if ln.strip() and not ln.startswith((" ", "\t")):
                return ln.strip()
    return next((ln.strip() for ln in reversed(plain) if is_error_line(ln)), "")


# Exceptions a rank dies of when it is stopped from outside, not of its own error.
_STOPPED_BY = re.compile(r"^(KeyboardInterrupt|SystemExit|[\w.]*SignalException)\b")


def died_raising(lines: tuple[str, ...] | list[str]) -> bool:
    """Whether a stderr tail ends with a traceback's exception line: the rank raised, and its
    interpreter printed that as its last words (a rank the agent terminated prints nothing, or
    a ``KeyboardInterrupt``)."""
    plain = [_RANK_TAG.sub("", ln) for ln in lines if ln.strip()]
    if not plain or not any(
        "Traceback (most recent call last)" in ln or _FRAME_LINE.match(ln) for ln in plain
    ):
        return False
    last = last_error_line(plain)
    return bool(last) and plain[-1].strip() == last and not _STOPPED_BY.match(last)


def describe_exit(exit_code: int | None) -> str:
    """``exit 3``, ``SIGKILL (-9)`` or ``running``: a short label for a rank's end."""
    if exit_code is None:
        return "running"
    name = signal_name(exit_code)
    if name:
        return f"{name} ({exit_code})"
    return f"exit {exit_code}"


# What a rank prints when a peer on another node went away mid-collective, or its store did:
# gloo's socket errors and timeouts, NCCL's remote errors and watchdog aborts, the TCPStore
# client losing its server. Lower case; matched anywhere in the rank's last words.
_PEER_SIGNS: tuple[str, ...] = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "no route to host",
    "network is unreachable",
    "socket timeout",
    "timed out waiting",  # gloo: "Timed out waiting 1800000ms for recv operation"
    "failed to recv, got 0 bytes",  # TCPStore client: the server went away
    "ncclremoteerror",
    "remote process exited",
    "communicator was aborted",
    "watchdog caught collective operation timeout",
    "process group watchdog",
)


def peer_failure(*texts: str | None) -> bool:
    """Whether a failed rank's message, traceback or stderr tail says a *peer* broke.

    A rank whose partner on another node died fails too, with a socket error inside a
    collective: that says nothing about this node. A rank that failed with anything else (its
    own exception, a signal, an exit code) failed by itself. When in doubt this says "peer",
    which only costs a lost-node check.
    """
    text = "\n".join(t for t in texts if t).lower()
    return any(sign in text for sign in _PEER_SIGNS)


def one_line_error(e: BaseException) -> str:
    """torch's exceptions (C++ ones included) reduced to one line, with their inner cause.

    torch often wraps the informative error ("connect timeout", "address already in use")
    in a generic one ("See inner exception for details"): both go on the line.
    """

    def first_line(x: BaseException) -> str:
        text = str(x).strip() or type(x).__name__
        first = text.splitlines()[0].strip()
        name = type(x).__name__
        return first if first.startswith(name) else f"{name}: {first}"

    line = first_line(e).replace(" See inner exception for details.", "")
    inner = e.__cause__ or e.__context__
    seen = {id(e)}
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        line += f" <- {first_line(inner)}"
        inner = inner.__cause__ or inner.__context__
    return line
