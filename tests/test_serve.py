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
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cdp_client import Browser, open_page
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


@pytest.mark.timeout(900)
def test_serve_in_headless_chromium(chromium: str, tuilaunch, tmp_path: Path) -> None:
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
    browser = Browser(chromium, tmp_path / "profile")
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


def _pages(run_dir: str) -> dict[int, str]:
    """The page processes of ``serve`` for ``run_dir`` (pid: command line): every process
    running ``tui_launch attach|replay`` on it (a shell in front of one included)."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "tui_launch" in cmd and run_dir in cmd and (" attach " in cmd or " replay " in cmd):
            out[int(entry)] = cmd
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _url(out: Path) -> str:
    line = wait_for(
        lambda: next((s for s in out.read_text().splitlines() if s.startswith("open: ")), ""),
        120,
        what="serve's URL",
    )
    return line.split()[1]


async def _open_and_close(browser: Browser, url: str, run_dir: str) -> set[int]:
    """Open ``url`` and close the tab as soon as its page process exists: before its
    dashboard is up (that takes a second or more), as a page that lives a moment does.
    The new page's processes."""
    before = set(_pages(run_dir))
    async with open_page(browser.port()) as page:
        await page.send("Page.navigate", url=url)
        for _ in range(600):
            if set(_pages(run_dir)) - before:
                break
            await asyncio.sleep(0.05)
        await page.send("Page.close")
    new = set(_pages(run_dir)) - before
    assert new, "no page process started"
    return new


async def _open(browser: Browser, url: str, run_dir: str, what: str) -> dict[int, str]:
    """Open ``url`` in a new tab (left open) until its dashboard draws; its page processes."""
    async with open_page(browser.port()) as page:
        await page.send("Page.navigate", url=url)
        await page.wait(f"window.__received.join('').includes('{what}')", 180, what)
    return wait_for(lambda: _pages(run_dir), 30, what="the page's process")


def _gone(run_dir: str, what: str) -> None:
    wait_for(lambda: not _pages(run_dir), 60, interval=0.2, what=what)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_page_processes_end_with_page_run_and_serve(
    chromium: str, tuilaunch, tmp_path: Path
) -> None:
    """Issue 32: a page's ``attach``/``replay`` process ends with its page (a short-lived
    ``chromium --screenshot`` too), with ``serve`` (SIGTERM, SIGKILL) and with its run; an open
    page left idle does not spin."""
    pytest.importorskip("textual_serve")
    job = tuilaunch(
        "--standalone", "--nproc-per-node", "1", str(WORKERS / "stepper.py"),
        "--steps", "100000", "--interval", "0.5",
    )  # fmt: skip

    def registered() -> runindex.Entry | None:
        for e in runindex.entries():
            if e.pid == job.pid and e.run_dir and e.journal and os.path.exists(e.journal):
                return e
        return None

    run_dir = str(wait_for(registered, 180, what="the run's directory").run_dir)
    browser = Browser(chromium, tmp_path / "profile")
    servers: list[subprocess.Popen[bytes]] = []

    def serve(name: str) -> tuple[subprocess.Popen[bytes], str]:
        out = tmp_path / f"{name}.out"
        servers.append(_serve(str(job.pid), "--port", "0", out=out))
        return servers[-1], _url(out)

    try:
        # A page that lives a fraction of a second: its dashboard never read the quit.
        first, url = serve("screenshot")
        shot = subprocess.run(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
             f"--user-data-dir={tmp_path / 'shot-profile'}", f"--screenshot={tmp_path / 's.png'}",
             url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        assert shot.returncode == 0
        _gone(run_dir, "the screenshot page's process to end with its page")
        asyncio.run(_open_and_close(browser, url, run_dir))
        _gone(run_dir, "the process of a page closed at once to end with its page")

        # An open page: idle, it costs little; serve SIGKILLed, it ends.
        pages = asyncio.run(_open(browser, url, run_dir, "ATTACHED"))
        pid = max(pages)
        cpu, start = _cpu_seconds(pid), time.monotonic()
        time.sleep(5)  # the window the CPU time is measured over, not a wait for a condition
        busy = (_cpu_seconds(pid) - cpu) / (time.monotonic() - start)
        assert busy < 0.3, f"an idle page's process used {busy:.0%} of a core"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        _gone(run_dir, "the page's process to end with serve (SIGKILL)")

        # serve stopped by SIGTERM with a page open: serve and the page's process end.
        second, url = serve("sigterm")
        asyncio.run(_open(browser, url, run_dir, "ATTACHED"))
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
        _gone(run_dir, "the page's process to end with serve (SIGTERM)")

        # The run ends with a page open: the page's process ends, serve stays, and a page
        # opened now gets the replay.
        third, url = serve("run-end")
        asyncio.run(_open(browser, url, run_dir, "ATTACHED"))
        job.proc.send_signal(signal.SIGTERM)
        assert job.wait(120) == 143
        _gone(run_dir, "the attached page's process to end with its run")
        assert third.poll() is None
        pages = asyncio.run(_open(browser, url, run_dir, "REPLAY"))
        assert all(" replay " in cmd for cmd in pages.values()), pages
        # A replay's page closed before its dashboard was up (it spun at 50-99 % of a core,
        # forever, never reading the quit).
        new = asyncio.run(_open_and_close(browser, url, run_dir))
        wait_for(lambda: not new & set(_pages(run_dir)), 60, what="the closed page to end")
    finally:
        browser.close()
        for proc in servers:
            _end(proc)
    _gone(run_dir, "every page's process")
