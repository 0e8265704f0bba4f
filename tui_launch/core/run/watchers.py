"""The runner's watchers of a job that has not crashed: stacks, hangs, progress, stragglers.

:class:`Diagnosis` owns the four parts that read the ranks without changing them and wires
them to the log tailer and the store, so the runner only tells it when an attempt starts and
asks it, at each monitor tick, whether a confirmed hang wants the group failed:

- :class:`~.dumps.Dumper`: stack dumps (the ``d`` key, the control API, before teardown);
- :class:`~.hangwatch.HangWatch`: the job stood still (its steps, from the progress watch, or
  its output) for longer than its rhythm allows, two dumps that match, ``--on-hang``;
- :class:`~.progress.watch.ProgressWatch`: steps, rate, ETA and slowdowns from the logs;
- :class:`~.progress.straggler.StragglerSampler`: the rank the others wait for, from stack
  samples.

Threads: each watcher runs on its own :class:`~.periodic.Periodic` loop; the hang watch's
thread hands a confirmed hang over under this object's lock, and the agent thread takes it in
:meth:`Diagnosis.take_hang`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable

from tui_launch.core.diagnosis.collectives import CollectivePoller
from tui_launch.core.diagnosis.dumps import Dumper
from tui_launch.core.diagnosis.hangwatch import HangWatch
from tui_launch.core.diagnosis.ncclwatch import NcclDumpWatch
from tui_launch.core.diagnosis.straggler import StragglerSampler
from tui_launch.core.model.events import HangDetected, StacksDumped, WorkerInfo
from tui_launch.core.model.layout import RunDirLayout, analyser_stem
from tui_launch.core.model.store import RunStore
from tui_launch.core.progress.watch import ProgressWatch
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.control import ShimDir
from tui_launch.core.run.rundir import RunFiles
from tui_launch.core.run.state import RunState
from tui_launch.core.seam import flightrec
from tui_launch.core.workers.shim import FAULTHANDLER_ENV, FAULTHANDLER_SIGNAL
from tui_launch.core.workers.table import RankTable


class Diagnosis:
    """The dumper, the hang watch, the progress watch and the straggler sampler of one run.

    Args:
        store: where their events go (the progress watch also reads the store's events).
        ranks: the rank table (pids to dump and sample).
        files: the run's files (log and stderr paths, the run directory, the tailer).
        state: the run's state: whether the agent is watching a running group (no hang while
            it is not).
        config: the run's settings: ``hang_timeout``, ``on_hang``, ``dump_on_failure``,
            ``dump_via_faulthandler``, ``stack_samples``.
        shim: the worker bootstrap (faulthandler dumps need workers started through it).
        rank_cpu: a rank's CPU % from the telemetry (evidence for a straggler), or None.
    """

    def __init__(
        self,
        store: RunStore,
        ranks: RankTable,
        files: RunFiles,
        state: RunState,
        config: RunConfig,
        shim: ShimDir,
        rank_cpu: Callable[[int], float | None],
    ) -> None:
        via_faulthandler = config.dump_via_faulthandler and shim.wanted
        # The Flight Recorder is collected wherever the bootstrap runs (the default).
        self._flight_recorder = shim.wanted
        # The responders' sockets: an owner-only directory of its own, short enough for a
        # socket path (108 bytes) whatever --log-dir is; removed at the end of the run.
        self.responder_dir: str | None = None
        self._live_stem: str | None = None  # NCCL's dump files of the latest workers, if ours
        self._live_attempt = 0  # the attempt they are of
        self._store = store
        self._files = files
        self._dump_on_failure = config.dump_on_failure
        self._via_faulthandler = via_faulthandler
        self._lock = threading.Lock()
        self._hang: HangDetected | None = None  # a confirmed hang for the agent thread
        self._wake = state.wake.notify
        self.dumper = Dumper(
            store.post,
            ranks,
            self._ensured_run_dir,
            lambda: dict(files.stderr_paths),
            via_faulthandler=via_faulthandler,
            responders=lambda: self.responder_dir,
        )
        self.hangs = HangWatch(
            store.post,
            self.dumper,
            state.monitored,
            timeout=config.hang_timeout,
            action=config.on_hang,
            on_hang=self._hang_confirmed,
            steps=lambda: self.progress.steps(),
            collectives=lambda: self.collectives.moves(),
        )
        # The Flight Recorder: each rank's last collective, live, and the survivors' last state.
        self.collectives = CollectivePoller(
            store.post,
            lambda: self.dumper.targets(check=False),
            lambda: ranks.attempt,
            lambda: self.responder_dir,
        )
        self.dumper.recent = self.collectives.latest
        # NCCL's dump-on-timeout files, judged as soon as they are written.
        self.nccl_dumps = NcclDumpWatch(
            store.post, lambda: self._live_stem, lambda: self._live_attempt, fswatch=files.fswatch
        )
        self.progress = ProgressWatch(store.post, journal_every=config.journal_samples)
        # Where the live poll holds a fresh stack of a rank, a straggler sample reads it
        # instead of starting py-spy (empty with --no-bootstrap: py-spy then).
        self.stragglers = StragglerSampler(
            store.post, rank_cpu, interval=config.stack_samples, recent=self.collectives.latest
        )

    def start(self) -> None:
        """Wire the watchers to the tailer and the store and start their loops (before the
        tailer starts, so no line is missed)."""
        tailer = self._files.tailer
        if self._via_faulthandler:
            # Inherited by the workers: the bootstrap registers faulthandler on this signal.
            os.environ[FAULTHANDLER_ENV] = str(int(FAULTHANDLER_SIGNAL))
        if self._flight_recorder:
            # The sockets (and NCCL's pipes) in a short node-local directory; NCCL's dump
            # files in the run directory, which outlives the job, named per attempt when
            # torch lays out its files (the run directory exists from then on).
            directory = tempfile.mkdtemp(prefix="tuilaunch-fr-")
            if flightrec.worker_env(os.environ, directory, "") is not None:
                self.responder_dir = directory
                self._files.attempt_env.append(self._flight_recorder_env)
                self.collectives.start()
                self.nccl_dumps.start()
            else:
                os.rmdir(directory)
        if self.hangs.enabled:
            tailer.add_sink(self.hangs.sink, lossy=True)
            tailer.add_partial_sink(self.hangs.partial_sink)
            self.hangs.start()
        self._store.subscribe(self.progress.on_event)
        # lossy: progress needs the newest lines, not every line of a flood.
        tailer.add_sink(self.progress.on_lines, lossy=True)
        # tqdm's bars rewrite one line with \r and end it only at close: the unterminated text.
        tailer.add_partial_sink(self.progress.on_partial)
        self.progress.start()
        self.stragglers.start()

    def stop(self) -> None:
        """Stop the loops; call it after the tailer has stopped, so the progress watch's last
        record holds the last lines."""
        self.hangs.stop()
        self.progress.stop()
        self.stragglers.stop()
        self.collectives.stop()
        if self.responder_dir is not None:
            self.nccl_dumps.stop()
        self._close_responders()

    def _flight_recorder_env(self, run_dir: str, attempt: int) -> dict[str, str]:
        """The Flight Recorder's variables for ``attempt``'s workers: NCCL's own dumps go to
        ``<run dir>/flightrec/<host>.attempt<A>.rank_`` (torch adds the rank)."""
        target = RunDirLayout(run_dir).flightrec_dir
        stem = os.path.join(target, analyser_stem(socket.gethostname(), attempt))
        env = flightrec.worker_env(os.environ, self.responder_dir or "", stem) or {}
        if flightrec.NCCL_TEMP_FILE in env:  # not the user's own: watch it
            with contextlib.suppress(OSError):  # owner-only, for NCCL to write into
                os.makedirs(target, mode=0o700, exist_ok=True)
            self._live_attempt = attempt
            self._live_stem = stem
        return env

    def _close_responders(self) -> None:
        """Remove the sockets' directory (NCCL's dump files are in the run directory)."""
        directory, self.responder_dir = self.responder_dir, None
        if directory is None:
            return
        shutil.rmtree(directory, ignore_errors=True)
        run_dir = self._files.run_dir
        if run_dir:  # nothing dumped: no empty directory left behind
            with contextlib.suppress(OSError):
                os.rmdir(RunDirLayout(run_dir).flightrec_dir)

    def attempt_started(self, attempt: int, workers: tuple[WorkerInfo, ...]) -> None:
        """A new attempt runs: watch its ranks."""
        self.hangs.attempt_started(attempt, {w.local_rank: w.global_rank for w in workers})
        self.stragglers.set_workers(attempt, [(w.global_rank, w.pid) for w in workers])

    def take_hang(self, attempt: int) -> HangDetected | None:
        """On the agent thread: the hang confirmed in ``attempt`` that ``--on-hang restart|stop``
        wants acted on, once."""
        with self._lock:
            hang, self._hang = self._hang, None
        return hang if hang is not None and hang.attempt == attempt else None

    def dump_survivors(self, attempt: int) -> StacksDumped | None:
        """Dump the ranks still alive in a failed group (once per attempt, about a second)."""
        if not self._dump_on_failure:
            return None
        return self.dumper.survivors(attempt)

    def _hang_confirmed(self, event: HangDetected) -> None:
        # On the hang watch's thread: the agent thread acts on it at its next monitor tick.
        if event.action in ("restart", "stop"):
            with self._lock:
                self._hang = event
            self._wake()

    def _ensured_run_dir(self) -> str:
        self._files.ensure_run_dir()
        return self._files.run_dir or "."
