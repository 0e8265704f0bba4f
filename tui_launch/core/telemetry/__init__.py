"""GPU and process telemetry: NVML (nvidia-ml-py) and psutil, mapped to ranks.

The package follows nvitop's split, one module per concern:

- :mod:`~tui_launch.core.telemetry.nvml`: :class:`GpuSampler` and :func:`load_nvml`: one
  ``nvmlInit``, every GPU's readings; every failure is a state, never an exception.
- :mod:`~tui_launch.core.telemetry.procs`: :class:`ProcessSampler`: each rank's process tree,
  CPU %, RSS, threads and state, from ``/proc`` (psutil where there is none).
- :mod:`~tui_launch.core.telemetry.mapping`: which rank is on which GPU (by pid, or inferred
  from ``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES`` in containers), as pure functions.
- :mod:`~tui_launch.core.telemetry.sampler`: :class:`Telemetry`, the thread that ticks them
  all and posts :class:`~tui_launch.core.model.events.TelemetrySample` events to the store.
- The store's view of the samples (:class:`TelemetryView`, :func:`fold`) lives outside the
  package, in :mod:`tui_launch.core.model.telemetry`, so that the store never imports this one.

This ``__init__`` imports nothing itself: the names below are loaded on first use (PEP 562), so
``from tui_launch.core.telemetry import Telemetry, RankTarget`` works and importing the package
costs nothing until then.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tui_launch.core.model.telemetry import HISTORY, TelemetryView, fold
    from tui_launch.core.telemetry.mapping import RankTarget, map_rank, visible_device
    from tui_launch.core.telemetry.nvml import (
        FAKE_ENV,
        GPU_ERROR,
        GPU_LOST,
        GPU_NO_DEVICES,
        GPU_NO_DRIVER,
        GPU_NO_LIBRARY,
        GPU_OFF,
        GPU_OK,
        GPU_PERMISSION,
        GpuSampler,
        fake_from_env,
        load_nvml,
    )
    from tui_launch.core.telemetry.procs import ProcessSampler, TreeReading
    from tui_launch.core.telemetry.sampler import Telemetry

_WHERE = {
    **dict.fromkeys(("RankTarget", "map_rank", "visible_device"), "telemetry.mapping"),
    **dict.fromkeys(
        (
            "FAKE_ENV",
            "GPU_ERROR",
            "GPU_LOST",
            "GPU_NO_DEVICES",
            "GPU_NO_DRIVER",
            "GPU_NO_LIBRARY",
            "GPU_OFF",
            "GPU_OK",
            "GPU_PERMISSION",
            "GpuSampler",
            "fake_from_env",
            "load_nvml",
        ),
        "telemetry.nvml",
    ),
    **dict.fromkeys(("ProcessSampler", "TreeReading"), "telemetry.procs"),
    "Telemetry": "telemetry.sampler",
    **dict.fromkeys(("HISTORY", "TelemetryView", "fold"), "model.telemetry"),
}


def __getattr__(name: str) -> Any:
    """Load ``name`` from the module that owns it, on first use."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tui_launch.core.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "FAKE_ENV",
    "GPU_ERROR",
    "GPU_LOST",
    "GPU_NO_DEVICES",
    "GPU_NO_DRIVER",
    "GPU_NO_LIBRARY",
    "GPU_OFF",
    "GPU_OK",
    "GPU_PERMISSION",
    "HISTORY",
    "GpuSampler",
    "ProcessSampler",
    "RankTarget",
    "Telemetry",
    "TelemetryView",
    "TreeReading",
    "fake_from_env",
    "fold",
    "load_nvml",
    "map_rank",
    "visible_device",
]
