"""Issue 27: ``tuilaunch status`` and ``tuilaunch ctl``, the verbs for scripts.

Real runs: a headless job with a control socket; ``status --json`` (a second process) agrees
with the journal (run id, attempt, the workers' pids, their state); ``ctl restart`` gives new
pids and a journaled restart whose source names ctl's pid and uid; a refused command exits 1;
another uid (``setpriv`` as nobody) does not reach the run; the finished run's status is its
outcome. Without a run: usage errors exit 2 with one line, an unknown run exits 3, and the
document validates against the published JSON Schema.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, ROOT, WORKERS, base_env, live_journal, wait_for

from tui_launch import cli
from tui_launch.apps import ctl
from tui_launch.core.model.commands import DumpStacks, Inject, Restart, SignalRank, StopRun
from tui_launch.core.remote import runindex

SCHEMA = ROOT / "docs" / "status.schema.json"
NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _tuilaunch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tui_launch ARGS`` as a second process (its pid is the client's)."""
    return subprocess.run(
        [PY, "-m", "tui_launch", *args],
        env=env or base_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _check_schema(doc: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


# ------------------------------------------------------------------------------ no run needed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["r"], "a run and a verb are needed"),
        (["r", "explode"], "unknown verb 'explode'"),
        (["r", "stop"], "stop needs --rank N"),
        (["r", "kill", "--rank", "x"], "--rank needs a local rank"),
        (["r", "restart", "--rank", "1"], "restart acts on the whole group"),
        (["r", "inject"], "inject needs one SPEC"),
        (["r", "inject", "nonsense:rank=0"], "bad inject spec"),
        (["r", "dump", "--force"], "unexpected option '--force'"),
    ],
)
def test_ctl_bad_usage_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run(["ctl", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tuilaunch ctl: error: ") and message in err


def test_ctl_builds_the_commands_of_the_model() -> None:
    kill = SignalRank(1, int(signal.SIGKILL), source="ctl")
    assert ctl.parse(["7", "kill", "--rank", "1"]) == ("7", kill)
    cont = SignalRank(0, int(signal.SIGCONT), source="ctl")
    assert ctl.parse(["7", "cont", "--rank=0"])[1] == cont
    assert ctl.parse(["7", "restart"])[1] == Restart(source="ctl")
    assert ctl.parse(["7", "term"])[1] == StopRun(int(signal.SIGTERM), source="ctl")
    assert ctl.parse(["7", "dump"])[1] == DumpStacks(source="ctl")
    spec = "exit:rank=1,after=5s"
    assert ctl.parse(["7", "inject", spec])[1] == Inject(spec, source="ctl")


def test_no_such_run_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(["status", "no-such-run-anywhere"]) == 3
    assert cli.run(["ctl", "no-such-run-anywhere", "restart"]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("no " in line and "'no-such-run-anywhere'" in line for line in err)
    assert cli.run(["status", "--bogus"]) == 2


def test_status_of_a_journal_validates_against_the_schema(tmp_path: Path) -> None:
    from tui_launch.core.journal.writer import Journal
    from tui_launch.core.model.events import RunFinished
    from tui_launch.core.model.store import RunStore
    from tui_launch.core.remote.status import resolve, status
    from tui_launch.testing import builders

    store = RunStore()
    journal = Journal(str(tmp_path / "journal.jsonl"))
    store.subscribe(journal.write)
    for e in [
        builders.run_started(),
        *builders.attempt(0, 2, 10.0, 4000),
        builders.failed_attempt(0, 11.0),
    ]:
        store.post(e)
    store.post(RunFinished("failed", 1, "rank 1 failed"))
    journal.close()
    doc = status(resolve(str(tmp_path)))
    _check_schema(doc)
    assert doc["state"] == "failed" and doc["live"] is False
    assert doc["outcome"] == {"outcome": "failed", "exit_code": 1, "message": "rank 1 failed"}
    assert doc["root_cause"]["global_rank"] == 1
    assert [r["pid"] for r in doc["ranks"]] == [r.pid for r in store.snapshot().ranks]
    assert doc["root_cause"]["traceback"] == builders.TRACEBACK


# ------------------------------------------------------------------------------ a real run


def _wait_listening(pid: int) -> runindex.Entry:
    def listening() -> runindex.Entry | None:
        for e in runindex.entries():
            if e.pid == pid and e.control and e.journal and os.path.exists(e.control):
                return e
        return None

    return wait_for(listening, 180, what="the run's control socket in the index")


def _workers(journal: str) -> list[dict[str, Any]]:
    return [e for e in live_journal(journal) if e["kind"] == "workers_started"]


@pytest.mark.timeout(600)
def test_status_and_ctl_on_a_real_run(tuilaunch) -> None:
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
        str(WORKERS / "stepper.py"), "--steps", "100000", "--interval", "0.05",
    )  # fmt: skip
    entry = _wait_listening(job.pid)
    journal = str(entry.journal)
    first = wait_for(lambda: _workers(journal), 120, what="workers started")[0]
    old = {w["local_rank"]: w["pid"] for w in first["workers"]}

    def stepping() -> dict[str, Any] | None:
        out = _tuilaunch("status", str(job.pid), "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        ranks = doc["ranks"]
        return doc if ranks and ranks[0]["step"] and ranks[0]["rate"] else None

    doc = wait_for(stepping, 120, what="status showing rank 0's step and rate")
    _check_schema(doc)
    started = next(e for e in live_journal(journal) if e["kind"] == "run_started")
    assert doc["live"] is True and doc["state"] == "running" and doc["attempt"] == 0
    assert doc["run"]["id"] == started["run_id"] and doc["run"]["launcher_pid"] == job.pid
    assert doc["run"]["journal"] == journal and doc["source"] == "journal+socket"
    assert {r["local_rank"]: r["pid"] for r in doc["ranks"]} == old
    assert all(r["state"] == "running" and r["last_collective"] is None for r in doc["ranks"])
    assert doc["ranks"][0]["rate"] > 0
    # By run id and by run directory: the same run; the human form names its pids.
    by_id = json.loads(_tuilaunch("status", started["run_id"], "--json").stdout)
    assert by_id["run"]["launcher_pid"] == job.pid
    human = _tuilaunch("status", os.path.dirname(journal))
    assert human.returncode == 0 and all(str(p) in human.stdout for p in old.values())

    # ctl restart from a second process: new pids, journaled with that process's pid and uid.
    restart = subprocess.Popen(
        [PY, "-m", "tui_launch", "ctl", str(job.pid), "restart"],
        env=base_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = restart.communicate(timeout=60)
    assert restart.returncode == 0, err
    assert out.count("\n") == 1 and err == ""
    again = wait_for(lambda: _workers(journal)[1:], 180, what="the group restarted")[0]
    new = {w["local_rank"]: w["pid"] for w in again["workers"]}
    assert sorted(new) == [0, 1] and not set(new.values()) & set(old.values())
    control = next(e for e in live_journal(journal) if e["kind"] == "control")
    assert control["action"] == "restart" and control["ok"]
    assert control["source"] == f"ctl pid {restart.pid} uid {os.getuid()}"

    def restarted() -> dict[str, Any] | None:
        doc = json.loads(_tuilaunch("status", str(job.pid), "--json", "--no-socket").stdout)
        return doc if doc["attempt"] == 1 and doc["state"] == "running" else None

    doc = wait_for(restarted, 120, what="status of attempt 1")
    assert {r["local_rank"]: r["pid"] for r in doc["ranks"]} == new
    assert doc["restarts"]["manual"] == 1 and doc["source"] == "journal"
    assert [a["number"] for a in doc["attempts"]] == [0, 1]

    # Refused by the run (no such rank): exit 1, one line; stop and continue a rank.
    refused = _tuilaunch("ctl", str(job.pid), "kill", "--rank", "9")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused
    assert "no running worker" in refused.stderr
    assert _tuilaunch("ctl", str(job.pid), "stop", "--rank", "1").returncode == 0
    doc = json.loads(_tuilaunch("status", str(job.pid), "--json").stdout)
    assert doc["ranks"][1]["state"] == "stopped"
    assert _tuilaunch("ctl", str(job.pid), "cont", "--rank", "1").returncode == 0

    # A stack dump: its verdict on stdout, and in status.
    dump = _tuilaunch("ctl", str(job.pid), "dump")
    assert dump.returncode == 0 and "(stacks: " in dump.stdout, dump
    doc = json.loads(_tuilaunch("status", str(job.pid), "--json").stdout)
    dumped = [e for e in live_journal(journal) if e["kind"] == "stacks_dumped"][-1]
    assert doc["verdict"]["source"] == "dump" and doc["verdict"]["text"] == dumped["verdict"]
    assert doc["verdict"]["stacks"] == dumped["path"] and dumped["verdict"] in dump.stdout

    # The whole job: ctl term (as q in its dashboard), the launcher exits as after SIGTERM.
    assert _tuilaunch("ctl", str(job.pid), "term").returncode == 0
    assert job.wait(120) == 143
    # Finished: the journal's outcome; ctl has no live run to act on.
    doc = json.loads(_tuilaunch("status", os.path.dirname(journal), "--json").stdout)
    finished = next(e for e in live_journal(journal) if e["kind"] == "run_finished")
    assert doc["live"] is False and doc["state"] == finished["outcome"]
    assert doc["outcome"]["exit_code"] == finished["exit_code"]
    assert doc["events"] == sum(1 for e in live_journal(journal) if e["kind"] != "log_mark")
    gone = _tuilaunch("ctl", str(job.pid), "restart")
    assert gone.returncode == 3 and "no live run" in gone.stderr


def _raw(path: str, *lines: bytes) -> list[dict[str, Any]]:
    """Send ``lines`` on the control socket as they are; the answers, until it closes or goes
    quiet."""
    import socket

    answers: list[dict[str, Any]] = []
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.settimeout(10)
        sock.sendall(b"".join(line + b"\n" for line in lines))
        with sock.makefile("rb") as replies:
            for reply in replies:
                answers.append(json.loads(reply))
                if len(answers) == len(lines):
                    break
    return answers


@pytest.mark.timeout(600)
def test_ctl_on_garbage_a_gone_rank_and_a_dump(tuilaunch) -> None:
    """Issue 32: malformed JSON on the socket is answered (no traceback on the launcher's
    console); a second kill of a rank that already died is refused (exit 1), not done; a dump
    from ctl is named for ctl. A slow monitor (5 s) keeps the killed rank unreaped a while."""
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
        "--monitor-interval", "5", str(WORKERS / "ticker.py"), "--ticks", "100000",
    )  # fmt: skip
    entry = _wait_listening(job.pid)
    wait_for(lambda: _workers(str(entry.journal)), 120, what="workers started")
    path = str(entry.control)

    hello = json.dumps({"hello": "tuilaunch-control", "mode": "read"}).encode()
    for garbage in (b"{not json", b"[1, 2]", b'"hello"'):
        assert _raw(path, garbage) == [{"ok": False, "error": "not a tuilaunch control client"}]
    answers = _raw(path, hello, b"not json", b"[1]", b'{"cmd": "status"}')
    bad = {"ok": False, "detail": "bad request: not a JSON object"}
    assert answers[0]["ok"] and answers[1:3] == [bad, bad], answers
    assert answers[3]["ok"] and answers[3]["phase"] == "running", answers

    dump = _tuilaunch("ctl", str(job.pid), "dump")
    assert dump.returncode == 0, dump
    folder = dump.stdout.split("(stacks: ")[1].rstrip().rstrip(")")
    assert os.path.basename(folder).endswith("-ctl"), folder

    assert _tuilaunch("ctl", str(job.pid), "kill", "--rank", "1").returncode == 0
    again = _tuilaunch("ctl", str(job.pid), "kill", "--rank", "1")
    assert again.returncode == 1 and again.stdout == "", again
    assert again.stderr.startswith("tuilaunch ctl: refused: local rank 1 (pid "), again
    assert "already gone" in again.stderr and again.stderr.count("\n") == 1, again
    refused = [e for e in live_journal(str(entry.journal)) if e["kind"] == "control"][-1]
    assert refused["action"] == "kill" and not refused["ok"], refused

    assert _tuilaunch("ctl", str(job.pid), "term").returncode == 0
    assert job.wait(120) == 143
    assert "Traceback" not in job.output, job.output


@pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv"),
    reason="needs root and setpriv to run the client as another user",
)
@pytest.mark.timeout(600)
def test_another_uid_is_refused(tuilaunch, tmp_path: Path) -> None:
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "1",
        str(WORKERS / "ticker.py"), "--ticks", "6000",
    )  # fmt: skip
    entry = _wait_listening(job.pid)
    assert entry.control and entry.journal
    # nobody's own index does not list root's run: no such run.
    home = Path(tempfile.mkdtemp(prefix="tuilaunch-nobody-", dir="/tmp"))
    public = Path(tempfile.mkdtemp(prefix="tuilaunch-test-", dir="/tmp"))
    try:
        os.chown(home, NOBODY, NOBODY)
        env = base_env(XDG_RUNTIME_DIR=str(home), XDG_STATE_HOME=str(home), HOME=str(home))
        env.pop("TMPDIR", None)
        nobody = [*AS_NOBODY, PY, "-m", "tui_launch", "ctl"]
        out = subprocess.run(
            [*nobody, str(job.pid), "restart"], env=env, cwd="/", capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 3 and out.stderr.count("\n") == 1, out
        # Even pointed at the socket (a copy of root's index entry, the socket linked into an
        # open directory and made 0666): ctl refuses a socket that is not its own user's.
        if public.stat().st_dev != os.stat(entry.control).st_dev:
            pytest.skip("the socket is not on /tmp's filesystem: no hard link to it")
        public.chmod(0o755)
        link = public / "open.sock"
        os.link(entry.control, link)
        os.chmod(link, 0o666)
        planted = Path(entry.path).read_text().replace(entry.control, str(link))
        subprocess.run(
            [*AS_NOBODY, PY, "-c", "import sys, pathlib; d = pathlib.Path(sys.argv[1]);"
             "(d / 'tuilaunch').mkdir(mode=0o700); (d / 'tuilaunch' / 'live-x.json')"
             ".write_text(sys.argv[2])", str(home), planted],
            check=True, timeout=60,
        )  # fmt: skip
        out = subprocess.run(
            [*nobody, str(job.pid), "restart"], env=env, cwd="/", capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 1 and "refusing" in out.stderr, out
        assert out.stderr.count("\n") == 1
    finally:
        with contextlib.suppress(OSError):
            os.chmod(entry.control, 0o600)
        shutil.rmtree(public, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    assert [e for e in live_journal(entry.journal) if e["kind"] == "control" and e["ok"]] == []
    assert len(_workers(entry.journal)) == 1  # nothing restarted
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143
