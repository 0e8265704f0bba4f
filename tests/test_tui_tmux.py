"""End to end in a real terminal: the dashboard of a real 2-rank job, driven through tmux.

Start the job under the dashboard in a detached tmux session (its own tmux server, so the
test's environment and nothing else reaches the launcher), read the screen with
``capture-pane``, select rank 1, kill it with ``k`` ``y``, see the restart and the new pids,
dump every rank's stacks with ``d``,
quit with ``q`` ``y``, read the summary printed after the dashboard closed, and check that no
process of the launch is left. Polls with generous timeouts: a loaded 2-core machine takes a
while to import torch twice and form a gloo group.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import pytest
from conftest import PY, ROOT, TOKEN_VAR, WARM, WORKERS, base_env, leftovers, wait_gone

T = TypeVar("T")
TMUX = shutil.which("tmux")
pytestmark = [
    pytest.mark.skipif(
        TMUX is None, reason="tmux is not installed: the end-to-end dashboard test needs a terminal"
    ),
    pytest.mark.slow,
]

WIDTH, HEIGHT = 160, 45
SIDE = 46  # the left column (#side) is 46 cells wide; the workers table is right of it
ROW = re.compile(r"│\s?(\d+)\s+(\d+)\s+(\d+)\s+([a-z]+)\s")


class Tmux:
    """One tmux server (own socket, no user config) with one session running ``command``."""

    def __init__(
        self, command: str, env: dict[str, str], width: int = WIDTH, height: int = HEIGHT
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="tuilaunch-tmux-")
        self.socket = os.path.join(self.dir, "tmux.sock")
        self.session = "dash"
        self.env = env
        # remain-on-exit in the same tmux invocation: the pane stays (dead, with its exit
        # status) however fast the command ends, so the final screen can still be read.
        self.tmux(
            "new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height),
            "-c", str(ROOT), command, ";",
            "set-option", "-t", self.session, "remain-on-exit", "on",
        )  # fmt: skip

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            [TMUX, "-S", self.socket, "-f", os.devnull, *args],  # type: ignore[list-item]
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise AssertionError(f"tmux {args[0]} failed: {out.stderr.strip()}")
        return out.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def history(self) -> str:
        """The pane's whole scrollback and screen: a summary taller than the pane is all here."""
        return self.tmux("capture-pane", "-p", "-S", "-", "-t", self.session)

    def keys(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", self.session, key)
            time.sleep(0.3)

    def pane(self, fmt: str) -> str:
        return self.tmux("display-message", "-p", "-t", self.session, fmt).strip()

    def exit_status(self) -> str | None:
        """The pane's exit status once its command is gone and tmux has reaped it: the
        number as a string (``"-15"`` for a death by SIGTERM); None while it runs.

        A tmux built with libutempter (Debian's) can miss the pane's SIGCHLD (tmux#311): the
        pty's EOF comes first and makes tmux run utempter's helper, which sets SIGCHLD to its
        default (discard) meanwhile; a command that exits in that moment stays an unreaped
        zombie, and the pane reads dead with no status, for good (7 of 20 panes running
        ``python3 -c 'import time; time.sleep(0.3)'`` here). A SIGCHLD of our own makes tmux
        reap it: its handler waits for any child.
        """
        fmt = "#{pane_dead},#{pane_dead_status},#{pane_dead_signal}"
        dead, status, sig = self.pane(fmt).split(",")
        if dead != "1":
            return None
        if status or sig:
            return status or f"-{sig}"
        os.kill(int(self.pane("#{pid}")), signal.SIGCHLD)
        return None

    def close(self) -> None:
        subprocess.run(
            [TMUX, "-S", self.socket, "kill-server"],  # type: ignore[list-item]
            env=self.env,
            capture_output=True,
            timeout=30,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def table_rows(screen: str) -> dict[int, tuple[int, str]]:
    """Local rank -> (pid as shown, state) from the workers table on the screen."""
    rows = {}
    for line in screen.splitlines():
        m = ROW.search(line[SIDE:])
        if m:
            rows[int(m.group(2))] = (int(m.group(3)), m.group(4))
    return rows


def workers(token: str) -> dict[int, int]:
    """Local rank -> pid of the live worker processes of the launch (read from /proc)."""
    found = {}
    for pid in leftovers(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fp:
                if b"steady.py" not in fp.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as fp:
                env = dict(item.split(b"=", 1) for item in fp.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"LOCAL_RANK" in env:
            found[int(env[b"LOCAL_RANK"])] = pid
    return found


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fp:
                cmd = fp.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/stat") as fp:
                ppid = fp.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            cmd, ppid = "?", "?"
        out.append(f"{pid} (parent {ppid}): {cmd}")
    return out


def poll(tmux: Tmux, what: str, timeout: float, check: Callable[[str], T | None]) -> T:
    """Poll ``check(screen)`` until it returns something truthy; fail with the screen."""
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux.screen()
        value = check(screen)
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; screen:\n{screen}")


@pytest.mark.timeout(900)
def test_kill_a_rank_restart_and_quit_in_a_real_terminal() -> None:
    token = uuid.uuid4().hex
    # The tmux server must not hold the token (it would count as a leftover): only the launch
    # gets it, through env(1) in the pane's command.
    env = base_env()
    env.pop(TOKEN_VAR, None)
    env.pop("TMUX", None)
    env["TERM"] = "xterm-256color"
    launch = [
        PY, "-m", "tui_launch", *WARM, "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "3",
        str(WORKERS / "steady.py"), "--seconds", "600",
    ]  # fmt: skip
    # Every process of the launch carries the token, whatever the tmux server's environment.
    command = shlex.join(["env", f"{TOKEN_VAR}={token}", "PYTHONUNBUFFERED=1", *launch])
    command += '; echo "launcher exit status $?"'  # the pane stays (remain-on-exit) to read it
    tmux = Tmux(command, env)
    try:
        # 1. Both ranks running, with the pids of the real worker processes.
        def both_running(screen: str) -> dict[int, int] | None:
            rows = table_rows(screen)
            if sorted(rows) != [0, 1] or any(state != "running" for _, state in rows.values()):
                return None
            real = workers(token)
            shown = {lr: pid for lr, (pid, _) in rows.items()}
            return shown if real == shown else None

        old = poll(tmux, "both ranks running with their pids", 240, both_running)
        assert "RUNNING" in tmux.screen()
        assert "on failure  0 / 3" in tmux.screen()

        # 2. Select rank 1, k, the dialog names it, y.
        tmux.keys("Down")
        tmux.keys("k")
        poll(
            tmux,
            "the kill confirmation for rank 1",
            30,
            lambda s: f"Kill (SIGKILL) rank 1 (local 1, pid {old[1]})?" in s,
        )
        tmux.keys("y")

        # 3. The restart count becomes 1 and both ranks run again as new processes.
        def restarted(screen: str) -> dict[int, int] | None:
            if "on failure  1 / 3" not in screen:
                return None
            rows = table_rows(screen)
            if sorted(rows) != [0, 1] or any(state != "running" for _, state in rows.values()):
                return None
            shown = {lr: pid for lr, (pid, _) in rows.items()}
            real = workers(token)
            if sorted(real) != [0, 1] or set(real.values()) & set(old.values()):
                return None
            if set(shown.values()) & set(old.values()):
                return None
            return real if shown == real else None  # the table shows the new workers' pids

        new = poll(tmux, "restart 1 of 3 with new pids", 240, restarted)
        assert not set(new.values()) & set(old.values())
        for pid in old.values():
            assert pid not in leftovers(token)

        # 4. d dumps both ranks' stacks (py-spy, off the UI thread): the Stacks tab shows them.
        tmux.keys("d")
        poll(
            tmux,
            "the Stacks tab with both ranks' stacks",
            60,
            lambda s: "stacks (key)" in s and "ranks 0, 1" in s and "steady.py" in s,
        )

        # 5. q asks (the job is running), y stops the workers and closes the dashboard.
        tmux.keys("q")
        poll(tmux, "the quit confirmation", 30, lambda s: "Stop the workers and quit?" in s)
        tmux.keys("y")
        poll(tmux, "the launcher to exit", 180, lambda s: tmux.pane("#{pane_dead}") == "1")
        final = tmux.history()
        assert "tuilaunch summary: STOPPED" in final, final
        assert "exit code 143" in final, final
        assert "restarts: 1/3 on failure" in final, final
        assert "launcher exit status 143" in final, final

        # 6. Nothing of the launch is left.
        left = wait_gone(token, 30)
        assert not left, f"processes left behind: {describe(left)}"
    finally:
        tmux.close()
        for pid in leftovers(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(300)
def test_a_store_nobody_serves_at_80x24() -> None:
    """Issue 17: the dashboard says what it waits for, then why it failed, on 80x24."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = uuid.uuid4().hex
    env = base_env()
    env.pop(TOKEN_VAR, None)
    env.pop("TMUX", None)
    env["TERM"] = "xterm-256color"
    launch = [
        PY, "-m", "tui_launch", *WARM, "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-conf", "is_host=0,read_timeout=8", "--nnodes", "2", "--nproc-per-node", "1",
        str(WORKERS / "noop.py"),
    ]  # fmt: skip
    command = shlex.join(["env", f"{TOKEN_VAR}={token}", "PYTHONUNBUFFERED=1", *launch])
    command += '; echo "launcher exit status $?"'
    tmux = Tmux(command, env, width=80, height=24)
    try:
        endpoint = f"127.0.0.1:{port}"
        poll(tmux, "the store being contacted", 120, lambda s: "no answer yet" in s)
        waiting = tmux.screen()
        assert endpoint in waiting and "8s a try" in waiting, waiting
        assert "Workers" in waiting and "frame #" not in waiting, waiting
        poll(tmux, "the error", 120, lambda s: "could not reach the c10d" in s)
        failed = tmux.screen()
        assert failed.splitlines()[0].lstrip().startswith("ERROR"), failed
        # A store never reached: an infrastructure failure (docs/restart-policy.md).
        assert "exit code 75" in failed.splitlines()[0], failed
        # The root-cause tab, shown at once: the sentence names the endpoint and the timeout.
        assert "the run failed before its workers started" in failed, failed
        assert f"{endpoint} within its" in failed and "timeout (8s)" in failed, failed
        assert "^p palette" not in failed  # the hint no longer covers the footer's keys
        tmux.keys("q")
        poll(tmux, "the launcher to exit", 60, lambda s: tmux.pane("#{pane_dead}") == "1")
        final = tmux.screen()
        assert "launcher exit status 75" in final, final
        assert not wait_gone(token, 30)
    finally:
        tmux.close()
        for pid in leftovers(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(300)
def test_a_workers_escapes_leave_the_terminal_alone() -> None:
    """Issue 23: a worker printing an OSC title change, a cursor move, a clear screen and a
    bell (tests/workers/escapes.py, twice a second on both streams) under the dashboard: the
    pane's title stays what it was, and the log shows the sequences as text (``^[]0;...``)."""
    token = uuid.uuid4().hex
    env = base_env()
    env.pop(TOKEN_VAR, None)
    env.pop("TMUX", None)
    env["TERM"] = "xterm-256color"
    launch = [
        PY, "-m", "tui_launch", "--standalone", "--nproc-per-node", "1", "--max-restarts", "0",
        str(WORKERS / "escapes.py"), "--forever",
    ]  # fmt: skip
    command = shlex.join(["env", f"{TOKEN_VAR}={token}", "PYTHONUNBUFFERED=1", *launch])
    command += '; echo "launcher exit status $?"'
    tmux = Tmux(command, env, width=120, height=30)
    try:
        tmux.tmux("select-pane", "-t", tmux.session, "-T", "before-the-run")
        title = tmux.pane("#{pane_title}")
        assert title == "before-the-run", title
        poll(tmux, "the escapes shown as text", 180, lambda s: "escapes 3: ^[]0;pwned-title" in s)
        screen = tmux.screen()
        assert "^[[5;5Hmoved" in screen and "^[[2J" in screen, screen
        assert "RUNNING" in screen.splitlines()[0], screen  # no clear screen went through
        assert tmux.pane("#{pane_title}") == title
        tmux.keys("q")
        poll(tmux, "the quit confirmation", 30, lambda s: "Stop the workers and quit?" in s)
        tmux.keys("y")
        poll(tmux, "the launcher to exit", 120, lambda s: tmux.pane("#{pane_dead}") == "1")
        assert "launcher exit status 143" in tmux.history()
        assert tmux.pane("#{pane_title}") == title
        assert not wait_gone(token, 30)
    finally:
        tmux.close()
        for pid in leftovers(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


TICK = re.compile(r"\[\d\] tick (\d+)\s*$")


def log_following(screen: str) -> int | None:
    """The tick on the log's bottom line while the log bar says it follows (None: it does not
    say so, or says paused, or no tick is shown yet)."""
    lines = screen.splitlines()
    bar = [ln for ln in lines if "streams: both" in ln]
    if len(bar) != 1 or not bar[0].rstrip().endswith("following"):
        return None
    ticks = [int(m.group(1)) for ln in lines if (m := TICK.search(ln))]
    return ticks[-1] if ticks else None


def keeps_following(tmux: Tmux, what: str) -> None:
    """The log follows, and its bottom line moves on with the workers' output."""
    first = poll(tmux, f"{what}: the log following", 120, log_following)
    poll(tmux, f"{what}: newer lines at the bottom", 60, lambda s: (log_following(s) or 0) > first)


@pytest.mark.timeout(600)
def test_the_log_follows_at_80x24_and_100x30_and_through_resizes() -> None:
    """Issue 32: below 120 columns the log paused by itself ("paused, 603 new line(s) — f to",
    the hint cut). An attach at 80x24 and at 100x30, and a running dashboard shrunk and grown
    again, follow the log, with the bar whole."""
    token = uuid.uuid4().hex
    env = base_env()
    env.pop(TOKEN_VAR, None)
    env.pop("TMUX", None)
    env["TERM"] = "xterm-256color"
    launch = [
        PY, "-m", "tui_launch", "--standalone", "--nproc-per-node", "2",
        str(WORKERS / "ticker.py"), "--ticks", "100000", "--interval", "0.05",
    ]  # fmt: skip
    command = shlex.join(["env", f"{TOKEN_VAR}={token}", "PYTHONUNBUFFERED=1", *launch])
    dashboard = Tmux(command, env)
    attached: list[Tmux] = []
    try:
        keeps_following(dashboard, "the dashboard at 160x45")
        launcher = dashboard.pane("#{pane_pid}")
        for width, height in [(80, 24), (100, 30)]:
            attach = shlex.join([PY, "-m", "tui_launch", "attach", launcher])
            attached.append(Tmux(attach, env, width=width, height=height))
            keeps_following(attached[-1], f"attach at {width}x{height}")
        first = attached[0]
        for width, height in [(100, 30), (80, 24)]:
            first.tmux("resize-window", "-t", first.session, "-x", str(width), "-y", str(height))
            keeps_following(first, f"attach resized to {width}x{height}")
        for width, height in [(80, 24), (100, 30), (160, 45)]:
            dashboard.tmux(
                "resize-window", "-t", dashboard.session, "-x", str(width), "-y", str(height)
            )
            keeps_following(dashboard, f"the dashboard resized to {width}x{height}")
        dashboard.keys("q")
        poll(dashboard, "the quit confirmation", 30, lambda s: "Stop the workers and quit?" in s)
        dashboard.keys("y")
        poll(dashboard, "the launcher to exit", 180, lambda s: dashboard.exit_status() is not None)
        assert not wait_gone(token, 60)
    finally:
        for tmux in [dashboard, *attached]:
            tmux.close()
        for pid in leftovers(token):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
