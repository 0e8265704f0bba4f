"""Telemetry: per-GPU and per-rank readings, their samples and end totals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tui_launch.core.model.events.base import Event, register
from tui_launch.core.model.words import Word


class GpuState(Word):
    """The GPU sampler's state (``TelemetrySample.gpu_state``) and one GPU's
    (``GpuReading.state``: ``ok`` or ``lost``).

    The events keep the field a ``str``: a journal read back holds the plain word, which
    compares and hashes as its member.
    """

    OK = "ok"
    OFF = "off"  # --no-gpu
    NO_LIBRARY = "no-library"
    NO_DRIVER = "no-driver"
    NO_DEVICES = "no-devices"
    PERMISSION = "permission"
    LOST = "lost"  # NVML failed mid-run (a GPU: NVML said it is lost; no longer queried)
    ERROR = "error"


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one sampler tick. None means not available (not supported, no permission).

    ``state`` is ``ok`` or ``lost`` (NVML said the GPU is lost; it is no longer queried).
    Memory is in bytes, power in watts, temperature in degrees Celsius.
    """

    index: int
    name: str
    uuid: str
    util: int | None
    mem_used: int | None
    mem_total: int | None
    temp: int | None = None
    power: float | None = None
    power_limit: float | None = None
    state: str = GpuState.OK


@dataclass(frozen=True)
class RankReading:
    """One local rank's process tree at one sampler tick.

    ``cpu`` is percent of one core, summed over the tree (data-loader workers included); ``rss``
    bytes summed over the tree; ``status`` is the rank process's psutil status (running,
    sleeping, disk-sleep, stopped, zombie, ...); ``d_state`` counts processes of the tree in
    uninterruptible disk sleep. ``mapping`` says how ``gpus`` were found: ``pid`` (the tree's
    pids are in NVML's process lists; ``gpu_mem``/``gpu_util`` are the tree's own), ``inferred``
    (from LOCAL_RANK and CUDA_VISIBLE_DEVICES; the figures are the whole device's) or None.
    """

    local_rank: int
    global_rank: int
    pid: int
    cpu: float | None
    rss: int | None
    threads: int | None
    status: str | None
    procs: int = 1
    d_state: int = 0
    gpus: tuple[int, ...] = ()
    mapping: str | None = None
    gpu_mem: int | None = None
    gpu_util: int | None = None


@dataclass(frozen=True)
class TelemetrySample(Event):
    """A sampler tick: every rank's process tree and every GPU (a sample: not journaled).

    ``gpu_state`` is ``ok``, ``off`` (``--no-gpu``), ``no-library``, ``no-driver``,
    ``no-devices``, ``permission``, ``lost`` (NVML failed mid-run) or ``error``; ``gpu_note``
    says it in words. ``simulated`` is True when the readings come from the fake NVML.
    """

    kind: ClassVar[str] = "telemetry_sample"
    journaled: ClassVar[bool] = False
    attempt: int
    gpu_state: str
    gpu_note: str
    gpus: tuple[GpuReading, ...]
    ranks: tuple[RankReading, ...]
    simulated: bool = False


@dataclass(frozen=True)
class TelemetryRecord(TelemetrySample):
    """The same reading, at the journal's low rate (every 10 s by default)."""

    kind: ClassVar[str] = "telemetry"
    journaled: ClassVar[bool] = True


@dataclass(frozen=True)
class RankTotals:
    """One rank of one attempt over the whole run, for the end summary."""

    attempt: int
    local_rank: int
    global_rank: int
    samples: int = 0
    peak_rss: int | None = None
    cpu_sum: float = 0.0
    cpu_n: int = 0
    peak_gpu_mem: int | None = None
    gpu_util_sum: float = 0.0
    gpu_util_n: int = 0
    mapping: str | None = None

    @property
    def mean_cpu(self) -> float | None:
        """Mean CPU % over the samples that had one."""
        return self.cpu_sum / self.cpu_n if self.cpu_n else None

    @property
    def mean_gpu_util(self) -> float | None:
        """Mean GPU utilisation % over the samples that had one."""
        return self.gpu_util_sum / self.gpu_util_n if self.gpu_util_n else None


@dataclass(frozen=True)
class TelemetryTotals(Event):
    """The sampler stopped: per-rank totals over every sample, live ones included, so that a
    replayed journal (which holds only every 10 s's sample) gives the same end summary."""

    kind: ClassVar[str] = "telemetry_totals"
    totals: tuple[RankTotals, ...]


register(TelemetryTotals, nested={"totals": RankTotals})
register(TelemetrySample, TelemetryRecord, nested={"gpus": GpuReading, "ranks": RankReading})
