"""An attach's first frame: the state at a journal's end without its old telemetry records.

A long journal is mostly telemetry records (one every ``--journal-samples`` seconds) among a
few hundred other state events, and the full reduce parses and folds every one of them. What the
dashboard shows of telemetry is the latest record and the short histories of
:class:`~tui_launch.core.model.telemetry.TelemetryView` (the last
:data:`~tui_launch.core.model.telemetry.HISTORY` values per GPU and per rank: the GPU panel's
and the Workers table's sparklines, the CPU sparkline's scale over the whole history). So
:func:`recent_snapshot` reduces every other state event and only the telemetry records the
histories are made of, found walking back from the end:

- GPU histories (by position) reset when the set of GPUs changes: records are taken until
  :data:`HISTORY` in a row share the last record's GPUs, or one with other GPUs is met;
- rank histories reset when the attempt changes: records are taken until each rank of the
  last record has :data:`HISTORY` readings in the last record's attempt, or a record of
  another attempt is met.

Folding from nothing at that point gives the same histories as folding everything: what is
older than the window was pushed out, or reset away, by the records inside it. ``version``
and ``events`` count the skipped records too. What differs is ``telemetry.totals`` (sums over
every record, which no panel shows): the exact state, totals included, comes from the
checkpoints a background thread computes (:meth:`Timeline.precompute`), as ``replay`` does.
A rank absent from the last record has no reading in the Workers table, hence no sparkline;
its history is not part of what this makes exact.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import replace

from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model.events import Event, TelemetryRecord, from_dict
from tui_launch.core.model.store import Snapshot, reduce
from tui_launch.core.model.telemetry import HISTORY

TELEMETRY = TelemetryRecord.kind


def _parse(timeline: Timeline, k: int) -> Event | None:
    """The ``k``-th state event, parsed (None: a kind this version does not know)."""
    for _, line in timeline._state_lines(k, k + 1):
        try:
            return from_dict(json.loads(line))
        except (KeyError, TypeError, ValueError):
            return None
    return None


def window(timeline: Timeline, j: int, keep: int = HISTORY) -> dict[int, Event]:
    """The telemetry records among the first ``j`` state events that the last one's
    histories are made of, parsed, by state index (see the module docstring)."""
    kinds = timeline._state_kind
    out: dict[int, Event] = {}
    last: TelemetryRecord | None = None
    counts: dict[int, int] = {}
    gpus_run = 0
    gpus_done = ranks_done = False
    for k in range(j - 1, -1, -1):
        if kinds[k] != TELEMETRY:
            continue
        e = _parse(timeline, k)
        if not isinstance(e, TelemetryRecord):
            continue
        if last is None:
            last = e
            counts = dict.fromkeys((r.local_rank for r in e.ranks), 0)
        gpus = tuple(g.index for g in e.gpus) == tuple(g.index for g in last.gpus)
        gpus_done = gpus_done or not gpus or gpus_run >= keep
        ranks_done = (
            ranks_done or e.attempt != last.attempt or all(c >= keep for c in counts.values())
        )
        if gpus_done and ranks_done:
            break  # this record and all before it are pushed out or reset away
        out[k] = e
        gpus_run += 1
        for r in e.ranks:
            if r.local_rank in counts:
                counts[r.local_rank] += 1
    return out


def recent_snapshot(timeline: Timeline, n: int, keep: int = HISTORY) -> Snapshot:
    """The state after the first ``n`` events as the dashboard shows it, with the telemetry
    records older than the histories' window skipped (exact but for ``telemetry.totals``)."""
    with timeline._lock:
        n = max(0, min(n, len(timeline)))
        j = bisect.bisect_left(timeline.states, n)  # state events among the first n
        kept = window(timeline, j, keep)
        kinds = timeline._state_kind
        snap = Snapshot()
        skipped = 0
        for k in range(j):
            if kinds[k] == TELEMETRY and k not in kept:
                skipped += 1
                continue
            e = kept[k] if k in kept else _parse(timeline, k)
            if e is not None:
                snap = reduce(snap, e)
    return replace(snap, version=snap.version + skipped, events=snap.events + skipped)
