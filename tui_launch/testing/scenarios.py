"""The deterministic runs the dashboard is tested and pictured in (:data:`STATES`).

Each scenario is a :class:`~tui_launch.testing.fake_source.FakeSource` made of real events,
built with :mod:`tui_launch.testing.builders`: the run starting, an attempt's rendezvous and
workers, exits, failures, restarts, telemetry read from the fake NVML, log lines.
"""

from __future__ import annotations

from tui_launch.core.model.commands import DumpStacks
from tui_launch.core.model.events import (
    AttemptFailed,
    ClusterSample,
    Connecting,
    Event,
    GroupState,
    NodeChange,
    Participant,
    RendezvousSample,
    RendezvousStarted,
    Restart,
    RunFinished,
    StoreRetry,
)
from tui_launch.testing.builders import (
    T0_MONO,
    T0_WALL,
    at,
    attempt,
    exited,
    failed_attempt,
    failure,
    fill_logs,
    node_status,
    nodes_round,
    progress,
    run_started,
    telemetry,
)
from tui_launch.testing.fake_source import FakeSource


def _source(
    events: list[Event], nproc: int, *logs: tuple[int, int], clock: float | None = None
) -> FakeSource:
    """A fake source of ``events`` whose log buffer holds, for each ``(attempt, epochs)`` of
    ``logs``, ``epochs`` lines of every one of ``nproc`` ranks, settled (nothing pending)."""
    src = FakeSource(events=events) if clock is None else FakeSource(events=events, clock=clock)
    for attempt_no, epochs in logs:
        fill_logs(src.logs, nproc, attempt_no, epochs)
    src.settle_logs()
    return src


def healthy(nproc: int = 4) -> FakeSource:
    """A run in its first attempt, every rank training."""
    events: list[Event] = [run_started(nproc, 3), *attempt(0, nproc, 0.1, 5100)]
    events += telemetry(0, nproc, 5100, 80.0, 14, gpus=nproc, d_state_rank=nproc - 1)
    events += progress(0, nproc, 0.1, 94.5, 4.2, total=2000)
    src = FakeSource(events=events)
    fill_logs(src.logs, nproc, 0, 6)
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
            **at(0.1),
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
            **at(1),
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
        GroupState(attempt=0, state="FAILED", **at(30.3)),
        Restart(
            cause="failure",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=0,
            **at(30.4),
        ),
        *attempt(1, 2, 30.5, 5200),
        *telemetry(1, 2, 5200, 60.0, 8, gpus=1, init_error=12),
        exited(1, 1, 5201, 1, at=70),
        exited(1, 0, 5200, -15, at=70.2, by_agent=True),
        failed_attempt(1, 70),
        GroupState(attempt=1, state="FAILED", **at(70.3)),
        RunFinished(outcome="failed", exit_code=1, message="rank 1 failed", **at(70.5)),
    ]
    return _source(events, 2, (0, 3), (1, 2))


def restarting() -> FakeSource:
    """Rank 1 was killed (SIGKILL); the agent is re-forming the group."""
    events: list[Event] = [run_started(2, 3), *attempt(0, 2, 0.1, 5100)]
    events += telemetry(0, 2, 5100, 66.0, 12, gpus=2, lose_after=6, lost_gpus={1})
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
        AttemptFailed(attempt=0, failures=(kill,), **at(80.3)),
        GroupState(attempt=0, state="FAILED", **at(80.3)),
        Restart(
            cause="failure",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=2,
            **at(80.4),
        ),
        RendezvousStarted(
            attempt=1,
            backend="c10d",
            endpoint="node0.cluster:29400",
            run_id="demo-run-42",
            **at(80.5),
        ),
    ]
    return _source(events, 2, (0, 5), clock=T0_MONO + 81.0)


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
            **at(30.4),
        ),
        *progress(0, 2, 0.1, 30.0, 10.0, total=1000, fmt="plain", final=True),
        *attempt(1, 2, 30.5, 5200),
        *telemetry(1, 2, 5200, 78.0, 10, note="GPU sampling off (--no-gpu)"),
        *progress(1, 2, 30.5, 90.0, 10.0, first_step=200, total=1000, fmt="plain", final=True),
        exited(1, 0, 5200, 0, at=90),
        exited(1, 1, 5201, 0, at=90.1),
        GroupState(attempt=1, state="SUCCEEDED", **at(90.2)),
        RunFinished(outcome="succeeded", exit_code=0, message="all ranks exited 0", **at(90.5)),
    ]
    return _source(events, 2, (0, 3), (1, 8))


def eight_gpus_in_container() -> FakeSource:
    """8 ranks on 8 GPUs in a container: NVML's pids are the host's, so every rank's GPU is
    inferred from LOCAL_RANK and CUDA_VISIBLE_DEVICES (GPU UUIDs, listed in reverse)."""
    from tui_launch.core.telemetry.fake_nvml import PID_OFFSET, gpu_uuid

    nproc = 8
    cvd = ",".join(gpu_uuid(i) for i in reversed(range(nproc)))
    events: list[Event] = [run_started(nproc, 3), *attempt(0, nproc, 0.1, 5100)]
    events += telemetry(0, nproc, 5100, 80.0, 14, gpus=nproc, cvd=cvd, pid_offset=PID_OFFSET)
    return _source(events, nproc, (0, 4))


def multinode() -> FakeSource:
    """A 2:4-node elastic job: node2 joined (a membership restart), node3 waits to join, and
    the cluster view shows node2 silent for 25 s."""
    names = [f"node{i}:{4242 + i}" for i in range(3)]
    events: list[Event] = [run_started(2, 3, nodes=(2, 4))]
    events += nodes_round(0, names[:2], 2, 0.1, 5100)
    events += [
        Restart(
            cause="membership",
            from_attempt=0,
            to_attempt=1,
            restarts_used=1,
            budget_left=3,
            **at(40.0),
        ),
        NodeChange(attempt=1, joined=(names[2],), left=(), group_world_size=3, **at(41.0)),
        *nodes_round(1, names, 2, 40.1, 5200),
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
            **at(90),
        ),
        ClusterSample(
            nodes=(
                node_status(0, "running", 1, 2, 3, 0.0, gpu="2 GPU util 97% mem 61/80G"),
                node_status(1, "running", 1, 2, 3, 1.0, gpu="2 GPU util 95% mem 60/80G"),
                node_status(2, "lost", 1, 2, 3, 25.0, error="rank 5: NCCL watchdog timeout"),
            ),
            store="tcpstore node0.cluster:29400",
            **at(94),
        ),
    ]
    return _source(events, 2, (1, 4))


_ENDPOINT = "10.0.0.7:29400"


def _connecting_events() -> list[Event]:
    return [
        Connecting(
            backend="c10d",
            endpoint=_ENDPOINT,
            min_nodes=2,
            max_nodes=2,
            timeout=60.0,
            join_timeout=600.0,
            **at(0.0),
        ),
        StoreRetry(endpoint=_ENDPOINT, attempt=1, delay=28.6, timeout=60.0, **at(60.0)),
    ]


def connecting() -> FakeSource:
    """A c10d store that nobody serves: the launcher waits in torch's TCPStore client."""
    src = FakeSource(events=_connecting_events())
    src.agent = [
        "[W1121 12:01:00.014587443 TCPStore.cpp:340] [c10d] TCP client failed to "
        f"connect/validate to host {_ENDPOINT} - retrying (try=0, timeout=60000ms, "
        "delay=28634ms): The client socket has timed out after 60000ms"
    ]
    return src


def connect_failed() -> FakeSource:
    """The same store never answered: the run ended before any worker, with torch's error."""
    message = (
        f"could not reach the c10d rendezvous store at {_ENDPOINT} within its connect "
        "timeout (60s): nothing answered there. Start the node that hosts the store first (or "
        "give it --rdzv-conf is_host=1), or check --rdzv-endpoint; --rdzv-conf "
        "read_timeout=SECONDS waits longer. (RendezvousConnectionError: The connection to the "
        "C10d store has failed. <- DistNetworkError: The client socket has timed out after "
        f"60000ms while trying to connect to ({_ENDPOINT.replace(':', ', ')}).)"
    )
    events = [
        *_connecting_events(),
        RunFinished(outcome="error", exit_code=1, message=message, **at(89.5)),
    ]
    src = FakeSource(events=events)
    src.agent = connecting().agent
    return src


def hung(nproc: int = 4) -> FakeSource:
    """A run where rank 1 waits in its own code and the others in all_reduce: two dumps, a
    confirmed hang (--on-hang dump), rank 1 flagged in the Workers table."""
    from tui_launch.core.model.events import HangDetected

    src = healthy(nproc)
    first = src.send(DumpStacks("hang-suspected", source="hang")).dump
    second = src.send(DumpStacks("hang-confirm", source="hang")).dump
    assert first is not None and second is not None
    src.post(
        HangDetected(
            attempt=0,
            silence=310.0,
            interval=10.0,
            still_ranks=tuple(range(nproc)),
            confirmation=f"hung: no main-thread stack moved in 10 s (ranks 0-{nproc - 1})",
            verdict=second.verdict,
            odd_ranks=second.odd_ranks,
            first_path=first.path,
            second_path=second.path,
            action="dump",
            mono=T0_MONO + 94.5,
            wall=T0_WALL + 94.5,
        )
    )
    return src


def nccl_timeout() -> FakeSource:
    """The hung run of :func:`hung`, after NCCL's watchdog timed out: every rank wrote its
    Flight Recorder (:mod:`tui_launch.testing.frgen`, a 2x2x2 Megatron layout in which rank 1
    stopped issuing), judged by ``tuilaunch why``'s judge as the live watch posts it."""
    import shutil
    import tempfile
    from dataclasses import replace

    from tui_launch.core.diagnosis import frdump, frjudge
    from tui_launch.testing import frgen

    src = hung(4)
    directory = tempfile.mkdtemp(prefix="tuilaunch-scenario-")
    try:
        frgen.generate(directory, 4, (1,), tp=2, pp=2, ep=2)
        verdict = frjudge.judge(frdump.load_dir(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    e = verdict.event(0, "nccl", "/runs/demo/flightrec/node0.attempt0.rank_")
    src.post(replace(e, mono=T0_MONO + 96.0, wall=T0_WALL + 96.0))
    return src


def multinode_hung() -> FakeSource:
    """The job of :func:`multinode`, hung: ``d`` on node0 asked every node through the store;
    node1 answered with its ranks, node2 (silent for 25 s) did not."""
    from dataclasses import replace

    from tui_launch.core.diagnosis.dumps import Taken
    from tui_launch.core.job.jobstacks import job_event, node_answer
    from tui_launch.testing.builders import fake_dump, fake_dumped

    src = multinode()
    local = src.send(DumpStacks("key", source="dashboard")).dump
    assert local is not None
    names = [f"node{i}:{4242 + i}" for i in range(3)]
    theirs = fake_dump("key", [(0, 2, 5400), (1, 3, 5401)])
    remote = fake_dumped(theirs, "/runs/node1/stacks/000-key", "remote")
    answers = {
        names[0]: node_answer(names[0], "node0", 0, Taken(src.dumps[local.path], local)),
        names[1]: node_answer(names[1], "node1", 1, Taken(theirs, remote)),
    }
    e = job_event(1, "key", "dashboard", names[0], answers, (names[2],), local.path)
    src.post(replace(e, mono=T0_MONO + 92.0, wall=T0_WALL + 92.0))
    return src


STATES = {
    "healthy": healthy,
    "waiting": waiting_for_nodes,
    "failure": failed_with_traceback,
    "restarting": restarting,
    "finished": finished,
    "gpus8": eight_gpus_in_container,
    "multinode": multinode,
    "connecting": connecting,
    "connect_failed": connect_failed,
    "hung": hung,
    "nccl_timeout": nccl_timeout,
    "multinode_hung": multinode_hung,
}
