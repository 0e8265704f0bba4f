"""The hang verdict on the corpus's framework programs (issue 25): a Hugging Face ``Trainer``
and a Lightning DDP job, rank 1 stuck inside ``training_step`` (``CORPUS_HANG_*``, see
``tests/corpus/README.md``). The Trainer with no flag (the Flight Recorder, on by default:
the collective-level verdict), Lightning with the stacks alone (``--no-bootstrap``: DDP's
waiting rank sits in ``backward()``). Each
verdict names rank 1 within ``--hang-timeout`` + 30 s of the last output.

And a rank killed mid-step (``CORPUS_KILL_*``) leaves a before-teardown dump of its survivor
that says where it was, with no flag: gloo raises in the survivor within milliseconds, so the
dump shows the traceback the survivor printed (the broken collective, in the program's own
code), never "no Python frame" or the interpreter's exit handlers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import journal_path, journaled_hang, read_journal

from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside

CORPUS = Path(__file__).parent / "corpus"
TIMEOUT = 15.0  # the frameworks print nothing for a while between their own lines


def _hang(launch) -> dict:
    """The one hang: Lightning's own SIGTERM handler moves a rank into a broadcast while the
    group is being stopped, which the watch judged as a second hang (and suspected first)
    before it stopped watching the group it ends."""
    hang = journaled_hang(launch, TIMEOUT, only=True)
    events = read_journal(journal_path(launch.output))
    late = [
        e
        for e in events
        if e["kind"] == "stacks_dumped"
        and e["reason"] == "hang-suspected"
        and e["wall"] > hang["wall"]
    ]
    assert not late, late
    return hang


def _run(tuilaunch, tmp_path, program: str, *extra: str):
    env = {**os.environ, "CORPUS_HANG_RANK": "1", "CORPUS_HANG_STEP": "6"}
    launch = tuilaunch(
        *extra,
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop", "--log-dir", str(tmp_path)),
        *("--standalone", "--nproc-per-node", "2", str(CORPUS / program)),
        env=env,
    )
    assert launch.wait(400) == INFRASTRUCTURE, launch.output[-3000:]
    return launch


def test_trainer_rank_that_never_issued_the_all_reduce(tuilaunch, tmp_path):
    pytest.importorskip("transformers", reason="the corpus needs the test extra")
    launch = _run(tuilaunch, tmp_path, "hf_trainer.py")
    hang = _hang(launch)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert hang["verdict"].startswith("rank 1 never issued all_reduce #"), hang["verdict"]
    assert "wandered_off" in hang["verdict"] and "rank 0 waits in it" in hang["verdict"]


def test_lightning_rank_that_never_issued_the_all_reduce(tuilaunch, tmp_path):
    """Lightning with the defaults: the Flight Recorder's verdict names rank 1 (the stacks'
    verdict, under ``--no-bootstrap``, is the next test)."""
    pytest.importorskip("lightning", reason="the corpus needs the test extra")
    launch = _run(tuilaunch, tmp_path, "lightning_ddp.py")
    hang = _hang(launch)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert hang["verdict"].startswith("rank 1 never issued all_reduce #"), hang["verdict"]
    assert "wandered_off" in hang["verdict"] and "rank 0 waits in it" in hang["verdict"]


def test_lightning_rank_in_training_step_named_from_stacks(tuilaunch, tmp_path):
    pytest.importorskip("lightning", reason="the corpus needs the test extra")
    launch = _run(tuilaunch, tmp_path, "lightning_ddp.py", "--no-bootstrap")
    hang = _hang(launch)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert hang["verdict"].startswith("rank 1 is not in a collective:"), hang["verdict"]
    assert "wandered_off" in hang["verdict"]
    assert "rank 0 waits in backward (DDP's gradient all-reduce)" in hang["verdict"]


@pytest.mark.parametrize(
    ("program", "where"),
    [
        ("nanogpt.py", "backward (DDP's gradient all-reduce) (nanogpt.py:"),  # a raw DDP loop
        ("async_collective.py", "work.wait() at async_collective.py:"),  # its own sync_point
    ],
)
def test_killed_rank_leaves_its_survivor_where_it_was(tuilaunch, tmp_path, program, where):
    env = {**os.environ, "CORPUS_KILL_RANK": "1", "CORPUS_KILL_STEP": "5", "CORPUS_STEPS": "500"}
    launch = tuilaunch(
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        str(CORPUS / program),
        env=env,
    )
    assert launch.wait(300) == INFRASTRUCTURE, launch.output[-3000:]
    events = read_journal(journal_path(launch.output))
    (dump,) = [e for e in events if e["kind"] == "stacks_dumped" and e["reason"] == "before-kill"]
    assert dump["ranks"] == [0], dump
    (failed,) = [e for e in events if e["kind"] == "attempt_failed"]
    cause = next(f for f in failed["failures"] if not f["collateral"])
    assert cause["global_rank"] == 1 and cause["stacks"] == dump["path"], cause
    (peer,) = cause["peers"]
    assert peer.startswith(f"rank 0: {where}"), peer
    assert "where it raised RuntimeError: " in peer and "Connection" in peer, peer
    assert "rank 0: " in launch.stderr and where in launch.stderr
    text = (Path(dump["path"]) / "stacks.txt").read_text()
    assert "traceback on stderr" in text and "rank 0 raised, with the stack above" in text
