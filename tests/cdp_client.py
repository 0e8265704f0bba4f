"""A small Chrome DevTools Protocol client: headless Chromium driven over its debugging port.

Debian's ``chromium`` (no browser download): started headless with ``--remote-debugging-port=0``
on 127.0.0.1 and a private profile; its ``DevToolsActivePort`` file gives the port, and a page
is driven over the page's websocket with aiohttp (already installed with textual-serve).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

# Before the page's own scripts run: keep every text a websocket receives (textual-serve's
# packets: what the dashboard process wrote to its terminal, which xterm.js draws on a canvas,
# out of the DOM's reach).
RECORD_WEBSOCKET = """
window.__received = [];
const Native = window.WebSocket;
window.WebSocket = function (...args) {
  const ws = new Native(...args);
  ws.addEventListener("message", (e) => {
    if (typeof e.data !== "string") {
      window.__received.push(new TextDecoder().decode(new Uint8Array(e.data)));
    }
  });
  return ws;
};
window.WebSocket.prototype = Native.prototype;
"""


class Browser:
    """One headless Chromium with a private profile in ``profile``."""

    def __init__(self, exe: str, profile: Path, size: tuple[int, int] = (1280, 800)) -> None:
        self.profile = profile
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless=new",
                "--no-sandbox",  # root in a container: the sandbox needs user namespaces
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def port(self, timeout: float = 60) -> int:
        """The debugging port, once Chromium has written it."""
        path = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(path.read_text().splitlines()[0])
            time.sleep(0.1)
        raise RuntimeError("chromium wrote no DevToolsActivePort")

    def close(self) -> None:
        """Kill Chromium and every process it started (its own session)."""
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


class Page:
    """One page (tab), driven over its DevTools websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call ``method`` and return its result (RuntimeError on a protocol error)."""
        n = next(self.ids)
        await self.ws.send_str(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self.events.append(msg)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        out = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    async def key(self, char: str) -> None:
        """Type one printable character (a key down with its text, a key up)."""
        code = f"Key{char.upper()}" if char.isalpha() else ""
        vk = ord(char.upper())
        await self.send(
            "Input.dispatchKeyEvent", type="keyDown", key=char, code=code, text=char,
            windowsVirtualKeyCode=vk,
        )  # fmt: skip
        await self.send(
            "Input.dispatchKeyEvent", type="keyUp", key=char, code=code, windowsVirtualKeyCode=vk
        )

    async def screenshot(self, path: Path) -> None:
        """A PNG of the page."""
        data = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(data["data"]))

    async def wait(self, expression: str, timeout: float, what: str) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextlib.asynccontextmanager
async def open_page(port: int, record: bool = True) -> Any:
    """A new page of the Chromium on ``port`` (websockets recorded with ``record``)."""
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as r:
            target = await r.json(content_type=None)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = Page(ws)
            await page.send("Page.enable")
            await page.send("Runtime.enable")
            if record:
                await page.send("Page.addScriptToEvaluateOnNewDocument", source=RECORD_WEBSOCKET)
            yield page
