"""Who is in the job: rendezvous rounds, lost nodes, and the cluster view.

:class:`Membership` remembers the round this node joined and its members, posts a
``NodeChange`` when the next round differs, and tells a lost node (a membership change, which
restarts without spending the failure budget) from a failure. A node's death shows first as a
broken collective on every other node, long before torch notices its missing heartbeats;
:meth:`Membership.node_lost` reads the handler's cached state (never the network) and
believes an absence only when it lasts (:data:`ABSENCE_CONFIRM_SECONDS`);
:meth:`Membership.wait_node_loss` waits up to one heartbeat window for the answer. It also
starts this node's :class:`~tui_launch.core.job.view.ClusterView`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tui_launch.core.diagnosis.dumps import Dumper
from tui_launch.core.job.jobstacks import JobDumps
from tui_launch.core.job.view import ClusterView, interval_from_env
from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.model import errors
from tui_launch.core.model.events import Event, Failure, NodeChange, Notice, RendezvousSample
from tui_launch.core.model.store import Snapshot
from tui_launch.core.seam import agent, rendezvous

SINGLE_NODE_CLUSTER_INTERVAL = 10.0  # s between cluster-view records when the job has one node
# How long a member must stay missing from a complete round, with nobody waiting, before it
# counts as lost: a node that re-rendezvous after its own rank failed leaves the participants
# and joins the wait list in two store writes, which a loaded machine can space out by far
# more than one monitor tick (torch syncs the state every tick, so two ticks were not enough).
# A node that is really gone was already missing a heartbeat window: this adds little.
ABSENCE_CONFIRM_SECONDS = 3.0


def failed_here(failures: Iterable[Failure]) -> bool:
    """Whether some rank failed by itself: not terminated by torch (collateral), and not
    killed by a peer's broken collective (a socket error from a rank on another node)."""
    return any(
        not f.collateral
        and f.exit_code != 0
        and not errors.peer_failure(f.message, f.traceback, *f.stderr_tail)
        for f in failures
    )


class Membership:
    """This node's view of the job's rounds and members.

    Args:
        post: the run store's ``post``.
        snapshot: the run store's ``snapshot`` (for the cluster view's records).
        host: this node's host name.
        torchrun: torchrun's arguments (``--nnodes``, the rendezvous flags).
        dumper: this node's stack dumper; with more than one node, its dumps for a person or
            a hang are asked of every node through the cluster view's store (:mod:`.jobstacks`).
    """

    def __init__(
        self,
        post: Callable[[Event], object],
        snapshot: Callable[[], Snapshot],
        host: str,
        torchrun: TorchrunArgs,
        dumper: Dumper | None = None,
    ) -> None:
        self._post = post
        self._dumper = dumper
        self.jobs: JobDumps | None = None  # job-wide stack dumps (jobs of more than one node)
        self._snapshot = snapshot
        self._host = host
        self._torchrun = torchrun
        # The round and group size this node joined, and who was in it.
        self.round: int | None = None
        self.group_world = 1
        self.members: tuple[str, ...] = ()
        # Members missing from this complete round at the last look, and since when (node_lost).
        self._absent: tuple[str, ...] = ()
        self._absent_since = 0.0
        self.cluster: ClusterView | None = None  # once the first rendezvous is done

    @property
    def host(self) -> str:
        """This node's host name (what its failures and ``RunStarted`` name)."""
        return self._host

    def note(self, group_world_size: int, live: RendezvousSample | None, next_attempt: int) -> None:
        """Remember this round; post which nodes joined or left since the previous one.

        ``next_attempt``: the attempt this round starts (0: the first, nothing to compare).
        """
        members = tuple(sorted(p.node for p in live.participants)) if live else ()
        before, before_world = self.members, self.group_world
        self.round = live.round if live else None
        self.members, self.group_world = members, group_world_size
        self._absent = ()
        if next_attempt <= 0:
            return
        joined = tuple(m for m in members if m not in before)
        left = tuple(m for m in before if m not in members)
        if joined or left or group_world_size != before_world:
            self._post(
                NodeChange(
                    attempt=next_attempt,
                    joined=joined,
                    left=left,
                    group_world_size=group_world_size,
                )
            )

    def node_lost(self, handler: Any, now: float | None = None) -> list[str]:
        """Nodes of this round that are gone: dropped by torch or with expired heartbeats.

        ``now``: the monotonic time of this look (default: the clock's).
        """
        if self.group_world <= 1:
            return []
        state = rendezvous.cached_state(handler)
        if state is None or getattr(state, "round", None) != self.round:
            return []  # a newer round: torch's own waiting-node check restarts us
        dead = rendezvous.dead_participants(handler)
        if dead:
            return dead
        present = {rendezvous.node_name(n) for n in getattr(state, "participants", {}) or {}}
        waiting = getattr(state, "wait_list", None)
        if getattr(state, "complete", False) and len(present) < self.group_world and not waiting:
            # Dropped by torch (another node's sync removed its expired heartbeat) - or a node
            # that left on purpose to re-rendezvous after its own rank failed: torch removes it
            # from the participants, then adds it to the wait list, in two writes. Believe an
            # absence only when later looks still see it, ABSENCE_CONFIRM_SECONDS on.
            gone = tuple(m for m in self.members if m not in present) or ("?",)
            now = time.monotonic() if now is None else now
            if self._absent != gone:
                self._absent, self._absent_since = gone, now
            return list(gone) if now - self._absent_since >= ABSENCE_CONFIRM_SECONDS else []
        self._absent = ()
        return []

    def wait_node_loss(
        self, handler: Any, stopping: Callable[[], bool], poll: float = 0.25
    ) -> list[str]:
        """After a failure in an elastic multi-node group: was it a node that went away?

        Waiting for one heartbeat window (syncing the state on the agent thread, as torch's
        own loop does) tells a lost node, which is a membership change, from a failure, which
        spends the budget. A node that joins the wait list in the meantime is alive and
        restarting: that was a real failure. Only nodes whose ranks died of broken collectives
        wait here; the node where a rank failed by itself skips it (see :func:`failed_here`).
        """
        window = rendezvous.heartbeat_window(handler)
        if window is None:
            return []
        # torch drops the dead node at the first sync past its heartbeat's expiry, and the
        # absence is then believed ABSENCE_CONFIRM_SECONDS later: both fit before the deadline
        # (the window alone, plus 2 s, lost that race under load and spent the budget).
        deadline = time.monotonic() + window.total_seconds() + ABSENCE_CONFIRM_SECONDS + 2.0
        while time.monotonic() < deadline and not stopping():
            try:
                waiting = handler.num_nodes_waiting()  # syncs: torch drops expired nodes
            except Exception:
                return []
            lost = self.node_lost(handler)
            if lost:
                return lost
            if waiting:
                return []
            time.sleep(poll)
        return []

    def restart(self, agent_obj: agent.TorchAgent, wg: agent.WorkerGroup, lost: list[str]) -> None:
        """A membership restart: like a manual one, torch spends a restart that is given back
        first; the notice says which nodes were lost."""
        agent.give_back_restart(agent_obj, wg)
        self._post(
            Notice(
                level="warning",
                message=f"node lost: {', '.join(lost)} (heartbeat expired); restarting with "
                "the remaining nodes, no failure budget spent",
            )
        )

    def start_cluster_view(self, handler: Any) -> None:
        """Start publishing this node's status (or point the running view at a new round)."""
        if self.cluster is not None:
            self.cluster.set_handler(handler)
            return
        interval = interval_from_env()
        if interval <= 0:
            return
        many = self._torchrun.node_range[1] > 1
        if not many:
            # A job of one node: its Cluster tab repeats this node's own panels, so a store
            # round trip every few seconds buys nothing (and was a tenth of the steady CPU).
            interval = max(interval, SINGLE_NODE_CLUSTER_INTERVAL)
        args = self._torchrun.namespace
        self.cluster = ClusterView(
            post=self._post,
            snapshot=self._snapshot,
            host=self._host,
            handler=handler,
            endpoint=lambda h: rendezvous.endpoint(h, args),
            run_id=rendezvous.call(handler, "get_run_id") or (self._torchrun.rdzv_id or "none"),
            interval=interval,
        )
        if many and self._dumper is not None:
            self.jobs = JobDumps(
                self._post,
                self._dumper,
                self.cluster.node,
                self._host,
                self._snapshot,
                self.cluster.wake,
            )
            self.cluster.rider = self.jobs.tick
            self._dumper.listeners.append(self.jobs.on_taken)
        self.cluster.start()

    @property
    def cluster_interval(self) -> float | None:
        """Seconds between two cluster records (None: no cluster view)."""
        return self.cluster.interval if self.cluster is not None else None

    def stop(self) -> None:
        """Stop the cluster view after one last record (the run's outcome)."""
        if self.cluster is not None:
            self.cluster.stop()
