"""What every family module of :mod:`tui_launch.metrics` builds its gauges with."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily

# The labels of a per-rank family. Never a pid or an attempt: both change on every restart.
RANK = ("node", "rank", "local_rank")


def gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    """A gauge family with these label names."""
    return GaugeMetricFamily(name, doc, labels=list(labels))
