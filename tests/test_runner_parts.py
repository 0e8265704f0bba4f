"""Unit tests for the runner's parts that need no torch process.

Failure collection (a pure function), node-loss detection against a fake rendezvous handler,
the cluster view against an in-memory store, injection scheduling, the rank table, and the
run's shared state and settings.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from tui_launch.core.job.view import ClusterView, prefix
from tui_launch.core.launch.args import parse
from tui_launch.core.launch.options import Options
from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.model import errors
from tui_launch.core.model.commands import Inject
from tui_launch.core.model.events import ControlAction, Event, Injected, NodeChange
from tui_launch.core.model.store import Phase, RunStore, Snapshot
from tui_launch.core.model.text import cluster_lines
from tui_launch.core.run import runner
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.control import Actions, Control, ShimDir
from tui_launch.core.run.failures import collect_failures, run_outcome
from tui_launch.core.run.faults import FaultExecutor
from tui_launch.core.run.inject import Fired, Injector, InjectSpec, parse_spec
from tui_launch.core.run.membership import ABSENCE_CONFIRM_SECONDS, Membership, failed_here
from tui_launch.core.run.state import RunState
from tui_launch.core.seam import rendezvous
from tui_launch.core.workers.table import RanksView, RankTable

# ----------------------------------------------------------------------------- failures


def _pf(local_rank: int, pid: int, exitcode: int, error_file: str = "") -> Any:
    return SimpleNamespace(local_rank=local_rank, pid=pid, exitcode=exitcode, error_file=error_file)


def _w(local_rank: int, global_rank: int) -> Any:
    return SimpleNamespace(local_rank=local_rank, global_rank=global_rank)


def test_failures_root_vs_collateral_and_the_stderr_message(tmp_path):
    err0 = tmp_path / "0.err"
    err0.write_text("[rank2]: Traceback (most recent call last):\n[rank2]: RuntimeError: boom\n\n")
    err1 = tmp_path / "1.err"
    err1.write_text("some output cut off by SIGTERM\n")
    ranks = RanksView(
        attempt=1,
        pids={0: 100, 1: 101},
        global_ranks={0: 2, 1: 3},
        exits={0: 1, 1: -15},
        exit_times={0: 1000.0, 1: 1001.0},
        by_agent=frozenset({1}),  # torch had begun terminating the group when rank 1 died
    )
    out = collect_failures(
        reported={2: _pf(0, 100, 1)},
        workers=[_w(0, 2), _w(1, 3)],
        ranks=ranks,
        error_files={},
        stderr_paths={0: str(err0), 1: str(err1)},
        host="h",
    )
    assert [(f.global_rank, f.collateral) for f in out] == [(2, False), (3, True)]
    root, peer = out
    assert root.message == "RuntimeError: boom"  # torch's "[rank2]: " prefix is gone
    assert root.stderr_tail[-2] == "[rank2]: RuntimeError: boom"  # the tail is kept as is
    assert (root.attempt, root.host, root.pid, root.time) == (1, "h", 100, 1000.0)
    # A signalled rank was cut off mid-stream: its last line is no message.
    assert peer.message == errors.describe_exit(-15)
    assert peer.signal == "SIGTERM" and peer.time == 1001.0
    assert not failed_here([peer]) and failed_here(out)


def test_failures_error_file_marks_and_unseen_exits(tmp_path):
    ef = tmp_path / "error.json"
    ef.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: bad",
                    "extraInfo": {"py_callstack": "TB", "timestamp": "7"},
                }
            }
        )
    )
    ranks = RanksView(
        attempt=0,
        pids={0: 100, 1: 101},
        global_ranks={0: 0, 1: 1},
        exits={0: -9},  # rank 1 was never seen exiting: torch reported it after its teardown
        marks={100: "SIGKILL sent by tuilaunch (api)"},
    )
    out = collect_failures(
        reported={0: _pf(0, 100, -9), 1: _pf(1, 101, 1, str(ef))},
        workers=[_w(0, 0), _w(1, 1)],
        ranks=ranks,
        error_files={1: str(ef)},
        stderr_paths={},
        host="h",
        now=5.0,
    )
    killed, raised = out
    assert killed.caused_by == "SIGKILL sent by tuilaunch (api)" and not killed.collateral
    assert killed.time == 5.0  # no recorded exit time, no error file: the given now
    assert (raised.message, raised.traceback, raised.time) == ("ValueError: bad", "TB", 7.0)
    assert raised.error_file == str(ef) and raised.stderr_tail == ()
    assert raised.collateral and raised.caused_by is None


def test_run_outcome():
    from torch.distributed.elastic.multiprocessing.api import SignalException

    assert run_outcome(None, None, None, None, "1") == ("succeeded", 0, "all ranks exited 0")
    e = SignalException("x", sigval=signal.SIGTERM)
    assert run_outcome(e, None, None, None, "1") == ("stopped", 143, "stopped by SIGTERM")
    assert run_outcome(RuntimeError("x"), signal.SIGINT, None, None, "1")[:2] == ("stopped", 130)
    outcome, code, message = run_outcome(RuntimeError("boom"), None, None, None, "1")
    assert (outcome, code, message) == ("error", 1, "RuntimeError: boom")


# ----------------------------------------------------------------------------- membership


def _handler(
    participants: tuple[str, ...] = ("a", "b"),
    *,
    round: int = 3,
    wait_list: tuple[str, ...] = (),
    complete: bool = True,
    age: dict[str, float] | None = None,
) -> Any:
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # torch keeps naive UTC
    age = age or {}
    state = SimpleNamespace(
        round=round,
        complete=complete,
        closed=False,
        deadline=None,
        participants={n: i for i, n in enumerate(participants)},
        wait_list=set(wait_list),
        last_heartbeats={n: now - timedelta(seconds=age.get(n, 0.0)) for n in participants},
    )
    settings = SimpleNamespace(
        keep_alive_interval=timedelta(seconds=5), keep_alive_max_attempt=3, timeout=None
    )
    return SimpleNamespace(
        _state_holder=SimpleNamespace(_state=state), _settings=settings, _this_node="a"
    )


def _membership(events: list[Event]) -> Membership:
    args = argparse.Namespace(nnodes="1:3", rdzv_id="job")
    m = Membership(events.append, Snapshot, "host", TorchrunArgs.read(args))
    m.note(2, rendezvous.sample(_handler()), next_attempt=0)
    return m


def test_node_lost_needs_an_absence_that_lasts():
    events: list[Event] = []
    m = _membership(events)
    wait = ABSENCE_CONFIRM_SECONDS
    assert events == []  # the first round: nothing to compare with
    assert m.node_lost(_handler(), now=0.0) == []
    gone = _handler(("a",))
    assert m.node_lost(gone, now=1.0) == []  # maybe b is between its two writes
    # Many looks (a monitor tick each) inside the confirmation time: still not lost.
    assert all(m.node_lost(gone, now=1.0 + t / 10) == [] for t in range(int(wait * 10)))
    assert m.node_lost(gone, now=1.0 + wait) == ["b"]
    # Back on the next look: the absence clock starts over.
    assert m.node_lost(_handler(), now=10.0) == []
    assert m.node_lost(gone, now=11.0) == []
    assert m.node_lost(gone, now=11.0 + wait - 0.1) == []
    assert m.node_lost(gone, now=11.0 + wait) == ["b"]


@pytest.mark.slow
def test_a_node_killed_just_after_its_heartbeat_is_found_lost_in_the_wait():
    """b is SIGKILLed right after a heartbeat; a's rank dies of the broken collective at once.
    The wait must outlast b's heartbeat expiry, at which a's own sync drops b as torch's does,
    and then the absence's confirmation (the window plus 2 s did not: a's job then failed
    with --max-restarts 0 instead of going on without b, a flake of the whole suite)."""
    m = _membership([])
    handler = _handler()
    handler._settings.keep_alive_interval = timedelta(seconds=0.2)  # a 0.6 s window
    state = handler._state_holder._state

    def sync() -> int:  # torch's sanitize: drop the nodes whose heartbeat expired
        limit = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=0.6)
        for node in [n for n, beat in state.last_heartbeats.items() if beat < limit]:
            del state.last_heartbeats[node], state.participants[node]
        state.last_heartbeats["a"] = datetime.now(timezone.utc).replace(tzinfo=None)
        return len(state.wait_list)

    handler.num_nodes_waiting = sync
    t0 = time.monotonic()
    assert m.wait_node_loss(handler, lambda: False, poll=0.05) == ["b"]
    assert time.monotonic() - t0 >= ABSENCE_CONFIRM_SECONDS  # the confirmation was waited


def test_node_lost_dead_waiting_and_newer_rounds():
    m = _membership([])
    # Heartbeat older than interval x attempts (15 s): dead at once, no second look.
    assert m.node_lost(_handler(age={"b": 60.0})) == ["b"]
    # Missing, but on the wait list: alive and re-joining.
    assert m.node_lost(_handler(("a",), wait_list=("b",))) == []
    assert m.node_lost(_handler(("a",), wait_list=("b",))) == []
    # A newer round than the one joined: torch's own check restarts; nothing here.
    newer = _handler(("a",), round=4, age={"a": 60.0})
    assert m.node_lost(newer) == [] and m.node_lost(newer) == []
    # A round that is not complete yet is not a loss.
    assert m.node_lost(_handler(("a",), complete=False)) == []
    assert m.node_lost(_handler(("a",), complete=False)) == []


def test_node_lost_needs_a_group_and_a_handler_state():
    m = Membership(
        [].append, Snapshot, "h", TorchrunArgs.read(argparse.Namespace(nnodes="1", rdzv_id="j"))
    )
    m.note(1, rendezvous.sample(_handler(("a",))), next_attempt=0)
    assert m.node_lost(_handler(("a",), age={"a": 60.0})) == []  # one node: nothing to lose
    m = _membership([])
    assert m.node_lost(SimpleNamespace()) == []  # a static handler: no cached state


def test_note_posts_who_joined_and_left():
    events: list[Event] = []
    m = _membership(events)
    m.note(2, rendezvous.sample(_handler(("a", "c"))), next_attempt=1)
    (change,) = events
    assert isinstance(change, NodeChange)
    assert (change.attempt, change.joined, change.left, change.group_world_size) == (
        1,
        ("c",),
        ("b",),
        2,
    )
    m.note(2, rendezvous.sample(_handler(("a", "c"))), next_attempt=2)
    assert len(events) == 1  # the same members: nothing to say


# ----------------------------------------------------------------------------- cluster view


class MemKV:
    """A dict-backed store: a TCPStore without listing (index used) or etcd-like with it."""

    def __init__(self, listing: bool = False) -> None:
        self.data: dict[str, bytes] = {}
        self.listing = listing
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("store unreachable")

    def set(self, key: str, value: bytes) -> None:
        self._check()
        self.data[key] = value

    def add(self, key: str, amount: int) -> int:
        self._check()
        n = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(n).encode()
        return n

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        self._check()
        return [self.data.get(k) for k in keys]

    def list_status(self, pfx: str) -> list[bytes] | None:
        self._check()
        if not self.listing:
            return None
        return [v for k, v in self.data.items() if k.startswith(pfx + "s/")]

    def append(self, pfx: str, value: bytes) -> None:
        self.set(pfx + str(self.add(pfx + "n", 1)), value)

    def appended(self, pfx: str, start: int) -> list[bytes]:
        self._check()
        n = int(self.data.get(pfx + "n", b"0"))
        out = []
        for k in range(start + 1, n + 1):
            if pfx + str(k) not in self.data:
                break
            out.append(self.data[pfx + str(k)])
        return out

    def describe(self) -> str:
        return "mem"


def _view(kv: MemKV, addr: str, store: RunStore) -> ClusterView:
    handler = SimpleNamespace(_this_node=SimpleNamespace(addr=addr, pid=7))
    return ClusterView(
        post=store.post,
        snapshot=store.snapshot,
        host=addr,
        handler=handler,
        endpoint=lambda h: "unused:0",
        run_id="job",
        interval=0.0,  # read on every tick
        connector=lambda h, ep: kv,
    )


@pytest.mark.parametrize("listing", [False, True], ids=["index", "listing"])
def test_cluster_view_publishes_and_reads_every_node(listing):
    kv = MemKV(listing)
    sa, sb = RunStore(), RunStore()
    a, b = _view(kv, "10.0.0.1", sa), _view(kv, "10.0.0.2", sb)
    first = a.tick()
    assert first is not None and [n.node for n in first.nodes] == ["10.0.0.1:7"]
    assert first.nodes[0].this_node and first.error is None
    sample = b.tick()
    assert sample is not None and sample.store == "mem"
    assert {n.node: n.this_node for n in sample.nodes} == {"10.0.0.1:7": False, "10.0.0.2:7": True}
    assert sb.snapshot().cluster == sample  # posted to the run's own store
    if not listing:  # each node registered once in the index
        assert kv.data[prefix("job") + "n"] == b"2"
        b.tick()
        assert kv.data[prefix("job") + "n"] == b"2"


def test_cluster_view_stale_node_and_error_fallback():
    kv = MemKV()
    sa, sb = RunStore(), RunStore()
    a, b = _view(kv, "10.0.0.1", sa), _view(kv, "10.0.0.2", sb)
    a.tick()
    # Node a stops publishing: its record grows old and the headless line says LOST.
    key = prefix("job") + "s/10.0.0.1:7"
    record = json.loads(kv.data[key])
    record["t"] -= 120
    kv.data[key] = json.dumps(record).encode()
    sample = b.tick()
    assert sample is not None
    lines = cluster_lines(sample.nodes, stale_after=10.0)
    assert ": LOST, " in lines["10.0.0.1:7"] and "LOST" not in lines["10.0.0.2:7"]
    # The store goes away: the last nodes are kept, with the error.
    kv.down = True
    failed = b.tick()
    assert failed is not None and "store unreachable" in (failed.error or "")
    assert [n.node for n in failed.nodes] == [n.node for n in sample.nodes]
    assert sb.snapshot().cluster == failed
    # Its host comes back with an empty store: the view reconnects, registers again, and
    # the error is gone; node a shows up once it publishes again.
    kv.down = False
    kv.data.clear()
    back = b.tick()
    assert back is not None and back.error is None
    assert [n.node for n in back.nodes] == ["10.0.0.2:7"]
    a.tick()
    again = b.tick()
    assert again is not None and [n.node for n in again.nodes] == ["10.0.0.1:7", "10.0.0.2:7"]


# ----------------------------------------------------------------------------- injection


class Recorder:
    """An inject.Target that records firings and lets a test wait for the n-th one."""

    def __init__(self) -> None:
        self.fired: list[Fired] = []
        self.cond = threading.Condition()

    def attempt_alive(self, attempt: int) -> bool:
        return True

    def inject_fault(self, spec: InjectSpec, local_rank: int, fired: Fired) -> bool:
        with self.cond:
            self.fired.append(fired)
            self.cond.notify_all()
        return True

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Fired]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.fired) >= n, timeout), self.fired
            return list(self.fired)


def _run_attempts(injector: Injector, rec: Recorder, per_attempt: list[int]) -> list[Fired]:
    """Run one attempt per entry of ``per_attempt``, waiting for that many firings in each.

    Timers of one attempt fire on their own threads in no set order, so each attempt first
    waits for the firings it expects; then a sentinel firing (added last, due at once) shows
    that nothing else was due at the attempt's start before the attempt is ended.
    """
    for attempt, n in enumerate(per_attempt):
        before = len(rec.fired)
        injector.attempt_started(attempt, {g: g for g in range(8)}, 8)
        rec.wait_for(before + n)
        injector.add(parse_spec(f"kill:rank=7,attempt={attempt}"), "sentinel")
        rec.wait_for(before + n + 1)
        injector.attempt_ended(attempt)
    injector.close()
    got = [f for f in rec.fired if f.source != "sentinel"]
    assert len(got) == sum(per_attempt), got
    return got


def test_injector_same_seed_same_ranks():
    specs = [parse_spec("kill:rank=random,times=3"), parse_spec("hang:rank=random,times=3")]
    runs = []
    for _ in range(2):
        rec = Recorder()
        got = _run_attempts(Injector(specs, seed=1234, target=rec), rec, [2, 2, 2])
        runs.append(sorted((f.attempt, f.spec.kind, f.global_rank) for f in got))
    assert runs[0] == runs[1]
    assert all(0 <= g < 8 for _, _, g in runs[0])
    assert Injector(specs, seed=1234).uses_random


def test_injector_attempt_and_times():
    rec = Recorder()
    specs = [parse_spec("kill:rank=2,attempt=1"), parse_spec("exit:rank=3,times=2")]
    got = _run_attempts(Injector(specs, seed=0, target=rec), rec, [1, 2, 0, 0])
    assert sorted((f.attempt, f.spec.kind, f.global_rank, f.count) for f in got) == [
        (0, "exit", 3, 1),
        (1, "exit", 3, 2),  # times=2: once per attempt, then never again
        (1, "kill", 2, 1),  # attempt=1 only
    ]


# ----------------------------------------------------------------------------- wiring


def test_runner_builds_each_part_from_parts_built_before_it():
    """Issue 33: no late binding in ``Runner.__init__``: no ``bind`` call, and no lambda that
    reads an attribute of the runner assigned after it (the old ``schedule=lambda ...:
    self.faults.inject(...)`` handed to Control before ``self.faults`` existed)."""
    init = next(
        n
        for n in ast.walk(ast.parse(inspect.getsource(runner.Runner)))
        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    assigned: set[str] = set()
    late: list[str] = []
    for stmt in init.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr != "bind", f"late binding: {ast.unparse(node)}"
            if isinstance(node, ast.Lambda):
                for inner in ast.walk(node.body):
                    if (
                        isinstance(inner, ast.Attribute)
                        and isinstance(inner.value, ast.Name)
                        and inner.value.id == "self"
                        and inner.attr not in assigned
                        and not callable(getattr(runner.Runner, inner.attr, None))
                    ):
                        late.append(ast.unparse(node))
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                assigned.add(node.attr)
    assert {"actions", "faults", "injector", "control", "supervisor"} <= assigned
    assert not late, f"lambdas reaching a part assigned later: {late}"
    assert not hasattr(Injector, "bind")


def test_control_parts_built_in_order_schedule_and_fire_an_injection():
    """The control parts alone, built in order (actions -> faults -> injector -> control), with
    no runner: a live ``Inject`` is checked (world size, the bootstrap's refusal) and
    scheduled, and its firing SIGKILLs a real process through the actions, journaled as an
    ``Injected`` then a ``ControlAction``."""
    store, ranks, state = RunStore(), RankTable(), RunState()
    shim = ShimDir(False, no_python=False)
    actions = Actions(
        store.post, ranks, shim, state, dump=lambda r, s: None, stop=lambda g, r: None
    )
    faults = FaultExecutor(actions, ranks, shim, store.post, state)
    injector = Injector((), seed=0, target=faults)
    control = Control(actions, injector, ranks, shim, store.snapshot)
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ranks.begin_attempt({0: proc.pid}, {0: 0}, 1)
        state.set_phase(Phase.RUNNING)
        refused = control.execute(Inject("exit:rank=0", source="test"))
        assert (refused.ok, refused.detail) == (False, shim.no_shim_reason("exit"))
        out_of_range = control.execute(Inject("kill:rank=3", source="test"))
        assert not out_of_range.ok and "rank 3 is out of range" in out_of_range.detail
        assert injector.specs == ()  # nothing refused was scheduled
        ok = control.execute(Inject("kill:rank=0", source="test"))
        assert (ok.ok, ok.detail) == (True, "scheduled kill:rank=0")
        injector.attempt_started(0, {0: 0}, 1)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        injector.close()
        faults.close()
        proc.kill()
        proc.wait()
    fired = [e for e in store.events() if isinstance(e, Injected | ControlAction)]
    assert [type(e) for e in fired] == [Injected, ControlAction], fired
    assert fired[0].ok and fired[0].source == "test"
    assert fired[1].ok and fired[1].action == "kill" and fired[1].source == "inject, test"


# ----------------------------------------------------------------------------- rank table


def test_rank_table_records_each_exit_once():
    t = RankTable()
    assert t.begin_attempt({0: 100, 1: 101}, {0: 4, 1: 5}, 8) == 0
    assert t.info(0).alive and t.world_size == 8
    new, seen = t.record_exits({0: None, 1: 3}, by_agent=False)
    assert [(x.local_rank, x.global_rank, x.pid, x.exit_code, x.by_agent) for x in new] == [
        (1, 5, 101, 3, False)
    ]
    assert seen == {1: 3} and not t.info(1).alive
    new, seen = t.record_exits({0: -15, 1: 3}, by_agent=True)
    assert [(x.local_rank, x.by_agent) for x in new] == [(0, True)]  # rank 1 not again
    view = t.view()
    assert view.exits == {0: -15, 1: 3} and view.by_agent == frozenset({0})
    assert set(view.exit_times) == {0, 1}
    t.mark(100, "SIGKILL sent by tuilaunch (api)")
    # A new attempt forgets exits and stopped ranks, not marks (a pid is not reused).
    assert t.begin_attempt({0: 200}, {0: 0}, 1) == 1
    assert t.view().exits == {} and t.view().marks == {100: "SIGKILL sent by tuilaunch (api)"}


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fp:
        return fp.read().split(")")[-1].split()[0]


def _wait_state(pid: int, want: bool, states: str = "T", timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (_state(pid) in states) != want:
        assert time.monotonic() < deadline, _state(pid)
        time.sleep(0.01)


def test_rank_table_continue_stopped_lets_go_for_good():
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        t = RankTable()
        attempt = t.begin_attempt({0: p.pid}, {0: 0}, 1)
        assert t.pause(0, p.pid, attempt, True, lambda: True)
        assert t.is_stopped(0) and t.current(attempt)
        _wait_state(p.pid, True)
        t.continue_stopped()
        _wait_state(p.pid, False)
        assert not t.is_stopped(0)
        # The attempt is being torn down: a `slow` injection may not stop it again.
        assert not t.current(attempt)
        assert not t.pause(0, p.pid, attempt, True, lambda: True)
        assert _state(p.pid) not in "T"
        # The runner no longer monitors (or another pid): no stop either.
        t2 = RankTable()
        a2 = t2.begin_attempt({0: p.pid}, {0: 0}, 1)
        assert not t2.pause(0, p.pid, a2, True, lambda: False)
        assert not t2.pause(0, p.pid + 1, a2, True, lambda: True)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_rank_table_continues_a_rank_stopped_by_someone_else():
    """A rank SIGSTOPped from outside (``kill -STOP``) is continued too when torch is about to
    terminate the group: stopped, it would leave the SIGTERM pending for the whole shutdown
    timeout."""
    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        t = RankTable()
        t.begin_attempt({0: p.pid}, {0: 0}, 1)
        os.kill(p.pid, signal.SIGSTOP)
        _wait_state(p.pid, True)
        assert not t.is_stopped(0)  # not tuilaunch's doing
        t.continue_stopped()
        _wait_state(p.pid, False)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


# ----------------------------------------------------------------------------- run state, config


def test_run_state_restart_stop_and_finish():
    """The run's shared state: a restart is taken only while the group runs and no stop was
    asked for; the first stop's signal stays; the first finisher wins and settles the run."""
    state = RunState()
    assert state.request_restart() == "agent is starting" and not state.monitored()
    state.set_phase(Phase.RUNNING)
    assert state.monitored() and not state.settled()
    assert state.request_restart() is None
    assert state.take_restart() and not state.take_restart()  # taken once
    assert state.request_stop(signal.SIGTERM, "stop requested")
    assert not state.request_stop(signal.SIGINT, "again")
    assert state.stop_signal == signal.SIGTERM and state.stop_reason == "stop requested"
    assert not state.monitored() and state.request_restart() == "agent is running"
    assert state.claim_finish("error", 1, "boom")
    assert not state.claim_finish("stopped", 143, "killed")
    assert (state.phase, state.exit_code, state.error_message) == ("error", 1, "boom")
    assert state.settled()


def test_run_config_from_options():
    """The command line's settings reach the run as one RunConfig (no field relayed)."""
    _, opts = parse(
        [
            "--hang-timeout=7",
            "--on-hang=stop",
            "--no-dump-on-failure",
            "--stack-samples=0",
            "--inject=exit:rank=0",
            "--inject-seed=3",
            "--journal=j.jsonl",
            "train.py",
        ]
    )
    config = RunConfig.from_options(opts, mute_agent_console=True)
    assert config.hang_timeout == 7 and config.on_hang == "stop"
    assert not config.dump_on_failure and config.stack_samples == 0
    assert [s.kind for s in config.inject] == ["exit"] and config.inject_seed == 3
    assert config.journal_path == "j.jsonl" and config.mute_agent_console
    assert config.bootstrap  # an exit spec needs the worker bootstrap
    # RunConfig's defaults are the options' (one default each: tests/test_cli.py).
    assert RunConfig().bootstrap and RunConfig().hang_timeout == Options().hang_timeout
    # The bootstrap is the default; --no-bootstrap is torchrun's plain worker.
    plain = RunConfig.from_options(parse(["--no-bootstrap", "train.py"])[1])
    assert not plain.bootstrap
