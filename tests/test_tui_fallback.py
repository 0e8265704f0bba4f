"""An exception inside the dashboard restores the terminal and keeps the job running headless.

A real run (2 ranks of steady.py) under a dashboard whose refresh raises after a few ticks:
``run_dashboard`` must come back with the error (not raise), fd 2 must be the original one
again, the job must still be running, and the headless front end must then see it through to
exit code 0 with every log line in the files.
"""

from __future__ import annotations

import io
import os

import pytest
from conftest import WORKERS, leftovers, wait_for

from tui_launch.core.launch.args import parse
from tui_launch.core.model.store import RunStore
from tui_launch.core.run.config import RunConfig
from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner
from tui_launch.headless import Headless
from tui_launch.tui.app import Dashboard
from tui_launch.tui.run import run_dashboard


class BrokenDashboard(Dashboard):
    """Raises from its refresh once the workers are up, like a widget bug would."""

    ticks = 0

    def _tick(self) -> None:
        super()._tick()
        if self.source.snapshot().phase == "running":
            BrokenDashboard.ticks += 1
            if BrokenDashboard.ticks >= 3:
                raise RuntimeError("widget bug")


@pytest.mark.slow
def test_ui_exception_keeps_the_job_running_headless(tmp_path, monkeypatch):
    monkeypatch.delenv(SHARE_STORE_ENV, raising=False)
    token = f"fallback-{os.getpid()}"
    monkeypatch.setenv("TUILAUNCH_TEST_TOKEN", token)
    args, _ = parse(
        ["--standalone", "--nproc-per-node", "2", str(WORKERS / "steady.py"), "--seconds", "8"]
    )
    store = RunStore()
    runner = Runner(
        args, store, RunConfig(journal_path=str(tmp_path / "j.jsonl"), mute_agent_console=True)
    )
    fd2_before = os.fstat(2)
    runner.start()
    try:
        code, error = run_dashboard(
            runner,
            refresh_hz=10,
            confirm=False,
            exit_on_finish=False,
            app_class=BrokenDashboard,
            headless=True,
        )
        assert code is None
        assert isinstance(error, RuntimeError) and "widget bug" in str(error)
        fd2_after = os.fstat(2)
        assert (fd2_after.st_ino, fd2_after.st_dev) == (fd2_before.st_ino, fd2_before.st_dev)
        assert not runner.done, "the job must outlive the dashboard"
        out, err = io.StringIO(), io.StringIO()
        exit_code = Headless(store, runner, out=out, err=err, status_line=False).run()
        assert exit_code == 0, err.getvalue()[-3000:]
        assert "tuilaunch summary: SUCCEEDED" in err.getvalue()
        ranks = {e.local_rank for e in store.events() if type(e).__name__ == "RankExited"}
        assert ranks == {0, 1}
        # Every line each rank printed is in its file, whatever the dashboard saw.
        log_dir = next(e.log_dir for e in store.events() if type(e).__name__ == "WorkersStarted")
        for rank in (0, 1):
            with open(os.path.join(log_dir, str(rank), "stdout.log")) as fp:
                text = fp.read()
            assert "step" in text
    finally:
        if not runner.done:
            runner.stop()
            runner.wait(30)
        wait_for(lambda: not leftovers(token), 10, what="workers gone")
