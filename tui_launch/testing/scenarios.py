"""The deterministic runs the dashboard is tested and pictured in, and the builders they share.

Each scenario (:data:`STATES`) is a :class:`~tui_launch.testing.fake_source.FakeSource` made of
real events: the run starting, an attempt's rendezvous and workers, exits, failures, restarts,
telemetry read from the fake NVML. The small builders (:func:`run_started`,
:func:`workers_started`, :func:`attempt`, :func:`exited`, :func:`failure`,
:func:`failed_attempt`) are public: the store's tests build their runs from them too. A builder
given ``at`` (seconds after the scenario's start) stamps its events on the fake clock; without
it the events carry the real clocks, as posted.
"""

from __future__ import annotations

import signal
from typing import Any

from tui_launch.core.events import (
    AttemptFailed,
    ClusterSample,
    Event,
    Failure,
    GroupState,
    NodeChange,
    NodeStatus,
    Participant,
    RankExited,
    RankReading,
    RendezvousCompleted,
    RendezvousSample,
    RendezvousStarted,
    Restart,
    RunFinished,
    RunStarted,
    TelemetrySample,
    WorkerInfo,
    WorkersStarted,
)
from tui_launch.core.logs import LogBuffer, LogSource
from tui_launch.testing.fake_source import T0_MONO, T0_WALL, FakeSource

__all__ = [
    "STATES",
    "T0_MONO",
    "T0_WALL",
    "FakeSource",
    "at",
    "attempt",
    "exited",
    "failed_attempt",
    "failure",
    "run_started",
    "workers_started",
]

TRACEBACK = """Traceback (most recent call last):
  File "examples/train_ddp.py", line 182, in main
    trainer.train(args.epochs)
  File "examples/train_ddp.py", line 121, in train
    self._run_epoch(epoch)
  File "examples/train_ddp.py", line 98, in _run_epoch
    loss = self._run_batch(source, targets)
  File "examples/train_ddp.py", line 87, in _run_batch
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
RuntimeError: CUDA error: an illegal memory access was encountered"""


def at(seconds: float | None) -> dict[str, Any]:
    """The ``mono``/``wall`` keywords of an event ``seconds`` after the start (none for None)."""
    if seconds is None:
        return {}
    return {"mono": T0_MONO + seconds, "wall": T0_WALL + seconds}


# The builders below take an ``at`` argument of their own.
_at = at


def run_started(
    nproc: int = 2,
    max_restarts: int = 3,
    nodes: tuple[int, int] = (1, 1),
    at: float | None = 0.0,
) -> RunStarted:
    """The run's first event: ``nproc`` ranks per node, ``nodes`` (min, max), a budget."""
    return RunStarted(
        entrypoint="examples/train_ddp.py",
        args=("--epochs", "20"),
        role="default",
        nproc_per_node=nproc,
        min_nodes=nodes[0],
        max_nodes=nodes[1],
        max_restarts=max_restarts,
        backend="c10d",
        endpoint="node0.cluster:29400",
        run_id="demo-run-42",
        host="node0",
        launcher_pid=4242,
        torch_version="2.13.0",
        **_at(at),
    )


def workers_started(
    attempt: int, nproc: int, pid0: int, *, world: int | None = None, at: float | None = None
) -> WorkersStarted:
    """An attempt's workers: local rank ``i`` is global rank ``i`` with pid ``pid0 + i``."""
    workers = tuple(
        WorkerInfo(
            local_rank=i, global_rank=i, role_rank=i, world_size=world or nproc, pid=pid0 + i
        )
        for i in range(nproc)
    )
    return WorkersStarted(
        attempt=attempt, workers=workers, log_dir=f"/logs/attempt_{attempt}", **_at(at)
    )


def attempt(n: int, nproc: int, start: float, pid0: int) -> list[Event]:
    """Attempt ``n`` on one node: its rendezvous, its workers (pids from ``pid0``), a sample."""
    return [
        *_nodes_round(n, ["node0.cluster:4242"], nproc, start, pid0, rdzv_s=0.4, start_s=0.5),
        RendezvousSample(
            round=n,
            complete=True,
            closed=False,
            min_nodes=1,
            max_nodes=1,
            join_timeout=600.0,
            participants=(
                Participant(node="node0.cluster:4242", rank=0, heartbeat_age=2, this_node=True),
            ),
            waiting=(),
            **_at(start + 1),
        ),
    ]


def exited(
    attempt: int, rank: int, pid: int, code: int, at: float | None = None, by_agent: bool = False
) -> RankExited:
    """Rank ``rank`` exited with ``code`` (negative: killed by that signal)."""
    sig = signal.Signals(-code).name if code < 0 else None
    return RankExited(
        attempt=attempt,
        local_rank=rank,
        global_rank=rank,
        pid=pid,
        exit_code=code,
        signal=sig,
        by_agent=by_agent,
        **_at(at),
    )


def failure(
    attempt: int,
    rank: int,
    *,
    pid: int,
    at: float,
    code: int = 1,
    message: str | None = None,
    traceback: str | None = None,
    collateral: bool = False,
    host: str = "node0",
    hint: str | None = None,
    error_file: str | None = None,
    stderr_tail: tuple[str, ...] = (),
) -> Failure:
    """One failed rank, ``at`` seconds after the start (its message: the exit by default)."""
    sig = signal.Signals(-code).name if code < 0 else None
    return Failure(
        attempt=attempt,
        local_rank=rank,
        global_rank=rank,
        host=host,
        pid=pid,
        exit_code=code,
        signal=sig,
        hint=hint,
        time=T0_WALL + at,
        message=message if message is not None else f"{sig} ({code})" if sig else f"exit {code}",
        traceback=traceback,
        stderr_tail=stderr_tail,
        error_file=error_file,
        collateral=collateral,
    )


def failed_attempt(attempt: int, at: float) -> AttemptFailed:
    """Rank 1 raised (with its traceback) ``at`` seconds in; the agent then SIGTERMed rank 0."""
    real = failure(
        attempt,
        1,
        pid=5101,
        at=at,
        message="RuntimeError: CUDA error: an illegal memory access was encountered",
        traceback=TRACEBACK,
        error_file=f"/logs/attempt_{attempt}/1/error.json",
    )
    peer = failure(
        attempt,
        0,
        pid=5100,
        at=at + 0.2,
        code=-15,
        hint="terminated by a signal from outside (a scheduler, a user, the agent)",
        collateral=True,
    )
    return AttemptFailed(attempt=attempt, failures=(real, peer), **_at(at + 0.2))


def _fill_logs(logs: LogBuffer, nproc: int, attempt: int, epochs: int) -> None:
    for rank in range(nproc):
        src = LogSource(
            attempt=attempt,
            local_rank=rank,
            global_rank=rank,
            stream="stdout",
            path="",
            console=False,
            prefix=None,
        )
        lines = [
            # Matches attempt()'s pids: the first attempt's base is 5100, the next 5200, ...
            f"[RANK {rank}] start: restart_count={attempt} world_size={nproc} "
            f"pid={5100 + 100 * attempt + rank}"
        ]
        lines += [
            f"[RANK {rank}] Epoch {e} | Batchsize: 32 | Steps: 20 | loss {0.9 / (e + 1):.4f}"
            for e in range(epochs)
        ]
        logs(src, lines)


def _telemetry(
    attempt: int,
    nproc: int,
    pid0: int,
    start: float,
    ticks: int,
    *,
    gpus: int | None = None,
    cvd: str | None = None,
    d_state_rank: int | None = None,
    gpu_state: str = "off",
    note: str = "",
    **fake: Any,
) -> list[Event]:
    """Telemetry samples of one attempt, one per second from ``start + 1``.

    GPU readings come from the real :class:`GpuSampler` reading the fake NVML (``gpus`` GPUs,
    configured with ``fake``), and ranks are mapped to GPUs by the same functions a live run
    uses; CPU and memory figures are made up but fixed.
    """
    import math

    from tui_launch.core.telemetry import GpuSampler, map_rank, visible_device
    from tui_launch.testing import fake_pynvml

    sampler = None
    if gpus is not None:
        procs = {i % gpus: [(pid0 + i, (18 + 3 * i) * fake_pynvml.GIB)] for i in range(nproc)}
        fake_pynvml.configure(gpus, processes=procs if gpus else None, **fake)
        sampler = GpuSampler(fake_pynvml)
        sampler.open()
    out: list[Event] = []
    for k in range(ticks):
        readings, nvprocs = sampler.sample() if sampler else ((), {})
        by_index = {g.index: g for g in readings}
        ranks = []
        for i in range(nproc):
            pid = pid0 + i
            gl, mem, util = map_rank((pid,), nvprocs, by_index)
            mapping = "pid" if gl else None
            if not gl and cvd is not None and sampler is not None:
                dev = visible_device(cvd, i, sampler.uuid_index, len(sampler.gpus))
                if dev is not None and by_index[dev].state == "ok":
                    g = by_index[dev]
                    gl, mem, util, mapping = (dev,), g.mem_used, g.util, "inferred"
            stuck = i == d_state_rank and k >= ticks - 3
            ranks.append(
                RankReading(
                    local_rank=i,
                    global_rank=i,
                    pid=pid,
                    cpu=None if k == 0 else round(92 + 7 * math.sin(0.8 * k + i), 1),
                    rss=(2300 + 40 * i + 5 * k) * (1 << 20),
                    threads=38 + i,
                    status="disk-sleep" if stuck else "running",
                    procs=3,
                    d_state=1 if stuck else 0,
                    gpus=gl,
                    mapping=mapping,
                    gpu_mem=mem,
                    gpu_util=util,
                )
            )
        out.append(
            TelemetrySample(
                attempt=attempt,
                gpu_state=sampler.state if sampler else gpu_state,
                gpu_note=sampler.note if sampler else note,
                gpus=readings,
                ranks=tuple(ranks),
                simulated=sampler.simulated if sampler else False,
                **_at(start + 1 + k),
            )
        )
    if sampler is not None:
        sampler.close()
    return out


def healthy(nproc: int = 4) -> FakeSource:
    """A run in its first attempt, every rank training."""
    events: list[Event] = [run_started(nproc, 3), *attempt(0, nproc, 0.1, 5100)]
    events += _telemetry(0, nproc, 5100, 80.0, 14, gpus=nproc, d_state_rank=nproc - 1)
    src = FakeSource(events=events)
    _fill_logs(src.logs, nproc, 0, 6)
    src.agent = ["2026-11-21 12:00:00 I torch.distributed.elastic: rendezvous complete"]
    src.settle_logs()
    return src


def waiting_for_nodes() -> FakeSource:
    """One node of a 2:4 job waiting in the rendezvous for the others."""
    events: list[Event] = [
        run_started(2, 3, nodes=(2, 4)),
        RendezvousStarted(
            attempt=0,
            backend="c10d",
            endpoint="node0.cluster:29400",
            run_id="demo-run-42",
            **_at(0.1),
        ),
        RendezvousSample(
            round=0,
            complete=False,
            closed=False,
            min_nodes=2,
            max_nodes=4,
            join_timeout=600.0,
            participants=(
                Participant(node="node0.cluster:4242", rank=0, heartbeat_age=1, this_node=True),
            ),
            waiting=(),
            **_at(1),
        ),
    ]
    return FakeSource(events=events, clock=T0_MONO + 42.0)


def failed_with_traceback() -> FakeSource:
    """Rank 1 raised; the budget was spent: the run failed with its root cause."""
    events: list[Event] = [run_started(2, 1), *attempt(0, 2, 0.1, 5100)]
    events += [
        exited(0, 1, 5101, 1, at=30),
        exited(0, 0, 5100, -15, at=30.2, by_agent=True),
        failed_attempt(0, 30),
        GroupState(attempt=0, state="FAILED", **_at(30.3)),
        Restart(
            cause="failure",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=0,
            **_at(30.4),
        ),
        *attempt(1, 2, 30.5, 5200),
        *_telemetry(1, 2, 5200, 60.0, 8, gpus=1, init_error=12),
        exited(1, 1, 5201, 1, at=70),
        exited(1, 0, 5200, -15, at=70.2, by_agent=True),
        failed_attempt(1, 70),
        GroupState(attempt=1, state="FAILED", **_at(70.3)),
        RunFinished(outcome="failed", exit_code=1, message="rank 1 failed", **_at(70.5)),
    ]
    src = FakeSource(events=events)
    _fill_logs(src.logs, 2, 0, 3)
    _fill_logs(src.logs, 2, 1, 2)
    src.settle_logs()
    return src


def restarting() -> FakeSource:
    """Rank 1 was killed (SIGKILL); the agent is re-forming the group."""
    events: list[Event] = [run_started(2, 3), *attempt(0, 2, 0.1, 5100)]
    events += _telemetry(0, 2, 5100, 66.0, 12, gpus=2, lose_after=6, lost_gpus={1})
    kill = failure(
        0,
        1,
        pid=5101,
        at=80,
        code=-9,
        hint="killed: often the kernel's OOM killer (check `dmesg`), or a scheduler",
        stderr_tail=("[RANK 1] Epoch 5 | Batchsize: 32 | Steps: 20 | loss 0.1500",),
    )
    events += [
        exited(0, 1, 5101, -9, at=80),
        exited(0, 0, 5100, -15, at=80.2, by_agent=True),
        AttemptFailed(attempt=0, failures=(kill,), **_at(80.3)),
        GroupState(attempt=0, state="FAILED", **_at(80.3)),
        Restart(
            cause="failure",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=2,
            **_at(80.4),
        ),
        RendezvousStarted(
            attempt=1,
            backend="c10d",
            endpoint="node0.cluster:29400",
            run_id="demo-run-42",
            **_at(80.5),
        ),
    ]
    src = FakeSource(events=events, clock=T0_MONO + 81.0)
    _fill_logs(src.logs, 2, 0, 5)
    src.settle_logs()
    return src


def finished() -> FakeSource:
    """A run that recovered from one failure and succeeded."""
    events: list[Event] = [run_started(2, 3), *attempt(0, 2, 0.1, 5100)]
    events += [
        exited(0, 1, 5101, 1, at=30),
        failed_attempt(0, 30),
        Restart(
            cause="failure",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=2,
            **_at(30.4),
        ),
        *attempt(1, 2, 30.5, 5200),
        *_telemetry(1, 2, 5200, 78.0, 10, note="GPU sampling off (--no-gpu)"),
        exited(1, 0, 5200, 0, at=90),
        exited(1, 1, 5201, 0, at=90.1),
        GroupState(attempt=1, state="SUCCEEDED", **_at(90.2)),
        RunFinished(outcome="succeeded", exit_code=0, message="all ranks exited 0", **_at(90.5)),
    ]
    src = FakeSource(events=events)
    _fill_logs(src.logs, 2, 0, 3)
    _fill_logs(src.logs, 2, 1, 8)
    src.settle_logs()
    return src


def eight_gpus_in_container() -> FakeSource:
    """8 ranks on 8 GPUs in a container: NVML's pids are the host's, so every rank's GPU is
    inferred from LOCAL_RANK and CUDA_VISIBLE_DEVICES (GPU UUIDs, listed in reverse)."""
    from tui_launch.testing.fake_pynvml import PID_OFFSET, gpu_uuid

    nproc = 8
    cvd = ",".join(gpu_uuid(i) for i in reversed(range(nproc)))
    events: list[Event] = [run_started(nproc, 3), *attempt(0, nproc, 0.1, 5100)]
    events += _telemetry(0, nproc, 5100, 80.0, 14, gpus=nproc, cvd=cvd, pid_offset=PID_OFFSET)
    src = FakeSource(events=events)
    _fill_logs(src.logs, nproc, 0, 4)
    src.settle_logs()
    return src


def _nodes_round(
    n: int,
    nodes: list[str],
    nproc: int,
    start: float,
    pid0: int,
    rdzv_s: float = 1.2,
    start_s: float = 1.5,
) -> list[Event]:
    """One rendezvous round of ``nodes`` (this node first, group rank 0) and its workers:
    the rendezvous takes ``rdzv_s``, the workers start ``start_s`` after ``start``."""
    return [
        RendezvousStarted(
            attempt=n,
            backend="c10d",
            endpoint="node0.cluster:29400",
            run_id="demo-run-42",
            **_at(start),
        ),
        RendezvousCompleted(
            attempt=n,
            round=n,
            backend="c10d",
            endpoint="node0.cluster:29400",
            run_id="demo-run-42",
            group_rank=0,
            group_world_size=len(nodes),
            master_addr="node0.cluster",
            master_port=41000 + n,
            participants=tuple(nodes),
            duration=rdzv_s,
            **_at(start + rdzv_s),
        ),
        workers_started(n, nproc, pid0, world=nproc * len(nodes), at=start + start_s),
    ]


def _node(
    i: int, state: str, attempt: int, nproc: int, world: int, age: float, **kw: object
) -> NodeStatus:
    rank_state = {"lost": "running", "restarting": "restarting"}.get(state, state)
    return NodeStatus(
        node=f"node{i}:{4242 + i}",
        host=f"node{i}",
        pid=4242 + i,
        state="running" if state == "lost" else state,
        group_rank=i,
        group_world_size=world,
        local_world_size=nproc,
        attempt=attempt,
        ranks=tuple((i * nproc + lr, lr, 5300 + 100 * i + lr, rank_state) for lr in range(nproc)),
        restarts=(0, 0, attempt),
        gpu=kw.get("gpu"),  # type: ignore[arg-type]
        error=kw.get("error"),  # type: ignore[arg-type]
        age=age,
        this_node=i == 0,
    )


def multinode() -> FakeSource:
    """A 2:4-node elastic job: node2 joined (a membership restart), node3 waits to join, and
    the cluster view shows node2 silent for 25 s."""
    names = [f"node{i}:{4242 + i}" for i in range(3)]
    events: list[Event] = [run_started(2, 3, nodes=(2, 4))]
    events += _nodes_round(0, names[:2], 2, 0.1, 5100)
    events += [
        Restart(
            cause="membership",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=3,
            **_at(40.0),
        ),
        NodeChange(attempt=1, joined=(names[2],), left=(), group_world_size=3, **_at(41.0)),
        *_nodes_round(1, names, 2, 40.1, 5200),
        RendezvousSample(
            round=1,
            complete=True,
            closed=False,
            min_nodes=2,
            max_nodes=4,
            join_timeout=600.0,
            participants=tuple(
                Participant(node=n, rank=i, heartbeat_age=(0, 0, 25)[i], this_node=i == 0)
                for i, n in enumerate(names)
            ),
            waiting=("node3:4245",),
            **_at(90),
        ),
        ClusterSample(
            nodes=(
                _node(0, "running", 1, 2, 3, 0.0, gpu="2 GPU util 97% mem 61/80G"),
                _node(1, "running", 1, 2, 3, 1.0, gpu="2 GPU util 95% mem 60/80G"),
                _node(2, "lost", 1, 2, 3, 25.0, error="rank 5: NCCL watchdog timeout"),
            ),
            store="tcpstore node0.cluster:29400",
            **_at(94),
        ),
    ]
    src = FakeSource(events=events)
    _fill_logs(src.logs, 2, 1, 4)
    src.settle_logs()
    return src


STATES = {
    "healthy": healthy,
    "waiting": waiting_for_nodes,
    "failure": failed_with_traceback,
    "restarting": restarting,
    "finished": finished,
    "gpus8": eight_gpus_in_container,
    "multinode": multinode,
}
