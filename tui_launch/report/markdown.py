"""A report as Markdown: tables and text for a terminal or a pull request (no plots)."""

from __future__ import annotations

from collections.abc import Sequence

from tui_launch.core.journal.report import Report, Table
from tui_launch.core.model.text import failure_headline, stood_still
from tui_launch.report import common

MARKS_LISTED = 100
LOG_LINES = 15
STACK_LINES = 120


# Text from the run (a worker's exception, its environment, a stack's ``<module>``) is shown
# as text: markup in it neither renders nor breaks the page. HTML's specials become entities
# (no tag, no comment, no autolink); a backslash, a backtick (no code span), a table's pipe
# and an opening bracket (no link) are escaped with a backslash; a line break ends nothing.
# Emphasis characters are left alone: they can only restyle a cell, and escaping them would
# clutter every path and variable name for the terminal reader.
_MD_SPECIAL = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "\\": "\\\\",
        "`": "\\`",
        "|": "\\|",
        "[": "\\[",
        "\r": " ",
        "\n": " ",
    }
)


def _text(text: object) -> str:
    """``text`` as inline Markdown that shows exactly it, on one line (a table cell, a list
    item, a heading)."""
    return str(text).translate(_MD_SPECIAL)


def _cell(text: object) -> str:
    return _text(text)


def _code(text: str) -> str:
    """``text`` as an inline code span (on one line): delimited by more backticks than any
    run of them inside it."""
    text = text.replace("\r", " ").replace("\n", " ")
    n = 1
    while "`" * n in text:
        n += 1
    return f"{'`' * n} {text} {'`' * n}"


def _table(head: tuple[str, ...], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(_text(h) for h in head) + " |", "|" + "---|" * len(head)]
    out.extend("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows)
    return out


def _fence(text: str) -> list[str]:
    # A fence longer than any run of backticks inside it.
    n = 3
    while "`" * n in text:
        n += 1
    return ["`" * n, text, "`" * n]


def _last(table: Table | None, column: str) -> str:
    if table is None:
        return "-"
    values = [v for v in table.column(column) if v is not None]
    return f"{values[-1]:.4g}" if values else "-"


def render(report: Report) -> str:
    """The whole Markdown document."""
    s = report.snapshot
    out = [f"# tuilaunch report: {_text(common.title(report))}", ""]
    out += _table(("", ""), common.header_rows(report))
    out += ["", "## Attempts", ""]
    out += _table(
        ("attempt", "started", "duration", "world size", "ended by"), common.attempt_rows(report)
    )
    out += ["", "## Events", ""]
    listed = report.marks[:MARKS_LISTED]
    out += _table(
        ("at", "what", "attempt", ""),
        [
            (
                common.offset(report, m.wall),
                m.kind,
                "" if m.attempt is None else str(m.attempt),
                m.text,
            )
            for m in listed
        ],
    )
    if len(report.marks) > MARKS_LISTED:
        out.append(f"\n({len(report.marks) - MARKS_LISTED} more not listed)")
    out += ["", "## Goodput", ""]
    out += [f"- {_text(line)}" for line in common.goodput_text(report)]
    rate = report.progress.get("rate")
    if rate is not None:
        out += [
            "",
            "Last step rate (steps advanced between the journal's last two progress records)"
            " and loss per rank:",
            "",
        ]
        loss = report.progress.get("loss")
        out += _table(
            ("rank", "steps/s", "loss"),
            [(name, _last(rate, name), _last(loss, name)) for name, _ in rate.columns],
        )
    rows = common.resource_rows(report)
    if rows:
        out += ["", "## Resources", ""]
        out += _table(
            ("attempt", "rank", "peak RSS", "mean CPU %", "peak GPU mem", "mean GPU %"), rows
        )
    out += ["", "## Root cause", ""]
    rc = common.root_cause(report)
    if rc is not None:
        out += [f"**{_text(failure_headline(rc))}**", ""]
        out += _fence("\n".join(common.root_cause_lines(rc)))
        if rc.traceback:
            out += ["", "Traceback:", ""]
            out += _fence(rc.traceback.rstrip())
    else:
        out.append("no failure ended the run")
    others = common.other_failures(report)
    if others:
        out += ["", "Other failures:", ""]
        for f in others:
            out.append(f"- attempt {f.attempt}: {_text(failure_headline(f))}")
            if f.traceback:
                # Every line indented: the list item's fenced block ends where one is not.
                fenced = "\n".join(_fence(f.traceback.rstrip())).splitlines()
                out += ["", *("  " + x for x in fenced), ""]
    out += ["", "## Hang", ""]
    h = s.hang
    if h is None:
        out.append(
            "no hang detected"
            if not any(m.kind == "hang" for m in report.marks)
            else "a hang was detected and later cleared (see the events)"
        )
    else:
        out += [
            f"- attempt {h.attempt}: {_text(stood_still(h))}",
            f"- {_text(h.confirmation)}",
            f"- **verdict**: {_text(h.verdict)}",
            f"- action: {_text(h.action)}",
            f"- stacks: {_code(report.hang_stacks_path or h.second_path)}",
        ]
        if report.hang_stacks:
            lines = report.hang_stacks.splitlines()
            cut = lines[:STACK_LINES]
            if len(lines) > STACK_LINES:
                cut.append(f"[... {len(lines) - STACK_LINES} more lines in the file]")
            out += ["", *_fence("\n".join(cut))]
    out += ["", "## Flight Recorder", ""]
    fr = common.flight_recorder(report)
    if fr is None:
        out.append("no Flight Recorder dump was judged while the run ran")
    else:
        fr_rows, heading, groups = fr
        out += [f"- **{name}**: {_text(value)}" for name, value in fr_rows]
        if groups:
            out += ["", f"{heading}:", ""]
            out += [f"- {_text(g)}" for g in groups]
    out += ["", "## Last lines of each rank's logs", ""]
    if not report.logs:
        out.append("no rank log files in the run directory")
    for log in report.logs:
        out += [
            f"attempt {log.attempt}, local rank {log.local_rank}, {_text(log.stream)} "
            f"({_code(log.path)}, {log.size:,} bytes):",
            "",
        ]
        out += _fence("\n".join(log.lines[-LOG_LINES:]) or "(empty)")
        out.append("")
    out += ["## Environment", ""]
    if report.env:
        out += _table(("variable", "value"), list(report.env))
    else:
        out.append("the journal holds no environment")
    out.append("")
    return "\n".join(out)
