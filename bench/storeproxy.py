"""A counting TCP proxy for a job's rendezvous store: who sends how many requests, how many bytes.

Used by ``bench/agents.py``: agents reach the c10d ``TCPStore`` or the etcd server through it,
and each request is read off the wire and put down to whoever sent it: tuilaunch (its keys are
under ``tuilaunch/``: the cluster view and job-wide dumps) or torch (the rendezvous: its state
key ``torch.rendezvous.<run id>``, or etcd's ``/torch/...``). Bytes are counted per connection,
both ways, and put down to the connection's owner: tuilaunch's cluster view opens a client of its
own (``core/job/view.py``), so a connection is one side's or the other's.

Two readers of the client's stream, stdlib only:

* :class:`TCPStoreReader`: torch's ``TCPStore`` protocol (``QueryType`` in
  ``torch/csrc/distributed/c10d/TCPStoreBackend.hpp``): one command byte, then its arguments,
  strings and payloads as a little-endian ``uint64`` length and the bytes;
* :class:`HTTPReader`: etcd's v2 API, HTTP/1.1 requests (request line, headers, a body of
  ``Content-Length`` bytes).

A stream the reader cannot follow (an unknown command) is counted in bytes only, and said so
(``unparsed``). One thread (``selectors``) serves every connection.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

TUILAUNCH, TORCH, UNKNOWN = "tuilaunch", "torch", "unknown"

# QueryType, in order (TCPStoreBackend.hpp); each entry: the argument shapes after the command
# byte. "k" a key (uint64 length + bytes), "p" a payload (the same), "4" a uint32, "8" an
# int64, "K" a uint64 count then that many keys, "M" a count then that many (key, payload).
COMMANDS: tuple[tuple[str, str], ...] = (
    ("validate", "4"),
    ("set", "kp"),
    ("compare_set", "kpp"),
    ("get", "k"),
    ("add", "k8"),
    ("check", "K"),
    ("wait", "K"),
    ("getnumkeys", ""),
    ("delete_key", "k"),
    ("append", "kp"),
    ("multi_get", "K"),
    ("multi_set", "M"),
    ("cancel_wait", ""),
    ("ping", "4"),
    ("queue_push", "kp"),
    ("queue_pop", "k"),
    ("queue_len", "k"),
)


def owner_of(key: str) -> str:
    """Whose key this is: tuilaunch's (``tuilaunch/...``) or torch's."""
    return TUILAUNCH if "tuilaunch/" in key else TORCH


@dataclass
class Request:
    """One request read off a client's stream."""

    op: str
    keys: tuple[str, ...]
    size: int  # bytes on the wire, the command byte included


class TCPStoreReader:
    """Reads ``TCPStore`` requests off a client's byte stream, as they arrive in pieces."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.broken = False

    def feed(self, data: bytes) -> list[Request]:
        """The requests completed by ``data`` (none once the stream could not be followed)."""
        if self.broken:
            return []
        self._buf += data
        out = []
        while self._buf:
            got = self._one()
            if got is None:
                break
            out.append(got)
        return out

    def _one(self) -> Request | None:
        buf = self._buf
        cmd = buf[0]
        if cmd >= len(COMMANDS):
            self.broken = True
            self._buf.clear()
            return None
        op, shape = COMMANDS[cmd]
        pos, keys = 1, []

        def take(n: int) -> bytes | None:
            nonlocal pos
            if len(buf) < pos + n:
                return None
            chunk = bytes(buf[pos : pos + n])
            pos += n
            return chunk

        def string() -> bytes | None:
            head = take(8)
            if head is None:
                return None
            return take(struct.unpack("<Q", head)[0])

        for part in shape:
            if part in "48":
                if take(int(part)) is None:
                    return None
            elif part in "kp":
                s = string()
                if s is None:
                    return None
                if part == "k":
                    keys.append(s.decode(errors="replace"))
            else:  # K, M: a count, then keys (and payloads)
                head = take(8)
                if head is None:
                    return None
                for _ in range(struct.unpack("<Q", head)[0]):
                    s = string()
                    if s is None:
                        return None
                    keys.append(s.decode(errors="replace"))
                    if part == "M" and string() is None:
                        return None
        del buf[:pos]
        return Request(op, tuple(keys), pos)


class HTTPReader:
    """Reads HTTP/1.1 requests (etcd's v2 API) off a client's byte stream."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.broken = False

    def feed(self, data: bytes) -> list[Request]:
        """The requests completed by ``data``."""
        if self.broken:
            return []
        self._buf += data
        out = []
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            total = end + 4 + length
            if len(self._buf) < total:
                break
            parts = head[0].split()
            if len(parts) < 2:
                self.broken = True
                self._buf.clear()
                break
            path = parts[1].split("?", 1)[0]
            out.append(Request(parts[0].lower(), (path,), total))
            del self._buf[:total]
        return out


@dataclass
class Conn:
    """One client connection through the proxy and what went over it."""

    sent: int = 0  # client -> store
    received: int = 0  # store -> client
    requests: dict[str, dict[str, int]] = field(default_factory=dict)  # owner -> op -> count
    unparsed: bool = False

    def owner(self) -> str:
        """Whose connection this is: the owner of most of its keyed requests."""
        counts = {who: sum(ops.values()) for who, ops in self.requests.items() if who != UNKNOWN}
        return max(counts, key=lambda who: counts[who]) if counts else UNKNOWN


@dataclass
class Totals:
    """What one owner sent through the proxy, summed over its connections."""

    requests: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    received: int = 0
    connections: int = 0

    @property
    def bytes(self) -> int:
        """Both ways."""
        return self.sent + self.received


class Proxy:
    """Forward ``listen`` to ``target`` on loopback, reading every client's requests.

    Args:
        target: the store's port on 127.0.0.1.
        reader: a new stream reader for each connection (:class:`TCPStoreReader`,
            :class:`HTTPReader`).
        port: the port to listen on (0: any; :attr:`port` says which).
    """

    def __init__(
        self, target: int, reader: Callable[[], TCPStoreReader | HTTPReader], port: int = 0
    ):
        self.target = target
        self._reader = reader
        self._listener = socket.create_server(("127.0.0.1", port), backlog=256)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self.conns: list[Conn] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storeproxy", daemon=True)

    def start(self) -> Proxy:
        """Start serving (one daemon thread)."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop, closing every connection."""
        self._stop.set()
        self._thread.join(5)
        for key in list(self._sel.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()

    def totals(self) -> dict[str, Totals]:
        """Per owner, what its connections carried so far."""
        out: dict[str, Totals] = {}
        with self._lock:
            for c in self.conns:
                t = out.setdefault(c.owner(), Totals())
                t.connections += 1
                t.sent += c.sent
                t.received += c.received
                for ops in c.requests.values():
                    for op, n in ops.items():
                        t.by_op[op] = t.by_op.get(op, 0) + n
                        t.requests += n
        return out

    @property
    def unparsed(self) -> int:
        """Connections whose stream could not be read (counted in bytes only)."""
        with self._lock:
            return sum(c.unparsed for c in self.conns)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _mask in self._sel.select(0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._pump(*key.data)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            client.close()
            return
        conn = Conn()
        with self._lock:
            self.conns.append(conn)
        reader = self._reader()
        for s in (client, upstream):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sel.register(client, selectors.EVENT_READ, (client, upstream, conn, reader, True))
        self._sel.register(upstream, selectors.EVENT_READ, (upstream, client, conn, None, False))

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        conn: Conn,
        reader: TCPStoreReader | HTTPReader | None,
        from_client: bool,
    ) -> None:
        try:
            data = src.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(src, dst)
            return
        try:
            dst.setblocking(True)  # small messages: a blocking send never waits long here
            dst.sendall(data)
            dst.setblocking(False)
        except OSError:
            self._drop(src, dst)
            return
        with self._lock:
            if from_client:
                conn.sent += len(data)
                if reader is not None:
                    for req in reader.feed(data):
                        who = owner_of(req.keys[0]) if req.keys else UNKNOWN
                        ops = conn.requests.setdefault(who, {})
                        ops[req.op] = ops.get(req.op, 0) + 1
                    conn.unparsed = reader.broken
            else:
                conn.received += len(data)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(s)
            with contextlib.suppress(OSError):
                s.close()
