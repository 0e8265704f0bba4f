"""Prometheus metrics of a run: ``--metrics-port`` and ``--metrics-textfile``.

Beside the front ends: it reads the store's snapshots as they do, never a runner.

- ``families``: every family, built from one store snapshot, on a custom
  ``prometheus_client`` registry (:class:`RunCollector`), and the hook for extra families
  (:data:`ExtraProvider`).
- ``progress``: training progress, suspected hangs and collectives as families.
- ``common``: the per-rank labels and the gauge every family module builds.
- ``serve``: :class:`MetricsServer` (``GET /metrics``) and :class:`TextfileWriter`
  (``tuilaunch_<run-id>_<node>.prom`` for node_exporter).
- ``node``: the ``node`` label (host name, or ``<host>/<group rank>`` when agents of the run
  share a host).
- ``exporters``: :func:`start_exporters`, the one call the launch makes.

docs/metrics.md lists the metrics, a scrape config and alert rules.

The one package ``__init__`` that is more than re-exports: it loads neither prometheus_client
nor the submodules until a name is used (PEP 562), because every launch imports it and a run
without the options must pay nothing for them, and listen on nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tui_launch.metrics.families import (
        EventTally,
        ExtraProvider,
        RunCollector,
        RunInfo,
        build_families,
        exit_reason,
        last_output_times,
        run_info,
    )
    from tui_launch.metrics.progress import (
        HANG_SUSPECTED,
        PROGRESS_LAST_STEP,
        PROGRESS_STEP,
        PROGRESS_STEPS_PER_SECOND,
        RankProgress,
        hang_families,
        progress_families,
    )
    from tui_launch.metrics.serve import (
        TEXTFILE_INTERVAL,
        MetricsServer,
        TextfileWriter,
        textfile_name,
        write_atomically,
    )


_LAZY = {
    "families": (
        "EventTally",
        "ExtraProvider",
        "RunCollector",
        "RunInfo",
        "build_families",
        "exit_reason",
        "last_output_times",
        "run_info",
    ),
    "progress": (
        "HANG_SUSPECTED",
        "PROGRESS_LAST_STEP",
        "PROGRESS_STEP",
        "PROGRESS_STEPS_PER_SECOND",
        "RankProgress",
        "hang_families",
        "progress_families",
    ),
    "exporters": ("Exporters", "start_exporters"),
    "serve": (
        "MetricsError",
        "TEXTFILE_INTERVAL",
        "MetricsServer",
        "TextfileWriter",
        "textfile_name",
        "write_atomically",
    ),
}
_WHERE = {name: mod for mod, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)


__all__ = [
    "HANG_SUSPECTED",
    "PROGRESS_LAST_STEP",
    "PROGRESS_STEP",
    "PROGRESS_STEPS_PER_SECOND",
    "TEXTFILE_INTERVAL",
    "EventTally",
    "Exporters",
    "ExtraProvider",
    "MetricsError",
    "MetricsServer",
    "RankProgress",
    "RunCollector",
    "RunInfo",
    "TextfileWriter",
    "build_families",
    "exit_reason",
    "hang_families",
    "last_output_times",
    "progress_families",
    "run_info",
    "start_exporters",
    "textfile_name",
    "write_atomically",
]
