"""Reading a rendezvous handler's state without touching the network.

``DynamicRendezvousHandler`` (c10d, etcd-v2) caches the last synced state in
``_state_holder._state``; reading it is free. ``num_nodes_waiting()`` and ``is_closed()`` sync
with the backend under the agent's lock, so front ends must never call them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tui_launch.core.events import Participant, RendezvousSample


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
    settings = getattr(handler, "_settings", None)
    interval = getattr(settings, "keep_alive_interval", None)
    attempts = getattr(settings, "keep_alive_max_attempt", None)
    if state is None or interval is None or not attempts:
        return []
    now = now or datetime.now(timezone.utc)
    limit = interval * attempts
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
