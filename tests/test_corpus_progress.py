"""Progress from the corpus's real programs (tests/corpus), with no change to them.

Each program runs under ``tuilaunch --no-tui --standalone --nproc-per-node 2`` as written:
Lightning with its default bar (rich's, since rich imports next to tuilaunch), the Hugging Face
Trainer's tqdm bar, nanoGPT's ``iter`` lines, the PyTorch DDP tutorial's epoch lines and a
``step N/T`` log, and the demo's trainer (``examples/train_ddp.py``). The journal must hold a
progress record taken while the program was training (a step short of the last one, with our
rate, and an ETA where the run states or declares its total), the counter must end where the
program says it ends, and the summary's goodput must not be 0 %. The dashboard's progress (the
header and the workers table's ETA cell), rendered from the journal at that record, shows the
ETA or says why there is none.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import re
import select
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, base_env, journal_path, read_journal, tuilaunch_cmd, wait_gone

from tui_launch.core.model import events as ev
from tui_launch.core.model.store import Snapshot, reduce
from tui_launch.tui.panels.progress import header_progress, progress_cells

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


# Each run steps for about 5 s, long enough for the per-second progress records to see it
# mid-run on any machine: few steps, each stretched to STEP seconds (CORPUS_STEP_SECONDS,
# asleep), rather than many steps of compute, whose time depends on the machine (on an idle
# 2-core machine 48 Lightning steps ended between two records, on CI's 40 Trainer steps).
STEP = {"CORPUS_STEP_SECONDS": "0.08"}
CASES = {
    # 4 epochs of 16 steps: "Epoch 3/3 ... 16/16" ends at global step 64 of 64
    "lightning": Case(
        "lightning_ddp.py",
        (),
        {"CORPUS_EPOCHS": "4", **STEP},
        "lightning_rich",
        64,
        64,
        "lightning",
    ),
    "hf_trainer": Case(
        "hf_trainer.py", (), {"CORPUS_STEPS": "60", **STEP}, "tqdm", 60, 60, "transformers"
    ),
    # nanoGPT's configurator prints the override: "Overriding: max_iters = 60", the total
    "nanogpt": Case("nanogpt.py", ("--max_iters=60",), STEP, "nanogpt", 60, 60),
    # the tutorial's own argv: 6 epochs of 32 steps, a snapshot every 3; its last line is
    # "Epoch 5", printed when epoch 5 starts: 5 epochs of 32 steps done. No line states the
    # number of epochs (argv's 6): no total, and the ETA says so
    "ddp_tutorial": Case(
        "multigpu_torchrun.py",
        ("6", "3"),
        {"CORPUS_STEP_SECONDS": "0.03"},
        "ddp_tutorial",
        5 * 32,
        None,
    ),
    # "step N/T | loss L" is the shape of llm.c's lines
    "async": Case("async_collective.py", (), {"CORPUS_STEPS": "60", **STEP}, "llmc", 60, 60),
    # the demo's trainer: "epochs=6" at its start, then epochs of 20 steps (6 x 20 in all)
    "demo_trainer": Case(
        str(ROOT / "examples" / "train_ddp.py"),
        ("--epochs", "6", "--step-delay", "0.04"),
        {},
        "tuilaunch",
        120,
        120,
    ),
}


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _check_teardown(output: str) -> None:
    """torch's gloo may abort a rank in its teardown after the last step ("terminate called
    without an active exception", SIGABRT): with the bootstrap on by default the run is then
    "completed; rank N crashed in teardown", exit 0 (checked by the caller), never a failure."""
    plain = ANSI.sub("", output)
    if re.search(r"terminate called without an active exception[\s\S]*SIGABRT \(-6\)", plain):
        assert re.search(r"completed; rank \d+ crashed in teardown", plain), plain[-3000:]


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
    rc = launch.wait(timeout=280)
    assert rc == 0, launch.output[-4000:]
    _check_teardown(launch.output)

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
    else:
        assert all(r["eta"] is None for r in ranks)
    assert records[-1]["progress_time"] > 0
    m = re.search(r"goodput: making progress (\d+)% of wall time", launch.output)
    assert m is not None and int(m.group(1)) > 0, launch.output[-2000:]

    # The dashboard at that record: the header and rank 0's ETA cell.
    snap = _snapshot_at(journal_path(launch.output), live[0])
    header = header_progress(snap).plain
    rank0 = next(r for r in snap.ranks if r.global_rank == 0)
    eta_cell = progress_cells(rank0, snap.progress)[2].plain
    if case.total is not None:
        assert re.search(rf"step {live[0]['step']}/{case.total} \d+%.* ETA \d+s", header), header
        assert re.fullmatch(r"\d+s", eta_cell), eta_cell
    else:
        assert "ETA ? no total" in header, header
        assert eta_cell == "? no total"


def _snapshot_at(journal: Path, rank: dict[str, object]) -> Snapshot:
    """The run's snapshot right after the progress record holding ``rank``'s reading."""
    s = Snapshot()
    for d in read_journal(journal):
        s = reduce(s, ev.from_dict(d))
        if d.get("kind") == "progress" and rank in d["ranks"]:
            return s
    raise AssertionError("no such record")


def test_ddp_tutorial_killed_and_resumed_resumes_where_it_says(tmp_path: Path, tuilaunch) -> None:
    """The tutorial killed mid-run and resumed from its snapshot: the summary's "resumed from"
    is the step of the first line the resumed attempt printed ("Resuming training from
    snapshot at Epoch E", then "Epoch E | ... | Steps: 32": E x 32 steps done), not the next
    epoch's."""
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--inject",
        "kill:rank=1,after=7s,attempt=0",
        str(CORPUS / "multigpu_torchrun.py"),
        "8",
        "2",
        cwd=tmp_path,
        env=base_env(CORPUS_STEP_SECONDS="0.03"),
    )
    assert launch.wait(timeout=280) == 0, launch.output[-4000:]
    events = read_journal(journal_path(launch.output))
    logs = {e["attempt"]: Path(e["log_dir"]) for e in events if e["kind"] == "workers_started"}
    resumed = (logs[1] / "0" / "stdout.log").read_text()
    m = re.search(r"Resuming training from snapshot at Epoch (\d+)", resumed)
    epoch = int(m.group(1)) if m else 0  # killed before the first snapshot: from scratch
    assert f"[GPU0] Epoch {epoch} | Batchsize: 32 | Steps: 32" in resumed
    line = re.search(r"attempt 1: reached step (\d+), resumed from (\d+)", launch.output)
    assert line is not None, launch.output[-3000:]
    assert (int(line.group(1)), int(line.group(2))) == (7 * 32, epoch * 32), line.group(0)


@pytest.mark.parametrize("shape", ["rank", "of"])
def test_a_trainer_that_prints_epochs_only(shape: str, tmp_path: Path, tuilaunch) -> None:
    """A fault-tolerant trainer printing ``epoch E rank R`` (or ``Epoch [E/N], Loss: L``) and
    no step line, whose rank 1 exits as epoch 2 starts: each attempt's epochs are its progress
    (no "no step seen"), the resumed attempt starts where its snapshot was, and with the
    number of epochs in the line there is an ETA."""
    launch = tuilaunch(
        "--journal-samples",
        "1",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        str(ROOT / "tests" / "programs" / "epoch_lines.py"),
        "--shape",
        shape,
        "--epochs",
        "8",
        "--snapshot",
        str(tmp_path / "snap"),
        "--exit-rank",
        "1",
        "--exit-epoch",
        "2",
        cwd=tmp_path,
        env=base_env(),
    )
    assert launch.wait(timeout=280) == 0, launch.output[-4000:]
    out = launch.output
    assert "no step seen" not in out, out[-3000:]
    first, last = (1, 8) if shape == "of" else (0, 7)  # as printed: 1-based "of N"
    m = re.search(r"attempt 0: reached epoch (\d+)", out)
    assert m is not None and int(m.group(1)) == first + 1, out[-3000:]
    # attempt 1 resumed from the snapshot of 2 epochs done ("resuming from epoch 2")
    resumed = rf"attempt 1: reached epoch {last}, resumed from 2\b"
    assert re.search(resumed, out), out[-3000:]
    assert re.search(rf"printed epoch {last}", out), out[-3000:]
    records = [e for e in read_journal(journal_path(out)) if e.get("kind") == "progress"]
    ranks = [r for rec in records for r in rec["ranks"] if r["global_rank"] == 0]
    assert {r["fmt"] for r in ranks} == {"epoch"}
    live = [r for r in ranks if r["rate"] and r["step"] < last]
    assert live, ranks
    if shape == "of":
        # (a record between "resuming from epoch 2" and the first "Epoch [3/8]" knows no total)
        assert live[-1]["total"] == ranks[-1]["total"] == 8 and live[-1]["eta"] > 0
    else:
        assert all(r["total"] is None and r["eta"] is None for r in ranks)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "eta"),
    [
        ("nanogpt", r"step \d+/60 \d+% [\d.]+/s ETA \d+s"),
        ("ddp_tutorial", r"step \d+ [\d.]+/s ETA \? no total"),
    ],
)
def test_headless_status_line_shows_the_eta(name: str, eta: str, tmp_path: Path) -> None:
    """``--no-tui`` on a terminal: the live status line has the job's step, rate and ETA (or
    why there is none) while the program trains."""
    case = CASES[name]
    token = os.urandom(8).hex()
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        tuilaunch_cmd(
            "--standalone", "--nproc-per-node", "2", str(CORPUS / case.program), *case.args
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        cwd=tmp_path,
        env=base_env(TUILAUNCH_TEST_TOKEN=token, **case.env),
        start_new_session=True,
    )
    os.close(slave)
    out = bytearray()
    try:
        while True:  # to the end of the run: the pty reads EIO once the launcher is gone
            if select.select([master], [], [], 1.0)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=60)
        assert rc == 0, out[-3000:]
        _check_teardown(out.decode(errors="replace"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        assert not wait_gone(token, 10)
    status = [seg for seg in out.decode(errors="replace").split("\r") if "| attempt 0 |" in seg]
    assert any(re.search(eta, seg) for seg in status), status[-5:]
