"""Rank ↔ GPU: which GPU each rank is on, as pure functions of one tick's readings.

First by pid: the rank's pid and all its descendants against NVML's process lists (a rank's GPU
memory is the sum over its tree; :func:`map_rank`). When none of them is there, and the GPU it
would use lists pids this process cannot see (another PID namespace: a container) or cannot be
listed at all, the GPU is inferred from ``LOCAL_RANK`` and ``CUDA_VISIBLE_DEVICES`` (indices,
GPU or MIG UUIDs; :func:`visible_device`) and the reading says ``inferred``; its figures are
then the whole device's. :func:`assign` does both for every rank of a tick.

Nothing here reads ``/proc`` or calls NVML: the sampler passes its readings in, and the
pid-visibility probe and the worker-environment reader are parameters, so the container and
MIG cases are unit-tested without processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tui_launch.core.model.events import GpuReading, GpuState
from tui_launch.core.telemetry.nvml import ProcOnGpu
from tui_launch.core.telemetry.procs import TreeReading

PID, INFERRED = "pid", "inferred"  # RankReading.mapping values


@dataclass(frozen=True)
class RankTarget:
    """A rank to watch: its pid and what the launcher knows of its GPU environment."""

    local_rank: int
    global_rank: int
    pid: int
    cuda_visible_devices: str | None = None


@dataclass(frozen=True)
class RankGpu:
    """Where one rank is on the GPUs at one tick.

    ``gpus`` are NVML indices; ``mapping`` is ``"pid"``, ``"inferred"`` or None (on no GPU);
    ``mem`` (bytes) and ``util`` (%) are the rank's own figures when mapped by pid, the whole
    device's when inferred.
    """

    gpus: tuple[int, ...] = ()
    mapping: str | None = None
    mem: int | None = None
    util: int | None = None


EnvOf = Callable[[RankTarget], tuple[str | None, int]]
"""A rank's ``(CUDA_VISIBLE_DEVICES, LOCAL_RANK)`` as the worker itself started with them."""


def visible_device(
    cvd: str | None, local_rank: int, uuid_index: Mapping[str, int], count: int
) -> int | None:
    """The NVML index of the GPU that ``local_rank`` would use: device ``cuda:LOCAL_RANK``
    of ``CUDA_VISIBLE_DEVICES`` (indices, or GPU/MIG UUIDs, whole or a unique prefix)."""
    if cvd is None:
        return local_rank if 0 <= local_rank < count else None
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if not entries:
        return None
    # One device per rank (a wrapper set it per rank): that one, whatever the local rank.
    if len(entries) == 1:
        entry = entries[0]
    elif local_rank < len(entries):
        entry = entries[local_rank]
    else:
        return None
    if entry.lstrip("-").isdigit():
        i = int(entry)
        return i if 0 <= i < count else None
    hits = {i for u, i in uuid_index.items() if u == entry or u.startswith(entry)}
    return hits.pop() if len(hits) == 1 else None


def map_rank(
    tree: Iterable[int],
    procs: Mapping[int, Sequence[ProcOnGpu]],
    gpus: Mapping[int, GpuReading],
) -> tuple[tuple[int, ...], int | None, int | None]:
    """By pid: the GPUs the tree's processes are on, their memory sum and SM utilisation.

    Utilisation is summed per GPU over the tree's processes and the busiest GPU is given.
    """
    mem: int | None = None
    per_gpu: dict[int, int | None] = {}
    for pid in tree:
        for p in procs.get(pid, ()):
            if p.mem is not None:
                mem = (mem or 0) + p.mem
            if p.gpu not in per_gpu:
                per_gpu[p.gpu] = p.sm
            elif p.sm is not None:
                per_gpu[p.gpu] = (per_gpu[p.gpu] or 0) + p.sm
    if not per_gpu:
        return (), None, None
    utils = [u for u in per_gpu.values() if u is not None]
    util = min(100, max(utils)) if utils else None
    return tuple(sorted(per_gpu)), mem, util


# ----------------------------------------------------------------- the sampler thread


def pid_visible(pid: int) -> bool:
    """Whether ``pid`` exists in this process's PID namespace (signal 0; never our group)."""
    if pid <= 0:
        return False  # os.kill(0, ...) would mean our own process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def assign(
    targets: Sequence[RankTarget],
    trees: Mapping[int, TreeReading],
    nvprocs: Mapping[int, Sequence[ProcOnGpu]],
    gpus: Sequence[GpuReading],
    env_of: EnvOf,
    *,
    uuid_index: Mapping[str, int] | None = None,
    unlisted: Collection[int] = (),
    visible: Callable[[int], bool] = pid_visible,
) -> tuple[RankGpu, ...]:
    """Each target's GPUs at one tick, in ``targets`` order.

    Args:
        targets: the ranks of the current attempt.
        trees: each rank's process tree by root pid (a rank missing here is its pid alone).
        nvprocs: NVML's compute processes by pid.
        gpus: this tick's GPU readings (empty: no NVML, no GPU telemetry).
        env_of: a rank's own ``(CUDA_VISIBLE_DEVICES, LOCAL_RANK)``; called only for the ranks
            whose GPU must be inferred.
        uuid_index: GPU and MIG UUIDs to NVML indices (``GpuSampler.uuid_index``).
        unlisted: indices of GPUs whose process lists NVML cannot give (not supported, no
            permission): a rank may be inferred onto them.
        visible: whether a pid exists in this PID namespace (:func:`pid_visible`).

    Returns:
        One :class:`RankGpu` per target. By pid when any process of the rank's tree is on a
        GPU; else inferred, when the GPU its environment names is ``ok`` and is foreign (lists a
        pid we cannot see, or is ``unlisted``); else on no GPU. A rank mapped by pid alone on
        one GPU without a per-process utilisation figure gets its GPU's.
    """
    by_index = {g.index: g for g in gpus}
    # GPUs whose process list names pids this process cannot see (another PID namespace),
    # or cannot be listed at all: only there may a rank's GPU be inferred.
    ours = {pid for tr in trees.values() for pid in tr.pids}
    foreign: set[int] = set(unlisted) & set(by_index)
    for pid, entries in nvprocs.items():
        if pid not in ours and not visible(pid):
            foreign.update(p.gpu for p in entries)
    by_pid: list[tuple[tuple[int, ...], int | None, int | None]] = []
    for t in targets:
        tr = trees.get(t.pid)
        by_pid.append(map_rank(tr.pids if tr else (t.pid,), nvprocs, by_index))
    # How many of our ranks are on each GPU (for the utilisation fallback below).
    sharing: dict[int, int] = {}
    inferred: dict[int, int] = {}  # target position -> GPU index
    for k, t in enumerate(targets):
        on = by_pid[k][0]
        if not on and by_index:
            cvd, lr = env_of(t)
            dev = visible_device(cvd, lr, uuid_index or {}, len(gpus))
            if dev is not None and dev in foreign and by_index[dev].state == GpuState.OK:
                inferred[k] = dev
                on = (dev,)
        for i in on:
            sharing[i] = sharing.get(i, 0) + 1
    out: list[RankGpu] = []
    for k in range(len(targets)):
        on, mem, util = by_pid[k]
        if k in inferred:
            g = by_index[inferred[k]]
            out.append(RankGpu((g.index,), INFERRED, g.mem_used, g.util))
            continue
        if on and util is None and len(on) == 1 and sharing.get(on[0]) == 1:
            util = by_index[on[0]].util  # no per-process figure; the GPU is this rank's alone
        out.append(RankGpu(on, PID if on else None, mem, util))
    return tuple(out)


__all__ = [
    "INFERRED",
    "PID",
    "EnvOf",
    "RankGpu",
    "RankTarget",
    "assign",
    "map_rank",
    "pid_visible",
    "visible_device",
]
