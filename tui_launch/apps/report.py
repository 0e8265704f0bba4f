"""``tuilaunch report RUN_DIR|journal [-o FILE] [--format html|md]``: a run as one page to share.

The HTML page is self-contained (every script and style inline, no request: it opens offline
and can be attached to an issue); Markdown is for a terminal or a pull request. Both come from
:func:`tui_launch.core.journal.report.build`, for a finished or a running run.
"""

from __future__ import annotations

import os
import sys

USAGE = "usage: tuilaunch report RUN_DIR|journal.jsonl [-o FILE] [--format html|md]"
HELP = f"""{USAGE}

Write a report of a run (finished or still running) from its journal and run directory.

  -o, --output FILE   where to write it (default: run.html or run.md in the current
                      directory; '-' for standard output)
  --format html|md    a self-contained HTML page with plots (default; from -o's suffix when
                      it is .md), or Markdown (tables and text, no plots)
"""


def parse(argv: list[str]) -> tuple[str, str, str]:
    """``(target, output, format)``; ValueError (one line) on anything else."""
    target: str | None = None
    output: str | None = None
    fmt: str | None = None
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("-o", "--output", "--format"):
            if not eq:
                if not rest:
                    raise ValueError(f"{name} needs a value")
                value = rest.pop(0)
            if name == "--format":
                if value not in ("html", "md"):
                    raise ValueError(f"--format must be html or md, got {value!r}")
                fmt = value
            else:
                output = value
        elif (arg.startswith("-") and arg != "-") or target is not None:
            raise ValueError(f"unexpected argument {arg!r}")
        else:
            target = arg
    if target is None:
        raise ValueError("a run directory or journal is needed")
    if fmt is None:
        fmt = "md" if output is not None and output.endswith((".md", ".markdown")) else "html"
    if output is None:
        output = f"run.{fmt}"
    return target, output, fmt


def main(argv: list[str]) -> int:
    """``tuilaunch report``: write the report; exit 2 on bad input (one line), 1 when it
    cannot be written."""
    if argv and argv[0] in ("-h", "--help"):
        print(HELP, end="")
        return 0
    from tui_launch.core.journal.report import NotAJournal, build

    try:
        target, output, fmt = parse(argv)
        report = build(target)
    except (ValueError, NotAJournal) as e:
        print(f"tuilaunch report: error: {e} ({USAGE})", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tuilaunch report: error: cannot read {target}: {e.strerror or e}", file=sys.stderr)
        return 2
    if fmt == "md":
        from tui_launch.report import markdown

        text = markdown.render(report)
    else:
        from tui_launch.report import html

        text = html.render(report)
    if output == "-":
        sys.stdout.write(text)
        return 0
    try:
        tmp = f"{output}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fp:
            fp.write(text)
        os.replace(tmp, output)
    except OSError as e:
        print(f"tuilaunch report: error: cannot write {output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"report: {output} ({len(text.encode()):,} bytes, {report.outcome})")
    return 0
