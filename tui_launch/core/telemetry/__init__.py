"""GPU and process telemetry: NVML (nvidia-ml-py) and psutil, mapped to ranks.

One module per concern:

- ``nvml``: :class:`GpuSampler` and :func:`load_nvml`: one ``nvmlInit``, every GPU's
  readings; every failure is a state, never an exception.
- ``procs``: :class:`ProcessSampler`: each rank's process tree, CPU %, RSS, threads and
  state, from ``/proc`` (psutil where there is none).
- ``mapping``: which rank is on which GPU (by pid, or inferred from ``LOCAL_RANK`` and
  ``CUDA_VISIBLE_DEVICES`` in containers), as pure functions.
- ``sampler``: :class:`Telemetry`, the ``tuilaunch-telemetry`` thread that ticks them all and
  posts :class:`~tui_launch.core.model.events.TelemetrySample` events to the store.
- ``fake_nvml``: a fake ``pynvml`` with the real module's surface, for machines without a GPU
  (tests, snapshots, ``--demo``); ``fake_nvml_types``: the constants, error classes and
  structures it re-exports, as nvidia-ml-py has them.

The store's view of the samples (:class:`TelemetryView`, :func:`fold`) lives in
:mod:`tui_launch.core.model.telemetry`, below this package, so that the store never imports it.
None of these modules imports NVML or psutil at import time: a sampler loads them when it opens.
"""

from __future__ import annotations

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
