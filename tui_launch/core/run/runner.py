"""Run torch's own torchrun path on a background thread, observed and steerable.

:class:`Runner` calls ``torch.distributed.run.run(args)`` (so ``--standalone``, ``-m``,
``--no-python``, ``--run-path``, ``OMP_NUM_THREADS`` and every other flag behave exactly as in
torchrun) with ``LocalElasticAgent`` swapped for a subclass (:mod:`.agent`, the torch seam)
that reports every transition to the run's :class:`~.observer.Supervisor` (the callbacks and
``monitor``, the one decision point), which posts it to the
:class:`~tui_launch.core.model.store.RunStore`. The runner creates the parts, hands each the
run's shared :class:`~.state.RunState` and :class:`~.config.RunConfig` where it needs them, and
sequences the run's start and end; each job has its own module (the package's docstring,
:mod:`tui_launch.core.run`, lists them), and the runner implements the surface the front ends
use (:class:`~.handle.RunHandle`) by forwarding each call to the part that owns it.

Threads: the agent runs on ``tuilaunch-agent``, the only thread that acts on torch. Commands
only set flags (in the :class:`~.state.RunState`) or send signals; the agent thread acts on the
flags in ``monitor`` (every ``--monitor-interval``), the one place where the run decides,
through torch's own paths (``SignalException`` for a stop, ``UNHEALTHY`` for a restart). Lock
order: the rank table's lock before the run state's.
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

from tui_launch.core.diagnosis.stacks import StackDump
from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.logs.sinks import AgentLogCapture
from tui_launch.core.logs.tail import Accepts, LineSink, PartialSink, RawSink
from tui_launch.core.model import exitcodes, failclass
from tui_launch.core.model.commands import Command, Outcome
from tui_launch.core.model.events import LogMark, Notice, RunFinished
from tui_launch.core.model.store import RunStore
from tui_launch.core.run import inject, reports
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.control import Actions, Control, ShimDir
from tui_launch.core.run.failures import error_class, run_outcome
from tui_launch.core.run.faults import FaultExecutor
from tui_launch.core.run.membership import Membership
from tui_launch.core.run.observer import Supervisor
from tui_launch.core.run.rundir import RunFiles
from tui_launch.core.run.shutdown import Stopper, signal_exit_code
from tui_launch.core.run.state import RunState
from tui_launch.core.run.watchers import Diagnosis
from tui_launch.core.seam import agent, rendezvous
from tui_launch.core.telemetry import Telemetry
from tui_launch.core.workers import reaper, stale
from tui_launch.core.workers.reaper import Reaper
from tui_launch.core.workers.table import RankTable
from tui_launch.core.workers.warm import WarmPool

SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
__all__ = ["SHARE_STORE_ENV", "Runner", "signal_exit_code"]


def _nothing() -> None:
    """A step with nothing to do (a part this run does not have)."""


class Runner:
    """One launch of torch's elastic agent, with a control API (a :class:`.handle.RunHandle`).

    The runner creates the parts, hands each what it needs (the run's shared
    :class:`~.state.RunState`, its :class:`~.config.RunConfig`, the other parts), sequences
    the run's start and end, and forwards the handle's surface to the part that owns it.

    Args:
        args: torchrun's parsed arguments (``torch.distributed.run.parse_args``).
        store: where events go.
        config: tuilaunch's settings for the run (default: those of a plain torchrun run).
        telemetry: the GPU/process sampler to run with the job (None: no telemetry).
        warm: ``--warm-start``'s spare (None: every worker starts cold, as in torchrun); the
            runner configures, replaces and closes it.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        store: RunStore,
        config: RunConfig | None = None,
        *,
        telemetry: Telemetry | None = None,
        warm: WarmPool | None = None,
    ) -> None:
        config = config if config is not None else RunConfig()
        self.args = args
        # torchrun's arguments as tuilaunch reads them, read once; torch gets ``args`` itself.
        self.torchrun = TorchrunArgs.read(args)
        self.config = config
        self.warm = warm
        self.store = store
        self.host = socket.gethostname()
        self.telemetry = telemetry
        self.reaper: Reaper | None = None  # start() contains the run
        self.state = RunState()
        self._error_class = ""  # the class of an error torch raised outside the workers
        self._thread: threading.Thread | None = None

        self.ranks = RankTable()
        self.files = RunFiles(
            self.torchrun, config.journal_path, config.echo, lambda: self.ranks.attempt + 1
        )
        self.files.journal.on_error = self._say
        self.files.agent_log.on_error = self._say
        self.shim = ShimDir(config.bootstrap, self.torchrun.no_python)
        self.diagnosis = Diagnosis(
            store, self.ranks, self.files, self.state, config, self.shim, self._rank_cpu
        )
        self.dumper = self.diagnosis.dumper  # the handle's dump_stacks and load_dump
        # The stop watchdog and a second stop end the run themselves: the runner's last steps.
        self.stopper = Stopper(
            self.torchrun, self.ranks, store.post, self.state, self._finish, config.preempt_signals
        )
        # Each part is built from parts built before it (no late binding): what acts on the
        # ranks, what a fired injection does through it, the schedule that fires it, and the
        # command front that schedules a live spec.
        self.actions = Actions(
            store.post,
            self.ranks,
            self.shim,
            self.state,
            dump=self.dumper.dump_stacks,
            stop=self.stopper.stop,
        )
        self.faults = FaultExecutor(self.actions, self.ranks, self.shim, store.post, self.state)
        self.injector = inject.Injector(config.inject, seed=config.inject_seed, target=self.faults)
        self.control = Control(self.actions, self.injector, self.ranks, self.shim, store.snapshot)
        self.membership = Membership(
            store.post, store.snapshot, self.host, self.torchrun, dumper=self.dumper
        )
        self.supervisor = Supervisor(
            self.torchrun,
            config,
            store,
            self.state,
            files=self.files,
            ranks=self.ranks,
            membership=self.membership,
            injector=self.injector,
            diagnosis=self.diagnosis,
            stopper=self.stopper,
            shim=self.shim,
            telemetry=telemetry,
            warm=warm,
        )
        self._sampler = rendezvous.Sampler(store.post, self.supervisor.rdzv_handler)
        if self.injector.uses_random:
            seed = self.injector.seed
            self.supervisor.note(
                f"inject: rank=random draws use seed {seed} (--inject-seed {seed} repeats them)"
            )

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the reaper, the log tailer and the agent thread."""
        self.store.subscribe(self.files.journal.write)
        self.files.agent_log.install(mute_console=self.config.mute_agent_console)
        agent.silence_thread_warning()
        self._fix_restarts()
        # No orphans: the run's cgroup (or subreaper + token sweep), and the reaper for when
        # the launcher dies; which one is in RunStarted's notes.
        # A launcher SIGKILLed with its reaper left its workers in its cgroup: end them.
        stale.sweep_stale()
        contained = reaper.contain(reaper.run_token())
        self.supervisor.note(contained.describe())
        self.reaper = Reaper(contained, lambda m: self.store.post(Notice("warning", m)))
        if self.warm is not None:
            self.warm.set_watch(self.reaper.watch, self.reaper.forget)
        self.files.tailer.set_mark_sink(lambda offsets: self.store.post(LogMark(offsets=offsets)))
        self.diagnosis.start()
        self.files.tailer.start()
        # Before torch's rendezvous handler exists: creating it can block a whole connect
        # timeout (a c10d store nobody serves), and the front ends say what it waits for.
        connecting = reports.connecting(self.torchrun)
        self.supervisor.begin(self.reaper, connecting)
        self.store.post(connecting)
        self._thread = threading.Thread(target=self._main, name="tuilaunch-agent", daemon=True)
        self._thread.start()
        self._sampler.start()

    def _rank_cpu(self, global_rank: int) -> float | None:
        tel = self.store.snapshot().telemetry
        for r in tel.latest.ranks if tel is not None else ():
            if r.global_rank == global_rank:
                return r.cpu
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the run to end; return its exit code (None on timeout)."""
        self.state.done.wait(timeout)
        return self.state.exit_code

    @property
    def done(self) -> bool:
        """True once the run has finished and the summary is final."""
        return self.state.done.is_set()

    @property
    def exit_code(self) -> int | None:
        """The run's exit status once done (0, 1, 2 or 128+N), else None."""
        return self.state.exit_code

    @property
    def error_message(self) -> str | None:
        """Why the run ended in an error (None: it did not)."""
        return self.state.error_message

    @property
    def phase(self) -> str:
        """Where the agent thread is, in the snapshot's words (:class:`~.store.Phase`)."""
        return self.state.phase

    def _fix_restarts(self) -> None:
        # torch >= 2.5 shares the rendezvous TCPStore with the workers; stale keys and a reused
        # MASTER_PORT can make a restart fail or hang (pytorch issues 135712, 167288): with
        # torch 2.13, 2 of 5 restarts of 2 gloo workers worked, 0 of 5 of 4 (docs/differences.md).
        if SHARE_STORE_ENV in os.environ:
            return
        os.environ[SHARE_STORE_ENV] = "1"
        self.supervisor.note(
            f"restarts: tuilaunch set {SHARE_STORE_ENV}=1 (a fresh rendezvous store per "
            "attempt; torch's shared store can make a restart of several workers fail or "
            f"hang). Opt out with {SHARE_STORE_ENV}=0."
        )

    def _main(self) -> None:
        error: BaseException | None = None
        try:
            with (
                agent.observed(self.supervisor),
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
            self.state.wake.close()  # its only waiter was this thread
            snap = self.store.snapshot()
            with contextlib.suppress(Exception):
                self._error_class = error_class(
                    error, snap.rendezvous_live, self.torchrun.nnodes, self.supervisor.connecting
                )
            self._finish(
                *run_outcome(
                    error,
                    self.state.stop_signal,
                    snap.root_cause,
                    snap.rendezvous_live,
                    self.torchrun.nnodes,
                    self.supervisor.connecting,
                )
            )

    def _warm_configure(self, count: int, boot: Any) -> None:
        # In torchrun's config_from_args, before the agent exists: a note for RunStarted.
        assert self.warm is not None
        self.supervisor.note(self.warm.configure(count, boot))

    def _hosting_by_address(self, host: str) -> None:
        # Called while torch creates the rendezvous handler, before RunStarted: a note.
        self.supervisor.note(
            f"rendezvous: this node hosts the c10d store: {host} is an address of one of its "
            f"interfaces (torch's hostname check said no; --rdzv-conf is_host=0 overrides)"
        )

    def _judge(self, outcome: str, code: int, message: str) -> tuple[str, int, str, str]:
        """The run's end in the exit-code table: (outcome, exit code, message, class).

        ``code`` is torchrun's; ``--exit-codes torchrun`` keeps it. A stop by a preemption
        signal is ``preempted``; workers that all finished their work before one crashed in
        teardown make the run ``succeeded``, saying so.
        """
        cls = ""
        if outcome == "failed" and self.supervisor.completed_in_teardown:
            outcome, message = "succeeded", self.supervisor.completed_in_teardown
            cls = failclass.TEARDOWN
        elif outcome == "stopped" and self.stopper.preempted:
            outcome, cls = "preempted", failclass.PREEMPTED
            message = f"preempted: {message}"
        elif outcome == "failed":
            root = self.store.snapshot().root_cause
            cls = root.failure_class if root is not None else ""
        elif outcome == "error" and code != 2:
            # torch raised before or between attempts (a rendezvous that never completed, a
            # store that could not be reached or was lost): the class _main found.
            cls = self._error_class
        elif outcome == "error":
            outcome = "usage"
        final = exitcodes.exit_code(outcome, cls, code, self.config.exit_codes)
        return ("error" if outcome == "usage" else outcome), final, message, cls

    def _finish(self, outcome: str, code: int, message: str) -> None:
        # Two threads may finish at once (the agent thread and the stop watchdog or a second
        # stop): the first one through here finishes, the other returns at once.
        torchrun_outcome = outcome
        outcome, code, message, cls = self._judge(outcome, code, message)
        if not self.state.claim_finish(outcome, code, message):
            return
        # Every step runs, whatever the one before raised (a full disk makes the journal's
        # and the agent log's writes fail): the front ends wait for ``done``, and a launcher
        # that never sets it can only be SIGKILLed.
        steps: list[tuple[str, Callable[[], object]]] = [
            ("log tailer", self.files.tailer.stop),
            ("diagnosis", self.diagnosis.stop),  # after the tailer: its last lines count
            ("file watch", self.files.fswatch.stop),
            ("telemetry", self.telemetry.stop if self.telemetry is not None else _nothing),
            ("injections", self.injector.close),  # nothing fires any more
            ("faults", self.faults.close),
            ("warm start", self.warm.close if self.warm is not None else _nothing),
            ("orphans", self._sweep),  # after the spare: nothing it forked is left
            ("saved", self.supervisor.note_saved),
            (
                "finish",
                lambda: self.store.post(
                    self._finished(outcome, code, message, cls, torchrun_outcome)
                ),
            ),
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
            self.state.done.set()
            self.store.wake()

    def _sweep(self) -> None:
        # Whatever the workers started and left (a child that ignored SIGTERM, one that
        # called setsid) goes with the run.
        left = self.reaper.sweep() if self.reaper is not None else 0
        if left:
            self.store.post(
                Notice("info", f"no orphans: killed {left} process(es) left by the workers")
            )

    def _finished(
        self, outcome: str, code: int, message: str, cls: str, torchrun_outcome: str
    ) -> RunFinished:
        # The run's last event; a writer that lost events to a full disk says so on its line.
        lost = [w for w in (self.files.journal.error, self.files.agent_log.error) if w]
        if lost and outcome != "succeeded" and "no space left" not in message:
            message = f"{message}; {lost[0]}"
        kind = "usage" if outcome == "error" and torchrun_outcome == "error" and code == 2 else ""
        return RunFinished(
            outcome=outcome,
            exit_code=code,
            message=message,
            failure_class=cls,
            meaning=kind or exitcodes.meaning(outcome, cls),
        )

    def _say(self, message: str) -> None:
        # The launcher's own trouble: a notice (the store never raises), and on stderr when
        # even that cannot be shown.
        try:
            self.store.post(Notice(level="error", message=message))
        except Exception:
            with contextlib.suppress(Exception):
                os.write(2, f"tuilaunch: {message}\n".encode())

    def stop(self, sig: int = signal.SIGTERM, reason: str = "stop requested") -> None:
        """Stop the run: workers get ``sig``, then SIGKILL after the shutdown timeout.

        A second call escalates: every worker is SIGKILLed at once.
        """
        self.stopper.stop(sig, reason)

    # ------------------------------------------------------------------ what the run shows

    @property
    def agent_log(self) -> AgentLogCapture:
        """The agent's log capture (torch's and c10d's records, the launcher's stderr)."""
        return self.files.agent_log

    @property
    def run_dir(self) -> str | None:
        """The run's log directory (None until torch made it; always set once done)."""
        return self.files.run_dir

    @property
    def journal_path(self) -> str | None:
        """Where the journal is written."""
        return self.files.journal.path

    @property
    def cluster_interval(self) -> float | None:
        """Seconds between two cluster-view records (None: no cluster view)."""
        return self.membership.cluster_interval

    def add_log_sink(
        self, sink: LineSink, lossy: bool = False, accepts: Accepts | None = None
    ) -> None:
        """Give ``sink`` every batch of worker lines (``lossy``: a view that may skip)."""
        self.files.tailer.add_sink(sink, lossy=lossy, accepts=accepts)

    def add_raw_sink(self, sink: RawSink, accepts: Accepts | None = None) -> None:
        """Give ``sink`` each new byte range of the worker streams it accepts."""
        self.files.tailer.add_raw_sink(sink, accepts=accepts)

    def add_partial_sink(self, sink: PartialSink) -> None:
        """Give ``sink`` each worker stream's unterminated text whenever it changes."""
        self.files.tailer.add_partial_sink(sink)

    def agent_lines(self) -> list[str]:
        """The agent's most recent log lines, oldest first."""
        return list(self.files.agent_log.recent)

    def before_exit(self, hook: Callable[[], None], first: bool = False) -> None:
        """Call ``hook`` just before a ``node`` injection SIGKILLs the launcher."""
        hooks = self.actions.before_exit
        hooks.insert(0, hook) if first else hooks.append(hook)

    # ------------------------------------------------------------------ control API

    def execute(self, cmd: Command) -> Outcome:
        """Carry out ``cmd`` if the run's state allows it (see :meth:`Control.execute`)."""
        return self.control.execute(cmd)

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch has stopped this rank and not continued it."""
        return self.control.is_stopped(local_rank)

    def inject_refusal(self, kind: str) -> str | None:
        """Why this run can never inject ``kind``; None when it can."""
        return self.shim.refusal(kind)

    def attempt_alive(self, attempt: int) -> bool:
        """Whether ``attempt`` is the current one and still being monitored (not ending)."""
        return self.faults.attempt_alive(attempt)

    def stack_dump(self, path: str) -> StackDump | None:
        """The dump kept at ``path``."""
        return self.dumper.load(path)
