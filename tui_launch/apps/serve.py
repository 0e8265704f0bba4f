"""``tuilaunch serve [RUN] [--port PORT] [--host HOST] [--control]``: the dashboard in a browser.

Textual's own web server (``textual-serve``, the ``serve`` extra: ``pip install -e
'.[serve]'``) runs one dashboard process per browser connection, over a websocket: ``tuilaunch
attach RUN_DIR`` for a live run (``attach RUN_DIR --control`` with ``--control``), ``tuilaunch
replay RUN_DIR`` for a finished one. ``RUN`` is named as ``status`` names it (a run id, a
launcher pid, a run directory; default: the only or latest live run, else the latest ended
one), once, at start: one ``serve`` serves one run.

What guards it:

- it listens on 127.0.0.1 unless ``--host`` names another address, and then says on stderr
  that anyone who can reach that address and has the URL can see the run (and act on it with
  ``--control``); the README shows the SSH tunnel instead;
- every request needs the random token of the URL it prints (``?token=...``), or the cookie
  the first page sets from it (HttpOnly, SameSite=Strict: another site's page cannot make the
  browser send it); anything else is answered 403, the websocket included, before any
  dashboard process starts;
- read-only unless ``--control``: the attached dashboard then acts through the run's control
  socket, which checks the uid and journals each command as any ``attach --control`` does.

It costs the run nothing while no browser is connected: this process only waits on its
listening socket (and looks once a second whether a live run's launcher is still there); the
dashboard process, which reads the journal, exists only while a browser page is open.

No page process outlives what it shows (:class:`PageService`): each runs in a process group
of its own and ends

- with its page: once the websocket closes it is asked to quit, then its group gets SIGTERM,
  then SIGKILL (a page closed before its dashboard was up never saw the quit);
- with its run: when a live run's launcher is gone, the attached pages end and a page opened
  afterwards gets the replay;
- with ``serve``: on SIGINT or SIGTERM every page ends as above before ``serve`` exits; a
  ``serve`` killed by SIGKILL closes its end of each page's input pipe, and the page, which
  watches that pipe (:func:`tui_launch.apps.replay.end_with_server`), exits.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from tui_launch.apps.status import NO_RUN, OK, USAGE

USAGE_LINE = "usage: tuilaunch serve [RUN] [--port PORT] [--host HOST] [--control]"
HELP = f"""{USAGE_LINE}

The dashboard of a run in a browser: attach (live) or replay (ended), one process per open
page. RUN: a run id, launcher pid or run directory (default: the only or latest live run,
else the latest ended one). Prints the URL to open; it holds a random token, without which
every request is refused (403).

  --port PORT   the port (default {{port}}; 0: any free port)
  --host HOST   listen on HOST instead of 127.0.0.1 (a warning: prefer an SSH tunnel)
  --control     the dashboard may act on the run (kill, restart, ...), as attach --control

Needs textual-serve, the serve extra: pip install -e '.[serve]' in tuilaunch's checkout."""
DEFAULT_PORT = 8000
LOOPBACK = "127.0.0.1"
COOKIE = "tuilaunch_token"
# The README's set-up installs no extra: from the checkout, `pip install -e '.[serve]'`.
MISSING = (
    "tuilaunch serve: error: textual-serve is not installed (the serve extra): "
    "pip install -e '.[serve]' in tuilaunch's checkout"
)
REFUSED = "403: this page needs the token of the URL that tuilaunch serve printed\n"


class Usage(ValueError):
    """Bad usage, in one line."""


def parse(argv: list[str]) -> tuple[str | None, int, str, bool]:
    """``(RUN, port, host, control)``; Usage with a one-line reason."""
    target: str | None = None
    port, host, control = DEFAULT_PORT, LOOPBACK, False
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg in ("--port", "--host"):
            if not rest:
                raise Usage(f"{arg} needs a value")
            value = rest.pop(0)
            if arg == "--host":
                host = value
            elif not value.isdigit() or int(value) > 65535:
                raise Usage(f"--port needs a port number (0-65535), got {value!r}")
            else:
                port = int(value)
        elif arg == "--control":
            control = True
        elif arg.startswith("-") or target is not None:
            raise Usage(f"unexpected argument {arg!r}")
        else:
            target = arg
    return target, port, host, control


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def view_command(run_dir: str, live: bool, control: bool) -> str:
    """The dashboard command one browser connection runs (a shell line: textual-serve
    starts it with a shell, so every word is quoted). A live run's page opened once the run
    has ended gets its replay: ``attach --control`` then finds no live run (exit 2)."""
    me = [sys.executable, "-m", "tui_launch"]
    replay = shlex.join([*me, "replay", run_dir])
    if not live:
        return f"exec {replay}"  # one process per page, not a shell waiting on it
    attach = shlex.join([*me, "attach", run_dir, *(["--control"] if control else [])])
    return f"{attach} || {{ [ $? -eq 2 ] && exec {replay}; }}" if control else f"exec {attach}"


def installed() -> bool:
    """Whether the serve extra (textual-serve, and aiohttp under it) can be imported."""
    try:
        import aiohttp  # noqa: F401
        import textual_serve.server  # noqa: F401
    except ImportError:
        return False
    return True


# How long a page's dashboard has to leave after the quit, then after SIGTERM, before its
# process group gets the next signal (a dashboard leaves in well under a second).
QUIT_GRACE = 3.0
TERM_GRACE = 2.0
RUN_POLL = 1.0  # s between two looks at whether a live run's launcher is still there


def make_server(
    command: str,
    title: str,
    token: str,
    run_live: Callable[[], bool] | None = None,
    replay: str | None = None,
) -> Any:
    """A textual-serve server for ``command`` whose every request must carry ``token``
    (None without textual-serve). ``run_live``: whether the live run is still there (looked
    at every :data:`RUN_POLL` s); once it says no, the open pages end and new pages run
    ``replay``."""
    try:
        from aiohttp import web
        from textual_serve.app_service import AppService
        from textual_serve.server import Server, to_int
    except ImportError:
        return None
    import asyncio

    async def exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    class PageService(AppService):
        """One page's dashboard process, in a process group of its own, ended with its
        page: asked to quit, then SIGTERM, then SIGKILL to its group (textual-serve only
        sends the quit, which a dashboard still starting up never reads)."""

        _stopping: asyncio.Task[None] | None = None

        async def _open_app_process(
            self, width: int = 80, height: int = 24
        ) -> asyncio.subprocess.Process:
            environment = self._build_environment(width=width, height=height)
            self._process = process = await asyncio.create_subprocess_shell(
                self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=environment,
                start_new_session=True,  # its group: the shell and the dashboard, ended together
            )
            assert process.stdin is not None
            self._stdin = process.stdin
            return process

        async def stop(self) -> None:
            """End the page's process (idempotent; concurrent calls wait for the same end)."""
            if self._stopping is None:
                self._stopping = asyncio.ensure_future(self._end())
            await asyncio.shield(self._stopping)

        async def _end(self) -> None:
            process = self._process
            if process is not None and process.returncode is None:
                await self.send_meta({"type": "quit"})
                if not await exited(process, QUIT_GRACE):
                    for sig, grace in ((signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, 10.0)):
                        with contextlib.suppress(OSError):
                            os.killpg(process.pid, sig)
                        if await exited(process, grace):
                            break
            task, self._task = self._task, None
            if task is not None:
                await self._download_manager.cancel_app_downloads(
                    app_service_id=self.app_service_id
                )
                # Its reader ends at the output's end, which the process's end brings.
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(task, 5.0)

    class TokenServer(Server):
        """textual-serve behind a token check (a middleware in front of every route), whose
        page processes end with their page, their run and the server."""

        pages: set[PageService]

        async def _make_app(self) -> web.Application:
            self.pages = set()
            app = await super()._make_app()
            app.middlewares.insert(0, self._guard)
            return app

        @web.middleware
        async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
            given = request.query.get("token") or request.cookies.get(COOKIE) or ""
            if not hmac.compare_digest(given.encode(), token.encode()):
                return web.Response(status=403, text=REFUSED)
            if request.path == "/":
                # The page's own links (scripts, the websocket) go back to the host and port
                # the browser used, which an SSH tunnel may have changed.
                self.public_url = f"{request.scheme}://{request.host}"
            response: web.StreamResponse = await handler(request)
            if "token" in request.query and not response.prepared:
                response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            return response

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            """textual-serve's, with a :class:`PageService` that is ended whatever ends the
            connection, and known to the server until it has ended."""
            websocket = web.WebSocketResponse(heartbeat=15)
            width = to_int(request.query.get("width", "80"), 80)
            height = to_int(request.query.get("height", "24"), 24)
            page: PageService | None = None

            async def close() -> None:
                await websocket.close()

            try:
                await websocket.prepare(request)
                page = PageService(
                    self.command,
                    write_bytes=websocket.send_bytes,
                    write_str=websocket.send_str,
                    close=close,
                    download_manager=self.download_manager,
                    debug=self.debug,
                )
                self.pages.add(page)
                await page.start(width, height)
                await self._process_messages(websocket, page)
            except asyncio.CancelledError:
                await websocket.close()
            except Exception as error:
                logging.getLogger("textual-serve").exception(error)
            finally:
                if page is not None:
                    await page.stop()
                    self.pages.discard(page)
            return websocket

        async def end_pages(self) -> None:
            """End every open page's process."""
            await asyncio.gather(*(page.stop() for page in list(self.pages)))

        async def watch_run(self) -> None:
            """Once the live run is gone: its pages end, a new page gets the replay."""
            assert run_live is not None and replay is not None
            while run_live():
                await asyncio.sleep(RUN_POLL)
            self.command = replay
            await self.end_pages()

        def initialize_logging(self) -> None:
            """Quiet: the URL is printed once by :func:`main`; errors still reach stderr."""
            logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

        async def on_startup(self, app: web.Application) -> None:
            """Nothing to print (textual-serve's banner would go to stdout); the run's
            watch starts."""
            if run_live is not None and replay is not None:
                self._watch = asyncio.ensure_future(self.watch_run())

        async def on_shutdown(self, app: web.Application) -> None:
            """The pages end before the server does."""
            await self.end_pages()

        def serve_on(self, sock: socket.socket) -> None:
            """Serve on an already bound socket until SIGINT or SIGTERM; no page process
            is left when it returns."""
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.request_exit)
            try:
                web.run_app(
                    self._make_app(), sock=sock, handle_signals=False, loop=loop, print=None
                )
            finally:
                # Whatever on_shutdown could not end (a second signal cut it short).
                for page in getattr(self, "pages", ()):
                    process = page._process
                    if process is not None and process.returncode is None:
                        with contextlib.suppress(OSError):
                            os.killpg(process.pid, signal.SIGKILL)

    return TokenServer(command, title=title)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (OSError in words)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str]) -> int:
    """``tuilaunch serve``: print the URL, serve until interrupted (exit 2 on bad input)."""
    from tui_launch.core.remote import runindex
    from tui_launch.core.remote.status import NoSuchRun, resolve

    if any(a in ("-h", "--help") for a in argv):
        print(HELP.replace("{port}", str(DEFAULT_PORT)))
        return OK
    try:
        target, port, host, control = parse(argv)
    except Usage as e:
        print(f"tuilaunch serve: error: {e} ({USAGE_LINE})", file=sys.stderr)
        return USAGE
    if not installed():  # before the run is looked for: that is not what is wrong
        print(MISSING, file=sys.stderr)
        return USAGE
    try:
        run = resolve(target)
    except NoSuchRun as e:
        print(f"tuilaunch serve: error: {e}", file=sys.stderr)
        return NO_RUN
    if control and not run.live:
        print("tuilaunch serve: error: --control needs a live run; this one has ended "
              "(serve it without --control to replay it)", file=sys.stderr)  # fmt: skip
        return USAGE
    if control and run.entry is not None and not run.entry.control:
        print(f"tuilaunch serve: error: run {run.entry.pid} does not listen for control: start "
              "it with --control-socket (or --detach, or press D in its dashboard)",
              file=sys.stderr)  # fmt: skip
        return USAGE
    token = secrets.token_urlsafe(24)
    run_id = run.entry.run_id if run.entry else run.run_dir
    entry = run.entry
    run_live = None
    if run.live and entry is not None:

        def run_live() -> bool:
            # Its live entry goes when it ends; a SIGKILLed launcher's pid goes (or is reused).
            return os.path.exists(entry.path) and runindex.state(entry) == runindex.LIVE

    server = make_server(
        view_command(run.run_dir, run.live, control),
        f"tuilaunch {run_id}",
        token,
        run_live=run_live,
        replay=view_command(run.run_dir, False, False),
    )
    if server is None:
        print(MISSING, file=sys.stderr)
        return USAGE
    try:
        sock = bind(host, port)
    except OSError as e:
        print(f"tuilaunch serve: error: cannot listen on {host}:{port}: {e.strerror or e} "
              "(--port N picks another; 0: any free port)", file=sys.stderr)  # fmt: skip
        return USAGE
    if not is_loopback(host):
        print(f"tuilaunch serve: warning: listening on {host}, not on 127.0.0.1: anyone who "
              "can reach it and has the URL can see this run"
              + (" and act on it (--control)" if control else "")
              + "; the token travels in clear text (no TLS): prefer an SSH tunnel",
              file=sys.stderr)  # fmt: skip
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    mode = "control" if control else ("read-only" if run.live else "replay")
    print(f"tuilaunch serve: {mode} dashboard of run {run_id} ({run.run_dir})")
    print(f"open: http://{shown}:{bound_port}/?token={token}", flush=True)
    with contextlib.closing(sock):
        server.serve_on(sock)
    return OK
