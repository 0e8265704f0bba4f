"""Restarts that work: a rank SIGKILLed 10 times in a row recovers 10 times out of 10.

Every attempt must see the next TORCHELASTIC_RESTART_COUNT, with fresh worker processes, and
the failure budget must count down exactly once per failure.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from conftest import EXAMPLES, WORKERS, read_journal, wait_for

STEADY = str(WORKERS / "steady.py")
CRASH = str(WORKERS / "crash.py")
KILLS = 10


def _events(journal: Path, kind: str | None = None) -> list[dict]:
    if not journal.exists():
        return []
    events = read_journal(journal)
    return [e for e in events if kind is None or e["kind"] == kind]


def _restart_log(path: Path) -> list[tuple[int, int, int]]:
    """(rank, restart count, pid) per line of steady.py's --restart-log."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return out


def _stepping(started: dict) -> bool:
    """Both ranks of an attempt are past init_process_group (steady.py printed a step)."""
    for w in started["workers"]:
        path = os.path.join(started["log_dir"], str(w["local_rank"]), "stdout.log")
        try:
            with open(path) as fp:
                if "step" not in fp.read():
                    return False
        except OSError:
            return False
    return True


def test_rank_killed_ten_times_recovers_ten_times(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    rlog = tmp_path / "restarts.log"
    # Each attempt runs 5 s once its gloo group is up; the test kills rank 1 as soon as
    # both ranks step, so attempts 0..9 die and attempt 10 finishes normally.
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(KILLS),
        # Each attempt is killed as soon as it steps, never gaining a step: a restart storm
        # the smart policy would stop; this test is about torch's restart path.
        "--restart-storm",
        "0",
        "--journal",
        str(journal),
        STEADY,
        "--seconds",
        "5",
        "--restart-log",
        str(rlog),
    )
    killed: list[int] = []
    for attempt in range(KILLS + 1):

        def current(attempt: int = attempt):
            started = [e for e in _events(journal, "workers_started") if e["attempt"] == attempt]
            lines = [ln for ln in _restart_log(rlog) if ln[1] == attempt]
            if started and len(lines) == 2 and _stepping(started[0]):
                return started[0], lines
            return None

        started, lines = wait_for(current, 90, interval=0.05, what=f"attempt {attempt} running")
        assert launch.proc.poll() is None, launch.output
        pid1 = next(w["pid"] for w in started["workers"] if w["global_rank"] == 1)
        # The pid the agent reported is the process that saw this restart count.
        assert {(r, p) for r, _, p in lines} == {
            (w["global_rank"], w["pid"]) for w in started["workers"]
        }
        if attempt == KILLS:
            break
        os.kill(pid1, signal.SIGKILL)
        killed.append(pid1)

    code = launch.wait(120)
    assert code == 0, launch.output[-6000:]
    assert len(killed) == KILLS

    # Both ranks saw restart counts 0..10, each attempt in fresh processes.
    log = _restart_log(rlog)
    assert sorted((r, c) for r, c, _ in log) == [(r, c) for r in (0, 1) for c in range(KILLS + 1)]
    assert len({p for _, _, p in log}) == 2 * (KILLS + 1)

    starts = _events(journal, "workers_started")
    assert [e["attempt"] for e in starts] == list(range(KILLS + 1))
    all_pids = [w["pid"] for e in starts for w in e["workers"]]
    assert len(set(all_pids)) == len(all_pids) == 2 * (KILLS + 1)

    restarts = _events(journal, "restart")
    assert len(restarts) == KILLS
    assert [r["cause"] for r in restarts] == ["failure"] * KILLS
    assert [r["budget_left"] for r in restarts] == list(range(KILLS - 1, -1, -1))
    assert [(r["from_attempt"], r["to_attempt"]) for r in restarts] == [
        (i, i + 1) for i in range(KILLS)
    ]

    failed = _events(journal, "attempt_failed")
    assert [f["attempt"] for f in failed] == list(range(KILLS))
    for f, pid in zip(failed, killed, strict=True):
        real = [x for x in f["failures"] if not x["collateral"]]
        assert len(real) == 1, f
        assert real[0]["global_rank"] == 1 and real[0]["pid"] == pid
        assert real[0]["signal"] == "SIGKILL"

    fin = _events(journal)[-1]
    assert fin["kind"] == "run_finished" and fin["outcome"] == "succeeded"
    assert f"restarts: {KILLS}/{KILLS} on failure" in launch.stderr


def test_budget_exhausted_after_max_restarts(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--journal",
        str(journal),
        CRASH,
        "--rank",
        "1",
        "--mode",
        "exit",
        "--after",
        "0.2",
    )
    code = launch.wait(120)
    assert code == 1, launch.output
    starts = _events(journal, "workers_started")
    assert [e["attempt"] for e in starts] == [0, 1]
    restarts = _events(journal, "restart")
    assert len(restarts) == 1
    assert restarts[0]["cause"] == "failure" and restarts[0]["budget_left"] == 0
    failed = _events(journal, "attempt_failed")
    assert [f["attempt"] for f in failed] == [0, 1]
    for f in failed:
        real = [x for x in f["failures"] if not x["collateral"]]
        assert [(x["global_rank"], x["exit_code"]) for x in real] == [(1, 3)]
    fin = _events(journal)[-1]
    assert fin["kind"] == "run_finished" and fin["outcome"] == "failed"
    assert "restarts: 1/1 on failure" in launch.stderr
    # The root cause is the last attempt's failure; the earlier one is listed too.
    summary = launch.stderr[launch.stderr.rfind("tuilaunch summary:") :]
    assert "attempt    : 1" in summary
    assert "failures of earlier attempts" in summary
    assert "attempt 0: rank 1 (local 1" in summary


def test_example_trainer_resumes_from_snapshot(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    snapshot = tmp_path / "snapshot.pt"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--journal",
        str(journal),
        str(EXAMPLES / "train_ddp.py"),
        "--epochs",
        "4",
        "--step-delay",
        "0.1",
        "--snapshot-path",
        str(snapshot),
    )

    def epoch1_done():
        starts = _events(journal, "workers_started")
        if not starts:
            return None
        path = os.path.join(starts[0]["log_dir"], "1", "stdout.log")
        try:
            text = Path(path).read_text()
        except OSError:
            return None
        return starts[0] if "[RANK 1] Epoch 1 |" in text else None

    started = wait_for(epoch1_done, 120, interval=0.05, what="rank 1 finished epoch 1")
    assert launch.proc.poll() is None, launch.output
    assert snapshot.exists()
    pid1 = next(w["pid"] for w in started["workers"] if w["global_rank"] == 1)
    os.kill(pid1, signal.SIGKILL)
    t0 = time.monotonic()
    code = launch.wait(180)
    assert code == 0, launch.output[-6000:]
    assert time.monotonic() - t0 < 170
    assert "Resuming training from snapshot at Epoch" in launch.stdout
    assert "restart_count=1" in launch.stdout
    # Nothing before the kill was rerun from scratch: the resumed attempt starts at >= 1.
    resumed = [
        int(ln.rsplit(" ", 1)[1])
        for ln in launch.stdout.splitlines()
        if "Resuming training from snapshot at Epoch" in ln
    ]
    assert resumed and all(e >= 1 for e in resumed), resumed
    restarts = _events(journal, "restart")
    assert [(r["cause"], r["budget_left"]) for r in restarts] == [("failure", 1)]
    failed = _events(journal, "attempt_failed")
    real = [x for x in failed[0]["failures"] if not x["collateral"]]
    assert [(x["global_rank"], x["signal"]) for x in real] == [(1, "SIGKILL")]
    assert not snapshot.exists()  # rank 0 removes it after a successful run
