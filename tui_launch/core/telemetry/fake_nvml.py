"""A fake ``pynvml`` (nvidia-ml-py) for machines without a GPU: tests, snapshots and ``--demo``.

It has the real module's surface for everything tuilaunch calls: the same function names and
arguments, return values shaped like nvidia-ml-py's (ctypes structures with the same fields, or
the friendly objects nvidia-ml-py builds for process lists), the ``NVMLError`` hierarchy built the
same way (``NVMLError(NVML_ERROR_NOT_SUPPORTED)`` is an ``NVMLError_NotSupported``) and the
constants. What it reports is configured with :func:`configure`, or from a scenario string
(:func:`configure_from_spec`), which is how the launcher opens it: the scenario is the caller's
choice (``--demo``'s) or the ``TUILAUNCH_FAKE_NVML`` test hook's, decided in
:func:`tui_launch.core.telemetry.nvml.load_nvml` (this module reads no environment variable
to choose itself).

Readings are deterministic: they depend on the GPU index and on how many times that GPU's
utilisation was read (one per sampler tick), never on the clock.

Scenarios (comma separated, as ``TUILAUNCH_FAKE_NVML`` takes them):

- ``N`` — N GPUs (0 gives "no devices"); default 1.
- ``nolib`` — ``nvmlInit`` raises ``NVMLError_LibraryNotFound``.
- ``nodriver`` / ``noperm`` — ``nvmlInit`` raises ``DriverNotLoaded`` / ``NoPermission``.
- ``mismatch`` — process lists hold pids from another PID namespace (the real pid plus
  :data:`PID_OFFSET`), as in a container; use GPU UUIDs in ``CUDA_VISIBLE_DEVICES``.
- ``lost`` or ``lost=K`` — every GPU is lost (``NVMLError_GpuIsLost``) after K ticks (default 3).
- ``notsupported`` — temperature, power and per-process utilisation raise ``NotSupported``.
- ``procperm`` — process lists raise ``NoPermission``.
- ``mig`` — each GPU has MIG enabled with two MIG devices (``MIG-...`` UUIDs).

Without explicit processes (:func:`set_processes`), the fake finds the launcher's worker
processes itself (descendants of this process with ``LOCAL_RANK`` in their environment, as
:func:`tui_launch.core.workers.env.environ` reads it: a warm-start spare's is the one it was
handed) and
puts each on GPU ``LOCAL_RANK % N``, as a training script that calls
``torch.cuda.set_device(local_rank)`` would be.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

# nvidia-ml-py's constants, error classes and structures, as the real module has them.
from tui_launch.core.telemetry.fake_nvml_types import *  # noqa: F403
from tui_launch.core.telemetry.fake_nvml_types import (  # named: used here
    NVML_DEVICE_MIG_DISABLE,
    NVML_DEVICE_MIG_ENABLE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVMLError,
    c_nvmlDevice_t,
    c_nvmlMemory_t,
    c_nvmlProcessUtilizationSample_t,
    c_nvmlUtilization_t,
    nvmlFriendlyObject,
)

SIMULATED = True
ENV = "TUILAUNCH_FAKE_NVML"
PID_OFFSET = 5_000_000  # above Linux's largest pid_max (2**22): never a pid of ours
GIB = 1 << 30
MIB = 1 << 20

# ----------------------------------------------------------------- configuration


def gpu_uuid(index: int) -> str:
    """The fake UUID of GPU ``index`` (real ones look the same: GPU-8-4-4-4-12 hex digits)."""
    return f"GPU-{0xFA4E0000 + index:08x}-0000-4000-8000-{index:012x}"


def mig_uuid(index: int, mig: int) -> str:
    """The fake UUID of MIG device ``mig`` on GPU ``index``."""
    return f"MIG-{0xFA4E0000 + index:08x}-{mig:04x}-4000-8000-{index:012x}"


@dataclass
class FakeGpu:
    """One simulated GPU."""

    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    mem_total: int = 80 * GIB
    power_limit_mw: int = 700_000
    ticks: int = 0

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = gpu_uuid(self.index)


@dataclass
class FakeConfig:
    """What the fake reports. ``processes`` maps a GPU index to ``(pid, bytes)`` entries;
    None means: find the launcher's workers (see the module docstring)."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None
    pid_offset: int = 0
    lose_after: int | None = None
    lost_gpus: set[int] | None = None  # None with lose_after: every GPU
    unsupported: set[str] = field(default_factory=set)
    proc_error: int | None = None
    mig: bool = False
    processes: dict[int, list[tuple[int, int]]] | None = None


_lock = threading.Lock()
_config = FakeConfig(gpus=[FakeGpu(0)])
_initialized = 0
_discovered: tuple[float, dict[int, list[tuple[int, int]]]] = (0.0, {})
calls: dict[str, int] = {}
"""How many times each NVML function was called (the bench counts a tick's calls)."""

SLOW_FIELDS = {"nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"}


def configure(
    gpus: int = 1,
    *,
    init_error: int | None = None,
    pid_offset: int = 0,
    lose_after: int | None = None,
    lost_gpus: set[int] | None = None,
    unsupported: set[str] | None = None,
    proc_error: int | None = None,
    mig: bool = False,
    processes: dict[int, list[tuple[int, int]]] | None = None,
) -> FakeConfig:
    """Reset the fake to a scenario (see the module docstring) and return its configuration."""
    global _config, _initialized, _discovered
    with _lock:
        _config = FakeConfig(
            gpus=[FakeGpu(i) for i in range(gpus)],
            init_error=init_error,
            pid_offset=pid_offset,
            lose_after=lose_after,
            lost_gpus=lost_gpus,
            unsupported=set(unsupported or ()),
            proc_error=proc_error,
            mig=mig,
            processes=processes,
        )
        _initialized = 0
        _discovered = (0.0, {})
        calls.clear()
        return _config


def set_processes(processes: dict[int, list[tuple[int, int]]] | None) -> None:
    """Put ``(pid, bytes)`` processes on GPUs (None: find the launcher's workers)."""
    with _lock:
        _config.processes = processes


def configure_from_spec(spec: str) -> FakeConfig:
    """Configure from a ``TUILAUNCH_FAKE_NVML`` value such as ``8,mismatch`` or ``1,lost=2``."""
    n = 1
    kw: dict[str, Any] = {}
    for raw in spec.split(","):
        token = raw.strip().lower()
        if not token:
            continue
        name, _, value = token.partition("=")
        if name.isdigit():
            n = int(name)
        elif name == "nolib":
            kw["init_error"] = NVML_ERROR_LIBRARY_NOT_FOUND
        elif name == "nodriver":
            kw["init_error"] = NVML_ERROR_DRIVER_NOT_LOADED
        elif name == "noperm":
            kw["init_error"] = NVML_ERROR_NO_PERMISSION
        elif name == "mismatch":
            kw["pid_offset"] = PID_OFFSET
        elif name == "lost":
            kw["lose_after"] = int(value) if value.isdigit() else 3
        elif name == "notsupported":
            kw["unsupported"] = {*SLOW_FIELDS, "nvmlDeviceGetProcessUtilization"}
        elif name == "procperm":
            kw["proc_error"] = NVML_ERROR_NO_PERMISSION
        elif name == "mig":
            kw["mig"] = True
        else:
            raise ValueError(f"{ENV}: unknown scenario {raw!r}")
    return configure(n, **kw)


# ----------------------------------------------------------------- helpers


def _count(name: str) -> None:
    calls[name] = calls.get(name, 0) + 1


def _check_init() -> None:
    if not _initialized:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _gpu(handle: c_nvmlDevice_t, name: str) -> FakeGpu:
    _count(name)
    _check_init()
    cfg = _config
    if not isinstance(handle, c_nvmlDevice_t) or not 0 <= handle.index < len(cfg.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    gpu = cfg.gpus[handle.index]
    doomed = cfg.lost_gpus is None or gpu.index in cfg.lost_gpus
    if cfg.lose_after is not None and doomed and gpu.ticks >= cfg.lose_after:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    if name in cfg.unsupported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu


def _util(gpu: FakeGpu) -> int:
    # A slow wave per GPU, phase-shifted so that the GPUs differ.
    return max(0, min(100, round(55 + 40 * math.sin(0.45 * gpu.ticks + 0.9 * gpu.index))))


def _processes(gpu: FakeGpu) -> list[tuple[int, int]]:
    cfg = _config
    if cfg.processes is not None:
        return cfg.processes.get(gpu.index, [])
    return _discover().get(gpu.index, [])


def _discover() -> dict[int, list[tuple[int, int]]]:
    """This process's workers (descendants with LOCAL_RANK), each on GPU LOCAL_RANK % N."""
    global _discovered
    now = time.monotonic()
    if now - _discovered[0] < 1.0:
        return _discovered[1]
    found: dict[int, list[tuple[int, int]]] = {}
    n = len(_config.gpus)
    if n:
        try:
            import psutil

            for p in psutil.Process().children(recursive=True):
                lr = _local_rank(p.pid)
                if lr is None or not lr.isdigit():
                    continue
                # Only the rank's own process holds a CUDA context (not its children).
                if _local_rank(_ppid(p)) == lr:
                    continue
                found.setdefault(int(lr) % n, []).append((p.pid, (6 + 2 * int(lr)) * GIB))
        except Exception:
            found = {}
    _discovered = (now, found)
    return found


def _local_rank(pid: int | None) -> str | None:
    """``LOCAL_RANK`` of the environment process ``pid`` runs with: its start environment, or
    for a ``--warm-start`` spare the one it was handed (which ``/proc`` does not show)."""
    if pid is None:
        return None
    from tui_launch.core.workers import env as workerenv

    try:
        return workerenv.environ(pid).get("LOCAL_RANK")
    except (OSError, ValueError):
        return None


def _ppid(p: Any) -> int | None:
    try:
        return int(p.ppid())
    except Exception:
        return None


# ----------------------------------------------------------------- the NVML functions


def nvmlInitWithFlags(flags: int) -> None:
    """Start the library (or fail as configured: no library, no driver, no permission)."""
    global _initialized
    _count("nvmlInit")
    if _config.init_error is not None:
        raise NVMLError(_config.init_error)
    with _lock:
        _initialized += 1


def nvmlInit() -> None:
    """As ``nvmlInitWithFlags(0)``."""
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    """Balance one :func:`nvmlInit`."""
    global _initialized
    _count("nvmlShutdown")
    _check_init()
    with _lock:
        _initialized -= 1


def nvmlSystemGetDriverVersion() -> str:
    """A made-up driver version."""
    _check_init()
    return "570.00.fake"


def nvmlDeviceGetCount() -> int:
    """How many GPUs the fake has."""
    _count("nvmlDeviceGetCount")
    _check_init()
    return len(_config.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    """The handle of GPU ``index``."""
    _count("nvmlDeviceGetHandleByIndex")
    _check_init()
    if not 0 <= index < len(_config.gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(index)


def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int:
    """The GPU's index."""
    return _gpu(handle, "nvmlDeviceGetIndex").index


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    """The product name (str, as nvidia-ml-py returns on Python 3)."""
    return _gpu(handle, "nvmlDeviceGetName").name


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    """The GPU's UUID, or the MIG device's for a MIG handle."""
    gpu = _gpu(handle, "nvmlDeviceGetUUID")
    return gpu.uuid if handle.mig is None else mig_uuid(gpu.index, handle.mig)


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:
    """GPU and memory-controller utilisation (%). Each call is one tick of this GPU."""
    gpu = _gpu(handle, "nvmlDeviceGetUtilizationRates")
    gpu.ticks += 1
    u = _util(gpu)
    return c_nvmlUtilization_t(gpu=u, memory=u // 2)


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version: int | None = None) -> c_nvmlMemory_t:
    """Total, free and used memory in bytes (used: the processes' own plus a context's)."""
    gpu = _gpu(handle, "nvmlDeviceGetMemoryInfo")
    used = 512 * MIB + sum(m for _, m in _processes(gpu))
    used = min(used, gpu.mem_total)
    return c_nvmlMemory_t(total=gpu.mem_total, free=gpu.mem_total - used, used=used)


def nvmlDeviceGetTemperature(handle: c_nvmlDevice_t, sensor: int) -> int:
    """Degrees Celsius."""
    gpu = _gpu(handle, "nvmlDeviceGetTemperature")
    return 38 + _util(gpu) // 3


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:
    """Milliwatts."""
    gpu = _gpu(handle, "nvmlDeviceGetPowerUsage")
    return 90_000 + _util(gpu) * 5_500


def nvmlDeviceGetEnforcedPowerLimit(handle: c_nvmlDevice_t) -> int:
    """Milliwatts."""
    return _gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw


def nvmlDeviceGetPowerManagementLimit(handle: c_nvmlDevice_t) -> int:
    """Milliwatts."""
    return _gpu(handle, "nvmlDeviceGetPowerManagementLimit").power_limit_mw


def nvmlDeviceGetComputeRunningProcesses(handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]:
    """The compute processes on the GPU: pid (in the host's namespace) and memory in bytes."""
    gpu = _gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
    if _config.proc_error is not None:
        raise NVMLError(_config.proc_error)
    off = _config.pid_offset
    return [
        nvmlFriendlyObject(
            {"pid": pid + off, "usedGpuMemory": mem, "gpuInstanceId": 0, "computeInstanceId": 0}
        )
        for pid, mem in _processes(gpu)
    ]


def nvmlDeviceGetProcessUtilization(
    handle: c_nvmlDevice_t, timeStamp: int
) -> list[c_nvmlProcessUtilizationSample_t]:
    """Per-process SM utilisation samples newer than ``timeStamp`` (µs); ``NotFound`` if none."""
    gpu = _gpu(handle, "nvmlDeviceGetProcessUtilization")
    procs = _processes(gpu)
    stamp = gpu.ticks * 1_000_000
    if not procs or stamp <= timeStamp:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    share = _util(gpu) // len(procs)
    off = _config.pid_offset
    return [
        c_nvmlProcessUtilizationSample_t(
            pid=pid + off, timeStamp=stamp, smUtil=share, memUtil=share // 2, encUtil=0, decUtil=0
        )
        for pid, _ in procs
    ]


def nvmlDeviceGetMigMode(device: c_nvmlDevice_t) -> list[int]:
    """``[current, pending]`` MIG mode."""
    _gpu(device, "nvmlDeviceGetMigMode")
    mode = NVML_DEVICE_MIG_ENABLE if _config.mig else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(device: c_nvmlDevice_t) -> int:
    """How many MIG devices the GPU can have."""
    _gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
    return 7 if _config.mig else 0


def nvmlDeviceGetMigDeviceHandleByIndex(device: c_nvmlDevice_t, index: int) -> c_nvmlDevice_t:
    """The device of MIG device ``index`` (two exist per GPU with ``mig``)."""
    _gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
    if not _config.mig or index >= 2:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return c_nvmlDevice_t(device.index, mig=index)
