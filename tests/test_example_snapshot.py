"""The example trainer's snapshot belongs to one run (issue 23).

A run stopped like ``q`` does (SIGTERM to the launcher) leaves ``snapshot.pt`` behind; the
next run of the same command must train from scratch, not resume that stale snapshot, train
nothing and say SUCCEEDED. A restart within one run still resumes
(``test_restarts.py::test_example_trainer_resumes_from_snapshot``).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from conftest import EXAMPLES, wait_for


def test_a_second_run_trains_after_the_first_was_stopped(tuilaunch, tmp_path: Path) -> None:
    # The README's command, short: relative snapshot.pt in the launch directory.
    args = ("--standalone", "--nproc-per-node", "1", str(EXAMPLES / "train_ddp.py"))
    journal = tmp_path / "first.jsonl"
    first = tuilaunch(
        "--journal", str(journal), *args, "--epochs", "200", "--step-delay", "0.01", cwd=tmp_path
    )
    snapshot = tmp_path / "snapshot.pt"

    def saved_twice() -> bool:
        # Epoch 1's snapshot renamed into place: it holds two epochs.
        return snapshot.exists() and "Epoch 1 | Training snapshot saved" in _rank0(journal)

    wait_for(saved_twice, 180, what="the first run's second snapshot")
    first.proc.send_signal(signal.SIGTERM)  # what `q` does
    assert first.wait(120) == 143, first.output[-3000:]
    assert snapshot.exists()  # stopped before its end: the snapshot stays

    # Two epochs: a resume of the stale snapshot (>= 2 epochs run) would train nothing.
    second = tuilaunch(*args, "--epochs", "2", "--step-delay", "0", cwd=tmp_path)
    assert second.wait(180) == 0, second.output[-3000:]
    out = second.stdout
    assert "Resuming training from snapshot" not in out, out[-3000:]
    assert "Ignoring the snapshot of another run" in out
    assert "[RANK 0] Epoch 0 | Batchsize: 32 | Steps: 40" in out
    assert "[RANK 0] Epoch 1 | Batchsize: 32 | Steps: 40" in out
    assert not snapshot.exists()  # a finished run deletes its own


def _rank0(journal: Path) -> str:
    """Rank 0's output so far, from the log file the journal's workers_started names."""
    try:
        lines = journal.read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("kind") == "workers_started":
            try:
                return Path(os.path.join(event["log_dir"], "0", "stdout.log")).read_text()
            except OSError:
                return ""
    return ""
