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
listening socket; the dashboard process, which reads the journal, exists only while a browser
page is open, and ends when it closes.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import secrets
import shlex
import socket
import sys
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
        return replay
    attach = shlex.join([*me, "attach", run_dir, *(["--control"] if control else [])])
    return f"{attach} || {{ [ $? -eq 2 ] && {replay}; }}" if control else attach


def installed() -> bool:
    """Whether the serve extra (textual-serve, and aiohttp under it) can be imported."""
    try:
        import aiohttp  # noqa: F401
        import textual_serve.server  # noqa: F401
    except ImportError:
        return False
    return True


def make_server(command: str, title: str, token: str) -> Any:
    """A textual-serve server for ``command`` whose every request must carry ``token``
    (None without textual-serve)."""
    try:
        from aiohttp import web
        from textual_serve.server import Server
    except ImportError:
        return None

    class TokenServer(Server):
        """textual-serve behind a token check (a middleware in front of every route)."""

        async def _make_app(self) -> web.Application:
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

        def initialize_logging(self) -> None:
            """Quiet: the URL is printed once by :func:`main`; errors still reach stderr."""
            import logging

            logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

        async def on_startup(self, app: web.Application) -> None:
            """Nothing to print (textual-serve's banner would go to stdout)."""

        def serve_on(self, sock: socket.socket) -> None:
            """Serve on an already bound socket until SIGINT or SIGTERM."""
            import asyncio
            import signal

            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.request_exit)
            web.run_app(self._make_app(), sock=sock, handle_signals=False, loop=loop, print=None)

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
    server = make_server(view_command(run.run_dir, run.live, control), f"tuilaunch {run_id}", token)
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
