"""The torch seam: every use of torch's private elastic-agent API, behind named functions.

tuilaunch runs torch's own torchrun path and watches it from inside, which torch offers no
public API for. Everything that depends on torch's internals lives in three modules, so that a
torch upgrade breaks in one known place: this one (the agent subclass and its hooks, the
module swaps, the worker bootstrap, exit codes, the restart budget), :mod:`.rendezvous` (the
rendezvous handler's internals) and :mod:`.logspecs` (the ``LogsSpecs`` subclass). Each keeps
the private names it uses in ``PRIVATE_NAMES``; ``tests/test_torch_seam.py`` checks every one
of them against the installed torch (``torchnames.SEAM_MODULES`` lists
the three).

The observing agent calls an :class:`AgentObserver` (the runner) at each transition; the rest
of tuilaunch reaches torch's objects only through the accessors below.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

from tui_launch.core.seam.names import TorchName

THREAD_WARNING = "Failed to register signal handlers since torchelastic is running"

# torch's LocalElasticAgent, or the subclass made below. Opaque outside this module: other
# modules only hand it back to the accessors here.
TorchAgent: TypeAlias = Any


_LAUNCHER = "torch.distributed.launcher.api"
_RUN = "torch.distributed.run"
_AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent"
_AGENT_API = "torch.distributed.elastic.agent.server.api"
_MP = "torch.distributed.elastic.multiprocessing.api"
_SUBPROC = "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler"

# The protected LocalElasticAgent methods the observing agent overrides.
HOOKS = (
    "_rendezvous",
    "_start_workers",
    "_monitor_workers",
    "_restart_workers",
    "_shutdown",
    "_exit_barrier",
)

PRIVATE_NAMES: tuple[TorchName, ...] = (
    # launch_agent looks LocalElasticAgent up in its module at call time: swapped there.
    TorchName(_LAUNCHER, None, "LocalElasticAgent"),
    # torchrun's (config, entrypoint, args) builder: swapped for the worker bootstrap.
    TorchName(_RUN, None, "config_from_args"),
    *(TorchName(_AGENT, "LocalElasticAgent", hook) for hook in HOOKS),
    TorchName(_AGENT_API, "SimpleElasticAgent", "_worker_group", "instance"),
    TorchName(_AGENT_API, "SimpleElasticAgent", "_remaining_restarts", "instance"),
    TorchName(_AGENT, "LocalElasticAgent", "_pcontext", "instance"),
    # torch 2.13's D-state check in _monitor_workers (absent before: nothing to skip then).
    TorchName(_AGENT, "LocalElasticAgent", "_uninterruptible_state_timeout", "instance"),
    TorchName(_MP, "SubprocessContext", "subprocess_handlers", "instance"),
    TorchName(_MP, "MultiprocessContext", "_pc", "instance"),
    TorchName(_MP, None, THREAD_WARNING, "text"),
    # --warm-start: SubprocessContext looks the handler factory up in its module at call time;
    # the handler's _popen is where a worker forked from the spare takes the place of a new one.
    TorchName(_MP, None, "get_subprocess_handler"),
    TorchName(_SUBPROC, "SubprocessHandler", "_popen"),
    TorchName(_SUBPROC, "SubprocessHandler", "_stdout", "instance"),
    TorchName(_SUBPROC, "SubprocessHandler", "_stderr", "instance"),
)

# --warm-start's hand-off: (argv, env, torch's per-worker keys, stdout fd, stderr fd) -> a Popen
# for the worker forked from the spare, or None to start the worker cold.
HandOff: TypeAlias = Callable[[Sequence[str], dict[str, str], Sequence[str], int, int], Any]
# Told torchrun's configuration under --warm-start: (local world size, bootstrap arguments).
OnConfig: TypeAlias = Callable[[int, Sequence[str]], None]


# ----------------------------------------------------------------------------- torch's shapes


class Worker(Protocol):
    """One worker of torch's ``WorkerGroup`` (the fields tuilaunch reads)."""

    @property
    def local_rank(self) -> int: ...
    @property
    def global_rank(self) -> int: ...
    @property
    def role_rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...


class WorkerSpec(Protocol):
    """torch's ``WorkerSpec`` (the fields tuilaunch reads; ``max_restarts`` is raised)."""

    role: str
    local_world_size: int
    max_restarts: int
    rdzv_handler: Any


class WorkerGroup(Protocol):
    """torch's ``WorkerGroup`` once its rendezvous is done."""

    spec: WorkerSpec
    workers: Sequence[Worker]
    group_rank: int  # set by the rendezvous (None only before it)
    group_world_size: int
    master_addr: str | None
    master_port: int | None


class ProcessFailure(Protocol):
    """One entry of ``RunResult.failures``: a rank that exited non-zero."""

    @property
    def local_rank(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def exitcode(self) -> int: ...
    @property
    def error_file(self) -> str: ...


class RunResult(Protocol):
    """What ``_monitor_workers`` returns: a ``WorkerState`` and the failures, by global rank."""

    @property
    def state(self) -> Any: ...
    @property
    def failures(self) -> Mapping[int, ProcessFailure]: ...


class AgentObserver(Protocol):
    """What the observing agent reports to; every method runs on the agent's thread."""

    def on_agent_created(self, agent: TorchAgent) -> None:
        """The agent exists (its worker group and rendezvous handler too)."""
        ...

    def check_stop(self) -> None:
        """Raise torch's ``SignalException`` if a stop was asked for (never spawn again)."""
        ...

    def on_rendezvous(self, agent: TorchAgent) -> None:
        """A rendezvous round begins."""
        ...

    def on_rendezvous_done(self, agent: TorchAgent, wg: WorkerGroup) -> None:
        """The round is complete: group rank, world size and master are known."""
        ...

    def on_workers_started(self, agent: TorchAgent, wg: WorkerGroup, pids: dict[int, int]) -> None:
        """The attempt's workers run, ``{local_rank: pid}``."""
        ...

    def monitor(
        self, agent: TorchAgent, wg: WorkerGroup, inner: Callable[[WorkerGroup], RunResult]
    ) -> RunResult:
        """One monitor tick: decide, calling torch's own ``inner`` unless overriding it."""
        ...

    def on_restart(self, agent: TorchAgent, wg: WorkerGroup) -> None:
        """torch is about to restart the worker group."""
        ...

    def on_shutdown(self) -> None:
        """torch is about to terminate the workers (stopped ranks must be able to die)."""
        ...

    def on_workers_stopped(self, agent: TorchAgent) -> None:
        """torch's shutdown of the workers returned (or raised)."""
        ...

    def on_exit_barrier(self, done: bool) -> None:
        """The agent enters (``done=False``) or leaves the exit barrier."""
        ...

    def wrap_logs_specs(self, logs_specs: Any, spec: WorkerSpec) -> Any:
        """The ``LogsSpecs`` the agent should use instead of the user's."""
        ...


# ----------------------------------------------------------------------------- the agent


def make_agent_class(observer: AgentObserver, base: type) -> type:
    """A subclass of torch's ``LocalElasticAgent`` that reports to ``observer``.

    Every override calls torch's own implementation; constructor arguments are passed through
    untouched (they differ between torch releases) except ``logs_specs``, which is wrapped.
    """

    class ObservingAgent(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            spec: Any = kwargs.get("spec", args[0] if args else None)
            if "logs_specs" in kwargs:
                kwargs["logs_specs"] = observer.wrap_logs_specs(kwargs["logs_specs"], spec)
            elif len(args) > 1:
                args = (args[0], observer.wrap_logs_specs(args[1], spec), *args[2:])
            super().__init__(*args, **kwargs)
            observer.on_agent_created(self)

        def _rendezvous(self, worker_group: Any) -> None:
            observer.check_stop()
            observer.on_rendezvous(self)
            super()._rendezvous(worker_group)
            observer.on_rendezvous_done(self, worker_group)

        def _start_workers(self, worker_group: Any) -> dict[int, Any]:
            observer.check_stop()  # a stopped run never spawns another attempt
            pids: dict[int, Any] = super()._start_workers(worker_group)
            observer.on_workers_started(self, worker_group, pids)
            return pids

        def _monitor_workers(self, worker_group: Any) -> Any:
            return observer.monitor(self, worker_group, super()._monitor_workers)

        def _restart_workers(self, worker_group: Any) -> None:
            observer.on_restart(self, worker_group)
            super()._restart_workers(worker_group)

        def _shutdown(self, *args: Any, **kwargs: Any) -> None:
            observer.on_shutdown()
            try:
                super()._shutdown(*args, **kwargs)
            finally:
                observer.on_workers_stopped(self)

        def _exit_barrier(self) -> None:
            observer.on_exit_barrier(False)
            try:
                super()._exit_barrier()
            finally:
                observer.on_exit_barrier(True)

    ObservingAgent.__name__ = ObservingAgent.__qualname__ = "ObservingAgent"
    return ObservingAgent


@contextlib.contextmanager
def swap_agent(module: Any, cls: type) -> Iterator[None]:
    """Make ``module.LocalElasticAgent`` be ``cls`` for the duration."""
    # launch_agent looks LocalElasticAgent up in its module at call time.
    original = module.LocalElasticAgent
    module.LocalElasticAgent = cls
    try:
        yield
    finally:
        module.LocalElasticAgent = original


@contextlib.contextmanager
def observed(observer: AgentObserver) -> Iterator[None]:
    """Within this block, torchrun's ``launch_agent`` builds an agent that reports to
    ``observer``."""
    import torch.distributed.launcher.api as launcher_api

    with swap_agent(launcher_api, make_agent_class(observer, launcher_api.LocalElasticAgent)):
        yield


@contextlib.contextmanager
def worker_bootstrap(directory: str | None, warm: OnConfig | None = None) -> Iterator[None]:
    """Start Python workers through :mod:`tui_launch.core.workers.shim` with order directory
    ``directory`` (None: leave torchrun's command line alone).

    ``warm`` (``--warm-start``): every Python worker goes through the bootstrap (with
    ``directory`` or ``-``, no orders), ``--run-path`` included, as a command a spare can run;
    ``warm`` is told the local world size and the bootstrap's arguments before the rendezvous.
    """
    if directory is None and warm is None:
        yield
        return
    import torch.distributed.run as torch_run

    from tui_launch.core.workers import shim

    original = torch_run.config_from_args

    def config_from_args(args: Any) -> Any:
        config, cmd, cmd_args = original(args)
        cmd_args = list(cmd_args)
        if warm is not None:
            order_dir = directory or shim.NO_ORDERS
            if callable(cmd):  # --run-path: torch's run_script_path, in a subprocess instead
                cmd, cmd_args = os.getenv("PYTHON_EXEC", sys.executable), ["--run-path", *cmd_args]
            elif cmd_args[:1] == ["-u"]:
                cmd_args = cmd_args[1:]
            boot = [order_dir, *cmd_args]
            warm(int(config.nproc_per_node), boot)
            return config, cmd, ["-u", "-m", shim.__name__, *boot]
        assert directory is not None
        if callable(cmd):  # --run-path: a function run in a spawned interpreter
            return config, shim.run_path_entry, [directory, *cmd_args]
        if cmd_args[:1] == ["-u"]:
            cmd_args = cmd_args[1:]
        return config, cmd, ["-u", "-m", shim.__name__, directory, *cmd_args]

    torch_run.config_from_args = config_from_args
    try:
        yield
    finally:
        torch_run.config_from_args = original


@contextlib.contextmanager
def warm_handlers(
    hand_off: HandOff | None,
    wrap: Callable[[Sequence[str], Mapping[str, str]], tuple[str, ...]] | None = None,
) -> Iterator[None]:
    """Within this block, torch's worker processes are taken from ``hand_off`` (a worker forked
    from the spare: its ``Popen`` is what torch's handler holds, signals and polls) and
    started cold only when it returns None; a cold worker's command line goes through ``wrap``
    (the run's containment: join its cgroup, then ``exec`` the worker, same pid). Both None:
    torch's own handlers."""
    if hand_off is None and wrap is None:
        yield
        return
    import torch.distributed.elastic.multiprocessing.api as mp_api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    take = hand_off

    def cold(args: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
        return wrap(args, env) if wrap is not None else tuple(args)

    class WarmHandler(SubprocessHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            env = kwargs.get("env", args[2] if len(args) > 2 else None) or {}
            self._tl_worker_keys = tuple(env)  # the variables torch sets for this worker
            super().__init__(*args, **kwargs)

        def _popen(self, args: tuple[Any, ...], env: dict[str, str]) -> Any:
            out = self._stdout.fileno() if self._stdout else 1
            err = self._stderr.fileno() if self._stderr else 2
            proc = take(tuple(args), dict(env), self._tl_worker_keys, out, err) if take else None
            return proc if proc is not None else super()._popen(cold(args, env), env)

    original = mp_api.get_subprocess_handler

    def get_subprocess_handler(*args: Any, **kwargs: Any) -> Any:
        return WarmHandler(*args, **kwargs)

    mp_api.get_subprocess_handler = get_subprocess_handler
    try:
        yield
    finally:
        mp_api.get_subprocess_handler = original


def torchrun(args: Any) -> None:
    """``torch.distributed.run.run(args)``: torchrun itself, on the calling thread."""
    import torch.distributed.run as torch_run

    torch_run.run(args)


# ----------------------------------------------------------------------------- accessors


def worker_group(agent: TorchAgent) -> WorkerGroup:
    """The agent's (single) worker group."""
    wg: WorkerGroup = agent._worker_group
    return wg


def rdzv_handler(agent: TorchAgent) -> Any:
    """The agent's rendezvous handler (see :mod:`.rendezvous` for its internals)."""
    return worker_group(agent).spec.rdzv_handler


def pcontext(agent: TorchAgent) -> Any:
    """The current attempt's process context (None before the first start)."""
    return getattr(agent, "_pcontext", None)


def give_back_restart(agent: TorchAgent, wg: WorkerGroup) -> None:
    """Raise the restart budget by one before torch spends one.

    The restart count (``max_restarts - _remaining_restarts``) and ``attempt_N`` advance; the
    failure budget does not.
    """
    wg.spec.max_restarts += 1
    agent._remaining_restarts += 1


def state_name(result: RunResult) -> str:
    """The ``WorkerState`` of a monitor result as a word: HEALTHY, FAILED, SUCCEEDED, ..."""
    return str(result.state.name)


def quiet_result(agent: TorchAgent) -> RunResult | None:
    """What torch's own ``_monitor_workers`` answers when no worker can have exited since the
    last look (:func:`no_new_exit` said so): HEALTHY, without its poll of every worker's
    ``Popen`` ten times a second. None where torch's check does more than look for exits (its
    uninterruptible-sleep timeout, torch 2.13's ``TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT``):
    ask torch then."""
    if float(getattr(agent, "_uninterruptible_state_timeout", 0.0) or 0.0) > 0:
        return None
    from torch.distributed.elastic.agent.server.api import RunResult as TorchRunResult
    from torch.distributed.elastic.agent.server.api import WorkerState

    result: RunResult = TorchRunResult(state=WorkerState.HEALTHY)
    return result


def unhealthy() -> RunResult:
    """A monitor result that makes torch restart the group (a manual or membership restart)."""
    from torch.distributed.elastic.agent.server.api import RunResult as TorchRunResult
    from torch.distributed.elastic.agent.server.api import WorkerState

    result: RunResult = TorchRunResult(state=WorkerState.UNHEALTHY)
    return result


def failed(ranks: dict[int, tuple[int, int]]) -> RunResult:
    """A monitor result that fails the group as a crash would (a confirmed hang): torch
    restarts it if the budget allows, else stops it and the launch fails (exit 1).

    ``ranks``: global rank -> (local rank, pid) of the ranks to name as failed.
    """
    from torch.distributed.elastic.agent.server.api import RunResult as TorchRunResult
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failures = {
        g: ProcessFailure(local_rank=lr, pid=pid, exitcode=1, error_file="")
        for g, (lr, pid) in ranks.items()
    }
    result: RunResult = TorchRunResult(state=WorkerState.FAILED, failures=failures)
    return result


def spend_restarts(agent: TorchAgent) -> None:
    """Leave no restart in the budget: the next failed result ends the launch."""
    agent._remaining_restarts = 0


def stop_exception(sig: signal.Signals, reason: str) -> BaseException:
    """torch's own ``SignalException``: raised on the agent thread, it shuts the run down the
    way a signal to torchrun would."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return SignalException(f"tuilaunch: {reason}", sigval=sig)


def exit_codes(pc: Any) -> dict[int, int | None]:
    """Exit code of each local rank's process (None while running), for either context kind.

    ``Popen.poll`` reaps and caches the status, so torch's own poll sees the same value.
    """
    if pc is None:
        return {}
    handlers = getattr(pc, "subprocess_handlers", None)
    if handlers:
        return {lr: h.proc.poll() for lr, h in handlers.items()}
    mp = getattr(pc, "_pc", None)
    if mp is not None:
        return {lr: p.exitcode for lr, p in enumerate(mp.processes)}
    return {}


def no_new_exit(pc: Any, known: Container[int]) -> bool:
    """Whether no rank of ``pc`` can have exited unseen since ``known`` (local ranks whose
    exit is recorded): True only when every worker is a plain child ``Popen`` (not a warm
    spare's), none has a status that is not in ``known``, and no child of the launcher is
    waiting to be reaped (one ``waitid`` that reaps nothing). False: poll them
    (:func:`exit_codes`).

    The monitor looks for exits ten times a second, before torch's own poll; this asks the
    kernel once instead of polling every rank's process (at idle with 8 ranks, that poll
    was most of what tuilaunch added to torch's monitor loop).
    """
    handlers = getattr(pc, "subprocess_handlers", None) if pc is not None else None
    if not handlers:
        return False
    for lr, h in handlers.items():
        proc = getattr(h, "proc", None)
        if type(proc) is not subprocess.Popen:
            return False
        if proc.returncode is not None and lr not in known:
            return False  # reaped by torch's poll since: not recorded yet
    try:
        waiting = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError, AttributeError):
        return False
    return waiting is None


def hook_close(agent: TorchAgent, before: Callable[[], None]) -> None:
    """Call ``before`` whenever torch closes this attempt's process context.

    torch's poll finds a failed rank and closes the whole context in the same call, so a rank
    that died a moment before it would otherwise be told apart from the peers torch killed by
    nothing but luck. Noting exits in ``before`` records every exit that happened before torch
    sent its first signal.
    """
    pc = pcontext(agent)
    close = getattr(pc, "close", None)
    if pc is None or close is None:
        return

    def close_noting_exits(*args: Any, **kwargs: Any) -> Any:
        before()
        return close(*args, **kwargs)

    pc.close = close_noting_exits


def silence_thread_warning() -> None:
    """Drop torch's warning that signal handlers cannot be installed off the main thread."""

    # Running the agent off the main thread is deliberate: tuilaunch handles the signals
    # itself and cleans up orphans, so torch's warning about it is wrong here.
    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return THREAD_WARNING not in str(record.msg)

    logging.getLogger(_MP).addFilter(_Drop())


def remaining_restarts(agent: TorchAgent) -> int:
    """The restarts torch has left to spend (``--max-restarts`` minus those spent)."""
    return int(getattr(agent, "_remaining_restarts", 0))
