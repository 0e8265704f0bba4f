"""Failure classes on real GPU failure text (``tests/gpu_failures/``).

Every excerpt is error output a person posted in a public issue thread (NCCL watchdog
timeouts, NCCL's CUDA, system and remote errors, segfaults in libnccl, ProcessGroupNCCL
aborts, CUDA out of memory, illegal memory accesses, device-side asserts, cuBLAS and cuDNN
errors, uncorrectable ECC errors, DataLoader worker deaths, a dead peer's connection reset),
with its source and the class a person would give it. Each goes the live run's way: the
rank's stderr log read by failure collection, classified, made the attempt's record and
decided by the restart policy, once and then again as the same failure on the next attempt.
"""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import WORKERS, read_journal
from gpu_failures.corpus import HERE, Excerpt, excerpts, replay

from tui_launch.core.model import exitcodes, failclass, policy

EXCERPTS = excerpts()
WORKER = WORKERS / "gpu_excerpt.py"


def test_the_corpus_covers_the_gpu_failure_kinds():
    assert len(EXCERPTS) >= 40
    assert len({e.url for e in EXCERPTS}) == len(EXCERPTS)  # one excerpt per thread
    kinds = Counter(e.kind for e in EXCERPTS)
    for kind in (
        "nccl-timeout",
        "nccl-cuda-error",
        "nccl-remote",
        "nccl-system-error",
        "nccl-segfault",
        "pg-abort",
        "cuda-oom",
        "illegal-memory-access",
        "device-assert",
        "cublas",
        "cudnn",
        "ecc",
        "dataloader",
        "conn-reset",
    ):
        assert kinds[kind] >= 1, kind
    for e in EXCERPTS:
        assert e.url.startswith("https://github.com/" + e.repo + "/"), e.name
        assert e.cls in failclass.CLASSES, e.name
        assert e.text.strip(), e.name


@pytest.mark.parametrize("ex", EXCERPTS, ids=lambda e: e.name)
def test_each_excerpt_gets_the_class_and_decisions_a_person_would_give(ex: Excerpt):
    r = replay(ex)
    assert r.failure.failure_class == ex.cls, (r.failure.failure_detail, ex.why)
    assert (r.first, r.repeat) == (ex.first, ex.repeat), ex.why


def test_a_gpu_fault_exits_as_infrastructure_and_stops_when_it_repeats():
    # A GPU that faulted twice in a row is not coming back on this node: stop, and tell the
    # scheduler (75) to run the job elsewhere rather than fail it as the program's fault (1).
    gpu = [e for e in EXCERPTS if e.cls == failclass.GPU_FAULT]
    assert len(gpu) >= 5
    for e in gpu:
        assert exitcodes.exit_code("failed", e.cls, 1, "tuilaunch") == exitcodes.INFRASTRUCTURE
        assert (e.first, e.repeat) == ("restart", "stop gpu-fault")
    assert policy.rule_of(failclass.GPU_FAULT) == "gpu-fault"
    # torchrun's policy restarts it until the budget is spent, as torchrun does.
    tr = policy.RestartPolicy(policy.PolicyConfig("torchrun"))
    rec = policy.AttemptRecord(
        attempt=0, time=0.0, cls=failclass.GPU_FAULT, signature="", step=None
    )
    assert tr.decide(rec, 3).action == tr.decide(rec, 2).action == "restart"


def _kind(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "cls", "code", "decisions"),
    [
        # A GPU that faults again after a restart: stopped after the second attempt, exit 75.
        ("ecc-jade-hpc-194", "gpu-fault", 75, [("restart", "restart"), ("stop", "gpu-fault")]),
        # A segfault in libnccl (SIGSEGV): NCCL's, restarted until the budget is spent.
        (
            "nccl-segfault-nccl-1050",
            "backend",
            75,
            [("restart", "restart"), ("restart", "restart"), ("stop", "budget")],
        ),
    ],
)
def test_a_real_launch_classifies_a_posted_excerpt_as_the_corpus_does(
    tuilaunch, tmp_path, name, cls, code, decisions
):
    journal = tmp_path / "j.jsonl"
    ex = HERE / f"{name}.txt"
    args = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "2"]
    launch = tuilaunch(*args, "--journal", str(journal), str(WORKER), str(ex))
    assert launch.wait(120) == code, launch.output[-4000:]
    events = read_journal(journal)
    assert [(d["action"], d["rule"]) for d in _kind(events, "policy_decision")] == decisions
    fin = events[-1]
    assert fin["kind"] == "run_finished" and fin["failure_class"] == cls
    assert fin["meaning"] == "infrastructure"


@pytest.mark.slow
def test_a_gpu_fault_under_torchruns_policy_and_exit_codes_spends_the_budget_and_exits_1(
    tuilaunch, tmp_path
):
    journal = tmp_path / "j.jsonl"
    ex = HERE / "ecc-jade-hpc-194.txt"
    launch = tuilaunch(
        *["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"],
        *["--restart-policy", "torchrun", "--exit-codes", "torchrun"],
        *["--journal", str(journal), str(WORKER), str(ex)],
    )
    assert launch.wait(120) == 1, launch.output[-4000:]
    events = read_journal(journal)
    assert [d["rule"] for d in _kind(events, "policy_decision")] == ["torchrun", "budget"]
    assert events[-1]["failure_class"] == "gpu-fault"
