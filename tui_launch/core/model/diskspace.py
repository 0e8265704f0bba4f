"""A full (or failing) file system, in words: which one, how big, and which file it cost.

A log directory on a full file system shows up as ranks that "exit 1" with nothing in their
stderr (their traceback could not be written either) and as the launcher's own writers (the
journal, the agent log) failing with ``ENOSPC``. These helpers name the file system and the
file so that the root cause and the notices say "no space left", not just "exit 1".
"""

from __future__ import annotations

import errno
import os

from tui_launch.core.model.text import fmt_bytes

# Errors that mean "this file system cannot take more": out of blocks, out of quota, out of
# inodes (ENOSPC too).
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def mount_point(path: str) -> str:
    """The mount point of the file system holding ``path`` (its nearest existing ancestor)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    try:
        dev = os.stat(p).st_dev
        while p != os.path.dirname(p):
            parent = os.path.dirname(p)
            if os.stat(parent).st_dev != dev:
                break
            p = parent
    except OSError:
        pass
    return p


def _size(n: int) -> str:
    """A file system's size or free space: ``2.0 MB``, ``512.0 kB``."""
    return fmt_bytes(n, words=True, tenths=True)


def free_space(path: str) -> tuple[int, int] | None:
    """(free bytes for an unprivileged writer, total bytes) of ``path``'s file system."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def full_filesystem(path: str | None) -> str | None:
    """``"/mnt (2.0 MB, 0 B free)"`` when the file system holding ``path`` is (nearly) full.

    Nearly: less than 5% free and under 1 MB, so that a rank whose last write failed (the
    launcher may have freed a few pages since, a partial line cut off) still counts.
    None when it has room, or ``path`` is None.
    """
    if not path:
        return None
    space = free_space(path)
    if space is None:
        return None
    free, total = space
    if total <= 0 or free >= min(1024 * 1024, total * 0.05):
        return None
    return f"{mount_point(path)} ({_size(total)}, {_size(free)} free)"


def write_error(e: OSError, path: str) -> str:
    """One sentence for a failed write of ``path``: the error, the file, the file system."""
    what = os.strerror(e.errno) if e.errno else str(e)
    fs = mount_point(path)
    space = free_space(path)
    size = f" ({_size(space[1])}, {_size(space[0])} free)" if space else ""
    if e.errno in FULL_ERRNOS:
        return f"{what.lower()}: the file system at {fs}{size} is full; writing {path} failed"
    return f"{what.lower()} writing {path} (file system at {fs}{size})"
