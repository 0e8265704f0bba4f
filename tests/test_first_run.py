"""Issue 17: what a new user meets in the first five minutes.

Pure checks (torch's stderr filter, failure texts, summaries), dashboard checks with the
deterministic fake source (Pilot), and real launches on a pipe: a rendezvous store nobody
serves, --version and usage errors without torch's NumPy warning, an unknown --logs-specs
name, a clean single-node run's short summary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, PY, ROOT, WORKERS, base_env, free_port, rich_text

from tui_launch.core.logs.stderr import StderrFilter
from tui_launch.core.model import errors
from tui_launch.core.model.events import (
    AttemptFailed,
    Failure,
    NodeStatus,
    RunFinished,
    StoreRetry,
)
from tui_launch.core.model.store import Snapshot, replay
from tui_launch.core.model.text import cluster_lines, describe, failure_details
from tui_launch.summary import print_summary
from tui_launch.testing import builders, scenarios
from tui_launch.tui import actions
from tui_launch.tui.app import Dashboard

# ------------------------------------------------------------------ torch's stderr, filtered

# What torch 2.13's TCPStore client printed for one retry and the last try (frames shortened).
RETRY_OUTPUT = """\
[E1124 00:23:20.006340366 socket.cpp:1028] [c10d] The client socket has timed out after 60000ms while trying to connect to (127.0.0.1, 43905).
[W1124 00:23:20.014587443 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host 127.0.0.1:43905 - retrying (try=0, timeout=60000ms, delay=28634ms): The client socket has timed out after 60000ms while trying to connect to (127.0.0.1, 43905).
Exception raised from throwTimeoutError at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/socket.cpp:1030 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7fedbc179b8d in libc10.so)
frame #1: <unknown function> + 0x163b752 (0x7feda8c3b752 in libtorch_cpu.so)
<omitting python frames>
frame #32: <unknown function> + 0x891f5 (0x7fedbe6a71f5 in /lib/x86_64-linux-gnu/libc.so.6)

[E1124 00:23:49.662580132 socket.cpp:1028] [c10d] The client socket has timed out after 60000ms while trying to connect to (127.0.0.1, 43905).
[E1124 00:23:49.662720153 TCPStore.cpp:328] [c10d] TCP client failed to connect/validate to host 127.0.0.1:43905 - timed out (try=1, timeout=60000ms): The client socket has timed out after 60000ms while trying to connect to (127.0.0.1, 43905).
Exception raised from throwTimeoutError at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/socket.cpp:1030 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7fedbc179b8d in libc10.so)

a plain line of the launcher's own
"""  # noqa: E501


def test_torch_store_retries_become_one_line_each():
    filt = StderrFilter()
    out = [filt.feed(line) for line in RETRY_OUTPUT.splitlines()]
    shown = [o.console for o in out if o.console is not None]
    assert shown == [
        "rendezvous: the store at 127.0.0.1:43905 did not answer within 60s (try 1); "
        "torch retries in 29s (details in agent.log)",
        "rendezvous: the store at 127.0.0.1:43905 did not answer (try 2, the last)",
        "a plain line of the launcher's own",
    ]
    retries = [o.event for o in out if isinstance(o.event, StoreRetry)]
    assert [(r.endpoint, r.attempt, r.timeout) for r in retries] == [("127.0.0.1:43905", 1, 60.0)]


# ------------------------------------------------------------------ failures and summaries


def _failure(rank: int, *, collateral: bool = False, attempt: int = 0, **kw: object) -> Failure:
    base = builders.failure(attempt, rank, pid=5100 + rank, at=10.0 + rank)
    return dataclasses.replace(base, collateral=collateral, **kw)  # type: ignore[arg-type]


def test_attempt_line_counts_only_real_collateral():
    own = AttemptFailed(attempt=0, failures=tuple(_failure(r) for r in range(4)))
    line = describe(own) or ""
    assert "terminated by the agent" not in line and "+3 more failed" in line
    mixed = AttemptFailed(attempt=0, failures=(_failure(1), _failure(0, collateral=True)))
    assert (describe(mixed) or "").endswith("(+1 terminated by the agent)")


def test_no_oom_hint_when_tuilaunch_sent_the_signal():
    killed = _failure(1, exit_code=-9, hint=None, caused_by="SIGKILL sent by tuilaunch (dashboard)")
    text = "\n".join(failure_details(killed))
    assert "cause      : SIGKILL sent by tuilaunch" in text and "OOM" not in text


def test_plain_trailing_stderr_is_labelled_not_evidence():
    numpy = (
        "UserWarning: Failed to initialize NumPy: No module named 'numpy'",
        "  cpu = _conversion_method_template(device=torch.device('cpu'))",
    )
    assert not errors.has_error_signature(numpy)
    quiet = _failure(1, traceback=None, stderr_tail=numpy, exit_code=-9)
    text = "\n".join(failure_details(quiet))
    assert "no traceback or error in them" in text and "stderr (last" not in text
    real = (*numpy, "RuntimeError: boom")
    assert errors.has_error_signature(real)
    loud = _failure(1, traceback=None, stderr_tail=real)
    assert "stderr (last 3 lines, no @record traceback):" in "\n".join(failure_details(loud))


def _summary(snap: Snapshot, verbose: bool = False) -> str:
    buf = io.StringIO()
    print_summary(snap, None, buf, verbose=verbose)
    return buf.getvalue()


def test_one_attempt_lists_its_other_failures_as_such():
    events = [
        builders.run_started(2, 0, at=0.0),
        *builders.attempt(0, 2, 0.1, 5100),
        AttemptFailed(attempt=0, failures=(_failure(0), _failure(1))),
        RunFinished(outcome="failed", exit_code=1, message="x", **builders.at(20.0)),
    ]
    text = _summary(replay(events))
    assert "failures of earlier attempts" not in text
    assert "other failures of attempt 0" in text


def test_clean_success_ends_with_a_short_summary():
    events = [
        builders.run_started(2, 3, at=0.0),
        *builders.attempt(0, 2, 0.1, 5100),
        RunFinished(outcome="succeeded", exit_code=0, message="ok", **builders.at(12.5)),
    ]
    snap = replay(events)
    short = _summary(snap)
    assert "SUCCEEDED  exit code 0  duration 12.5s" in short
    assert "2 rank(s) exited 0; no failures, no restarts" in short
    assert "ranks (attempt" not in short and "restarts: 0/3" not in short
    full = _summary(snap, verbose=True)
    assert "ranks (attempt 0)" in full and "restarts: 0/3 on failure" in full


def test_cluster_lines_are_words_and_drop_a_recovered_error():
    node = NodeStatus(
        node="node0:42",
        host="node0",
        pid=42,
        state="succeeded",
        group_rank=0,
        group_world_size=2,
        local_world_size=2,
        attempt=1,
        ranks=((0, 0, 1, "exited"), (1, 1, 2, "exited")),
        restarts=(1, 0, 0),
        gpu=None,
        error="rank 1: boom (attempt 0)",
        age=0.0,
    )
    line = cluster_lines((node,), 10.0)["node0:42"]
    assert line == (
        "node0:42 (node 0 of 2): succeeded, attempt 1, ranks 0,1 exited, "
        "restarts: 1 after a failure"
    )


def test_duration_counts_from_the_launch():
    # The store never answered: no RunStarted, and the summary still counts from the launch.
    snap = scenarios.connect_failed().snapshot()
    assert snap.run is None
    assert "ERROR  exit code 1  duration 89.5s" in _summary(snap)


def _pilot(app: Dashboard, size: tuple[int, int], body: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``body(pilot)`` on ``app`` under ``run_test`` (no asyncio plugin in this suite)."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await body(pilot)

    asyncio.run(main())


def _text(widget: object) -> str:
    """What a panel shows, as plain text (its rich renderable, rendered wide)."""
    return rich_text(widget.content, width=300)  # type: ignore[attr-defined]


def test_a_store_nobody_serves_is_explained_on_the_dashboard():
    app = Dashboard(scenarios.connecting())

    async def waiting(pilot: Any) -> None:
        header = _text(app.panel("header"))
        assert "10.0.0.7:29400" in header and "0:01:35" in header
        rdzv = _text(app.panel("rendezvous"))
        assert "no answer yet" in rdzv and "60s a try" in rdzv and "retries" in rdzv

    _pilot(app, (80, 24), waiting)
    failed = Dashboard(scenarios.connect_failed())

    async def ended(pilot: Any) -> None:
        failed_header = _text(failed.panel("header"))
        assert "ERROR" in failed_header and "exit code 1" in failed_header
        assert failed._tabs.active == "cause-tab"  # nothing ran: the reason is shown
        cause = _text(failed.panel("rootcause"))
        assert "10.0.0.7:29400" in cause and "(60s)" in cause
        await pilot.press("o")
        assert failed._tabs.active == "agent-tab"

    _pilot(failed, (80, 24), ended)


def test_esc_clears_a_filter_applied_with_enter():
    app = Dashboard(scenarios.healthy())

    async def body(pilot: Any) -> None:
        await pilot.press("slash", *"epoch", "enter")
        assert app.log_pane.filter_text == "epoch"
        assert not app.query_one("#filter-input").display
        await pilot.press("escape")
        assert app.log_pane.filter_text == ""
        assert "filter" not in app.log_pane.bar_text

    _pilot(app, (150, 42), body)


def test_rank_log_follows_the_selection():
    app = Dashboard(scenarios.healthy())

    async def body(pilot: Any) -> None:
        await pilot.press("down", "l")
        assert app.log_pane.rank == 1
        await pilot.press("down")
        assert app.log_pane.rank == 2
        assert "local rank 2" in app.log_pane.bar_text

    _pilot(app, (150, 42), body)


def test_palette_entries_are_unique_and_cover_the_tabs():
    titles = [a.palette for a in actions.palette()]
    assert len(titles) == len(set(titles))
    assert "Show the agent log" in titles and "Show the cluster tab" in titles


def test_palette_as_the_app_offers_it_has_no_duplicates():
    app = Dashboard(scenarios.healthy())

    async def body(pilot: Any) -> None:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert len(titles) == len(set(titles)), titles
        assert "Show the agent log" in titles and "Show the cluster tab" in titles

    _pilot(app, (150, 42), body)


def test_clocks_stop_when_the_job_ends():
    src = scenarios.finished()
    app = Dashboard(src)

    async def body(pilot: Any) -> None:
        rows = range(app._table.row_count)
        before = (_text(app.panel("header")), [app._table.get_row_at(i) for i in rows])
        src.clock += 120
        app._tick()
        await pilot.pause()
        after = (_text(app.panel("header")), [app._table.get_row_at(i) for i in rows])
        assert after == before

    _pilot(app, (150, 42), body)


def test_80x24_keeps_the_essentials():
    app = Dashboard(scenarios.healthy())

    async def body(pilot: Any) -> None:
        assert app._table.border_title == "Workers"
        shown = app._table.shown_columns
        assert {"rank", "state", "exit", "last log"} <= set(shown)
        assert not app._footer.show_command_palette  # it covered the last keys
        header = _text(app.panel("header"))
        assert header.index("RUNNING") < header.index("0:01:35") < header.index("examples/")

    _pilot(app, (80, 24), body)


# ------------------------------------------------------------------ real launches


@pytest.mark.timeout(120)
def test_headless_store_nobody_serves(tuilaunch, tmp_path):
    port = free_port()
    launch = tuilaunch(
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-conf", "is_host=0,read_timeout=3", "--nnodes", "2", "--nproc-per-node", "1",
        "--log-dir", str(tmp_path / "logs"), str(EXAMPLES / "train_ddp.py"),
    )  # fmt: skip
    assert launch.wait(90) == 75, launch.output  # a store never reached: infrastructure
    err = launch.stderr
    assert "frame #" not in err and "Exception raised from" not in err, err
    retries = [ln for ln in err.splitlines() if "did not answer within 3s" in ln]
    assert len(retries) >= 1 and all(f"127.0.0.1:{port}" in ln for ln in retries), err
    assert f"could not reach the c10d rendezvous store at 127.0.0.1:{port}" in err
    duration = float(err.split("duration ")[1].split("s")[0])
    assert duration >= 3.0, err  # from the launch, not from a RunStarted that never came
    agent_logs = list((tmp_path / "logs").glob("*/agent.log"))
    assert agent_logs and "frame #" in agent_logs[0].read_text()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tui_launch", *args],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_launcher_prints_no_numpy_warning_of_its_own():
    version = _run("--version")
    assert version.returncode == 0 and "tuilaunch" in version.stdout
    assert "NumPy" not in version.stderr and version.stderr == ""
    bad = _run("--bogus")
    assert bad.returncode == 2 and "NumPy" not in bad.stderr
    assert bad.stderr.count("\n") == 1, bad.stderr


@pytest.mark.slow
def test_unknown_logs_specs_is_a_usage_error(tmp_path: Path):
    logs = tmp_path / "logs"
    p = _run(
        "--no-tui", "--logs-specs", "nope", "--log-dir", str(logs), "--nproc-per-node", "1",
        str(WORKERS / "noop.py"),
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "--logs-specs 'nope'" in p.stderr and "Traceback" not in p.stderr
    assert not logs.exists()


@pytest.mark.fresh_launcher
@pytest.mark.timeout(120)
def test_single_node_success_is_short(tuilaunch):
    launch = tuilaunch("--standalone", "--nproc-per-node", "2", str(WORKERS / "noop.py"))
    assert launch.wait(90) == 0, launch.output
    err = launch.stderr
    assert "exit barrier" not in err and "[tuilaunch] cluster" not in err, err
    summary = err[err.rfind("tuilaunch summary:") :]
    assert "2 rank(s) exited 0; no failures, no restarts" in summary
    assert "ranks (attempt" not in summary and "logs: " in summary
    assert len(summary.strip().splitlines()) <= 5, summary


def test_the_exception_line_is_found_whatever_its_name():
    tail = (
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "w.py", line 3, in <module>',
        "[rank1]:     raise InjectedFailure('boom')",
        "[rank1]: InjectedFailure: boom, said the injector",
        "[W1124 00:00:00 ProcessGroup.cpp:1] Warning: a destructor note",
    )
    assert errors.last_error_line(tail) == "InjectedFailure: boom, said the injector"
    assert errors.last_error_line(("UserWarning: Failed to initialize NumPy",)) == ""


def test_a_deep_traceback_cut_off_by_the_tail_still_names_its_exception():
    # Hugging Face's Trainer: the 30-line tail starts inside the frames, without the header,
    # and the exception's name ends in neither Error nor Exception.
    tail = (
        '[rank1]:   File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 1873,'
        " in _run_epoch",
        "[rank1]:     batch_samples, num_items = self.get_batch_samples(epoch_iterator, n)",
        '[rank1]:   File "hf_train.py", line 10, in __getitem__',
        "[rank1]:     g = torch.Generator().manual_seed(i)",
        "[rank1]: tui_launch.core.workers.shim.InjectedFailure: boom in HF",
    )
    assert errors.has_error_signature(tail)
    assert (
        errors.last_error_line(tail) == "tui_launch.core.workers.shim.InjectedFailure: boom in HF"
    )
    # faulthandler's dump (no comma before "in") is not a traceback.
    dump = ('  File "w.py", line 3 in main', "Current thread 0x7f (most recent call first):")
    assert not errors.has_error_signature(dump)
