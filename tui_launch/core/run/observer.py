"""What the run does at each of the agent's transitions, and its one decision point.

:class:`Supervisor` is the :class:`~tui_launch.core.seam.agent.AgentObserver` that the
:class:`~tui_launch.core.run.runner.Runner` creates and hands to the seam: torch's agent calls
its methods on the ``tuilaunch-agent`` thread as it creates the agent, rendezvouses, starts,
monitors, restarts and stops the workers. :meth:`Supervisor.monitor` runs every
``--monitor-interval`` and is where the run decides: a stop, a manual restart, a confirmed
hang, torch's own check, lost nodes, failures, always through torch's own paths
(``SignalException`` for a stop, ``UNHEALTHY`` for a restart). It owns the agent thread's
state (the pending restart cause, the failure count, the notes); the phase and the requests
it takes are in the run's shared :class:`~tui_launch.core.run.state.RunState`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.model import errors
from tui_launch.core.model.events import (
    AttemptFailed,
    Connecting,
    ExitBarrier,
    Failure,
    GroupState,
    HangDetected,
    Notice,
    PolicyDecision,
    WorkersSaved,
    WorkersStarted,
)
from tui_launch.core.model.policy import RestartPolicy, attempt_record
from tui_launch.core.model.store import Phase, RunStore
from tui_launch.core.run import inject, reports
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.control import ShimDir
from tui_launch.core.run.failures import classified, collect_failures, hang_failures, with_peers
from tui_launch.core.run.membership import Membership, failed_here
from tui_launch.core.run.rundir import RunFiles
from tui_launch.core.run.shutdown import Stopper
from tui_launch.core.run.state import RunState
from tui_launch.core.run.wake import IDLE_PERIOD
from tui_launch.core.run.watchers import Diagnosis
from tui_launch.core.seam import agent, rendezvous
from tui_launch.core.seam.agent import RunResult, TorchAgent, WorkerGroup, WorkerSpec
from tui_launch.core.seam.logspecs import CapturingLogsSpecs
from tui_launch.core.telemetry import RankTarget, Telemetry
from tui_launch.core.workers import shim
from tui_launch.core.workers.oom import OomWatch
from tui_launch.core.workers.reaper import Reaper
from tui_launch.core.workers.table import RankTable
from tui_launch.core.workers.warm import WarmPool

# How long an exit waits for the tailer to hand on what the rank wrote before it (the tailer is
# woken at once; only a blocked console or a flood makes it take longer).
EXIT_OUTPUT_WAIT = 0.25
# How long the exit status of a rank that is gone may take to reach torch's Popen.
EXIT_READ_SECONDS = 5.0


class Supervisor:
    """The agent's observer (:class:`~tui_launch.core.seam.agent.AgentObserver`): what the run
    does at each of torch's transitions, and the agent thread's own state.

    Args:
        torchrun: torchrun's arguments, read once (torch's namespace in ``namespace``).
        config: tuilaunch's settings for the run (its restart policy, its Slurm job, the
            notes said with ``RunStarted``).
        store: where events go.
        state: the run's shared state (the phase it moves on, the requests it takes).
        files: the run's files (logs, error files, the tailer).
        ranks: the rank table.
        membership: rounds, lost nodes and the cluster view (and this node's host name).
        injector: the injection schedule (armed per attempt).
        diagnosis: the watchers (hangs to act on, survivors to dump).
        stopper: the stop request's way out through torch.
        shim: the worker bootstrap's directory, where a worker whose main returned leaves
            its marker (no directory: no bootstrap, no markers).
        telemetry: the GPU/process sampler (None: none).
        warm: ``--warm-start``'s spare (None: cold starts).

    Its own state (the pending cause, the failure count, the notes...) is the agent thread's:
    set up before that thread starts, then read and written only by it (the rendezvous sampler
    reads the agent, once set, through :meth:`rdzv_handler`).
    """

    def __init__(
        self,
        torchrun: TorchrunArgs,
        config: RunConfig,
        store: RunStore,
        state: RunState,
        *,
        files: RunFiles,
        ranks: RankTable,
        membership: Membership,
        injector: inject.Injector,
        diagnosis: Diagnosis,
        stopper: Stopper,
        shim: ShimDir,
        telemetry: Telemetry | None,
        warm: WarmPool | None,
    ) -> None:
        self._torchrun = torchrun
        self._args = torchrun.namespace
        self._store = store
        self._host = membership.host
        self._state = state
        self._files = files
        self._ranks = ranks
        self._membership = membership
        self._injector = injector
        self._diagnosis = diagnosis
        self._stopper = stopper
        self._telemetry = telemetry
        self._warm = warm
        self._slurm_job = config.slurm_job
        self._policy = RestartPolicy(config.policy)
        self._shim = shim  # the bootstrap's directory: its main-returned markers
        self._oom = OomWatch()
        # Set when the policy ends the run because every rank's main returned: the outcome.
        self.completed_in_teardown: str | None = None
        self._reaper: Reaper | None = None  # set by begin(): the run's containment
        self._connecting: Connecting | None = None
        self._agent: TorchAgent = None
        self._pending_cause: str | None = None  # why the next restart happens
        self._failure_restarts = 0
        self._user_max_restarts = torchrun.max_restarts
        self._rdzv_t0 = 0.0
        self._last_group_state: str | None = None
        self._no_exit = False  # the last look for exits found none possible (waitid)
        self._notes: tuple[str, ...] = tuple(config.notes)  # said with RunStarted

    def note(self, text: str) -> None:
        """Add a note for ``RunStarted`` (before the agent exists)."""
        self._notes += (text,)

    def begin(self, reaper: Reaper | None, connecting: Connecting) -> None:
        """Before the agent thread starts: the reaper that watches the workers, and what the
        run connects to (its time is the launch's)."""
        self._reaper = reaper
        self._connecting = connecting
        cgroup = reaper.cgroup if reaper is not None else None
        self._oom = OomWatch(cgroup)

    @property
    def connecting(self) -> Connecting | None:
        """What the run connected to (an error before the agent existed names it)."""
        return self._connecting

    def rdzv_handler(self) -> Any:
        """torch's rendezvous handler, once the agent exists (else None)."""
        return agent.rdzv_handler(self._agent) if self._agent is not None else None

    def wrap_logs_specs(self, logs_specs: Any, spec: WorkerSpec) -> CapturingLogsSpecs:
        """Wrap the user's ``LogsSpecs`` so every rank's output lands in files."""
        return self._files.wrap_logs_specs(logs_specs, spec)

    def check_stop(self) -> None:
        """Leave through torch's own path once a stop was asked for."""
        self._stopper.check_stop()

    def on_agent_created(self, agent_obj: TorchAgent) -> None:
        """Post ``RunStarted`` (and the notes); start the telemetry."""
        self._agent = agent_obj
        spec = agent.worker_group(agent_obj).spec
        started = reports.run_started(spec, self._args, self._host, self._notes)
        launched = self._connecting.mono if self._connecting is not None else None
        self._store.post(
            dataclasses.replace(started, launched_mono=launched, slurm_job=self._slurm_job)
        )
        for note in self._notes:
            self._store.post(Notice(level="info", message=note))
        if self._telemetry is not None:
            self._telemetry.start()  # after RunStarted: the journal begins with it

    def on_rendezvous(self, agent_obj: TorchAgent) -> None:
        """A round begins."""
        self._state.set_phase(Phase.RENDEZVOUS)
        self._rdzv_t0 = time.monotonic()
        handler = agent.rdzv_handler(agent_obj)
        self._store.post(reports.rendezvous_started(handler, self._args, self._ranks.attempt + 1))

    def on_rendezvous_done(self, agent_obj: TorchAgent, wg: WorkerGroup) -> None:
        """The round is complete: post it, note the members, check ``--inject`` ranks."""
        handler = wg.spec.rdzv_handler
        live = rendezvous.sample(handler)
        next_attempt = self._ranks.attempt + 1
        duration = time.monotonic() - self._rdzv_t0
        self._store.post(reports.rendezvous_completed(wg, live, self._args, next_attempt, duration))
        self._membership.note(int(wg.group_world_size), live, next_attempt)
        if wg.workers:
            # Ranks in --inject can only be checked once the world size is known; stop here,
            # before any worker starts (exit status 2, as for any bad input).
            inject.check_world_size(self._injector.cli_specs, int(wg.workers[0].world_size))
        self._state.set_phase(Phase.STARTING)
        self._membership.start_cluster_view(handler)

    def on_workers_started(
        self, agent_obj: TorchAgent, wg: WorkerGroup, pids: dict[int, int]
    ) -> None:
        """A new attempt runs: reset the rank table, post the workers, arm the injections."""
        world = int(wg.workers[0].world_size) if wg.workers else 0
        attempt = self._ranks.begin_attempt(
            {lr: int(p) for lr, p in pids.items()},
            {w.local_rank: w.global_rank for w in wg.workers},
            world,
        )
        self._last_group_state = "HEALTHY"
        self._oom.attempt_started()
        if self._reaper is not None:
            for pid in pids.values():
                self._reaper.watch(pid)
        self._state.wake.watch(int(p) for p in pids.values())
        agent.hook_close(agent_obj, lambda: self._before_close(agent_obj))
        workers = reports.workers(wg, pids)
        self._store.post(
            WorkersStarted(attempt=attempt, workers=workers, log_dir=self._files.attempt_dir)
        )
        if self._telemetry is not None:
            self._telemetry.set_workers(
                attempt, (RankTarget(w.local_rank, w.global_rank, w.pid) for w in workers)
            )
        self._diagnosis.attempt_started(attempt, workers)
        self._state.set_phase(Phase.RUNNING)
        self._injector.attempt_started(
            attempt, {w.global_rank: w.local_rank for w in wg.workers}, world
        )
        if self._warm is not None:  # which ranks were forked warm; a dead spare is replaced
            self._store.post(
                Notice(level="info", message=self._warm.attempt_started(attempt, pids))
            )

    def _before_close(self, agent_obj: TorchAgent) -> None:
        # Exits seen before torch's first signal are the ranks' own (not collateral).
        seen = self._poll_exits(agent_obj, by_agent=False)
        try:
            if (
                any(code not in (0, None) for code in seen.values())
                and not self._state.stop_requested
            ):
                # torch's poll found a failed rank and is about to terminate the others.
                self._diagnosis.dump_survivors(self._ranks.attempt)
        except Exception as e:
            self._store.post(Notice(level="error", message=f"stack dump: {e}"))
        self._ranks.continue_stopped()

    def monitor(
        self, agent_obj: TorchAgent, wg: WorkerGroup, inner: Callable[[WorkerGroup], RunResult]
    ) -> RunResult:
        """One monitor tick, the runner's one decision point: stop, manual restart, torch's
        own check, lost nodes, failures.

        A tick that finds nothing to act on then waits (up to :data:`~.wake.IDLE_PERIOD` in
        all, torch's sleep included) for a worker's exit or a request, so that an idle agent
        loop ticks about once a second, not ten times."""
        self._state.set_phase(Phase.RUNNING)
        self._stopper.check_stop()
        manual = self._state.take_restart()
        hang = self._diagnosis.take_hang(self._ranks.attempt)
        if hang is not None:
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
            self._ranks.continue_stopped()  # torch is about to SIGTERM the peers
        # No worker can have exited since the last look: torch's answer is HEALTHY, without
        # its own poll of every worker (most of what an idle monitor loop costs).
        quiet = agent.quiet_result(agent_obj) if self._no_exit else None
        result = quiet if quiet is not None else inner(wg)
        state = agent.state_name(result)
        handler = wg.spec.rdzv_handler
        if state in ("FAILED", "SUCCEEDED"):
            self._injector.attempt_ended(self._ranks.attempt)
        if state == "HEALTHY":
            lost = self._membership.node_lost(handler)
            if lost:
                # torch would wait on these workers until their collectives time out.
                self._membership_restart(agent_obj, wg, lost)
                return agent.unhealthy()
        if state == "FAILED":
            self._poll_exits(agent_obj, by_agent=True)
            # Before torch terminates the survivors (torch's poll may have begun already:
            # _before_close dumped them then): where was every other rank?
            peers = self._diagnosis.dump_survivors(self._ranks.attempt)
            failures = collect_failures(
                reported=result.failures,
                workers=wg.workers,
                ranks=self._ranks.view(),
                error_files=self._files.error_files,
                stderr_paths=self._files.stderr_paths,
                host=self._host,
            )
            if peers is not None:
                failures = with_peers(failures, peers)
            self._files.tailer.drain()
            failures = self._classify(failures)
            self._store.post(AttemptFailed(attempt=self._ranks.attempt, failures=failures))
            self._pending_cause = "failure"
            self._decide(agent_obj, failures, self._ranks.view().exits)
            # A rank of this node failed by itself: this node is alive and the failure is real.
            # Re-rendezvous at once (no lost-node wait): the other nodes, which only saw their
            # collectives break, see this node on the wait list and restart too.
            multi = self._torchrun.elastic and self._membership.group_world > 1
            if multi and not failed_here(failures):
                lost = self._membership.wait_node_loss(handler, lambda: self._state.stop_requested)
                if lost:
                    self._membership_restart(agent_obj, wg, lost)
        elif state == "SUCCEEDED":
            self._poll_exits(agent_obj, by_agent=False)
        self._post_group_state(state)
        if quiet is not None and state == "HEALTHY":
            # Before torch's own sleep, not after it: exits that come together (a rank and
            # the peer whose collective it broke) are still seen in one look, as at torch's
            # pace, and not the first alone the moment it lands.
            self._state.wake.wait(IDLE_PERIOD - self._torchrun.monitor_interval)
        return result

    def _hang_failure(self, agent_obj: TorchAgent, hang: HangDetected) -> RunResult:
        """``--on-hang restart|stop``: fail the group as a crash would, the hang its cause."""
        failures = hang_failures(hang, self._ranks.view(), self._host)
        self._diagnosis.hangs.attempt_ending()
        # End the attempt's ranks now, as torch's stop would next (SIGTERM and SIGCONT, SIGKILL
        # after the grace), so that the failure carries the exit the hung rank really had,
        # not the 0 of a process that had not exited yet.
        self._ranks.kill_all(signal.SIGTERM, grace=self._torchrun.shutdown_timeout)
        # A dead rank's status is read by torch's Popen, which may be a moment behind /proc
        # (another thread in its wait() holds the status until it returns).
        deadline = time.monotonic() + EXIT_READ_SECONDS
        exits = self._poll_exits(agent_obj, by_agent=True)
        while any(f.local_rank not in exits for f in failures) and time.monotonic() < deadline:
            time.sleep(0.02)
            exits = self._poll_exits(agent_obj, by_agent=True)
        failures = tuple(
            dataclasses.replace(f, exit_code=code, signal=errors.signal_name(code))
            if (code := exits.get(f.local_rank)) is not None
            else f
            for f in failures
        )
        self._store.post(AttemptFailed(attempt=hang.attempt, failures=failures))
        self._pending_cause = "failure"
        if hang.action == "stop":
            agent.spend_restarts(agent_obj)
        else:
            self._decide(agent_obj, failures, {})
        self._post_group_state("FAILED")
        return agent.failed({f.global_rank: (f.local_rank, f.pid) for f in failures})

    def _classify(self, failures: tuple[Failure, ...]) -> tuple[Failure, ...]:
        """Each failure's class, with the step its rank was at and the bootstrap's markers."""
        marks = self._shim.path
        # A fresh progress sample: the lines just drained, not the last 1 Hz tick's.
        with contextlib.suppress(Exception):
            self._diagnosis.progress.tick()
        progress = self._store.snapshot().progress
        attempt = self._ranks.attempt
        steps: dict[int, int | None] = {}
        for f in failures:
            r = progress.rank(f.global_rank, attempt) if progress is not None else None
            steps[f.global_rank] = r.step if r is not None else None

        def returned(pid: int) -> bool:
            return marks is not None and os.path.exists(shim.returned_path(marks, pid))

        return classified(failures, steps, returned, self._oom.since_start)

    def _attempt_step(self, attempt: int) -> int | None:
        progress = self._store.snapshot().progress
        if progress is None:
            return None
        sample = progress.latest if progress.latest.attempt == attempt else None
        sample = sample or progress.attempt(attempt)
        return sample.steps_reached if sample is not None else None

    def _decide(
        self, agent_obj: TorchAgent, failures: tuple[Failure, ...], exits: Mapping[int, int]
    ) -> None:
        """The restart policy's decision for this attempt: a line in the log, an event, and
        torch's budget spent when it says stop (torch then stops the workers its own way)."""
        attempt = self._ranks.attempt
        rec = attempt_record(
            attempt,
            failures,
            time=time.time(),
            step=self._attempt_step(attempt),
            exits=exits,
            local_ranks=self._ranks.view().pids,
        )
        if rec is None:
            return
        real = [f for f in failures if not f.collateral]
        cls = rec.cls
        left = agent.remaining_restarts(self._agent if self._agent is not None else agent_obj)
        decision = self._policy.decide(rec, left)
        saved = left if decision.action == "stop" else 0
        if decision.action == "stop":
            agent.spend_restarts(agent_obj)
            if decision.rule == "teardown":
                who = ", ".join(str(f.global_rank) for f in real)
                what = errors.describe_exit(real[0].exit_code) if real else ""
                self.completed_in_teardown = (
                    f"completed; rank {who} crashed in teardown ({what}) after its main returned"
                )
        self._store.post(
            PolicyDecision(
                attempt=attempt,
                action=decision.action,
                rule=decision.rule,
                reason=decision.reason,
                failure_class=cls,
                saved=saved,
                step=rec.step,
            )
        )

    def _membership_restart(self, agent_obj: TorchAgent, wg: WorkerGroup, lost: list[str]) -> None:
        self._membership.restart(agent_obj, wg, lost)
        self._pending_cause = "membership"
        self._post_group_state("UNHEALTHY")

    def _post_group_state(self, state: str) -> None:
        if state != self._last_group_state:
            self._last_group_state = state
            self._store.post(GroupState(attempt=self._ranks.attempt, state=state))

    def _poll_exits(self, agent_obj: TorchAgent, by_agent: bool) -> dict[int, int]:
        """Record ranks that have exited since the last poll; return all exits seen so far."""
        pc = agent.pcontext(agent_obj)
        self._no_exit = False
        if not by_agent:
            recorded = self._ranks.exits()
            if agent.no_new_exit(pc, recorded):
                self._no_exit = True
                return recorded
        codes = agent.exit_codes(pc)
        own: dict[int, int | None] = {}
        if by_agent:
            # Ranks that raised by themselves at about the same moment as the first (an
            # assert every rank hits at the same step) are first seen only once torch began
            # tearing the group down: they exited by themselves (a code, not the agent's
            # signal), and their own traceback says they failed, not torch. A rank whose error
            # is a peer's death (a collective's connection reset) is the first failure's
            # consequence, whatever it printed.
            known = self._ranks.view().exits
            own = {
                lr: code
                for lr, code in codes.items()
                if code is not None and code > 0 and lr not in known and self._raised(lr)
            }
        new, seen = self._ranks.record_exits(own, by_agent=False) if own else ([], {})
        more, seen = self._ranks.record_exits(
            {lr: c for lr, c in codes.items() if lr not in own}, by_agent
        )
        new += more
        if new:
            # What a rank wrote before it exited is shown before its exit is: the exit is seen
            # the moment it happens, maybe before the tailer read its last bytes. Waited for,
            # not read here: a console nobody reads would block this thread.
            self._files.tailer.caught_up(
                self._ranks.attempt, {x.local_rank for x in new}, EXIT_OUTPUT_WAIT
            )
        for x in new:
            self._state.wake.forget(x.pid)
            if self._reaper is not None:
                self._reaper.forget(x.pid)
            self._store.post(reports.rank_exited(x, self._ranks.attempt))
        return seen

    def _raised(self, local_rank: int) -> bool:
        """Whether ``local_rank`` left its own error behind: a ``@record`` error file, or a
        stderr that ends with a traceback."""
        recorded = errors.read_error_file(self._files.error_files.get(local_rank))
        if recorded:
            message, trace, _ = recorded
            return not errors.peer_failure(message, trace)
        tail = errors.tail_lines(self._files.stderr_paths.get(local_rank))
        return errors.died_raising(tail) and not errors.peer_failure(*tail)

    def on_restart(self, agent_obj: TorchAgent, wg: WorkerGroup) -> None:
        """torch restarts the group: post why, and what is left of the failure budget."""
        attempt = self._ranks.attempt
        self._injector.attempt_ended(attempt)
        cause = self._pending_cause or "membership"
        self._pending_cause = None
        if cause == "failure":
            self._failure_restarts += 1
        self._state.set_phase(Phase.RESTARTING)
        budget_left = max(0, self._user_max_restarts - self._failure_restarts)
        self._store.post(reports.restart(cause, attempt, budget_left))

    def on_shutdown(self) -> None:
        """torch terminates the workers: stopped ranks must run to be able to die."""
        self._ranks.continue_stopped()

    def on_workers_stopped(self, agent_obj: TorchAgent) -> None:
        """The workers are gone: record the last exits, close the attempt's logs."""
        attempt = self._ranks.attempt
        self._injector.attempt_ended(attempt)
        self._poll_exits(agent_obj, by_agent=True)
        if attempt >= 0:
            self._files.tailer.close_attempt(attempt)

    def note_saved(self) -> None:
        """After a preemption: how long this node's workers took to exit (to save and go),
        and whether every one made it before SIGKILL (a ``WorkersSaved``)."""
        pre = self._store.snapshot().preempted
        view = self._ranks.view()
        if pre is None or not view.pids:
            return
        last = max(view.exit_times.values(), default=time.time())
        codes = tuple(view.exits.get(lr, 0) for lr in sorted(view.pids))
        in_time = all(lr in view.exits for lr in view.pids) and -9 not in codes
        self._store.post(
            WorkersSaved(seconds=max(0.0, last - pre.wall), in_time=in_time, exit_codes=codes)
        )

    def on_exit_barrier(self, done: bool) -> None:
        """The agent waits for the other nodes to finish (or is done waiting)."""
        self._state.set_phase(Phase.FINISHING)
        self._store.post(ExitBarrier(attempt=self._ranks.attempt, done=done))
