"""Issue 27: ``tuilaunch serve``, the dashboard in a browser, tested in headless Chromium.

A real run with a control socket, ``serve RUN --control --port 0``: no dashboard process
while no page is open; without the token every request (the page, the websocket) is refused
with 403; with it the dashboard's worker pids reach the page; ``k`` then ``y`` typed into the
page kill rank 0 and the group restarts with new pids (journaled as the attached dashboard's
command); closing the page ends its dashboard process. ``--host`` other than loopback warns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cdp_client import Browser, chromium, open_page
from conftest import PY, ROOT, WORKERS, base_env, live_journal, wait_for

from tui_launch import cli
from tui_launch.apps import serve as serve_app
from tui_launch.apps.serve import is_loopback
from tui_launch.core.remote import runindex


def test_bad_usage_and_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["serve", "--port", "x"]) == 2
    assert cli.run(["serve", "--port", "70000"]) == 2
    assert cli.run(["serve", "a", "b"]) == 2
    assert cli.run(["serve", "no-such-run-anywhere"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("tuilaunch serve: error: ") for line in err)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def test_without_textual_serve_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the serve extra: one line naming the command and what installs the extra from
    this checkout, exit 2, before any run is looked for (not "no such run")."""
    for name in ("textual_serve", "textual_serve.server"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    assert cli.run(["serve", "no-such-run-anywhere"]) == 2
    assert capsys.readouterr().err == serve_app.MISSING + "\n"
    assert serve_app.MISSING.startswith("tuilaunch serve: error: ")
    assert "\n" not in serve_app.MISSING and "pip install -e '.[serve]'" in serve_app.MISSING


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (from /proc)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fp:
                out += [int(c) for c in fp.read().split()]
    return out


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _serve(*args: str, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as fp:
        return subprocess.Popen(
            [PY, "-m", "tui_launch", "serve", *args],
            env=base_env(),
            cwd=ROOT,
            stdout=fp,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its dashboard processes too: one group to end
        )


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(
    chromium() is None, reason="chromium is not installed (apt-get install chromium)"
)
@pytest.mark.timeout(900)
def test_serve_in_headless_chromium(tuilaunch, tmp_path: Path) -> None:
    pytest.importorskip("textual_serve")
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
        str(WORKERS / "stepper.py"), "--steps", "100000", "--interval", "0.1",
    )  # fmt: skip

    def listening() -> runindex.Entry | None:
        for e in runindex.entries():
            if e.pid == job.pid and e.control and e.journal and os.path.exists(e.journal):
                return e
        return None

    journal = str(wait_for(listening, 180, what="the run listening for control").journal)

    def started() -> list[dict[str, Any]]:
        return [e for e in live_journal(journal) if e["kind"] == "workers_started"]

    first = wait_for(started, 120, what="workers")[0]
    old = {w["local_rank"]: w["pid"] for w in first["workers"]}

    # Bound to anything but loopback: a warning, then the same URL line.
    wide_out = tmp_path / "wide.out"
    wide = _serve(str(job.pid), "--host", "0.0.0.0", "--port", "0", out=wide_out)
    try:
        wait_for(lambda: "open: http://" in wide_out.read_text(), 120, what="serve's URL")
        assert "warning: listening on 0.0.0.0, not on 127.0.0.1" in wide_out.read_text()
    finally:
        _end(wide)

    out = tmp_path / "serve.out"
    serve = _serve(str(job.pid), "--control", "--port", "0", out=out)
    browser = Browser(str(chromium()), tmp_path / "profile")
    try:
        line = wait_for(
            lambda: next((s for s in out.read_text().splitlines() if s.startswith("open: ")), ""),
            120,
            what="serve's URL",
        )
        url = line.split()[1]
        base = url.split("?")[0]
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        assert _children(serve.pid) == []  # no page open: no dashboard process
        # No token, or a wrong one: refused, the websocket too; still no dashboard process.
        assert _status(base) == 403
        assert _status(base + "?token=wrong") == 403
        assert _status(base + "ws") == 403
        assert _status(url.replace("/?", "/static/js/textual.js?")) == 200
        assert _children(serve.pid) == []
        drive = _drive(browser.port(), url, base, old, tmp_path, journal)
        asyncio.run(asyncio.wait_for(drive, 600))
        # The page closed: its dashboard process ends.
        wait_for(lambda: _children(serve.pid) == [], 60, what="the dashboard process to end")
    finally:
        browser.close()
        _end(serve)
    again = started()[1]
    new = {w["local_rank"]: w["pid"] for w in again["workers"]}
    assert not set(new.values()) & set(old.values())
    kill = next(
        e for e in live_journal(journal) if e["kind"] == "control" and e["action"] == "kill"
    )
    assert kill["pid"] == old[0] and kill["ok"] and kill["source"].startswith("attach pid ")
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143


async def _drive(
    port: int, url: str, base: str, old: dict[int, int], tmp: Path, journal: str
) -> None:
    def shown(pids: list[int], since: str = "0") -> str:
        found = " && ".join(f"text.includes('{pid}')" for pid in pids)
        text = f"window.__received.slice({since}).join('')"
        return f"(() => {{ const text = {text}; return {found}; }})()"

    async with open_page(port) as page:
        await page.send("Page.navigate", url=base)
        refused = await page.wait("document.body && document.body.innerText", 60, "the 403 page")
        assert refused.startswith("403")
        await page.send("Page.navigate", url=url)
        # The dashboard's first frames reach the page: both workers' pids are in them.
        await page.wait(shown(list(old.values())), 180, "the workers' pids in the page")
        await page.screenshot(tmp / "dashboard.png")
        assert (tmp / "dashboard.png").stat().st_size > 10_000
        await page.evaluate("document.querySelector('.xterm-helper-textarea').focus()")
        mark = await page.evaluate("window.__received.length")
        await page.key("k")  # rank 0 is selected: kill it ...
        await page.wait(
            f"window.__received.slice({mark}).join('').includes('SIGKILL')", 60, "the question"
        )
        await page.key("y")  # ... confirmed: the group restarts with new pids
        for _ in range(1200):
            workers = [e for e in live_journal(journal) if e["kind"] == "workers_started"]
            if len(workers) > 1:
                break
            await asyncio.sleep(0.2)
        new = [w["pid"] for w in workers[1]["workers"]]
        await page.wait(shown(new, str(mark)), 180, "the new pids in the page")
        await page.screenshot(tmp / "restarted.png")
        await page.send("Page.close")  # the tab closed (navigating away may keep it cached)
