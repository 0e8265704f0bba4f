"""The restart policy over its labelled corpus (``tests/policy_corpus/``): no false stops.

Every sequence is a real program's failed attempts, captured from real ``tuilaunch`` launches
(``tests/policy_corpus/capture.py``), fed here to the same classification, record and policy
a live run uses. A transient failure must never be stopped (the job would have finished);
a deterministic bug must be stopped, except where its evidence proves nothing (an exit code
or a signal without a traceback, no step seen): those the policy restarts as torchrun does,
and ``bench/README.md`` counts them. The slow tests launch a few of the programs for real.
"""

from __future__ import annotations

import pytest
from conftest import ROOT, read_journal
from policy_corpus.evaluate import load, replay
from policy_corpus.sequences import SEQUENCES, Sequence


def test_the_corpus_is_labelled_both_ways():
    assert len(SEQUENCES) >= 60
    assert len({s.id for s in SEQUENCES}) == len(SEQUENCES)
    assert {s.expect for s in SEQUENCES} == {"stop", "retry"}
    for label in ("stop", "retry"):
        assert sum(s.expect == label for s in SEQUENCES) >= 25


@pytest.mark.parametrize("seq", SEQUENCES, ids=lambda s: s.id)
def test_the_label_is_what_the_program_did(seq: Sequence):
    # The truth of each label, from the capture (torchrun's policy: every attempt ran): a
    # transient failure finished once restarted; a deterministic bug failed every attempt
    # (or stopped at once: a startup error torchrun's policy would retry the same way).
    cap = load(seq)
    attempts = cap["attempts"]
    assert attempts, cap["stderr_tail"]
    if seq.expect == "retry":
        assert (cap["outcome"], cap["exit_code"]) == ("succeeded", 0), cap["stderr_tail"]
    else:
        assert cap["outcome"] == "failed", cap["stderr_tail"]
        assert len(attempts) == seq.max_restarts + 1


@pytest.mark.parametrize("seq", SEQUENCES, ids=lambda s: s.id)
def test_the_policy_decides_as_labelled(seq: Sequence):
    r = replay(seq)
    said = [(d.action, d.rule, d.reason) for d in r.decisions]
    if seq.expect == "retry":
        assert r.stopped_at is None, f"false stop: {said}"
    elif seq.missed:
        assert r.stopped_at is None, f"proved a stop where the corpus says it cannot: {said}"
    else:
        # A startup error stops at once (a missing file when it is missing again); the same
        # exception at the same step stops once two attempts in a row show it.
        assert r.stopped_at is not None, f"missed stop: {said}"
        assert r.stopped_at < seq.max_restarts, said


def test_the_torchrun_policy_never_stops_early():
    assert all(replay(s, "torchrun").stopped_at is None for s in SEQUENCES)


@pytest.mark.slow
@pytest.mark.parametrize("seq_id", ["race-steps", "missing-then-written", "raise-resume"])
def test_real_launches_decide_as_the_corpus_says(tuilaunch, tmp_path, seq_id):
    # The default policy, live: a data race twice at the same line and a file another process
    # writes late finish; the same exception at the same step stops before the budget is spent.
    seq = next(s for s in SEQUENCES if s.id == seq_id)
    args = [
        a.replace("{tmp}", str(tmp_path)).replace("{ckpt}", f"{tmp_path}/ckpt") for a in seq.args
    ]
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone", "--nproc-per-node", "2", "--max-restarts", str(seq.max_restarts),
        "--journal", str(journal), str(ROOT / seq.program), *args,
    )  # fmt: skip
    code = launch.wait(180)
    decisions = [e for e in read_journal(journal) if e["kind"] == "policy_decision"]
    if seq.expect == "retry":
        assert code == 0, launch.output[-4000:]
        assert decisions and all(d["action"] == "restart" for d in decisions), decisions
    else:
        assert code == 1, launch.output[-4000:]
        # At the second attempt, or the third where the failed rank's step was read
        # differently in the first (resumed from a checkpoint, its step lines come fast).
        said = [(d["action"], d["rule"]) for d in decisions]
        assert said[-1] == ("stop", "same-failure"), said
        assert all(d == ("restart", "restart") for d in said[:-1]), said
        assert decisions[-1]["saved"] >= 1, decisions
