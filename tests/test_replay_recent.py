"""An attach's first frame (``core/journal/recent.py``): the state at a long journal's end without
its old telemetry records is what the full reduce gives, but for the telemetry totals (which
no panel shows), and the exact state follows once the checkpoints are computed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from conftest import rich_text

from tui_launch.core.journal.recent import recent_snapshot
from tui_launch.core.journal.timeline import Timeline
from tui_launch.core.model.events import Event, LogMark, Restart, TelemetryRecord, to_dict
from tui_launch.core.model.store import Snapshot
from tui_launch.core.model.telemetry import HISTORY
from tui_launch.testing import builders
from tui_launch.tui.panels import ranks as render_ranks
from tui_launch.tui.sources.attach import AttachSource

NPROC = 4


def _template() -> TelemetryRecord:
    s = builders.telemetry(0, NPROC, 1000, 0.0, 1, gpus=NPROC)[0]
    return TelemetryRecord(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})


def _record(
    base: TelemetryRecord, i: int, attempt: int, gpus: int = NPROC, skip_rank: int | None = None
) -> TelemetryRecord:
    """Record ``i``: figures that differ from one record to the next (a history cut one
    value short, or one too long, shows), ``gpus`` GPUs, and every rank but ``skip_rank``."""
    ranks = tuple(
        dataclasses.replace(r, cpu=float((7 * i + 13 * r.local_rank) % 250), gpu_util=i % 97)
        for r in base.ranks
        if r.local_rank != skip_rank
    )
    readings = tuple(dataclasses.replace(g, util=(3 * i + g.index) % 101) for g in base.gpus[:gpus])
    return dataclasses.replace(
        base, attempt=attempt, ranks=ranks, gpus=readings, **builders.at(10.0 * i + 5)
    )


def _journal(path: Path, records: int = 190, first: int = 0) -> None:
    """A long journal: attempt 0 (records 0..149: GPU 3 gone from records 90..109, rank 2
    missing from records 120..125), a failure and a restart, attempt 1 (records 150 on), and a
    log mark after every record. ``first``: append, from record ``first`` on."""
    base = _template()
    events: list[Event] = []
    if first == 0:
        events += [
            builders.run_started(NPROC, max_restarts=3),
            *builders.attempt(0, NPROC, 0, 1000),
        ]
    for i in range(first, records):
        if i == 150:
            t = 10.0 * i
            events.append(builders.exited(0, 1, 1001, -9, at=t))
            events.append(builders.failed_attempt(0, t))
            events.append(
                Restart(
                    cause="failure",
                    from_attempt=0,
                    to_attempt=1,
                    restarts_used=1,
                    budget_left=2,
                    **builders.at(t + 0.3),
                )
            )
            events += builders.attempt(1, NPROC, t + 0.5, 1100)
        gpus = NPROC - 1 if 90 <= i < 110 else NPROC
        skip = 2 if 120 <= i <= 125 else None
        events.append(_record(base, i, 1 if i >= 150 else 0, gpus, skip))
        events.append(LogMark(offsets=((0, 0, "stdout", 80 * i),), **builders.at(10.0 * i + 6)))
    mode = "w" if first == 0 else "a"
    with open(path, mode) as fp:
        seq = sum(1 for _ in open(path)) if first else 0  # noqa: SIM115
        for e in events:
            if e.journaled:
                fp.write(json.dumps({"seq": seq, **to_dict(e)}, default=str) + "\n")
                seq += 1


def _text(renderable: object) -> str:
    return rich_text(renderable, width=160)


def _same_but_totals(fast: Snapshot, full: Snapshot) -> bool:
    if fast.telemetry is None or full.telemetry is None:
        return fast == full
    totals = dataclasses.replace(fast.telemetry, totals=full.telemetry.totals)
    return dataclasses.replace(fast, telemetry=totals) == full


def _cursor_after_record(tl: Timeline, i: int) -> int:
    """The cursor just after telemetry record ``i`` (the i-th of kind telemetry)."""
    return tl.indices(TelemetryRecord.kind)[i] + 1


def test_the_first_frame_is_the_full_reduce_but_for_totals(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _journal(path)
    tl = Timeline(str(path))
    full_tl = Timeline(str(path))
    cursors = {
        "end": len(tl),
        "end of attempt 0": _cursor_after_record(tl, 149),
        "10 records after GPU 3 went": _cursor_after_record(tl, 99),
        "10 records after GPU 3 came back": _cursor_after_record(tl, 119),
        "just after rank 2 came back": _cursor_after_record(tl, 127),
        "20 records into attempt 1": _cursor_after_record(tl, 169),
        # The ranks' histories start with attempt 1, the GPUs' go back 60 records into 0.
        "30 records into attempt 1": _cursor_after_record(tl, 179),
        "70 records in": _cursor_after_record(tl, 69),
    }
    for name, n in cursors.items():
        full = full_tl.snapshot(n)
        fast = recent_snapshot(tl, n)
        assert _same_but_totals(fast, full), name
        assert fast.telemetry is not None and full.telemetry is not None
        assert fast.telemetry.totals != full.telemetry.totals, f"{name}: nothing was skipped"
        # What the panels show: the GPU panel and every rank's cells (sparklines included).
        assert _text(render_ranks.gpu_panel(fast)) == _text(render_ranks.gpu_panel(full)), name
        for r in full.ranks:
            now = full_tl.mono[n - 1]
            cells = render_ranks.rank_cells(r, now, None, fast.telemetry, None, None)
            want = render_ranks.rank_cells(r, now, None, full.telemetry, None, None)
            assert [_text(c) for c in cells] == [_text(c) for c in want], (name, r.local_rank)
    # The window is no longer than it must be: one record fewer and the histories differ.
    n = cursors["end of attempt 0"]
    assert not _same_but_totals(recent_snapshot(tl, n, keep=HISTORY - 1), full_tl.snapshot(n))


def test_attach_shows_the_recent_state_then_the_exact_one(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _journal(path, records=160)
    tl = Timeline(str(path))
    src = AttachSource(tl)
    assert src.approx and not tl.ready(len(tl))  # the first frame computed no checkpoint
    assert _same_but_totals(src.snapshot(), Timeline(str(path)).snapshot(len(tl)))
    # The launcher appends: the frames that follow reduce the new events onto the first.
    _journal(path, records=190, first=160)
    src.follow()
    assert src.cursor == len(tl) and src.approx
    assert _same_but_totals(src.snapshot(), Timeline(str(path)).snapshot(len(tl)))
    # The background pass (replay's precompute) has reached the first frame: exact, totals too.
    tl.precompute()
    src.follow()
    assert not src.approx
    assert src.snapshot() == Timeline(str(path)).snapshot(len(tl))
