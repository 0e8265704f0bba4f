"""Rank ↔ GPU mapping as a pure function: ``telemetry.mapping.assign`` on made-up readings.

No processes, no NVML: trees, NVML process lists and GPU readings are built here, and the two
probes that touch the system (is this pid in our namespace? what is the worker's own
environment?) are passed in. The sampler-level tests in test_telemetry.py run the same logic
against real processes and the fake NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tui_launch.core.model.events import GpuReading
from tui_launch.core.telemetry import fake_nvml as fake
from tui_launch.core.telemetry.mapping import (
    INFERRED,
    PID,
    RankGpu,
    RankTarget,
    assign,
    pid_visible,
)
from tui_launch.core.telemetry.nvml import ProcOnGpu
from tui_launch.core.telemetry.procs import TreeReading

GIB = 1 << 30
FOREIGN = fake.PID_OFFSET  # a pid of another PID namespace: never one of ours


def gpus(n: int, lost: Iterable[int] = ()) -> tuple[GpuReading, ...]:
    """``n`` GPU readings; GPU i has utilisation 10 * (i + 1) % and (i + 1) GiB used."""
    return tuple(
        GpuReading(
            index=i,
            name="GPU",
            uuid=fake.gpu_uuid(i),
            util=None if i in lost else 10 * (i + 1),
            mem_used=None if i in lost else (i + 1) * GIB,
            mem_total=80 * GIB,
            state="lost" if i in lost else "ok",
        )
        for i in range(n)
    )


def tree(root: int, *children: int) -> TreeReading:
    return TreeReading(
        pids=(root, *children), cpu=1.0, rss=GIB, threads=1, status="sleeping", d_state=0
    )


def ranks(*pids: int) -> list[RankTarget]:
    return [RankTarget(local_rank=i, global_rank=i, pid=p) for i, p in enumerate(pids)]


def env(cvd: str | None) -> Callable[[RankTarget], tuple[str | None, int]]:
    """Every worker started with ``CUDA_VISIBLE_DEVICES=cvd`` and its own LOCAL_RANK."""
    return lambda t: (cvd, t.local_rank)


def no_env(t: RankTarget) -> tuple[str | None, int]:
    raise AssertionError(f"rank {t.local_rank}'s environment read although mapped by pid")


def nobody(pid: int) -> bool:
    """No NVML pid is visible here: they all belong to another namespace."""
    return False


def everybody(pid: int) -> bool:
    return True


UUIDS = {fake.gpu_uuid(i): i for i in range(4)} | {fake.mig_uuid(2, m): 2 for m in range(2)}


# ----------------------------------------------------------------- by pid


def test_pid_match() -> None:
    targets = ranks(100, 200)
    placed = assign(
        targets,
        {100: tree(100), 200: tree(200)},
        {100: [ProcOnGpu(gpu=1, mem=3 * GIB, sm=40)], 200: [ProcOnGpu(gpu=0, mem=GIB, sm=7)]},
        gpus(2),
        no_env,
        visible=everybody,
    )
    assert placed == (RankGpu((1,), PID, 3 * GIB, 40), RankGpu((0,), PID, GIB, 7))


def test_descendants_sum_memory_and_utilisation() -> None:
    """A rank's data-loader children on its GPU and on another: memory is summed over the
    tree, utilisation per GPU, and the busiest GPU's is given (at most 100)."""
    procs = {
        101: [ProcOnGpu(gpu=0, mem=2 * GIB, sm=70)],
        102: [ProcOnGpu(gpu=0, mem=GIB, sm=60), ProcOnGpu(gpu=1, mem=GIB, sm=5)],
    }
    (r,) = assign(ranks(100), {100: tree(100, 101, 102)}, procs, gpus(2), no_env)
    assert r == RankGpu((0, 1), PID, 4 * GIB, 100)


def test_a_rank_missing_from_trees_is_its_pid_alone() -> None:
    (r,) = assign(ranks(100), {}, {100: [ProcOnGpu(0, GIB, 9)]}, gpus(1), no_env)
    assert r == RankGpu((0,), PID, GIB, 9)


def test_no_per_process_utilisation_uses_the_gpus_when_the_rank_has_it_alone() -> None:
    procs = {
        100: [ProcOnGpu(gpu=0, mem=GIB, sm=None)],
        200: [ProcOnGpu(gpu=1, mem=GIB, sm=None)],
        300: [ProcOnGpu(gpu=1, mem=GIB, sm=None)],
    }
    trees = {p: tree(p) for p in (100, 200, 300)}
    alone, shared1, shared2 = assign(ranks(100, 200, 300), trees, procs, gpus(2), no_env)
    assert alone.util == 10  # GPU 0's figure: rank 0 is alone on it
    assert shared1.util is None and shared2.util is None  # two ranks share GPU 1


def test_nothing_on_the_gpus_is_no_gpu() -> None:
    """A CPU job on a GPU machine: NVML lists no process, so nothing is inferred either."""
    placed = assign(ranks(100, 200), {}, {}, gpus(2), env("0,1"), visible=nobody)
    assert placed == (RankGpu(), RankGpu())


def test_visible_foreign_pids_do_not_allow_inference() -> None:
    """Another user's job in our namespace is on the GPU: our rank is not guessed onto it."""
    (r,) = assign(
        ranks(100), {}, {4242: [ProcOnGpu(0, GIB, 50)]}, gpus(1), env(None), visible=everybody
    )
    assert r == RankGpu()


# ----------------------------------------------------------------- inferred (containers)


def in_container(
    cvd: str | None, n_ranks: int, n_gpus: int = 4, lost: Iterable[int] = ()
) -> tuple[RankGpu, ...]:
    """Every GPU lists one process of another namespace; ranks are pids 100, 101, ..."""
    pids = [100 + i for i in range(n_ranks)]
    nv = {FOREIGN + g: [ProcOnGpu(gpu=g, mem=GIB, sm=50)] for g in range(n_gpus)}
    return assign(
        ranks(*pids),
        {p: tree(p) for p in pids},
        nv,
        gpus(n_gpus, lost),
        env(cvd),
        uuid_index=UUIDS,
        visible=nobody,
    )


def test_container_inferred_from_local_rank() -> None:
    """No CUDA_VISIBLE_DEVICES: rank i is on GPU i, with the whole device's figures."""
    placed = in_container(None, 3)
    assert [r.gpus for r in placed] == [(0,), (1,), (2,)]
    assert {r.mapping for r in placed} == {INFERRED}
    assert [(r.mem, r.util) for r in placed] == [(GIB, 10), (2 * GIB, 20), (3 * GIB, 30)]


def test_container_inferred_from_indices() -> None:
    assert [r.gpus for r in in_container("3,1", 2)] == [(3,), (1,)]


def test_container_inferred_from_gpu_uuids() -> None:
    cvd = ",".join(fake.gpu_uuid(i) for i in (2, 0, 3))
    placed = in_container(cvd, 3)
    assert [r.gpus for r in placed] == [(2,), (0,), (3,)]
    assert {r.mapping for r in placed} == {INFERRED}


def test_container_inferred_from_a_mig_uuid() -> None:
    """One MIG device per rank (set by a wrapper): its parent GPU, whatever the local rank."""
    placed = in_container(fake.mig_uuid(2, 1), 2)
    assert [(r.gpus, r.mapping) for r in placed] == [((2,), INFERRED), ((2,), INFERRED)]


def test_container_no_device_for_the_rank() -> None:
    """Two devices for three ranks, or CUDA_VISIBLE_DEVICES="" (none): no GPU, no guess."""
    assert [r.gpus for r in in_container("0,1", 3)] == [(0,), (1,), ()]
    assert in_container("", 2) == (RankGpu(), RankGpu())


def test_inference_needs_a_foreign_gpu() -> None:
    """Only GPU 0 lists a foreign pid: rank 1, whose device is GPU 1, is not guessed."""
    nv = {FOREIGN: [ProcOnGpu(gpu=0, mem=GIB, sm=50)]}
    r0, r1 = assign(ranks(100, 101), {}, nv, gpus(2), env(None), visible=nobody)
    assert r0 == RankGpu((0,), INFERRED, GIB, 10)
    assert r1 == RankGpu()


def test_unlisted_gpus_allow_inference() -> None:
    """NVML cannot list GPU 1's processes (no permission): its rank is inferred onto it."""
    r0, r1 = assign(ranks(100, 101), {}, {}, gpus(2), env(None), unlisted={1}, visible=nobody)
    assert r0 == RankGpu()
    assert r1 == RankGpu((1,), INFERRED, 2 * GIB, 20)


def test_pid_match_wins_over_inference() -> None:
    """Rank 0 is found by pid; rank 1 (no match) is inferred; only rank 1's env is read."""
    read: list[int] = []

    def env_of(t: RankTarget) -> tuple[str | None, int]:
        read.append(t.local_rank)
        return "0,1", t.local_rank

    nv = {100: [ProcOnGpu(0, 5 * GIB, 80)], FOREIGN: [ProcOnGpu(1, GIB, 50)]}
    r0, r1 = assign(ranks(100, 101), {}, nv, gpus(2), env_of, visible=nobody)
    assert r0 == RankGpu((0,), PID, 5 * GIB, 80)
    assert r1 == RankGpu((1,), INFERRED, 2 * GIB, 20)
    assert read == [1]


# ----------------------------------------------------------------- failures


def test_a_lost_gpu_is_never_inferred() -> None:
    placed = in_container(None, 3, lost={1})
    assert [(r.gpus, r.mapping) for r in placed] == [
        ((0,), INFERRED),
        ((), None),
        ((2,), INFERRED),
    ]


def test_no_nvml_no_gpus() -> None:
    """No NVML (or --no-gpu): no readings, no process lists; every rank on no GPU, and the
    workers' environments are not read."""
    assert assign(ranks(100, 200), {}, {}, (), no_env, visible=nobody) == (RankGpu(), RankGpu())


def test_pid_visible_probe() -> None:
    import os

    assert pid_visible(os.getpid())
    assert not pid_visible(0) and not pid_visible(-1)  # never our own process group
    assert not pid_visible(FOREIGN)  # above any pid_max
