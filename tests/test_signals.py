"""Signals to the launcher stop everything, and a SIGKILLed launcher leaves no workers behind.

The launcher is started in its own session (``Launch.pid`` is its session leader); the signal
goes to that one process, as ``kill PID`` from a shell or a scheduler would send it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import (
    WORKERS,
    free_port,
    leftovers,
    needs_shutdown_timeout,
    read_journal,
    wait_for,
    wait_gone,
)

STEADY = str(WORKERS / "steady.py")
STUBBORN = str(WORKERS / "stubborn.py")
STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]


def _kinds(journal) -> list[str]:
    if not journal.exists():
        return []
    return [e["kind"] for e in read_journal(journal)]


def _ready_pids(path, n: int) -> list[int] | None:
    """Pids from a ready/restart log once ``n`` workers have written their line."""
    if not path.exists():
        return None
    lines = [ln.split() for ln in path.read_text().splitlines() if ln.strip()]
    if len(lines) < n:
        return None
    return [int(parts[-1]) for parts in lines]


def _start_steady(tuilaunch, tmp_path, *extra: str):
    journal = tmp_path / "j.jsonl"
    log = tmp_path / "restarts.log"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--journal",
        str(journal),
        *extra,
        STEADY,
        "--seconds",
        "120",
        "--restart-log",
        str(log),
    )
    pids = wait_for(lambda: _ready_pids(log, 2), 60, what="both workers started")
    wait_for(lambda: "workers_started" in _kinds(journal), 10, what="workers_started event")

    def stepping() -> bool:
        # steady.py prints "rank R step N" once the gloo group is up; the launcher's pipe
        # cannot be read without blocking, so look at the workers' own stdout files.
        started = next(e for e in read_journal(journal) if e["kind"] == "workers_started")
        found = []
        for w in started["workers"]:
            path = os.path.join(started["log_dir"], str(w["local_rank"]), "stdout.log")
            try:
                with open(path) as fp:
                    found.append("step" in fp.read())
            except OSError:
                found.append(False)
        return all(found)

    wait_for(stepping, 60, what="both ranks stepping")
    return launch, journal, pids


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: s.name)
def test_signal_while_running_stops_everything(tuilaunch, tmp_path, sig):
    launch, journal, pids = _start_steady(tuilaunch, tmp_path)
    assert all(p in leftovers(launch.token) for p in pids)
    t0 = time.monotonic()
    os.kill(launch.pid, sig)
    code = launch.wait(60)
    elapsed = time.monotonic() - t0
    assert code == 128 + int(sig), launch.output
    # steady.py does not ignore the signal: no need to wait for the 30 s shutdown timeout.
    assert elapsed < 20, elapsed
    left = wait_gone(launch.token, 5)
    assert left == [], f"left behind after {sig.name}: {left}"
    events = read_journal(journal)
    shutdown = [e for e in events if e["kind"] == "shutdown"]
    assert shutdown and shutdown[0]["signal"] == sig.name, [e["kind"] for e in events]
    fin = events[-1]
    assert fin["kind"] == "run_finished"
    # SIGTERM is a preemption (--preempt-signals): the same exit code, 143, in the table.
    outcome = "preempted" if sig == signal.SIGTERM else "stopped"
    assert fin["outcome"] == outcome and fin["exit_code"] == 128 + int(sig)
    assert f"tuilaunch summary: {outcome.upper()}" in launch.stderr
    # The shutdown line names the signal once (it said "received SIGINT (SIGINT)").
    said = [ln for ln in launch.output.splitlines() if "shutting down:" in ln]
    assert said == [f"[tuilaunch] shutting down: a signal to the launcher ({sig.name})"], said


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: s.name)
def test_signal_during_rendezvous_exits_promptly(tuilaunch, tmp_path, sig):
    journal = tmp_path / "j.jsonl"
    port = free_port()
    launch = tuilaunch(
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"sig{int(sig)}",
        "--journal",
        str(journal),
        STEADY,
        "--seconds",
        "5",
    )
    wait_for(lambda: "rendezvous_started" in _kinds(journal), 60, what="rendezvous_started")
    time.sleep(1.0)  # well inside the rendezvous' wait for a second node
    assert launch.proc.poll() is None, launch.wait(5) and launch.output
    assert "workers_started" not in _kinds(journal)
    t0 = time.monotonic()
    os.kill(launch.pid, sig)
    code = launch.wait(30)
    elapsed = time.monotonic() - t0
    assert code == 128 + int(sig), launch.output
    assert elapsed < 6, f"took {elapsed:.1f}s to leave the rendezvous"
    assert wait_gone(launch.token, 5) == []
    events = read_journal(journal)
    assert events[-1]["kind"] == "run_finished", [e["kind"] for e in events]
    assert events[-1]["outcome"] == ("preempted" if sig == signal.SIGTERM else "stopped")
    assert "workers_started" not in [e["kind"] for e in events]


def test_sigkill_of_launcher_leaves_no_workers(tuilaunch, tmp_path):
    launch, journal, pids = _start_steady(tuilaunch, tmp_path)
    os.kill(launch.pid, signal.SIGKILL)
    assert launch.wait(10) == -signal.SIGKILL
    t0 = time.monotonic()
    left = wait_gone(launch.token, 5)
    assert left == [], f"workers outlived the launcher: {left}"
    assert time.monotonic() - t0 < 5
    # The workers themselves are dead (or dying: a SIGKILLed process may linger a moment).
    wait_for(
        lambda: all(not os.path.exists(f"/proc/{p}") or _is_zombie(p) for p in pids),
        5,
        what="workers gone",
    )
    # The launcher had no chance to finish its journal: the reaper did the cleanup.
    assert "run_finished" not in _kinds(journal)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@needs_shutdown_timeout
def test_sigterm_then_sigkill_after_shutdown_timeout(tuilaunch, tmp_path):
    """Workers that ignore SIGTERM get SIGKILL once --shutdown-timeout has passed."""
    ready = tmp_path / "ready.log"
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "3",
        "--journal",
        str(journal),
        STUBBORN,
        "--ready",
        str(ready),
    )
    pids = wait_for(lambda: _ready_pids(ready, 2), 60, what="stubborn workers ready")
    t0 = time.monotonic()
    os.kill(launch.pid, signal.SIGTERM)
    time.sleep(1.0)
    # The workers ignore SIGTERM: they are still alive inside the shutdown timeout.
    assert launch.proc.poll() is None, launch.wait(5) and launch.output
    assert all(not _is_zombie(p) for p in pids)
    code = launch.wait(30)
    elapsed = time.monotonic() - t0
    assert code == 128 + signal.SIGTERM, launch.output
    assert 2.5 <= elapsed < 15, elapsed
    assert wait_gone(launch.token, 5) == []
    exited = [e for e in read_journal(journal) if e["kind"] == "rank_exited"]
    assert sorted(e["exit_code"] for e in exited) == [-9, -9], exited


@needs_shutdown_timeout
def test_second_sigint_escalates_to_sigkill(tuilaunch, tmp_path):
    ready = tmp_path / "ready.log"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "60",
        STUBBORN,
        "--ready",
        str(ready),
    )
    pids = wait_for(lambda: _ready_pids(ready, 2), 60, what="stubborn workers ready")
    os.kill(launch.pid, signal.SIGINT)
    time.sleep(1.5)
    assert launch.proc.poll() is None, "stopped before the shutdown timeout with workers alive"
    assert all(not _is_zombie(p) for p in pids)
    t0 = time.monotonic()
    os.kill(launch.pid, signal.SIGINT)
    code = launch.wait(30)
    assert code == 128 + signal.SIGINT, launch.output
    assert time.monotonic() - t0 < 10
    assert wait_gone(launch.token, 5) == []


@needs_shutdown_timeout
def test_signal_during_exit_barrier_exits_promptly(tuilaunch, tmp_path):
    """Node A's workers are done and it waits in the exit barrier for node B's workers."""
    port = free_port()
    rdzv = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "barrier",
    ]
    journal_a = tmp_path / "a.jsonl"
    ready_b = tmp_path / "b.ready"
    a = tuilaunch(*rdzv, "--journal", str(journal_a), STUBBORN, "--seconds", "0")
    b = tuilaunch(
        *rdzv,
        "--journal",
        str(tmp_path / "b.jsonl"),
        "--shutdown-timeout",
        "1",
        STUBBORN,
        "--seconds",
        "120",
        "--ready",
        str(ready_b),
    )
    wait_for(lambda: "exit_barrier" in _kinds(journal_a), 90, what="node A in the exit barrier")
    # node B's worker is still running (under load it may write its line after A is done)
    wait_for(lambda: _ready_pids(ready_b, 1), 90, what="node B's worker running")
    time.sleep(0.5)
    assert a.proc.poll() is None, a.wait(5) and a.output
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGTERM)
    code = a.wait(30)
    elapsed = time.monotonic() - t0
    assert code == 128 + signal.SIGTERM, a.output
    assert elapsed < 6, f"took {elapsed:.1f}s to leave the exit barrier"
    assert wait_gone(a.token, 5) == []
    events = read_journal(journal_a)
    assert events[-1]["kind"] == "run_finished" and events[-1]["outcome"] == "preempted"
    # Node B is still there (the fixture stops it); its worker was never touched by A.
    assert b.proc.poll() is None


def test_signal_while_agent_tears_down_a_failed_attempt(tuilaunch, tmp_path):
    """SIGTERM while torch waits (up to 30 s) for a peer to die after a rank failed.

    Rank 0 is SIGSTOPped from outside (a debugger, ``kill -STOP``), so torch's SIGTERM to it
    stays pending; rank 1 is SIGKILLed. The launcher must stop promptly, and the agent thread
    must not go on to restart the group after the run ended (those workers were orphans).
    """
    launch, journal, pids = _start_steady(tuilaunch, tmp_path, "--max-restarts", "3")
    started = next(e for e in read_journal(journal) if e["kind"] == "workers_started")
    by_rank = {w["local_rank"]: w["pid"] for w in started["workers"]}
    os.kill(by_rank[0], signal.SIGSTOP)
    os.kill(by_rank[1], signal.SIGKILL)
    # The agent has seen rank 1 die and is tearing the group down (rank 0's SIGTERM stays
    # pending while it is stopped): that is the moment this test is about.
    wait_for(
        lambda: any(
            e["kind"] == "rank_exited" and e["local_rank"] == 1 for e in read_journal(journal)
        ),
        30,
        what="the agent saw rank 1 die",
    )
    assert launch.proc.poll() is None
    t0 = time.monotonic()
    os.kill(launch.pid, signal.SIGTERM)
    code = launch.wait(60)
    assert code == 128 + signal.SIGTERM, launch.output
    assert time.monotonic() - t0 < 15
    assert wait_gone(launch.token, 5) == []
    # The launcher has exited, so nothing can be spawned late: only attempt 0 ever ran, and
    # its two pids are all the restart log knows.
    assert sorted(pids) == sorted(by_rank.values())
    assert len((tmp_path / "restarts.log").read_text().splitlines()) == 2
