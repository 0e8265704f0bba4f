"""Worker output to a console, byte for byte as torchrun writes it, without copying in Python.

What torchrun's console gets from a worker (checked by running torchrun to a pipe and a pty):

- *Not redirected* (the default): the worker writes straight to the inherited console, so the
  console gets the worker's own bytes, as they are written: a tqdm bar's ``\\r`` updates move
  it in place on a terminal and reach a pipe as they are. tuilaunch has the worker write to its
  rank file and moves each new byte range of that file to the console (:func:`copy_range`):
  with ``os.sendfile`` to a file (the kernel copies), with large ``pread``/``write`` chunks to
  a pipe or a terminal; never line by line.
- *Tee'd* (``--tee``): torch's tail thread reads the file in text mode, where ``\\n``, ``\\r\\n``
  and ``\\r`` all end a line, and writes each line as ``prefix + line + "\\n"``: one line per
  bar update, on a terminal and on a pipe alike. :class:`PrefixedLines` does the same with a
  few bytes operations per chunk (no per-line Python). Unlike torch's ``readline`` it never
  splits a line still being written, and it ends a last unterminated line with ``\n``.

A console that is ``/dev/null`` (:func:`is_devnull`) needs nothing at all: nothing is read.

A console that goes away (``tuilaunch ... | head``: its reader exits, writes fail with
``EPIPE``) costs nothing but the console: :class:`ConsoleStream` and :func:`silence` turn the
descriptor into ``/dev/null`` at the first failed write, so no writer of it (the launcher's own
lines, torch's log records, the workers' bytes, the summary) raises, and the run goes on.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Callable
from typing import TextIO

COPY_CHUNK = 1 << 22


def is_devnull(fd: int) -> bool:
    """Whether ``fd`` is ``/dev/null`` (what is written there needs no copying)."""
    try:
        st = os.fstat(fd)
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


_NO_SENDFILE: set[int] = set()  # output fds sendfile refused: pread + write
_SENDFILE_OK: set[int] = set()  # output fds that are regular files


def _sendfile_to(out_fd: int) -> bool:
    """Whether to ``sendfile`` to ``out_fd``: only a regular file. Into a pipe each call takes
    one of its 16 slots whatever its size (spliced pages are never merged), so a pipe whose
    reader is slow fills after 16 small copies and blocks the tailer; a write() of the same
    bytes merges them into its 64 kB."""
    if out_fd in _SENDFILE_OK:
        return True
    if out_fd in _NO_SENDFILE:
        return False
    try:
        regular = stat.S_ISREG(os.fstat(out_fd).st_mode)
    except OSError:
        regular = False
    (_SENDFILE_OK if regular else _NO_SENDFILE).add(out_fd)
    return regular


def copy_range(in_fd: int, out_fd: int, start: int, end: int) -> None:
    """Copy bytes ``[start, end)`` of the file ``in_fd`` to ``out_fd``, in the kernel if it can.

    ``in_fd``'s position does not move. To a regular file ``os.sendfile`` moves the bytes in
    the kernel; to a pipe or a terminal they go through ``os.pread``/``os.write`` in chunks of
    up to 4 MB (one copy, no per-line work).
    """
    pos = start
    while pos < end:
        n = min(end - pos, COPY_CHUNK)
        if _sendfile_to(out_fd):
            try:
                sent = os.sendfile(out_fd, in_fd, pos, n)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                _SENDFILE_OK.discard(out_fd)
                _NO_SENDFILE.add(out_fd)
                continue
            if sent == 0:  # the file is shorter than it said (truncated): nothing more to copy
                return
            pos += sent
            continue
        data = os.pread(in_fd, n, pos)
        if not data:
            return
        write_all(out_fd, data)
        pos += len(data)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PrefixedLines:
    """torch's ``--tee`` console lines: every ``\\n``, ``\\r\\n`` or ``\\r`` ends a line, which is
    written as ``prefix + line + "\\n"``; an unterminated line waits for its end.

    Args:
        prefix: torchrun's ``[role<local_rank>]:`` (or the template's) prefix.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix.encode()
        self._pending = b""

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """The console bytes for ``data`` (the next bytes of the stream); ``final``: its end."""
        data = self._pending + data
        held = b""
        if not final and data.endswith(b"\r"):
            data, held = data[:-1], b"\r"  # maybe the first half of \r\n: decide with the next read
        # Most output holds no \r at all: one memchr says so, where the two replaces would
        # scan every byte twice (half of this method's time on a flood of plain lines).
        text = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in data else data
        cut = text.rfind(b"\n")
        whole, rest = text[: cut + 1], text[cut + 1 :]
        p = self._prefix
        out = p + whole[:-1].replace(b"\n", b"\n" + p) + b"\n" if whole else b""
        if final and rest:  # the writer is gone: its last line ends here (torch adds no \n)
            out += p + rest + b"\n"
            rest = b""
        self._pending = rest + held
        return out


def silence(fd: int) -> None:
    """Make ``fd`` write to ``/dev/null`` from now on (its console went away).

    ``dup2`` keeps the descriptor's number, so every holder of it (a text stream, torch's
    logging handler, a copy loop) goes on writing without an error and without a word.
    """
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.dup2(null, fd, inheritable=False)
        finally:
            os.close(null)
    _SENDFILE_OK.discard(fd)
    _NO_SENDFILE.discard(fd)


def lost_words(e: OSError) -> str:
    """Why a console went away, in words (``Broken pipe``: its reader exited)."""
    return e.strerror or type(e).__name__


class ConsoleStream(io.TextIOBase):
    """A console text stream (the launcher's stdout or stderr) that cannot break the run.

    The first write or flush that fails (``EPIPE``: the reader of the pipe exited; ``EIO``;
    ``ENOSPC``: a file on a full disk) makes the descriptor ``/dev/null`` (:func:`silence`),
    sets :attr:`gone` to the reason and calls ``on_gone(name, reason)`` once; from then on
    writes are dropped. Anything else (``fileno``, ``isatty``, ``encoding``) is the stream's.

    Args:
        stream: the stream to write to.
        name: ``stdout`` or ``stderr`` (for ``on_gone``).
    """

    def __init__(self, stream: TextIO, name: str) -> None:
        super().__init__()
        self.stream = stream
        self.name = name
        self.gone: str | None = None
        self.on_gone: Callable[[str, str], None] | None = None

    def write(self, s: str) -> int:
        """Write ``s`` (dropped once the console is gone); never raises ``OSError``."""
        if self.gone is None:
            try:
                self.stream.write(s)
            except OSError as e:
                self.lost(e)
        return len(s)

    def flush(self) -> None:
        """Flush the stream; never raises ``OSError``."""
        if self.gone is None:
            try:
                self.stream.flush()
            except OSError as e:
                self.lost(e)

    def lost(self, e: OSError) -> None:
        """The console went away with ``e``: silence it (also called by a writer of its fd)."""
        if self.gone is not None:
            return
        self.gone = lost_words(e)
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            silence(self.stream.fileno())
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()  # what was buffered goes to /dev/null: no later flush fails
        if self.on_gone is not None:
            self.on_gone(self.name, self.gone)

    def fileno(self) -> int:
        """The descriptor under the stream."""
        return self.stream.fileno()

    def isatty(self) -> bool:
        """Whether the stream is a terminal (False once it is gone)."""
        if self.gone is not None:
            return False
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def writable(self) -> bool:
        """Always: a gone console takes every write."""
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The stream's encoding."""
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The stream's error handler."""
        return getattr(self.stream, "errors", None)
