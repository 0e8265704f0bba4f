"""Root cause: the first real failure, with its message, traceback or stderr tail, and hints.

Each test launches crash.py (one rank fails on purpose, the peer sleeps until the agent
terminates it) and checks the end-of-run summary on stderr and the journal's attempt_failed.
"""

from __future__ import annotations

import signal

import pytest
import torch
from conftest import WORKERS, read_journal

from tui_launch.core.model import errors

CRASH = str(WORKERS / "crash.py")


def _summary(stderr: str) -> str:
    """The end-of-run summary block of the headless output."""
    idx = stderr.rfind("tuilaunch summary:")
    assert idx >= 0, f"no summary in stderr:\n{stderr[-4000:]}"
    return stderr[idx:]


def _root_cause_block(stderr: str) -> str:
    summary = _summary(stderr)
    idx = summary.find("root cause")
    assert idx >= 0, f"no root cause block in summary:\n{summary}"
    return summary[idx:]


def _attempt_failed(journal) -> dict:
    events = read_journal(journal)
    failed = [e for e in events if e["kind"] == "attempt_failed"]
    assert len(failed) == 1, [e["kind"] for e in events]
    return failed[0]


def _run_crash(tuilaunch, tmp_path, *crash_args: str, nproc: int = 2):
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--journal",
        str(journal),
        CRASH,
        *crash_args,
    )
    code = launch.wait(120)
    return launch, code, journal


def test_record_raise_root_cause_has_message_and_traceback(tuilaunch, tmp_path):
    launch, code, journal = _run_crash(
        tuilaunch, tmp_path, "--rank", "1", "--mode", "raise", "--record"
    )
    assert code == 1, launch.output
    block = _root_cause_block(launch.stderr)
    assert "boom from rank 1" in block
    assert "rank       : 1 (local rank 1)" in block
    # The @record traceback, not the stderr tail.
    assert "traceback" in block
    assert any("explode" in ln for ln in block.splitlines()), block
    assert "stderr (last" not in block
    assert "tuilaunch summary: FAILED" in launch.stderr

    failed = _attempt_failed(journal)
    failures = failed["failures"]
    real = [f for f in failures if not f["collateral"]]
    assert len(real) == 1, failures
    root = real[0]
    assert root["global_rank"] == 1 and root["local_rank"] == 1
    assert root["exit_code"] == 1
    assert "boom from rank 1" in root["message"]
    assert root["traceback"] and "explode" in root["traceback"]
    assert root["error_file"] and root["error_file"].endswith("error.json")
    # torch >= 2.10 lists the peer it terminated as a failure too (torch 2.6 does not): when
    # it is there, it must be marked collateral.
    torch_version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if torch_version < (2, 10) and len(failures) == 1:
        return
    assert sorted(f["global_rank"] for f in failures) == [0, 1]
    peer = next(f for f in failures if f["global_rank"] == 0)
    assert peer["collateral"] is True
    assert peer["error_file"] is None  # it wrote none: no path to a missing file
    # The peer was terminated by the agent after rank 1 failed.
    assert peer["exit_code"] == -signal.SIGTERM, peer

    fin = read_journal(journal)[-1]
    assert fin["kind"] == "run_finished"
    assert fin["outcome"] == "failed" and fin["exit_code"] == 1


def test_raise_without_record_shows_stderr_tail(tuilaunch, tmp_path):
    launch, code, journal = _run_crash(tuilaunch, tmp_path, "--rank", "1", "--mode", "raise")
    assert code == 1, launch.output
    block = _root_cause_block(launch.stderr)
    assert "stderr (last" in block, block
    assert "stderr line 5" in block
    assert "RuntimeError: boom from rank 1" in block
    assert "rank       : 1 (local rank 1)" in block

    root = next(f for f in _attempt_failed(journal)["failures"] if not f["collateral"])
    assert root["global_rank"] == 1
    assert root["traceback"] is None
    # The message is the exception line from the stderr tail, without torch's "[rank1]: ".
    assert root["message"] == "RuntimeError: boom from rank 1", root["message"]
    assert "stderr line 5" in root["stderr_tail"]
    assert len(root["stderr_tail"]) <= 30


@pytest.mark.parametrize(
    ("mode", "sig"),
    [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT), ("kill", signal.SIGKILL)],
)
def test_signal_deaths_named_with_hint(tuilaunch, tmp_path, mode, sig):
    launch, code, journal = _run_crash(
        tuilaunch, tmp_path, "--rank", "1", "--mode", mode, "--after", "0.2"
    )
    # A native crash is the program's (1); a SIGKILL from an unknown sender may be the
    # infrastructure's (75): the exit-code table of docs/restart-policy.md.
    assert code == (75 if sig == signal.SIGKILL else 1), launch.output
    block = _root_cause_block(launch.stderr)
    assert f"exit       : {sig.name} (-{int(sig)})" in block, block
    hint = errors.hint_for(-int(sig))
    assert hint
    # rich may wrap long lines: compare with whitespace collapsed.
    assert " ".join(hint.split()) in " ".join(block.split()), block
    assert "rank       : 1 (local rank 1)" in block

    failures = _attempt_failed(journal)["failures"]
    real = [f for f in failures if not f["collateral"]]
    assert [f["global_rank"] for f in real] == [1], failures
    assert real[0]["exit_code"] == -int(sig)
    assert real[0]["signal"] == sig.name
    assert real[0]["hint"] == hint
    # A signal death is not mistaken for the peer's SIGTERM from the agent.
    assert all(f["collateral"] for f in failures if f["global_rank"] == 0)


def test_exit_code_three(tuilaunch, tmp_path):
    launch, code, journal = _run_crash(
        tuilaunch, tmp_path, "--rank", "0", "--mode", "exit", "--after", "0.2", nproc=1
    )
    assert code == 1, launch.output
    block = _root_cause_block(launch.stderr)
    assert "exit       : exit 3" in block, block
    assert "stderr line 5" in block
    assert "hint" not in block.split("attempt    :")[0]  # no signal hint for a plain exit
    root = _attempt_failed(journal)["failures"]
    assert len(root) == 1
    assert root[0]["exit_code"] == 3 and root[0]["signal"] is None
    assert root[0]["collateral"] is False
