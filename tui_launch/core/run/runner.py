"""Run torch's own torchrun path on a background thread, observed and steerable.

:class:`Runner` calls ``torch.distributed.run.run(args)`` (so ``--standalone``, ``-m``,
``--no-python``, ``--run-path``, ``OMP_NUM_THREADS`` and every other flag behave exactly as in
torchrun) with ``LocalElasticAgent`` swapped for a subclass (:mod:`.agent`, the torch seam)
that reports every transition to the runner (:mod:`.observer`: the callbacks and ``monitor``,
the one decision point), which posts it to the :class:`~tui_launch.core.model.store.RunStore`.
The runner wires the parts and sequences them; each job has its own module:

- :mod:`.workers`: the rank table (pids, exits, stopped ranks, marks) and its lock;
- :mod:`.control`: the control API (signal, kill, stop, continue, restart, orders, node);
- :mod:`.diagnosis`: stack dumps (``dump_stacks``, before teardown), the hang watch
  (``--on-hang``), progress from the logs and the straggler sampler;
- :mod:`.faults`: what a fired injection does;
- :mod:`.membership`: rounds, lost nodes and the cluster view;
- :mod:`.failures`: an attempt's failures, from what torch and the rank table say;
- :mod:`.shutdown`: stopping the run, and the watchdog for when torch cannot be reached;
- :mod:`.rundir`: the run directory and the log wiring;
- :mod:`.reports`: torch's objects as events;
- :mod:`.warm`: ``--warm-start``'s spare interpreter (workers forked from it, through the seam);
- :mod:`.handle`: the surface the front ends use (:class:`~.handle.RunHandle`).

Threads: the agent runs on ``tuilaunch-agent``. Commands only set flags or send signals; the
agent thread acts on flags in ``monitor`` (:mod:`.observer`) (every ``--monitor-interval``), the one
place where the runner decides, through torch's own paths (``SignalException`` for a stop,
``UNHEALTHY`` for a restart).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from tui_launch.core.model.events import Connecting, LogMark, Notice, RunFinished
from tui_launch.core.model.store import Phase, RunStore
from tui_launch.core.run import inject, reports
from tui_launch.core.run.control import Control, ShimDir
from tui_launch.core.run.failures import run_outcome
from tui_launch.core.run.faults import FaultExecutor
from tui_launch.core.run.handle import PartsHandle
from tui_launch.core.run.membership import Membership
from tui_launch.core.run.observer import AgentCallbacks
from tui_launch.core.run.rundir import RunFiles
from tui_launch.core.run.shutdown import Stopper, signal_exit_code
from tui_launch.core.run.watchers import Diagnosis
from tui_launch.core.seam import agent, rendezvous
from tui_launch.core.seam.agent import TorchAgent
from tui_launch.core.telemetry import Telemetry
from tui_launch.core.workers import reaper
from tui_launch.core.workers.reaper import Reaper
from tui_launch.core.workers.table import RankTable
from tui_launch.core.workers.warm import WarmPool

SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
__all__ = ["SHARE_STORE_ENV", "Runner", "signal_exit_code"]


def _nothing() -> None:
    """A step with nothing to do (a part this run does not have)."""


class Runner(PartsHandle, AgentCallbacks):
    """One launch of torch's elastic agent, with a control API (a :class:`.handle.RunHandle`).

    Args:
        args: torchrun's parsed arguments (``torch.distributed.run.parse_args``).
        store: where events go.
        echo: whether worker output that torchrun would print goes to the console sinks.
        journal_path: ``--journal``; default: ``journal.jsonl`` in the run's log directory.
        mute_agent_console: keep torch's own log lines off stderr (the dashboard shows them).
        telemetry: the GPU/process sampler to run with the job (None: no telemetry).
        injector: the ``--inject`` schedule (default: none, but the dashboard may add some).
        inject_ready: start Python workers through the injection bootstrap even without an
            ``exit``/``exception`` spec, so that the dashboard can inject those.
        hang_timeout: ``--hang-timeout``: seconds of silence on every rank before a hang is
            suspected (0: no detection).
        on_hang: ``--on-hang``: dump, restart or stop once a hang is confirmed.
        dump_on_failure: dump the surviving ranks before torch terminates a failed group
            (``--no-dump-on-failure`` turns it off).
        dump_via_faulthandler: start Python workers through the bootstrap with faulthandler on
            a real-time signal, and dump through it instead of py-spy.
        stack_samples: seconds between two stack samples of every rank, for the straggler
            inference (0: off).
        warm: ``--warm-start``'s spare (None: every worker starts cold, as in torchrun); the
            runner configures, replaces and closes it.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        store: RunStore,
        *,
        echo: bool = True,
        journal_path: str | None = None,
        mute_agent_console: bool = False,
        telemetry: Telemetry | None = None,
        injector: inject.Injector | None = None,
        inject_ready: bool = False,
        hang_timeout: float = 0.0,
        on_hang: str = "dump",
        dump_on_failure: bool = True,
        dump_via_faulthandler: bool = False,
        stack_samples: float = 5.0,
        warm: WarmPool | None = None,
    ) -> None:
        self.args = args
        self.warm = warm
        self.store = store
        self.host = socket.gethostname()
        self.telemetry = telemetry
        self.reaper: Reaper | None = None
        self.exit_code: int | None = None
        self.error_message: str | None = None
        self._mute_agent_console = mute_agent_console

        # Guards the phase and the restart flag (the agent thread writes, commands read).
        self._lock = threading.Lock()
        self._phase = Phase.STARTING
        self._restart_requested = False
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._finishing = False
        self._agent: TorchAgent = None
        # Agent thread only.
        self._pending_cause: str | None = None
        self._failure_restarts = 0
        self._user_max_restarts = int(getattr(args, "max_restarts", 0))
        self._rdzv_t0 = 0.0
        self._last_group_state: str | None = None
        self._notes: tuple[str, ...] = ()
        self._connecting: Connecting | None = None

        self.ranks = RankTable()
        self.files = RunFiles(args, journal_path, echo, lambda: self.ranks.attempt + 1)
        self.files.journal.on_error = self._write_failed
        self.files.agent_log.on_error = self._write_failed
        self.injector = injector or inject.Injector()
        self.shim = ShimDir(
            inject_ready or dump_via_faulthandler or inject.needs_shim(self.injector.specs),
            bool(getattr(args, "no_python", False)),
        )
        self.diagnosis = Diagnosis(
            store,
            self.ranks,
            self.files,
            self._monitored,
            hang_timeout=hang_timeout,
            on_hang=on_hang,
            dump_on_failure=dump_on_failure,
            via_faulthandler=dump_via_faulthandler and self.shim.wanted,
            stack_samples=stack_samples,
            rank_cpu=self._rank_cpu,
        )
        self.dumper = self.diagnosis.dumper  # the handle's dump_stacks and load_dump
        # Late-bound: the fault executor (an Inject's scheduler) needs the control API too.
        self.control = Control(
            store.post,
            self.ranks,
            self.shim,
            self._request_restart,
            snapshot=store.snapshot,
            schedule=lambda text, source: self.faults.inject(text, source),
            dump=self.dumper.dump_stacks,
            stop=self.stop,
        )
        self.faults = FaultExecutor(
            self.injector, self.ranks, self.control, self.shim, store.post, self._monitored
        )
        self.injector.bind(self.faults)
        self.membership = Membership(
            store.post, store.snapshot, self.host, args, dumper=self.dumper
        )
        self.stopper = Stopper(
            args, self.ranks, store.post, self._finish, self._stop_settled, self._stopping
        )
        self._sampler = rendezvous.Sampler(store.post, self._handler)
        if self.injector.uses_random:
            seed = self.injector.seed
            self._notes += (
                f"inject: rank=random draws use seed {seed} (--inject-seed {seed} repeats them)",
            )

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the reaper, the log tailer and the agent thread."""
        self.store.subscribe(self.files.journal.write)
        self.files.agent_log.install(mute_console=self._mute_agent_console)
        agent.silence_thread_warning()
        self._fix_restarts()
        # No orphans: the run's cgroup (or subreaper + token sweep), and the reaper for when
        # the launcher dies; which one is in RunStarted's notes.
        contained = reaper.contain(reaper.run_token())
        self._notes += (contained.describe(),)
        self.reaper = Reaper(contained, lambda m: self.store.post(Notice("warning", m)))
        if self.warm is not None:
            self.warm.set_watch(self.reaper.watch, self.reaper.forget)
        self.files.tailer.set_mark_sink(lambda offsets: self.store.post(LogMark(offsets=offsets)))
        self.diagnosis.start()
        self.files.tailer.start()
        # Before torch's rendezvous handler exists: creating it can block a whole connect
        # timeout (a c10d store nobody serves), and the front ends say what it waits for.
        self._connecting = reports.connecting(self.args)
        self.store.post(self._connecting)
        self._thread = threading.Thread(target=self._main, name="tuilaunch-agent", daemon=True)
        self._thread.start()
        self._sampler.start()

    def _rank_cpu(self, global_rank: int) -> float | None:
        tel = self.store.snapshot().telemetry
        for r in tel.latest.ranks if tel is not None else ():
            if r.global_rank == global_rank:
                return r.cpu
        return None

    def _handler(self) -> Any:
        return agent.rdzv_handler(self._agent) if self._agent is not None else None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the run to end; return its exit code (None on timeout)."""
        self._done.wait(timeout)
        return self.exit_code

    @property
    def done(self) -> bool:
        """True once the run has finished and the summary is final."""
        return self._done.is_set()

    @property
    def phase(self) -> str:
        """Where the agent thread is, in the snapshot's words (:class:`~.store.Phase`)."""
        with self._lock:
            return self._phase

    def _fix_restarts(self) -> None:
        # torch >= 2.5 shares the rendezvous TCPStore with the workers; stale keys and a reused
        # MASTER_PORT make most restarts fail or hang (pytorch issues 135712, 167288).
        if SHARE_STORE_ENV in os.environ:
            return
        os.environ[SHARE_STORE_ENV] = "1"
        self._notes += (
            f"restarts: tuilaunch set {SHARE_STORE_ENV}=1 (a fresh rendezvous store per "
            f"attempt; torch's shared store makes most restarts fail or hang). "
            f"Opt out with {SHARE_STORE_ENV}=0.",
        )

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            with (
                agent.observed(self),
                agent.worker_bootstrap(
                    self.shim.open(), self._warm_configure if self.warm is not None else None
                ),
                agent.warm_handlers(
                    self.warm.hand_off if self.warm is not None else None,
                    self.reaper.wrap_worker if self.reaper is not None else None,
                ),
                rendezvous.local_store_host(self._hosting_by_address),
            ):
                agent.torchrun(self.args)
        except BaseException as e:  # any error of torch's becomes one line, never a traceback
            error = e
        finally:
            snap = self.store.snapshot()
            self._finish(
                *run_outcome(
                    error,
                    self.stopper.stop_signal,
                    snap.root_cause,
                    snap.rendezvous_live,
                    self.args.nnodes,
                    self._connecting,
                )
            )

    def _warm_configure(self, count: int, boot: Any) -> None:
        # In torchrun's config_from_args, before the agent exists: a note for RunStarted.
        assert self.warm is not None
        self._notes += (self.warm.configure(count, boot),)

    def _hosting_by_address(self, host: str) -> None:
        # Called while torch creates the rendezvous handler, before RunStarted: a note.
        self._notes += (
            f"rendezvous: this node hosts the c10d store: {host} is an address of one of its "
            f"interfaces (torch's hostname check said no; --rdzv-conf is_host=0 overrides)",
        )

    def _finish(self, outcome: str, code: int, message: str) -> None:
        # Two threads may finish at once (the agent thread and the stop watchdog or a second
        # stop): the first one through here finishes, the other returns at once.
        with self._lock:
            if self._finishing:
                return
            self._finishing = True
            self._phase = outcome
            self.exit_code = code
            self.error_message = message if outcome == "error" else None
        # Every step runs, whatever the one before raised (a full disk makes the journal's
        # and the agent log's writes fail): the front ends wait for ``_done``, and a launcher
        # that never sets it can only be SIGKILLed.
        steps: list[tuple[str, Callable[[], object]]] = [
            ("log tailer", self.files.tailer.stop),
            ("diagnosis", self.diagnosis.stop),  # after the tailer: its last lines count
            ("telemetry", self.telemetry.stop if self.telemetry is not None else _nothing),
            ("injections", self.faults.close),
            ("warm start", self.warm.close if self.warm is not None else _nothing),
            ("orphans", self._sweep),  # after the spare: nothing it forked is left
            ("finish", lambda: self.store.post(self._finished(outcome, code, message))),
            ("sampler", self._sampler.stop),
            ("cluster", self.membership.stop),  # one last record: the outcome, for the others
            ("run directory", self.files.ensure_run_dir),
            ("journal", self.files.journal.close),
            ("reaper", self.reaper.close if self.reaper is not None else _nothing),
            ("agent log", self.files.agent_log.uninstall),
        ]
        try:
            for what, step in steps:
                try:
                    step()
                except Exception as e:
                    self._say(f"{what}: {type(e).__name__}: {e}")
        finally:
            self._done.set()
            self.store.wake()

    def _sweep(self) -> None:
        # Whatever the workers started and left (a child that ignored SIGTERM, one that
        # called setsid) goes with the run.
        left = self.reaper.sweep() if self.reaper is not None else 0
        if left:
            self.store.post(
                Notice("info", f"no orphans: killed {left} process(es) left by the workers")
            )

    def _finished(self, outcome: str, code: int, message: str) -> RunFinished:
        # The run's last event; a writer that lost events to a full disk says so on its line.
        lost = [w for w in (self.files.journal.error, self.files.agent_log.error) if w]
        if lost and outcome != "succeeded" and "no space left" not in message:
            message = f"{message}; {lost[0]}"
        return RunFinished(outcome=outcome, exit_code=code, message=message)

    def _say(self, message: str) -> None:
        # The launcher's own trouble: a notice (the store never raises), and on stderr when
        # even that cannot be shown.
        try:
            self.store.post(Notice(level="error", message=message))
        except Exception:
            with contextlib.suppress(Exception):
                os.write(2, f"tuilaunch: {message}\n".encode())

    def _write_failed(self, message: str) -> None:
        """A writer of the run's files failed (a full disk): one notice, at the first failure."""
        self._say(message)

    def stop(self, sig: int = signal.SIGTERM, reason: str = "stop requested") -> None:
        """Stop the run: workers get ``sig``, then SIGKILL after the shutdown timeout.

        A second call escalates: every worker is SIGKILLed at once.
        """
        self.stopper.stop(sig, reason, done=self._done.is_set())

    def _request_restart(self) -> str | None:
        with self._lock:
            if self._phase == Phase.RUNNING and not self.stopper.requested:
                self._restart_requested = True
                return None
            return f"agent is {self._phase}"

    def _monitored(self) -> bool:
        with self._lock:
            return self._phase == Phase.RUNNING and not self.stopper.requested

    def _stop_settled(self) -> bool:
        return self._done.is_set() or self.phase in (Phase.STOPPING, *Phase.OUTCOMES)

    def _stopping(self) -> None:
        self._set_phase(Phase.STOPPING)
