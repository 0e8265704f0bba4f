"""The store's telemetry view: the latest sample, short histories, and per-rank totals.

:func:`fold` turns the sampler's :class:`~tui_launch.core.model.events.TelemetrySample` events into
a :class:`TelemetryView`; the store's pure reducer calls it, and so does the sampler (for the
totals it journals at the end). This module is plain data: it imports neither NVML nor psutil
nor the sampler, so that the store (and a replayed journal) never loads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tui_launch.core.model.events import RankReading, RankTotals, TelemetrySample

HISTORY = 60  # samples kept per GPU and per rank for sparklines


@dataclass(frozen=True)
class TelemetryView:
    """The store's telemetry: the latest sample, short histories, and per-rank totals.

    ``gpu_util``/``gpu_mem`` hold, per GPU in ``latest.gpus`` order, the last
    :data:`HISTORY` utilisation and memory-used percentages; ``rank_cpu``/``rank_gpu`` the
    same per local rank of the current attempt (``(local_rank, history)`` pairs).
    """

    latest: TelemetrySample
    gpu_util: tuple[tuple[int, ...], ...] = ()
    gpu_mem: tuple[tuple[int, ...], ...] = ()
    rank_cpu: tuple[tuple[int, tuple[float, ...]], ...] = ()
    rank_gpu: tuple[tuple[int, tuple[int, ...]], ...] = ()
    totals: tuple[RankTotals, ...] = ()

    def rank(self, local_rank: int, attempt: int | None = None) -> RankReading | None:
        """The latest reading of ``local_rank`` (of ``attempt``, when given)."""
        if attempt is not None and self.latest.attempt != attempt:
            return None
        for r in self.latest.ranks:
            if r.local_rank == local_rank:
                return r
        return None

    def history(self, local_rank: int) -> tuple[float, ...]:
        """The CPU % history of ``local_rank``."""
        for lr, h in self.rank_cpu:
            if lr == local_rank:
                return h
        return ()

    def gpu_history(self, local_rank: int) -> tuple[int, ...]:
        """The GPU utilisation % history of ``local_rank``."""
        for lr, h in self.rank_gpu:
            if lr == local_rank:
                return h
        return ()


def _push(hist: tuple[Any, ...], value: Any) -> tuple[Any, ...]:
    return (*hist[-(HISTORY - 1) :], value)


def fold(view: TelemetryView | None, s: TelemetrySample) -> TelemetryView:
    """The view after sample ``s`` (pure; the store's reducer calls it)."""
    old = view
    # GPU histories, by position; reset if the set of GPUs changed.
    same_gpus = old is not None and tuple(g.index for g in old.latest.gpus) == tuple(
        g.index for g in s.gpus
    )
    gu = old.gpu_util if old is not None and same_gpus else tuple(() for _ in s.gpus)
    gm = old.gpu_mem if old is not None and same_gpus else tuple(() for _ in s.gpus)
    gpu_util = tuple(_push(h, g.util or 0) for h, g in zip(gu, s.gpus, strict=False))
    gpu_mem = tuple(
        _push(h, round(100 * g.mem_used / g.mem_total) if g.mem_used and g.mem_total else 0)
        for h, g in zip(gm, s.gpus, strict=False)
    )
    same_attempt = old is not None and old.latest.attempt == s.attempt
    cpu_h = dict(old.rank_cpu) if old is not None and same_attempt else {}
    gpu_h = dict(old.rank_gpu) if old is not None and same_attempt else {}
    totals = {(t.attempt, t.local_rank): t for t in (old.totals if old is not None else ())}
    for r in s.ranks:
        cpu_h[r.local_rank] = _push(cpu_h.get(r.local_rank, ()), r.cpu or 0.0)
        gpu_h[r.local_rank] = _push(gpu_h.get(r.local_rank, ()), r.gpu_util or 0)
        key = (s.attempt, r.local_rank)
        t = totals.get(key) or RankTotals(
            attempt=s.attempt, local_rank=r.local_rank, global_rank=r.global_rank
        )
        # Built directly, not with dataclasses.replace (which looks up every field each
        # time): a replayed day of telemetry folds ~70,000 of these.
        totals[key] = RankTotals(
            t.attempt,
            t.local_rank,
            t.global_rank,
            t.samples + 1,
            _max(t.peak_rss, r.rss),
            t.cpu_sum + (r.cpu or 0.0),
            t.cpu_n + (r.cpu is not None),
            _max(t.peak_gpu_mem, r.gpu_mem),
            t.gpu_util_sum + (r.gpu_util or 0),
            t.gpu_util_n + (r.gpu_util is not None),
            r.mapping or t.mapping,
        )
    return TelemetryView(
        latest=s,
        gpu_util=gpu_util,
        gpu_mem=gpu_mem,
        rank_cpu=tuple(sorted(cpu_h.items())),
        rank_gpu=tuple(sorted(gpu_h.items())),
        totals=tuple(sorted(totals.values(), key=lambda t: (t.attempt, t.local_rank))),
    )


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


__all__ = ["HISTORY", "TelemetryView", "fold"]
