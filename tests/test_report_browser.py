"""``tuilaunch report`` of a real run, opened in headless Chromium.

A run of ``tests/workers/stepper.py`` on 2 ranks with an exception injected into rank 1 in
attempt 0 (a failure with a traceback, then a restart) and rank 0 stopped in attempt 1 (a hang
that ``--hang-timeout`` confirms and ``--on-hang stop`` ends), its script given
``--token=abc123secret``. Its report is opened in Chromium (Debian's ``chromium``; the tests
skip, saying so, when there is none) with every connection sent to a local proxy that keeps
their request lines (loopback included): the page must make none (Chromium's own update and
account checks, which flags do not all switch off, are told apart by their exact hosts), its
Content-Security-Policy must report no violation (a blocked ``file://`` or inline load would),
and the DOM must hold the plots (uPlot's canvases), the hang verdict and the redacted argument.
A page that does load something, checked the same way, shows that the counting works.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import WORKERS, base_env, journal_path, wait_for

from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside

pytestmark = pytest.mark.slow

STEPPER = str(WORKERS / "stepper.py")
SECRET = "abc123secret"


# Chromium's own traffic, which flags do not all switch off (its component updater, the
# network time and account checks): requests for exactly these hosts are not the page's.
CHROMIUM_OWN = re.compile(
    rb"^(?:CONNECT (?:update\.googleapis\.com|accounts\.google\.com|clients2\.google\.com):443"
    rb"|(?:GET|POST) http://(?:update\.googleapis\.com|clients2\.google\.com)/(?:service/update2|time/1)/)"
)


class Proxy:
    """A TCP listener on loopback that keeps the first line of every request it is sent (and
    closes the connection)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            try:
                self.requests.append(conn.recv(4096).split(b"\r\n", 1)[0])
            except OSError as e:
                self.requests.append(f"(no request line: {e})".encode())
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)

    def pages(self) -> list[bytes]:
        """The requests that are not Chromium's own. A connection closed before any byte
        (b"": Chromium's speculative preconnect to its proxy, seen once in a suite run) asks
        for nothing, so it is not one."""
        return [r for r in self.requests if r and not CHROMIUM_OWN.match(r)]


def browse(exe: str, page: Path, tmp: Path, *action: str) -> tuple[str, list[bytes]]:
    """Open ``page`` in headless Chromium (``exe``) with ``action`` (``--dump-dom``,
    ``--screenshot=``); its output and the requests it made (Chromium's own left out)."""
    proxy = Proxy()
    profile = tmp / "chromium-profile"
    cmd = [
        exe,
        "--headless",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        # Every request, to loopback too, goes to the counting proxy.
        f"--proxy-server=http://127.0.0.1:{proxy.port}",
        "--proxy-bypass-list=<-loopback>",
        # Chromium's own background traffic off, so that any connection is the page's.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--no-first-run",
        "--no-default-browser-check",
        "--virtual-time-budget=5000",
        "--window-size=1300,2400",
        *action,
        page.as_uri(),
    ]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    env = base_env(HOME=str(tmp))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)
    finally:
        proxy.close()
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, proxy.pages()


def test_the_counting_sees_a_page_that_loads(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "loads.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="http://example.invalid/a.png">'
        '<script src="https://cdn.example.invalid/x.js"></script></body></html>'
    )
    _, requests = browse(chromium, page, tmp_path, "--dump-dom")
    assert any(b"example.invalid" in r for r in requests), requests


@pytest.fixture
def hung_run(tuilaunch, tmp_path: Path) -> Path:
    """A finished run: a failure with a traceback, a restart, a confirmed hang."""
    launch = tuilaunch(
        "--log-dir",
        str(tmp_path / "logs"),
        "--journal-samples",
        "1",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--hang-timeout",
        "3",
        "--on-hang",
        "stop",
        "--inject",
        "exception:rank=1,after=3s,attempt=0,message=loader died",
        "--inject",
        "hang:rank=0,after=3s,attempt=1,for=300s",
        STEPPER,
        "--steps",
        "5000",
        "--interval",
        "0.02",
        f"--token={SECRET}",
        env=base_env(HF_TOKEN="hf_" + SECRET),
    )
    assert launch.wait(180) == INFRASTRUCTURE, launch.output[-4000:]
    return journal_path(launch.output).parent


def test_report_of_a_real_run_in_chromium(chromium: str, hung_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    made = subprocess.run(
        [sys.executable, "-m", "tui_launch", "report", str(hung_run), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    page = out.read_text()
    assert SECRET not in page and "--token=***" in page
    assert len(page.encode()) < 5_000_000

    dom, requests = browse(chromium, out, tmp_path, "--dump-dom")
    assert requests == [], "the report made a network request"
    # No Content-Security-Policy violation recorded by the page (a blocked load would be).
    violations = re.search(r'<ul id="csp-violations"([^>]*)>(.*?)</ul>', dom, re.S)
    assert violations is not None, "no #csp-violations list in the DOM"
    assert violations.group(2) == "", violations.group(0)
    # The plots were drawn: uPlot's containers with their canvases, one per series table.
    drawn = re.search(r'<body[^>]*data-plots="(\d+)"', dom)
    assert drawn is not None, "the page's script did not run to its end"
    plotted = int(drawn.group(1))
    assert plotted >= 5, plotted  # rate, loss, step, CPU, memory (no GPU here)
    assert dom.count('class="uplot') == plotted and dom.count("<canvas") >= plotted
    for pid in ("plot-rate", "plot-loss", "plot-cpu", "plot-rss"):
        assert re.search(rf'id="{pid}"[^>]*data-plotted="\d+"', dom), pid
    # The hang's verdict, the failure's traceback, the restart and the injections.
    assert "hung: no main-thread stack moved" in dom
    assert "every rank is in the same place" in dom or "not in a collective" in dom
    assert "InjectedFailure: loader died" in dom and "Traceback" in dom
    assert "restart (failure): attempt 0 -&gt; 1" in dom
    assert dom.count('class="k-injection"') == 2
    assert "| HF_TOKEN |" not in dom and re.search(r"HF_TOKEN</th><td>\*\*\*</td>", dom)
    assert SECRET not in dom

    shot = tmp_path / "report.png"
    browse(chromium, out, tmp_path, f"--screenshot={shot}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_report_of_a_running_run(tuilaunch, tmp_path: Path) -> None:
    # A run still going: the report is made from what its journal holds so far.
    logs = tmp_path / "logs"
    launch = tuilaunch(
        "--log-dir",
        str(logs),
        "--journal-samples",
        "1",
        "--standalone",
        "--nproc-per-node",
        "2",
        STEPPER,
        "--steps",
        "100000",
        "--interval",
        "0.05",
    )

    def journal_with_telemetry() -> Path | None:
        for path in logs.glob("*/journal.jsonl"):
            if b'"kind": "telemetry"' in path.read_bytes():
                return path
        return None

    path = wait_for(journal_with_telemetry, 120, what="a journal with a telemetry record")
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "tui_launch",
            "report",
            str(path.parent),
            "--format",
            "md",
            "-o",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert "| outcome | running (no end recorded" in made.stdout, made.stdout[:2000]
    assert "| 0 | +" in made.stdout  # attempt 0 in the attempts table
    assert "local rank 0, stdout" in made.stdout  # its log so far
    launch.proc.terminate()
    assert launch.wait(60) != 0


# Every time-axis label's box, by row (uPlot's labels may have two), in the page's own font:
# the pairs of neighbours closer than 4 px, and those the canvas's edges cut.
AXIS_LABELS = r"""
(() => {
  const out = [];
  for (const u of window.tuilaunchReport.plots) {
    const ax = u.axes[0];
    const ctx = document.createElement("canvas").getContext("2d");
    ctx.font = ax.font[0];
    const boxes = [];
    ax._splits.forEach((v, i) => {
      const x = u.valToPos(v, "x") + u.bbox.left / devicePixelRatio;  // from the canvas's left
      String(ax._values[i] ?? "").split("\n").forEach((line, row) => {
        const w = ctx.measureText(line).width;
        if (line) boxes.push({row, line, l: x - w / 2, r: x + w / 2});
      });
    });
    const overlaps = [];
    for (const row of new Set(boxes.map(b => b.row))) {
      const bs = boxes.filter(b => b.row === row).sort((a, b) => a.l - b.l);
      for (let i = 1; i < bs.length; i++) {
        if (bs[i].l < bs[i - 1].r + 4) overlaps.push(bs[i - 1].line + " / " + bs[i].line);
      }
    }
    // Cut off by the canvas's edges.
    boxes.filter(b => b.l < 0 || b.r > u.width).forEach(b => overlaps.push(b.line + " / edge"));
    out.push({id: u.root.parentElement.id, labels: boxes.map(b => b.line), overlaps});
  }
  return out;
})()
"""


def _journal_of(run_dir: Path, first: float, last: float) -> None:
    """A run of 2 ranks with about 300 progress and telemetry records from ``first`` to
    ``last`` seconds after the builders' start (14:13:20 UTC), and its end."""
    import dataclasses

    from tui_launch.core.journal.writer import Journal
    from tui_launch.core.model.events import (
        ProgressRecord,
        RankProgress,
        RunFinished,
        TelemetryRecord,
    )
    from tui_launch.testing import builders

    run_dir.mkdir(parents=True)
    journal = Journal(str(run_dir / "journal.jsonl"))
    for e in [builders.run_started(2), *builders.attempt(0, 2, 0.5, 100)]:
        journal.write(e)
    sample = builders.telemetry(0, 2, 100, first, 1, gpus=2)[0]
    fields = {f.name: getattr(sample, f.name) for f in dataclasses.fields(sample)}
    every = max(1.0, (last - first) / 300)
    for k in range(int((last - first) / every) + 1):
        t = first + k * every
        journal.write(TelemetryRecord(**{**fields, **builders.at(t)}))
        ranks = tuple(RankProgress(g, g, "stdout", 10 * k, None, rate=10.0) for g in range(2))
        journal.write(
            ProgressRecord(
                attempt=0, leader=0, ranks=ranks, first_step=0, time_to_first_step=1.0,
                steps_reached=10 * k, progress_time=t, **builders.at(t),
            )
        )  # fmt: skip
    journal.write(RunFinished(outcome="succeeded", exit_code=0, message="", **builders.at(last)))
    journal.close()


@pytest.mark.parametrize(
    ("first", "last", "width"),
    [
        (34.0, 80.0, 1300),  # 46 s from 14:13:54: ticks 5 s apart across a minute
        (34.0, 80.0, 700),  # the same, one plot per row
        (5.0, 7200.0, 1300),  # two hours
        (5.0, 26 * 3600.0, 1300),  # a day and more: across midnight
    ],
    ids=["46s", "46s-narrow", "2h", "26h"],
)
def test_time_labels_do_not_overlap(
    chromium: str, tmp_path: Path, first: float, last: float, width: int
) -> None:
    # uPlot draws the axes on a canvas: the labels' boxes are measured in the page, in the
    # font uPlot draws them with. A screenshot of each case is left in tmp_path.
    import asyncio
    import base64

    from cdp_client import Browser, open_page

    run_dir = tmp_path / "run"
    _journal_of(run_dir, first, last)
    out = tmp_path / "report.html"
    made = subprocess.run(
        [sys.executable, "-m", "tui_launch", "report", str(run_dir), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr

    async def measure(port: int) -> list[dict[str, object]]:
        async with open_page(port, record=False) as page:
            await page.send("Page.navigate", url=out.as_uri())
            await page.wait("document.body && document.body.dataset.plots", 60, "the plots")
            top = await page.evaluate("document.getElementById('plots').offsetTop")
            shot = await page.send(
                "Page.captureScreenshot",
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": top, "width": width, "height": 700, "scale": 1},
            )
            (tmp_path / "plots.png").write_bytes(base64.b64decode(shot["data"]))
            result: list[dict[str, object]] = await page.evaluate(AXIS_LABELS)
            return result

    browser = Browser(chromium, tmp_path / "profile", (width, 1000))
    try:
        plots = asyncio.run(asyncio.wait_for(measure(browser.port()), 120))
    finally:
        browser.close()
    assert len(plots) >= 4, plots  # rate, loss, step, CPU, memory
    for p in plots:
        assert p["labels"], p
        assert p["overlaps"] == [], p
