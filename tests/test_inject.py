"""Failure injection (``--inject``) with real workers: the example trainer and real signals.

Each test launches ``tuilaunch --no-tui`` with injections and checks what happened from the
outside: the exit status, the summary's root cause, the journal, the trainer's own output
(which epochs each attempt ran, and whether it resumed from the snapshot), and that no process
is left behind (the ``launches`` fixture checks every launch's token).
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from conftest import EXAMPLES, WORKERS, base_env, journal_path, read_journal, wait_for

from tui_launch.core.model.events import from_dict
from tui_launch.core.model.store import STOPPED, replay

TRAINER = str(EXAMPLES / "train_ddp.py")
NOOP = str(WORKERS / "noop.py")
TICKER = str(WORKERS / "ticker.py")
_EPOCH = re.compile(r"^\[RANK 0\] Epoch (\d+) ")
_SAVED = re.compile(r"^Epoch (\d+) \| Training snapshot saved")
_RESUME = re.compile(r"^Resuming training from snapshot at Epoch (\d+)")


def trainer_args(tmp_path: Path, epochs: int, delay: float = 0.02) -> list[str]:
    """The example trainer with tiny epochs and its snapshot in ``tmp_path``."""
    snap = str(tmp_path / "snapshot.pt")
    return [TRAINER, "--epochs", str(epochs), "--snapshot-path", snap, "--step-delay", str(delay)]


def logs_dir(output: str) -> Path:
    """The run's log directory, as the summary printed it."""
    for line in output.splitlines():
        if line.startswith("logs: "):
            return Path(line[len("logs: ") :].strip())
    raise AssertionError(f"no logs line in output:\n{output[-3000:]}")


def kinds(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["kind"] == kind]


def epoch_sequence(run_dir: Path) -> list[dict]:
    """Per attempt, from rank 0's stdout: the epochs it trained, saved, and where it resumed."""
    out = []
    n = 0
    while (run_dir / f"attempt_{n}").is_dir():
        path = run_dir / f"attempt_{n}" / "0" / "stdout.log"
        text = path.read_text() if path.exists() else ""
        seq: dict = {"attempt": n, "epochs": [], "saved": [], "resumed": None}
        for line in text.splitlines():
            if m := _EPOCH.match(line):
                seq["epochs"].append(int(m.group(1)))
            elif m := _SAVED.match(line):
                seq["saved"].append(int(m.group(1)))
            elif m := _RESUME.match(line):
                seq["resumed"] = int(m.group(1))
        out.append(seq)
        n += 1
    return out


def check_resumes(seqs: list[dict], epochs: int) -> None:
    """Every attempt starts right after the last snapshot saved before it; all epochs done."""
    saved_so_far = 0  # epochs completed according to the snapshot on disk
    for s in seqs:
        if saved_so_far:
            assert s["resumed"] == saved_so_far, (s, seqs)
        else:
            assert s["resumed"] is None, (s, seqs)
        if s["epochs"]:
            assert s["epochs"][0] == saved_so_far, (s, seqs)
            assert s["epochs"] == list(range(saved_so_far, saved_so_far + len(s["epochs"])))
        if s["saved"]:
            saved_so_far = s["saved"][-1] + 1
    assert seqs[-1]["epochs"] and seqs[-1]["epochs"][-1] == epochs - 1, seqs


def test_kill_three_times_recovers_from_snapshots(tuilaunch, tmp_path):
    epochs = 4
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        "--inject",
        "kill:rank=1,after=2s,times=3",
        *trainer_args(tmp_path, epochs),
    )
    assert launch.wait(180) == 0, launch.output[-4000:]
    events = read_journal(journal_path(launch.output))
    injected = kinds(events, "injection")
    assert [(e["attempt"], e["global_rank"], e["fault"], e["ok"]) for e in injected] == [
        (0, 1, "kill", True),
        (1, 1, "kill", True),
        (2, 1, "kill", True),
    ]
    assert [e["count"] for e in injected] == [1, 2, 3]
    assert "injected: kill:rank=1,after=2s,times=3 in attempts 0, 1, 2" in launch.stderr
    restarts = kinds(events, "restart")
    assert [r["cause"] for r in restarts] == ["failure"] * 3
    for failed in kinds(events, "attempt_failed"):
        (cause,) = [f for f in failed["failures"] if not f["collateral"]]
        assert cause["global_rank"] == 1 and cause["exit_code"] == -signal.SIGKILL
        assert "sent by tuilaunch (inject)" in cause["caused_by"]
    seqs = epoch_sequence(logs_dir(launch.output))
    assert len(seqs) == 4
    check_resumes(seqs, epochs)


def test_kill_four_times_exhausts_the_budget(tuilaunch, tmp_path):
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        "--inject",
        "kill:rank=1,after=2s,times=4",
        *trainer_args(tmp_path, 4),
    )
    # A kill from outside the program: an infrastructure failure in the exit-code table.
    assert launch.wait(180) == 75, launch.output[-4000:]
    root = launch.stderr.split("root cause", 1)[1]
    assert re.search(r"rank\s+: 1 \(local rank 1\)", root), root
    assert "SIGKILL (-9)" in root and "sent by tuilaunch (inject)" in root, root
    events = read_journal(journal_path(launch.output))
    assert len(kinds(events, "injection")) == 4
    assert [r["cause"] for r in kinds(events, "restart")] == ["failure"] * 3


def test_exception_then_exit(tuilaunch, tmp_path):
    # Attempt 0: an exception in rank 1's main thread; attempt 1: rank 1 exits with 7.
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--inject",
        "exception:rank=1,after=6s,attempt=0,message=boom, said the injector",
        "--inject",
        "exit:rank=1,after=4s,attempt=1,code=7",
        *trainer_args(tmp_path, 40, delay=0.05),
    )
    assert launch.wait(180) == 1, launch.output[-4000:]
    events = read_journal(journal_path(launch.output))
    failed = {e["attempt"]: e for e in kinds(events, "attempt_failed")}
    (exc,) = [f for f in failed[0]["failures"] if not f["collateral"]]
    assert exc["global_rank"] == 1 and exc["exit_code"] == 1
    assert "InjectedFailure: boom, said the injector" in exc["message"]
    evidence = exc["traceback"] or "\n".join(exc["stderr_tail"])
    assert 'train_ddp.py", line' in evidence, evidence
    (ex,) = [f for f in failed[1]["failures"] if not f["collateral"]]
    assert ex["global_rank"] == 1 and ex["exit_code"] == 7
    root = launch.stderr.split("root cause", 1)[1]
    assert "exit 7" in root and "exit injected by tuilaunch" in root, root
    assert "attempt 0: rank 1 (local 1" in root and "boom, said the injector" in root, root


def test_hang_stops_then_continues(tuilaunch, tmp_path):
    # ticker.py ticks every 0.1 s and reports its longest pause: the hang must show in it.
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--inject",
        "hang:rank=0,after=1s,for=3s",
        TICKER,
        "--ticks",
        "40",
    )
    assert launch.wait(120) == 0, launch.output[-4000:]
    events = read_journal(journal_path(launch.output))
    controls = [e for e in kinds(events, "control") if e["source"] == "inject"]
    assert [(c["action"], c["local_rank"], c["ok"]) for c in controls] == [
        ("stop", 0, True),
        ("continue", 0, True),
    ]
    # Replayed up to the stop, the rank shows as stopped; then it ran on and exited 0.
    upto = [from_dict(e) for e in events if e["seq"] <= controls[0]["seq"]]
    assert replay(upto).rank(0).state == STOPPED
    assert sorted(e["exit_code"] for e in kinds(events, "rank_exited")) == [0, 0]
    gaps = {
        w: float(
            re.findall(
                r"max gap ([\d.]+)",
                (logs_dir(launch.output) / "attempt_0" / w / "stdout.log").read_text(),
            )[-1]
        )
        for w in ("0", "1")
    }
    assert gaps["0"] >= 2.5 and gaps["1"] < 2.5, gaps


def _attempt_seconds(events: list[dict]) -> float:
    start = kinds(events, "workers_started")[0]["mono"]
    end = max(e["mono"] for e in kinds(events, "rank_exited"))
    return end - start


def test_exception_reaches_a_rank_blocked_in_a_library_wait(tuilaunch):
    # The injected exception waits for the program's own code (not torch's, not the standard
    # library's), but not forever: a main thread that never leaves Event.wait() gets it there.
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "0",
        "--inject",
        "exception:rank=0,after=2s,message=held",
        str(WORKERS / "block.py"),
    )
    assert launch.wait(120) == 1, launch.output[-4000:]
    events = read_journal(journal_path(launch.output))
    (failure,) = kinds(events, "attempt_failed")[0]["failures"]
    assert "InjectedFailure: held" in failure["message"], failure
    assert "left the wait" in launch.output


def test_slow_rank_makes_training_longer(tuilaunch, tmp_path):
    args = ["--standalone", "--nproc-per-node", "2"]
    (tmp_path / "base").mkdir()
    (tmp_path / "s").mkdir()
    # Side by side, so that both runs share whatever else loads the machine (CI's 2 cores).
    base = tuilaunch(*args, *trainer_args(tmp_path / "base", 1))
    slow = tuilaunch(*args, "--inject", "slow:rank=0,duty=50", *trainer_args(tmp_path / "s", 1))
    assert base.wait(180) == 0, base.output[-4000:]
    assert slow.wait(180) == 0, slow.output[-4000:]
    t_base = _attempt_seconds(read_journal(journal_path(base.output)))
    t_slow = _attempt_seconds(read_journal(journal_path(slow.output)))
    # Stopped half of every second: about twice as long; generous bound for a shared CPU.
    print(f"slow: baseline {t_base:.1f}s, duty 50 {t_slow:.1f}s, ratio {t_slow / t_base:.2f}")
    assert t_slow >= 1.3 * t_base, (t_base, t_slow)


def test_node_dies_with_its_agent_and_leaves_nothing(tuilaunch, tmp_path):
    journal = tmp_path / "j.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--journal",
        str(journal),
        "--inject",
        "node:after=1s",
        TICKER,
        "--ticks",
        "300",
    )
    assert launch.wait(120) == -signal.SIGKILL, launch.output[-4000:]
    assert "[tuilaunch] inject node: SIGKILL to this node's workers" in launch.stderr
    events = read_journal(journal)
    (inj,) = kinds(events, "injection")
    assert inj["fault"] == "node" and inj["ok"]
    assert kinds(events, "run_finished") == []  # the agent died; nobody wrote an ending
    pids = [w["pid"] for w in kinds(events, "workers_started")[0]["workers"]]
    # The reaper kills the orphaned workers; the fixture then checks no process is left.
    wait_for(lambda: not any(_alive(p) for p in pids), 10, what="workers gone")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _schedule(tuilaunch, tmp_path: Path, seed: int) -> list[tuple[int, int]]:
    journal = tmp_path / f"seed-{seed}-{len(list(tmp_path.iterdir()))}.jsonl"
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "3",
        "--journal",
        str(journal),
        "--inject",
        "kill:rank=random,after=500ms,times=3",
        "--inject-seed",
        str(seed),
        "--no-python",
        "sleep",
        "3",  # 2.5 s past the kill: under load a 1 s sleep ended before it (2 kills, not 3)
    )
    assert launch.wait(120) == 0, launch.output[-4000:]
    events = read_journal(journal)
    assert any(f"seed {seed}" in n["message"] for n in kinds(events, "notice"))
    return [(e["attempt"], e["global_rank"]) for e in kinds(events, "injection")]


def test_same_seed_same_schedule(tuilaunch, tmp_path):
    first = _schedule(tuilaunch, tmp_path, 7)
    again = _schedule(tuilaunch, tmp_path, 7)
    assert len(first) == 3 and [a for a, _ in first] == [0, 1, 2]
    assert first == again


INVALID = [
    ([], "explode:rank=1", "unknown kind 'explode'"),
    ([], "kill:rnak=1", "unknown key 'rnak' for kill"),
    ([], "kill:rank=1,after=soon", "bad after 'soon'"),
    ([], "hang:for=3x", "bad for '3x'"),
    ([], "kill:signal=SIGNOPE", "bad signal 'SIGNOPE'"),
    ([], "kill:times=0", "bad times '0'"),
    ([], "kill:rank=-1", "bad rank '-1'"),
    ([], "slow:duty=150", "duty must be a percentage"),
    ([], "slow:period=0s", "bad period '0s'"),
    ([], "exit:code=300", "bad code '300'"),
    ([], "kill:rank", "'rank' needs a value"),
    ([], "kill:rank=1,rank=2", "key 'rank' given twice"),
    ([], "kill:rank=2", "rank 2 is out of range (world size 2"),
    (["--no-python"], "exception:rank=0", "exception needs a Python worker"),
    (["--no-python"], "exit:rank=0", "exit needs a Python worker"),
]


@pytest.mark.parametrize(("extra", "spec", "message"), INVALID)
def test_invalid_spec_is_a_usage_error(capsys, extra, spec, message):
    # Checked before anything starts, so the CLI is called in-process (two cases below go
    # through a real process).
    from tui_launch.cli import run as run_cli

    script = ["true"] if extra else [NOOP]
    argv = ["--no-tui", "--standalone", "--nproc-per-node", "2", *extra, "--inject", spec]
    assert run_cli([*argv, *script]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuilaunch: error: --inject"), err
    assert message in lines[0] and spec in lines[0], err


def test_invalid_spec_exits_2_in_a_real_process(tuilaunch):
    extra, spec, message = INVALID[-2]
    script = ["true"] if extra else [NOOP]
    launch = tuilaunch("--standalone", "--nproc-per-node", "2", *extra, "--inject", spec, *script)
    assert launch.wait(60) == 2, launch.output[-3000:]
    lines = [ln for ln in launch.stderr.splitlines() if ln.startswith("tuilaunch: error:")]
    assert len(lines) == 1 and message in lines[0], launch.stderr[-3000:]
    assert "Traceback" not in launch.stderr


def test_rank_out_of_range_found_at_the_rendezvous(tuilaunch, tmp_path):
    # With --nnodes 1:2 the world size is known only once the rendezvous completes.
    launch = tuilaunch(
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "--rdzv-conf",
        "last_call_timeout=1",
        "--nproc-per-node",
        "2",
        "--inject",
        "kill:rank=3",
        NOOP,
    )
    assert launch.wait(120) == 2, launch.output[-3000:]
    assert "rank 3 is out of range (world size 2" in launch.stderr
    assert "Traceback" not in launch.stderr
    events = read_journal(journal_path(launch.output))
    assert kinds(events, "workers_started") == []  # stopped before any worker started


def _dump(
    tuilaunch,
    tmp_path: Path,
    name: str,
    extra: list[str],
    target: list[str],
    cwd,
    env: dict[str, str] | None = None,
):
    out = tmp_path / "dump.json"  # the same path each time: argv must stay comparable
    launch = tuilaunch(
        "--standalone",
        "--nproc-per-node",
        "1",
        *extra,
        *target,
        "--dump",
        str(out),
        "--flag-like",
        "x y",
        cwd=cwd,
        env=env,
    )
    assert launch.wait(120) == 0, launch.output[-3000:]
    data = json.loads(out.read_text())
    out.rename(tmp_path / f"{name}.json")
    per_launch = ("TUILAUNCH_TEST_TOKEN", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    env = {k: v for k, v in data.pop("env").items() if k not in per_launch}
    env["TORCHELASTIC_ERROR_FILE"] = env["TORCHELASTIC_ERROR_FILE"].split("attempt_")[-1]
    return data, env


def test_bootstrap_keeps_argv_path_main_and_env(tuilaunch, tmp_path):
    # The same worker with and without the bootstrap that exit/exception injections need
    # (on by default; --no-bootstrap is torchrun's worker, --inject-ready still accepted):
    # argv, sys.path[0], __name__, __spec__ and the environment are equal (with the recorder
    # off, whose variables test_flight_recorder_bootstrap_differs_only_as_documented checks).
    off = {**base_env(), "TORCH_FR_BUFFER_SIZE": "0"}
    plain = _dump(tuilaunch, tmp_path, "plain", ["--no-bootstrap"], [TICKER], None, off)
    ready = _dump(tuilaunch, tmp_path, "ready", ["--inject-ready"], [TICKER], None, off)
    assert ready == plain
    data = plain[0]
    assert data["name"] == "__main__" and data["spec"] is None
    assert data["path0"] == str(WORKERS)
    assert data["argv"] == [TICKER, "--dump", str(tmp_path / "dump.json"), "--flag-like", "x y"]
    # -m MODULE through the bootstrap: what `python -m ticker` gives.
    module, env = _dump(tuilaunch, tmp_path, "module", ["-m"], ["ticker"], WORKERS, off)
    assert env == plain[1]
    assert module == {
        "argv": [TICKER, "--dump", str(tmp_path / "dump.json"), "--flag-like", "x y"],
        "name": "__main__",
        "path0": str(WORKERS),
        "spec": "ticker",
    }


def test_flight_recorder_bootstrap_differs_only_as_documented(tuilaunch, tmp_path):
    # By default workers start through the bootstrap with the responder: argv, sys.path[0],
    # __name__ and __spec__ are as with --no-bootstrap; the environment differs by exactly
    # the variables docs/differences.md lists.
    plain_data, plain_env = _dump(tuilaunch, tmp_path, "plain", ["--no-bootstrap"], [TICKER], None)
    fr_data, fr_env = _dump(tuilaunch, tmp_path, "fr", [], [TICKER], None)
    assert fr_data == plain_data
    added = set(fr_env) - set(plain_env)
    assert added == {
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "TUILAUNCH_RESPONDER_DIR",
    }, added
    assert {k: v for k, v in fr_env.items() if k not in added} == plain_env
    # The rank's exit status and death by signal are the program's, as without it.
    for mode, code in (("exit", 3), ("segv", -11)):
        seen = []
        for extra in (["--no-bootstrap"], []):
            launch = tuilaunch(
                *("--log-dir", str(tmp_path / f"{mode}{len(seen)}"), "--standalone"),
                *("--nproc-per-node", "1", *extra, str(WORKERS / "crash.py")),
                *("--rank", "0", "--mode", mode, "--after", "0"),
            )
            assert launch.wait(120) == 1, launch.output[-2000:]
            events = read_journal(journal_path(launch.output))
            seen.append([e["exit_code"] for e in events if e["kind"] == "rank_exited"])
        assert seen == [[code], [code]], (mode, seen)
