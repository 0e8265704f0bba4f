"""A report as one self-contained HTML page.

Every script and style is inline (uPlot's minified build and its CSS from ``assets/``, the
page's own ``report.js`` and ``report.css``); the page uses the system's fonts; the data is one
JSON block. A Content-Security-Policy meta tag allows nothing to be fetched (``default-src
'none'``) and only the page's own scripts to run (by their SHA-256): the page can make no
request, even if some text in it (a log line, an argument) looked like markup, and every text
is escaped anyway. A listener writes any policy violation into the page (``#csp-violations``),
where the tests look for it.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

from tui_launch.core.journal.report import Mark, Report, Table
from tui_launch.core.model.text import failure_headline, stood_still
from tui_launch.report import common

# The colour of each kind of mark, on the timeline and as lines on the plots.
MARK_COLORS = {
    "failure": "#c62828",
    "restart": "#ef6c00",
    "injection": "#ad1457",
    "hang": "#6a1b9a",
    "hang-cleared": "#8e99a8",
    "control": "#00838f",
    "slowdown": "#9e9d24",
    "stacks": "#5d4037",
    "shutdown": "#455a64",
    "finished": "#37474f",
}
MARKS_LISTED = 400  # marks in the table at most (all of them are drawn)
LANES = 24  # attempts drawn on lanes of their own at most (more share one)
MARKS_DRAWN = 2000  # marks drawn at most: failures, restarts, injections and hangs first
KEY_MARKS = frozenset({"failure", "restart", "injection", "hang", "finished"})


def drawn(marks: Sequence[Mark]) -> list[Mark]:
    """The marks drawn on the timeline and the plots: all of them, or, past
    :data:`MARKS_DRAWN` (a run that flapped for a day), every key one and the first others."""
    if len(marks) <= MARKS_DRAWN:
        return list(marks)
    key = [m for m in marks if m.kind in KEY_MARKS]
    rest = [m for m in marks if m.kind not in KEY_MARKS][: max(0, MARKS_DRAWN - len(key))]
    return sorted([*key, *rest], key=lambda m: m.wall)


# (metric table, id, title, axis label, unit, digits)
PROGRESS_PLOTS = (
    (
        "rate",
        "plot-rate",
        "step rate (steps/s per rank, from its step counter)",
        "steps/s",
        " steps/s",
        2,
    ),
    ("loss", "plot-loss", "loss (as the ranks print it)", "loss", "", 4),
    ("step", "plot-step", "step (per rank)", "step", "", 0),
)
TELEMETRY_PLOTS = (
    ("cpu", "plot-cpu", "CPU (% of one core, each rank's process tree)", "%", " %", 0),
    ("rss", "plot-rss", "memory (RSS, MB, each rank's process tree)", "MB", " MB", 0),
    ("gpu_util", "plot-gpu-util", "GPU utilisation (%, per rank)", "%", " %", 0),
    ("gpu_mem", "plot-gpu-mem", "GPU memory (MB, per rank)", "MB", " MB", 0),
)

# Records a Content-Security-Policy violation in the page (the tests read it back).
CSP_LISTENER = (
    'document.addEventListener("securitypolicyviolation",function(e){'
    'var l=document.getElementById("csp-violations");var i=document.createElement("li");'
    'i.textContent=e.violatedDirective+" "+e.blockedURI;l.appendChild(i);l.hidden=false;});'
)


def _asset(name: str) -> str:
    return resources.files("tui_launch.report").joinpath("assets", name).read_text("utf-8")


def _sha(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode() + "'"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _json(data: object) -> str:
    # Inside <script type="application/json">: "</" must not close the element.
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def _round(values: tuple[float | None, ...], digits: int) -> list[float | None]:
    # A loss of NaN or inf (a diverging run prints them) is a gap in the plot: JSON has no
    # such numbers.
    return [None if v is None or not math.isfinite(v) else round(v, digits) for v in values]


def _plot_spec(table: Table, spec: tuple[str, str, str, str, str, int]) -> dict[str, Any]:
    _, pid, title, axis, unit, digits = spec
    return {
        "id": pid,
        "title": title,
        "axis": axis,
        "unit": unit,
        "digits": digits,
        "t": [round(t, 2) for t in table.t],
        "names": [name for name, _ in table.columns],
        "values": [_round(values, max(digits, 2) + 1) for _, values in table.columns],
    }


def render(report: Report) -> str:
    """The whole page."""
    plots: list[dict[str, Any]] = []
    for specs, tables in ((PROGRESS_PLOTS, report.progress), (TELEMETRY_PLOTS, report.telemetry)):
        for spec in specs:
            table = tables.get(spec[0])
            if table is not None and table.t:
                plots.append(_plot_spec(table, spec))
    data = {
        "plots": plots,
        "marks": [{"t": round(m.wall, 2), "kind": m.kind} for m in drawn(report.marks)],
        "markColors": MARK_COLORS,
    }
    uplot_js, glue_js = _asset("uPlot.iife.min.js"), _asset("report.js")
    csp = (
        "default-src 'none'; "
        f"script-src {_sha(CSP_LISTENER)} {_sha(uplot_js)} {_sha(glue_js)}; "
        "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    )
    title = common.title(report)
    body = "\n".join(
        [
            _header(report),
            _timeline(report),
            _plots(report, plots),
            _goodput(report),
            _root_cause(report),
            _hang(report),
            _flight_recorder(report),
            _logs(report),
            _env(report),
        ]
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tuilaunch {_e(report.reader_version)}">
<title>tuilaunch report: {_e(title)}</title>
<script>{CSP_LISTENER}</script>
<style>{_asset("uPlot.min.css")}</style>
<style>{_asset("report.css")}</style>
</head><body>
<main>
<ul id="csp-violations" hidden></ul>
{body}
<footer>Made by <code>tuilaunch report</code> {_e(report.reader_version)} from
<code>{_e(report.journal)}</code>, {_e(_generated())}. Self-contained: it makes no request.
Plots: uPlot (MIT licence, Leon Sorokin); series are means over at most {_points(report)}
buckets.</footer>
</main>
<script type="application/json" id="report-data">{_json(data)}</script>
<script>{uplot_js}</script>
<script>{glue_js}</script>
</body></html>
"""


def _generated() -> str:
    import time

    return "generated " + common.when(time.time())


def _points(report: Report) -> int:
    tables = [*report.progress.values(), *report.telemetry.values()]
    return max((len(t.t) for t in tables), default=0)


def _kv(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{cells}</table>'


def _table(head: tuple[str, ...], rows: Sequence[Sequence[str]], numeric: int = 0) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{_e(c)}</td>' if i < numeric else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _header(report: Report) -> str:
    outcome = report.outcome
    badge = f'<span class="badge o-{_e(outcome)}">{_e(outcome.upper())}</span>'
    return (
        f"<h1>tuilaunch report {badge}</h1>"
        f'<p class="muted">{_e(common.title(report))}</p>'
        f'<div class="card" id="header">{_kv(common.header_rows(report))}</div>'
    )


def _timeline(report: Report) -> str:
    start = report.start_wall
    end = report.end_wall
    if start is None or end is None or end <= start:
        return "<h2>Timeline</h2><p class='muted'>no time span recorded</p>"
    width = end - start

    def pos(wall: float) -> float:
        return max(0.0, min(100.0, 100.0 * (wall - start) / width))

    lanes = []
    # One lane per attempt; a run of many attempts (an elastic job that flapped) on one.
    one_lane = len(report.spans) > LANES
    for a in report.spans:
        a_end = a.end if a.end is not None else end
        cls = _span_class(a.end_reason)
        left, right = pos(a.start), pos(a_end)
        tip = f"attempt {a.number}: {common.offset(report, a.start)}, {a_end - a.start:.1f}s"
        tip += f", {a.end_reason or 'running'}"
        marks = "".join(
            f'<div class="mk" style="left:{pos(m.wall):.3f}%;background:{MARK_COLORS[m.kind]}" '
            f'title="{_e(common.offset(report, m.wall) + " " + m.text)}"></div>'
            for m in drawn(report.marks)
            if m.kind in MARK_COLORS and m.attempt == a.number
        )
        if one_lane:
            lanes.append(
                f'<div class="span {_e(cls)}" '
                f'style="left:{left:.3f}%;width:{max(right - left, 0.2):.3f}%" '
                f'title="{_e(tip)}"></div>{marks}'
            )
            continue
        lanes.append(
            f'<div class="lane"><div class="label">attempt {a.number}</div><div class="track">'
            f'<div class="span {_e(cls)}" '
            f'style="left:{left:.3f}%;width:{max(right - left, 0.2):.3f}%" '
            f'title="{_e(tip)}"></div>{marks}</div></div>'
        )
    if one_lane:
        label = f"attempts 0-{report.spans[-1].number}"
        lanes = [
            f'<div class="lane"><div class="label">{_e(label)}</div><div class="track">'
            f"{''.join(lanes)}</div></div>"
        ]
    run_marks = "".join(
        f'<div class="mk" style="left:{pos(m.wall):.3f}%;background:{MARK_COLORS[m.kind]}" '
        f'title="{_e(common.offset(report, m.wall) + " " + m.text)}"></div>'
        for m in drawn(report.marks)
        if m.kind in MARK_COLORS and m.attempt is None
    )
    lanes.append(
        f'<div class="lane"><div class="label">run</div><div class="track">{run_marks}</div></div>'
    )
    ticks = "".join(
        f'<span style="left:{100 * i / 5:.1f}%">+{width * i / 5:.0f}s</span>' for i in range(6)
    )
    used = sorted({m.kind for m in report.marks if m.kind in MARK_COLORS})
    legend = "".join(
        f'<span><i style="background:{MARK_COLORS[k]}"></i>{_e(k)}</span>' for k in used
    )
    listed = report.marks[:MARKS_LISTED]
    rows = "".join(
        f'<tr><td class="num">{_e(common.offset(report, m.wall))}</td>'
        f'<td class="k-{_e(m.kind)}">{_e(m.kind)}</td>'
        f'<td class="num">{"" if m.attempt is None else m.attempt}</td><td>{_e(m.text)}</td></tr>'
        for m in listed
    )
    more = (
        f"<p class='muted'>{len(report.marks) - MARKS_LISTED} more not listed</p>"
        if len(report.marks) > MARKS_LISTED
        else ""
    )
    attempts = _table(
        ("attempt", "started", "duration", "world size", "ended by"),
        list(common.attempt_rows(report)),
        numeric=4,
    )
    return (
        '<h2 id="timeline">Attempts and events</h2><div class="card">'
        f'<div class="timeline">{"".join(lanes)}<div class="axis">{ticks}</div></div>'
        f'<div class="legend">{legend}</div>{attempts}'
        f"<details {'open' if len(listed) <= 40 else ''}><summary>{len(report.marks)} events"
        " (failures, restarts, injections, hangs, actions)</summary>"
        '<table id="marks"><thead><tr><th>at</th><th>what</th><th>attempt</th><th></th></tr>'
        f"</thead><tbody>{rows}</tbody></table>{more}</details></div>"
    )


def _span_class(reason: str | None) -> str:
    """The colour class of an attempt's bar, from how it ended."""
    if reason is None:
        return "running"
    for word, cls in (
        ("fail", "failed"),
        ("hang", "hang"),
        ("restart", "restarted"),
        ("stop", "stopped"),
        ("succe", "succeeded"),
    ):
        if word in reason:
            return cls
    return "other"


def _plots(report: Report, plots: list[dict[str, Any]]) -> str:
    if not plots:
        note = "no progress or telemetry records in the journal"
        return f'<h2 id="plots">Plots</h2><p class="muted">{_e(note)}</p>'
    holders = "".join(f'<div class="card plot" id="{_e(p["id"])}"></div>' for p in plots)
    notes = []
    if "rate" not in report.progress:
        notes.append("no step rate: the ranks printed no progress tuilaunch reads")
    if not any(k.startswith("gpu") for k in report.telemetry):
        notes.append(f"no GPU readings ({report.gpu_note or 'no GPU telemetry'})")
    rows = max((t.rows for t in [*report.progress.values(), *report.telemetry.values()]), default=0)
    notes.append(f"{rows:,} records, plotted as at most {_points(report)} points per series")
    return (
        '<h2 id="plots">Progress and resources</h2>'
        '<p id="plot-error" class="k-failure" hidden></p>'
        f'<p class="muted">{_e("; ".join(notes))}; vertical lines: the events above.</p>'
        f'<div class="grid">{holders}</div>' + _resources(report)
    )


def _resources(report: Report) -> str:
    rows = common.resource_rows(report)
    if not rows:
        return ""
    return "<h3>Per rank and attempt (the run's totals)</h3>" + _table(
        ("attempt", "rank", "peak RSS", "mean CPU %", "peak GPU mem", "mean GPU %"), rows
    )


def _goodput(report: Report) -> str:
    lines = "".join(f"<li>{_e(line)}</li>" for line in common.goodput_text(report))
    return f'<h2 id="goodput">Goodput</h2><div class="card"><ul>{lines}</ul></div>'


def _root_cause(report: Report) -> str:
    rc = common.root_cause(report)
    others = common.other_failures(report)
    if rc is None and not others:
        return '<h2 id="root-cause">Root cause</h2><p class="muted">no failure</p>'
    parts = ['<h2 id="root-cause">Root cause</h2>']
    if rc is not None:
        parts.append(f'<div class="card"><p class="k-failure">{_e(failure_headline(rc))}</p>')
        parts.append(f"<pre>{_e(chr(10).join(common.root_cause_lines(rc)))}</pre>")
        if rc.traceback:
            parts.append(f'<h3>traceback</h3><pre id="traceback">{_e(rc.traceback)}</pre>')
        parts.append("</div>")
    else:
        parts.append('<p class="muted">none ended the run (restarts recovered them)</p>')
    if others:
        parts.append("<h3>other failures</h3>")
        for f in others:
            head = f"attempt {f.attempt}: {failure_headline(f)}"
            evidence = f.traceback or "\n".join(f.stderr_tail)
            if evidence:
                parts.append(
                    f"<details><summary>{_e(head)}</summary><pre>{_e(evidence)}</pre></details>"
                )
            else:
                parts.append(f"<p>{_e(head)}</p>")
    return "".join(parts)


def _hang(report: Report) -> str:
    s = report.snapshot
    h = s.hang
    hangs = [m for m in report.marks if m.kind == "hang"]
    if h is None and not hangs:
        return '<h2 id="hang">Hang</h2><p class="muted">no hang detected</p>'
    parts = ['<h2 id="hang">Hang</h2><div class="card">']
    if h is not None:
        parts.append(
            _kv(
                [
                    ("attempt", str(h.attempt)),
                    ("stood still", stood_still(h)),
                    ("confirmed", h.confirmation),
                    ("verdict", h.verdict),
                    ("action", h.action),
                    ("stacks", report.hang_stacks_path or h.second_path),
                ]
            )
        )
        if report.hang_stacks:
            parts.append(f'<h3>stacks</h3><pre id="hang-stacks">{_e(report.hang_stacks)}</pre>')
    else:
        items = "".join(f"<li>{_e(common.offset(report, m.wall))} {_e(m.text)}</li>" for m in hangs)
        parts.append(f"<ul>{items}</ul>")
    parts.append("</div>")
    return "".join(parts)


def _flight_recorder(report: Report) -> str:
    head = '<h2 id="flight-recorder">Flight Recorder</h2>'
    fr = common.flight_recorder(report)
    if fr is None:
        return head + '<p class="muted">no Flight Recorder dump was judged while the run ran</p>'
    rows, heading, groups = fr
    parts = [head, '<div class="card">', _kv(rows)]
    if groups:
        items = "".join(f"<li>{_e(g)}</li>" for g in groups)
        parts.append(f'<h3>{_e(heading)}</h3><ul id="fr-groups">{items}</ul>')
    parts.append("</div>")
    return "".join(parts)


def _logs(report: Report) -> str:
    if not report.logs:
        return '<h2 id="logs">Logs</h2><p class="muted">no rank log files in the run directory</p>'
    parts = ['<h2 id="logs">Last lines of each rank\'s logs</h2>']
    # The logs of the ranks that failed are open: their last lines are the evidence.
    failed = {(f.attempt, f.local_rank) for f in report.snapshot.failures if not f.collateral}
    for log in report.logs:
        shown = " open" if log.lines and (log.attempt, log.local_rank) in failed else ""
        head = (
            f"attempt {log.attempt}, local rank {log.local_rank}, {log.stream} "
            f"({log.size:,} bytes, last {len(log.lines)} lines: {log.path})"
        )
        text = "\n".join(log.lines) if log.lines else "(empty)"
        parts.append(
            f"<details{shown}><summary>{_e(head)}</summary><pre>{_e(text)}</pre></details>"
        )
    return "".join(parts)


def _env(report: Report) -> str:
    rows = list(report.env)
    s = report.snapshot
    extra = ""
    if s.run is not None and s.run.notes:
        extra = "<h3>notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in s.run.notes) + "</ul>"
    if not rows:
        text = "the journal holds no environment (written by a tuilaunch that did not keep it)"
        return f'<h2 id="env">Environment</h2><p class="muted">{_e(text)}</p>{extra}'
    return (
        '<h2 id="env">Environment</h2><p class="muted">the launcher\'s variables that shape a '
        "run; values of names like token, key, secret, password are redacted</p>"
        f'<div class="card">{_kv(rows)}</div>{extra}'
    )
