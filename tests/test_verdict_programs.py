"""The hang verdict on programs written the way people write them (issue 25).

Real gloo workers on CPU through the real ``tuilaunch`` command: a plain DDP loop (whose
waiting ranks sit in ``loss.backward()`` while autograd's threads wait in the reducer), a rank
SIGSTOPped in that loop, asynchronous ``all_reduce(async_op=True)`` waited for in the program's
own ``sync_point()``, ranks that disagree on the collective, and a healthy run. Each hang's
verdict must name the rank the others wait for (or the mismatch), never a waiting rank, within
``--hang-timeout`` + 30 s of the last output.

These are the stacks' verdicts: the runs use ``--no-bootstrap`` (torchrun's worker, no Flight
Recorder), so that what py-spy's stacks alone can tell stays tested; the Flight Recorder's
collective-level verdicts on the same programs, the default, are in ``tests/test_flightrec.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import journal_path, journaled_hang, read_journal

from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside

PROGRAMS = Path(__file__).parent / "programs"
DDP_LOOP = str(PROGRAMS / "ddp_loop.py")
ASYNC = str(PROGRAMS / "async_sync.py")
MISMATCH = str(PROGRAMS / "mismatch.py")
BUFFERS = str(PROGRAMS / "ddp_buffers.py")
TIMEOUT = 4.0


def _cause(launch) -> dict:
    events = read_journal(journal_path(launch.output))
    (failed,) = [e for e in events if e["kind"] == "attempt_failed"]
    return next(f for f in failed["failures"] if not f["collateral"])


def _hung_run(tuilaunch, tmp_path, nproc: int, *program: str):
    launch = tuilaunch(
        "--no-bootstrap",
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--log-dir", str(tmp_path)),
        *("--standalone", "--nproc-per-node", str(nproc), *program),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    return launch


def test_ddp_loop_rank_in_its_own_code_is_named(tuilaunch, tmp_path):
    launch = _hung_run(tuilaunch, tmp_path, 2, DDP_LOOP, "--wander-rank", "1", "--seconds", "200")
    hang = journaled_hang(launch, TIMEOUT)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert "wandered_off" in hang["verdict"] and "rank 0 waits in backward" in hang["verdict"]
    assert _cause(launch)["global_rank"] == 1
    # The confirming dump read the C++ each main thread is in: rank 0 in DDP's reducer (the
    # end of backward waits for its all-reduce), rank 1 in the sleep of wandered_off.
    saved = json.loads((Path(hang["second_path"]) / "stacks.json").read_text())
    native = {
        r["global_rank"]: [f["function"] for f in r["process"]["threads"][0]["native"]]
        for r in saved["dump"]["ranks"]
    }
    assert "c10d::Reducer::finalize_backward" in native[0], native
    assert any("sleep" in f for f in native[1]), native
    text = (Path(hang["second_path"]) / "stacks.txt").read_text()
    assert "    [C/C++] " in text, text


def test_ddp_loop_stopped_rank_is_named(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--log-dir", str(tmp_path)),
        # Late enough that rank 1 is training, not still importing torch, on a loaded machine.
        *("--inject", "hang:rank=1,after=40s", "--standalone", "--nproc-per-node", "2"),
        *(DDP_LOOP, "--seconds", "150"),
    )
    assert launch.wait(200) == INFRASTRUCTURE, launch.output[-3000:]
    assert "rank 1 step 3" in launch.output, launch.output[-3000:]
    hang = journaled_hang(launch, TIMEOUT)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert "rank 1 is not in a collective: stopped" in hang["verdict"], hang["verdict"]
    assert _cause(launch)["global_rank"] == 1


def test_ddp_buffer_broadcast_is_a_wait_and_the_sleeper_is_named(tuilaunch, tmp_path):
    # Rank 0 sits in the forward's buffer broadcast (BatchNorm's running stats), whose
    # innermost Python frame calls the native dist._broadcast_coalesced.
    launch = _hung_run(tuilaunch, tmp_path, 2, BUFFERS, "--sleep-rank", "1", "--seconds", "200")
    hang = journaled_hang(launch, TIMEOUT)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert hang["verdict"] == (
        "rank 1 is not in a collective: ddp_buffers.py:29 in asleep; "
        "rank 0 waits in DDP's buffer broadcast"
    ), hang["verdict"]
    assert _cause(launch)["global_rank"] == 1


def test_ddp_buffer_broadcast_kill_of_the_sleeper_is_the_root_cause(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--inject", "kill:rank=1,after=40s", "--log-dir", str(tmp_path), "--standalone"),
        *("--nproc-per-node", "2", BUFFERS, "--sleep-rank", "1", "--seconds", "200"),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    assert "rank 0 step 4 " in launch.output, launch.output[-3000:]
    cause = _cause(launch)
    assert cause["global_rank"] == 1 and cause["signal"] == "SIGKILL", cause
    # The survivor was waiting for it in the buffer broadcast when gloo broke.
    (peer,) = [p for p in cause["peers"] if p.startswith("rank 0")]
    assert "rank 0: DDP's buffer broadcast (ddp_buffers.py:" in peer, peer


def test_async_wait_in_own_code_is_a_wait(tuilaunch, tmp_path):
    launch = _hung_run(tuilaunch, tmp_path, 2, ASYNC, "--wander-rank", "1", "--seconds", "200")
    hang = journaled_hang(launch, TIMEOUT)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert "wandered_off" in hang["verdict"], hang["verdict"]
    assert "rank 0 waits in work.wait() at async_sync.py:" in hang["verdict"], hang["verdict"]
    assert "in sync_point" in hang["verdict"]
    assert _cause(launch)["global_rank"] == 1


def test_mismatched_collectives_name_the_odd_rank(tuilaunch, tmp_path):
    launch = _hung_run(tuilaunch, tmp_path, 3, MISMATCH, "--odd", "2", "--seconds", "200")
    hang = journaled_hang(launch, TIMEOUT)
    assert hang["odd_ranks"] == [2], hang["verdict"]
    assert "all_gather" in hang["verdict"] and "all_reduce" in hang["verdict"]
    assert _cause(launch)["global_rank"] == 2


def test_healthy_ddp_loop_gets_no_verdict(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--log-dir", str(tmp_path)),
        *("--standalone", "--nproc-per-node", "2", DDP_LOOP, "--steps", "60"),
        *("--seconds", "200"),
    )
    assert launch.wait(260) == 0, launch.output[-3000:]
    events = read_journal(journal_path(launch.output))
    assert not [e for e in events if e["kind"] == "hang"]
    assert "rank 1 step 59" in launch.stdout
