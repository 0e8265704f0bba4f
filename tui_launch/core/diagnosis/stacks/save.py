"""Keep a dump in the run directory: ``stacks/<timestamp>-<reason>/stacks.{json,txt}``.

``stacks.json`` holds the whole dump and its verdict (machine-readable, read back with
:func:`load`); ``stacks.txt`` is for people: the verdict first, then each distinct main-thread
stack once with the ranks that share it, then the other threads, the child processes and what
could not be dumped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui_launch.core.diagnosis.stacks.model import (
    Frame,
    ProcessStack,
    StackDump,
    ThreadStack,
    dump_from_dict,
    dump_to_dict,
)
from tui_launch.core.diagnosis.stacks.verdict import SEES_MORE, Verdict, group_stacks, verdict
from tui_launch.core.model.events import StacksDumped
from tui_launch.core.model.layout import RunDirLayout, dump_files
from tui_launch.core.model.text import rank_list


@dataclass(frozen=True)
class SavedDump:
    """Where a dump was written."""

    directory: str
    json: str
    text: str


def _frames(frames: tuple[Frame, ...], indent: str = "    ") -> list[str]:
    if not frames:
        return [f"{indent}(no Python frame)"]
    return [f"{indent}{f.where}" for f in frames]


def _thread_title(t: ThreadStack) -> str:
    bits = [f"thread {t.name or hex(t.thread_id)}"]
    if t.native_id is not None:
        bits.append(f"tid {t.native_id}")
    if t.owns_gil:
        bits.append("holds the GIL")
    elif t.active is False:
        bits.append("idle")
    return ", ".join(bits)


def _native(frames: tuple[Frame, ...]) -> list[str]:
    """The native frames above a Python stack, marked as such (innermost first)."""
    return [f"    [C/C++] {f.function} ({f.file})" for f in frames]


def _process_line(p: ProcessStack) -> str:
    state = f"state {p.state}" if p.state else "gone"
    return f"pid {p.pid} ({state}, {p.method}, {p.duration:.3f} s)"


def render_text(dump: StackDump, v: Verdict | None = None) -> str:
    """The human text of a dump: verdict, distinct stacks with their ranks, then the rest."""
    v = v or verdict(dump)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(dump.wall))
    out = [
        v.text,
        "",
        f"reason: {dump.reason}; taken {when} with {dump.method} in {dump.duration:.3f} s; "
        f"{len(dump.ranks)} ranks",
    ]
    if dump.note:
        out.append(dump.note)
    for group in group_stacks(dump):
        n = len(group.ranks)
        # "x 7 ranks" with the multiplication sign, as the dashboard will show it.
        many = f"ranks {rank_list(group.ranks)} (\u00d7 {n} ranks)"
        who = f"rank {group.ranks[0]}" if n == 1 else many
        out += ["", f"main thread of {who}:", *_native(group.native), *_frames(group.frames)]
    # Other threads: identical ones (same name and frames) on several ranks are shown once.
    others: dict[tuple[Any, ...], list[int]] = {}
    titles: dict[tuple[Any, ...], tuple[str, tuple[Frame, ...]]] = {}
    for r in dump.ranks:
        for t in r.process.threads:
            if t.main:
                continue
            key = (t.name, tuple((f.function, f.file, f.line) for f in t.frames))
            others.setdefault(key, []).append(r.global_rank)
            titles[key] = (t.name or "thread", t.frames)
    for key, ranks in others.items():
        name, frames = titles[key]
        out += ["", f"thread {name} of ranks {rank_list(ranks)}:", *_frames(frames)]
    for r in dump.ranks:
        p = r.process
        if p.error or p.wchan:
            wchan = f"; kernel wait {p.wchan}" if p.wchan else ""
            out += ["", f"rank {r.global_rank}: {_process_line(p)}: {p.error or ''}{wchan}"]
        if p.raised:
            out += ["", f"rank {r.global_rank} raised, with the stack above: {p.raised}"]
        for c in r.children:
            out += ["", f"rank {r.global_rank}, child {_process_line(c)} {c.cmdline[:80]}"]
            if c.error or c.wchan:
                out.append(f"    {c.error or ''}{'; kernel wait ' + c.wchan if c.wchan else ''}")
            for t in c.threads:
                out += [f"  {_thread_title(t)}:", *_frames(t.frames)]
    out += ["", "per rank:"]
    out += [
        f"  rank {r.global_rank} (local {r.local_rank}): {_process_line(r.process)}, "
        f"{len(r.process.threads)} threads, {len(r.children)} children"
        + (f" (+{r.more_children} not dumped)" if r.more_children else "")
        for r in dump.ranks
    ]
    return "\n".join(out) + "\n"


def _slug(reason: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", reason).strip("-")[:40] or "dump"


def save(dump: StackDump, run_dir: str | os.PathLike[str], v: Verdict | None = None) -> SavedDump:
    """Write ``dump`` under ``<run_dir>/stacks/<timestamp>-<reason>/``; return the paths."""
    v = v or verdict(dump)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(dump.wall))
    stamp += f".{int(dump.wall * 1000) % 1000:03d}"
    layout = RunDirLayout(os.fspath(run_dir))
    Path(layout.stacks_dir).mkdir(parents=True, exist_ok=True)
    name = f"{stamp}-{_slug(dump.reason)}"
    directory = Path(layout.dump_dir(name))
    n = 1
    while True:
        try:
            directory.mkdir()
            break
        except FileExistsError:  # two dumps in the same millisecond: keep both
            n += 1
            directory = Path(layout.dump_dir(f"{name}-{n}"))
    return rewrite(str(directory), dump, v)


def rewrite(directory: str, dump: StackDump, v: Verdict | None = None) -> SavedDump:
    """Write ``dump``'s ``stacks.json`` and ``stacks.txt`` into ``directory`` (an existing
    dump's, to add what was read after it was first kept: the native frames of a hang)."""
    v = v or verdict(dump)
    data = {"verdict": dataclasses.asdict(v), "dump": dump_to_dict(dump)}
    json_file, text_file = dump_files(directory)
    json_path, text_path = Path(json_file), Path(text_file)
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    text_path.write_text(render_text(dump, v))
    return SavedDump(directory, str(json_path), str(text_path))


def load(path: str | os.PathLike[str]) -> StackDump:
    """Read a dump back from a ``stacks.json`` (or the directory that holds it)."""
    p = Path(path)
    if p.is_dir():
        p = Path(dump_files(str(p))[0])
    return dump_from_dict(json.loads(p.read_text())["dump"])


@dataclass(frozen=True)
class OwnVerdict:
    """A stack dump's own verdict, as its ``stacks.json`` keeps it."""

    text: str
    kind: str
    odd: tuple[int, ...]


def verdict_that_sees_more(records_dir: str) -> OwnVerdict | None:
    """The verdict of the stack dump whose records are in ``records_dir``
    (``<dump>/flightrec``), when it was made from more than those records (a second look, the
    stacks: :data:`~.verdict.SEES_MORE`); None otherwise, or when it cannot be read."""
    json_file, _ = dump_files(os.path.dirname(os.path.normpath(records_dir)))
    try:
        with open(json_file) as fp:
            v = json.load(fp).get("verdict") or {}
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(v, dict) or v.get("collective") not in SEES_MORE:
        return None
    return OwnVerdict(str(v.get("text", "")), str(v["collective"]), tuple(v.get("odd") or ()))


def dumped_event(
    dump: StackDump, saved: SavedDump, attempt: int, v: Verdict | None = None
) -> StacksDumped:
    """The journal's record of a kept dump (it points to the directory)."""
    v = v or verdict(dump)
    return StacksDumped(
        reason=dump.reason,
        attempt=attempt,
        ranks=tuple(r.global_rank for r in dump.ranks),
        verdict=v.text,
        odd_ranks=v.odd,
        path=saved.directory,
        method=dump.method,
        duration=dump.duration,
        note=dump.note or "",
        places=tuple(f"rank {p.global_rank}: {p.place}" for p in v.places),
    )
