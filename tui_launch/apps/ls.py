"""``tuilaunch ls``: this user's live and recent runs."""

from __future__ import annotations

from tui_launch.core.remote.runindex import UnsafeIndexDir, entries, format_table, index_dir, sweep


def main(argv: list[str]) -> int:
    """``tuilaunch ls``: print this user's live and recent runs (exit 2 on bad input)."""
    import sys

    if argv and argv[0] in ("-h", "--help"):
        print("usage: tuilaunch ls\n\nList this user's live, stale and recently ended runs.")
        return 0
    if argv:
        print(
            f"tuilaunch ls: error: unexpected argument {argv[0]!r} (usage: tuilaunch ls)",
            file=sys.stderr,
        )
        return 2
    try:
        directory = index_dir(create=False)
    except UnsafeIndexDir as e:
        print(f"tuilaunch ls: error: {e}", file=sys.stderr)
        return 2
    found = sweep(entries(directory))
    if not found:
        print(f"no runs (index: {directory})")
        return 0
    print(format_table(found))
    return 0
