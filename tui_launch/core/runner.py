"""Run torch's own torchrun path on a background thread, observed and steerable.

:class:`Runner` calls ``torch.distributed.run.run(args)`` (so ``--standalone``, ``-m``,
``--no-python``, ``--run-path``, ``OMP_NUM_THREADS`` and every other flag behave exactly as in
torchrun) with ``LocalElasticAgent`` swapped for a subclass that reports every transition to
the :class:`~tui_launch.core.store.RunStore` and takes commands from any thread:
signal, kill, stop or continue one rank; restart the group without spending the failure
budget; stop the run.

Threads: the agent runs on ``tuilaunch-agent``. Commands only set flags or send signals; the
agent thread acts on flags in ``_monitor_workers`` (every ``--monitor-interval``), through
torch's own paths (``SignalException`` for a stop, ``UNHEALTHY`` for a restart). When the agent
is somewhere it cannot be reached (a rendezvous, the exit barrier), ``stop`` kills the
workers' process groups itself after a short grace period.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from tui_launch.core import errors, inject, rendezvous
from tui_launch.core.args import min_max_nodes
from tui_launch.core.events import (
    AttemptFailed,
    ControlAction,
    ExitBarrier,
    Failure,
    GroupState,
    Injected,
    NodeChange,
    Notice,
    RankExited,
    RendezvousCompleted,
    RendezvousStarted,
    Restart,
    RunFinished,
    RunStarted,
    Shutdown,
    WorkerInfo,
    WorkersStarted,
)
from tui_launch.core.inject import Fired, InjectSpec
from tui_launch.core.journal import Journal
from tui_launch.core.logs import (
    STDERR,
    STDOUT,
    AgentLogCapture,
    CapturingLogsSpecs,
    DuplicateFilter,
    LogTailer,
    ReifiedLogs,
)
from tui_launch.core.reaper import Reaper
from tui_launch.core.store import RunStore
from tui_launch.core.telemetry import RankTarget, Telemetry

SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
SINGLE_NODE_CLUSTER_INTERVAL = 10.0  # s between cluster-view records when the job has one node
# torch's worker-side excepthook prefixes traceback lines with "[rank1]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_TORCH_THREAD_WARNING = "Failed to register signal handlers since torchelastic is running"


def signal_exit_code(sig: int) -> int:
    """The conventional exit status of a process ended by ``sig`` (128 + number)."""
    return 128 + int(sig)


class Runner:
    """One launch of torch's elastic agent, with a control API.

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
    ) -> None:
        self.args = args
        self.store = store
        self.echo = echo
        self.tailer = LogTailer()
        self.duplicates = DuplicateFilter(
            {
                STDOUT: list(getattr(args, "duplicate_stdout_filters", None) or []),
                STDERR: list(getattr(args, "duplicate_stderr_filters", None) or []),
            }
        )
        if self.duplicates:
            self.tailer.add_sink(self.duplicates)
        self.agent_log = AgentLogCapture()
        self.journal = Journal(journal_path)
        self._mute_agent_console = mute_agent_console
        self.reaper: Reaper | None = None
        self.host = socket.gethostname()

        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._agent: Any = None
        self._phase = "init"
        self._attempt = -1
        self._pids: dict[int, int] = {}
        self._global_ranks: dict[int, int] = {}
        self._exit_seen: dict[int, int] = {}
        # Ranks whose exit was first seen once torch had begun terminating the group.
        self._exit_by_agent: set[int] = set()
        self._stopped_by_us: set[int] = set()
        self._marks: dict[int, str] = {}
        self._error_files: dict[int, str] = {}
        self._stderr_paths: dict[int, str] = {}
        self._stop_sig: signal.Signals | None = None
        self._stop_reason = ""
        self._restart_requested = False
        self._pending_cause: str | None = None
        self._failure_restarts = 0
        self._user_max_restarts = int(getattr(args, "max_restarts", 0))
        self._rdzv_t0 = 0.0
        # Multi-node: the round and group size this node joined, and who was in it.
        self._round: int | None = None
        self._group_world = 1
        self._members: tuple[str, ...] = ()
        # Members missing from this complete round at the last look (see _node_lost).
        self._gone_once: tuple[str, ...] = ()
        self.cluster: Any = None  # cluster.ClusterView once the first rendezvous is done
        self._last_group_state: str | None = None
        self._notes: tuple[str, ...] = ()
        self._attempt_dir = ""
        self.run_dir: str | None = None
        self.exit_code: int | None = None
        self.error_message: str | None = None
        self.telemetry = telemetry
        # Failure injection (core/inject.py): the schedule, and the worker bootstrap's order
        # directory when Python workers run through it (only if a run asks for it).
        self.injector = injector or inject.Injector()
        self.injector.bind(self)
        self._shim_dir: str | None = None
        self._want_shim = (inject_ready or inject.needs_shim(self.injector.specs)) and not bool(
            getattr(args, "no_python", False)
        )
        self._thaw_attempt = -1  # the attempt whose stopped ranks were let go for good
        if self.injector.uses_random:
            seed = self.injector.seed
            self._notes += (
                f"inject: rank=random draws use seed {seed} (--inject-seed {seed} repeats them)",
            )
        # Called just before `node` kills the launcher (the dashboard restores the terminal).
        self.before_node_death: list[Callable[[], None]] = []

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the reaper, the log tailer and the agent thread."""
        self.store.subscribe(self.journal.write)
        self.agent_log.install(mute_console=self._mute_agent_console)
        _silence_thread_warning()
        self._fix_restarts()
        self.reaper = Reaper()
        self.tailer.start()
        self._thread = threading.Thread(target=self._main, name="tuilaunch-agent", daemon=True)
        self._thread.start()
        threading.Thread(target=self._sample_loop, name="tuilaunch-sampler", daemon=True).start()

    def _sample_loop(self, interval: float = 1.0) -> None:
        # Live rendezvous readings for the front ends; cached state only, never the network.
        last = None
        while not self._done.wait(interval):
            agent = self._agent
            if agent is None:
                continue
            try:
                s = rendezvous.sample(agent._worker_group.spec.rdzv_handler)
            except Exception:
                continue
            if s is not None and (last is None or replace(s, mono=0, wall=0) != last):
                last = replace(s, mono=0, wall=0)
                self.store.post(s)

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
        """Where the agent thread is: rendezvous, starting, monitoring, restarting, ..."""
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
        import torch.distributed.launcher.api as launcher_api
        import torch.distributed.run as torch_run
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        outcome, code, message = "error", 1, ""
        try:
            with (
                _swap_agent(launcher_api, make_agent_class(self, launcher_api.LocalElasticAgent)),
                self._worker_bootstrap(torch_run),
                rendezvous.local_store_host(self._hosting_by_address),
            ):
                torch_run.run(self.args)
            outcome, code = "succeeded", 0
            message = "all ranks exited 0"
        except ChildFailedError:
            outcome, code = "failed", 1
            rc = self.store.snapshot().root_cause
            message = _failure_line(rc) if rc else "workers failed"
        except SignalException as e:
            outcome, code = "stopped", signal_exit_code(e.sigval)
            message = f"stopped by {e.sigval.name}"
        except inject.InjectError as e:  # a rank out of range, found at the rendezvous
            outcome, code, message = "error", 2, str(e)
        except BaseException as e:  # any error of torch's becomes one line, never a traceback
            if self._stop_sig is not None:
                outcome, code = "stopped", signal_exit_code(self._stop_sig)
                message = f"stopped by {self._stop_sig.name}"
            else:
                outcome, code, message = "error", 1, self._rendezvous_error(e) or one_line_error(e)
        finally:
            self._finish(outcome, code, message)

    def _hosting_by_address(self, host: str) -> None:
        # Called while torch creates the rendezvous handler, before RunStarted: a note.
        self._notes += (
            f"rendezvous: this node hosts the c10d store: {host} is an address of one of its "
            f"interfaces (torch's hostname check said no; --rdzv-conf is_host=0 overrides)",
        )

    def _rendezvous_error(self, e: BaseException) -> str | None:
        """Below MIN nodes until the join timeout: say so in words, not torch's class name."""
        if type(e).__name__ != "RendezvousTimeoutError":
            return None
        lo, hi = min_max_nodes(self.args.nnodes)
        live = self.store.snapshot().rendezvous_live
        joined = len(live.participants) if live is not None and not live.complete else None
        timeout = live.join_timeout if live is not None else None
        have = f"; {joined} joined" if joined is not None else ""
        within = f" within the join timeout ({timeout:g}s)" if timeout else ""
        return (
            f"rendezvous timed out: fewer than the minimum of {lo} node(s) (--nnodes {lo}:{hi}) "
            f"joined{within}{have}. Start more nodes or lower MIN. ({one_line_error(e)})"
        )

    def _finish(self, outcome: str, code: int, message: str) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._phase = "done"
            self.exit_code = code
            self.error_message = message if outcome == "error" else None
        self.tailer.stop()
        if self.telemetry is not None:
            self.telemetry.stop()
        self.injector.close()
        if self._shim_dir:
            import shutil

            shutil.rmtree(self._shim_dir, ignore_errors=True)
        self.store.post(RunFinished(outcome=outcome, exit_code=code, message=message))
        if self.cluster is not None:
            self.cluster.stop()  # one last record: the outcome, for the other nodes
        if self.run_dir is None:
            self._ensure_run_dir()
        self.journal.close()
        if self.reaper is not None:
            self.reaper.close()
        self.agent_log.uninstall()
        self._done.set()
        self.store.wake()

    def _ensure_run_dir(self) -> None:
        # The run ended before torch made its log directory (e.g. the rendezvous failed):
        # the journal and agent log still need a home.
        import tempfile

        root = getattr(self.args, "log_dir", None)
        if not root or root == os.devnull:
            root = None
        try:
            if root:
                os.makedirs(root, exist_ok=True)
            d = tempfile.mkdtemp(prefix=f"{getattr(self.args, 'rdzv_id', 'run')}_", dir=root)
        except OSError:
            d = tempfile.mkdtemp(prefix="tuilaunch_")
        self._set_run_dir(d)

    def _set_run_dir(self, d: str) -> None:
        self.run_dir = d
        self.journal.set_dir(d)
        self.agent_log.set_dir(d)

    # ----------------------------------------------------------------- control API

    def signal_rank(self, local_rank: int, sig: int, source: str = "api") -> bool:
        """Send ``sig`` to one local rank's worker process. Returns whether it was sent."""
        sig = signal.Signals(sig)
        action = {signal.SIGSTOP: "stop", signal.SIGCONT: "continue"}.get(sig, "signal")
        if sig == signal.SIGKILL:
            action = "kill"
        with self._lock:
            pid = self._pids.get(local_rank)
            alive = pid is not None and local_rank not in self._exit_seen
            grank = self._global_ranks.get(local_rank)
        if not alive or pid is None:
            self.store.post(
                ControlAction(
                    action=action,
                    local_rank=local_rank,
                    global_rank=grank,
                    pid=pid,
                    signal=sig.name,
                    source=source,
                    ok=False,
                    detail="no running worker",
                )
            )
            return False
        ok, detail = True, ""
        try:
            if sig in (signal.SIGSTOP, signal.SIGCONT):
                # The whole rank: its data-loader children pause and resume with it.
                _signal_group(pid, sig)
            else:
                os.kill(pid, sig)
                if local_rank in self._stopped_by_us and sig != signal.SIGKILL:
                    _signal_group(pid, signal.SIGCONT)  # a stopped process cannot act on it
            with self._lock:
                if sig == signal.SIGSTOP:
                    self._stopped_by_us.add(local_rank)
                elif sig == signal.SIGCONT:
                    self._stopped_by_us.discard(local_rank)
                else:
                    self._marks[pid] = f"{sig.name} sent by tuilaunch ({source})"
        except ProcessLookupError:
            ok, detail = False, "process already gone"
        except PermissionError as e:
            ok, detail = False, str(e)
        self.store.post(
            ControlAction(
                action=action,
                local_rank=local_rank,
                global_rank=grank,
                pid=pid,
                signal=sig.name,
                source=source,
                ok=ok,
                detail=detail,
            )
        )
        return ok

    def kill_rank(self, local_rank: int, source: str = "api") -> bool:
        """SIGKILL one rank, as the OOM killer would."""
        return self.signal_rank(local_rank, signal.SIGKILL, source)

    def stop_rank(self, local_rank: int, source: str = "api") -> bool:
        """SIGSTOP one rank (and its children): it hangs until continued."""
        return self.signal_rank(local_rank, signal.SIGSTOP, source)

    def continue_rank(self, local_rank: int, source: str = "api") -> bool:
        """SIGCONT a stopped rank."""
        return self.signal_rank(local_rank, signal.SIGCONT, source)

    def is_stopped(self, local_rank: int) -> bool:
        """Whether tuilaunch has stopped this rank and not continued it."""
        with self._lock:
            return local_rank in self._stopped_by_us

    def restart(self, source: str = "api") -> bool:
        """Restart the whole local worker group; the failure budget is not spent."""
        with self._lock:
            ok = self._phase == "monitoring" and self._stop_sig is None
            if ok:
                self._restart_requested = True
        self.store.post(
            ControlAction(
                action="restart",
                local_rank=None,
                global_rank=None,
                pid=None,
                signal=None,
                source=source,
                ok=ok,
                detail="" if ok else f"agent is {self._phase}",
            )
        )
        return ok

    # ----------------------------------------------------------------- failure injection

    def inject(self, text: str, source: str = "dashboard") -> tuple[bool, str]:
        """Parse ``text`` (an ``--inject`` spec) and schedule it now; ``after`` counts from now.

        Returns (ok, message): the message says what was scheduled or why it was refused.
        """
        try:
            spec = inject.parse_spec(text)
            world = max((w.world_size for w in self._workers_view()), default=0)
            if world:
                inject.check_world_size([spec], world)
        except inject.InjectError as e:
            return False, str(e)
        if spec.kind in inject.SHIM_KINDS and self._shim_dir is None:
            return False, self._no_shim_reason(spec.kind)
        self.injector.add(spec, source)
        return True, f"scheduled {spec.canonical()}"

    def _workers_view(self) -> list[WorkerInfo]:
        for e in reversed(self.store.events()):
            if isinstance(e, WorkersStarted):
                return list(e.workers)
        return []

    def _no_shim_reason(self, kind: str) -> str:
        if getattr(self.args, "no_python", False):
            return f"{kind} injection needs a Python worker (this run uses --no-python)"
        return (
            f"{kind} injection needs tuilaunch's worker bootstrap: launch with "
            f"--inject-ready (or an --inject {kind}:... spec)"
        )

    def attempt_alive(self, attempt: int) -> bool:
        """Whether ``attempt`` is the current one and still being monitored (not ending)."""
        with self._lock:
            return (
                attempt == self._attempt
                and self._phase == "monitoring"
                and self._stop_sig is None
                and self._thaw_attempt != attempt
            )

    def inject_fault(self, spec: InjectSpec, local_rank: int, fired: Fired) -> bool:
        """Do one firing of ``spec`` on ``local_rank`` (called by the :class:`Injector`)."""
        with self._lock:
            pid = self._pids.get(local_rank)
            alive = pid is not None and local_rank not in self._exit_seen
        detail = "" if alive else "the rank is not running"
        if alive and spec.kind in inject.SHIM_KINDS and self._shim_dir is None:
            alive, detail = False, self._no_shim_reason(spec.kind)
        self.store.post(
            Injected(
                spec=spec.canonical(),
                fault=spec.kind,
                attempt=fired.attempt,
                global_rank=fired.global_rank,
                local_rank=local_rank,
                pid=pid,
                count=fired.count,
                times=spec.times,
                source=fired.source,
                ok=alive,
                detail=detail,
            )
        )
        if not alive:
            return False
        source = "inject" if fired.source == "--inject" else f"inject, {fired.source}"
        if spec.kind == "kill":
            return self.signal_rank(local_rank, inject.parse_signal(spec.signal), source)
        if spec.kind == "hang":
            ok = self.stop_rank(local_rank, source)
            if ok and spec.duration is not None:
                t = threading.Timer(
                    spec.duration, self._end_hang, (local_rank, pid, fired.attempt, source)
                )
                t.daemon = True
                t.start()
            return ok
        if spec.kind == "slow":
            threading.Thread(
                target=self._slow,
                args=(local_rank, pid, fired.attempt, spec),
                name="tuilaunch-slow",
                daemon=True,
            ).start()
            return True
        if spec.kind == "exit":
            return self.exit_rank(local_rank, spec.code, source)
        if spec.kind == "exception":
            return self.raise_in_rank(local_rank, spec.message, source)
        if spec.kind == "node":
            self.kill_node(source)
        return False

    def _end_hang(self, local_rank: int, pid: int, attempt: int, source: str) -> None:
        with self._lock:
            still = (
                self._attempt == attempt
                and self._pids.get(local_rank) == pid
                and local_rank in self._stopped_by_us
            )
        if still:
            self.continue_rank(local_rank, source)

    def _slow(self, local_rank: int, pid: int, attempt: int, spec: InjectSpec) -> None:
        # A straggler: stopped duty % of every period. The toggles are not events (two a
        # second would flood the journal); the Injected event says what is going on.
        stopped_for = spec.period * spec.duty / 100.0
        running_for = spec.period - stopped_for
        end = time.monotonic() + spec.duration if spec.duration is not None else float("inf")
        while time.monotonic() < end and self._pause(local_rank, pid, attempt, True):
            self._done.wait(stopped_for)
            self._pause(local_rank, pid, attempt, False)
            if self._done.wait(running_for):
                break

    def _pause(self, local_rank: int, pid: int, attempt: int, stop: bool) -> bool:
        with self._lock:  # held while signalling: _continue_stopped cannot slip in between
            if stop and not (
                self.attempt_alive(attempt)
                and self._pids.get(local_rank) == pid
                and local_rank not in self._exit_seen
            ):
                return False
            if not stop and local_rank not in self._stopped_by_us:
                return False
            _signal_group(pid, signal.SIGSTOP if stop else signal.SIGCONT)
            if stop:
                self._stopped_by_us.add(local_rank)
            else:
                self._stopped_by_us.discard(local_rank)
            return True

    def exit_rank(self, local_rank: int, code: int, source: str = "api") -> bool:
        """Make a Python worker exit with ``code`` (needs the worker bootstrap)."""
        return self._order(local_rank, {"kind": "exit", "code": int(code)}, source)

    def raise_in_rank(self, local_rank: int, message: str, source: str = "api") -> bool:
        """Raise an exception with ``message`` in a Python worker's main thread (bootstrap)."""
        return self._order(local_rank, {"kind": "exception", "message": message}, source)

    def _order(self, local_rank: int, order: dict[str, Any], source: str) -> bool:
        import json

        from tui_launch.core.shim import INJECT_SIGNAL

        kind = str(order["kind"])
        with self._lock:
            pid = self._pids.get(local_rank)
            alive = pid is not None and local_rank not in self._exit_seen
            grank = self._global_ranks.get(local_rank)
            stopped = local_rank in self._stopped_by_us
        ok, detail = alive, "" if alive else "no running worker"
        if ok and self._shim_dir is None:
            ok, detail = False, self._no_shim_reason(kind)
        if ok and pid is not None and self._shim_dir is not None:
            path = os.path.join(self._shim_dir, f"{pid}.json")
            try:
                with open(path + ".tmp", "w") as fp:
                    json.dump(order, fp)
                os.replace(path + ".tmp", path)  # the handler never reads half an order
                with self._lock:
                    self._marks[pid] = f"{kind} injected by tuilaunch ({source})"
                os.kill(pid, INJECT_SIGNAL)
                if stopped:
                    _signal_group(pid, signal.SIGCONT)  # a stopped process cannot act on it
            except ProcessLookupError:
                ok, detail = False, "process already gone"
            except OSError as e:
                ok, detail = False, str(e)
        self.store.post(
            ControlAction(
                action=kind,
                local_rank=local_rank,
                global_rank=grank,
                pid=pid,
                signal=None,
                source=source,
                ok=ok,
                detail=detail,
            )
        )
        return ok

    def kill_node(self, source: str = "api") -> None:
        """This node dies at once, as if the machine had gone: every worker's process group
        and the launcher itself are SIGKILLed. The reaper makes sure nothing is left."""
        self.store.post(
            ControlAction(
                action="node",
                local_rank=None,
                global_rank=None,
                pid=os.getpid(),
                signal="SIGKILL",
                source=source,
                ok=True,
            )
        )
        for hook in list(self.before_node_death):
            with contextlib.suppress(Exception):
                hook()
        with self._lock:
            pids = list(self._pids.values())
        for pid in pids:
            _signal_group(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    @contextlib.contextmanager
    def _worker_bootstrap(self, torch_run: Any) -> Iterator[None]:
        """Start Python workers through :mod:`tui_launch.core.shim` (only when asked for)."""
        if not self._want_shim:
            yield
            return
        import tempfile

        from tui_launch.core import shim

        self._shim_dir = tempfile.mkdtemp(prefix="tuilaunch-inject-")
        directory = self._shim_dir
        original = torch_run.config_from_args

        def config_from_args(args: Any) -> Any:
            config, cmd, cmd_args = original(args)
            cmd_args = list(cmd_args)
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

    def stop(self, sig: int = signal.SIGTERM, reason: str = "stop requested") -> None:
        """Stop the run: workers get ``sig``, then SIGKILL after the shutdown timeout.

        A second call escalates: every worker is SIGKILLed at once.
        """
        sig = signal.Signals(sig)
        with self._lock:
            first = self._stop_sig is None
            if first:
                self._stop_sig = sig
                self._stop_reason = reason
        if self._done.is_set():
            return
        if not first:
            self._kill_all(signal.SIGKILL)
            self._finish("stopped", signal_exit_code(self._stop_sig or sig), "killed")
            return
        self.store.post(Shutdown(reason=reason, signal=sig.name))
        threading.Thread(
            target=self._stop_watchdog, args=(sig,), name="tuilaunch-stop", daemon=True
        ).start()

    def _stop_watchdog(self, sig: signal.Signals) -> None:
        # Give the agent a few monitor ticks to pick the stop up through torch's own path.
        interval = float(getattr(self.args, "monitor_interval", 0.1) or 0.1)
        deadline = time.monotonic() + max(1.0, 5 * interval)
        while time.monotonic() < deadline:
            if self._done.is_set() or self._phase in ("stopping", "done"):
                return
            time.sleep(0.02)
        # The agent is stuck where torch cannot be interrupted (rendezvous, exit barrier,
        # a slow start): stop the workers ourselves and end the run.
        self._kill_all(sig, grace=self._shutdown_timeout())
        self._finish("stopped", signal_exit_code(sig), f"stopped by {sig.name}")

    def _shutdown_timeout(self) -> float:
        t: Any = getattr(self.args, "shutdown_timeout", None)
        if t is None:
            t = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        try:
            return float(t)
        except ValueError:
            return 30.0

    def _kill_all(self, sig: signal.Signals, grace: float = 0.0) -> None:
        with self._lock:
            pids = [p for lr, p in self._pids.items() if lr not in self._exit_seen]
        for pid in pids:
            _signal_group(pid, sig)
            _signal_group(pid, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while grace and time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        for pid in pids:
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)

    # ----------------------------------------------------------------- agent hooks

    def _on_agent_created(self, agent: Any) -> None:
        import torch

        self._agent = agent
        spec = agent._worker_group.spec
        handler = spec.rdzv_handler
        a = self.args
        min_nodes, max_nodes = min_max_nodes(a.nnodes)
        script = [a.training_script, *a.training_script_args]
        if a.module:
            script = ["-m", *script]
        self.store.post(
            RunStarted(
                entrypoint=" ".join(script[:1]),
                args=tuple(script[1:]),
                role=spec.role,
                nproc_per_node=spec.local_world_size,
                min_nodes=min_nodes,
                max_nodes=max_nodes,
                max_restarts=spec.max_restarts,
                backend=_safe(handler.get_backend, a.rdzv_backend),
                endpoint=_endpoint(handler, a),
                run_id=_safe(handler.get_run_id, a.rdzv_id),
                host=self.host,
                launcher_pid=os.getpid(),
                torch_version=torch.__version__,
                notes=self._notes,
            )
        )
        for note in self._notes:
            self.store.post(Notice(level="info", message=note))
        if self.telemetry is not None:
            self.telemetry.start()  # after RunStarted: the journal begins with it

    def _on_reify(self, info: ReifiedLogs) -> None:
        if self.run_dir is None:
            self._set_run_dir(os.path.dirname(info.attempt_dir))
        attempt = self._attempt + 1
        for src in info.sources:
            src.attempt = attempt
            if src.stream == STDERR:
                self._stderr_paths[src.local_rank] = src.path
        self._error_files = dict(info.error_files)
        if self.duplicates:
            self.tailer.drain()  # the previous attempt's lines go to the previous files
            self.duplicates.set_files(info.filtered_files)
        self._attempt_dir = info.attempt_dir
        self.tailer.add_sources(info.sources)

    def _on_rendezvous(self, agent: Any) -> None:
        self._phase = "rendezvous"
        self._rdzv_t0 = time.monotonic()
        handler = agent._worker_group.spec.rdzv_handler
        self.store.post(
            RendezvousStarted(
                attempt=self._attempt + 1,
                backend=_safe(handler.get_backend, self.args.rdzv_backend),
                endpoint=_endpoint(handler, self.args),
                run_id=_safe(handler.get_run_id, self.args.rdzv_id),
            )
        )

    def _on_rendezvous_done(self, agent: Any, wg: Any) -> None:
        handler = wg.spec.rdzv_handler
        live = rendezvous.sample(handler)
        self.store.post(
            RendezvousCompleted(
                attempt=self._attempt + 1,
                round=live.round if live else None,
                backend=_safe(handler.get_backend, self.args.rdzv_backend),
                endpoint=_endpoint(handler, self.args),
                run_id=_safe(handler.get_run_id, self.args.rdzv_id),
                group_rank=int(wg.group_rank),
                group_world_size=int(wg.group_world_size),
                master_addr=str(wg.master_addr),
                master_port=int(wg.master_port or 0),
                participants=tuple(p.node for p in live.participants) if live else (),
                duration=time.monotonic() - self._rdzv_t0,
            )
        )
        self._note_membership(wg, live)
        if wg.workers:
            # Ranks in --inject can only be checked once the world size is known; stop here,
            # before any worker starts (exit status 2, as for any bad input).
            inject.check_world_size(self.injector.cli_specs, int(wg.workers[0].world_size))
        self._phase = "starting"
        self._start_cluster_view(handler)

    def _note_membership(self, wg: Any, live: Any) -> None:
        """Remember this round; post which nodes joined or left since the previous one."""
        members = tuple(sorted(p.node for p in live.participants)) if live else ()
        world = int(wg.group_world_size)
        before, before_world = self._members, self._group_world
        self._round = live.round if live else None
        self._members, self._group_world = members, world
        self._gone_once = ()
        if self._attempt < 0:
            return
        joined = tuple(m for m in members if m not in before)
        left = tuple(m for m in before if m not in members)
        if joined or left or world != before_world:
            self.store.post(
                NodeChange(
                    attempt=self._attempt + 1, joined=joined, left=left, group_world_size=world
                )
            )

    def _start_cluster_view(self, handler: Any) -> None:
        if self.cluster is not None:
            self.cluster.set_handler(handler)
            return
        from tui_launch.core.cluster import ClusterView, interval_from_env

        interval = interval_from_env()
        if interval <= 0:
            return
        if min_max_nodes(self.args.nnodes)[1] == 1:
            # A job of one node: its Cluster tab repeats this node's own panels, so a store
            # round trip every few seconds buys nothing (and was a tenth of the steady CPU).
            interval = max(interval, SINGLE_NODE_CLUSTER_INTERVAL)
        self.cluster = ClusterView(self, handler, interval=interval)
        self.cluster.start()

    def _node_lost(self, agent: Any) -> list[str]:
        """Nodes of this round that are gone: dropped by torch or with expired heartbeats."""
        if self._group_world <= 1:
            return []
        handler = agent._worker_group.spec.rdzv_handler
        state = rendezvous.cached_state(handler)
        if state is None or getattr(state, "round", None) != self._round:
            return []  # a newer round: torch's own waiting-node check restarts us
        dead = rendezvous.dead_participants(handler)
        if dead:
            return dead
        present = {rendezvous.node_name(n) for n in getattr(state, "participants", {}) or {}}
        waiting = getattr(state, "wait_list", None)
        if getattr(state, "complete", False) and len(present) < self._group_world and not waiting:
            # Dropped by torch (another node's sync removed its expired heartbeat) - or a node
            # that left on purpose to re-rendezvous after its own rank failed: torch removes it
            # from the participants, then adds it to the wait list, in two writes. Believe an
            # absence only when the next look (a monitor tick or a poll later) still sees it.
            gone = tuple(m for m in self._members if m not in present) or ("?",)
            seen_before, self._gone_once = self._gone_once == gone, gone
            return list(gone) if seen_before else []
        self._gone_once = ()
        return []

    def _wait_node_loss(self, agent: Any) -> list[str]:
        """After a failure in an elastic multi-node group: was it a node that went away?

        A node's death shows first as a broken collective on every other node, long before
        torch notices its missing heartbeats. Waiting for one heartbeat window (syncing the
        state on the agent thread, as torch's own loop does) tells a lost node, which is a
        membership change, from a failure, which spends the budget. A node that joins the wait
        list in the meantime is alive and restarting: that was a real failure. Only nodes whose
        ranks died of broken collectives wait here; the node where a rank failed by itself
        skips it (see ``_failed_here``).
        """
        handler = agent._worker_group.spec.rdzv_handler
        settings = getattr(handler, "_settings", None)
        interval = getattr(settings, "keep_alive_interval", None)
        attempts = getattr(settings, "keep_alive_max_attempt", None)
        if interval is None or not attempts:
            return []
        deadline = time.monotonic() + (interval * attempts).total_seconds() + 2.0
        while time.monotonic() < deadline and self._stop_sig is None:
            try:
                waiting = handler.num_nodes_waiting()  # syncs: torch drops expired nodes
            except Exception:
                return []
            lost = self._node_lost(agent)
            if lost:
                return lost
            if waiting:
                return []
            time.sleep(0.25)
        return []

    def _on_workers_started(self, agent: Any, wg: Any, pids: dict[int, int]) -> None:
        with self._lock:
            self._attempt += 1
            self._pids = dict(pids)
            self._global_ranks = {w.local_rank: w.global_rank for w in wg.workers}
            self._exit_seen = {}
            self._exit_by_agent = set()
            self._stopped_by_us = set()
            self._last_group_state = "HEALTHY"
        if self.reaper is not None:
            for pid in pids.values():
                self.reaper.watch(pid)
        self._hook_close(agent)
        workers = tuple(
            WorkerInfo(
                local_rank=w.local_rank,
                global_rank=w.global_rank,
                role_rank=w.role_rank,
                world_size=w.world_size,
                pid=int(pids[w.local_rank]),
            )
            for w in wg.workers
        )
        self.store.post(
            WorkersStarted(attempt=self._attempt, workers=workers, log_dir=self._attempt_dir)
        )
        if self.telemetry is not None:
            self.telemetry.set_workers(
                self._attempt,
                (RankTarget(w.local_rank, w.global_rank, w.pid) for w in workers),
            )
        self._phase = "monitoring"
        self.injector.attempt_started(
            self._attempt,
            {w.global_rank: w.local_rank for w in wg.workers},
            int(wg.workers[0].world_size) if wg.workers else 0,
        )

    def _monitor(self, agent: Any, wg: Any, inner: Callable[[Any], Any]) -> Any:
        from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

        self._phase = "monitoring"
        self._check_stop()
        with self._lock:
            manual = self._restart_requested
            self._restart_requested = False
        if manual:
            # Raise the budget by one before torch spends one: the restart count and
            # attempt_N advance, the failure budget does not.
            wg.spec.max_restarts += 1
            agent._remaining_restarts += 1
            self._pending_cause = "manual"
            self._post_group_state("UNHEALTHY")
            return RunResult(state=WorkerState.UNHEALTHY)

        seen = self._poll_exits(agent, by_agent=False)
        if any(code != 0 for code in seen.values()):
            self._continue_stopped()  # torch is about to SIGTERM the peers
        result = inner(wg)
        state = result.state.name
        if state in ("FAILED", "SUCCEEDED"):
            self.injector.attempt_ended(self._attempt)
        if state == "HEALTHY":
            lost = self._node_lost(agent)
            if lost:
                # torch would wait on these workers until their collectives time out.
                self._membership_restart(agent, wg, lost)
                return RunResult(state=WorkerState.UNHEALTHY)
        if state == "FAILED":
            self._poll_exits(agent, by_agent=True)
            failures = self._failures(wg, result)
            self.tailer.drain()
            self.store.post(AttemptFailed(attempt=self._attempt, failures=failures))
            self._pending_cause = "failure"
            # A rank of this node failed by itself: this node is alive and the failure is real.
            # Re-rendezvous at once (no lost-node wait): the other nodes, which only saw their
            # collectives break, see this node on the wait list and restart too.
            if self._elastic() and self._group_world > 1 and not _failed_here(failures):
                lost = self._wait_node_loss(agent)
                if lost:
                    self._membership_restart(agent, wg, lost)
        elif state == "SUCCEEDED":
            self._poll_exits(agent, by_agent=False)
        self._post_group_state(state)
        return result

    def _elastic(self) -> bool:
        lo, hi = min_max_nodes(self.args.nnodes)
        return lo < hi

    def _membership_restart(self, agent: Any, wg: Any, lost: list[str]) -> None:
        # Like a manual restart: torch spends one restart, we give it back first.
        wg.spec.max_restarts += 1
        agent._remaining_restarts += 1
        self._pending_cause = "membership"
        self.store.post(
            Notice(
                level="warning",
                message=f"node lost: {', '.join(lost)} (heartbeat expired); restarting with "
                "the remaining nodes, no failure budget spent",
            )
        )
        self._post_group_state("UNHEALTHY")

    def _hook_close(self, agent: Any) -> None:
        """Note which ranks died by themselves before torch starts terminating the group.

        torch's poll finds a failed rank and closes the whole context in the same call, so a
        rank that died a moment before it would otherwise be told apart from the peers torch
        killed by nothing but luck. Wrapping this attempt's ``close`` records every exit that
        happened before torch sent its first signal.
        """
        pcontext = getattr(agent, "_pcontext", None)
        close = getattr(pcontext, "close", None)
        if pcontext is None or close is None:
            return

        def close_noting_exits(*args: Any, **kwargs: Any) -> Any:
            self._poll_exits(agent, by_agent=False)
            self._continue_stopped()
            return close(*args, **kwargs)

        pcontext.close = close_noting_exits

    def _check_stop(self) -> None:
        """On the agent thread: leave through torch's own path once a stop was asked for."""
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if self._stop_sig is not None:
            self._phase = "stopping"
            raise SignalException(f"tuilaunch: {self._stop_reason}", sigval=self._stop_sig)

    def _continue_stopped(self) -> None:
        # A SIGSTOPped rank leaves torch's SIGTERM pending and would cost the whole shutdown
        # timeout: let it run again so that it can die (and a `slow` injection may not
        # stop it again).
        with self._lock:
            self._thaw_attempt = self._attempt
            pids = [self._pids[lr] for lr in self._stopped_by_us if lr in self._pids]
            self._stopped_by_us.clear()
        for pid in pids:
            _signal_group(pid, signal.SIGCONT)

    def _post_group_state(self, state: str) -> None:
        if state != self._last_group_state:
            self._last_group_state = state
            self.store.post(GroupState(attempt=self._attempt, state=state))

    def _poll_exits(self, agent: Any, by_agent: bool) -> dict[int, int]:
        """Record ranks that have exited since the last poll; return all exits seen so far."""
        codes = exit_codes(getattr(agent, "_pcontext", None))
        new: list[tuple[int, int]] = []
        with self._lock:
            for lr, code in codes.items():
                if code is not None and lr not in self._exit_seen:
                    self._exit_seen[lr] = code
                    if by_agent:
                        self._exit_by_agent.add(lr)
                    new.append((lr, code))
            seen = dict(self._exit_seen)
        for lr, code in new:
            pid = self._pids.get(lr, -1)
            if self.reaper is not None:
                self.reaper.forget(pid)
            self.store.post(
                RankExited(
                    attempt=self._attempt,
                    local_rank=lr,
                    global_rank=self._global_ranks.get(lr, lr),
                    pid=pid,
                    exit_code=code,
                    signal=errors.signal_name(code),
                    by_agent=by_agent,
                )
            )
        return seen

    def _failures(self, wg: Any, result: Any) -> tuple[Failure, ...]:
        by_global = {w.global_rank: w for w in wg.workers}
        exit_times = {e.local_rank: e.wall for e in self._rank_exits()}
        # (global rank, local rank, pid, exit code, torch's error file) of every failed rank.
        failed: dict[int, tuple[int, int, int, int, str]] = {}
        for grank, pf in result.failures.items():
            worker = by_global.get(grank)
            lr = worker.local_rank if worker is not None else pf.local_rank
            failed[lr] = (grank, lr, int(pf.pid), int(pf.exitcode), pf.error_file)
        # Older torch (2.6) reports only the ranks that failed before it tore the group down; the
        # peers it terminated are failures of this attempt too (marked collateral below).
        with self._lock:
            seen = dict(self._exit_seen)
        for lr, code in seen.items():
            if code != 0 and lr not in failed:
                grank = self._global_ranks.get(lr, lr)
                failed[lr] = (grank, lr, self._pids.get(lr, -1), code, "")
        out = []
        for grank, lr, pid, code, error_file in sorted(failed.values()):
            err = errors.read_error_file(self._error_files.get(lr) or error_file)
            message, tb, ts = err if err else ("", None, None)
            # Collateral: first seen dead only after torch began terminating the group.
            collateral = lr in self._exit_by_agent or lr not in self._exit_seen
            tail = () if tb else errors.tail_lines(self._stderr_paths.get(lr))
            if not message:
                # Without @record, a rank that exited with an error code usually printed the
                # exception last; a signalled one was cut off mid-stream.
                last = next((ln.strip() for ln in reversed(tail) if ln.strip()), "")
                last = _RANK_PREFIX.sub("", last) if code > 0 else ""
                message = last or errors.describe_exit(code)
            when = exit_times.get(lr) or ts or time.time()
            out.append(
                Failure(
                    attempt=self._attempt,
                    local_rank=lr,
                    global_rank=grank,
                    host=self.host,
                    pid=pid,
                    exit_code=code,
                    signal=errors.signal_name(code),
                    hint=errors.hint_for(code),
                    time=when,
                    message=message,
                    traceback=tb,
                    stderr_tail=tail,
                    error_file=(self._error_files.get(lr) or None) if err else None,
                    collateral=collateral,
                    caused_by=self._marks.get(pid),
                )
            )
        return tuple(out)

    def _rank_exits(self) -> list[RankExited]:
        return [
            e
            for e in self.store.events()
            if isinstance(e, RankExited) and e.attempt == self._attempt
        ]

    def _on_restart(self, agent: Any, wg: Any) -> None:
        self.injector.attempt_ended(self._attempt)
        cause = self._pending_cause or "membership"
        self._pending_cause = None
        if cause == "failure":
            self._failure_restarts += 1
        self._phase = "restarting"
        self.store.post(
            Restart(
                cause=cause,
                from_attempt=self._attempt,
                to_attempt=self._attempt + 1,
                restarts_used=self._attempt + 1,
                budget_left=max(0, self._user_max_restarts - self._failure_restarts),
            )
        )

    def _on_workers_stopped(self, agent: Any) -> None:
        self.injector.attempt_ended(self._attempt)
        self._poll_exits(agent, by_agent=True)
        if self._attempt >= 0:
            self.tailer.close_attempt(self._attempt)

    def _on_exit_barrier(self, done: bool) -> None:
        self._phase = "exit_barrier" if not done else "finishing"
        self.store.post(ExitBarrier(attempt=self._attempt, done=done))

    def wrap_logs_specs(self, logs_specs: Any, spec: Any) -> CapturingLogsSpecs:
        """Wrap the user's ``LogsSpecs`` so every rank's output lands in files."""
        return CapturingLogsSpecs(
            logs_specs,
            role=spec.role,
            prefix_template=os.getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
            echo=self.echo,
            on_reify=self._on_reify,
        )


def make_agent_class(runner: Runner, base: type) -> type:
    """A subclass of torch's ``LocalElasticAgent`` that reports to ``runner``.

    Every override calls torch's own implementation; constructor arguments are passed through
    untouched (they differ between torch releases) except ``logs_specs``, which is wrapped.
    """

    class ObservingAgent(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            spec = kwargs.get("spec", args[0] if args else None)
            if "logs_specs" in kwargs:
                kwargs["logs_specs"] = runner.wrap_logs_specs(kwargs["logs_specs"], spec)
            elif len(args) > 1:
                args = (args[0], runner.wrap_logs_specs(args[1], spec), *args[2:])
            super().__init__(*args, **kwargs)
            runner._on_agent_created(self)

        def _rendezvous(self, worker_group: Any) -> None:
            runner._check_stop()
            runner._on_rendezvous(self)
            super()._rendezvous(worker_group)
            runner._on_rendezvous_done(self, worker_group)

        def _start_workers(self, worker_group: Any) -> dict[int, Any]:
            runner._check_stop()  # a stopped run never spawns another attempt
            pids = super()._start_workers(worker_group)
            runner._on_workers_started(self, worker_group, pids)
            return pids

        def _monitor_workers(self, worker_group: Any) -> Any:
            return runner._monitor(self, worker_group, super()._monitor_workers)

        def _restart_workers(self, worker_group: Any) -> None:
            runner._on_restart(self, worker_group)
            super()._restart_workers(worker_group)

        def _shutdown(self, *args: Any, **kwargs: Any) -> None:
            runner._continue_stopped()
            try:
                super()._shutdown(*args, **kwargs)
            finally:
                runner._on_workers_stopped(self)

        def _exit_barrier(self) -> None:
            runner._on_exit_barrier(False)
            try:
                super()._exit_barrier()
            finally:
                runner._on_exit_barrier(True)

    ObservingAgent.__name__ = ObservingAgent.__qualname__ = "ObservingAgent"
    return ObservingAgent


@contextlib.contextmanager
def _swap_agent(module: Any, cls: type) -> Iterator[None]:
    # launch_agent looks LocalElasticAgent up in its module at call time.
    original = module.LocalElasticAgent
    module.LocalElasticAgent = cls
    try:
        yield
    finally:
        module.LocalElasticAgent = original


def exit_codes(pcontext: Any) -> dict[int, int | None]:
    """Exit code of each local rank's process (None while running), for either context kind.

    ``Popen.poll`` reaps and caches the status, so torch's own poll sees the same value.
    """
    if pcontext is None:
        return {}
    handlers = getattr(pcontext, "subprocess_handlers", None)
    if handlers:
        return {lr: h.proc.poll() for lr, h in handlers.items()}
    pc = getattr(pcontext, "_pc", None)
    if pc is not None:
        return {lr: p.exitcode for lr, p in enumerate(pc.processes)}
    return {}


def _endpoint(handler: Any, args: argparse.Namespace) -> str:
    # --standalone asks for localhost:0; the real port is the store's.
    ep = str(getattr(args, "rdzv_endpoint", "") or "")
    if args.rdzv_backend == "static" and not ep:
        ep = f"{args.master_addr}:{args.master_port}"
    port = None
    for store in (
        getattr(handler, "_store", None),
        getattr(getattr(getattr(handler, "_state_holder", None), "_backend", None), "_store", None),
    ):
        store = getattr(store, "underlying_store", store)  # a PrefixStore wraps the TCPStore
        port = port or getattr(store, "port", None)
    if ep.endswith(":0") and port:
        ep = f"{ep[:-2]}:{port}"
    return ep


def _safe(fn: Callable[[], Any], default: Any) -> str:
    try:
        return str(fn())
    except Exception:
        return str(default)


def _signal_group(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def one_line_error(e: BaseException) -> str:
    """torch's exceptions (C++ ones included) reduced to one line, with their inner cause.

    torch often wraps the informative error ("connect timeout", "address already in use")
    in a generic one ("See inner exception for details"): both go on the line.
    """

    def first_line(x: BaseException) -> str:
        text = str(x).strip() or type(x).__name__
        first = text.splitlines()[0].strip()
        name = type(x).__name__
        return first if first.startswith(name) else f"{name}: {first}"

    line = first_line(e).replace(" See inner exception for details.", "")
    inner = e.__cause__ or e.__context__
    seen = {id(e)}
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        line += f" <- {first_line(inner)}"
        inner = inner.__cause__ or inner.__context__
    return line


def _failed_here(failures: tuple[Failure, ...]) -> bool:
    """Whether some rank failed by itself: not terminated by torch (collateral), and not
    killed by a peer's broken collective (a socket error from a rank on another node)."""
    return any(
        not f.collateral
        and f.exit_code != 0
        and not errors.peer_failure(f.message, f.traceback, *f.stderr_tail)
        for f in failures
    )


def _failure_line(f: Failure) -> str:
    what = errors.describe_exit(f.exit_code)
    return f"rank {f.global_rank} (local {f.local_rank}, pid {f.pid}) failed: {what}"


def _silence_thread_warning() -> None:
    # Running the agent off the main thread is deliberate: tuilaunch handles the signals
    # itself and cleans up orphans, so torch's warning about it is wrong here.
    import logging

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return _TORCH_THREAD_WARNING not in str(record.msg)

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_Drop())
