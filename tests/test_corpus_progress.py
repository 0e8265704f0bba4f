"""Progress from the corpus's real programs (tests/corpus), with no change to them.

Each program runs under ``tuilaunch --no-tui --standalone --nproc-per-node 2`` as written:
Lightning with its default bar (rich's, since rich imports next to tuilaunch), the Hugging Face
Trainer's tqdm bar, nanoGPT's ``iter`` lines, the PyTorch DDP tutorial's epoch lines and a
``step N/T`` log. The journal must hold a progress record taken while the program was training
(a step short of the last one, with our rate, and an ETA where the run states its total), the
counter must end where the program says it ends, and the summary's goodput must not be 0 %.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, base_env, journal_path, read_journal

CORPUS = ROOT / "tests" / "corpus"


@dataclass(frozen=True)
class Case:
    program: str
    args: tuple[str, ...]
    env: dict[str, str]
    fmt: str
    last_step: int  # the global step the run ends at, in the program's own counting
    total: int | None  # the run's total, where its lines state one
    needs: str | None = None  # a framework the program imports


CASES = {
    # 25 epochs of 16 steps: "Epoch 24/24 ... 16/16" ends at global step 400 of 400; about
    # 5 s at the 78 steps/s of an idle 2-core machine (3 epochs ended between two records)
    "lightning": Case(
        "lightning_ddp.py", (), {"CORPUS_EPOCHS": "25"}, "lightning_rich", 400, 400, "lightning"
    ),
    # 400 steps: about 12 s at CI's 32 steps/s, long enough for the per-second records
    "hf_trainer": Case(
        "hf_trainer.py", (), {"CORPUS_STEPS": "400"}, "tqdm", 400, 400, "transformers"
    ),
    # long enough (about 10 s) for the per-second progress records to see it mid-run
    "nanogpt": Case("nanogpt.py", (), {"CORPUS_STEPS": "600"}, "nanogpt", 600, None),
    # the tutorial's own argv: 60 epochs (about 10 s, so that the per-second progress records
    # see it mid-run), a snapshot every 30; its last line is "Epoch 59", printed when epoch 59
    # starts: 59 epochs of 32 steps done
    "ddp_tutorial": Case("multigpu_torchrun.py", ("60", "30"), {}, "ddp_tutorial", 59 * 32, None),
    # "step N/T | loss L" is the shape of llm.c's lines; 1000 steps: about 6 s at the 156
    # steps/s of an idle 2-core machine (200 took 1.3 s, about one progress record)
    "async": Case("async_collective.py", (), {"CORPUS_STEPS": "1000"}, "llmc", 1000, 1000),
}


@pytest.mark.parametrize("name", list(CASES))
def test_corpus_program_shows_live_progress(name: str, tmp_path: Path, tuilaunch) -> None:
    case = CASES[name]
    if case.needs is not None and importlib.util.find_spec(case.needs) is None:
        pytest.skip(f"{case.needs} is not installed (pip install -e '.[test]')")
    launch = tuilaunch(
        "--journal-samples",
        "1",  # a progress record every second: the run's live readings, kept
        "--standalone",
        "--nproc-per-node",
        "2",
        str(CORPUS / case.program),
        *case.args,
        cwd=tmp_path,
        env=base_env(**case.env),
    )
    assert launch.wait(timeout=280) == 0, launch.output[-4000:]

    records = [e for e in read_journal(journal_path(launch.output)) if e.get("kind") == "progress"]
    assert records, launch.output[-3000:]
    ranks = [r for rec in records for r in rec["ranks"] if r["global_rank"] == 0]
    assert {r["fmt"] for r in ranks} == {case.fmt}
    last = ranks[-1]
    assert (last["step"], last["total"]) == (case.last_step, case.total)
    assert records[-1]["steps_reached"] == case.last_step
    # live: a record taken mid-run, with our rate (and the ETA where the total is known)
    live = [r for r in ranks if 0 < r["step"] < case.last_step and r["rate"]]
    assert live, [(r["step"], r["rate"]) for r in ranks]
    if case.total is not None:
        assert live[0]["eta"] is not None and live[0]["eta"] > 0
    assert records[-1]["progress_time"] > 0
    m = re.search(r"goodput: making progress (\d+)% of wall time", launch.output)
    assert m is not None and int(m.group(1)) > 0, launch.output[-2000:]
