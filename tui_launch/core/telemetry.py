"""GPU and process telemetry: NVML (nvidia-ml-py) and psutil, mapped to ranks.

One background thread (``tuilaunch-telemetry``) ticks on a schedule that does not drift
(``--gpu-interval``, 1 s by default). Each tick reads every rank's process tree from ``/proc``
(psutil where there is none; :class:`ProcessSampler`) and every GPU with NVML
(:class:`GpuSampler`; temperature and power only every Nth tick), works out which rank is on
which GPU, and posts one compact :class:`~tui_launch.core.events.TelemetrySample` to the store;
every ``journal_every`` seconds the tick posts a
:class:`~tui_launch.core.events.TelemetryRecord` instead, which the journal keeps. :func:`fold`
turns samples into the store's :class:`TelemetryView` (latest readings, short histories for
sparklines, per-rank totals for the end summary).

Rank ↔ GPU: first by pid — the rank's pid and all its descendants against NVML's process lists
(a rank's GPU memory is the sum over its tree). When none of them is there and NVML lists pids
this process cannot see (another PID namespace: a container), or cannot list processes at all,
the GPU is inferred from ``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES`` (indices, GPU or MIG UUIDs,
read from the worker's own environment when possible) and the reading says ``inferred``; its
figures are then the whole device's.

Failure is a state, never an exception: no nvidia-ml-py, no libnvidia-ml, no driver, no
devices, no permission, a field that is not supported (then not asked again), a GPU lost or
NVML gone mid-run — each ends up in ``gpu_state``/``gpu_note`` and the job goes on.

The fake NVML (:mod:`tui_launch.testing.fake_pynvml`) is used instead of ``pynvml`` when
``TUILAUNCH_FAKE_NVML`` is set; its readings are marked ``simulated``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tui_launch.core.events import (
    Event,
    GpuReading,
    Notice,
    RankReading,
    RankTotals,
    TelemetryRecord,
    TelemetrySample,
    TelemetryTotals,
)

FAKE_ENV = "TUILAUNCH_FAKE_NVML"
HISTORY = 60  # samples kept per GPU and per rank for sparklines

# gpu_state values
GPU_OK, GPU_OFF, GPU_NO_LIBRARY, GPU_NO_DRIVER = "ok", "off", "no-library", "no-driver"
GPU_NO_DEVICES, GPU_PERMISSION, GPU_LOST, GPU_ERROR = "no-devices", "permission", "lost", "error"

# NVML return codes (the same in every nvidia-ml-py release; the fake uses them too).
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND = 3, 4, 6
_FUNCTION_NOT_FOUND, _GPU_IS_LOST, _RESET_REQUIRED = 13, 15, 16
_GONE = {1, 9, 12, 18}  # uninitialized, driver not loaded, library not found, RM mismatch


@dataclass(frozen=True)
class RankTarget:
    """A rank to watch: its pid and what the launcher knows of its GPU environment."""

    local_rank: int
    global_rank: int
    pid: int
    cuda_visible_devices: str | None = None


# ----------------------------------------------------------------- NVML


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


def load_nvml() -> tuple[Any | None, str]:
    """The NVML module to use (the fake with ``TUILAUNCH_FAKE_NVML``) or None and why not."""
    if os.environ.get(FAKE_ENV) is not None:
        from tui_launch.testing import fake_pynvml

        try:
            fake_pynvml.configure_from_env()
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
        nvml: the ``pynvml`` module (or the fake); default: :func:`load_nvml`.
        slow_every: read temperature and power every this many ticks.
    """

    def __init__(self, nvml: Any | None = None, slow_every: int = 5) -> None:
        self._nvml = nvml
        self.slow_every = max(1, slow_every)
        self.state = GPU_ERROR
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
            nv, why = load_nvml()
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
            }.get(code, (GPU_ERROR, f"NVML failed to start ({_describe(e)})"))  # type: ignore[arg-type]
            self.state, self.note = state, f"no GPU telemetry: {what}"
            return
        self._open = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            for i in range(count):
                self.gpus.append(self._describe_gpu(i))
        except Exception as e:
            self.state, self.note = GPU_ERROR, f"no GPU telemetry: {_describe(e)}"
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
                raise _GpuLost(_describe(e)) from None
            elif code in _GONE:
                raise _NvmlGone(_describe(e)) from None
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
        state="lost",
    )


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    return text or type(e).__name__


def _short(fname: str) -> str:
    return {
        "nvmlDeviceGetComputeRunningProcesses": "process lists",
        "nvmlDeviceGetProcessUtilization": "process utilisation",
    }.get(fname, fname.replace("nvmlDeviceGet", ""))


# ----------------------------------------------------------------- psutil


# Process states as psutil names them (``/proc/<pid>/stat``'s letters).
STATUS_ZOMBIE = "zombie"
STATUS_DISK_SLEEP = "disk-sleep"
_STATES = {
    b"R": "running",
    b"S": "sleeping",
    b"D": STATUS_DISK_SLEEP,
    b"Z": STATUS_ZOMBIE,
    b"T": "stopped",
    b"t": "tracing-stop",
    b"X": "dead",
    b"x": "dead",
    b"K": "wake-kill",
    b"W": "waking",
    b"P": "parked",
    b"I": "idle",
}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class TreeReading:
    """A rank's process tree at one tick."""

    pids: tuple[int, ...]
    cpu: float | None
    rss: int | None
    threads: int | None
    status: str | None
    d_state: int


class ProcessSampler:
    """Per rank CPU %, RSS, threads and state over the rank's whole process tree.

    Each process is one read of ``/proc/<pid>/stat`` (psutil, where there is no ``/proc``, reads
    three files for the same figures). Children are found each tick through
    ``/proc/<pid>/task/<pid>/children`` (cheap: one small read per process); every
    ``full_scan_every`` ticks a scan of every process's parent also catches children forked from
    other threads. RSS is summed over the tree, so pages shared between a rank and its forked
    data-loader workers count more than once, as in ``top``.
    """

    def __init__(self, full_scan_every: int = 10) -> None:
        import psutil

        self._psutil = psutil
        self.full_scan_every = max(1, full_scan_every)
        self._procs: dict[int, Any] = {}
        self._cpu: dict[int, tuple[float, float]] = {}
        self._ticks = 0
        self._children_file = True
        self._proc_stat = os.path.exists(f"/proc/{os.getpid()}/stat")

    def sample(self, pids: Iterable[int]) -> dict[int, TreeReading]:
        """Read each root pid's tree; a pid that is gone gives a reading of Nones."""
        self._ticks += 1
        roots = list(pids)
        ppid_map: dict[int, int] | None = None
        if not self._children_file or self._ticks % self.full_scan_every == 1:
            try:
                ppid_map = self._psutil._pslinux.ppid_map()  # one scan of /proc for all roots
            except Exception:
                ppid_map = None
        children_of: dict[int, list[int]] | None = None
        if ppid_map is not None:
            children_of = {}
            for child, parent in ppid_map.items():
                children_of.setdefault(parent, []).append(child)
        now = time.monotonic()
        out: dict[int, TreeReading] = {}
        seen: set[int] = set()
        for root in roots:
            tree = self._tree(root, children_of)
            seen.update(tree)
            out[root] = self._read_tree(root, tree, now)
        for pid in list(self._procs):
            if pid not in seen:
                self._procs.pop(pid, None)
                self._cpu.pop(pid, None)
        return out

    def _tree(self, root: int, children_of: dict[int, list[int]] | None) -> list[int]:
        tree, todo = [], [root]
        while todo:
            pid = todo.pop()
            if pid in tree:
                continue
            tree.append(pid)
            if children_of is not None:
                todo.extend(children_of.get(pid, ()))
                continue
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as fp:
                    todo.extend(int(c) for c in fp.read().split())
            except FileNotFoundError:
                if os.path.exists(f"/proc/{pid}"):
                    self._children_file = False  # kernel without it: scan every tick
            except (OSError, ValueError):
                pass
        return tree

    def _read_tree(self, root: int, tree: list[int], now: float) -> TreeReading:
        cpu_total: float | None = None
        rss_total: int | None = None
        threads: int | None = None
        status: str | None = None
        d_state = 0
        alive: list[int] = []
        for pid in tree:
            reading = self._read_proc(pid) if self._proc_stat else self._read_psutil(pid)
            if reading is None:
                continue
            st, used, rss, nth = reading
            if st == STATUS_ZOMBIE:
                if pid == root:
                    status = st
                continue
            alive.append(pid)
            if pid == root:
                status = st
            if st == STATUS_DISK_SLEEP:
                d_state += 1
            last = self._cpu.get(pid)
            self._cpu[pid] = (used, now)
            if last is not None and now > last[1]:
                pct = max(0.0, (used - last[0]) / (now - last[1]) * 100.0)
                cpu_total = (cpu_total or 0.0) + pct
            rss_total = (rss_total or 0) + rss
            threads = (threads or 0) + nth
        return TreeReading(
            pids=tuple(alive) or (root,),
            cpu=round(cpu_total, 1) if cpu_total is not None else None,
            rss=rss_total,
            threads=threads,
            status=status,
            d_state=d_state,
        )

    def _read_proc(self, pid: int) -> tuple[str, float, int, int] | None:
        """(state, CPU seconds, RSS bytes, threads) from one read of ``/proc/<pid>/stat``:
        what psutil reads from three files, at a third of its cost."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as fp:
                data = fp.read()
            f = data[data.rindex(b")") + 2 :].split()  # the name may hold spaces and ")"
            used = (int(f[11]) + int(f[12])) / _CLOCK_TICKS  # utime, stime
            return _STATES.get(f[0], f[0].decode()), used, int(f[21]) * _PAGE_SIZE, int(f[17])
        except (OSError, ValueError, IndexError):
            return None

    def _read_psutil(self, pid: int) -> tuple[str, float, int, int] | None:
        """The same through psutil, where there is no ``/proc``."""
        psutil = self._psutil
        p = self._procs.get(pid)
        try:
            if p is None:
                p = self._procs[pid] = psutil.Process(pid)
            with p.oneshot():
                st = p.status()
                if st == STATUS_ZOMBIE:
                    return st, 0.0, 0, 0
                t = p.cpu_times()
                return st, t.user + t.system, int(p.memory_info().rss), int(p.num_threads())
        except psutil.ZombieProcess:
            return STATUS_ZOMBIE, 0.0, 0, 0
        except (psutil.Error, OSError):
            self._procs.pop(pid, None)
            return None


# ----------------------------------------------------------------- rank <-> GPU


def visible_device(
    cvd: str | None, local_rank: int, uuid_index: dict[str, int], count: int
) -> int | None:
    """The NVML index of the GPU that ``local_rank`` would use: device ``cuda:LOCAL_RANK``
    of ``CUDA_VISIBLE_DEVICES`` (indices, or GPU/MIG UUIDs, whole or a unique prefix)."""
    if cvd is None:
        return local_rank if 0 <= local_rank < count else None
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if not entries:
        return None
    # One device per rank (a wrapper set it per rank): that one, whatever the local rank.
    if len(entries) == 1:
        entry = entries[0]
    elif local_rank < len(entries):
        entry = entries[local_rank]
    else:
        return None
    if entry.lstrip("-").isdigit():
        i = int(entry)
        return i if 0 <= i < count else None
    hits = {i for u, i in uuid_index.items() if u == entry or u.startswith(entry)}
    return hits.pop() if len(hits) == 1 else None


def map_rank(
    tree: Iterable[int],
    procs: dict[int, list[ProcOnGpu]],
    gpus: dict[int, GpuReading],
) -> tuple[tuple[int, ...], int | None, int | None]:
    """By pid: the GPUs the tree's processes are on, their memory sum and SM utilisation.

    Utilisation is summed per GPU over the tree's processes and the busiest GPU is given.
    """
    mem: int | None = None
    per_gpu: dict[int, int | None] = {}
    for pid in tree:
        for p in procs.get(pid, ()):
            if p.mem is not None:
                mem = (mem or 0) + p.mem
            if p.gpu not in per_gpu:
                per_gpu[p.gpu] = p.sm
            elif p.sm is not None:
                per_gpu[p.gpu] = (per_gpu[p.gpu] or 0) + p.sm
    if not per_gpu:
        return (), None, None
    utils = [u for u in per_gpu.values() if u is not None]
    util = min(100, max(utils)) if utils else None
    return tuple(sorted(per_gpu)), mem, util


# ----------------------------------------------------------------- the sampler thread


class Telemetry:
    """Samples ranks and GPUs on one thread and posts the readings to the store.

    Args:
        post: where samples go (``RunStore.post``).
        interval: seconds between ticks (``--gpu-interval``).
        gpu: False for ``--no-gpu``: no NVML at all.
        journal_every: every this many seconds a tick is journaled (0: never).
        slow_every: temperature and power every this many ticks.
        nvml: the NVML module (tests pass the fake); default: :func:`load_nvml`.
        launcher_cvd: ``CUDA_VISIBLE_DEVICES`` the workers inherit, used when a worker's own
            environment cannot be read.
    """

    def __init__(
        self,
        post: Callable[[Event], Any],
        *,
        interval: float = 1.0,
        gpu: bool = True,
        journal_every: float = 10.0,
        slow_every: int = 5,
        nvml: Any | None = None,
        launcher_cvd: str | None = None,
    ) -> None:
        self.post = post
        self.interval = max(0.05, float(interval))
        self.journal_every = journal_every
        self.gpu_enabled = gpu
        self.gpu = GpuSampler(nvml, slow_every=slow_every)
        self.procs: ProcessSampler | None = None
        self.launcher_cvd = (
            launcher_cvd if launcher_cvd is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        self._lock = threading.Lock()
        self._attempt = -1
        self._targets: tuple[RankTarget, ...] = ()
        self._env: dict[int, tuple[str | None, int | None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = False
        self._last_journal: float | None = None
        self._state_told = GPU_OK
        self._last: TelemetrySample | None = None
        self._view: TelemetryView | None = None  # the same fold as the store's, for the totals
        self.cpu_seconds = 0.0  # the thread's CPU time: opening NVML and psutil, and every tick
        self.open_cpu_seconds = 0.0
        self.ticks = 0
        self.error: str | None = None

    def set_workers(self, attempt: int, targets: Iterable[RankTarget]) -> None:
        """The ranks of a new attempt (any thread)."""
        with self._lock:
            self._attempt = attempt
            self._targets = tuple(targets)
            self._env = {}  # the previous attempt's pids are gone

    def open(self) -> None:
        """Initialise NVML and psutil (the thread does it itself; tests and bench call it)."""
        if self._opened:
            return
        self._opened = True
        if self.gpu_enabled:
            self.gpu.open()
        else:
            self.gpu.state, self.gpu.note = GPU_OFF, "GPU sampling off (--no-gpu)"
        try:
            self.procs = ProcessSampler()
        except Exception as e:  # psutil missing or broken: GPUs still work
            self.procs = None
            self.error = f"psutil unavailable ({_describe(e)})"

    def start(self) -> None:
        """Start the sampler thread (once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="tuilaunch-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread, journal the last reading and the totals, shut NVML down."""
        with self._lock:
            first = not self._stop.is_set()
            self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        if first and self._last is not None:
            # The journal's last word: the final reading, and totals over every live sample,
            # so a replayed journal prints the same summary as the live run did.
            last = self._last
            self.post(TelemetryRecord(**{f: getattr(last, f) for f in _SAMPLE_FIELDS}))
            if self._view is not None:
                self.post(TelemetryTotals(totals=self._view.totals))
        if t is None or not t.is_alive():
            self.gpu.close()  # not under a thread still inside an NVML call

    def _loop(self) -> None:
        t0 = time.thread_time()
        self.open()
        self.open_cpu_seconds = time.thread_time() - t0
        self.cpu_seconds += self.open_cpu_seconds
        # A schedule that does not drift: tick k is due at start + k * interval; ticks that
        # could not be kept (a suspended process, a slow NVML call) are skipped, not bunched.
        start = time.monotonic()
        k = 0
        while not self._stop.is_set():
            c0 = time.thread_time()
            try:
                self.tick()
            except Exception as e:  # never let telemetry take anything down
                self.error = _describe(e)
            self.cpu_seconds += time.thread_time() - c0
            k += 1
            now = time.monotonic()
            due = start + k * self.interval
            if due < now:
                k = int((now - start) / self.interval) + 1
                due = start + k * self.interval
            if self._stop.wait(due - now):
                break

    def _worker_env(self, t: RankTarget) -> tuple[str | None, int]:
        """The worker's own CUDA_VISIBLE_DEVICES and LOCAL_RANK (its start environment)."""
        cached = self._env.get(t.pid)
        if cached is None:
            cvd, lr = t.cuda_visible_devices or self.launcher_cvd, None
            try:
                with open(f"/proc/{t.pid}/environ", "rb") as fp:
                    env = dict(kv.split(b"=", 1) for kv in fp.read().split(b"\0") if b"=" in kv)
                raw = env.get(b"CUDA_VISIBLE_DEVICES")
                cvd = raw.decode() if raw is not None else None
                raw_lr = env.get(b"LOCAL_RANK")
                lr = int(raw_lr) if raw_lr is not None and raw_lr.isdigit() else None
                self._env[t.pid] = cached = (cvd, lr)
            except (OSError, ValueError):
                cached = (cvd, None)  # not cached: it may become readable
        cvd, lr = cached
        return cvd, lr if lr is not None else t.local_rank

    def tick(self) -> TelemetrySample:
        """Take one reading of everything and post it; returns what was posted."""
        self.open()
        with self._lock:
            attempt, targets = self._attempt, self._targets
        gpus, nvprocs = self.gpu.sample()
        trees = self.procs.sample(t.pid for t in targets) if self.procs else {}
        by_index = {g.index: g for g in gpus}
        # GPUs whose process list names pids this process cannot see (another PID namespace),
        # or cannot be listed at all: only there may a rank's GPU be inferred.
        foreign: set[int] = set()
        ours = {pid for tr in trees.values() for pid in tr.pids}
        for pid, entries in nvprocs.items():
            if pid not in ours and not _pid_visible(pid):
                foreign.update(p.gpu for p in entries)
        foreign.update(g.index for g in gpus if not self.gpu.process_list_known(g.index))
        mapped: dict[int, tuple[tuple[int, ...], int | None, int | None]] = {}
        for t in targets:
            tr = trees.get(t.pid)
            mapped[t.local_rank] = map_rank(tr.pids if tr else (t.pid,), nvprocs, by_index)
        # How many of our ranks share each GPU (for the utilisation fallback below).
        sharing: dict[int, int] = {}
        inferred: dict[int, int] = {}
        for t in targets:
            gl = mapped[t.local_rank][0]
            if not gl and by_index and self.gpu.state == GPU_OK:
                cvd, lr = self._worker_env(t)
                dev = visible_device(cvd, lr, self.gpu.uuid_index, len(self.gpu.gpus))
                if dev is not None and dev in foreign and by_index[dev].state == "ok":
                    inferred[t.local_rank] = dev
                    gl = (dev,)
            for i in gl:
                sharing[i] = sharing.get(i, 0) + 1
        ranks = []
        for t in targets:
            tr = trees.get(t.pid)
            gl, mem, util = mapped[t.local_rank]
            mapping: str | None = "pid" if gl else None
            if t.local_rank in inferred:
                dev = inferred[t.local_rank]
                g = by_index[dev]
                gl, mem, util, mapping = (dev,), g.mem_used, g.util, "inferred"
            elif gl and util is None and len(gl) == 1 and sharing.get(gl[0]) == 1:
                util = by_index[gl[0]].util  # no per-process figure; the GPU is this rank's alone
            ranks.append(
                RankReading(
                    local_rank=t.local_rank,
                    global_rank=t.global_rank,
                    pid=t.pid,
                    cpu=tr.cpu if tr else None,
                    rss=tr.rss if tr else None,
                    threads=tr.threads if tr else None,
                    status=tr.status if tr else None,
                    procs=len(tr.pids) if tr else 0,
                    d_state=tr.d_state if tr else 0,
                    gpus=gl,
                    mapping=mapping,
                    gpu_mem=mem,
                    gpu_util=util,
                )
            )
        now = time.monotonic()
        journal = self.journal_every > 0 and (
            self._last_journal is None or now - self._last_journal >= self.journal_every
        )
        cls = TelemetryRecord if journal else TelemetrySample
        if journal:
            self._last_journal = now
        sample = cls(
            attempt=attempt,
            gpu_state=self.gpu.state,
            gpu_note=self.gpu.note,
            gpus=gpus,
            ranks=tuple(ranks),
            simulated=self.gpu.simulated,
        )
        with self._lock:
            if self._stop.is_set() and self._thread is not None:
                return sample  # the run is over: nothing may follow its last events
            self._last = sample
            self._view = fold(self._view, sample)
            if self.gpu.state == GPU_LOST and self._state_told != GPU_LOST:
                self.post(Notice(level="warning", message=f"GPU telemetry: {self.gpu.note}"))
            self._state_told = self.gpu.state
            self.ticks += 1
            self.post(sample)
        return sample


_SAMPLE_FIELDS = ("attempt", "gpu_state", "gpu_note", "gpus", "ranks", "simulated")


def _pid_visible(pid: int) -> bool:
    if pid <= 0:
        return False  # os.kill(0, ...) would mean our own process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


# ----------------------------------------------------------------- the store's view


@dataclass(frozen=True)
class TelemetryView:
    """The store's telemetry: the latest sample, short histories, and per-rank totals.

    ``gpu_util``/``gpu_mem`` hold, per GPU in ``latest.gpus`` order, the last
    :data:`HISTORY` utilisation and memory-used percentages; ``rank_cpu``/``rank_gpu`` the
    same per local rank of the current attempt (``(local_rank, history)`` pairs).
    """

    latest: TelemetrySample
    gpu_util: tuple[tuple[int, ...], ...] = ()
    gpu_mem: tuple[tuple[int, ...], ...] = ()
    rank_cpu: tuple[tuple[int, tuple[float, ...]], ...] = ()
    rank_gpu: tuple[tuple[int, tuple[int, ...]], ...] = ()
    totals: tuple[RankTotals, ...] = ()

    def rank(self, local_rank: int, attempt: int | None = None) -> RankReading | None:
        """The latest reading of ``local_rank`` (of ``attempt``, when given)."""
        if attempt is not None and self.latest.attempt != attempt:
            return None
        for r in self.latest.ranks:
            if r.local_rank == local_rank:
                return r
        return None

    def history(self, local_rank: int) -> tuple[float, ...]:
        """The CPU % history of ``local_rank``."""
        for lr, h in self.rank_cpu:
            if lr == local_rank:
                return h
        return ()

    def gpu_history(self, local_rank: int) -> tuple[int, ...]:
        """The GPU utilisation % history of ``local_rank``."""
        for lr, h in self.rank_gpu:
            if lr == local_rank:
                return h
        return ()


def _push(hist: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
    return (*hist[-(HISTORY - 1) :], value)


def fold(view: TelemetryView | None, s: TelemetrySample) -> TelemetryView:
    """The view after sample ``s`` (pure; the store's reducer calls it)."""
    old = view
    # GPU histories, by position; reset if the set of GPUs changed.
    same_gpus = old is not None and tuple(g.index for g in old.latest.gpus) == tuple(
        g.index for g in s.gpus
    )
    gu = old.gpu_util if old is not None and same_gpus else tuple(() for _ in s.gpus)
    gm = old.gpu_mem if old is not None and same_gpus else tuple(() for _ in s.gpus)
    gpu_util = tuple(_push(h, g.util or 0) for h, g in zip(gu, s.gpus, strict=False))
    gpu_mem = tuple(
        _push(h, round(100 * g.mem_used / g.mem_total) if g.mem_used and g.mem_total else 0)
        for h, g in zip(gm, s.gpus, strict=False)
    )
    same_attempt = old is not None and old.latest.attempt == s.attempt
    cpu_h = dict(old.rank_cpu) if old is not None and same_attempt else {}
    gpu_h = dict(old.rank_gpu) if old is not None and same_attempt else {}
    totals = {(t.attempt, t.local_rank): t for t in (old.totals if old is not None else ())}
    for r in s.ranks:
        cpu_h[r.local_rank] = _push(cpu_h.get(r.local_rank, ()), r.cpu or 0.0)
        gpu_h[r.local_rank] = _push(gpu_h.get(r.local_rank, ()), r.gpu_util or 0)
        key = (s.attempt, r.local_rank)
        t = totals.get(key) or RankTotals(
            attempt=s.attempt, local_rank=r.local_rank, global_rank=r.global_rank
        )
        t = replace(
            t,
            samples=t.samples + 1,
            peak_rss=_max(t.peak_rss, r.rss),
            cpu_sum=t.cpu_sum + (r.cpu or 0.0),
            cpu_n=t.cpu_n + (r.cpu is not None),
            peak_gpu_mem=_max(t.peak_gpu_mem, r.gpu_mem),
            gpu_util_sum=t.gpu_util_sum + (r.gpu_util or 0),
            gpu_util_n=t.gpu_util_n + (r.gpu_util is not None),
            mapping=r.mapping or t.mapping,
        )
        totals[key] = t
    return TelemetryView(
        latest=s,
        gpu_util=gpu_util,
        gpu_mem=gpu_mem,
        rank_cpu=tuple(sorted(cpu_h.items())),
        rank_gpu=tuple(sorted(gpu_h.items())),
        totals=tuple(sorted(totals.values(), key=lambda t: (t.attempt, t.local_rank))),
    )


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def fmt_bytes(n: int | None) -> str:
    """``512M``, ``12.3G`` (or ``-``)."""
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f}G"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.0f}M"
    return f"{n / 1024:.0f}K"


__all__ = [
    "GpuSampler",
    "ProcessSampler",
    "RankTarget",
    "Telemetry",
    "TelemetryView",
    "fmt_bytes",
    "fold",
    "map_rank",
    "visible_device",
]
