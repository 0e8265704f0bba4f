"""A rank stopped from outside (``kill -STOP``) when the run stops: no shutdown timeout spent.

torch's teardown sends SIGTERM and waits up to the shutdown timeout (30 s by default) before
SIGKILL; a stopped process keeps the SIGTERM pending all that time. The launcher continues
every stopped rank before torch's SIGTERM, so the rank dies of it at once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import WORKERS, live_journal, read_journal, wait_for

from tui_launch.core.model.exitcodes import INFRASTRUCTURE

pytestmark = pytest.mark.slow

TICKER = str(WORKERS / "ticker.py")


def _started_pid(journal: Path) -> int | None:
    if not journal.exists():
        return None
    for e in live_journal(journal):
        if e["kind"] == "workers_started":
            return int(e["workers"][0]["pid"])
    return None


def test_on_hang_stop_with_a_sigstopped_rank_is_prompt(tuilaunch, tmp_path):
    journal = tmp_path / "run.jsonl"
    launch = tuilaunch(
        *("--hang-timeout", "2", "--on-hang", "stop", "--journal", str(journal)),
        *("--standalone", "--nproc-per-node", "1", TICKER, "--ticks", "6000"),
    )
    pid = wait_for(lambda: _started_pid(journal), 60, what="the worker's pid in the journal")
    os.kill(pid, signal.SIGSTOP)
    assert launch.wait(120) == INFRASTRUCTURE, launch.output
    events = read_journal(journal)
    (hang,) = [e for e in events if e["kind"] == "hang"]
    (exited,) = [e for e in events if e["kind"] == "rank_exited"]
    (end,) = [e for e in events if e["kind"] == "run_finished"]
    # Died of torch's SIGTERM (continued first), not of the SIGKILL 30 s later.
    assert exited["exit_code"] == -signal.SIGTERM, exited
    assert end["wall"] - hang["wall"] < 10, (hang["wall"], end["wall"])
