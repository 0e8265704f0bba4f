"""The MCP SDK's own stdio client, as a program: start ``tuilaunch mcp`` and call its tools.

``python tests/mcp_client.py CALLS_JSON [--control]`` prints one JSON object: the server's
name and version, its tool names, and each call's ``[is_error, text]``; the server's stderr
goes to ``$MCP_SERVER_STDERR`` (a file). Run under whichever SDK ``sys.path`` finds first, so a
test runs it under mcp 2 (the venv's) and mcp 1 (a ``pip install --target`` directory put
first on ``PYTHONPATH``), client and server alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


def _text(result: Any) -> list[Any]:
    """[is it an error, its text] (mcp 1 and 2 spell the flag apart)."""
    error = bool(getattr(result, "is_error", None) or getattr(result, "isError", False))
    return [error, "".join(getattr(c, "text", "") for c in result.content)]


async def _session(calls: list[list[Any]], control: bool) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    args = ["-m", "tui_launch", "mcp", *(["--control"] if control else [])]
    params = StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ))
    with open(os.environ.get("MCP_SERVER_STDERR", os.devnull), "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            init = await session.initialize()
            info: Any = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
            names = sorted(t.name for t in (await session.list_tools()).tools)
            results = []
            for name, arguments in calls:
                try:
                    results.append(_text(await session.call_tool(name, arguments)))
                except Exception as e:  # a protocol error (an unknown tool, under mcp 1)
                    results.append([True, str(e)])
    import mcp

    version = getattr(mcp, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("mcp")
    return {
        "sdk": version,
        "name": info.name,
        "version": info.version,
        "tools": names,
        "results": results,
    }


def main() -> None:
    calls = json.loads(sys.argv[1])
    out = asyncio.run(asyncio.wait_for(_session(calls, "--control" in sys.argv), 120))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
