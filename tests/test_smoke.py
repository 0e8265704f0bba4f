"""Smoke: a 2-rank no-op job succeeds headless, and the journal tells the same story."""

from __future__ import annotations

import pytest
from conftest import WORKERS, read_journal


@pytest.mark.fresh_launcher
def test_noop_two_ranks(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "2", "--journal", str(journal), str(WORKERS / "noop.py")
    )
    assert launch.wait() == 0, launch.output
    kinds = [e["kind"] for e in read_journal(journal)]
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_finished"
    assert kinds.count("workers_started") == 1
    started = next(e for e in read_journal(journal) if e["kind"] == "workers_started")
    assert sorted(w["global_rank"] for w in started["workers"]) == [0, 1]
    assert "tuilaunch summary: SUCCEEDED" in launch.stderr
