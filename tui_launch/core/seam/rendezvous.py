"""Reading a rendezvous handler's state without touching the network; who hosts the c10d store.

``DynamicRendezvousHandler`` (c10d, etcd-v2) caches the last synced state in
``_state_holder._state``; reading it is free. ``num_nodes_waiting()`` and ``is_closed()`` sync
with the backend under the agent's lock, so front ends must never call them.

Part of the torch seam (see :mod:`~tui_launch.core.seam.agent`): every private attribute of a
rendezvous handler that tuilaunch reads is read here, and listed in ``PRIVATE_NAMES``.

:func:`local_store_host` widens torch's guess of whether this node hosts the c10d store (see
there).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from tui_launch.core.model.errors import one_line_error
from tui_launch.core.model.events import (
    Connecting,
    Event,
    Notice,
    Participant,
    RendezvousSample,
)
from tui_launch.core.periodic import Periodic
from tui_launch.core.seam.names import TorchName

_DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_C10D = "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"
_ETCD_BACKEND = "torch.distributed.elastic.rendezvous.etcd_rendezvous_backend"
_ETCD = "torch.distributed.elastic.rendezvous.etcd_rendezvous"

PRIVATE_NAMES: tuple[TorchName, ...] = (
    TorchName(_DYNAMIC, "DynamicRendezvousHandler", "_state_holder", "instance"),
    TorchName(_DYNAMIC, "DynamicRendezvousHandler", "_settings", "instance"),
    TorchName(_DYNAMIC, "DynamicRendezvousHandler", "_this_node", "instance"),
    TorchName(_DYNAMIC, "DynamicRendezvousHandler", "_store", "instance"),
    TorchName(_DYNAMIC, "_BackendRendezvousStateHolder", "_state", "instance"),
    TorchName(_DYNAMIC, "_BackendRendezvousStateHolder", "_backend", "instance"),
    # The cached state's fields (a private class, public field names).
    *(
        TorchName(_DYNAMIC, "_RendezvousState", field, "instance")
        for field in ("round", "complete", "deadline", "closed", "participants", "wait_list")
    ),
    TorchName(_DYNAMIC, "_RendezvousState", "last_heartbeats", "instance"),
    TorchName(_C10D, "C10dRendezvousBackend", "_store", "instance"),
    TorchName(_C10D, None, "_matches_machine_hostname"),
    TorchName(_ETCD_BACKEND, "EtcdRendezvousBackend", "_client", "instance"),
    TorchName(_ETCD, "EtcdRendezvousHandler", "_rdzv_impl", "instance"),
)


def call(handler: Any, name: str) -> Any:
    """``handler.<name>()``, or None if it raises (or is not there)."""
    try:
        return getattr(handler, name)()
    except Exception:
        return None


def safe(fn: Callable[[], Any], default: Any) -> str:
    """``str(fn())``, or ``str(default)`` if it raises."""
    try:
        return str(fn())
    except Exception:
        return str(default)


def backend_name(handler: Any, args: argparse.Namespace) -> str:
    """The handler's backend (``c10d``, ``etcd-v2``, ``static``...), else ``--rdzv-backend``."""
    return safe(handler.get_backend, args.rdzv_backend)


def run_id(handler: Any, args: argparse.Namespace) -> str:
    """The handler's run id, else ``--rdzv-id``."""
    return safe(handler.get_run_id, args.rdzv_id)


def this_node(handler: Any) -> Any:
    """The handler's own ``_NodeDesc`` (None for handlers without one)."""
    return getattr(handler, "_this_node", None)


def _tcp_stores(handler: Any) -> list[Any]:
    # The handler's own store (c10d, static) and the c10d backend's; a PrefixStore wraps the
    # TCPStore, whose host and port are what a client needs.
    holder = getattr(handler, "_state_holder", None)
    out = []
    for store in (
        getattr(handler, "_store", None),
        getattr(getattr(holder, "_backend", None), "_store", None),
    ):
        out.append(getattr(store, "underlying_store", store))
    return out


def endpoint(handler: Any, args: argparse.Namespace) -> str:
    """The rendezvous endpoint as it really is (``--standalone`` asks for ``localhost:0``; the
    real port is the store's)."""
    ep = str(getattr(args, "rdzv_endpoint", "") or "")
    if args.rdzv_backend == "static" and not ep:
        ep = f"{args.master_addr}:{args.master_port}"
    port = None
    for store in _tcp_stores(handler):
        port = port or getattr(store, "port", None)
    if ep.endswith(":0") and port:
        ep = f"{ep[:-2]}:{port}"
    return ep


def store_address(handler: Any) -> tuple[str, int] | None:
    """Host and port of the c10d handler's own ``TCPStore`` (None if it has none)."""
    store = _tcp_stores(handler)[0]
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if not host or not port:
        return None
    return str(host), int(port)


def etcd_client(handler: Any) -> Any:
    """The python-etcd client of an ``etcd`` (v1) or ``etcd-v2`` handler, or None."""
    client = getattr(getattr(handler, "_rdzv_impl", None), "client", None)
    if client is None:
        backend_obj = getattr(getattr(handler, "_state_holder", None), "_backend", None)
        client = getattr(backend_obj, "_client", None)
    return client


def heartbeat_window(handler: Any) -> timedelta | None:
    """How long a node's heartbeat may be missing before torch drops it (None: unknown)."""
    settings = getattr(handler, "_settings", None)
    interval = getattr(settings, "keep_alive_interval", None)
    attempts = getattr(settings, "keep_alive_max_attempt", None)
    if interval is None or not attempts:
        return None
    window: timedelta = interval * attempts
    return window


def node_name(node: Any) -> str:
    """A rendezvous node as ``addr:pid`` (torch's ``_NodeDesc``)."""
    addr = getattr(node, "addr", None)
    return f"{addr}:{getattr(node, 'pid', '')}" if addr else str(node)


def cached_state(handler: Any) -> Any:
    """The handler's cached ``_RendezvousState``, or None (static or unknown handlers)."""
    holder = getattr(handler, "_state_holder", None)
    return getattr(holder, "_state", None) if holder is not None else None


def sample(handler: Any, now: datetime | None = None) -> RendezvousSample | None:
    """A :class:`RendezvousSample` of the handler's cached state, or None if it has none."""
    state = cached_state(handler)
    if state is None:
        return None
    now = now or datetime.now(timezone.utc)
    this = this_node(handler)
    beats = dict(getattr(state, "last_heartbeats", {}) or {})
    parts = []
    for node, rank in sorted(
        (getattr(state, "participants", {}) or {}).items(), key=lambda kv: kv[1]
    ):
        hb = beats.get(node)
        age = None
        if hb is not None:
            try:
                # Heartbeats come every few seconds: 5 s steps keep samples from changing
                # (and front ends from redrawing) every second.
                age = 5 * int(max(0.0, (now - _aware(hb)).total_seconds()) // 5)
            except TypeError:
                age = None
        parts.append(
            Participant(
                node=node_name(node), rank=int(rank), heartbeat_age=age, this_node=node == this
            )
        )
    settings = getattr(handler, "_settings", None)
    timeout = getattr(settings, "timeout", None)
    join = getattr(timeout, "join", None)
    return RendezvousSample(
        round=getattr(state, "round", None),
        complete=getattr(state, "complete", None),
        closed=getattr(state, "closed", None),
        min_nodes=getattr(settings, "min_nodes", None),
        max_nodes=getattr(settings, "max_nodes", None),
        join_timeout=join.total_seconds() if join is not None else None,
        participants=tuple(parts),
        waiting=tuple(sorted(node_name(n) for n in getattr(state, "wait_list", ()) or ())),
        deadline=_wall(getattr(state, "deadline", None)),
    )


class Sampler:
    """Posts a :class:`RendezvousSample` every ``interval`` seconds while the cached state
    changes (cached state only, never the network), for the front ends' live panel.

    Args:
        post: the run store's ``post``.
        handler: returns the current rendezvous handler (None: no agent yet).
    """

    def __init__(
        self, post: Callable[[Event], object], handler: Callable[[], Any], interval: float = 1.0
    ) -> None:
        self._post = post
        self._handler = handler
        self._last: RendezvousSample | None = None
        self._told_spare = False
        self._loop = Periodic("tuilaunch-sampler", interval, self.tick, first_delay=interval)

    def start(self) -> None:
        """Start sampling (the first sample comes one interval later)."""
        self._loop.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._loop.stop()

    def tick(self) -> None:
        """Post a sample if the handler's cached state differs from the last one posted."""
        try:
            handler = self._handler()
            s = sample(handler) if handler is not None else None
        except Exception:
            return
        # Timestamps aside: an unchanged state is not posted again.
        flat = replace(s, mono=0, wall=0) if s is not None else None
        if s is not None and flat != self._last:
            self._last = flat
            self._post(s)
            if not self._told_spare and _not_in_complete_round(s):
                me = node_name(this_node(handler))
                if me not in s.waiting:  # waiting: torch restarts the round to let it in
                    self._told_spare = True
                    self._post(Notice(level="warn", message=spare_notice(s)))


def spare_notice(live: RendezvousSample) -> str:
    """Said once while this node sits outside a complete round that has no room for it: torch
    parks it silently (its "redundancy list") until that round ends, which for a second launch
    with the same --rdzv-id means until the first run ends."""
    cap = f" of {live.max_nodes}" if live.max_nodes else ""
    return (
        f"rendezvous: the round is already complete with {len(live.participants)}{cap} "
        f"node(s), none of them this one; this node waits as a spare until that round ends "
        f"(another launch with the same --rdzv-id?)"
    )


def _wall(t: Any) -> float | None:
    if not isinstance(t, datetime):
        return None
    return _aware(t).timestamp()


def dead_participants(handler: Any, now: datetime | None = None) -> list[str]:
    """Participants of the cached round whose heartbeats have expired (never the network).

    torch only notices a dead node when another node next syncs the state; it then drops it
    from the participants, but the agents of a complete round go on waiting on their workers.
    The keep-alive thread refreshes the cached heartbeats every ``keep_alive_interval``.
    """
    state = cached_state(handler)
    limit = heartbeat_window(handler)
    if state is None or limit is None:
        return []
    now = now or datetime.now(timezone.utc)
    out = []
    beats = dict(getattr(state, "last_heartbeats", {}) or {})
    for node in getattr(state, "participants", {}) or {}:
        hb = beats.get(node)
        try:
            if hb is not None and now - _aware(hb) > limit:
                out.append(node_name(node))
        except TypeError:
            continue
    return out


def _aware(t: datetime) -> datetime:
    # torch stores naive UTC datetimes from datetime.utcnow().
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


# ----------------------------------------------------------------------------- store host


def _nonlocal_bind_allowed(family: int) -> bool:
    # With this sysctl on, binding any address succeeds: a bind test proves nothing.
    path = (
        "/proc/sys/net/ipv4/ip_nonlocal_bind"
        if family == socket.AF_INET
        else "/proc/sys/net/ipv6/ip_nonlocal_bind"
    )
    try:
        with open(path) as fp:
            return fp.read().strip() not in ("", "0")
    except OSError:
        return False


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an IP address literal held by an interface of this network namespace.

    Binding ``(host, 0)`` says so without sending anything: the kernel refuses an address that
    is not ours (EADDRNOTAVAIL). Hostnames, the wildcard and multicast addresses answer False;
    so does every address where ``ip_nonlocal_bind`` would make the test meaningless.
    """
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if addr.is_unspecified or addr.is_multicast:
        return False
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    if _nonlocal_bind_allowed(family):
        return False
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((str(addr), 0))
    except OSError:  # EADDRNOTAVAIL: not ours; anything else: no evidence that it is
        return False
    return True


@contextlib.contextmanager
def local_store_host(decided: Callable[[str], None] | None = None) -> Iterator[None]:
    """Let a node host the c10d store when the endpoint is an IP address of its own.

    Without ``is_host`` in ``--rdzv-conf``, torch's c10d backend hosts the store on the node
    whose hostname (or the addresses that hostname resolves to) matches the endpoint
    (``utils._matches_machine_hostname``). An address on a second interface, or in a network
    namespace of its own (which keeps the machine's hostname), matches no node: none hosts, all
    wait for a store that never comes. This adds one case to torch's guess: an IP literal that
    an interface of this network namespace holds. Every case torch already said yes to is kept,
    hostnames are left to torch, and torch's own fallback stays (a node that guessed "host"
    but finds the port taken becomes a client). ``decided(host)`` is called when the addition
    made the difference. Torch without the function is left alone.
    """
    try:
        from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
    except ImportError:
        yield
        return
    original = getattr(backend, "_matches_machine_hostname", None)
    if original is None:
        yield
        return

    def matches(host: str) -> bool:
        if original(host):
            return True
        if is_local_address(host):
            if decided is not None:
                decided(host)
            return True
        return False

    backend._matches_machine_hostname = matches
    try:
        yield
    finally:
        backend._matches_machine_hostname = original


# ----------------------------------------------------------------------------- store errors

_ETCD_BACKENDS = ("etcd", "etcd-v2")


def store_error(
    e: BaseException, connecting: Connecting | None, live: RendezvousSample | None
) -> str | None:
    """The run's one line when its rendezvous went wrong after the launcher had reached it.

    What the launcher saw decides: ``live`` (the last sample of the handler's cached state) is
    only there once the store or etcd answered a sync. Three cases, None for any other (the
    caller's "nothing answered there" is then right):

    - the round was complete without this node (another launch with the same ``--rdzv-id``
      holds it; torch parks this node as a spare until that run ends, then fails with its
      store gone, a closed rendezvous, or an AttributeError of its own);
    - a connection error after an answer: the store host (c10d) or the etcd server was lost;
    - a connection error to an etcd server that never answered (not a node's store: no
      ``is_host`` can help).
    """
    name = type(e).__name__
    connection = name == "RendezvousConnectionError"
    backend = connecting.backend if connecting is not None else ""
    ep = connecting.endpoint if connecting is not None else "its endpoint"
    if live is not None and _not_in_complete_round(live) and (connection or _parked_exit(e)):
        nodes = len(live.participants)
        cap = f" of {live.max_nodes}" if live.max_nodes else ""
        return (
            f"the rendezvous at {ep} ({backend}) was already complete with {nodes}{cap} "
            f"node(s), none of them this one: another launch with the same --rdzv-id is "
            f"running there, and this node waited as a spare until "
            f"{'its store went away' if connection else 'that run closed the rendezvous'}. "
            f"Give this launch its own --rdzv-id (or --rdzv-endpoint). ({one_line_error(e)})"
        )
    if not connection:
        return None
    if live is not None:
        until = time.strftime("%H:%M:%S", time.localtime(live.wall))
        if backend in _ETCD_BACKENDS:
            return (
                f"the etcd server at {ep} stopped answering (it answered until at least "
                f"{until}): the rendezvous cannot go on without it; check that etcd is "
                f"running and reachable. ({one_line_error(e)})"
            )
        return (
            f"lost the rendezvous store at {ep} (it answered until at least {until}): the "
            f"node hosting it (the launcher on that host) died, was stopped or became "
            f"unreachable, and the job cannot go on without it. ({one_line_error(e)})"
        )
    if backend in _ETCD_BACKENDS:
        return (
            f"could not reach the etcd server at {ep}: nothing answered there. Start etcd "
            f"(with --enable-v2), or check --rdzv-endpoint. ({one_line_error(e)})"
        )
    return None


def store_gone(connecting: Connecting | None, live: RendezvousSample | None) -> str | None:
    """For workers that failed of a peer's loss: "lost the rendezvous store at EP (it answered
    until at least T)" when the c10d store that answered before now refuses a connection (its
    host node died with the peer), else None.

    A node hosting the store takes its ranks with it: the other node's ranks often fail of the
    broken collective before its agent notices the store is gone, and the run then ends as a
    worker failure. One connect says which of the two stories it is.
    """
    if connecting is None or live is None or connecting.backend in _ETCD_BACKENDS:
        return None
    host, _, port = connecting.endpoint.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return None  # it answers: the store is not what went away
    except OSError:
        pass
    until = time.strftime("%H:%M:%S", time.localtime(live.wall))
    return (
        f"lost the rendezvous store at {connecting.endpoint} (it answered until at least "
        f"{until}): the node hosting it died, was stopped or became unreachable"
    )


def _not_in_complete_round(live: RendezvousSample) -> bool:
    return bool(live.complete and live.participants) and not any(
        p.this_node for p in live.participants
    )


def _parked_exit(e: BaseException) -> bool:
    # torch ends a spare whose rendezvous closed with RendezvousGracefulExitError, which its
    # agent swallows and returns None for, and its launcher then fails on None.is_failed().
    name = type(e).__name__
    return name in ("RendezvousClosedError", "RendezvousGracefulExitError") or (
        isinstance(e, AttributeError) and "is_failed" in str(e)
    )
