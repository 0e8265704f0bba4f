"""The monitor's look for exits: one ``waitid`` that reaps nothing, not a poll of every rank.

Ten times a second, before torch's own poll, the observer looks for ranks that exited so that
the first failure is told from the peers torch then kills. When no rank's status is new and no
child of the launcher waits to be reaped, :func:`no_new_exit` says so without polling each
process (issue 34: the launcher's CPU at idle); any doubt (a zombie of any child, a status
torch reaped that is not recorded yet, a worker that is not a plain child) means a poll.
"""

from __future__ import annotations

import signal
import subprocess
from types import SimpleNamespace

from conftest import wait_for

from tui_launch.core.model.store import Phase
from tui_launch.core.seam.agent import exit_codes, no_new_exit
from tui_launch.core.workers.table import RankTable


def _zombie(proc: subprocess.Popen[bytes]) -> bool:
    with open(f"/proc/{proc.pid}/stat") as fp:
        return fp.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_no_new_exit_until_a_rank_exits_then_once_its_exit_is_recorded() -> None:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    pc = SimpleNamespace(
        subprocess_handlers={lr: SimpleNamespace(proc=p) for lr, p in enumerate(procs)}
    )
    table = RankTable()
    table.begin_attempt({lr: p.pid for lr, p in enumerate(procs)}, {lr: lr for lr in range(3)}, 3)
    try:
        assert no_new_exit(pc, table.exits())
        procs[1].send_signal(signal.SIGTERM)
        wait_for(lambda: _zombie(procs[1]), 10, what="rank 1 to exit")
        assert not no_new_exit(pc, table.exits())  # waiting to be reaped: poll
        assert not no_new_exit(pc, table.exits())  # the look reaps nothing
        codes = exit_codes(pc)  # the poll reaps it (torch's poll sees the same status)
        assert codes == {0: None, 1: -signal.SIGTERM, 2: None}
        assert not no_new_exit(pc, {})  # reaped, not recorded: poll again
        table.record_exits(codes, by_agent=False)
        assert table.exits() == {1: -signal.SIGTERM}
        assert no_new_exit(pc, table.exits())
        # A worker that is not a plain child (a warm spare's) is always polled.
        spare = SimpleNamespace(subprocess_handlers={0: SimpleNamespace(proc=SimpleNamespace())})
        assert not no_new_exit(spare, {})
        assert not no_new_exit(None, {}) and not no_new_exit(SimpleNamespace(), {})
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_with_no_exit_possible_the_answer_is_torchs_healthy_without_its_poll(monkeypatch) -> None:
    # When the look for exits finds none possible, the monitor answers HEALTHY itself instead
    # of having torch poll every worker's Popen again (most of an idle monitor loop's cost);
    # where torch's check does more (its D-state timeout, torch 2.13), torch is asked.
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from tui_launch.core.seam.agent import quiet_result

    monkeypatch.delenv("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", raising=False)
    plain = SimpleNamespace(_uninterruptible_state_timeout=0.0)
    result = quiet_result(plain)
    assert result is not None and result.state == WorkerState.HEALTHY and not result.failures
    assert quiet_result(SimpleNamespace()) is not None  # torch < 2.13: no such check
    d_state = SimpleNamespace(_uninterruptible_state_timeout=30.0)
    assert quiet_result(d_state) is None
    # The attribute is torch's own, set in LocalElasticAgent.__init__ from the variable.
    import inspect

    assert "self._uninterruptible_state_timeout" in inspect.getsource(LocalElasticAgent)


def test_the_idle_wait_ends_when_a_worker_exits_or_a_request_comes_and_not_before() -> None:
    # Between two ticks that found nothing to do the monitor waits here up to a second (the
    # agent loop's idle cost, issue 34); a worker's exit or a stop/restart/hang request must
    # end the wait at once, or the launcher would see a failure later than torchrun does.
    import threading
    import time

    from tui_launch.core.run.state import RunState

    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    state = RunState()
    wake = state.wake
    try:
        wake.watch(p.pid for p in procs)
        t0 = time.monotonic()
        assert wake.wait(0.3)  # nothing happens: the whole wait
        assert time.monotonic() - t0 >= 0.25
        threading.Timer(0.2, procs[1].kill).start()
        t0 = time.monotonic()
        assert wake.wait(60)
        assert time.monotonic() - t0 < 30 and _zombie(procs[1])
        # Recorded: the dead worker's pidfd no longer ends every wait.
        wake.forget(procs[1].pid)
        t0 = time.monotonic()
        wake.wait(0.3)
        assert time.monotonic() - t0 >= 0.25
        # A request from another thread (a stop from the signal handler, a restart from a
        # command) wakes it; so does one made just before the wait began.
        state.set_phase(Phase.RUNNING)
        threading.Timer(0.2, state.request_restart).start()
        t0 = time.monotonic()
        wake.wait(60)
        assert time.monotonic() - t0 < 30 and state.take_restart()
        state.request_stop(signal.SIGTERM, "test")
        t0 = time.monotonic()
        wake.wait(60)
        assert time.monotonic() - t0 < 30
        # A worker that cannot be watched (gone before its pidfd was opened): no idle wait.
        wake.watch([procs[1].pid, procs[0].pid])
        procs[1].wait()
        wake.watch([procs[1].pid])
        assert not wake.wait(60)
    finally:
        wake.close()
        for p in procs:
            p.kill()
            p.wait()
    assert not wake.wait(60)  # closed: never waits
    wake.notify()  # and a late request is harmless


def test_a_run_state_holds_no_descriptor_until_workers_are_watched_and_none_once_closed() -> None:
    # Every run (and every test) builds a RunState: its wake-up pipe is opened with the first
    # workers and closed with the agent thread, so none are left open behind.
    import os

    from tui_launch.core.run.state import RunState

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    states = [RunState() for _ in range(20)]
    assert open_fds() == before
    proc = subprocess.Popen(["sleep", "60"])
    try:
        states[0].wake.watch([proc.pid])
        assert open_fds() == before + 3  # the pidfd and the pipe
        states[0].wake.close()
        assert open_fds() == before
    finally:
        proc.kill()
        proc.wait()
