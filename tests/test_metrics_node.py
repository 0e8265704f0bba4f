"""The ``node`` label (tui_launch/metrics/node.py): the host name, unless other agents of
the run share the host, then ``<host>/<group rank>``, pinned for the agent's life.

Snapshots are built from the events the runner posts (rendezvous views, live rendezvous samples,
cluster samples); the real two-agents-on-one-host case runs in tests/test_metrics_cli.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tui_launch.core.model import events as ev
from tui_launch.core.model.store import RendezvousView, Snapshot
from tui_launch.metrics.node import NodeLabel, shared_host

HOST = "gpu-07"


def _snap(
    group_rank: int | None,
    participants: tuple[str, ...] = (),
    me: str | None = None,
    complete: bool = True,
    cluster: tuple[tuple[str, str], ...] = (),
    world: int = 2,
) -> Snapshot:
    rdzv = RendezvousView(
        backend="c10d",
        endpoint="x:1",
        run_id="r",
        state="complete",
        since=0.0,
        group_rank=group_rank,
        group_world_size=world,
    )
    live = None
    if participants:
        live = ev.RendezvousSample(
            round=1,
            complete=complete,
            closed=False,
            min_nodes=1,
            max_nodes=2,
            join_timeout=60.0,
            participants=tuple(
                ev.Participant(node=p, rank=i, heartbeat_age=0.1, this_node=p == me)
                for i, p in enumerate(participants)
            ),
            waiting=(),
        )
    sample = None
    if cluster:
        sample = ev.ClusterSample(
            nodes=tuple(
                ev.NodeStatus(
                    node=node,
                    host=host,
                    pid=1,
                    state="running",
                    group_rank=i,
                    group_world_size=world,
                    local_world_size=1,
                    attempt=0,
                    ranks=(),
                    restarts=(0, 0, 0),
                    gpu=None,
                    error=None,
                    age=0.0,
                    this_node=node == me,
                )
                for i, (node, host) in enumerate(cluster)
            ),
            store="x:1",
        )
    return replace(Snapshot(), rendezvous=rdzv, rendezvous_live=live, cluster=sample)


def test_before_the_rendezvous_the_label_is_the_host_and_not_settled():
    label = NodeLabel(host=HOST)
    assert label(Snapshot()) == HOST
    assert label(_snap(None)) == HOST
    assert not label.settled


def test_one_agent_per_host_is_the_host_name_pinned():
    label = NodeLabel(host=HOST)
    snap = _snap(1, ("a.example:10", "b.example:10"), me="b.example:10")
    assert shared_host(snap) is False
    assert label(snap) == HOST and label.settled
    # A later round on which this host had two agents does not rename the series.
    later = _snap(0, ("b.example:10", "b.example:11"), me="b.example:10")
    assert label(later) == HOST


def test_two_agents_on_one_host_get_the_group_rank_of_the_first_round():
    a, b = NodeLabel(host=HOST), NodeLabel(host=HOST)
    parts = ("h.example:100", "h.example:200")
    assert a(_snap(0, parts, me=parts[0])) == f"{HOST}/0"
    assert b(_snap(1, parts, me=parts[1])) == f"{HOST}/1"
    # Renumbered by a later round: the labels stay (no new series).
    assert a(_snap(1, parts, me=parts[0])) == f"{HOST}/0"


def test_an_incomplete_round_does_not_decide():
    label = NodeLabel(host=HOST)
    snap = _snap(0, ("h:1",), me="h:1", complete=False)
    assert shared_host(snap) is None
    assert label(snap) == HOST and not label.settled


def test_static_rendezvous_uses_the_cluster_view_once_every_node_published():
    me = f"{HOST}:100"
    one = _snap(1, cluster=((me, HOST),))
    assert shared_host(one) is None  # one record of two nodes: wait for the other
    both = _snap(1, cluster=((f"{HOST}:50", HOST), (me, HOST)), me=me)
    assert shared_host(both) is True
    assert NodeLabel(host=HOST)(both) == f"{HOST}/1"
    apart = _snap(1, cluster=(("other:50", "other"), (me, HOST)), me=me)
    assert shared_host(apart) is False


def test_static_with_the_cluster_view_off_settles_on_the_host(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUILAUNCH_CLUSTER_INTERVAL", "0")
    label = NodeLabel(host=HOST)
    assert label(_snap(0)) == HOST and label.settled


def test_the_run_host_name_wins_over_the_local_guess_and_a_fixed_label_is_kept():
    snap = replace(
        _snap(0, ("h:1",), me="h:1"),
        run=ev.RunStarted(
            entrypoint="t.py",
            args=(),
            role="default",
            nproc_per_node=1,
            min_nodes=1,
            max_nodes=1,
            max_restarts=0,
            backend="c10d",
            endpoint="x:1",
            run_id="r",
            host="from-run",
            launcher_pid=1,
            torch_version="2",
        ),
    )
    assert NodeLabel(host=HOST)(snap) == "from-run"
    fixed = NodeLabel(fixed="mine", host=HOST)
    assert fixed.settled and fixed(snap) == "mine"
