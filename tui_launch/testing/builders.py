"""Small builders of the events a run is made of, shared by the scenarios and the store's tests.

An attempt (:func:`attempt`, or :func:`nodes_round` for several nodes), its workers
(:func:`workers_started`), an exit (:func:`exited`), a failure (:func:`failure`,
:func:`failed_attempt`), a run's start (:func:`run_started`), telemetry read from the fake NVML
(:func:`telemetry`), log lines (:func:`fill_logs`). A builder given ``at`` (seconds after the
run's start) stamps its events on the fake clock (:data:`T0_MONO`, :data:`T0_WALL`); without
it the events carry the real clocks, as posted.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from tui_launch.core.diagnosis.stacks import StackDump
from tui_launch.core.logs.sinks import LogBuffer
from tui_launch.core.logs.tail import LogSource
from tui_launch.core.model.events import (
    AttemptFailed,
    Event,
    Failure,
    GpuState,
    NodeStatus,
    Participant,
    RankExited,
    RankReading,
    RendezvousCompleted,
    RendezvousSample,
    RendezvousStarted,
    RunStarted,
    StacksDumped,
    TelemetrySample,
    WorkerInfo,
    WorkersStarted,
)
from tui_launch.core.model.layout import RunDirLayout

# The run directory the built events name (nothing is written there).
LOGS = RunDirLayout("/logs")

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
        attempt=attempt, workers=workers, log_dir=LOGS.attempt_dir(attempt), **_at(at)
    )


def attempt(n: int, nproc: int, start: float, pid0: int) -> list[Event]:
    """Attempt ``n`` on one node: its rendezvous, its workers (pids from ``pid0``), a sample."""
    return [
        *nodes_round(n, ["node0.cluster:4242"], nproc, start, pid0, rdzv_s=0.4, start_s=0.5),
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
        error_file=LOGS.error_file(attempt, 1),
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


def fill_logs(logs: LogBuffer, nproc: int, attempt: int, epochs: int) -> None:
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


def telemetry(
    attempt: int,
    nproc: int,
    pid0: int,
    start: float,
    ticks: int,
    *,
    gpus: int | None = None,
    cvd: str | None = None,
    d_state_rank: int | None = None,
    gpu_state: str = GpuState.OFF,
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
    from tui_launch.core.telemetry import fake_nvml as fake_pynvml

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
                if dev is not None and by_index[dev].state == GpuState.OK:
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


def nodes_round(
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


def node_status(
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


def fake_dump(reason: str, ranks: list[tuple[int, int, int]]) -> StackDump:
    """A deterministic stack dump of ``ranks`` ((local, global, pid)): rank 1 waits in its own
    ``load_batch``, every other rank in ``all_reduce`` (the textbook hang)."""
    from tui_launch.core.diagnosis.stacks import Frame, ProcessStack, RankStack, ThreadStack

    dist = "torch/distributed/distributed_c10d.py"
    waiting = (
        Frame("all_reduce", dist, 3252, "/site-packages/" + dist),
        Frame("train_step", "train.py", 87),
        Frame("main", "train.py", 120),
    )
    odd = (
        Frame("load_batch", "data.py", 41),
        Frame("train_step", "train.py", 80),
        Frame("main", "train.py", 120),
    )
    out = []
    for local, grank, pid in ranks:
        frames = odd if grank == 1 else waiting
        main = ThreadStack(thread_id=1, name="MainThread", frames=frames, native_id=pid, main=True)
        proc = ProcessStack(pid=pid, state="S", method="py-spy", threads=(main,), duration=0.05)
        out.append(RankStack(local_rank=local, global_rank=grank, process=proc))
    return StackDump(reason=reason, wall=T0_WALL + 94.0, duration=0.08, ranks=tuple(out))


def fake_dumped(dump: StackDump, path: str, source: str) -> StacksDumped:
    """The event the runner would post for ``dump`` kept at ``path``, stamped at the fake clock."""
    from tui_launch.testing.scale import dumped

    return dataclasses.replace(dumped(dump, path, source), **at(94.0))


def progress(
    attempt: int,
    nproc: int,
    start: float,
    end: float,
    rate: float,
    *,
    first_step: int = 0,
    total: int | None = None,
    printing: tuple[int, ...] = (0,),
    fmt: str = "tqdm",
    final: bool = False,
) -> list[Event]:
    """Progress events of one attempt, made by the real watcher from made-up log lines.

    The printing ranks write a step line (``fmt``: ``tqdm`` or ``plain``) every quarter
    second from ``start + 1`` to ``end`` at ``rate`` steps/s from ``first_step``; the watcher
    (:class:`~tui_launch.core.progress.watch.ProgressWatch`, on a fake clock) samples once a
    second. ``final``: end with the attempt's last (journaled) record, as when it ended.
    """
    import dataclasses

    from tui_launch.core.progress.watch import ProgressWatch

    out: list[Event] = []
    now = [T0_MONO + start]
    watch = ProgressWatch(out.append, clock=lambda: now[0])
    watch.on_event(workers_started(attempt, nproc, 5100 + 100 * attempt, at=start))
    t, last_tick = start + 1.0, start
    while t <= end:
        now[0] = T0_MONO + t
        step = first_step + int(rate * (t - start - 1.0))
        for rank in printing:
            if fmt == "tqdm" and total:
                pct = 100 * step // total
                bar = "#" * (10 * step // total)
                line = f"\rtrain: {pct:3d}%|{bar:10s}| {step}/{total} [00:10<00:30, {rate:.2f}it/s]"
            elif fmt == "tqdm":
                line = f"\rtrain: {step}it [00:10, {rate:.2f}it/s]"
            else:
                line = f"step {step}{'/' + str(total) if total else ''} loss {1.0 / (step + 1):.4f}"
            src = LogSource(attempt, rank, rank, "stderr", "", False, None)
            watch.on_lines(src, [line])
        if t - last_tick >= 1.0:
            last_tick = t
            watch.tick()
        t += 0.25
    if final:
        watch.tick(final=True)
    # Stamp the events with the fake clock's times (the watcher takes ``wall`` from the OS).
    return [dataclasses.replace(e, **_at(e.mono - T0_MONO)) for e in out]


T0_MONO = 1000.0


T0_WALL = 1_790_000_000.0
