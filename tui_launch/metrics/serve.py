"""Where the metrics go: ``GET /metrics`` over HTTP, and an atomically rewritten textfile.

- :class:`MetricsServer` (``--metrics-port``, ``--metrics-bind``): a daemon thread serving the
  registry in the Prometheus text format (OpenMetrics when the scraper asks for it), 404
  anywhere else; :meth:`MetricsServer.bind` is apart from serving so that a port in use fails
  before any worker starts.
- :class:`TextfileWriter` (``--metrics-textfile``): ``DIR/tuilaunch_<run-id>_<node>.prom``
  every 10 s on a :class:`~tui_launch.core.periodic.Periodic` (``tuilaunch-metrics-textfile``,
  nice +5), temp file then ``os.replace``, so node_exporter's textfile collector never reads
  half a file; the last write at close.

Neither knows what is in the registry: :mod:`tui_launch.metrics.families` builds it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.registry import CollectorRegistry

from tui_launch import __version__
from tui_launch.core.periodic import Periodic

if TYPE_CHECKING:
    pass

TEXTFILE_INTERVAL = 10.0


# ------------------------------------------------------------------------------ HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never holds the launcher's exit

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr, i.e. onto the run's console or dashboard,
        # for a scraper that hung up mid-answer (its scrape_timeout): nothing to tell the user.
        pass


def _handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that sends nothing is dropped
        server_version = f"tuilaunch/{__version__}"

        def do_GET(self) -> None:
            if urlsplit(self.path).path != "/metrics":
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")
                return
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(registry)
            except Exception as e:  # a scrape must not die silently nor print a traceback
                msg = f"tuilaunch: metrics failed: {type(e).__name__}: {e}\n"
                self._send(500, "text/plain; charset=utf-8", msg.encode())
                return
            self._send(200, content_type, body)

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no access log on the dashboard's terminal

    return Handler


class MetricsServer:
    """``GET /metrics`` on ``bind:port`` from a daemon thread (404 anywhere else).

    :meth:`bind` opens the socket (and raises :class:`MetricsError` for a port in use) without
    serving, so the CLI can fail before it starts any worker; :meth:`start` serves.
    """

    def __init__(self, registry: CollectorRegistry, port: int, bind: str = "127.0.0.1") -> None:
        self.registry = registry
        self.port = port
        self.bind_address = bind
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> MetricsServer:
        """Open and listen on the socket; :class:`MetricsError` if that cannot be done."""
        if self._server is not None:
            return self
        where = f"{self.bind_address}:{self.port}"
        if not 0 <= self.port <= 65535:
            raise MetricsError(f"--metrics-port must be 1-65535, got {self.port}")
        try:
            family = ipaddress.ip_address(self.bind_address).version
        except ValueError:
            raise MetricsError(
                f"--metrics-bind must be an IP address, got {self.bind_address!r}"
            ) from None
        server_cls = type(
            "_Server" + str(family),
            (_Server,),
            {"address_family": socket.AF_INET6 if family == 6 else socket.AF_INET},
        )
        try:
            self._server = server_cls((self.bind_address, self.port), _handler(self.registry))
        except OSError as e:
            reason = e.strerror or type(e).__name__
            raise MetricsError(f"--metrics-port: cannot listen on {where} ({reason})") from None
        return self

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the real port when 0 was asked for)."""
        if self._server is None:
            raise RuntimeError("not bound")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """The endpoint's URL."""
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def start(self) -> MetricsServer:
        """Bind if not yet done and serve on a daemon thread."""
        server = self.bind()._server
        assert server is not None
        if self._thread is None:
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.5},
                name="tuilaunch-metrics-http",
                daemon=True,
            )
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the socket (nothing listens afterwards)."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:
            server.shutdown()
            self._thread.join(5)
            self._thread = None
        server.server_close()


# -------------------------------------------------------------------------- textfile

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def textfile_name(run_id: str, node: str) -> str:
    """``tuilaunch_<run-id>_<node>.prom`` with anything unsafe in a file name made ``_``."""
    return f"tuilaunch_{_UNSAFE.sub('_', run_id)}_{_UNSAFE.sub('_', node)}.prom"


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file.

    A temp file in the same directory (``.tmp`` suffix: node_exporter reads only ``*.prom``)
    then ``os.replace``, which is atomic on one file system.
    """
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tuilaunch_", suffix=".prom.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fp:
            fp.write(data)
            fp.flush()
            os.fsync(fp.fileno())  # no empty file after a crash: the data is there before it
        # node_exporter runs as its own user and must read it (mkstemp made it 0600).
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class TextfileWriter:
    """Rewrite ``DIR/<name>`` from ``registry`` every ``interval`` s on a
    :class:`~tui_launch.core.periodic.Periodic`; :meth:`close` writes a last time.

    Args:
        registry: what to write.
        directory: the textfile collector's directory (it must exist).
        name: ``name(final)`` gives the file name, or None while it is not known yet (the run
            id comes with the rendezvous); it is fixed at the first write.
        finish: called before the last write (the collector then says the run finished).
        interval: seconds between writes.
        on_error: called with what a write raised (the loop goes on).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        directory: str,
        name: Callable[[bool], str | None],
        *,
        finish: Callable[[], None] | None = None,
        interval: float = TEXTFILE_INTERVAL,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.registry = registry
        self.directory = directory
        self.path: str | None = None
        self.writes = 0
        self._name = name
        self._finish = finish
        self._final = False
        self._on_error = on_error
        self._loop = Periodic(
            "tuilaunch-metrics-textfile",
            interval,
            self._tick,
            final_call=True,
            nice=5,
            on_error=self._failed,
        )

    def _failed(self, e: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(e)

    def _tick(self) -> float | None:
        if self.path is None:
            name = self._name(self._final)
            if name is None:
                return 1.0  # not named yet: look again in a second, not in ten
            self.path = os.path.join(self.directory, name)
        write_atomically(self.path, generate_latest(self.registry))
        self.writes += 1
        return None

    def start(self) -> TextfileWriter:
        """Start the loop (the first write at once, if the name is known)."""
        self._loop.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """The last write (after ``finish``), then stop the loop."""
        self._final = True
        if self._finish is not None:
            self._finish()
        self._loop.stop(timeout)


__all__ = [
    "TEXTFILE_INTERVAL",
    "MetricsServer",
    "TextfileWriter",
    "textfile_name",
    "write_atomically",
]


class MetricsError(Exception):
    """An exporter cannot start (the port was taken): one line for the user, exit status 2."""
