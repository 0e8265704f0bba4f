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

import ctypes
import math
import string
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

SIMULATED = True
ENV = "TUILAUNCH_FAKE_NVML"
PID_OFFSET = 5_000_000  # above Linux's largest pid_max (2**22): never a pid of ours
GIB = 1 << 30
MIB = 1 << 20

# ----------------------------------------------------------------- constants (as nvidia-ml-py)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1


class NVMLError(Exception):
    """As nvidia-ml-py: ``NVMLError(code)`` returns an instance of the code's subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = Exception.__hash__


def _make_error_classes() -> None:
    # The same names as nvidia-ml-py's: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        words = string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = getattr(module, name)

        def new(cls: type, *args: Any, _v: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _v)

        cls = type(f"NVMLError_{words}", (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, cls.__name__, cls)
        NVMLError._valClassMapping[value] = cls


_make_error_classes()
# Spelled out for type checkers and readers; _make_error_classes made them.
NVMLError_Uninitialized: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_UNINITIALIZED]
NVMLError_NotSupported: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NOT_SUPPORTED]
NVMLError_NoPermission: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NO_PERMISSION]
NVMLError_NotFound: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_NOT_FOUND]
NVMLError_LibraryNotFound: type[NVMLError] = NVMLError._valClassMapping[
    NVML_ERROR_LIBRARY_NOT_FOUND
]
NVMLError_DriverNotLoaded: type[NVMLError] = NVMLError._valClassMapping[
    NVML_ERROR_DRIVER_NOT_LOADED
]
NVMLError_GpuIsLost: type[NVMLError] = NVMLError._valClassMapping[NVML_ERROR_GPU_IS_LOST]


def nvmlErrorString(result: int) -> str:
    """The error's text, as the real library gives it."""
    return NVMLError._errcode_to_string.get(result, "Unknown Error")


# ----------------------------------------------------------------- structures (as nvidia-ml-py)


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class c_nvmlProcessUtilizationSample_t(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class nvmlFriendlyObject:
    """What nvidia-ml-py returns for process-list entries: the struct's fields as attributes."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for k, v in dictionary.items():
            setattr(self, k, v)

    def __str__(self) -> str:
        return str(self.__dict__)


@dataclass(frozen=True)
class c_nvmlDevice_t:
    """A device handle (the real one is an opaque pointer)."""

    index: int
    mig: int | None = None


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
