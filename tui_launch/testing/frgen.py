"""Synthetic Flight Recorder dump sets of a Megatron-style job, for tests and ``bench/frgen.py``.

:func:`generate` writes one NCCL-style pickle per rank (the dictionary torch 2.13's
``_dump_nccl_trace`` writes, with ``pg_config``, ``pg_status`` keyed by local id and the
outstanding entries) for a job of ``world`` ranks cut into tensor (``tp``), pipeline (``pp``),
expert (``ep``) and data-parallel groups, in which the ``culprits`` stopped: ``hang`` (they
stopped issuing: their peers wait in the next collective) or ``stall`` (they kept issuing but
their work stopped completing, as on a GPU fault). With no culprit every rank waits in the same
collective. ``mismatch`` gives one rank a different size at one collective instead.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Layout", "generate", "layout"]


@dataclass(frozen=True)
class Layout:
    """Every group of the job: name -> (description, global ranks)."""

    world: int
    groups: dict[str, tuple[str, tuple[int, ...]]]
    member_of: dict[int, list[str]]
    configs: dict[str, dict[str, str]]

    def of(self, rank: int) -> list[str]:
        """The groups ``rank`` belongs to, in the order they were made."""
        return self.member_of[rank]

    def config(self, name: str) -> dict[str, str]:
        """Group ``name``'s ``pg_config`` entry (ranks as the string torch writes)."""
        if name not in self.configs:
            desc, ranks = self.groups[name]
            self.configs[name] = {"name": name, "desc": desc, "ranks": str(list(ranks))}
        return self.configs[name]


def layout(world: int, tp: int = 8, pp: int = 4, ep: int = 8) -> Layout:
    """Megatron's groups: default, tensor, pipeline, data-parallel, expert (names count up
    as ``new_group`` is called, on every rank alike)."""
    if world % (tp * pp):
        raise ValueError(f"world {world} is not a multiple of tp*pp = {tp * pp}")
    dp = world // (tp * pp)
    groups: dict[str, tuple[str, tuple[int, ...]]] = {"0": ("default_pg", tuple(range(world)))}
    n = 1

    def add(desc: str, ranks: Iterable[int]) -> None:
        nonlocal n
        groups[str(n)] = (desc, tuple(sorted(ranks)))
        n += 1

    for start in range(0, world, tp):
        add("TENSOR_MODEL_PARALLEL_GROUP", range(start, start + tp))
    stage = world // pp
    for i in range(stage):
        add("PIPELINE_MODEL_PARALLEL_GROUP", range(i, world, stage))
    for p in range(pp):
        for t in range(tp):
            add("DATA_PARALLEL_GROUP", [p * stage + d * tp + t for d in range(dp)])
    for p in range(pp):
        for t in range(tp):
            members = [p * stage + d * tp + t for d in range(dp)]
            for i in range(0, len(members), max(1, min(ep, len(members)))):
                add("EXPERT_MODEL_PARALLEL_GROUP", members[i : i + ep])
    member_of: dict[int, list[str]] = {r: [] for r in range(world)}
    for name, (_, ranks) in groups.items():
        for r in ranks:
            member_of[r].append(name)
    return Layout(world, groups, member_of, {})


def _entry(
    name: str, desc: str, pg_id: int, seq: int, op: str, state: str, numel: int
) -> dict[str, Any]:
    size = [[numel]]
    return {
        "record_id": seq,
        "pg_id": pg_id,
        "process_group": (name, desc),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1_700_000_000_000_000_000 + seq,
        "duration_ms": None,
        "input_sizes": size,
        "input_dtypes": ["BFloat16"],
        "output_sizes": size,
        "output_dtypes": ["BFloat16"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": False,
        "timeout_ms": 600000,
        "is_p2p": False,
        "thread_id": "1",
        "thread_name": "pt_main_thread",
    }


_OPS = {
    "default_pg": "barrier",
    "TENSOR_MODEL_PARALLEL_GROUP": "_all_gather_base",
    "PIPELINE_MODEL_PARALLEL_GROUP": "broadcast",
    "DATA_PARALLEL_GROUP": "all_reduce",
    "EXPERT_MODEL_PARALLEL_GROUP": "all_to_all",
}


def rank_dump(
    lay: Layout,
    rank: int,
    culprits: frozenset[int],
    fault: str = "hang",
    base: int = 1000,
    completed_kept: int = 0,
    mismatch: int | None = None,
) -> dict[str, Any]:
    """Rank ``rank``'s dump: in each group with a culprit, the others issued two collectives
    past the last one the culprit issued; elsewhere every member waits in one collective.
    ``completed_kept`` completed entries per group are kept before the outstanding ones (a
    full ring rather than torch's only-active dump)."""
    names = lay.of(rank)
    config = {
        n: {"name": n, "desc": lay.groups[n][0], "ranks": str(list(lay.groups[n][1]))}
        for n in names
    }
    status: dict[str, dict[str, int]] = {}
    entries: list[dict[str, Any]] = []
    for pg_id, n in enumerate(names):
        desc, ranks = lay.groups[n]
        op = _OPS.get(desc, "all_reduce")
        bad = culprits.intersection(ranks)
        if n == "0":
            issued, done = base, base  # the default group is idle
        elif not bad:
            issued, done = base + 1, base
        elif rank in bad and fault == "hang":
            issued, done = base, base
        elif rank in bad:  # stall: it issued on, its work stopped completing
            issued, done = base + 2, base - 3
        else:
            issued, done = base + 2, base
        status[str(pg_id)] = {
            "last_enqueued_collective": issued,
            "last_started_collective": -1,
            "last_completed_collective": done,
        }
        for seq in range(max(done - completed_kept + 1, 1), issued + 1):
            state = "completed" if seq <= done else "scheduled"
            numel = 1024 * (2 if mismatch == rank and seq == done + 1 else 1)
            entries.append(_entry(n, desc, pg_id, seq, op, state, numel))
    return {
        "version": "2.10",
        "pg_config": config,
        "pg_status": status,
        "nccl_version": "2.27.3",
        "entries": entries,
    }


def generate(
    directory: str,
    world: int,
    culprits: Iterable[int] = (),
    fault: str = "hang",
    completed_kept: int = 0,
    mismatch: int | None = None,
    prefix: str = "nccl_trace_rank_",
    tp: int = 8,
    pp: int = 4,
    ep: int = 8,
    missing: Iterable[int] = (),
) -> Layout:
    """Write every rank's pickle into ``directory`` (``missing`` ranks write none)."""
    lay = layout(world, tp, pp, ep)
    bad = frozenset(culprits)
    skip = set(missing)
    os.makedirs(directory, exist_ok=True)
    for rank in range(world):
        if rank in skip:
            continue
        data = rank_dump(lay, rank, bad, fault, completed_kept=completed_kept, mismatch=mismatch)
        with open(os.path.join(directory, f"{prefix}{rank}"), "wb") as fp:
            pickle.dump(data, fp, protocol=pickle.HIGHEST_PROTOCOL)
    return lay
