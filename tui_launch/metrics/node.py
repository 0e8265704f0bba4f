"""The ``node`` label of this agent's series: the host name, unless the host has several agents.

Every series carries ``node`` so that the job's series add up across nodes, and the textfile is
named after it. The host name is what the rest of a cluster's monitoring calls a machine (DCGM
exporter's ``Hostname``, node_exporter's host), so it is the label, and it never changes.

Several agents of one run may share a host (a test, a single-machine "multi-node" job, two
agents per large host): then the host name alone would merge their series and make them write
the same textfile. Such an agent's label is ``<host>/<group rank>``, the group rank of the first
rendezvous that showed the sharing: bounded (at most ``--nnodes`` values), and pinned for the
agent's life, so a later round that renumbers the nodes does not start new series. Pids, which
the cluster view uses to tell agents apart (``addr:pid``), are never a label.

Whether the host is shared comes from the snapshot (no I/O): the rendezvous's participants
(``addr:pid`` each, this agent marked) for the dynamic backends, or else the cluster view's
records (their ``host``) for ``static``. Until the first rendezvous completes the label is
provisionally the host name (the HTTP endpoint serves run-level series meanwhile); the textfile
waits for :attr:`NodeLabel.settled` before it picks its name.
"""

from __future__ import annotations

import socket
import threading

from tui_launch.core.job.view import interval_from_env
from tui_launch.core.model.store import Snapshot


def _addr(node: str) -> str:
    """The address part of the rendezvous's ``addr:pid`` node name."""
    return node.rsplit(":", 1)[0]


def shared_host(snap: Snapshot) -> bool | None:
    """Whether other agents of this run are on this agent's host; None while unknown.

    Known once the rendezvous completed and either a complete round's participants (marked
    with this agent) or the cluster view's records of every node in the group are at hand; also
    False when neither can ever come (no live rendezvous state and the cluster view is off).
    """
    rdzv = snap.rendezvous
    if rdzv is None or rdzv.group_rank is None:
        return None
    live = snap.rendezvous_live
    if live is not None and live.complete:
        me = next((p for p in live.participants if p.this_node), None)
        if me is not None:
            addr = _addr(me.node)
            return sum(_addr(p.node) == addr for p in live.participants) > 1
    cluster = snap.cluster
    if cluster is not None:
        mine = next((n for n in cluster.nodes if n.this_node), None)
        if mine is not None and len(cluster.nodes) >= (rdzv.group_world_size or 1):
            return sum(n.host == mine.host for n in cluster.nodes) > 1
    if live is None and interval_from_env() == 0:
        return False  # static rendezvous with the cluster view off: nothing will ever tell
    return None


class NodeLabel:
    """This agent's ``node`` label (see the module docstring); call it with each snapshot.

    Args:
        fixed: a label to use as is (a test, or a caller that knows better): always settled.
        host: the host name (default :func:`socket.gethostname`, as the run's ``RunStarted``).
    """

    def __init__(self, fixed: str | None = None, host: str | None = None) -> None:
        self.host = host or socket.gethostname()
        self._pinned = fixed
        self._lock = threading.Lock()

    @property
    def settled(self) -> bool:
        """True once the label can no longer change."""
        return self._pinned is not None

    def __call__(self, snap: Snapshot) -> str:
        """The label for this snapshot: pinned once known, the host name until then."""
        pinned = self._pinned
        if pinned is not None:
            return pinned
        host = snap.run.host if snap.run is not None and snap.run.host else self.host
        shared = shared_host(snap)
        if shared is None:
            return host
        rdzv = snap.rendezvous
        label = f"{host}/{rdzv.group_rank}" if shared and rdzv is not None else host
        with self._lock:
            if self._pinned is None:
                self._pinned = label
            return self._pinned


__all__ = ["NodeLabel", "shared_host"]
