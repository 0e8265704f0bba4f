"""A run as a report: what ``tuilaunch report`` shows, read from a journal and its run directory.

:func:`build` reads a ``journal.jsonl`` (finished, still written, or cut off) through the
replay's :class:`~tui_launch.core.journal.timeline.Timeline` (the same sparse index: the log
marks, most of a long journal, are never parsed) and folds its state events with the store's
own :func:`~tui_launch.core.model.store.reduce`, so the report says what the dashboard, the
headless summary and a replay say. Beside the final :class:`~tui_launch.core.model.store.Snapshot`
it keeps what a snapshot forgets: every attempt's span, every failure, restart, injection,
hang and control action on the time axis (:class:`Mark`), and the journaled progress and
telemetry records as time series (:class:`Table`), cut down to at most ``points`` rows each
(bucket means) so a day-long run makes a page of reasonable size. From the run directory: the
last lines of each rank's logs and the hang's stacks. Secrets in the command line and the
environment are redacted (:mod:`tui_launch.core.model.redact`).

Telemetry records older than the snapshot's histories are not reduced (as an attach's first
frame does, :mod:`.recent`): they only feed the series here, and the end totals come from the
journal's ``telemetry_totals`` when the run wrote it.

No front end: the HTML and Markdown renderers (:mod:`tui_launch.report`) read a :class:`Report`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tui_launch import __version__
from tui_launch.core.journal.marks import Mark, mark_of
from tui_launch.core.journal.recent import window
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.logs.lastlines import tail_lines
from tui_launch.core.model.events import (
    HangDetected,
    ProgressRecord,
    RunStarted,
    TelemetryRecord,
    from_dict,
)
from tui_launch.core.model.goodput import GoodputSummary
from tui_launch.core.model.layout import STREAMS, RunDirLayout, dump_files, journal_of
from tui_launch.core.model.progress import HISTORY as PROGRESS_HISTORY
from tui_launch.core.model.progress import goodput
from tui_launch.core.model.redact import redact_args, redact_env
from tui_launch.core.model.store import Snapshot, reduce

POINTS = 600  # rows at most per plotted table
LOG_LINES = 40  # last lines of each rank's stream
LOG_ATTEMPTS = 4  # attempts whose logs are shown at most
STACKS_BYTES = 64 * 1024  # of a hang's stacks.txt
TELEMETRY, PROGRESS = TelemetryRecord.kind, ProgressRecord.kind
RECORDS = frozenset((TELEMETRY, PROGRESS))


class NotAJournal(ValueError):
    """The path names no journal, or a file that holds no whole event."""


@dataclass(frozen=True)
class Span:
    """One attempt from its workers' start to its end (``end`` None: still running)."""

    number: int
    start: float
    end: float | None
    world_size: int
    end_reason: str | None


@dataclass(frozen=True)
class Table:
    """Time series sharing one time axis: ``t`` (wall-clock seconds) and ``columns`` (name,
    values; None where a series has no value at that time, e.g. a rank between attempts).
    ``rows`` is how many rows the journal held before they were cut to at most ``POINTS``."""

    t: tuple[float, ...] = ()
    columns: tuple[tuple[str, tuple[float | None, ...]], ...] = ()
    rows: int = 0

    def column(self, name: str) -> tuple[float | None, ...]:
        """The values of column ``name`` (empty when there is no such column)."""
        for n, values in self.columns:
            if n == name:
                return values
        return ()


@dataclass(frozen=True)
class RankLog:
    """The last lines of one rank's stream in one attempt (``path`` relative to the run
    directory); ``size`` is the file's size in bytes."""

    attempt: int
    local_rank: int
    stream: str
    path: str
    size: int
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    """Everything a report shows, read from one journal and its run directory."""

    journal: str
    run_dir: str
    snapshot: Snapshot
    events: int  # whole events in the journal, log marks included
    state_events: int
    running: bool  # no run_finished: still running, or the launcher was killed
    start_wall: float | None
    end_wall: float | None  # run_finished, or the last event while it runs
    duration: float
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    tuilaunch_version: str  # the launcher's ("" for a journal written before it was kept)
    reader_version: str
    spans: tuple[Span, ...]
    marks: tuple[Mark, ...]
    progress: dict[str, Table] = field(default_factory=dict)  # "rate", "loss", "step"
    telemetry: dict[str, Table] = field(default_factory=dict)  # "cpu", "rss", "gpu_util", ...
    goodput: GoodputSummary | None = None
    logs: tuple[RankLog, ...] = ()
    hang_stacks: str = ""  # the confirming dump's stacks.txt ("" when not found)
    hang_stacks_path: str = ""
    gpu_note: str = ""

    @property
    def outcome(self) -> str:
        """succeeded, failed, stopped, error, or ``running`` (no end recorded)."""
        fin = self.snapshot.finished
        return fin.outcome if fin is not None else "running"


def journal_path(target: str) -> str:
    """The journal a report argument names (a run directory or the file); NotAJournal."""
    path = journal_of(target)
    if not os.path.isfile(path):
        raise NotAJournal(f"no journal at {path}")
    return path


def build(target: str, points: int = POINTS, now: float | None = None) -> Report:
    """Read the journal ``target`` names (a run directory or the file) into a :class:`Report`.

    Raises :class:`NotAJournal` (one line) when there is none or it holds no event, OSError
    when it cannot be read. ``now`` (wall clock) closes a run still going (default: its last
    event's time).
    """
    path = journal_path(target)
    timeline = Timeline(path)
    try:
        if not len(timeline) or not len(timeline.states):
            raise NotAJournal(f"{path} holds no tuilaunch event")
        return _build(timeline, path, points, now)
    finally:
        timeline.close()


def _build(timeline: Timeline, path: str, points: int, now: float | None) -> Report:
    run_dir = os.path.dirname(os.path.abspath(path))
    kinds = timeline._state_kind
    n_states = len(timeline.states)
    # Pass 1: the progress and telemetry records (most of a long journal's state events) as
    # series, read as JSON only: building and folding each as an event is what makes a full
    # replay of a day slow, and the snapshot needs few of them (pass 2).
    prog, tele = _Collector(), _Collector()
    rates = _StepRates()
    progress_attempts: list[tuple[int, int]] = []  # (state index, attempt)
    for k, (_, line) in enumerate(timeline._state_lines(0, n_states)):
        kind = kinds[k]
        if kind not in RECORDS:
            continue
        try:
            data = json.loads(line)
            if kind == TELEMETRY:
                tele.add(float(data["wall"]), _telemetry_row(data["ranks"]))
            else:
                wall, attempt = float(data["wall"]), int(data["attempt"])
                prog.add(wall, _progress_row(data["ranks"], rates, wall, attempt))
                progress_attempts.append((k, attempt))
        except (KeyError, TypeError, ValueError):
            continue
    # Pass 2: every other state event and the records the final snapshot is made of, folded
    # by the store's reduce in journal order.
    needed = set(window(timeline, n_states)) | _progress_needed(progress_attempts)
    snap = Snapshot()
    skipped = 0
    marks: list[Mark] = []
    first_wall: float | None = None
    last_wall = 0.0
    started: RunStarted | None = None
    for k, (_, line) in enumerate(timeline._state_lines(0, n_states)):
        if kinds[k] in RECORDS and k not in needed:
            skipped += 1
            continue
        try:
            e = from_dict(json.loads(line))
        except (KeyError, TypeError, ValueError):
            continue
        if first_wall is None:
            first_wall = e.wall
        last_wall = max(last_wall, e.wall)
        if isinstance(e, RunStarted) and started is None:
            started = e
        mark = mark_of(e)
        if mark is not None:
            marks.append(mark)
        snap = reduce(snap, e)
    if tele.t:
        last_wall = max(last_wall, tele.t[-1])
    if prog.t:
        last_wall = max(last_wall, prog.t[-1])
    snap = replace(snap, version=snap.version + skipped, events=snap.events + skipped)
    running = snap.finished is None
    end_wall = snap.finished.wall if snap.finished is not None else (now or last_wall)
    start_wall = _start_wall(snap, first_wall)
    duration = max(0.0, end_wall - start_wall) if start_wall is not None else 0.0
    spans = tuple(
        Span(a.number, a.started, a.ended, a.world_size, a.end_reason) for a in snap.attempts
    )
    hang_text, hang_path = _hang_stacks(snap.hang, run_dir)
    tel = snap.telemetry
    return Report(
        journal=os.path.abspath(path),
        run_dir=run_dir,
        snapshot=snap,
        events=len(timeline),
        state_events=n_states,
        running=running,
        start_wall=start_wall,
        end_wall=end_wall,
        duration=duration,
        command=redact_args(_command(started)),
        env=redact_env(started.env if started is not None else ()),
        tuilaunch_version=started.tuilaunch_version if started is not None else "",
        reader_version=__version__,
        spans=spans,
        marks=tuple(marks),
        progress=prog.tables(points, ("rate", "loss", "step")),
        telemetry=tele.tables(points, ("cpu", "rss", "gpu_util", "gpu_mem")),
        goodput=goodput(snap.progress, snap.attempts, end_wall),
        logs=tuple(_logs(run_dir, snap)),
        hang_stacks=hang_text,
        hang_stacks_path=hang_path,
        gpu_note=tel.latest.gpu_note if tel is not None else "",
    )


def _start_wall(s: Snapshot, first: float | None) -> float | None:
    """When the launcher began, on the wall clock (its monotonic start carried over)."""
    if s.run is None:
        return first
    if s.launched_mono is not None:
        return s.run.wall - (s.run.mono - s.launched_mono)
    return s.run.wall


def _command(e: RunStarted | None) -> tuple[str, ...]:
    """The launcher's command line when the journal kept it, else the training command."""
    if e is None:
        return ()
    if e.command:
        return e.command
    return (e.entrypoint, *e.args)


def _telemetry_row(ranks: list[dict[str, Any]]) -> dict[str, float | None]:
    """One telemetry record's readings by column (the record's JSON ``ranks``): per global
    rank CPU %, RSS (MB), and the GPU % and GPU memory (MB) of a rank that has a GPU."""
    row: dict[str, float | None] = {}
    for r in ranks:
        name = f"rank {r['global_rank']}"
        rss = r.get("rss")
        row[f"cpu/{name}"] = r.get("cpu")
        row[f"rss/{name}"] = rss / 1e6 if rss is not None else None
        if r.get("gpus"):
            util, mem = r.get("gpu_util"), r.get("gpu_mem")
            row[f"gpu_util/{name}"] = float(util) if util is not None else None
            row[f"gpu_mem/{name}"] = mem / 1e6 if mem is not None else None
    return row


def _progress_row(
    ranks: list[dict[str, Any]], rates: _StepRates, wall: float, attempt: int
) -> dict[str, float | None]:
    """One progress record by column (the record's JSON ``ranks``): per global rank steps/s
    (from the step counter, :class:`_StepRates`), loss and step."""
    row: dict[str, float | None] = {}
    for r in ranks:
        rank = int(r["global_rank"])
        name = f"rank {rank}"
        step = r.get("step")
        row[f"rate/{name}"] = rates.rate(rank, attempt, wall, step)
        row[f"loss/{name}"] = r.get("loss")
        row[f"step/{name}"] = float(step) if step is not None else None
    return row


class _StepRates:
    """Each rank's step rate between two progress records: the steps it advanced over the
    seconds between them. Not the record's own ``rate``: the tracker's rate is its last
    window's and stays put while a rank prints nothing, so a hung job would plot as steady;
    from the counter, a rank that stops advancing falls to 0. None (a gap) at a rank's first
    record of an attempt and where its counter went back (a new epoch's bar)."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, float, int]] = {}  # rank: (attempt, wall, step)

    def rate(self, rank: int, attempt: int, wall: float, step: object) -> float | None:
        if not isinstance(step, int | float):
            self.last.pop(rank, None)
            return None
        before = self.last.get(rank)
        self.last[rank] = (attempt, wall, int(step))
        if before is None or before[0] != attempt or wall <= before[1] or step < before[2]:
            return None
        return (step - before[2]) / (wall - before[1])


def _progress_needed(records: list[tuple[int, int]], keep: int = PROGRESS_HISTORY) -> set[int]:
    """The progress records (state indices; ``records`` as ``(index, attempt)`` in journal
    order) the final snapshot's progress view is made of: the first and last of each attempt
    (the view's per-attempt goodput facts, and where its flags reset) and the last ``keep``
    (the rate histories). The others change nothing the end state keeps."""
    needed = {k for k, _ in records[-keep:]}
    for i, (k, attempt) in enumerate(records):
        if i == 0 or records[i - 1][1] != attempt:
            needed.add(k)
        if i + 1 == len(records) or records[i + 1][1] != attempt:
            needed.add(k)
    return needed


class _Collector:
    """Rows of readings by column name, then cut into :class:`Table` s by metric."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.rows: list[dict[str, float | None]] = []
        self.names: dict[str, None] = {}

    def add(self, wall: float, row: dict[str, float | None]) -> None:
        self.t.append(wall)
        self.rows.append(row)
        self.names.update(dict.fromkeys(row))

    def tables(self, points: int, metrics: Sequence[str]) -> dict[str, Table]:
        out: dict[str, Table] = {}
        buckets = _buckets(len(self.t), points)
        times = tuple(_mean([self.t[i] for i in range(a, b)]) or 0.0 for a, b in buckets)
        for metric in metrics:
            prefix = metric + "/"
            names = sorted(
                (n for n in self.names if n.startswith(prefix)), key=lambda n: _rank_key(n)
            )
            columns = []
            for name in names:
                values = [row.get(name) for row in self.rows]
                if all(v is None for v in values):
                    continue
                cut = tuple(_mean(values[a:b]) for a, b in buckets)
                columns.append((name[len(prefix) :], cut))
            if columns:
                out[metric] = Table(t=times, columns=tuple(columns), rows=len(self.t))
        return out


def _rank_key(name: str) -> tuple[int, str]:
    tail = name.rsplit(" ", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (1 << 30, name)


def _buckets(n: int, points: int) -> list[tuple[int, int]]:
    """``n`` rows as at most ``points`` consecutive ranges of (nearly) equal length."""
    if n <= points:
        return [(i, i + 1) for i in range(n)]
    edges = [round(i * n / points) for i in range(points + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _logs(run_dir: str, s: Snapshot) -> list[RankLog]:
    """The last lines of each rank's streams: of the last attempt, and of the attempts that
    failed (the last :data:`LOG_ATTEMPTS` of them)."""
    failed = sorted({f.attempt for f in s.failures if f.attempt != s.attempt})
    attempts = [*failed[-(LOG_ATTEMPTS - 1) :], s.attempt]
    out = []
    layout, relative = RunDirLayout(run_dir), RunDirLayout("")  # the report shows the latter
    for attempt in attempts:
        with contextlib.suppress(OSError):
            for rank in layout.local_ranks(attempt):
                for stream in STREAMS:
                    rel = relative.rank_log(attempt, rank, stream)
                    tail = tail_lines(layout.rank_log(attempt, rank, stream), LOG_LINES)
                    if tail is not None:
                        size, lines = tail
                        out.append(RankLog(attempt, rank, stream, rel, size, lines))
    return out


def _hang_stacks(hang: HangDetected | None, run_dir: str) -> tuple[str, str]:
    """The confirming dump's stacks.txt of the hang (its path as recorded, or the same dump
    under this run directory when the report is read on another machine)."""
    if hang is None or not hang.second_path:
        return "", ""
    for directory in (
        hang.second_path,
        RunDirLayout(run_dir).dump_dir(os.path.basename(hang.second_path.rstrip("/"))),
    ):
        _, path = dump_files(directory)
        with contextlib.suppress(OSError), open(path, "rb") as fp:
            data = fp.read(STACKS_BYTES + 1)
            text = data[:STACKS_BYTES].decode("utf-8", "replace")
            if len(data) > STACKS_BYTES:
                text += "\n[... cut: the whole dump is in the file]"
            return text, path
    return "", hang.second_path


__all__ = [
    "LOG_LINES",
    "POINTS",
    "Mark",
    "NotAJournal",
    "RankLog",
    "Report",
    "Span",
    "Table",
    "build",
    "journal_path",
]
