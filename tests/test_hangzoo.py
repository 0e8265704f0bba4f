"""The hang and false-alarm benchmarks, small (issue 35): ``bench/hangzoo.py`` and
``bench/falsealarm.py`` run for real, a class or a pause each, so that the harnesses, the
corpus's hang classes (``CORPUS_HANG_KIND``) and the pauses' workload cannot rot.

The figures themselves are the benchmarks' (``bench/README.md``); here the hang runs use the
default rule (no flag: seconds, on 0.2 s steps) and the healthy job a scaled clock with a
scaled ``--hang-timeout``, so each takes about a minute, and the checks are of what the
harness measured: the hang started, it was suspected and then confirmed after it started,
the verdict named the rank that hung, no process was left behind; the healthy job ended by
itself with no hang confirmed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PY, ROOT, base_env

BENCH = ROOT / "bench"


def _bench(script: str, tmp_path: Path, *args: str, timeout: float = 540) -> dict:
    results = tmp_path / "results"
    p = subprocess.run(
        [PY, str(BENCH / script), *args, "--results-dir", str(results)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = results.glob("*.json")
    doc = json.loads(path.read_text())
    assert str(path) in p.stdout
    return {"doc": doc, "stdout": p.stdout, "stderr": p.stderr}


@pytest.mark.slow
@pytest.mark.timeout(600)  # two 4-rank launches' start-up on a loaded machine
def test_hangzoo_confirms_and_names_the_hung_rank(tmp_path: Path) -> None:
    run = _bench(
        "hangzoo.py",
        tmp_path,
        *("--classes", "sleep,gil", "--programs", "loop", "--runs", "1", "--parallel", "2"),
        *("--cap", "90", "--work", str(tmp_path / "work")),
    )
    # No flag: the default rule (the job's own step rhythm), as users get it.
    assert run["doc"]["settings"]["flags"] == []
    samples = run["doc"]["samples"]
    assert sorted(s["kind"] for s in samples) == ["gil", "sleep"]
    for s in samples:
        assert s["outcome"] == "confirmed", s
        assert s["rank"] == 1 and s["odd_ranks"] == [1] and s["right_rank"], s
        assert 0 < s["to_suspicion_s"] <= s["to_verdict_s"], s
        assert s["stood_still"].startswith("no step for "), s
        assert s["leftover_processes"] == 0, s
        # The mark the hung rank wrote is the one the harness timed from.
        mark = json.loads((Path(s["directory"]) / "hang-mark.json").read_text())
        assert mark["rank"] == 1 and mark["kind"] == s["kind"] and mark["wall"] == s["hang_wall"]
    rows = {r["kind"]: r for r in run["doc"]["summary"]}
    assert rows["gil"]["confirmed"] == 1 and rows["gil"]["right_rank"] == 1
    assert "| loop | sleep | 1 | 1/1 |" in run["stdout"]


@pytest.mark.slow
def test_hangzoo_refuses_an_unknown_class(tmp_path: Path) -> None:
    p = subprocess.run(
        [PY, str(BENCH / "hangzoo.py"), "--classes", "sleep,nap", "--results-dir", str(tmp_path)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == "hangzoo.py: unknown class or program: nap"
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(600)  # two 4-rank launches' start-up on a loaded machine
def test_falsealarm_checkpoint_pause_is_not_a_hang(tmp_path: Path) -> None:
    # Scale 0.05: the 120 s saves take 6 s, the job 24 s; the timeout is 300 s x 0.05 = 15 s.
    run = _bench(
        "falsealarm.py",
        tmp_path,
        *("--pauses", "checkpoint", "--scale", "0.05", "--work", str(tmp_path / "work")),
    )
    doc = run["doc"]
    assert doc["settings"]["flags"] == ["--hang-timeout", "15"]
    (s,) = doc["samples"]
    assert s["outcome"] == "ended" and s["launcher_rc"] == 0, s
    assert s["confirmed"] == 0 and doc["confirmed"] == 0, s
    assert s["leftover_processes"] == 0
    assert s["first_step_wall"] is not None and s["suspicions_at_start"] <= s["suspicions"]
    output = (Path(s["directory"]) / "output.txt").read_text()
    # It did pause: two saves, each announced before and after.
    assert output.count("checkpoint saved at step") == 2, output[-3000:]
    assert "| **all** | 24 | | " in run["stdout"]
