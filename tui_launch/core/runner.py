"""Run torch's own torchrun path on a background thread, observed and steerable.

:class:`Runner` calls ``torch.distributed.run.run(args)`` (so ``--standalone``, ``-m``,
``--no-python``, ``--run-path``, ``OMP_NUM_THREADS`` and every other flag behave exactly as in
torchrun) with ``LocalElasticAgent`` swapped for a subclass (:mod:`.agent`, the torch seam)
that reports every transition to the runner, which posts it to the
:class:`~tui_launch.core.store.RunStore`. The runner wires the parts and sequences them; each
job has its own module:

- :mod:`.workers`: the rank table (pids, exits, stopped ranks, marks) and its lock;
- :mod:`.control`: the control API (signal, kill, stop, continue, restart, orders, node);
- :mod:`.dumps`: stack dumps of the ranks (``dump_stacks``, before teardown, for a hang);
- :mod:`.hangwatch`: silence on every rank, two dumps that match, ``--on-hang``;
- :mod:`.faults`: what a fired injection does;
- :mod:`.membership`: rounds, lost nodes and the cluster view;
- :mod:`.failures`: an attempt's failures, from what torch and the rank table say;
- :mod:`.shutdown`: stopping the run, and the watchdog for when torch cannot be reached;
- :mod:`.rundir`: the run directory and the log wiring;
- :mod:`.reports`: torch's objects as events;
- :mod:`.warm`: ``--warm-start``'s spare interpreters (handed to torch through the seam);
- :mod:`.handle`: the surface the front ends use (:class:`~.handle.RunHandle`).

Threads: the agent runs on ``tuilaunch-agent``. Commands only set flags or send signals; the
agent thread acts on flags in :meth:`Runner.monitor` (every ``--monitor-interval``), the one
place where the runner decides, through torch's own paths (``SignalException`` for a stop,
``UNHEALTHY`` for a restart).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tui_launch.core import agent, inject, rendezvous, reports
from tui_launch.core.agent import RunResult, TorchAgent, WorkerGroup, WorkerSpec
from tui_launch.core.control import Control, ShimDir
from tui_launch.core.dumps import Dumper
from tui_launch.core.events import (
    AttemptFailed,
    Connecting,
    ExitBarrier,
    GroupState,
    HangDetected,
    LogMark,
    Notice,
    RunFinished,
    StacksDumped,
    WorkersStarted,
)
from tui_launch.core.failures import collect_failures, hang_failures, run_outcome, with_peers
from tui_launch.core.faults import FaultExecutor
from tui_launch.core.handle import PartsHandle
from tui_launch.core.hangwatch import HangWatch
from tui_launch.core.logspecs import CapturingLogsSpecs
from tui_launch.core.membership import Membership, elastic, failed_here
from tui_launch.core.progress.straggler import StragglerSampler
from tui_launch.core.progress.watch import ProgressWatch
from tui_launch.core.reaper import Reaper
from tui_launch.core.rundir import RunFiles
from tui_launch.core.shim import FAULTHANDLER_ENV, FAULTHANDLER_SIGNAL
from tui_launch.core.shutdown import Stopper, signal_exit_code
from tui_launch.core.store import Phase, RunStore
from tui_launch.core.telemetry import RankTarget, Telemetry
from tui_launch.core.warm import WarmPool
from tui_launch.core.workers import RankTable

SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
__all__ = ["SHARE_STORE_ENV", "Runner", "signal_exit_code"]


class Runner(PartsHandle):
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
        warm: ``--warm-start``'s spares (None: every worker starts cold, as in torchrun); the
            runner configures, refills and closes them.
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
        self.injector = injector or inject.Injector()
        self.shim = ShimDir(
            inject_ready or dump_via_faulthandler or inject.needs_shim(self.injector.specs),
            bool(getattr(args, "no_python", False)),
        )
        self._faulthandler = dump_via_faulthandler and self.shim.wanted
        self._dump_on_failure = dump_on_failure
        self._hang: HangDetected | None = None  # a confirmed hang for monitor to act on
        self.dumper = Dumper(
            store.post,
            self.ranks,
            self._ensured_run_dir,
            lambda: dict(self.files.stderr_paths),
            via_faulthandler=self._faulthandler,
        )
        self.hangs = HangWatch(
            store.post,
            self.dumper,
            lambda: dict(self.files.log_paths),
            self._monitored,
            timeout=hang_timeout,
            action=on_hang,
            on_hang=self._hang_confirmed,
        )
        self.control = Control(store.post, self.ranks, self.shim, self._request_restart)
        self.faults = FaultExecutor(
            self.injector, self.ranks, self.control, self.shim, store.post, self._monitored
        )
        self.injector.bind(self.faults)
        self.membership = Membership(store.post, store.snapshot, self.host, args)
        self.stopper = Stopper(
            args, self.ranks, store.post, self._finish, self._stop_settled, self._stopping
        )
        self._sampler = rendezvous.Sampler(store.post, self._handler)
        # Progress from the workers' logs (issue 15): steps, rate, ETA, slowdowns, goodput.
        self.progress = ProgressWatch(store.post)
        self.stragglers = StragglerSampler(store.post, self._rank_cpu, interval=stack_samples)
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
        self.reaper = Reaper()
        if self.warm is not None:
            self.warm.set_watch(self.reaper.watch, self.reaper.forget)
        self.files.tailer.set_mark_sink(lambda offsets: self.store.post(LogMark(offsets=offsets)))
        if self._faulthandler:
            # Inherited by the workers: the bootstrap registers faulthandler on this signal.
            os.environ[FAULTHANDLER_ENV] = str(int(FAULTHANDLER_SIGNAL))
        if self.hangs.enabled:
            self.files.tailer.add_sink(self.hangs.sink, lossy=True)
            self.hangs.start()
        self.store.subscribe(self.progress.on_event)
        # lossy: progress needs the newest lines, not every line of a flood.
        self.files.tailer.add_sink(self.progress.on_lines, lossy=True)
        # tqdm's bars rewrite one line with \r and end it only at close: the unterminated text.
        self.files.tailer.add_partial_sink(self.progress.on_partial)
        self.progress.start()
        self.stragglers.start()
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

    def _set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase = phase

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
                agent.warm_handlers(self.warm.hand_off if self.warm is not None else None),
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
        self.hangs.stop()
        self.files.tailer.stop()
        self.progress.stop()  # after the tailer: its last lines are in the last record
        self.stragglers.stop()
        if self.telemetry is not None:
            self.telemetry.stop()
        self.faults.close()
        if self.warm is not None:
            self.warm.close()
        self.store.post(RunFinished(outcome=outcome, exit_code=code, message=message))
        self._sampler.stop()
        self.membership.stop()  # one last cluster record: the outcome, for the other nodes
        self.files.ensure_run_dir()
        self.files.journal.close()
        if self.reaper is not None:
            self.reaper.close()
        self.files.agent_log.uninstall()
        self._done.set()
        self.store.wake()

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

    def _ensured_run_dir(self) -> str:
        self.files.ensure_run_dir()
        return self.files.run_dir or "."

    def _hang_confirmed(self, event: HangDetected) -> None:
        # On the hang watch's thread: the agent thread acts on it at its next monitor tick.
        if event.action in ("restart", "stop"):
            with self._lock:
                self._hang = event

    def _monitored(self) -> bool:
        with self._lock:
            return self._phase == Phase.RUNNING and not self.stopper.requested

    def _stop_settled(self) -> bool:
        return self._done.is_set() or self.phase in (Phase.STOPPING, *Phase.OUTCOMES)

    def _stopping(self) -> None:
        self._set_phase(Phase.STOPPING)

    # ----------------------------------------------------------------- agent observer

    def wrap_logs_specs(self, logs_specs: Any, spec: WorkerSpec) -> CapturingLogsSpecs:
        """Wrap the user's ``LogsSpecs`` so every rank's output lands in files."""
        return self.files.wrap_logs_specs(logs_specs, spec)

    def check_stop(self) -> None:
        """On the agent thread: leave through torch's own path once a stop was asked for."""
        self.stopper.check_stop()

    def on_agent_created(self, agent_obj: TorchAgent) -> None:
        """Post ``RunStarted`` (and the notes); start the telemetry."""
        self._agent = agent_obj
        spec = agent.worker_group(agent_obj).spec
        started = reports.run_started(spec, self.args, self.host, self._notes)
        launched = self._connecting.mono if self._connecting is not None else None
        self.store.post(dataclasses.replace(started, launched_mono=launched))
        for note in self._notes:
            self.store.post(Notice(level="info", message=note))
        if self.telemetry is not None:
            self.telemetry.start()  # after RunStarted: the journal begins with it

    def on_rendezvous(self, agent_obj: TorchAgent) -> None:
        """A round begins."""
        self._set_phase(Phase.RENDEZVOUS)
        self._rdzv_t0 = time.monotonic()
        handler = agent.rdzv_handler(agent_obj)
        self.store.post(reports.rendezvous_started(handler, self.args, self.ranks.attempt + 1))

    def on_rendezvous_done(self, agent_obj: TorchAgent, wg: WorkerGroup) -> None:
        """The round is complete: post it, note the members, check ``--inject`` ranks."""
        handler = wg.spec.rdzv_handler
        live = rendezvous.sample(handler)
        next_attempt = self.ranks.attempt + 1
        duration = time.monotonic() - self._rdzv_t0
        self.store.post(reports.rendezvous_completed(wg, live, self.args, next_attempt, duration))
        self.membership.note(int(wg.group_world_size), live, next_attempt)
        if wg.workers:
            # Ranks in --inject can only be checked once the world size is known; stop here,
            # before any worker starts (exit status 2, as for any bad input).
            inject.check_world_size(self.injector.cli_specs, int(wg.workers[0].world_size))
        self._set_phase(Phase.STARTING)
        self.membership.start_cluster_view(handler)

    def on_workers_started(
        self, agent_obj: TorchAgent, wg: WorkerGroup, pids: dict[int, int]
    ) -> None:
        """A new attempt runs: reset the rank table, post the workers, arm the injections."""
        world = int(wg.workers[0].world_size) if wg.workers else 0
        attempt = self.ranks.begin_attempt(
            {lr: int(p) for lr, p in pids.items()},
            {w.local_rank: w.global_rank for w in wg.workers},
            world,
        )
        self._last_group_state = "HEALTHY"
        if self.reaper is not None:
            for pid in pids.values():
                self.reaper.watch(pid)
        agent.hook_close(agent_obj, lambda: self._before_close(agent_obj))
        workers = reports.workers(wg, pids)
        self.store.post(
            WorkersStarted(attempt=attempt, workers=workers, log_dir=self.files.attempt_dir)
        )
        if self.telemetry is not None:
            self.telemetry.set_workers(
                attempt, (RankTarget(w.local_rank, w.global_rank, w.pid) for w in workers)
            )
        self.hangs.attempt_started(attempt, {w.local_rank: w.global_rank for w in wg.workers})
        self.stragglers.set_workers(attempt, [(w.global_rank, w.pid) for w in workers])
        self._set_phase(Phase.RUNNING)
        self.injector.attempt_started(
            attempt, {w.global_rank: w.local_rank for w in wg.workers}, world
        )
        if self.warm is not None:  # which ranks run in spares; the spares used are replaced
            self.store.post(Notice(level="info", message=self.warm.attempt_started(attempt, pids)))

    def _before_close(self, agent_obj: TorchAgent) -> None:
        # Exits seen before torch's first signal are the ranks' own (not collateral).
        seen = self._poll_exits(agent_obj, by_agent=False)
        if any(code not in (0, None) for code in seen.values()) and not self.stopper.requested:
            # torch's poll found a failed rank and is about to terminate the others.
            self._dump_survivors()
        self.ranks.continue_stopped()

    def monitor(
        self, agent_obj: TorchAgent, wg: WorkerGroup, inner: Callable[[WorkerGroup], RunResult]
    ) -> RunResult:
        """One monitor tick, the runner's one decision point: stop, manual restart, torch's
        own check, lost nodes, failures."""
        self._set_phase(Phase.RUNNING)
        self.check_stop()
        with self._lock:
            manual, self._restart_requested = self._restart_requested, False
            hang, self._hang = self._hang, None
        if hang is not None and hang.attempt == self.ranks.attempt:
            return self._hang_failure(agent_obj, hang)
        if manual:
            # Raise the budget by one before torch spends one: the restart count and
            # attempt_N advance, the failure budget does not.
            agent.give_back_restart(agent_obj, wg)
            self._pending_cause = "manual"
            self._post_group_state("UNHEALTHY")
            return agent.unhealthy()

        seen = self._poll_exits(agent_obj, by_agent=False)
        if any(code != 0 for code in seen.values()):
            self.ranks.continue_stopped()  # torch is about to SIGTERM the peers
        result = inner(wg)
        state = agent.state_name(result)
        handler = wg.spec.rdzv_handler
        if state in ("FAILED", "SUCCEEDED"):
            self.injector.attempt_ended(self.ranks.attempt)
        if state == "HEALTHY":
            lost = self.membership.node_lost(handler)
            if lost:
                # torch would wait on these workers until their collectives time out.
                self._membership_restart(agent_obj, wg, lost)
                return agent.unhealthy()
        if state == "FAILED":
            self._poll_exits(agent_obj, by_agent=True)
            # Before torch terminates the survivors (torch's poll may have begun already:
            # _before_close dumped them then): where was every other rank?
            peers = self._dump_survivors()
            failures = collect_failures(
                reported=result.failures,
                workers=wg.workers,
                ranks=self.ranks.view(),
                error_files=self.files.error_files,
                stderr_paths=self.files.stderr_paths,
                host=self.host,
            )
            if peers is not None:
                failures = with_peers(failures, peers)
            self.files.tailer.drain()
            self.store.post(AttemptFailed(attempt=self.ranks.attempt, failures=failures))
            self._pending_cause = "failure"
            # A rank of this node failed by itself: this node is alive and the failure is real.
            # Re-rendezvous at once (no lost-node wait): the other nodes, which only saw their
            # collectives break, see this node on the wait list and restart too.
            multi = elastic(self.args.nnodes) and self.membership.group_world > 1
            if multi and not failed_here(failures):
                lost = self.membership.wait_node_loss(handler, lambda: self.stopper.requested)
                if lost:
                    self._membership_restart(agent_obj, wg, lost)
        elif state == "SUCCEEDED":
            self._poll_exits(agent_obj, by_agent=False)
        self._post_group_state(state)
        return result

    def _dump_survivors(self) -> StacksDumped | None:
        """Dump the ranks still alive in a failed group (once per attempt, about a second)."""
        if not self._dump_on_failure:
            return None
        return self.dumper.survivors(self.ranks.attempt)

    def _hang_failure(self, agent_obj: TorchAgent, hang: HangDetected) -> RunResult:
        """``--on-hang restart|stop``: fail the group as a crash would, the hang its cause."""
        failures = hang_failures(hang, self.ranks.view(), self.host)
        self.store.post(AttemptFailed(attempt=hang.attempt, failures=failures))
        self._pending_cause = "failure"
        if hang.action == "stop":
            agent.spend_restarts(agent_obj)
        self._post_group_state("FAILED")
        return agent.failed({f.global_rank: (f.local_rank, f.pid) for f in failures})

    def _membership_restart(self, agent_obj: TorchAgent, wg: WorkerGroup, lost: list[str]) -> None:
        self.membership.restart(agent_obj, wg, lost)
        self._pending_cause = "membership"
        self._post_group_state("UNHEALTHY")

    def _post_group_state(self, state: str) -> None:
        if state != self._last_group_state:
            self._last_group_state = state
            self.store.post(GroupState(attempt=self.ranks.attempt, state=state))

    def _poll_exits(self, agent_obj: TorchAgent, by_agent: bool) -> dict[int, int]:
        """Record ranks that have exited since the last poll; return all exits seen so far."""
        codes = agent.exit_codes(agent.pcontext(agent_obj))
        new, seen = self.ranks.record_exits(codes, by_agent)
        for x in new:
            if self.reaper is not None:
                self.reaper.forget(x.pid)
            self.store.post(reports.rank_exited(x, self.ranks.attempt))
        return seen

    def on_restart(self, agent_obj: TorchAgent, wg: WorkerGroup) -> None:
        """torch restarts the group: post why, and what is left of the failure budget."""
        attempt = self.ranks.attempt
        self.injector.attempt_ended(attempt)
        cause = self._pending_cause or "membership"
        self._pending_cause = None
        if cause == "failure":
            self._failure_restarts += 1
        self._set_phase(Phase.RESTARTING)
        budget_left = max(0, self._user_max_restarts - self._failure_restarts)
        self.store.post(reports.restart(cause, attempt, budget_left))

    def on_shutdown(self) -> None:
        """torch terminates the workers: stopped ranks must run to be able to die."""
        self.ranks.continue_stopped()

    def on_workers_stopped(self, agent_obj: TorchAgent) -> None:
        """The workers are gone: record the last exits, close the attempt's logs."""
        attempt = self.ranks.attempt
        self.injector.attempt_ended(attempt)
        self._poll_exits(agent_obj, by_agent=True)
        if attempt >= 0:
            self.files.tailer.close_attempt(attempt)

    def on_exit_barrier(self, done: bool) -> None:
        """The agent waits for the other nodes to finish (or is done waiting)."""
        self._set_phase(Phase.FINISHING)
        self.store.post(ExitBarrier(attempt=self.ranks.attempt, done=done))
