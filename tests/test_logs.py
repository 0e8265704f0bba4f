"""Lossless logs: every rank's output lands in per-rank files whatever the console shows.

``--local-ranks-filter``, ``--tee`` and ``--redirects`` keep their torchrun meaning for the
console (the launcher's stdout); the files under the attempt directory always hold every line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import WORKERS, journal_path, read_journal, wait_for

from tui_launch.core.launch.args import torch_option_strings

CHATTY = str(WORKERS / "chatty.py")
LINES = 20000


def _expected(rank: int) -> list[str]:
    out = []
    for i in range(LINES):
        head = f"rank {rank} line {i:06d} "
        out.append(head + "x" * (99 - len(head)))
    out.append(f"DONE rank {rank}")
    return out


def _started(journal: Path) -> dict:
    started = [e for e in read_journal(journal) if e["kind"] == "workers_started"]
    assert len(started) == 1
    return started[0]


def _rank_file(started: dict, local_rank: int, stream: str = "stdout") -> Path:
    return Path(started["log_dir"]) / str(local_rank) / f"{stream}.log"


def _console_worker_lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if "rank " in ln and (" line " in ln or "DONE" in ln)]


def test_filtered_console_but_files_hold_every_line(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--local-ranks-filter",
        "0",
        "--journal",
        str(journal),
        CHATTY,
        "--lines",
        str(LINES),
    )

    # The test does not read the launcher's stdout yet: ~2 MB of rank 0's console output sits
    # behind a 64 KiB pipe. The workers write to files, so they still finish.
    def both_exited():
        if not journal.exists():
            return False
        codes = [e["exit_code"] for e in read_journal(journal) if e["kind"] == "rank_exited"]
        return len(codes) == 2 and codes

    codes = wait_for(both_exited, 90, what="both workers exited with the console unread")
    assert codes == [0, 0]

    assert launch.wait(90) == 0, launch.stderr[-4000:]
    started = _started(journal)
    for lr in (0, 1):
        lines = _rank_file(started, lr).read_text().splitlines()
        assert lines == _expected(lr), f"rank {lr}: {len(lines)} lines in its file"

    # Console: rank 0 only, unprefixed (not tee'd), all of it, in order.
    console = _console_worker_lines(launch.stdout)
    assert console == _expected(0), f"{len(console)} console lines"
    assert "rank 1 line" not in launch.stdout
    assert "[default" not in launch.stdout

    # The agent's own torch log lines are captured next to the attempt directories.
    run_dir = Path(started["log_dir"]).parent
    agent_log = run_dir / "agent.log"
    assert agent_log.is_file()
    assert agent_log.stat().st_size > 0
    assert "torch.distributed" in agent_log.read_text()
    assert f"logs: {run_dir}" in launch.stderr


def test_tee_prefixes_console_lines(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--tee",
        "3",
        "--journal",
        str(journal),
        CHATTY,
        "--lines",
        str(LINES),
    )
    assert launch.wait(90) == 0, launch.stderr[-4000:]
    started = _started(journal)
    for lr in (0, 1):
        assert _rank_file(started, lr).read_text().splitlines() == _expected(lr)
        shown = [
            ln[len(f"[default{lr}]:") :]
            for ln in launch.stdout.splitlines()
            if ln.startswith(f"[default{lr}]:")
        ]
        assert shown == _expected(lr), f"rank {lr}: {len(shown)} prefixed console lines"
    # Every worker line on the console carries the prefix.
    assert all(ln.startswith("[default") for ln in _console_worker_lines(launch.stdout))


def test_redirects_hide_console_and_log_dir_holds_files(tuilaunch, tmp_path):
    log_dir = tmp_path / "logs"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--redirects",
        "3",
        "--log-dir",
        str(log_dir),
        CHATTY,
        "--lines",
        str(LINES),
    )
    assert launch.wait(90) == 0, launch.stderr[-4000:]
    # Without --journal, the journal lives in the run's log directory.
    journals = list(log_dir.glob("*/journal.jsonl"))
    assert len(journals) == 1, journals
    journal = journals[0]
    assert _console_worker_lines(launch.stdout) == []
    assert "line 0" not in launch.stderr
    started = _started(journal)
    attempt_dir = Path(started["log_dir"])
    assert attempt_dir.is_relative_to(log_dir), attempt_dir
    assert attempt_dir.name == "attempt_0"
    for lr in (0, 1):
        path = _rank_file(started, lr)
        assert path.is_relative_to(log_dir)
        assert path.read_text().splitlines() == _expected(lr)
        assert _rank_file(started, lr, "stderr").exists()
    run_dir = attempt_dir.parent
    assert journal == run_dir / "journal.jsonl"
    assert read_journal(journal)[-1]["kind"] == "run_finished"
    assert (run_dir / "agent.log").stat().st_size > 0
    # Everything is found by walking the directory the user asked for.
    found = sorted(
        os.path.relpath(os.path.join(d, f), run_dir)
        for d, _, files in os.walk(log_dir)
        for f in files
        if f == "stdout.log"
    )
    assert found == ["attempt_0/0/stdout.log", "attempt_0/1/stdout.log"]


def test_summary_prints_long_paths_on_one_line(tuilaunch, tmp_path):
    log_dir = tmp_path / ("long_directory_name_" * 4) / "logs"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "1",
        "--redirects",
        "3",
        "--log-dir",
        str(log_dir),
        CHATTY,
        "--lines",
        "1",
    )
    assert launch.wait(90) == 0, launch.stderr[-4000:]
    journals = list(log_dir.glob("*/journal.jsonl"))
    assert len(journals) == 1
    assert len(str(journals[0])) > 120
    assert f"logs: {journals[0].parent}\n" in launch.stderr
    assert journal_path(launch.stderr) == journals[0]


FRUIT = str(WORKERS / "fruit.py")


def _filtered(log_dir: Path) -> dict[str, dict[str, list[str]]]:
    """The ``filtered_std*.log`` lines of the one attempt under ``log_dir``, by stream, then
    by prefix (``[default0]:``): ranks interleave differently from run to run, each rank's
    lines keep their order."""
    out: dict[str, dict[str, list[str]]] = {}
    for stream in ("stdout", "stderr"):
        (path,) = log_dir.glob(f"*/attempt_0/filtered_{stream}.log")
        by_rank: dict[str, list[str]] = {}
        for line in path.read_text().splitlines():
            prefix, _, text = line.partition(":")
            by_rank.setdefault(prefix, []).append(text)
        out[stream] = by_rank
    return out


@pytest.mark.skipif(
    "--duplicate-stdout-filters" not in torch_option_strings(),
    reason="this torch has no --duplicate-*-filters (added in torch 2.8)",
)
def test_duplicate_filters_write_what_torchrun_writes(tuilaunch, torchrun, tmp_path):
    """``--duplicate-stdout/stderr-filters`` (torch's tee threads, replaced by tuilaunch's
    DuplicateFilter sink): the filtered files hold exactly the lines torchrun puts there,
    with the same prefixes; the per-rank files still hold every line."""
    opts = [
        *("--standalone", "--nproc-per-node", "2", "--tee", "3"),
        *("--duplicate-stdout-filters", "apple,orange", "--duplicate-stderr-filters", "pear"),
    ]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    t = torchrun(*opts, "--log-dir", str(theirs), FRUIT)
    assert t.wait() == 0, t.stderr[-3000:]
    u = tuilaunch(*opts, "--log-dir", str(ours), FRUIT)
    assert u.wait() == 0, u.stderr[-3000:]
    expected = {
        "stdout": {
            f"[default{r}]": [f"apple {r}", f"an orange for rank {r}", f"apple pie {r}"]
            for r in (0, 1)
        },
        "stderr": {f"[default{r}]": [f"pear {r}", f"pear tree {r}"] for r in (0, 1)},
    }
    assert _filtered(theirs) == expected  # what torchrun does, as this test understands it
    assert _filtered(ours) == _filtered(theirs)
    for r in (0, 1):
        (out,) = ours.glob(f"*/attempt_0/{r}/stdout.log")
        assert "banana" in out.read_text() and "kiwi" in out.read_text()
