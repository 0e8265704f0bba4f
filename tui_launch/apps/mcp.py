"""``tuilaunch mcp [--control]``: an MCP server (stdio) for coding agents on this user's runs.

The official ``mcp`` SDK (the ``mcp`` extra: ``pip install -e '.[mcp]'``), over stdio: the
agent's client starts this command and talks to it on its stdin and stdout. The tools are the
verbs of ``ls``, ``status`` and ``ctl`` and read the same things (the run index, the journal, the
control socket); nothing here is a second copy of them:

- ``list_runs``: this user's live and recent runs on this node;
- ``status``: a run's state, the ``status --json`` document (``docs/status.schema.json``);
- ``why``: the root cause (with its traceback) and the hang or stack-dump verdict;
- ``tail_log``: the last lines a local rank wrote in an attempt (stdout or stderr);

and with ``--control`` only (they act on a run; the control socket journals each with the
server's pid and uid, source ``mcp pid N uid M``):

- ``dump_stacks``: dump every rank's stacks, the verdict and where each rank is;
- ``restart``: restart the worker group (no failure budget spent);
- ``kill_rank``: SIGKILL one local rank (the group restarts while the budget lasts).

Without ``--control`` those three are not offered at all. A run is named as ``status`` names
it (a run id, a launcher pid, a run directory; empty: the only or latest live run).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from tui_launch.apps.status import OK, USAGE
from tui_launch.core.model import layout

USAGE_LINE = "usage: tuilaunch mcp [--control]"
HELP = f"""{USAGE_LINE}

An MCP server on stdio for coding agents: list_runs, status, why, tail_log; with --control
also dump_stacks, restart and kill_rank (they act on a run). Needs the mcp package, the mcp
extra: pip install -e '.[mcp]' in tuilaunch's checkout. A client configuration (e.g. Claude
Code's .mcp.json):

  {{"mcpServers": {{"tuilaunch": {{"command": "tuilaunch", "args": ["mcp"]}}}}}}"""
# The README's set-up installs no extra: from the checkout, `pip install -e '.[mcp]'`.
MISSING = (
    "tuilaunch mcp: error: the mcp package is not installed (the mcp extra): "
    "pip install -e '.[mcp]' in tuilaunch's checkout"
)
TAIL_MAX = 1000  # lines a tail_log may ask for
TAIL_BYTES = 1 << 20  # read at most this much of a log's end


class ToolError(Exception):
    """What a tool answers when it cannot: the server turns it into the SDK's own error
    (:func:`sdk_error`), whose text the client sees."""


def sdk_error(message: str) -> Exception:
    """The SDK's error for a tool that failed for a reason it gives: ``ToolError`` of
    ``mcp.server.mcpserver.exceptions`` (mcp 2) or of ``mcp.server.fastmcp.exceptions``
    (mcp 1). mcp 2 sends the client any other exception as ``Error executing tool NAME``
    only, and logs its whole traceback on stderr."""
    for module in ("mcp.server.mcpserver.exceptions", "mcp.server.fastmcp.exceptions"):
        try:
            error_class = getattr(importlib.import_module(module), "ToolError", None)
        except ImportError:
            continue
        if isinstance(error_class, type) and issubclass(error_class, Exception):
            return error_class(message)
    return ToolError(message)


def _reasoned(fn: Callable[..., str]) -> Callable[..., str]:
    """``fn`` as a tool: a failure with a reason reaches the client as the SDK's error."""

    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> str:
        try:
            return fn(*args, **kwargs)
        except ToolError as e:
            raise sdk_error(str(e)) from None
        except OSError as e:  # a file of the run that cannot be read: say which and why
            raise sdk_error(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None

    return tool


def _server_class() -> Any:
    """The SDK's high-level server: ``MCPServer`` (mcp 2), ``FastMCP`` (mcp 1); None when the
    SDK is not installed."""
    try:
        from mcp.server.mcpserver import MCPServer

        return MCPServer
    except ImportError:
        pass
    try:
        from mcp.server import fastmcp  # mcp 1's name for it

        return getattr(fastmcp, "FastMCP", None)
    except ImportError:
        return None


# ------------------------------------------------------------------ the tools, plain functions


def list_runs() -> list[dict[str, Any]]:
    """This user's live and recent runs on this node, newest first."""
    from tui_launch.core.remote import runindex

    out = []
    for e in runindex.sweep(runindex.entries()):
        out.append(
            {
                "pid": e.pid,
                "run_id": e.run_id,
                "state": runindex.state(e),
                "host": e.host,
                "started": e.started,
                "ended": e.ended,
                "outcome": e.outcome,
                "exit_code": e.exit_code,
                "command": list(e.argv),
                "run_dir": e.run_dir,
                "control": bool(e.control),
            }
        )
    return out


def run_status(run: str = "") -> dict[str, Any]:
    """The ``status --json`` document of ``run``."""
    from tui_launch.core.remote import status

    try:
        return status.status(status.resolve(run or None))
    except status.NoSuchRun as e:
        raise ToolError(str(e)) from None


def why(run: str = "") -> dict[str, Any]:
    """Why the run is in its state: outcome, root cause, verdict, and where each rank was."""
    doc = run_status(run)
    verdict = doc["verdict"]
    places: list[str] = []
    if verdict and verdict.get("stacks"):
        places = _stacks_summary(str(verdict["stacks"]))
    return {
        "run": doc["run"]["id"],
        "state": doc["state"],
        "outcome": doc["outcome"],
        "attempt": doc["attempt"],
        "restarts": doc["restarts"],
        "root_cause": doc["root_cause"],
        "verdict": verdict,
        # tuilaunch why's verdict on the run's Flight Recorder dumps (docs/why.md).
        "flight_recorder": doc.get("flight_recorder"),
        "stacks": places,
        "hung_ranks": [r["global_rank"] for r in doc["ranks"] if r["hung"]],
    }


def _stacks_summary(path: str, limit: int = 60) -> list[str]:
    """The first lines of a dump's ``stacks.txt`` (the verdict and the distinct stacks)."""
    try:
        _, text = layout.dump_files(path)
        with open(text, encoding="utf-8", errors="replace") as fp:
            return [line.rstrip("\n") for _, line in zip(range(limit), fp, strict=False)]
    except OSError:
        return []


def tail_log(
    run: str = "", rank: int = 0, lines: int = 50, stream: str = "stdout", attempt: int = -1
) -> str:
    """The last ``lines`` lines local rank ``rank`` wrote to ``stream`` in ``attempt``
    (-1: the current one)."""
    if stream not in layout.STREAMS:
        raise ToolError(f"stream must be stdout or stderr, not {stream!r}")
    if not 1 <= lines <= TAIL_MAX:
        raise ToolError(f"lines must be between 1 and {TAIL_MAX}")
    from tui_launch.core.remote import status

    try:
        target = status.resolve(run or None)
    except status.NoSuchRun as e:
        raise ToolError(str(e)) from None
    if attempt < 0:
        attempt = int(status.status(target, socket=False)["attempt"])
    path = layout.RunDirLayout(target.run_dir).rank_log(attempt, rank, stream)
    try:
        with open(path, "rb") as fp:
            size = fp.seek(0, os.SEEK_END)
            fp.seek(max(0, size - TAIL_BYTES))
            data = fp.read()
    except OSError as e:
        raise ToolError(f"no {stream} log for local rank {rank} in attempt {attempt}: {e}") from e
    text = data.decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:])


def act(run: str, cmd: Any) -> str:
    """Send a command to a live run as ``mcp`` (journaled with this server's pid and uid)."""
    from tui_launch.apps.ctl import send

    code, line = send(run, cmd, client="mcp")
    if code != OK:
        raise ToolError(line)
    return line


# ------------------------------------------------------------------ the server


def build(control: bool) -> Any:
    """The MCP server with its tools (the acting ones only with ``control``); None without
    the SDK."""
    from tui_launch.core.model.commands import DumpStacks, Restart, SignalRank

    server_class = _server_class()
    if server_class is None:
        return None
    from tui_launch import __version__

    # WARNING: the SDK logs every tool that fails at INFO on stderr, which is the agent's
    # log of this server; a reason the client is sent is not news there.
    options: dict[str, Any] = {"log_level": "WARNING"}
    takes = inspect.signature(server_class).parameters
    if "version" in takes:  # mcp 2
        options["version"] = __version__
    server = server_class(
        "tuilaunch",
        instructions=(
            "Inspect this user's tuilaunch (torchrun) runs on this machine: list_runs, status, "
            "why (root cause and hang verdict), tail_log."
            + (" dump_stacks, restart and kill_rank act on a live run." if control else "")
        ),
        **{k: v for k, v in options.items() if k in takes},
    )
    low = getattr(server, "_mcp_server", None)
    if "version" not in takes and low is not None and hasattr(low, "version"):
        low.version = __version__  # mcp 1: its low-level server says the SDK's version else

    def list_runs_tool() -> str:
        """This user's live and recent tuilaunch runs on this node (pid, run id, state, run
        directory, whether it listens for control), newest first, as JSON."""
        return json.dumps(list_runs())

    def status_tool(run: str = "") -> str:
        """A run's state as JSON (schema_version 1): state, attempts, each rank's pid, state,
        step and rate, the verdict and the root cause. run: a run id, launcher pid or run
        directory; empty: the only or latest live run."""
        return json.dumps(run_status(run))

    def why_tool(run: str = "") -> str:
        """Why a run failed, hung or restarted: its root cause (rank, exit, message,
        traceback), the hang or stack-dump verdict, the distinct stacks and the verdict on
        its Flight Recorder dumps (which rank the others wait on, per process group), as
        JSON."""
        return json.dumps(why(run))

    def tail_log_tool(
        run: str = "", rank: int = 0, lines: int = 50, stream: str = "stdout", attempt: int = -1
    ) -> str:
        """The last lines a local rank wrote (stream: stdout or stderr) in an attempt (-1: the
        current one)."""
        return tail_log(run, rank, lines, stream, attempt)

    tools: list[tuple[str, Callable[..., str]]] = [
        ("list_runs", list_runs_tool),
        ("status", status_tool),
        ("why", why_tool),
        ("tail_log", tail_log_tool),
    ]
    if control:

        def dump_stacks_tool(run: str = "") -> str:
            """Dump every rank's Python stacks in a live run (takes seconds): the verdict and
            the dump's directory."""
            return act(run, DumpStacks(source="mcp"))

        def restart_tool(run: str = "") -> str:
            """Restart a live run's worker group (new worker processes; the failure budget is
            not spent). Destructive: the workers lose what they have not saved."""
            return act(run, Restart(source="mcp"))

        def kill_rank_tool(rank: int, run: str = "") -> str:
            """SIGKILL one local rank of a live run; the group then restarts while its
            --max-restarts budget lasts. Destructive."""
            return act(run, SignalRank(rank, int(signal.SIGKILL), source="mcp"))

        tools += [
            ("dump_stacks", dump_stacks_tool),
            ("restart", restart_tool),
            ("kill_rank", kill_rank_tool),
        ]
    for name, fn in tools:
        server.tool(name=name)(_reasoned(fn))
    return server


def main(argv: list[str]) -> int:
    """``tuilaunch mcp``: serve on stdio until the client closes it."""
    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return OK
    bad = [a for a in argv if a != "--control"]
    if bad:
        error = f"unexpected argument {bad[0]!r} ({USAGE_LINE})"
        print(f"tuilaunch mcp: error: {error}", file=sys.stderr)
        return USAGE
    server = build(control="--control" in argv)
    if server is None:
        print(MISSING, file=sys.stderr)
        return USAGE
    server.run("stdio")
    return OK
