"""Which failure is whose (issue 23, items 11, 16, 19), with real launches.

- a run stopped after a restart recovered a failure does not name that failure its root cause;
- ranks that all raise at the same step are all ``failed``, each with its own error, even the
  one first seen exiting after torch began tearing the group down;
- torch's "Failed to initialize NumPy" warning, printed at start, is never the evidence.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from conftest import read_journal, wait_for

from tui_launch.core.journal.writer import read_journal as read_events
from tui_launch.core.model import errors
from tui_launch.core.model.store import recovered, replay

# Attempt 0: rank 1 raises; attempt 1: both ranks run until stopped.
RECOVERS = """
import os, sys, time
r = int(os.environ["RANK"]); attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {r} attempt {attempt}", flush=True)
if attempt == 0 and r == 1:
    time.sleep(0.3)
    raise RuntimeError("boom in attempt 0")
while True:
    print(f"rank {r} attempt {attempt} tick", flush=True)
    time.sleep(0.2)
"""

# Every rank asserts at step 3. Rank 1's interpreter then takes a second to go (its exit
# handlers, as a real training script's teardown), deaf to torch's SIGTERM: torch sees rank 0
# fail first, and rank 1 exits 1 only once torch has begun terminating the group.
# Both ranks assert at step 3, together: each waits there for the other (a file each), so a
# rank that started late on a loaded machine is not still at step 1 when its peer fails. Rank 1
# ignores SIGTERM and lingers in an atexit handler, so torch first sees it exit (code 1, its
# own traceback) only after it began tearing the group down.
ASSERTS = """
import atexit, os, signal, time
r = int(os.environ["RANK"])
here = os.path.dirname(os.path.abspath(__file__))
if r == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    atexit.register(time.sleep, 1.5)
for step in range(100):
    print(f"rank {r} step {step}", flush=True)
    if step == 3:
        open(os.path.join(here, f"at_step_3.{r}"), "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(here, f"at_step_3.{1 - r}")):
            assert time.monotonic() < deadline, "the other rank never reached step 3"
            time.sleep(0.005)
    assert step < 3, f"rank {r}: loss is nan at step {step}"
    time.sleep(0.1)
"""

NUMPY_WARNING = (
    "Failed to initialize NumPy: No module named 'numpy' (Triggered internally at "
    "/__w/pytorch/pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)"
)

# Rank 0 warns as torch does at import, prints a few lines, then fails: MODE "exit" prints an
# error line and leaves with os._exit(3) (no traceback), "raise" raises.
WARNS = f"""
import os, sys, time, warnings
warnings.warn({NUMPY_WARNING!r}, UserWarning)
r = int(os.environ["RANK"])
for step in range(3):
    print(f"rank {{r}} step {{step}}", flush=True)
    time.sleep(0.1)
if r == 0:
    if sys.argv[1] == "exit":
        print("ERROR: shard 7 is missing from /data/train", file=sys.stderr, flush=True)
        print("progress 3/10", file=sys.stderr, flush=True)
        os._exit(3)
    raise ValueError("bad batch shape (3, 5)")
time.sleep(30)
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_stopped_run_does_not_blame_a_recovered_failure(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    run = tuilaunch(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--journal",
        str(journal),
        str(_script(tmp_path, "recovers.py", RECOVERS)),
    )
    wait_for(
        lambda: (
            journal.exists()
            and any(
                e["kind"] == "workers_started" and e["attempt"] == 1 for e in read_journal(journal)
            )
        ),
        90,
        what="attempt 1",
    )
    os.kill(run.pid, signal.SIGTERM)
    assert run.wait(60) == 128 + signal.SIGTERM, run.output[-3000:]
    summary = run.stderr[run.stderr.index("tuilaunch summary") :]
    assert "PREEMPTED" in summary  # SIGTERM is a preemption (exit 143 as before)
    assert "root cause" not in summary, summary
    recovered_part = summary[summary.index("failures (recovered by restarts)") :]
    assert "attempt 0: rank 1" in recovered_part and "boom in attempt 0" in recovered_part
    snap = replay(read_events(str(journal)))
    assert snap.root_cause is not None and snap.root_cause.attempt == 0
    assert recovered(snap, snap.root_cause)


def test_ranks_raising_together_are_all_failed(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    run = tuilaunch(
        "--nproc-per-node",
        "2",
        "--journal",
        str(journal),
        str(_script(tmp_path, "asserts.py", ASSERTS)),
    )
    assert run.wait(60) == 1, run.output[-3000:]
    snap = replay(read_events(str(journal)))
    assert [(r.global_rank, r.state) for r in snap.ranks] == [(0, "failed"), (1, "failed")]
    by_rank = {f.global_rank: f for f in snap.failures}
    assert not by_rank[1].collateral
    for rank in (0, 1):
        assert by_rank[rank].message == f"AssertionError: rank {rank}: loss is nan at step 3"
    assert "+1 more failed" in run.stderr and "terminated by the agent" not in run.stderr
    table = run.stderr[run.stderr.index("ranks (attempt 0)") :]
    assert table.count(" failed ") >= 2, table


def _root_cause(output: str) -> str:
    part = output[output.index("root cause") :]
    return part[: part.index("logs: ")]


def test_numpy_warning_is_not_the_evidence(tuilaunch, tmp_path):
    script = _script(tmp_path, "warns.py", WARNS)
    run = tuilaunch("--nproc-per-node", "2", str(script), "exit")
    assert run.wait(60) == 1, run.output[-3000:]
    cause = _root_cause(run.stderr)
    assert "error      : ERROR: shard 7 is missing from /data/train" in cause, cause
    assert "NumPy" not in cause and "progress 3/10" not in cause, cause

    run = tuilaunch("--nproc-per-node", "2", str(script), "raise")
    assert run.wait(60) == 1, run.output[-3000:]
    cause = _root_cause(run.stderr)
    assert "ValueError: bad batch shape (3, 5)" in cause and "Traceback" in cause, cause
    assert "NumPy" not in cause, cause


def test_evidence_tail_and_died_raising(tmp_path):
    warn = [
        f"/x/functional_tensor.py:368: UserWarning: {NUMPY_WARNING}",
        '  cpu = _conversion_method_template(device=torch.device("cpu"))',
    ]
    log = tmp_path / "stderr.log"
    log.write_text("\n".join([*warn, "step 1", "step 2"]) + "\n")
    assert errors.evidence_tail(str(log)) == ("step 1", "step 2")
    log.write_text("\n".join([*warn, "fatal: bad thing", "step 2"]) + "\n")
    assert errors.evidence_tail(str(log)) == ("fatal: bad thing",)
    tb = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "t.py", line 3, in <module>',
        "[rank1]:     assert x",
        "[rank1]: AssertionError: nan",
    ]
    assert errors.died_raising(tb)
    assert not errors.died_raising([*tb, "step 9"])  # it went on after that traceback
    assert not errors.died_raising([*tb[:3], "KeyboardInterrupt"])
    assert not errors.died_raising(["exit now"])
