"""NVML: the GPUs' readings through nvidia-ml-py (``pynvml``), or the fake NVML in tests.

One :class:`GpuSampler` owns one ``nvmlInit`` for its whole life. Once open, it reads what does
not change (names, UUIDs, memory totals, power limits, MIG devices' UUIDs), then every tick
each GPU's utilisation and memory, NVML's compute processes (their memory and SM utilisation),
and every ``slow_every`` ticks temperature and power.

Failure is a state, never an exception into the UI (nvitop's ``NA``): no nvidia-ml-py, no
libnvidia-ml, no driver, no devices, no permission, a field that is not supported (then not
asked again), a GPU lost or NVML gone mid-run — each ends up in :attr:`GpuSampler.state` and
:attr:`GpuSampler.note` (one of the ``GPU_*`` values below) and sampling goes on.

Which NVML, the real one or the fake (:mod:`tui_launch.core.telemetry.fake_nvml`, whose
readings are marked ``simulated``), is decided in one place, :func:`load_nvml`, by its caller:

- ``load_nvml(fake=None)`` is nvidia-ml-py; ``load_nvml(fake="2")`` the fake with that scenario.
- The caller that builds the sampler says which (``GpuSampler(fake=...)``,
  ``Telemetry(fake_nvml=...)``): the product's only choice of the fake is ``--demo``, which
  trains on CPU and shows simulated GPUs on purpose.
- :func:`fake_from_env` is the hook for tests (and for trying the dashboard without a GPU):
  ``TUILAUNCH_FAKE_NVML`` set to a scenario overrides the caller's choice. It is the only
  place that reads the variable, and the sampler consults it when it opens, so a test's
  launcher in another process is run against the fake without code of its own.

Importing this module does not import ``pynvml``: :func:`load_nvml` does, when a sampler opens.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.model.events import GpuReading, GpuState

FAKE_ENV = "TUILAUNCH_FAKE_NVML"

# gpu_state values (the model's vocabulary, by the names the samplers use)
GPU_OK, GPU_OFF, GPU_NO_LIBRARY, GPU_NO_DRIVER = (
    GpuState.OK,
    GpuState.OFF,
    GpuState.NO_LIBRARY,
    GpuState.NO_DRIVER,
)
GPU_NO_DEVICES, GPU_PERMISSION, GPU_LOST, GPU_ERROR = (
    GpuState.NO_DEVICES,
    GpuState.PERMISSION,
    GpuState.LOST,
    GpuState.ERROR,
)

# NVML return codes (the same in every nvidia-ml-py release; the fake uses them too).
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND = 3, 4, 6
_FUNCTION_NOT_FOUND, _GPU_IS_LOST, _RESET_REQUIRED = 13, 15, 16
_GONE = {1, 9, 12, 18}  # uninitialized, driver not loaded, library not found, RM mismatch


class _GpuLost(Exception):
    pass


class _NvmlGone(Exception):
    pass


@dataclass
class _Gpu:
    index: int
    handle: Any
    name: str
    uuid: str
    mem_total: int | None
    power_limit: float | None
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    last_ts: int = 0
    temp: int | None = None
    power: float | None = None


@dataclass(frozen=True)
class ProcOnGpu:
    """One NVML compute process: which GPU, its memory (bytes) and SM utilisation (%)."""

    gpu: int
    mem: int | None
    sm: int | None


def fake_from_env(chosen: str | None = None) -> str | None:
    """The fake NVML's scenario to open: ``TUILAUNCH_FAKE_NVML``'s when it is set (the tests'
    hook), else ``chosen``, the caller's (None: the real NVML)."""
    return os.environ.get(FAKE_ENV, chosen)


def load_nvml(fake: str | None = None) -> tuple[Any | None, str]:
    """The NVML module, or None and why not.

    Args:
        fake: None for nvidia-ml-py (``pynvml``); else the fake NVML configured with this
            scenario (``"2"``, ``"1,lost=2"``: see
            :func:`~tui_launch.core.telemetry.fake_nvml.configure_from_spec`).
    """
    if fake is not None:
        from tui_launch.core.telemetry import fake_nvml as fake_pynvml

        try:
            fake_pynvml.configure_from_spec(fake)
        except ValueError as e:
            return None, str(e)
        return fake_pynvml, ""
    try:
        import pynvml
    except Exception:  # ImportError, or a broken install
        return None, "nvidia-ml-py (module pynvml) is not installed"
    return pynvml, ""


class GpuSampler:
    """Reads every GPU through NVML. Never raises: problems end up in :attr:`state`/:attr:`note`.

    Args:
        nvml: the ``pynvml`` module (or the fake, configured); default: :func:`load_nvml`'s
            when the sampler opens.
        slow_every: read temperature and power every this many ticks.
        fake: without ``nvml``, the fake NVML's scenario to open (the demo's simulated GPUs);
            None: the real NVML. :func:`fake_from_env` (the tests' hook) overrides it.
    """

    def __init__(
        self, nvml: Any | None = None, slow_every: int = 5, *, fake: str | None = None
    ) -> None:
        self._nvml = nvml
        self.fake = fake
        self.slow_every = max(1, slow_every)
        self.state: GpuState = GPU_ERROR
        self.note = "not started"
        self.simulated = False
        self.gpus: list[_Gpu] = []
        self.uuid_index: dict[str, int] = {}
        self.denied: set[str] = set()
        self._ticks = 0
        self._open = False

    def open(self) -> None:
        """``nvmlInit`` once and read what does not change (names, UUIDs, totals, MIG)."""
        nv = self._nvml
        if nv is None:
            nv, why = load_nvml(fake_from_env(self.fake))
            if nv is None:
                self.state, self.note = GPU_NO_LIBRARY, f"no GPU telemetry: {why}"
                return
            self._nvml = nv
        self.simulated = bool(getattr(nv, "SIMULATED", False))
        try:
            nv.nvmlInit()
        except Exception as e:
            code = getattr(e, "value", None)
            state, what = {
                12: (GPU_NO_LIBRARY, "NVML not found (no libnvidia-ml.so.1: no NVIDIA driver)"),
                9: (GPU_NO_DRIVER, "the NVIDIA driver is not loaded"),
                4: (GPU_PERMISSION, "no permission to use NVML"),
            }.get(code, (GPU_ERROR, f"NVML failed to start ({describe_error(e)})"))  # type: ignore[arg-type]
            self.state, self.note = state, f"no GPU telemetry: {what}"
            return
        self._open = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            for i in range(count):
                self.gpus.append(self._describe_gpu(i))
        except Exception as e:
            self.state, self.note = GPU_ERROR, f"no GPU telemetry: {describe_error(e)}"
            self.gpus = []
            return
        if not self.gpus:
            self.state, self.note = GPU_NO_DEVICES, "no GPUs: NVML sees no devices"
            return
        self.state = GPU_OK
        self.note = self._count_note()

    def _count_note(self) -> str:
        return f"{len(self.gpus)} GPU(s)" + (" (simulated: fake NVML)" if self.simulated else "")

    def _describe_gpu(self, i: int) -> _Gpu:
        nv: Any = self._nvml
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        g = _Gpu(index=i, handle=handle, name="?", uuid="", mem_total=None, power_limit=None)
        g.name = str(self._get(g, "nvmlDeviceGetName", handle) or "GPU")
        g.uuid = str(self._get(g, "nvmlDeviceGetUUID", handle) or "")
        mem = self._get(g, "nvmlDeviceGetMemoryInfo", handle)
        g.mem_total = int(mem.total) if mem is not None else None
        limit = self._get(g, "nvmlDeviceGetEnforcedPowerLimit", handle)
        g.power_limit = limit / 1000.0 if limit is not None else None
        if g.uuid:
            self.uuid_index[g.uuid] = i
        # MIG devices have their own UUIDs; CUDA_VISIBLE_DEVICES may name them.
        mode = self._get(g, "nvmlDeviceGetMigMode", handle)
        if mode and mode[0]:
            n = self._get(g, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
            for m in range(int(n)):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, m)
                    self.uuid_index[str(nv.nvmlDeviceGetUUID(mh))] = i
                except Exception:
                    continue  # an empty MIG slot
        return g

    def _get(self, g: _Gpu, fname: str, *args: Any) -> Any:
        """One NVML call; None when not available. Raises only _GpuLost / _NvmlGone."""
        if fname in g.unsupported:
            return None
        try:
            return getattr(self._nvml, fname)(*args)
        except Exception as e:
            code = getattr(e, "value", None)
            if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND) or isinstance(e, AttributeError):
                g.unsupported.add(fname)  # it will not start working: stop asking
            elif code == _NO_PERMISSION:
                self.denied.add(fname)
            elif code == _NOT_FOUND:
                return _NOTHING
            elif code in (_GPU_IS_LOST, _RESET_REQUIRED):
                raise _GpuLost(describe_error(e)) from None
            elif code in _GONE:
                raise _NvmlGone(describe_error(e)) from None
            return None

    def sample(self) -> tuple[tuple[GpuReading, ...], dict[int, list[ProcOnGpu]]]:
        """Read every GPU: readings in index order and NVML's compute processes by pid."""
        if self.state == GPU_LOST:
            return self._lost_readings(), {}
        if self.state != GPU_OK:
            return (), {}
        self._ticks += 1
        slow = (self._ticks - 1) % self.slow_every == 0
        readings: list[GpuReading] = []
        procs: dict[int, list[ProcOnGpu]] = {}
        try:
            for g in self.gpus:
                if g.lost:
                    readings.append(_lost(g))
                    continue
                try:
                    readings.append(self._sample_gpu(g, slow, procs))
                except _GpuLost:
                    g.lost = True
                    readings.append(_lost(g))
        except _NvmlGone as e:
            self.state, self.note = GPU_LOST, f"NVML lost mid-run ({e}): the job goes on"
            return self._lost_readings(), {}
        if all(g.lost for g in self.gpus):
            self.state = GPU_LOST
            self.note = "NVML lost mid-run (GPU is lost): the job goes on"
        else:
            lost = [str(g.index) for g in self.gpus if g.lost]
            note = self._count_note()
            if lost:
                note += f"; lost: GPU {', '.join(lost)}"
            if self.denied:
                note += "; no permission for " + ", ".join(sorted(_short(f) for f in self.denied))
            self.note = note
        return tuple(readings), procs

    def _lost_readings(self) -> tuple[GpuReading, ...]:
        return tuple(_lost(g) for g in self.gpus)

    def _sample_gpu(self, g: _Gpu, slow: bool, procs: dict[int, list[ProcOnGpu]]) -> GpuReading:
        h = g.handle
        util = self._get(g, "nvmlDeviceGetUtilizationRates", h)
        mem = self._get(g, "nvmlDeviceGetMemoryInfo", h)
        if slow:
            t = self._get(g, "nvmlDeviceGetTemperature", h, 0)  # NVML_TEMPERATURE_GPU
            g.temp = int(t) if isinstance(t, int) else None
            p = self._get(g, "nvmlDeviceGetPowerUsage", h)
            g.power = p / 1000.0 if isinstance(p, (int, float)) else None
        plist = self._get(g, "nvmlDeviceGetComputeRunningProcesses", h)
        sm: dict[int, int] | None = None
        if plist and plist is not _NOTHING:
            samples = self._get(g, "nvmlDeviceGetProcessUtilization", h, g.last_ts)
            if samples is _NOTHING:
                sm = {}  # no new samples since the last tick: nothing ran
            elif samples is not None:
                sm = {}
                newest: dict[int, int] = {}
                for s in samples:
                    ts = int(s.timeStamp)
                    if ts >= newest.get(int(s.pid), -1):
                        newest[int(s.pid)] = ts
                        sm[int(s.pid)] = int(s.smUtil)
                    g.last_ts = max(g.last_ts, ts)
            for p in plist:
                used = getattr(p, "usedGpuMemory", None)
                pid = int(p.pid)
                procs.setdefault(pid, []).append(
                    ProcOnGpu(
                        gpu=g.index,
                        mem=int(used) if used is not None else None,
                        sm=None if sm is None else sm.get(pid, 0),
                    )
                )
        return GpuReading(
            index=g.index,
            name=g.name,
            uuid=g.uuid,
            util=int(util.gpu) if util is not None and util is not _NOTHING else None,
            mem_used=int(mem.used) if mem is not None and mem is not _NOTHING else None,
            mem_total=g.mem_total,
            temp=g.temp,
            power=g.power,
            power_limit=g.power_limit,
        )

    def process_list_known(self, index: int) -> bool:
        """Whether NVML can list GPU ``index``'s processes (supported and permitted)."""
        g = self.gpus[index] if 0 <= index < len(self.gpus) else None
        name = "nvmlDeviceGetComputeRunningProcesses"
        return g is not None and name not in g.unsupported and name not in self.denied

    def close(self) -> None:
        """``nvmlShutdown`` (once, if ``open`` initialised NVML)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()  # type: ignore[union-attr]


_NOTHING = object()  # NVML said "not found": no data since the timestamp we gave


def _lost(g: _Gpu) -> GpuReading:
    return GpuReading(
        index=g.index,
        name=g.name,
        uuid=g.uuid,
        util=None,
        mem_used=None,
        mem_total=g.mem_total,
        power_limit=g.power_limit,
        state=GPU_LOST,
    )


def describe_error(e: BaseException) -> str:
    """An exception as one short line: its message, or its type's name when it has none."""
    text = str(e).strip()
    return text or type(e).__name__


def _short(fname: str) -> str:
    return {
        "nvmlDeviceGetComputeRunningProcesses": "process lists",
        "nvmlDeviceGetProcessUtilization": "process utilisation",
    }.get(fname, fname.replace("nvmlDeviceGet", ""))


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
    "GpuSampler",
    "ProcOnGpu",
    "describe_error",
    "fake_from_env",
    "load_nvml",
]
