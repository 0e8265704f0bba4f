"""Reducers of the telemetry events: the sampler's readings and the run's totals."""

from __future__ import annotations

from dataclasses import replace

from tui_launch.core.model.events import TelemetrySample, TelemetryTotals
from tui_launch.core.model.reducers.base import reduces
from tui_launch.core.model.snapshot import Snapshot
from tui_launch.core.model.telemetry import fold


@reduces(TelemetrySample)  # and TelemetryRecord, its journaled twin
def _sample(s: Snapshot, e: TelemetrySample) -> Snapshot:
    return replace(s, telemetry=fold(s.telemetry, e))


@reduces(TelemetryTotals)
def _totals(s: Snapshot, e: TelemetryTotals) -> Snapshot:
    if s.telemetry is None:
        return s
    return replace(s, telemetry=replace(s.telemetry, totals=e.totals))
