"""The telemetry thread: every tick, every rank's process tree and every GPU, posted to the store.

:class:`Telemetry` runs on a :class:`~tui_launch.core.periodic.Periodic` named
``tuilaunch-telemetry`` whose schedule does not drift (``--gpu-interval``, 1 s by default). It
opens NVML and psutil on that thread, then each tick reads the ranks' trees
(:class:`~tui_launch.core.telemetry.procs.ProcessSampler`) and the GPUs
(:class:`~tui_launch.core.telemetry.nvml.GpuSampler`), works out which rank is on which GPU
(:func:`~tui_launch.core.telemetry.mapping.assign`) and posts one compact
:class:`~tui_launch.core.model.events.TelemetrySample`; every ``journal_every`` seconds the tick
posts
a :class:`~tui_launch.core.model.events.TelemetryRecord` instead, which the journal keeps.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tui_launch.core.model.events import (
    Event,
    Notice,
    RankReading,
    TelemetryRecord,
    TelemetrySample,
    TelemetryTotals,
)
from tui_launch.core.model.telemetry import TelemetryView, fold
from tui_launch.core.periodic import Periodic
from tui_launch.core.telemetry.mapping import RankTarget, assign
from tui_launch.core.telemetry.nvml import (
    GPU_LOST,
    GPU_OFF,
    GPU_OK,
    GpuSampler,
    describe_error,
)
from tui_launch.core.telemetry.procs import ProcessSampler
from tui_launch.core.workers import env as workerenv

_SAMPLE_FIELDS = ("attempt", "gpu_state", "gpu_note", "gpus", "ranks", "simulated")


class Telemetry:
    """Samples ranks and GPUs on one thread and posts the readings to the store.

    Args:
        post: where samples go (``RunStore.post``).
        interval: seconds between ticks (``--gpu-interval``).
        gpu: False for ``--no-gpu``: no NVML at all.
        journal_every: every this many seconds a tick is journaled (0: never).
        slow_every: temperature and power every this many ticks.
        nvml: the NVML module (tests pass the fake); default:
            :func:`~tui_launch.core.telemetry.nvml.load_nvml`'s.
        fake_nvml: without ``nvml``, the fake NVML's scenario (``--demo``'s simulated GPUs);
            None: the real NVML (see :mod:`tui_launch.core.telemetry.nvml` for the tests' hook).
        launcher_cvd: ``CUDA_VISIBLE_DEVICES`` the workers inherit, used when a worker's own
            environment cannot be read.
        view: the store's fold of the posted samples (``store.snapshot().telemetry``): the
            totals journaled at the end are read from it. None: the sampler folds its samples
            itself for them (the same fold a second time, a fifth of a tick's cost).
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
        fake_nvml: str | None = None,
        launcher_cvd: str | None = None,
        view: Callable[[], TelemetryView | None] | None = None,
    ) -> None:
        self.post = post
        self._store_view = view
        self.interval = max(0.05, float(interval))
        self.journal_every = journal_every
        self.gpu_enabled = gpu
        self.gpu = GpuSampler(nvml, slow_every=slow_every, fake=fake_nvml)
        self.procs: ProcessSampler | None = None
        self.launcher_cvd = (
            launcher_cvd if launcher_cvd is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        )
        self._lock = threading.Lock()
        self._attempt = -1
        self._targets: tuple[RankTarget, ...] = ()
        self._env: dict[int, tuple[str | None, int | None]] = {}
        self._stop = threading.Event()
        self._loop: Periodic | None = None
        self._opened = False
        self._last_journal: float | None = None
        self._state_told = GPU_OK
        self._last: TelemetrySample | None = None
        self._view: TelemetryView | None = None  # the same fold as the store's, for the totals
        self.ticks = 0
        self.error: str | None = None

    @property
    def running(self) -> bool:
        """Whether the sampler thread is alive."""
        return self._loop is not None and self._loop.running

    @property
    def cpu_seconds(self) -> float:
        """The thread's CPU time: opening NVML and psutil, and every tick."""
        return self._loop.cpu_seconds if self._loop is not None else 0.0

    @property
    def open_cpu_seconds(self) -> float:
        """The thread's CPU time spent opening NVML and psutil."""
        return self._loop.setup_cpu_seconds if self._loop is not None else 0.0

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
            self.error = f"psutil unavailable ({describe_error(e)})"

    def start(self) -> None:
        """Start the sampler thread (once): it opens NVML and psutil, then ticks."""
        if self._loop is not None:
            return
        self._loop = Periodic(
            "tuilaunch-telemetry",
            self.interval,
            self._tick,
            setup=self.open,
            on_error=self._failed,
        ).start()

    def _tick(self) -> None:
        self.tick()

    def _failed(self, e: BaseException) -> None:
        self.error = describe_error(e)  # never let telemetry take anything down

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread, journal the last reading and the totals, shut NVML down."""
        with self._lock:
            first = not self._stop.is_set()
            self._stop.set()
        loop = self._loop
        if loop is not None:
            loop.stop(timeout)  # joins unless called from the loop's own thread
        if first and self._last is not None:
            # The journal's last word: the final reading, and totals over every live sample,
            # so a replayed journal prints the same summary as the live run did. (Read before
            # the final reading is posted again: it is counted once.)
            last = self._last
            view = self._store_view() if self._store_view is not None else self._view
            self.post(TelemetryRecord(**{f: getattr(last, f) for f in _SAMPLE_FIELDS}))
            if view is not None:
                self.post(TelemetryTotals(totals=view.totals))
        if loop is None or not loop.running:
            self.gpu.close()  # not under a thread still inside an NVML call
            if self.procs is not None:
                self.procs.close()  # the /proc files it keeps open between ticks

    def _worker_env(self, t: RankTarget) -> tuple[str | None, int]:
        """The worker's own CUDA_VISIBLE_DEVICES and LOCAL_RANK (its start environment)."""
        cached = self._env.get(t.pid)
        if cached is None:
            cvd, lr = t.cuda_visible_devices or self.launcher_cvd, None
            try:
                # A --warm-start spare's is the environment it was handed, not its /proc one.
                env = workerenv.environ(t.pid)
                raw_lr = env.get("LOCAL_RANK")
                lr = int(raw_lr) if raw_lr is not None and raw_lr.isdigit() else None
                if raw_lr is not None:
                    cvd = env.get("CUDA_VISIBLE_DEVICES")
                # else: not the environment torch built: the launcher's view stands.
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
        placed = assign(
            targets,
            trees,
            nvprocs,
            gpus,
            self._worker_env,
            uuid_index=self.gpu.uuid_index,
            unlisted={g.index for g in gpus if not self.gpu.process_list_known(g.index)},
        )
        ranks = []
        for t, on in zip(targets, placed, strict=True):
            tr = trees.get(t.pid)
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
                    gpus=on.gpus,
                    mapping=on.mapping,
                    gpu_mem=on.mem,
                    gpu_util=on.util,
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
            if self._stop.is_set() and self._loop is not None:
                return sample  # the run is over: nothing may follow its last events
            self._last = sample
            if self._store_view is None:
                self._view = fold(self._view, sample)
            if self.gpu.state == GPU_LOST and self._state_told != GPU_LOST:
                self.post(Notice(level="warning", message=f"GPU telemetry: {self.gpu.note}"))
            self._state_told = self.gpu.state
            self.ticks += 1
            self.post(sample)
        return sample


__all__ = ["Telemetry"]
