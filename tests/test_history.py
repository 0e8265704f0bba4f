"""The reducers grow the snapshot's lists of events without copying them (issue 32: ``report``
and ``status`` were quadratic in notices), and :class:`History` keeps every snapshot immutable.

No timing: what one more event costs is counted in bytes allocated (``tracemalloc``), on a
snapshot that holds a few events and on one that holds many; a reducer that copies its list
allocates in proportion to it. The measured times are in ``bench/notices.py``.
"""

from __future__ import annotations

import pickle
import threading
import tracemalloc
from collections.abc import Callable

import pytest

from tui_launch.core.model import events as ev
from tui_launch.core.model.history import History
from tui_launch.core.model.snapshot import Snapshot
from tui_launch.core.model.store import reduce, replay
from tui_launch.testing import builders


def _failed(k: int) -> ev.AttemptFailed:
    return ev.AttemptFailed(attempt=0, failures=(builders.failure(0, 1, pid=100 + k, at=k),))


def _control(k: int) -> ev.ControlAction:
    return ev.ControlAction(
        action="dump",
        local_rank=None,
        global_rank=None,
        pid=None,
        signal=None,
        source="key",
        ok=True,
        detail=str(k),
    )


def _dump(k: int) -> ev.StacksDumped:
    return ev.StacksDumped(
        reason="manual", attempt=0, ranks=(0,), verdict="alike", odd_ranks=(), path=f"/x/{k}"
    )


def _decision(k: int) -> ev.PolicyDecision:
    return ev.PolicyDecision(
        attempt=k, action="restart", rule="default", reason="budget", failure_class="crash"
    )


def _node_change(k: int) -> ev.NodeChange:
    return ev.NodeChange(attempt=k, joined=(f"h{k}",), left=(), group_world_size=2)


# (field, one event of its kind); each kind's list grows by one per event.
GROWERS: list[tuple[str, Callable[[int], ev.Event]]] = [
    ("notices", lambda k: ev.Notice("warning", f"n{k}")),
    ("failures", _failed),
    ("node_changes", _node_change),
    ("decisions", _decision),
    ("controls", _control),
    ("dumps", _dump),
]


def _allocated(s: Snapshot, e: ev.Event) -> int:
    """Bytes allocated (peak) while ``e`` is folded into ``s``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        reduce(s, e)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("field", "make"), GROWERS, ids=[g[0] for g in GROWERS])
def test_one_more_event_does_not_copy_the_list(field: str, make: Callable[[int], ev.Event]) -> None:
    few = replay([builders.run_started(2), *(make(k) for k in range(3))])
    many = replay([builders.run_started(2), *(make(k) for k in range(20_000))])
    assert len(getattr(many, field)) > len(getattr(few, field))
    e = make(99_999)
    # Warmed on a snapshot of its own (first-call allocations out): folding onto ``few`` or
    # ``many`` twice would make the second a branch, which copies by design.
    reduce(replay([builders.run_started(2), make(0)]), e)
    small, big = _allocated(few, e), _allocated(many, e)
    # A copy of the many snapshot's list is 8 bytes an item: the margin is 40 items' worth
    # (the capped lists, controls and dumps, copied 100-200 items per event before).
    assert big - small < 320, (field, small, big)


def test_every_snapshot_keeps_what_it_saw() -> None:
    s0 = Snapshot()
    s1 = reduce(s0, ev.Notice("info", "a"))
    s2 = reduce(s1, ev.Notice("info", "b"))
    s3 = reduce(s2, ev.Notice("info", "c"))
    assert [n.message for n in s1.notices] == ["a"] and len(s0.notices) == 0
    assert [n.message for n in s3.notices] == ["a", "b", "c"]
    # Folding on from an older snapshot (a replay's jump back) branches: neither line changes.
    b = reduce(s1, ev.Notice("info", "x"))
    assert [n.message for n in b.notices] == ["a", "x"]
    assert [n.message for n in s3.notices] == ["a", "b", "c"]
    assert [n.message for n in s2.notices] == ["a", "b"]
    b2 = reduce(b, ev.Notice("info", "y"))
    assert [n.message for n in b2.notices] == ["a", "x", "y"] and len(b.notices) == 2
    # Readers see a sequence that equals the tuple of its items; a slice is a tuple.
    assert s3.notices == tuple(s3.notices) and s3.notices[-1:] == (s3.notices[2],)
    assert s2.notices != s3.notices and s2.notices == s3.notices[:2]
    assert Snapshot().notices == () and next(reversed(s3.notices)).message == "c"
    with pytest.raises(IndexError):
        s1.notices[1]


def test_a_capped_history_shows_the_newest() -> None:
    h: History[int] = History()
    views = []
    for k in range(5000):
        h = h.appended(k, keep=100)
        views.append(h)
    assert tuple(h) == tuple(range(4900, 5000)) and len(h) == 100
    assert tuple(views[150]) == tuple(range(51, 151))  # an older view, after compactions
    assert tuple(views[10]) == tuple(range(11))


def test_history_pickles_as_its_items() -> None:
    h = History([1, 2]).appended(3)
    back = pickle.loads(pickle.dumps(h))
    assert back == (1, 2, 3) and back == h


def test_threads_folding_from_one_snapshot_do_not_mix() -> None:
    # Two replays that fold from the same snapshot, at once: each sees only its own events.
    start = reduce(Snapshot(), ev.Notice("info", "start"))
    out: dict[str, Snapshot] = {}

    def fold(name: str) -> None:
        s = start
        for k in range(2000):
            s = reduce(s, ev.Notice("info", f"{name}{k}"))
        out[name] = s

    threads = [threading.Thread(target=fold, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for name in ("a", "b"):
        msgs = [n.message for n in out[name].notices]
        assert msgs == ["start", *(f"{name}{k}" for k in range(2000))]
