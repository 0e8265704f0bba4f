"""Issue 16: ``attach --control`` (the control socket), ``D`` and ``--detach``, end to end.

Real launches, real second processes: a headless job started with ``--control-socket`` is
steered from another process (a kill restarts the group and the journal names the client's
pid), a read-only connection is refused for control, a socket with the wrong mode or owner is
refused by the client, a peer of another uid (``setpriv`` as nobody, when the suite runs as
root) is refused by the launcher. In tmux: the dashboard's ``D``, the first tmux server
killed, the job still running, ``attach --control`` from a second one kills a rank and quits
the job. ``--detach`` prints how to attach and the job finishes on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from conftest import (
    PY,
    ROOT,
    TOKEN_VAR,
    WARM,
    WORKERS,
    base_env,
    leftovers,
    live_journal,
    wait_for,
    wait_gone,
)

from tui_launch.core.model.commands import (
    Command,
    DumpStacks,
    Inject,
    SignalRank,
    StopRun,
    command_to_dict,
)
from tui_launch.core.remote import runindex
from tui_launch.core.remote.controlsock import (
    MAX_PATH,
    ControlClient,
    ControlError,
    bind_private,
    check_socket,
    find,
    peer_allowed,
    peer_cred,
    prune_stale,
    socket_path,
)

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
can_setpriv = pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
    reason="needs root, setpriv and /usr/bin/python3 to run a client as another user",
)

# A client with nothing of ours imported (nobody cannot read the venv): connect, hello, one
# request, print what came back (or the error).
RAW_CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    s.sendall(b'{"hello": "tuilaunch-control", "mode": "control"}\\n')
    reply = s.makefile().readline().strip()
    if json.loads(reply).get("ok"):
        s.sendall(b'{"cmd": {"kind": "signal", "local_rank": 0, "sig": 9}}\\n')
    print(reply)
except OSError as e:
    print(type(e).__name__)
"""


def _client(path: str, mode: str, cmd: str | Command) -> tuple[int, dict]:
    """Run one request from a second process (``status``, or a command as data); (its pid,
    the answer)."""
    request = {"cmd": cmd if isinstance(cmd, str) else command_to_dict(cmd)}
    code = (
        "import json, os, sys; from tui_launch.core.remote.controlsock import ControlClient; "
        "print(os.getpid()); print(json.dumps(ControlClient(sys.argv[1], sys.argv[2])"
        ".request(json.loads(sys.argv[3]))))"
    )
    out = subprocess.run(
        [PY, "-c", code, path, mode, json.dumps(request)],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pid, answer = out.stdout.splitlines()
    return int(pid), json.loads(answer)


# ------------------------------------------------------------------------------ the pieces


def test_peer_credentials_and_the_uid_rule() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        pid, uid, _ = peer_cred(a)
    assert (pid, uid) == (os.getpid(), os.getuid())
    assert peer_allowed(os.getuid())
    assert peer_allowed(0)  # root may
    assert not peer_allowed(NOBODY, owner=1000)
    assert peer_allowed(1000, owner=1000)


def test_socket_path_falls_back_when_too_long(tmp_path: Path) -> None:
    short = socket_path(str(tmp_path), "/run/x")
    assert short == str(tmp_path / "control.sock")
    deep = tmp_path / ("d" * (MAX_PATH - len(str(tmp_path))))
    assert socket_path(str(deep), "/run/x", pid=42) == "/run/x/ctl-42.sock"
    assert socket_path(str(deep), "/" + "x" * MAX_PATH) is None


def test_socket_path_leaves_room_for_the_private_bind(tmp_path: Path) -> None:
    """bind_private binds in a private directory beside the socket first: a run directory
    whose ``control.sock`` fits in a socket address but whose bind path does not gets the
    fallback, and binds. (It used to get no socket at all, "AF_UNIX path too long": a run
    directory under pytest's temporary directory, 101 bytes, in test_agents_real.)"""
    room = MAX_PATH - len(str(tmp_path)) - len("/") - len("/control.sock")
    deep = tmp_path / ("d" * room)  # deep/control.sock is exactly MAX_PATH bytes
    deep.mkdir()
    fallback = tmp_path / "f"
    fallback.mkdir()
    path = socket_path(str(deep), str(fallback), pid=42)
    assert path == str(fallback / "ctl-42.sock")
    bind_private(path).close()
    roomy = tmp_path / ("d" * (room - 16))  # room for the private directory's name too
    roomy.mkdir()
    path = socket_path(str(roomy), str(fallback), pid=42)
    assert path == str(roomy / "control.sock")
    bind_private(path).close()


def test_bound_socket_is_0600_and_checked_by_the_client(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    sock = bind_private(path)
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["s.sock"]  # no private dir left
        check_socket(path)
        os.chmod(path, 0o666)
        with pytest.raises(ControlError, match="mode 0666, open to others"):
            check_socket(path)
        os.chmod(path, 0o600)
        if os.getuid() == 0:
            os.chown(path, NOBODY, NOBODY)
            with pytest.raises(ControlError, match=f"belongs to uid {NOBODY}"):
                check_socket(path)
        (tmp_path / "f").write_text("")
        with pytest.raises(ControlError, match="not a socket"):
            check_socket(str(tmp_path / "f"))
    finally:
        sock.close()


# ------------------------------------------------------------------------------ a real run


@pytest.mark.timeout(600)
def test_control_from_a_second_process(tuilaunch) -> None:
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
        str(WORKERS / "ticker.py"), "--ticks", "6000",
    )  # fmt: skip

    def listening() -> tuple[str, str] | None:
        with contextlib.suppress(ControlError):
            path, journal = find(str(job.pid))
            return (path, journal) if journal and os.path.exists(path) else None
        return None

    path, journal = wait_for(listening, 180, what="the run's control socket in the index")
    # In the run directory, or (pytest's deep temp paths) in the index directory.
    run_dir = os.path.dirname(journal)
    assert path == socket_path(run_dir, str(runindex.index_dir()), job.pid)
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    started = [e for e in live_journal(journal) if e["kind"] == "workers_started"]
    old = {w["local_rank"]: w["pid"] for w in started[0]["workers"]}

    # A client that connects and never says or reads anything holds nothing up.
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(path)
    try:
        # Read-only: status yes, commands no (and the refusal is journaled).
        reader, answer = _client(path, "read", "status")
        assert answer["ok"] and answer["phase"] == "running"
        reader, answer = _client(path, "read", SignalRank(1, signal.SIGKILL))
        assert answer == {"ok": False, "detail": answer["detail"]}
        assert "read-only" in answer["detail"]
        # Control: SIGKILL rank 1 from this second process.
        killer, answer = _client(path, "control", SignalRank(1, signal.SIGKILL))
        assert answer["ok"] is True
    finally:
        silent.close()

    def restarted() -> list[dict] | None:
        found = [e for e in live_journal(journal) if e["kind"] == "workers_started"]
        return found if len(found) >= 2 else None

    again = wait_for(restarted, 180, what="the group restarted")[1]
    assert again["attempt"] == 1
    new = {w["local_rank"]: w["pid"] for w in again["workers"]}
    assert sorted(new) == [0, 1] and not set(new.values()) & set(old.values())
    controls = [e for e in live_journal(journal) if e["kind"] == "control"]
    uid = os.getuid()
    kill = next(e for e in controls if e["action"] == "kill")
    assert kill["source"] == f"attach pid {killer} uid {uid}" and kill["ok"]
    assert kill["pid"] == old[1]
    refused = next(e for e in controls if e["action"] == "signal" and not e["ok"])
    assert refused["source"] == f"attach (read-only) pid {reader} uid {uid}"

    # An injection the launcher refuses, and a stack dump: both journaled with the client.
    injector, answer = _client(path, "control", Inject("bogus:rank=0"))
    assert answer["ok"] is False and answer["detail"]
    dumper, answer = _client(path, "control", DumpStacks())
    assert answer["ok"] is True and answer["event"]["kind"] == "stacks_dumped"
    assert answer["event"]["source"] == f"attach pid {dumper} uid {uid}"
    events = live_journal(journal)
    inject = next(e for e in events if e["kind"] == "control" and e["action"] == "inject")
    assert inject["source"] == f"attach pid {injector} uid {uid}" and not inject["ok"]
    assert "bogus:rank=0" in inject["detail"]
    dumped = next(e for e in events if e["kind"] == "stacks_dumped" and e["reason"] == "attach")
    assert dumped["source"] == f"attach pid {dumper} uid {uid}"

    # Stop the whole job from the socket: it ends as a SIGTERM to the launcher would.
    stopper, answer = _client(path, "control", StopRun())
    assert answer["ok"]
    assert job.wait(180) == 143
    assert not os.path.exists(path)  # the socket goes with the run
    stop = next(
        e for e in live_journal(journal) if e["kind"] == "control" and e["action"] == "stop"
    )
    assert stop["source"] == f"attach pid {stopper} uid {uid}"
    ended = [e for e in runindex.entries() if e.pid == job.pid]
    assert ended and ended[0].control is None and ended[0].exit_code == 143


@can_setpriv
@pytest.mark.timeout(600)
def test_another_uid_is_refused(tuilaunch, tmp_path: Path) -> None:
    job = tuilaunch(
        "--control-socket", "--standalone", "--nproc-per-node", "1",
        str(WORKERS / "ticker.py"), "--ticks", "6000",
    )  # fmt: skip

    def listening() -> tuple[str, str] | None:
        with contextlib.suppress(ControlError):
            path, journal = find(str(job.pid))
            return (path, journal) if journal and os.path.exists(path) else None
        return None

    path, journal = wait_for(listening, 180, what="the run's control socket")
    # As made (0600 in the run's 0700 directory): nobody cannot even reach it.
    script = ["/usr/bin/python3", "-c", RAW_CLIENT]
    out = subprocess.run([*AS_NOBODY, *script, path], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "PermissionError", out
    # Made reachable on purpose (a hard link in an open directory, mode 0666): the launcher
    # reads nobody's uid from SO_PEERCRED and refuses, and says so in the journal.
    public = Path(tempfile.mkdtemp(prefix="tuilaunch-test-", dir="/tmp"))
    try:
        if public.stat().st_dev != os.stat(path).st_dev:
            pytest.skip("the socket is not on /tmp's filesystem: no hard link to it")
        public.chmod(0o755)
        link = public / "open.sock"
        os.link(path, link)
        os.chmod(link, 0o666)
        out = subprocess.run(
            [*AS_NOBODY, *script, str(link)], capture_output=True, text=True, timeout=60
        )
        answer = json.loads(out.stdout)
        assert answer["ok"] is False and f"uid {NOBODY} is not the run's owner" in answer["error"]
        # And our own client refuses a socket open to others before it says anything.
        with pytest.raises(ControlError, match="open to others"):
            ControlClient(str(link)).call("status")
    finally:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o600)
        shutil.rmtree(public, ignore_errors=True)
    refusal = next(
        e for e in live_journal(journal) if e["kind"] == "control" and e["action"] == "connect"
    )
    assert refusal["ok"] is False and f"uid {NOBODY}" in refusal["source"]
    assert [e for e in live_journal(journal) if e["kind"] == "control" and e["ok"]] == []
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_detach_prints_how_to_attach_and_the_job_finishes(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    env = base_env(**{TOKEN_VAR: token})
    cmd = [
        PY, "-m", "tui_launch", *WARM, "--detach", "--standalone", "--nproc-per-node", "1",
        str(WORKERS / "ticker.py"), "--ticks", "20",
    ]  # fmt: skip
    out = subprocess.run(
        cmd,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert out.returncode == 0, out.stderr
        first = out.stdout.splitlines()[0]
        assert first.startswith("tuilaunch: running in the background as pid ")
        pid = int(first.split("pid ")[1].split(";")[0])
        assert f"tuilaunch attach {pid} --control" in out.stdout
        assert out.stderr == ""

        def ended() -> runindex.Entry | None:
            found = [e for e in runindex.entries() if e.pid == pid and e.ended is not None]
            return found[0] if found else None

        entry = wait_for(ended, 180, what="the detached run to end")
        assert entry.outcome == "succeeded" and entry.exit_code == 0
        assert entry.detached and entry.run_dir
        console = Path(entry.run_dir, "console.log").read_text()
        assert "rendezvous complete" in console  # written before the run dir existed
        assert "tick 19" in console and "tuilaunch summary: SUCCEEDED" in console
        spare = [p.name for p in runindex.index_dir().iterdir() if p.name.startswith("console-")]
        assert spare == []
        assert not wait_gone(token, 30)
    finally:
        for p in leftovers(token):
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)


# ------------------------------------------------------------------------------ tmux


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest.mark.timeout(900)
def test_detach_with_d_then_attach_control_in_tmux() -> None:
    from test_tui_tmux import Tmux, poll, table_rows, workers

    token = uuid.uuid4().hex
    env = base_env()
    env.pop(TOKEN_VAR, None)
    env.pop("TMUX", None)
    env["TERM"] = "xterm-256color"
    launch = [
        PY, "-m", "tui_launch", *WARM, "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "3",
        str(WORKERS / "steady.py"), "--seconds", "600",
    ]  # fmt: skip
    command = shlex.join(["env", f"{TOKEN_VAR}={token}", "PYTHONUNBUFFERED=1", *launch])
    first = Tmux(command + '; echo "launcher exit status $?"', env)
    second: Tmux | None = None
    try:

        def both_running(screen: str) -> dict[int, int] | None:
            rows = table_rows(screen)
            if sorted(rows) != [0, 1] or any(state != "running" for _, state in rows.values()):
                return None
            real = workers(token)
            shown = {lr: pid for lr, (pid, _) in rows.items()}
            return shown if real == shown else None

        old = poll(first, "both ranks running", 240, both_running)
        first.keys("D")
        screen: str = poll(
            first, "the detach message", 120, lambda s: s if "tuilaunch: detached" in s else None
        )
        assert "tuilaunch attach" in screen and "--control" in screen
        launcher = int(screen.split("(pid ")[1].split(")")[0])
        # The first terminal goes away (SIGHUP, SIGCONT to the pane's processes).
        first.close()
        entry = wait_for(
            lambda: next((e for e in runindex.entries() if e.pid == launcher and e.control), None),
            120,
            what="the detached run listening for control",
        )
        assert runindex.state(entry) == runindex.LIVE and entry.detached
        attach = shlex.join([PY, "-m", "tui_launch", "attach", str(launcher), "--control"])
        second = attached = Tmux(attach, env)  # the pane's dead status is attach's exit status
        shown = poll(second, "the attached view of both ranks", 120, both_running)
        assert shown == old  # the same workers: nothing was restarted by the hang-up
        assert "ATTACHED control" in second.screen()
        second.keys("Down", "k")
        poll(second, "the kill confirmation", 60, lambda s: f"rank 1 (local 1, pid {old[1]})?" in s)
        second.keys("y")

        def restarted(screen: str) -> dict[int, int] | None:
            if "on failure  1 / 3" not in screen:
                return None
            now = both_running(screen)
            return now if now and not set(now.values()) & set(old.values()) else None

        poll(second, "restart 1 of 3 with new pids", 240, restarted)
        second.keys("q")
        poll(second, "the quit confirmation", 60, lambda s: "Stop the workers and quit?" in s)
        second.keys("y")

        # tmux keeps the dead pane (remain-on-exit) and knows attach's exit status. Asked of
        # tmux itself, not read off the screen: a full-screen app that leaves the alternate
        # screen as it exits can leave the pane blank, without tmux's "Pane is dead" line.
        # (A pane read as dead with no status was once taken for status 1: tmux had missed
        # the SIGCHLD, see Tmux.exit_status.)
        try:
            status = poll(second, "the attach to leave", 180, lambda _: attached.exit_status())
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_stacks_of_attach()}") from None
        assert status == "0", f"attach --control left with status {status} after q y"
        assert not wait_gone(token, 120)
        journal = Path(entry.journal or "")
        controls = [e for e in live_journal(str(journal)) if e["kind"] == "control"]
        kill = next(e for e in controls if e["action"] == "kill")
        assert kill["source"].startswith("attach pid ") and kill["pid"] == old[1]
        assert any(e["action"] == "stop" for e in controls)
        console = (journal.parent / "console.log").read_text()
        assert "detached from the dashboard" in console and "STOPPED" in console
        # torch's agent lines reach the console once detached, as a headless run's do.
        after = console.split("detached from the dashboard", 1)[1]
        assert "torch/distributed/elastic" in after and "closing signal SIGTERM" in after, after
    finally:
        first.close()
        if second is not None:
            second.close()
        for pid in leftovers(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_attach_control_bad_input(tmp_path: Path) -> None:
    """No live run, or an unknown argument: one line, exit 2, no traceback."""
    index = tmp_path / "index"
    index.mkdir(mode=0o700)
    env = base_env(XDG_RUNTIME_DIR=str(index))
    for args, says in (
        ([], "no live run here"),
        (["12345678"], "no live run '12345678' here"),
        (["--bogus"], "unexpected argument '--bogus'"),
        (["--refresh-hz"], "--refresh-hz needs a value"),
    ):
        out = subprocess.run(
            [PY, "-m", "tui_launch", "attach", "--control", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.count("\n") == 1 and says in out.stderr, (args, out.stderr)
        assert out.stderr.startswith("tuilaunch attach: error: ")


@pytest.mark.timeout(300)
def test_no_socket_unless_asked_for(tuilaunch) -> None:
    job = tuilaunch(
        "--standalone", "--nproc-per-node", "1", str(WORKERS / "ticker.py"), "--ticks", "6000"
    )

    def started() -> runindex.Entry | None:
        found = [e for e in runindex.entries() if e.pid == job.pid and e.run_dir]
        if found and '"workers_started"' in Path(found[0].journal or "").read_text():
            return found[0]
        return None

    entry = wait_for(started, 180, what="the run's workers")
    assert entry.control is None
    assert not [p for p in Path(entry.run_dir or "").iterdir() if p.suffix == ".sock"]
    assert not (runindex.index_dir() / f"ctl-{job.pid}.sock").exists()
    out = subprocess.run(
        [PY, "-m", "tui_launch", "attach", str(job.pid), "--control"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "does not listen for control" in out.stderr
    assert "--control-socket" in out.stderr and out.stderr.count("\n") == 1
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143


def test_control_attach_shows_the_acting_keys_and_read_only_does_not() -> None:
    """The action table's rule: a replay or read-only attach hides what acts on the run, an
    attach --control (``controls``) shows it, D included; a finished run hides D."""
    from tui_launch.testing import scenarios
    from tui_launch.tui import actions

    live = scenarios.healthy().snapshot()
    done = scenarios.finished().snapshot()
    acting = [a for a in actions.ACTIONS if a.needs in actions.ACTS_ON_RUN]
    assert {a.name for a in acting} >= {"kill", "term", "stop_continue", "restart", "detach"}
    for a in acting:
        assert not actions.applies(a.needs, live, 0, replay=True), a.name
        assert actions.applies(a.needs, live, 0, replay=True, controls=True), a.name
        assert actions.applies(a.needs, live, 0), a.name  # the launcher's own dashboard
    detach = actions.BY_NAME["detach"]
    assert not detach.destructive and detach.keys == ("D",)
    assert not actions.applies(detach.needs, done, None, replay=True, controls=True)


def test_stale_sockets_of_dead_launchers_are_pruned(tmp_path: Path) -> None:
    gone = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(gone.stdout)
    socks = [bind_private(str(tmp_path / f"ctl-{pid}.sock")) for pid in (dead, os.getpid())]
    try:
        (tmp_path / "ctl-notapid.sock").write_text("")
        prune_stale(str(tmp_path))
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted([f"ctl-{os.getpid()}.sock", "ctl-notapid.sock"])
    finally:
        for s in socks:
            s.close()


def _stacks_of_attach() -> str:
    """py-spy dumps of every live ``tui_launch attach`` process (why one did not leave)."""
    out = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if b"tui_launch" in cmd and b"attach" in cmd:
                spy = shutil.which("py-spy") or "py-spy"
                dump = subprocess.run(
                    [spy, "dump", "--pid", entry], capture_output=True, text=True, timeout=60
                )
                out.append(f"attach pid {entry}:\n{dump.stdout}{dump.stderr}")
    return "\n".join(out) or "no attach process left"
