"""Pure renderers of the per-rank side: the GPU panel and the workers table's cells.

Like :mod:`.render`, snapshot (+ the current time) in, rich renderables out; the table widget
that shows the cells is :class:`~tui_launch.tui.widgets.table.WorkersTable`.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text

from tui_launch.core.model import errors
from tui_launch.core.model.events import CollectiveSample, GpuState, RankReading
from tui_launch.core.model.progress import ProgressView, fmt_duration
from tui_launch.core.model.store import LIVE_STATES, RankState, RankView, Snapshot
from tui_launch.core.model.telemetry import TelemetryView
from tui_launch.core.model.text import fmt_bytes
from tui_launch.tui.panels.base import Frame, Panel, Where
from tui_launch.tui.panels.progress import PROGRESS_COLUMNS, progress_cells
from tui_launch.tui.panels.render import STATE_STYLE

SPARK = "▁▂▃▄▅▆▇█"


def spark(values: tuple[float, ...] | list[float], width: int, top: float = 100.0) -> str:
    """The last ``width`` values as a block sparkline scaled to ``0..top`` (padded left)."""
    vals = list(values)[-width:]
    out = "".join(
        SPARK[min(len(SPARK) - 1, max(0, round((v or 0) / top * (len(SPARK) - 1))))] for v in vals
    )
    return out.rjust(width)


def _gb(n: int | None) -> str:
    if n is None:
        return "-"
    gib = n / (1 << 30)
    return f"{gib:.0f}" if gib >= 10 else f"{gib:.1f}"


GPU_FULL_WIDTH = 40  # cells: below this (the stacked side panels of a narrow screen) one
# short line per GPU: utilisation and memory first, then what else fits.
NARROW_GPU_LINES = 5  # what the stacked panel holds (dashboard.tcss: max-height 7, borders)


class ByWidth:
    """A renderable made for the width it is given (a panel's width is the layout's to say)."""

    def __init__(self, make: Callable[[int], RenderableType]) -> None:
        self.make = make

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.make(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.make(options.max_width))


def gpu_panel(s: Snapshot) -> RenderableType:
    """Per-GPU utilisation and memory (sparkline and numbers), temperature and power; or one
    line saying why there is nothing (no NVML, no devices, sampling off, NVML lost).

    On a narrow screen (below :data:`GPU_FULL_WIDTH` cells) each GPU gets one short line,
    so that its figures are not cut where the panel ends."""
    tel = s.telemetry
    if tel is None:
        return Text("no telemetry yet", style="dim")
    latest = tel.latest
    if not latest.gpus:
        style = (
            "yellow"
            if latest.gpu_state in (GpuState.LOST, GpuState.ERROR, GpuState.PERMISSION)
            else "dim"
        )
        return Text(latest.gpu_note, style=style)
    return ByWidth(lambda width: _gpu_text(tel, width))


def _gpu_text(tel: TelemetryView, width: int) -> Text:
    latest = tel.latest
    compact = len(latest.gpus) > 4
    narrow = width < GPU_FULL_WIDTH
    on_gpu: dict[int, list[str]] = {}
    for r in latest.ranks:
        for i in r.gpus:
            on_gpu.setdefault(i, []).append(
                ("~" if r.mapping == "inferred" else "") + str(r.local_rank)
            )
    out = Text()
    gpus = latest.gpus
    if narrow and len(gpus) > NARROW_GPU_LINES:
        gpus = gpus[: NARROW_GPU_LINES - 1]  # and a last line that counts the others
    for pos, g in enumerate(gpus):
        if pos:
            out.append("\n")
        util_h = tel.gpu_util[pos] if pos < len(tel.gpu_util) else ()
        mem_h = tel.gpu_mem[pos] if pos < len(tel.gpu_mem) else ()
        if g.state != GpuState.OK:
            out.append(f"{g.index} ", style="bold")
            out.append(f"{_short_name(g.name)}  ", style="dim")
            out.append(g.state.upper(), style="bold red")
            continue
        util = f"{g.util:3d}%" if g.util is not None else " n/a"
        mem = f"{_gb(g.mem_used)}/{_gb(g.mem_total)}G"
        temp = f"{g.temp}°C" if g.temp is not None else "-°C"
        power = f"{g.power:.0f}W" if g.power is not None else "-W"
        if narrow:
            # "0  56% 12/80G", then a sparkline and the temperature as far as they fit.
            out.append(f"{g.index} ", style="bold")
            out.append(util, style="bold")
            out.append(f" {mem}")
            room = width - (len(str(g.index)) + 1 + len(util) + 1 + len(mem))
            if room >= 4 + len(temp):
                out.append(f" {temp}", style="dim")
                room -= 1 + len(temp)
            if room >= 3:
                out.append(" " + spark(util_h, min(8, room - 1)), style="green")
            continue
        if compact:
            out.append(f"{g.index} ", style="bold")
            out.append(spark(util_h, 8), style="green")
            out.append(f" {util} ")
            out.append(f"{mem:>10} ")
            out.append(f"{temp} {power}", style="dim")
            continue
        ranks = ",".join(on_gpu.get(g.index, [])) or "-"
        if g.power is not None and g.power_limit is not None:
            power = f"{g.power:.0f}/{g.power_limit:.0f}W"
        out.append(f"{g.index} ", style="bold")
        out.append(f"{_short_name(g.name)[:14]:<14}")
        out.append(f" {temp:>5} {power:>9}", style="dim")
        out.append(f"  rank {ranks}\n", style="cyan")
        out.append("  util ", style="dim")
        out.append(spark(util_h, 8), style="green")
        out.append(f" {util}", style="bold")
        out.append("  mem ", style="dim")
        out.append(spark(mem_h, 5), style="magenta")
        out.append(f" {mem}")
    if len(gpus) < len(latest.gpus):
        out.append(f"\n+{len(latest.gpus) - len(gpus)} more GPUs", style="dim")
    if not narrow and any(r.mapping == "inferred" for r in latest.ranks):
        out.append("\n~ inferred (pids in another namespace)", style="dim")
    if latest.gpu_state != GpuState.OK or ";" in latest.gpu_note:
        out.append("\n" + latest.gpu_note.split("; ", 1)[-1], style="yellow")
    return out


def _gpu_shape(s: Snapshot) -> object:
    tel = s.telemetry
    return None if tel is None else (tel.latest.gpu_state, len(tel.latest.gpus))


def _gpu_title(f: Frame) -> str:
    # "Simulated" labels readings; a fake NVML that failed to open has none to label.
    tel = f.snap.telemetry
    if tel is not None and tel.latest.simulated and tel.latest.gpus:
        # The long title is cut where the narrow layout's panel ends.
        return "GPUs" + (" (sim.)" if f.narrow else " (simulated: fake NVML)")
    return "GPUs"


# GPU figures arrive mid-second: they wait for the clock's frame, as the table's do, unless what
# the panel shows changes shape (GPUs appear, go, or are lost).
GPUS = Panel(
    "gpus",
    Where.SIDE,
    "GPUs",
    key=lambda f: (f.snap.telemetry,),
    render=lambda f: gpu_panel(f.snap),
    shape=_gpu_shape,
    retitle=_gpu_title,
)


def _short_name(name: str) -> str:
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name[:16]


def _state_cell(r: RankView, tel: RankReading | None, hung: bool = False) -> Text:
    """The rank's state, with the process state when it needs attention (D, T, Z), and
    ``HUNG?`` for a rank a confirmed hang names (the Stacks tab says why)."""
    text, style = r.state, STATE_STYLE.get(r.state, "")
    if hung and r.state in LIVE_STATES:
        return Text(f"{text} HUNG?", style="bold red")
    if tel is not None and r.state in LIVE_STATES:
        if tel.status == "disk-sleep" or tel.d_state:
            # Uninterruptible I/O (a hung NFS mount, a stuck driver): signals cannot reach it.
            return Text(f"{text} D", style="bold red")
        if tel.status in ("stopped", "tracing-stop") and r.state != RankState.STOPPED:
            return Text("stopped T", style="bold yellow")
        if tel.status == "zombie":
            return Text("zombie", style="red")
    return Text(text, style=style)


def rank_cells(
    r: RankView,
    now: float,
    last_log: float | None,
    telemetry: TelemetryView | None = None,
    progress: ProgressView | None = None,
    straggler: int | None = None,
    hung: bool = False,
    collectives: CollectiveSample | None = None,
) -> tuple[RenderableType, ...]:
    """The workers table's cells for one rank, in column order (:func:`worker_columns`:
    with ``progress``, the step, rate and ETA cells follow the exit cell; ``hung``: flagged
    by a confirmed hang)."""
    tel = telemetry.rank(r.local_rank) if telemetry is not None else None
    if tel is not None and (tel.pid != r.pid or r.exit_code is not None):
        tel = None  # another attempt's process, or the rank is gone
    state = _state_cell(r, tel, hung)
    exit_text = (
        Text(errors.describe_exit(r.exit_code), style="red" if r.exit_code else "")
        if r.exit_code is not None
        else Text("-", style="dim")
    )
    end = r.exited if r.exited is not None else now
    cpu: RenderableType = "-"
    util: RenderableType = "-"
    rss, gpu, gmem = "-", "-", "-"
    if tel is not None:
        hist = telemetry.history(r.local_rank) if telemetry is not None else ()
        if tel.cpu is not None:
            cpu = Text.assemble(
                (spark(hist, 5, top=max((100.0, *hist))), "green"), f" {tel.cpu:3.0f}"
            )
        rss = fmt_bytes(tel.rss)
        mark = "~" if tel.mapping == "inferred" else ""
        if tel.gpus:
            gpu = mark + ",".join(str(i) for i in tel.gpus)
            if tel.gpu_util is not None and telemetry is not None:
                ghist = telemetry.gpu_history(r.local_rank)
                util = Text.assemble((spark(ghist, 4), "green"), f" {mark}{tel.gpu_util:>2}")
            gmem = mark + fmt_bytes(tel.gpu_mem) if tel.gpu_mem is not None else "-"
    return (
        str(r.global_rank),
        str(r.local_rank),
        str(r.pid),
        state,
        exit_text,
        *(progress_cells(r, progress, straggler, hung) if progress is not None else ()),
        *((collective_cell(r.global_rank, collectives),) if collectives is not None else ()),
        cpu,
        rss,
        gpu,
        util,
        gmem,
        fmt_duration(end - r.started, floor=True),
        fmt_duration(now - last_log, floor=True) if last_log is not None else "-",
    )


# The columns that stay when the table is narrow, most important first; any other column
# (GPU detail, and columns added later) goes first. See WorkersTable.set_columns.
WORKER_KEEP = (
    "rank",
    "state",
    "exit",
    "last log",
    "step",
    "collective",  # asked for (--flight-recorder): what a hang is judged by
    "local",
    "uptime",
    "CPU %",
    "ETA",
    "pid",
    "RSS",
)

WORKER_COLUMNS = (
    "rank",
    "local",
    "pid",
    "state",
    "exit",
    "CPU %",
    "RSS",
    "GPU",
    "GPU %",
    "GPU mem",
    "uptime",
    "last log",
)


def worker_columns(progress: bool, collectives: bool = False) -> tuple[str, ...]:
    """The workers table's columns: the progress ones once a rank printed a step, the
    ``collective`` one while the Flight Recorder is polled (``--flight-recorder``)."""
    cut = WORKER_COLUMNS.index("exit") + 1
    extra = (
        *(PROGRESS_COLUMNS if progress else ()),
        *((COLLECTIVE_COLUMN,) if collectives else ()),
    )
    if not extra:
        return WORKER_COLUMNS
    return (*WORKER_COLUMNS[:cut], *extra, *WORKER_COLUMNS[cut:])


COLLECTIVE_COLUMN = "collective"
# A rank at one collective for this long is shown in yellow (seconds): a step rarely takes it.
_LONG_WAIT = 10.0


def collective_cell(global_rank: int, sample: CollectiveSample | None) -> Text:
    """``all_reduce #41 12s``: the rank's newest collective and how long it has been at it."""
    if sample is None:
        return Text("-", style="dim")
    for rc in sample.ranks:
        if rc.global_rank == global_rank:
            if rc.seq < 0:
                return Text("-", style="dim")
            text = f"{rc.op} #{rc.seq}" if rc.op else f"#{rc.seq}"
            if rc.waiting >= 1:
                text += f" {fmt_duration(rc.waiting, floor=True)}"
            return Text(text, style="yellow" if rc.waiting >= _LONG_WAIT else "")
    return Text("-", style="dim")
