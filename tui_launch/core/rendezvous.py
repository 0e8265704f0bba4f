"""Reading a rendezvous handler's state without touching the network.

``DynamicRendezvousHandler`` (c10d, etcd-v2) caches the last synced state in
``_state_holder._state``; reading it is free. ``num_nodes_waiting()`` and ``is_closed()`` sync
with the backend under the agent's lock, so front ends must never call them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tui_launch.core.events import Participant, RendezvousSample


def _node_name(node: Any) -> str:
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
    this = getattr(handler, "_this_node", None)
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
                node=_node_name(node), rank=int(rank), heartbeat_age=age, this_node=node == this
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
        waiting=tuple(sorted(_node_name(n) for n in getattr(state, "wait_list", ()) or ())),
    )


def _aware(t: datetime) -> datetime:
    # torch stores naive UTC datetimes from datetime.utcnow().
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
