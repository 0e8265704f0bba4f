"""Failure collection: an attempt's failed ranks as
:class:`~tui_launch.core.model.events.Failure`\\ s.

:func:`collect_failures` is a pure function of what it is given (torch's monitor result, a
view of the rank table, the attempt's error and stderr files), so that it can be tested
without a torch process. The evidence for each rank, best first: the ``@record`` error file
(message and traceback), else the last line of its stderr (with torch's ``[rankN]:`` prefix
stripped), else its exit code in words.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from collections.abc import Callable, Iterable, Mapping

from tui_launch.core.launch.validate import min_max_nodes
from tui_launch.core.model import diskspace, errors, failclass
from tui_launch.core.model.events import (
    Connecting,
    Failure,
    HangDetected,
    RendezvousSample,
    StacksDumped,
)
from tui_launch.core.model.text import stood_still
from tui_launch.core.run import inject
from tui_launch.core.run.shutdown import signal_exit_code
from tui_launch.core.seam import rendezvous
from tui_launch.core.seam.agent import ProcessFailure, Worker
from tui_launch.core.workers.table import RanksView

# torch's worker-side excepthook prefixes traceback lines with "[rank1]: ".
RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
NO_SPACE = "no space left on device"


def collect_failures(
    *,
    reported: Mapping[int, ProcessFailure],
    workers: Iterable[Worker],
    ranks: RanksView,
    error_files: Mapping[int, str],
    stderr_paths: Mapping[int, str],
    host: str,
    now: float | None = None,
) -> tuple[Failure, ...]:
    """Every failed rank of one attempt, sorted by global rank.

    Args:
        reported: torch's ``RunResult.failures`` (by global rank).
        workers: the worker group's workers (global rank -> local rank).
        ranks: the rank table's view of the attempt: exits seen (and whether torch was
            already terminating the group then), pids, exit times and tuilaunch's marks.
        error_files: torch's error file of each local rank (``@record``).
        stderr_paths: each local rank's stderr log.
        host: this node's name.
        now: the time of a failure with no recorded exit and no error file (default: now).
    """
    by_global = {w.global_rank: w for w in workers}
    # (global rank, local rank, pid, exit code, torch's error file) of every failed rank.
    failed: dict[int, tuple[int, int, int, int, str]] = {}
    for grank, pf in reported.items():
        worker = by_global.get(grank)
        lr = worker.local_rank if worker is not None else pf.local_rank
        failed[lr] = (grank, lr, int(pf.pid), int(pf.exitcode), pf.error_file)
    # Older torch (2.6) reports only the ranks that failed before it tore the group down; the
    # peers it terminated are failures of this attempt too (marked collateral below).
    for lr, code in ranks.exits.items():
        if code != 0 and lr not in failed:
            grank = ranks.global_ranks.get(lr, lr)
            failed[lr] = (grank, lr, ranks.pids.get(lr, -1), code, "")
    out = []
    for grank, lr, pid, code, error_file in sorted(failed.values()):
        err = errors.read_error_file(error_files.get(lr) or error_file)
        message, tb, ts = err if err else ("", None, None)
        # Collateral: first seen dead only after torch began terminating the group.
        collateral = lr in ranks.by_agent or lr not in ranks.exits
        tail = () if tb else errors.evidence_tail(stderr_paths.get(lr))
        if not message:
            # Without @record, a rank that exited with an error code usually printed the
            # exception last; a signalled one was cut off mid-stream. Only an error line
            # counts (a trailing warning or progress line says nothing about the exit).
            last = errors.last_error_line(tail)
            last = RANK_PREFIX.sub("", last) if code > 0 else ""
            message = last or _disk_full(stderr_paths.get(lr), code) or errors.describe_exit(code)
        caused_by = ranks.marks.get(pid)
        when = ranks.exit_times.get(lr) or ts or (time.time() if now is None else now)
        out.append(
            Failure(
                attempt=ranks.attempt,
                local_rank=lr,
                global_rank=grank,
                host=host,
                pid=pid,
                exit_code=code,
                signal=errors.signal_name(code),
                # "often the OOM killer" guesses at an unknown sender: none when it is known.
                hint=None if caused_by else errors.hint_for(code),
                time=when,
                message=message,
                traceback=tb,
                stderr_tail=tail,
                error_file=(error_files.get(lr) or None) if err else None,
                collateral=collateral,
                caused_by=caused_by,
            )
        )
    return tuple(out)


def classified(
    failures: tuple[Failure, ...],
    steps: Mapping[int, int | None],
    returned: Callable[[int], bool],
    oom_kill: Callable[[int], str | None],
) -> tuple[Failure, ...]:
    """The failures, each with its class (:mod:`~tui_launch.core.model.failclass`) and step.

    Args:
        failures: the attempt's failures.
        steps: the training step each global rank was last seen at.
        returned: whether the worker with this pid had its ``main`` return (the bootstrap's
            marker).
        oom_kill: where an OOM kill of this pid shows (None: nowhere), asked for SIGKILLs only.
    """
    out = []
    for f in failures:
        step = steps.get(f.global_rank)
        oom = oom_kill(f.pid) if f.exit_code == -signal.SIGKILL and not f.caused_by else None
        c = failclass.classify(
            exit_code=f.exit_code,
            message=f.message,
            traceback=f.traceback,
            stderr_tail=f.stderr_tail,
            caused_by=f.caused_by,
            collateral=f.collateral,
            hung=f.hung,
            step=step,
            main_returned=returned(f.pid),
            oom_kill=oom,
        )
        out.append(dataclasses.replace(f, failure_class=c.cls, failure_detail=c.detail, step=step))
    return tuple(out)


def _disk_full(stderr_path: str | None, code: int) -> str | None:
    """A rank that died with no word of why, its logs on a full file system: say that.

    Its last write (and the traceback after it) had nowhere to go, so "exit 1" is all torch
    knows; the full file system is the likeliest cause, and the one thing the user can fix.
    """
    if code <= 0 or not stderr_path:  # a signal says why by itself
        return None
    full = diskspace.full_filesystem(stderr_path)
    if full is None:
        return None
    return (
        f"{NO_SPACE}: the file system of its logs, {full}, is full; its output and any "
        f"traceback could not be written ({stderr_path})"
    )


def run_outcome(
    error: BaseException | None,
    stop_signal: signal.Signals | None,
    root_cause: Failure | None,
    live: RendezvousSample | None,
    nnodes: str,
    connecting: Connecting | None = None,
) -> tuple[str, int, str]:
    """How a run ended: (outcome, exit status, one-line message).

    Args:
        error: what ``torch.distributed.run.run`` raised (None: it returned).
        stop_signal: the signal of a stop tuilaunch was asked for, if any.
        root_cause: the store's root cause (for workers that failed).
        live: the last rendezvous sample (for a rendezvous that timed out).
        nnodes: ``--nnodes``.
        connecting: what the launcher contacted first (for a store that never answered).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if error is None:
        return "succeeded", 0, "all ranks exited 0"
    if isinstance(error, ChildFailedError):
        line = failure_line(root_cause) if root_cause else "workers failed"
        if root_cause is not None and errors.peer_failure(root_cause.message):
            gone = rendezvous.store_gone(connecting, live)  # the peer's node hosted the store
            if gone:
                line = f"{line}; {gone}"
        return "failed", 1, line
    if isinstance(error, SignalException):
        return "stopped", signal_exit_code(error.sigval), f"stopped by {error.sigval.name}"
    if isinstance(error, inject.InjectError):  # a rank out of range, found at the rendezvous
        return "error", 2, str(error)
    if stop_signal is not None:
        return "stopped", signal_exit_code(stop_signal), f"stopped by {stop_signal.name}"
    return (
        "error",
        1,
        (
            rendezvous_error(error, nnodes, live)
            or rendezvous.store_error(error, connecting, live)  # reached, then lost
            or connect_error(error, connecting)
            or errors.one_line_error(error)
        ),
    )


def error_class(
    error: BaseException | None,
    live: RendezvousSample | None,
    nnodes: str,
    connecting: Connecting | None = None,
) -> str:
    """The failure class of an error torch raised outside the workers ("" when none fits):
    too few nodes within the join timeout is a node lost; a store never reached or lost is
    a backend error. A spare of another run (the same ``--rdzv-id``) is neither: a mistake."""
    if error is None or not isinstance(error, Exception):
        return ""
    if rendezvous_error(error, nnodes, live):
        return failclass.NODE_LOST
    lost = rendezvous.store_error(error, connecting, live)
    if lost:
        return "" if "already complete" in lost else failclass.BACKEND
    if connect_error(error, connecting):
        return failclass.BACKEND
    return ""


def failure_line(f: Failure) -> str:
    """The run's one-line outcome when ``f`` is its root cause."""
    if f.hung:
        return f"rank {f.global_rank} (local {f.local_rank}, pid {f.pid}) hung: {f.message[6:]}"
    what = errors.describe_exit(f.exit_code)
    if f.message.startswith(NO_SPACE):
        what += f" ({f.message})"
    if f.failure_class:
        what += f"; {failclass.describe(f.failure_class, f.failure_detail)}"
    return f"rank {f.global_rank} (local {f.local_rank}, pid {f.pid}) failed: {what}"


def rendezvous_error(e: BaseException, nnodes: str, live: RendezvousSample | None) -> str | None:
    """Below MIN nodes until the join timeout: say so in words, not torch's class name.

    None when ``e`` is not torch's ``RendezvousTimeoutError``.
    """
    if type(e).__name__ != "RendezvousTimeoutError":
        return None
    lo, hi = min_max_nodes(nnodes)
    joined = len(live.participants) if live is not None and not live.complete else None
    timeout = live.join_timeout if live is not None else None
    have = f"; {joined} joined" if joined is not None else ""
    within = f" within the join timeout ({timeout:g}s)" if timeout else ""
    return (
        f"rendezvous timed out: fewer than the minimum of {lo} node(s) (--nnodes {lo}:{hi}) "
        f"joined{within}{have}. Start more nodes or lower MIN. ({errors.one_line_error(e)})"
    )


def connect_error(e: BaseException, connecting: Connecting | None) -> str | None:
    """The rendezvous store never answered: one sentence naming the endpoint and the timeout.

    None unless ``e`` is torch's ``RendezvousConnectionError``.
    """
    if type(e).__name__ != "RendezvousConnectionError":
        return None
    where = (
        f"{connecting.backend} rendezvous store at {connecting.endpoint}"
        if connecting
        else ("rendezvous store")
    )
    within = ""
    if connecting is not None and connecting.timeout:
        within = f" within its connect timeout ({connecting.timeout:g}s)"
    return (
        f"could not reach the {where}{within}: nothing answered there. Start the node that "
        f"hosts the store first (or give it --rdzv-conf is_host=1), or check --rdzv-endpoint; "
        f"--rdzv-conf read_timeout=SECONDS waits longer. ({errors.one_line_error(e)})"
    )


def with_peers(failures: tuple[Failure, ...], dump: StacksDumped) -> tuple[Failure, ...]:
    """The failures, each real one pointing to the dump of the ranks that survived it."""
    return tuple(
        f if f.collateral else dataclasses.replace(f, stacks=dump.path, peers=dump.places)
        for f in failures
    )


def hang_failure(
    hang: HangDetected, local_rank: int, global_rank: int, pid: int, host: str
) -> Failure:
    """A confirmed hang as a failure of ``global_rank`` (the root cause of the attempt)."""
    return Failure(
        attempt=hang.attempt,
        local_rank=local_rank,
        global_rank=global_rank,
        host=host,
        pid=pid,
        exit_code=0,
        signal=None,
        hint=hang.confirmation,
        time=hang.wall,
        message=f"hang: {hang.verdict}",
        traceback=None,
        stderr_tail=(),
        error_file=None,
        stacks=hang.second_path,
        hung=True,
        caused_by=f"{stood_still(hang)}; --on-hang {hang.action}",
        failure_class=failclass.HANG,
        failure_detail=hang.verdict[:200],
    )


def hang_failures(hang: HangDetected, view: RanksView, host: str) -> tuple[Failure, ...]:
    """The failures of a confirmed hang: the odd ranks out (every still rank when none is odd)
    that run on this node."""
    named = hang.odd_ranks or hang.still_ranks or tuple(view.global_ranks.values())
    by_global = {g: lr for lr, g in view.global_ranks.items()}
    out = []
    for g in named:
        lr = by_global.get(g)
        if lr is not None and lr in view.pids:
            out.append(hang_failure(hang, lr, g, view.pids[lr], host))
    return tuple(out)
