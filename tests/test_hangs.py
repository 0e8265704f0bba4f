"""Hangs, end to end (issue 14): real gloo workers on CPU, the real tuilaunch command.

rank 1 of ``workers/hang.py`` stops calling collectives and waits in ``load_batch`` while rank
0 blocks in ``all_reduce``: with a short ``--hang-timeout`` the hang is found, confirmed by a
second dump, journaled with both dumps' paths, and ``--on-hang`` acts on it. A silent job whose
stacks move is not a hang; a killed rank's peer is dumped before torch terminates it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import WORKERS, journal_path, read_journal

from tui_launch.core.diagnosis.dumps import Dumper
from tui_launch.core.model.events import ControlAction, StacksDumped
from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside
from tui_launch.core.workers.table import RankTable

HANG = str(WORKERS / "hang.py")
QUIET = str(WORKERS / "quiet.py")
STEADY = str(WORKERS / "steady.py")
TICKER = str(WORKERS / "ticker.py")
TIMEOUT = 4.0  # --hang-timeout in these tests; the confirmation window is then 4 s too


def _journal(launch) -> list[dict]:
    return read_journal(journal_path(launch.output))


def _kind(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


def _hang_kinds(events: list[dict]) -> list[str]:
    """Confirmed hangs and their ends (a suspicion's own cleared event left out)."""
    return [
        e["kind"]
        for e in events
        if e["kind"] == "hang" or (e["kind"] == "hang_cleared" and not e.get("suspected"))
    ]


def _hang_cleared(events: list[dict]) -> list[dict]:
    return [e for e in _kind(events, "hang_cleared") if not e.get("suspected")]


def test_hang_found_confirmed_and_stopped(tuilaunch, tmp_path):
    # --no-bootstrap: the stacks' verdict (the Flight Recorder's is tests/test_flightrec.py's).
    launch = tuilaunch(
        "--no-bootstrap",
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--log-dir", str(tmp_path)),
        *("--standalone", "--nproc-per-node", "2", HANG, "--seconds", "90"),
    )
    assert launch.wait(120) == INFRASTRUCTURE, launch.output
    events = _journal(launch)
    (hang,) = _kind(events, "hang")
    # Found within the timeout plus the confirmation window (counted from the last output).
    assert TIMEOUT <= hang["silence"] <= TIMEOUT + 4.0 + 2.0, hang
    assert hang["action"] == "stop" and hang["still_ranks"] == [0, 1]
    assert hang["verdict"].startswith("rank 1 is not in a collective: hang.py:")
    assert "in load_batch" in hang["verdict"] and "rank 0 waits in all_reduce" in hang["verdict"]
    assert hang["odd_ranks"] == [1]
    # Both dumps are in the run directory and the journal points to them.
    for path in (hang["first_path"], hang["second_path"]):
        text = (Path(path) / "stacks.txt").read_text()
        assert "load_batch" in text and "all_reduce" in text
        data = json.loads((Path(path) / "stacks.json").read_text())
        assert sorted(r["global_rank"] for r in data["dump"]["ranks"]) == [0, 1]
    dumped = {e["path"] for e in _kind(events, "stacks_dumped")}
    assert {hang["first_path"], hang["second_path"]} <= dumped
    # The hang is the root cause, in the journal and in the summary.
    (failed,) = _kind(events, "attempt_failed")
    (cause,) = failed["failures"]
    assert cause["hung"] and cause["global_rank"] == 1 and cause["stacks"] == hang["second_path"]
    assert "run failed (exit code 75): rank 1 (local 1, pid" in launch.stderr
    assert "hung: rank 1 is not in a collective" in launch.stderr
    # The exit it really had (torch's SIGTERM), not the 0 of a process still running.
    assert cause["exit_code"] == -15 and cause["signal"] == "SIGTERM", cause
    assert (
        "exit       : SIGTERM (-15)" in launch.stderr
        and ": hung, ended by tuilaunch" in launch.stderr
    )
    # Headless printed each distinct stack once per dump, with the verdict.
    assert "rank 1, main thread (innermost first):" in launch.stderr


def test_hang_restart_spends_the_budget_and_recovers(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "restart", "--max-restarts", "1"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(HANG, "--seconds", "90", "--hang-attempts", "1"),
    )
    assert launch.wait(150) == 0, launch.output
    events = _journal(launch)
    assert [h["attempt"] for h in _kind(events, "hang")] == [0]
    (restart,) = _kind(events, "restart")
    assert restart["cause"] == "failure" and restart["budget_left"] == 0
    assert restart["to_attempt"] == 1
    assert _kind(events, "run_finished")[0]["outcome"] == "succeeded"
    assert "rank 0 done" in launch.stdout and "rank 1 done" in launch.stdout


def test_stopped_rank_gets_a_stack(tuilaunch, tmp_path):
    # --inject hang SIGSTOPs rank 1: rank 0 then blocks in all_reduce, nobody prints.
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--log-dir", str(tmp_path)),
        *("--inject", "hang:rank=1,after=3s", "--standalone", "--nproc-per-node", "2"),
        *(STEADY, "--seconds", "60"),
    )
    assert launch.wait(120) == INFRASTRUCTURE, launch.output
    (hang,) = _kind(_journal(launch), "hang")
    data = json.loads((Path(hang["second_path"]) / "stacks.json").read_text())
    ranks = {r["global_rank"]: r for r in data["dump"]["ranks"]}
    stopped = ranks[1]["process"]
    assert stopped["state"] in ("T", "t") and stopped["method"] == "py-spy --nonblocking"
    assert stopped["threads"] and stopped["threads"][0]["frames"], stopped
    assert "rank 0 waits in" in hang["verdict"] or "every rank" in hang["verdict"]


def test_silent_job_that_moves_is_not_hung(tuilaunch, tmp_path):
    # Silent for 3x the timeout, but its stack moves: suspected, never confirmed.
    launch = tuilaunch(
        *("--hang-timeout", "2", "--on-hang", "stop", "--log-dir", str(tmp_path)),
        *("--standalone", "--nproc-per-node", "1", QUIET, "--seconds", "9"),
    )
    assert launch.wait(120) == 0, launch.output
    events = _journal(launch)
    assert not _kind(events, "hang")
    reasons = [e["reason"] for e in _kind(events, "stacks_dumped")]
    assert "hang-suspected" in reasons and "hang-confirm" in reasons, reasons


def test_killed_rank_dumps_its_peer_first(tuilaunch, tmp_path):
    # ticker.py: no collective, so rank 0 outlives rank 1 (a gloo peer blocked in a collective
    # fails within milliseconds of its peer's death, before the monitor's next look; an NCCL
    # peer would wait, as this one does).
    launch = tuilaunch(
        *("--log-dir", str(tmp_path), "--inject", "kill:rank=1,after=2s"),
        *("--standalone", "--nproc-per-node", "2", TICKER, "--ticks", "600"),
    )
    assert launch.wait(120) == INFRASTRUCTURE, launch.output
    events = _journal(launch)
    (dump,) = _kind(events, "stacks_dumped")
    assert dump["reason"] == "before-kill" and dump["ranks"] == [0]
    assert dump["duration"] < 1.0
    (failed,) = _kind(events, "attempt_failed")
    cause = next(f for f in failed["failures"] if not f["collateral"])
    assert cause["global_rank"] == 1 and cause["stacks"] == dump["path"]
    assert cause["peers"] and cause["peers"][0].startswith("rank 0: ")
    assert "ticker.py" in cause["peers"][0]
    assert "other ranks, before torch terminated them:" in launch.stderr
    assert Path(dump["path"], "stacks.txt").exists()


def test_no_dump_on_failure_turns_it_off(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--log-dir", str(tmp_path), "--inject", "kill:rank=1,after=2s"),
        "--no-dump-on-failure",
        *("--standalone", "--nproc-per-node", "2", TICKER, "--ticks", "600"),
    )
    assert launch.wait(120) == INFRASTRUCTURE, launch.output
    events = _journal(launch)
    assert not _kind(events, "stacks_dumped")
    assert not _kind(events, "attempt_failed")[0]["failures"][0]["stacks"]


def test_dump_via_faulthandler(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--dump-via-faulthandler"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(HANG, "--seconds", "90"),
    )
    assert launch.wait(120) == INFRASTRUCTURE, launch.output
    events = _journal(launch)
    (hang,) = _kind(events, "hang")
    # The Flight Recorder's verdict (the default), with where rank 1 is from faulthandler.
    assert hang["verdict"].startswith("rank 1 never issued all_reduce #"), hang["verdict"]
    assert "load_batch" in hang["verdict"], hang["verdict"]
    # The hang's dumps by faulthandler (a dump before the kill may read the recorder's last
    # answers of ranks already gone instead).
    dumps = {e["path"]: e["method"] for e in _kind(events, "stacks_dumped")}
    assert dumps[hang["first_path"]] == dumps[hang["second_path"]] == "faulthandler", dumps
    assert set(dumps.values()) <= {"faulthandler", "responder"}, dumps


def test_pyspy_that_fails_says_why_in_one_line(tmp_path):
    # A py-spy that fails as a ptrace refusal does: the dump says so once, with the fix.
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(0o755)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ranks = RankTable()
        ranks.begin_attempt({0: sleeper.pid}, {0: 0}, 1)
        posted: list[object] = []
        dumper = Dumper(posted.append, ranks, lambda: str(tmp_path), dict, pyspy=str(fake))
        taken = dumper.take("key", "dashboard")
        assert taken is not None
        (event,) = [e for e in posted if isinstance(e, StacksDumped)]
        assert event.note.startswith("py-spy cannot attach"), event.note
        assert "\n" not in event.note
        assert event.verdict.startswith("no stacks: py-spy cannot attach")
        assert os.path.isfile(os.path.join(event.path, "stacks.txt"))
        assert dumper.load(event.path) == taken.dump
    finally:
        sleeper.kill()
        sleeper.wait()
    # No live rank: refused with a ControlAction, nothing written.
    posted.clear()
    assert dumper.take("key", "dashboard") is None
    (refused,) = posted
    assert isinstance(refused, ControlAction) and not refused.ok
    assert refused.detail == "no running worker"
    assert time.monotonic() > 0


def test_bad_hang_options_are_one_line_and_exit_2(capsys) -> None:
    import pytest

    from tui_launch.core.launch.args import parse

    for argv, message in (
        (["--hang-timeout", "-1"], "--hang-timeout must be a finite number of seconds >= 0"),
        (["--on-hang", "explode"], "argument --on-hang: invalid choice: 'explode'"),
        (
            ["--hang-timeout", "soon"],
            "argument --hang-timeout: expected auto, 0 (off) or a number of seconds, got 'soon'",
        ),
    ):
        with pytest.raises(SystemExit) as exc:
            parse([*argv, HANG])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    args, opts = parse(["--hang-timeout", "0", "--on-hang", "restart", HANG])
    assert opts.hang_timeout == 0 and opts.on_hang == "restart" and not opts.no_dump_on_failure
    assert not hasattr(args, "tl_hang_timeout")  # none of ours reaches torch
    # The adaptive rule is the default, and "auto" names it (any case).
    assert parse([HANG])[1].hang_timeout == "auto"
    assert parse(["--hang-timeout", "AUTO", HANG])[1].hang_timeout == "auto"
    assert parse(["--hang-timeout", "300", HANG])[1].hang_timeout == 300.0


def _replayed(events: list[dict]):
    from tui_launch.core.model.events import from_dict
    from tui_launch.core.model.store import replay

    return replay(from_dict(e) for e in events)


def test_hung_flag_clears_when_output_resumes(tuilaunch, tmp_path):
    # Rank 1 waits in load_batch for 12 s, then prints and the job ends: the hang is
    # confirmed at about 6 s (timeout 3 + window 3), the watch's quiet look at 9 s finds
    # nothing moved, and rank 1's output at 12 s ends it: HUNG? goes before the attempt does.
    launch = tuilaunch(
        *("--hang-timeout", "3", "--log-dir", str(tmp_path), "--standalone"),
        *("--nproc-per-node", "2", HANG, "--seconds", "90", "--resume-after", "12"),
    )
    assert launch.wait(120) == 0, launch.output
    events = _journal(launch)
    kinds = _hang_kinds(events)
    assert kinds[:2] == ["hang", "hang_cleared"], kinds
    cleared = _hang_cleared(events)[0]
    assert cleared["why"] == "output" and cleared["ranks"] == [1] and cleared["attempt"] == 0
    assert _replayed(events).hung_ranks == ()
    # The first rank whose output the watch sees: rank 1's line, or rank 0's after it.
    assert "hang over (attempt 0, ranks 1): rank " in launch.stderr
    assert cleared["detail"].endswith("wrote output again")


def test_hung_flag_clears_when_the_stacks_move(tuilaunch, tmp_path):
    # Rank 1 leaves load_batch 14 s after "ready" for another silent function: no output, but
    # the watch's quiet look (every --hang-timeout seconds while hung) sees its stack moved.
    # (At 8 s, a loaded 2-core machine once took the rest of them to confirm it: no verdict.)
    launch = tuilaunch(
        *("--hang-timeout", "3", "--log-dir", str(tmp_path), "--standalone"),
        *("--nproc-per-node", "2", HANG, "--seconds", "90"),
        *("--resume-after", "14", "--quiet-for", "8"),
    )
    assert launch.wait(120) == 0, launch.output
    events = _journal(launch)
    kinds = _hang_kinds(events)
    assert kinds[:2] == ["hang", "hang_cleared"] and kinds[-1] == "hang_cleared", kinds
    first = _hang_cleared(events)[0]
    assert first["why"] == "stacks" and first["ranks"] == [1], first
    assert "moved" in first["detail"]
    assert _replayed(events).hung_ranks == ()


def test_faulthandler_with_no_python_is_refused(tuilaunch, tmp_path):
    # --no-python runs a plain program: nothing could register faulthandler, and falling back
    # to py-spy silently would hide that the dumps need ptrace after all.
    launch = tuilaunch(
        *("--dump-via-faulthandler", "--no-python", "--standalone", "--nproc-per-node", "1"),
        *("--log-dir", str(tmp_path), "true"),
    )
    assert launch.wait(60) == 2, launch.output
    err = launch.stderr.strip()
    assert err.startswith("tuilaunch: error: --dump-via-faulthandler needs a Python worker")
    assert "--no-python runs true as a plain program" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # refused before anything started
