"""The suite's forked launchers (``tests/prefork.py``) are what a fresh launcher is.

Most launches of the suite are forks of one interpreter per pytest process that imported
torch's launcher and ours once. These tests hold that harness to what the rest of the suite
relies on: a forked launcher is one (not a silent fallback to ``Popen``), ``/proc`` shows its
command line and environment (``ps``, ``pkill -f`` and the token search read them), it takes
signals and reports its exit code as a launcher does, and it says exactly what a fresh
interpreter says for the same command line.
"""

from __future__ import annotations

import signal

import conftest
import pytest
from conftest import WORKERS, Launch, launch_env, leftovers, tuilaunch_cmd, wait_for
from prefork import Forked

QUIET = str(WORKERS / "quiet.py")
NOOP = str(WORKERS / "noop.py")


def _proc_strings(pid: int, name: str) -> list[str]:
    with open(f"/proc/{pid}/{name}", "rb") as fp:
        return [s.decode() for s in fp.read().split(b"\0") if s]


def test_a_forked_launcher_shows_its_command_and_takes_signals(tuilaunch):
    launch = tuilaunch("--standalone", "--nproc-per-node", "1", QUIET, "--seconds", "60")
    assert isinstance(launch.proc, Forked), conftest._ZYGOTE[-1].refused
    # Right away, as after Popen's exec: its command and environment, not the zygote's.
    assert _proc_strings(launch.pid, "cmdline") == launch.cmd
    assert f"{conftest.TOKEN_VAR}={launch.token}" in _proc_strings(launch.pid, "environ")
    wait_for(lambda: len(leftovers(launch.token)) >= 2, 60, what="the worker started")
    launch.proc.send_signal(signal.SIGTERM)
    assert launch.wait(60) == 143, launch.output[-3000:]
    assert "tuilaunch summary: PREEMPTED" in launch.stderr, launch.output[-3000:]


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--nproc-per-node", "0", NOOP], id="refusal"),
        pytest.param(["--help"], id="help"),
    ],
)
def test_forked_and_fresh_launchers_say_the_same(argv, tmp_path):
    cmd = tuilaunch_cmd(*argv)
    env = launch_env()
    said = {}
    for fresh in (False, True):
        conftest._FRESH_ONLY[0] = fresh
        try:
            launch = Launch(cmd, tmp_path, env)
        finally:
            conftest._FRESH_ONLY[0] = False
        assert isinstance(launch.proc, Forked) is not fresh, conftest._ZYGOTE[-1].refused
        said[fresh] = (launch.wait(60), launch.stdout, launch.stderr)
    assert said[False] == said[True]
    assert said[False][0] in (0, 2), said[False]
