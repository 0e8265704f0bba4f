"""Issue 27: ``tuilaunch mcp``, driven by the official SDK's own stdio client.

A real run with a control socket: the client lists the tools (the acting ones only with
``--control``), ``status`` returns the run (its launcher pid and the workers' pids, as the
journal has them), ``tail_log`` a rank's output; without ``--control`` a restart is not a
tool; with it, ``kill_rank`` restarts the group (new pids) and the journal names the server.
Without the SDK the command says so in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, ROOT, WORKERS, base_env, live_journal, wait_for

from tui_launch import __version__, cli
from tui_launch.apps import mcp as mcp_app
from tui_launch.core.remote import runindex

READ_TOOLS = {"list_runs", "status", "why", "tail_log"}
ACT_TOOLS = {"dump_stacks", "restart", "kill_rank"}


def test_without_the_sdk_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("mcp", "mcp.server", "mcp.server.mcpserver", "mcp.server.fastmcp"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    assert cli.run(["mcp"]) == 2
    assert capsys.readouterr().err == mcp_app.MISSING + "\n"
    # One line that names the command and what installs the extra from this checkout (the
    # README's set-up command does not).
    assert mcp_app.MISSING.startswith("tuilaunch mcp: error: ") and "\n" not in mcp_app.MISSING
    assert "pip install -e '.[mcp]'" in mcp_app.MISSING


def _text(result: Any) -> tuple[bool, str]:
    """(is it an error, its text) of a tool call's result (mcp 1 and 2 spell the flag apart)."""
    error = bool(getattr(result, "is_error", None) or getattr(result, "isError", False))
    return error, "".join(getattr(c, "text", "") for c in result.content)


async def _session(control: bool, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """Start ``tuilaunch mcp`` with the SDK's stdio client: its tool names and each call's
    (error, text)."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    args = ["-m", "tui_launch", "mcp", *(["--control"] if control else [])]
    params = StdioServerParameters(command=PY, args=args, env=base_env(), cwd=str(ROOT))
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            results = []
            for name, arguments in calls:
                try:
                    results.append(_text(await session.call_tool(name, arguments)))
                except Exception as e:  # an unknown tool may be a protocol error
                    results.append((True, str(e)))
            return names, results


def _run(control: bool, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    return asyncio.run(asyncio.wait_for(_session(control, calls), 120))


@pytest.mark.timeout(600)
def test_mcp_client_on_a_real_run(tuilaunch) -> None:
    pytest.importorskip("mcp")
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
        str(WORKERS / "ticker.py"), "--ticks", "6000",
    )  # fmt: skip

    def listening() -> runindex.Entry | None:
        for e in runindex.entries():
            if e.pid == job.pid and e.control and e.journal and os.path.exists(e.journal):
                return e
        return None

    entry = wait_for(listening, 180, what="the run listening for control")
    journal = str(entry.journal)

    def started() -> list[dict[str, Any]]:
        return [e for e in live_journal(journal) if e["kind"] == "workers_started"]

    old = {w["local_rank"]: w["pid"] for w in wait_for(started, 120, what="workers")[0]["workers"]}
    wait_for(
        lambda: "tick" in _read(journal, 0),
        120,
        what="rank 0's first tick",
    )
    run = str(job.pid)
    names, results = _run(
        False,
        [
            ("list_runs", {}),
            ("status", {"run": run}),
            ("tail_log", {"run": run, "rank": 0, "lines": 5}),
            ("why", {"run": run}),
            ("restart", {"run": run}),
        ],
    )
    assert names == READ_TOOLS
    (e1, runs), (e2, status), (e3, tail), (e4, why), (e5, restart) = results
    assert not (e1 or e2 or e3 or e4), results
    assert any(r["pid"] == job.pid and r["control"] for r in json.loads(runs))
    doc = json.loads(status)
    assert doc["schema_version"] == 1 and doc["run"]["launcher_pid"] == job.pid
    assert doc["state"] == "running" and {r["local_rank"]: r["pid"] for r in doc["ranks"]} == old
    lines = tail.splitlines()
    # The last line may still be being written: the whole ones are the worker's ticks.
    assert 1 <= len(lines) <= 5 and all(line.startswith("tick ") for line in lines[:-1])
    assert json.loads(why)["root_cause"] is None
    assert e5 and "restart" in restart  # not a tool without --control
    assert len(started()) == 1  # nothing restarted

    names, results = _run(True, [("kill_rank", {"run": run, "rank": 1})])
    assert names == READ_TOOLS | ACT_TOOLS
    assert results[0][0] is False, results
    again = wait_for(lambda: started()[1:], 180, what="the group restarted")[0]
    new = {w["local_rank"]: w["pid"] for w in again["workers"]}
    assert sorted(new) == [0, 1] and not set(new.values()) & set(old.values())
    kill = next(
        e for e in live_journal(journal) if e["kind"] == "control" and e["action"] == "kill"
    )
    assert kill["source"].startswith("mcp pid ") and kill["source"].endswith(f"uid {os.getuid()}")
    assert kill["pid"] == old[1] and kill["ok"]
    # why names the root cause now: the killed rank.
    _, results = _run(False, [("why", {"run": run})])
    cause = json.loads(results[0][1])["root_cause"]
    assert cause["global_rank"] == 1 and cause["signal"] == "SIGKILL" and cause["recovered"]
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143


def _read(journal: str, rank: int) -> str:
    path = os.path.join(os.path.dirname(journal), "attempt_0", str(rank), "stdout.log")
    with contextlib.suppress(OSError), open(path) as fp:
        return fp.read()
    return ""


# The newest mcp 1.x, installed once per machine (pytest's cache) at test time; None where
# pip cannot get it (no index reachable): that case skips, with the reason.
MCP1_SPEC = "mcp<2"


def _mcp1_dir(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    # pytest's cache keeps the install across runs; without it (-p no:cacheprovider), this test's
    # own directory.
    cache: pytest.Cache | None = getattr(request.config, "cache", None)
    target = cache.mkdir("mcp1-sdk") if cache is not None else tmp_path / "mcp1-sdk"
    if (target / "mcp" / "server" / "fastmcp").is_dir():
        return str(target)
    done = subprocess.run(
        [PY, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
         str(target), MCP1_SPEC],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return str(target) if done.returncode == 0 else None


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sdk", ["installed", "mcp<2"])
def test_tool_errors_keep_their_reason(
    sdk: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The SDK's own client (and server) of each major version: a tool that cannot answer
    says why, the server's stderr stays empty, and the server reports tuilaunch's version."""
    pytest.importorskip("mcp")
    env = base_env()
    if sdk != "installed":
        where = _mcp1_dir(request, tmp_path)
        if where is None:
            pytest.skip(f"pip could not install {sdk!r} (no package index?)")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    stderr = tmp_path / "server.err"
    env["MCP_SERVER_STDERR"] = str(stderr)
    calls = [
        ("status", {"run": "no-such-run-anywhere"}),
        ("why", {"run": str(empty)}),
        ("tail_log", {"run": str(empty), "stream": "stdin"}),
        ("tail_log", {"lines": 0}),
    ]
    done = subprocess.run(
        [PY, str(ROOT / "tests" / "mcp_client.py"), json.dumps(calls)],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["sdk"].startswith("1.") == (sdk == "mcp<2"), out["sdk"]
    assert out["name"] == "tuilaunch" and out["version"] == __version__
    reasons = [
        "no run 'no-such-run-anywhere' here (tuilaunch ls)",
        f"{empty} holds no tuilaunch event: not a run's journal",
        "stream must be stdout or stderr, not 'stdin'",
        f"lines must be between 1 and {mcp_app.TAIL_MAX}",
    ]
    for (name, _), (error, text), reason in zip(calls, out["results"], reasons, strict=True):
        assert error and text == f"Error executing tool {name}: {reason}", (text, reason)
    assert stderr.read_text() == ""
