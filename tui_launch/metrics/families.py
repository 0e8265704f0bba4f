"""The run's metric families, built from one store snapshot.

A scrape reads the store's :class:`~tui_launch.core.model.store.Snapshot` and walks a few tuples: it
never calls NVML nor reads ``/proc`` (the telemetry sampler did, within its own budget). Two
facts the snapshot does not keep come from the store's journaled events through
:class:`EventTally`: every rank's exits over all attempts, and the attempt's log directory,
whose files' mtimes give each rank's last output time.

- :func:`build_families`: one snapshot in, metric families out (pure; the tests call it).
- :class:`RunCollector`: those families for a *custom* ``prometheus_client`` registry.
- training progress, hangs and collectives: :mod:`tui_launch.metrics.progress`.

Labels are bounded: ``node``, ``rank``, ``local_rank``, ``gpu`` (plus the label-valued info
metrics). Never a pid or an attempt number: both change on every restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from tui_launch import __version__
from tui_launch.core.model.events import Event, EventTable, RankExited, WorkersStarted
from tui_launch.core.model.layout import STREAMS, rank_log_in
from tui_launch.core.model.store import (
    EXITED,
    FAILED,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    Snapshot,
)
from tui_launch.metrics.common import RANK, gauge
from tui_launch.metrics.node import NodeLabel
from tui_launch.metrics.progress import (
    collective_families,
    hang_families,
    progress_families,
    progress_of,
)

if TYPE_CHECKING:
    from tui_launch.core.launch.args import Options

RANK_STATES = (STARTING, RUNNING, STOPPED, EXITED, FAILED, RESTARTING)
RESTART_CAUSES = ("failure", "manual", "membership")
_UP_STATES = (STARTING, RUNNING, STOPPED)  # the process is alive (a stopped one too)

ExtraProvider = Callable[[Snapshot], Iterable[Metric]]
"""A source of more families, called on every scrape with the same snapshot.

It must be as cheap as the rest (read the snapshot, no I/O). An exception from it drops its
families from that scrape only. This is how progress and hang detection plug in until the
snapshot carries them: see :mod:`tui_launch.metrics.progress`.
"""


@dataclass(frozen=True)
class RunInfo:
    """Facts about the run that are not events.

    ``run_id`` and ``torch`` default to the snapshot's ``RunStarted`` (the rendezvous's run id
    is only known once torch's agent made it, e.g. a fresh uuid under ``--standalone``).
    ``sample_interval`` is the telemetry period (``--gpu-interval``): CPU % samples times it
    give CPU seconds.
    """

    node: str | None = None  # None: the collector's NodeLabel (host name, or host/group rank)
    run_id: str | None = None
    version: str = __version__
    torch: str | None = None
    sample_interval: float = 1.0


def run_info(opts: Options, node: str | None = None) -> RunInfo:
    """This node's :class:`RunInfo` for ``opts``; ``node`` None leaves the label to
    :class:`~tui_launch.metrics.node.NodeLabel` (the host name, or ``<host>/<group rank>``
    when several agents of the run share the host)."""
    torch = sys.modules.get("torch")
    return RunInfo(
        node=node,
        torch=getattr(torch, "__version__", None),
        sample_interval=opts.gpu_interval,
    )


# ------------------------------------------------------------------- what the snapshot lacks


def exit_reason(exit_code: int, signal_name: str | None) -> str:
    """A bounded label value: the signal's name (``SIGKILL``) or ``exit_<code>``."""
    if signal_name:
        return signal_name
    if exit_code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-exit_code).name
        return f"signal_{-exit_code}"
    return f"exit_{exit_code}"


# What EventTally folds, by event type (as the store reduces them); any other event is no fact
# for it.
_TALLIES: EventTable[Callable[[EventTally, Any], None]] = EventTable("tally")


class EventTally:
    """A store listener for the two things a snapshot does not keep.

    The snapshot holds only the current attempt's ranks, so exits of earlier attempts (a
    SIGTERM of a manual restart, say) would vanish from a count made from it, and a counter must
    never go down. The snapshot does not keep the log directory either. Subscribe with
    ``store.subscribe(tally, replay=True)``; it runs under the store's lock and only updates
    two dicts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[int, int]] = set()
        self._exits: dict[tuple[int, int, str], int] = {}
        self._log_dir: str | None = None

    def __call__(self, e: Event) -> None:
        """Fold one journaled event."""
        fold = _TALLIES.get(type(e))
        if fold is not None:
            fold(self, e)

    @_TALLIES.on(RankExited)
    def _exited(self, e: RankExited) -> None:
        with self._lock:
            # The runner may report one exit twice (monitor, then reaper): count it once.
            if (e.attempt, e.local_rank) in self._seen:
                return
            self._seen.add((e.attempt, e.local_rank))
            key = (e.global_rank, e.local_rank, exit_reason(e.exit_code, e.signal))
            self._exits[key] = self._exits.get(key, 0) + 1

    @_TALLIES.on(WorkersStarted)
    def _started(self, e: WorkersStarted) -> None:
        self._log_dir = e.log_dir

    def exits(self) -> dict[tuple[int, int, str], int]:
        """``(rank, local_rank, reason) -> count`` over the whole run."""
        with self._lock:
            return dict(self._exits)

    @property
    def log_dir(self) -> str | None:
        """The latest attempt's log directory (``<dir>/<local_rank>/stdout.log``)."""
        return self._log_dir


def last_output_times(log_dir: str | None, local_ranks: Iterable[int]) -> dict[int, float]:
    """Per local rank, the newest mtime of its ``stdout.log``/``stderr.log`` (two stat calls)."""
    out: dict[int, float] = {}
    if not log_dir:
        return out
    for lr in local_ranks:
        for stream in STREAMS:
            with contextlib.suppress(OSError):
                mtime = os.stat(rank_log_in(log_dir, lr, stream)).st_mtime
                out[lr] = max(out.get(lr, 0.0), mtime)
    return out


# -------------------------------------------------------------------------- the families


def build_families(
    snap: Snapshot,
    info: RunInfo,
    *,
    exits: dict[tuple[int, int, str], int] | None = None,
    last_output: dict[int, float] | None = None,
    cpu_seconds: dict[tuple[int, int], float] | None = None,
    final: bool = False,
) -> list[Metric]:
    """Every built-in family for one snapshot (pure: no I/O, no clock).

    ``exits`` comes from :class:`EventTally`, ``last_output`` from :func:`last_output_times`;
    ``cpu_seconds`` (``(rank, local_rank) -> seconds``) overrides the estimate from the
    telemetry totals (the collector passes a never-decreasing one). ``final`` marks the run
    finished even if no ``RunFinished`` was posted (the textfile's last write).
    """
    node = info.node or socket.gethostname()
    run = snap.run
    fams: list[Metric] = []

    fam_info = InfoMetricFamily("tuilaunch", "The run: its id, this node, tuilaunch and torch.")
    fam_info.add_metric(
        [],
        {
            "run_id": info.run_id or (run.run_id if run else "") or "",
            "node": node,
            "version": info.version,
            "torch": (run.torch_version if run else None) or info.torch or "",
        },
    )
    fams.append(fam_info)

    f = gauge("tuilaunch_run_finished", "1 once the run is over (its last write).", ["node"])
    f.add_metric([node], 1.0 if (snap.finished is not None or final) else 0.0)
    fams.append(f)
    if snap.finished is not None:
        # Only once finished: a 0 before the end would read as success.
        f = gauge("tuilaunch_run_exit_code", "The launcher's exit status.", ["node"])
        f.add_metric([node], float(snap.finished.exit_code))
        fams.append(f)
    if snap.started_wall is not None:
        f = gauge("tuilaunch_run_start_timestamp_seconds", "When the run started.", ["node"])
        f.add_metric([node], snap.started_wall)
        fams.append(f)

    f = gauge("tuilaunch_attempt", "The worker group's attempt (0 first).", ["node"])
    f.add_metric([node], float(snap.attempt))
    fams.append(f)

    states = {s: 0 for s in RANK_STATES}
    for r in snap.ranks:
        states[r.state] = states.get(r.state, 0) + 1
    f = gauge("tuilaunch_workers", "This node's workers by state.", ["node", "state"])
    for state, n in states.items():
        f.add_metric([node, state], float(n))
    fams.append(f)

    c = CounterMetricFamily(
        "tuilaunch_restarts_total", "Worker-group restarts by cause.", labels=["node", "cause"]
    )
    for cause, n in zip(
        RESTART_CAUSES,
        (snap.failure_restarts, snap.manual_restarts, snap.membership_restarts),
        strict=True,
    ):
        c.add_metric([node, cause], float(n))
    fams.append(c)

    f = gauge(
        "tuilaunch_restart_budget_remaining",
        "Restarts on failure left (--max-restarts minus those used).",
        ["node"],
    )
    f.add_metric([node], float(snap.budget_left))
    fams.append(f)

    c = CounterMetricFamily(
        "tuilaunch_failures_total",
        "Rank failures by class (startup, exception, oom, signal, backend, hang, teardown...); "
        "peers the agent terminated are not counted.",
        labels=["node", "class"],
    )
    by_class: dict[str, int] = {}
    for fl in snap.failures:
        if not fl.collateral:
            key = fl.failure_class or "unknown"
            by_class[key] = by_class.get(key, 0) + 1
    for cls, n in sorted(by_class.items()):
        c.add_metric([node, cls], float(n))
    fams.append(c)

    c = CounterMetricFamily(
        "tuilaunch_policy_decisions_total",
        "The restart policy's decisions after failed attempts, by action and rule.",
        labels=["node", "action", "rule"],
    )
    decided: dict[tuple[str, str], int] = {}
    for d in snap.decisions:
        decided[(d.action, d.rule)] = decided.get((d.action, d.rule), 0) + 1
    for (action, rule), n in sorted(decided.items()):
        c.add_metric([node, action, rule], float(n))
    fams.append(c)
    f = gauge(
        "tuilaunch_restarts_saved",
        "Restarts of --max-restarts the policy did not spend (it stopped a doomed loop).",
        ["node"],
    )
    f.add_metric([node], float(sum(d.saved for d in snap.decisions)))
    fams.append(f)
    f = gauge("tuilaunch_preempted", "1 once the launcher was told it is preempted.", ["node"])
    f.add_metric([node], 1.0 if snap.preempted is not None else 0.0)
    fams.append(f)

    f = gauge("tuilaunch_rank_up", "1 while the rank's process is alive.", RANK)
    for r in snap.ranks:
        f.add_metric([node, str(r.global_rank), str(r.local_rank)], float(r.state in _UP_STATES))
    fams.append(f)

    c = CounterMetricFamily(
        "tuilaunch_rank_exits_total",
        "Rank exits by reason: a signal's name or exit_<code>.",
        labels=[*RANK, "reason"],
    )
    for (rank, lr, reason), n in sorted((exits or {}).items()):
        c.add_metric([node, str(rank), str(lr), reason], float(n))
    fams.append(c)

    if last_output:
        f = gauge(
            "tuilaunch_rank_last_output_timestamp_seconds",
            "When the rank last wrote to stdout or stderr (its log files' mtime).",
            RANK,
        )
        for r in snap.ranks:
            if r.local_rank in last_output:
                f.add_metric(
                    [node, str(r.global_rank), str(r.local_rank)], last_output[r.local_rank]
                )
        fams.append(f)

    fams.extend(_telemetry_families(snap, info, cpu_seconds))
    return fams


def cpu_seconds_estimate(snap: Snapshot, interval: float) -> dict[tuple[int, int], float]:
    """CPU seconds per ``(rank, local_rank)`` over every attempt: the telemetry totals' CPU %
    sums times the sampling interval (the sampler keeps no cumulative CPU time)."""
    out: dict[tuple[int, int], float] = {}
    if snap.telemetry is None:
        return out
    for t in snap.telemetry.totals:
        key = (t.global_rank, t.local_rank)
        out[key] = out.get(key, 0.0) + t.cpu_sum / 100.0 * interval
    return out


def _telemetry_families(
    snap: Snapshot, info: RunInfo, cpu_seconds: dict[tuple[int, int], float] | None
) -> list[Metric]:
    tv = snap.telemetry
    if tv is None:
        return []
    node = info.node or socket.gethostname()
    latest = tv.latest
    fams: list[Metric] = []

    c = CounterMetricFamily(
        "tuilaunch_rank_cpu_seconds_total",
        "CPU time of the rank's process tree (sampled CPU % times the sampling interval).",
        labels=list(RANK),
    )
    cpu = cpu_seconds
    if cpu is None:
        cpu = cpu_seconds_estimate(snap, info.sample_interval)
    for (rank, lr), secs in sorted(cpu.items()):
        c.add_metric([node, str(rank), str(lr)], secs)
    fams.append(c)

    # Readings of an earlier attempt describe processes that are gone: not exported.
    readings = latest.ranks if latest.attempt == snap.attempt else ()
    rss = gauge("tuilaunch_rank_rss_bytes", "Resident memory of the rank's process tree.", RANK)
    gmem = gauge(
        "tuilaunch_rank_gpu_memory_bytes",
        "GPU memory of the rank (its own processes', or the whole device's when inferred).",
        [*RANK, "gpu"],
    )
    for r in readings:
        labels = [node, str(r.global_rank), str(r.local_rank)]
        if r.rss is not None:
            rss.add_metric(labels, float(r.rss))
        if r.gpu_mem is not None and r.gpus:
            gmem.add_metric([*labels, ",".join(str(g) for g in r.gpus)], float(r.gpu_mem))
    fams += [rss, gmem]

    g_info = InfoMetricFamily(
        "tuilaunch_gpu", "Each GPU's UUID and model, to join with DCGM.", labels=["node", "gpu"]
    )
    util = gauge("tuilaunch_gpu_utilization_ratio", "GPU utilisation, 0 to 1.", ["node", "gpu"])
    used = gauge("tuilaunch_gpu_memory_used_bytes", "GPU memory used.", ["node", "gpu"])
    total = gauge("tuilaunch_gpu_memory_total_bytes", "GPU memory in all.", ["node", "gpu"])
    power = gauge("tuilaunch_gpu_power_watts", "GPU power draw.", ["node", "gpu"])
    temp = gauge("tuilaunch_gpu_temperature_celsius", "GPU temperature.", ["node", "gpu"])
    for g in latest.gpus:
        labels = [node, str(g.index)]
        g_info.add_metric(labels, {"uuid": g.uuid, "name": g.name})
        for fam, value, scale in (
            (util, g.util, 0.01),
            (used, g.mem_used, 1.0),
            (total, g.mem_total, 1.0),
            (power, g.power, 1.0),
            (temp, g.temp, 1.0),
        ):
            if value is not None:
                fam.add_metric(labels, float(value) * scale)
    fams += [g_info, util, used, total, power, temp]

    f = gauge(
        "tuilaunch_telemetry_timestamp_seconds",
        "When the latest telemetry sample was taken.",
        ["node"],
    )
    f.add_metric([node], latest.wall)
    fams.append(f)
    return fams


# --------------------------------------------------------------------------- collector


class RunCollector(Collector):
    """The run's families for a custom registry; every scrape reads one snapshot."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        info: RunInfo,
        *,
        tally: EventTally | None = None,
        extra: Sequence[ExtraProvider] = (),
    ) -> None:
        self._snapshot = snapshot
        self.info = info
        self.node = NodeLabel(fixed=info.node)
        self.tally = tally
        self.extra = tuple(extra)
        self.final = False  # set before the textfile's last write
        self._lock = threading.Lock()
        self._cpu_high: dict[tuple[int, int], float] = {}

    def run_id(self) -> str | None:
        """The run id, once known (from :class:`RunInfo` or the snapshot)."""
        run = self._snapshot().run
        return self.info.run_id or (run.run_id if run else None)

    def _cpu(self, snap: Snapshot) -> dict[tuple[int, int], float]:
        # The sampler's end totals may replace the store's with a sample fewer: keep the
        # counter from ever going down (Prometheus would read a reset and spike rate()).
        with self._lock:
            for key, v in cpu_seconds_estimate(snap, self.info.sample_interval).items():
                self._cpu_high[key] = max(v, self._cpu_high.get(key, 0.0))
            return dict(self._cpu_high)

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape or write."""
        snap = self._snapshot()
        tally = self.tally
        yield from build_families(
            snap,
            replace(self.info, node=self.node(snap)),
            exits=tally.exits() if tally else None,
            last_output=(
                last_output_times(tally.log_dir, (r.local_rank for r in snap.ranks))
                if tally
                else None
            ),
            cpu_seconds=self._cpu(snap),
            final=self.final,
        )
        node = self.node(snap)
        yield from progress_families(node, progress_of(snap))
        yield from hang_families(
            node,
            ((r.global_rank, r.local_rank, r.global_rank in snap.hung_ranks) for r in snap.ranks),
        )
        yield from collective_families(node, snap)
        for provider in self.extra:
            try:
                fams = list(provider(snap))
            except Exception:  # a broken hook must not take the whole scrape down
                continue
            yield from fams

    def registry(self) -> CollectorRegistry:
        """A fresh custom registry holding only this collector (never the global one)."""
        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        return reg


__all__ = [
    "RANK_STATES",
    "RESTART_CAUSES",
    "EventTally",
    "ExtraProvider",
    "RunCollector",
    "RunInfo",
    "build_families",
    "cpu_seconds_estimate",
    "exit_reason",
    "last_output_times",
    "run_info",
]
