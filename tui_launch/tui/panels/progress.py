"""Progress in the dashboard: the workers table's step/rate/ETA cells, the header's
job progress, the restarts timeline's steps, the finished run's goodput.

Pure renderers of the snapshot's :class:`~tui_launch.core.model.progress.ProgressView`, like
:mod:`.render` (which calls them). The progress columns are shown only once a rank printed a
step: a run whose program prints no progress keeps the table it had.
"""

from __future__ import annotations

import time

from rich.text import Text

from tui_launch.core.model.progress import (
    ProgressView,
    fmt_duration,
    fmt_eta,
    fmt_rate,
    fmt_step,
    goodput,
    unit_of,
)
from tui_launch.core.model.store import RankState, RankView, Snapshot

PROGRESS_COLUMNS = ("step", "steps/s", "ETA")
_SPARK = "▁▂▃▄▅▆▇█"


def _spark(values: tuple[float, ...], width: int) -> str:
    vals = values[-width:]
    top = max((*vals, 1e-9))
    out = "".join(_SPARK[min(7, max(0, round(v / top * 7)))] for v in vals)
    return out.rjust(width)


def straggler_of(s: Snapshot) -> int | None:
    """The global rank inferred to be the current attempt's straggler, if any."""
    st = s.straggler
    return st.global_rank if st is not None and st.attempt == s.attempt else None


def progress_cells(
    r: RankView, view: ProgressView | None, straggler: int | None = None, hung: bool = False
) -> tuple[Text, Text, Text]:
    """The ``step``, ``steps/s`` and ``ETA`` cells of one rank (``-`` if it prints none;
    ``straggler?`` in the step cell of the rank inferred to hold the others back). A rank
    that is stalled or ``hung`` has no ETA (``—``): the one computed from its last rate would
    promise an end that is not coming. A rank with no ETA says why (``? no total``)."""
    dash = Text("-", style="dim")
    p = view.rank(r.global_rank, r.attempt) if view is not None else None
    if r.global_rank == straggler:
        dash = Text("straggler?", style="bold magenta")
    if p is None or view is None:
        return dash, Text("-", style="dim"), Text("-", style="dim")
    flag = view.flagged(r.global_rank)
    step = Text(fmt_step(p), style="bold" if view.latest.leader == r.global_rank else "")
    if r.global_rank == straggler:
        step.append(" straggler?", style="bold magenta")
    if flag == "stalled":
        rate = Text(f"stalled {fmt_duration(p.stalled_for)}", style="bold red")
    else:
        rate = Text.assemble(
            (_spark(view.history(r.global_rank), 4), "yellow" if flag else "green"),
            (f" {fmt_rate(p.rate)}", "bold yellow" if flag else ""),
            (" slow" if flag == "slow" else "", "bold yellow"),
        )
    done = r.exit_code is not None
    if (flag == "stalled" or hung) and not done:
        eta = Text("—", style="dim")
    elif done or p.finished:
        eta = Text("-")
    else:
        eta = Text(fmt_eta(p), style="" if p.eta is not None else "dim")
    return step, rate, eta


def header_progress(s: Snapshot) -> Text:
    """``  step 120/500 24%  9.8/s  ETA 39s  from rank 0`` while the job runs (empty
    otherwise); ``epoch 3/10`` when the program prints epochs only, ``ETA ? no total`` when
    nothing says how far the run goes."""
    view = s.progress
    t = Text()
    straggler = straggler_of(s)
    if straggler is not None and s.finished is None:
        t.append(f"   straggler: rank {straggler} (inferred)", style="bold magenta")
    if view is None or s.finished is not None or view.latest.attempt != s.attempt:
        return t
    job = view.job
    if job is None or job.step is None:
        return t
    prefix = "" if unit_of(job) == "epoch" else "step "  # fmt_step says "epoch 3/10"
    t.append(f"   {prefix}{fmt_step(job)}", style="bold")
    if job.total:
        t.append(f" {100 * job.step / job.total:.0f}%")
    t.append(f"  {fmt_rate(job.rate)}/s")
    flags = sorted({w for _, w in view.active})
    if not job.finished and any(r.state == RankState.RUNNING for r in s.ranks):
        # No ETA while the job is stalled or hung: the last rate no longer predicts anything.
        stuck = job.eta is not None and ("stalled" in flags or bool(s.hung_ranks))
        t.append(f"  ETA {'—' if stuck else fmt_eta(job)}")
    t.append(f"  from rank {job.global_rank}", style="dim")
    if "stalled" in flags:
        t.append(f"  STALLED {fmt_duration(job.stalled_for)}", style="bold red")
    elif "slow" in flags:
        t.append("  SLOWDOWN", style="bold yellow")
    return t


def hang_watch_text(s: Snapshot, full: bool = False) -> Text:
    """What the hang rule expects and how long the job has stood still. Short (the header):
    only once the job has stood still for half its limit, ``  no step 4s/5s``; ``full`` (the
    Stacks tab): always, ``hang rule: a step every 0.8 s: suspected after 6.0 s without; no
    step for 1s``."""
    w = s.hang_watch
    t = Text()
    if w is None or s.finished is not None or w.attempt != s.attempt:
        return t
    what = {"steps": "step", "collectives": "collective"}.get(w.basis, "output")
    still = fmt_duration(w.still_for)
    style = "bold red" if w.state != "watching" or w.still_for >= w.limit else "yellow"
    if full:
        t.append("hang rule: ", style="bold")
        t.append(f"{w.expected}; no {what} for {still}")
        if w.state != "watching":
            t.append(f"  ({w.state})", style=style)
        return t
    if w.state != "watching" or w.still_for >= w.limit / 2:
        t.append(f"  no {what} {still}/{fmt_duration(w.limit)}", style=style)
    return t


def attempt_steps(s: Snapshot, number: int) -> str:
    """The restarts timeline's ``steps`` cell: ``80→200`` (resumed from → reached)."""
    view = s.progress
    p = view.attempt(number) if view is not None else None
    if p is None or p.steps_reached is None:
        return "-"
    if number > 0 and p.first_step is not None:
        return f"{p.first_step}→{p.steps_reached}"
    return str(p.steps_reached)


def goodput_text(s: Snapshot) -> Text | None:
    """The finished run's goodput, compact (the summary printed at exit has every line):
    share of wall time making progress, steps redone, time to first step per attempt."""
    if s.finished is None:
        return None
    summary = goodput(s.progress, s.attempts, s.finished.wall or time.time())
    if summary is None or summary.progress_share is None:
        return None
    t = Text()
    t.append("goodput ", style="bold")
    t.append(f"{100 * summary.progress_share:.0f}% of wall time stepping\n")
    t.append(f"redone  {summary.steps_redone} steps after restarts\n")
    firsts = [
        f"#{a.index} {a.time_to_first_step:.1f}s"
        for a in summary.attempts[-4:]
        if a.time_to_first_step is not None
    ]
    if firsts:
        t.append(f"1st step {', '.join(firsts)}")
    t.rstrip()
    return t


__all__ = [
    "PROGRESS_COLUMNS",
    "attempt_steps",
    "goodput_text",
    "header_progress",
    "progress_cells",
    "straggler_of",
]
