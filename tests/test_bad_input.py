"""Bad input: one clear line on stderr, the right exit code, no traceback, nothing left behind.

Usage errors (caught before anything starts) exit 2 with exactly one line,
``tuilaunch: error: ...``. Runtime errors from torch (an unreachable rendezvous endpoint, a
master port already in use) exit 1 like torchrun; their one line is tuilaunch's
``[tuilaunch] run error (exit code 1): ...``, which must carry the reason. torch's own log
records (``[E1122 00:08:40.62 socket.cpp:1028] ...`` from C++ with the continuation lines of
their message, ``E1122 00:08:40.625000 ...`` from Python logging) may also appear on stderr
in that case: they are torch's, not tuilaunch's, and torchrun prints them too.

In every case, Python warnings that torch itself raises while being imported (e.g. "Failed to
initialize NumPy" when numpy is not installed) are not counted: they come from torch's own
files and appear under torchrun as well.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import (
    ROOT,
    WORKERS,
    Launch,
    base_env,
    free_port,
    launch_env,
    leftovers,
    tuilaunch_cmd,
    wait_for,
    wait_gone,
)

NOOP = str(WORKERS / "noop.py")
RUN_ERROR = "[tuilaunch] run error (exit code {}): "
# The exit-code table (docs/restart-policy.md): a store never reached or lost, a node lost,
# is an infrastructure failure (75); another mistake a retry will not fix is 1.
INFRA = 75
_TORCH_DIR = importlib.util.find_spec("torch").submodule_search_locations[0]  # type: ignore[index, union-attr]
_WARNING = re.compile(r":\d+: \w*Warning: ")


def own_lines(stderr: str) -> list[str]:
    """stderr's non-empty lines without Python warnings raised from torch's own files."""
    out: list[str] = []
    skip_source = False
    for line in stderr.splitlines():
        if skip_source and line.startswith((" ", "\t")):
            skip_source = False
            continue
        skip_source = False
        if line.startswith(_TORCH_DIR + os.sep) and _WARNING.search(line):
            skip_source = True  # the warning's next line is the source line, indented
            continue
        if line.strip():
            out.append(line)
    return out


def check_usage_error(launch: Launch, *needles: str) -> str:
    """Exit 2, exactly one ``tuilaunch: error:`` line naming the problem; returns that line."""
    return check_refused(launch, launch.wait(timeout=120), *needles)


def check_refused(launch: Launch, code: int, *needles: str) -> str:
    """What :func:`check_usage_error` checks, of a launch that exited with ``code``."""
    assert code == 2, launch.output
    assert "Traceback" not in launch.output
    assert launch.stdout == ""
    lines = own_lines(launch.stderr)
    assert len(lines) == 1, launch.stderr
    line = lines[0]
    assert line.startswith("tuilaunch: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    assert leftovers(launch.token) == []
    return line


# Refusals of the command line: each case is a launcher of its own, which spends its time
# importing torch before it refuses. The `refusals` fixture starts the cases this session
# selects a few at a time, side by side; each test asserts on its own case's launch.
USAGE_ERRORS = [
    pytest.param(["no_such_script.py"], ["not found", "no_such_script.py"], id="missing-script"),
    pytest.param(
        ["-m", "no_such_pkg.mod"], ["module not found", "no_such_pkg"], id="missing-module"
    ),
    pytest.param(
        ["--no-python", "no-such-program-xyz"],
        ["not found", "no-such-program-xyz"],
        id="missing-program",
    ),
    pytest.param(["--nnodes", "abc", NOOP], ["--nnodes", "'abc'"], id="nnodes-abc"),
    pytest.param(["--nnodes", "1:2:3", NOOP], ["--nnodes", "'1:2:3'"], id="nnodes-1:2:3"),
    pytest.param(["--nnodes", "3:1", NOOP], ["--nnodes", "'3:1'"], id="nnodes-3:1"),
    pytest.param(["--nnodes", "0", NOOP], ["--nnodes", "'0'"], id="nnodes-0"),
    pytest.param(["--nproc-per-node", "0", NOOP], ["--nproc-per-node", "0"], id="nproc-0"),
    pytest.param(
        ["--nproc_per_node", "garbage", NOOP],
        ["--nproc-per-node", "'garbage'"],
        id="nproc-garbage",
    ),
    pytest.param(
        ["-m", "--no-python", "pkg.mod"], ["-m", "--no-python"], id="module-with-no-python"
    ),
    pytest.param(
        ["--bogus-flag", NOOP], ["unrecognized arguments", "--bogus-flag"], id="unknown-option"
    ),
    pytest.param(
        ["--log-dir", "/proc/tuilaunch-test-logs", NOOP],
        ["--log-dir", "/proc/tuilaunch-test-logs", "not a writable directory"],
        id="log-dir-in-proc",
    ),
    # --no-bootstrap takes away what works through the bootstrap: asking for both is refused.
    pytest.param(
        ["--no-bootstrap", "--inject-ready", NOOP],
        ["--inject-ready", "--no-bootstrap"],
        id="no-bootstrap-inject-ready",
    ),
    pytest.param(
        ["--no-bootstrap", "--inject", "exception:rank=0", NOOP],
        ["--inject exit/exception", "--no-bootstrap"],
        id="no-bootstrap-exception",
    ),
    pytest.param(
        ["--no-bootstrap", "--warm-start", NOOP],
        ["--warm-start", "--no-bootstrap"],
        id="no-bootstrap-warm-start",
    ),
]


@pytest.mark.parametrize(("argv", "needles"), USAGE_ERRORS)
def test_usage_error(refusals, argv, needles):
    check_refusal(refusals[("usage", *argv)], *needles)


@pytest.mark.fresh_launcher
def test_log_dir_under_a_file(tuilaunch, tmp_path):
    (tmp_path / "file").write_text("not a directory\n")
    log_dir = tmp_path / "file" / "logs"
    launch = tuilaunch("--log-dir", str(log_dir), NOOP)
    line = check_usage_error(launch, "--log-dir", str(log_dir), "not a writable directory")
    assert "Not a directory" in line
    assert (tmp_path / "file").is_file()


# --------------------------------------------------------------------------- runtime errors


def check_run_error(launch: Launch, expected: int = 1) -> str:
    """Exit ``expected``, no traceback, exactly one tuilaunch error line; returns it."""
    code = launch.wait(timeout=120)
    assert code == expected, launch.output
    assert "Traceback" not in launch.output
    assert "tuilaunch: error" not in launch.output  # not a usage error
    prefix = RUN_ERROR.format(expected)
    errors = [ln for ln in launch.stderr.splitlines() if ln.startswith(prefix)]
    assert len(errors) == 1, launch.stderr
    assert f"tuilaunch summary: ERROR  exit code {expected}" in launch.stderr
    # No worker was ever started.
    assert "started rank" not in launch.stderr
    assert wait_gone(launch.token, 10) == []
    return errors[0]


@pytest.fixture(scope="module")
def unreachable_rdzv():
    """One launch against a c10d endpoint nobody listens on: (launch, endpoint, seconds).

    ``is_host=false``: 127.0.0.2 is a loopback address, so by default torch would decide that
    this node hosts the store and the rendezvous would succeed. ``read_timeout`` is how long
    the c10d backend's TCPStore client tries to connect (default 60 s).
    """
    port = free_port("127.0.0.2")
    endpoint = f"127.0.0.2:{port}"
    env = base_env(TUILAUNCH_TEST_TOKEN=uuid.uuid4().hex)
    cmd = tuilaunch_cmd(
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "x",
        "--nnodes",
        "1",
        "--rdzv-conf",
        "is_host=false,read_timeout=2",
        NOOP,
    )
    t0 = time.monotonic()
    launch = Launch(cmd, ROOT, env)
    try:
        launch.wait(timeout=120)
    finally:
        if launch.proc.poll() is None:
            launch.kill()
    elapsed = time.monotonic() - t0
    yield launch, endpoint, elapsed
    left = wait_gone(launch.token, 10)
    launch.kill()
    assert left == []


def test_unreachable_rdzv_endpoint(unreachable_rdzv):
    launch, _endpoint, elapsed = unreachable_rdzv
    line = check_run_error(launch, INFRA)
    assert re.search(r"connect", line, re.IGNORECASE), line
    assert "rendezvous" in line.lower() or "store" in line.lower(), line
    # It gave up after its own timeout (2 s per try), not the 60 s default (two tries of 60 s each).
    assert 2 <= elapsed < 60, elapsed
    assert leftovers(launch.token) == []


def test_unreachable_rdzv_endpoint_is_named(unreachable_rdzv):
    launch, endpoint, _elapsed = unreachable_rdzv
    line = check_run_error(launch, INFRA)
    host, port = endpoint.split(":")
    assert host in line and port in line, line


def test_master_port_in_use(tuilaunch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        launch = tuilaunch(
            "--nnodes",
            "1",
            "--node-rank",
            "0",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--rdzv-backend",
            "static",
            NOOP,
        )
        line = check_run_error(launch)
    assert re.search(r"address already in use|EADDRINUSE", line, re.IGNORECASE), line
    assert str(port) in line, line
    assert leftovers(launch.token) == []


def test_own_lines_filter_only_drops_torch_warnings():
    """The filter above never hides a line of tuilaunch's (guards the one-line checks)."""
    torch_warning = (
        f"{Path(_TORCH_DIR) / '_subclasses' / 'functional_tensor.py'}:368: UserWarning: "
        "Failed to initialize NumPy"
    )
    stderr = "\n".join(
        [
            torch_warning,
            "  cpu = _conversion_method_template(device=torch.device('cpu'))",
            "tuilaunch: error: x",
            "/elsewhere/mod.py:1: UserWarning: kept",
            "  kept source",
            "",
        ]
    )
    assert own_lines(stderr) == [
        "tuilaunch: error: x",
        "/elsewhere/mod.py:1: UserWarning: kept",
        "  kept source",
    ]


# --------------------------------------------------------------------------- absurd values
#
# Each of these used to start (or half-start) something: a dashboard that never drew, memory
# growing 250 MB/s, a pybind TypeError, a traceback, directories created, a symlink followed,
# signals silently not handled, a run directory outside --log-dir, a timer thread dying. Now
# each is one line and exit 2 before anything exists: no run directory, no journal, no log
# directory, no run-index entry, no torch temp directory, no process.

BIG = "99999999999999999999999"


def _isolated(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """An environment whose run index and temp directory are this test's own, empty; the
    ``--log-dir`` to give (not created); the directory that must stay empty."""
    home = tmp_path / "home"
    (home / "index").mkdir(parents=True, mode=0o700)
    (home / "tmp").mkdir()
    env = base_env(
        TUILAUNCH_TEST_TOKEN=uuid.uuid4().hex,
        XDG_RUNTIME_DIR=str(home / "index"),
        XDG_STATE_HOME=str(home / "index"),
        TMPDIR=str(home / "tmp"),
    )
    return env, home / "logs", home


def _nothing_created(home: Path) -> None:
    made = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert made == ["index", "tmp"], made


ABSURD_VALUES = [
    pytest.param(["--refresh-hz", "1e9"], ["--refresh-hz", "60"], id="refresh-hz-1e9"),
    pytest.param(["--refresh-hz", "0"], ["--refresh-hz", "60"], id="refresh-hz-0"),
    pytest.param(["--refresh-hz", "nan"], ["--refresh-hz"], id="refresh-hz-nan"),
    pytest.param(
        ["--nproc-per-node", BIG], ["--nproc-per-node", "workers per node"], id="nproc-huge"
    ),
    pytest.param(["--nnodes", BIG], ["--nnodes", "32-bit"], id="nnodes-huge"),
    pytest.param(["--nnodes", f"1:{BIG}"], ["--nnodes", "32-bit"], id="nnodes-max-huge"),
    pytest.param(
        ["--signals-to-handle", "SIGTERM,SIGBOGUS"],
        ["--signals-to-handle", "'SIGBOGUS'", "not a signal"],
        id="signal-bogus",
    ),
    pytest.param(
        ["--signals-to-handle", "SIGKILL"], ["--signals-to-handle", "SIGKILL"], id="signal-kill"
    ),
    pytest.param(["--rdzv-id", "../../x"], ["--rdzv-id", "'../../x'", "'/'"], id="rdzv-id-up"),
    pytest.param(["--gpu-interval", "inf"], ["--gpu-interval", "finite"], id="gpu-interval-inf"),
    pytest.param(["--gpu-interval", "1e20"], ["--gpu-interval", "a year"], id="gpu-interval-1e20"),
    pytest.param(["--hang-timeout", "nan"], ["--hang-timeout", "finite"], id="hang-timeout-nan"),
    pytest.param(["--stack-samples", "inf"], ["--stack-samples", "finite"], id="stack-samples-inf"),
    pytest.param(
        ["--journal-samples", "1e300"],
        ["--journal-samples", "a year"],
        id="journal-samples-huge",
    ),
    pytest.param(
        ["--monitor-interval", "inf"],
        ["--monitor-interval", "finite"],
        id="monitor-interval-inf",
    ),
    pytest.param(
        ["--inject", "kill:after=100000000000000000000s"],
        ["--inject", "after", "at most a year"],
        id="inject-after-1e20s",
    ),
    pytest.param(
        ["--inject", "hang:for=9999999h"],
        ["--inject", "for", "at most a year"],
        id="inject-for-huge",
    ),
]


# What torch checks only once the launch has started (its config_from_args, then the
# rendezvous handler), where it failed as the program (exit 1) and left a run directory in the
# temp directory: refused like the rest, with no --log-dir given (the run directory went to
# TMPDIR, which must stay empty).
TORCH_CONFIG_ERRORS = [
    pytest.param(["--standalone", "--tee", "9"], ["--tee", "'9'", "3 (both)"], id="tee-9"),
    pytest.param(["--standalone", "-r", "0:4"], ["--redirects", "'0:4'"], id="redirects-0:4"),
    pytest.param(
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:99999"],
        ["--rdzv-endpoint 'localhost:99999'", "port", "65535"],
        id="endpoint-port-99999",
    ),
    pytest.param(
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", "no host!:29400"],
        ["--rdzv-endpoint 'no host!:29400'", "host"],
        id="endpoint-host",
    ),
    pytest.param(
        ["--rdzv-backend", "static", "--master-port", "99999"],
        ["--master-port 99999", "port"],
        id="static-master-port-99999",
    ),
    pytest.param(
        ["--standalone", "--rdzv-conf", "foo"], ["--rdzv-conf 'foo'", "KEY=VALUE"], id="conf-foo"
    ),
    pytest.param(
        ["--standalone", "--rdzv-conf", "is_host=1,=2"],
        ["--rdzv-conf 'is_host=1,=2'", "'=2'"],
        id="conf-no-key",
    ),
    pytest.param(
        ["--standalone", "--rdzv-conf", "read_timeout=soon"],
        ["--rdzv-conf read_timeout=soon", "whole number"],
        id="conf-read-timeout",
    ),
    pytest.param(
        ["--standalone", "--rdzv-conf", "join_timeout=0"],
        ["--rdzv-conf join_timeout=0", "> 0"],
        id="conf-join-timeout-0",
    ),
    pytest.param(
        ["--standalone", "--rdzv-conf", "is_host=maybe"],
        ["--rdzv-conf is_host=maybe", "true or false"],
        id="conf-is-host",
    ),
    pytest.param(
        ["--standalone", "--rdzv-conf", "store_type=redis"],
        ["--rdzv-conf store_type=redis", "tcp or file"],
        id="conf-store-type",
    ),
]


class Refusal(NamedTuple):
    """One refusal case's run, finished (``code``) or not in time (``error``)."""

    launch: Launch
    code: int | None
    error: str | None
    home: Path | None  # for an absurd value: the directory that must stay empty


@pytest.fixture(scope="module")
def refusals(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[tuple[str, ...], Refusal]]:
    """The launches of the refusal cases this session selects, keyed ``(kind, *argv)``,
    run one after the other before the first of them is checked."""
    # (key, argv, cwd, env, home): what the `tuilaunch` fixture would have been given
    cases: list[tuple[tuple[str, ...], list[str], Path, dict[str, str] | None, Path | None]]
    cases = []
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module or not hasattr(item, "callspec"):
            continue
        argv = item.callspec.params.get("argv")
        if item.name.startswith("test_usage_error["):
            cases.append((("usage", *argv), tuilaunch_cmd(*argv), WORKERS, None, None))
        elif item.name.startswith("test_absurd_value["):
            own_env, logs, own_home = _isolated(tmp_path_factory.mktemp("absurd"))
            cmd = tuilaunch_cmd("--log-dir", str(logs), *argv, NOOP)
            cases.append((("absurd", *argv), cmd, ROOT, own_env, own_home))
        elif item.name.startswith("test_torch_config_error["):
            own_env, _, own_home = _isolated(tmp_path_factory.mktemp("config"))
            cmd = tuilaunch_cmd(*argv, NOOP)
            cases.append((("config", *argv), cmd, ROOT, own_env, own_home))
    done: dict[tuple[str, ...], Refusal] = {}
    for key, cmd, cwd, env, home in cases:
        launch = Launch(cmd, cwd, launch_env(env))
        try:
            done[key] = Refusal(launch, launch.wait(120), None, home)
        except AssertionError as e:  # did not exit in time (killed): the test says so
            done[key] = Refusal(launch, None, str(e), home)
    yield done


def check_refusal(refusal: Refusal, *needles: str) -> str:
    """:func:`check_usage_error` of a case that the ``refusals`` fixture ran."""
    assert refusal.error is None, refusal.error
    assert refusal.code is not None
    return check_refused(refusal.launch, refusal.code, *needles)


@pytest.mark.parametrize(("argv", "needles"), ABSURD_VALUES)
def test_absurd_value(refusals, argv, needles):
    refusal = refusals[("absurd", *argv)]
    check_refusal(refusal, *needles)
    assert refusal.home is not None
    _nothing_created(refusal.home)


@pytest.mark.parametrize(("argv", "needles"), TORCH_CONFIG_ERRORS)
def test_torch_config_error(refusals, argv, needles):
    refusal = refusals[("config", *argv)]
    check_refusal(refusal, *needles)
    assert refusal.home is not None
    _nothing_created(refusal.home)  # no run directory, no index entry


def test_signals_to_handle_known_names_still_work(tuilaunch, tmp_path):
    """The check refuses only what is not a catchable signal: torch's default list passes."""
    env, logs, _home = _isolated(tmp_path)
    launch = tuilaunch(
        "--log-dir", str(logs), "--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1", NOOP, env=env
    )
    assert launch.wait(120) == 0, launch.output[-3000:]


def test_journal_is_a_directory(tuilaunch, tmp_path):
    env, logs, home = _isolated(tmp_path)
    target = home / "tmp"
    launch = tuilaunch("--log-dir", str(logs), "--journal", str(target), NOOP, env=env)
    check_usage_error(launch, "--journal", str(target), "is a directory")
    _nothing_created(home)


def test_journal_is_a_fifo(tuilaunch, tmp_path):
    """A FIFO's open() waits for a reader: the launch hung, silent, before its first line."""
    env, logs, home = _isolated(tmp_path)
    fifo = tmp_path / "journal.fifo"
    os.mkfifo(fifo)
    launch = tuilaunch("--log-dir", str(logs), "--journal", str(fifo), NOOP, env=env)
    check_refused(launch, launch.wait(timeout=60), "--journal", str(fifo), "named pipe (FIFO)")
    _nothing_created(home)


def test_journal_is_a_character_device(tuilaunch, tmp_path):
    """A device other than /dev/null (a terminal, /dev/zero) is no journal either."""
    env, logs, home = _isolated(tmp_path)
    launch = tuilaunch("--log-dir", str(logs), "--journal", "/dev/zero", NOOP, env=env)
    check_usage_error(launch, "--journal /dev/zero is a character device, not a regular file")
    _nothing_created(home)


def test_journal_in_a_missing_directory(tuilaunch, tmp_path):
    """torch-free and silent before: the directories were created; now they must exist."""
    env, logs, home = _isolated(tmp_path)
    target = home / "no" / "such" / "dir" / "j.jsonl"
    launch = tuilaunch("--log-dir", str(logs), "--journal", str(target), NOOP, env=env)
    check_usage_error(launch, "--journal", str(target.parent), "does not exist")
    _nothing_created(home)


def test_journal_through_another_users_symlink(tuilaunch, tmp_path):
    """A shared sticky directory (as /tmp) where another user planted journal.jsonl as a
    symlink to a file of ours: the journal is refused, the file is not appended to."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a symlink another owner (os.lchown)")
    env, logs, home = _isolated(tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("mine\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    link = shared / "journal.jsonl"
    link.symlink_to(victim)
    os.lchown(link, 54321, 54321)
    launch = tuilaunch("--log-dir", str(logs), "--journal", str(link), NOOP, env=env)
    check_usage_error(launch, "--journal", str(link), "symbolic link", "54321")
    assert victim.read_text() == "mine\n"
    _nothing_created(home)


def test_journal_through_own_symlink_is_followed(tuilaunch, tmp_path):
    """Our own symlink is followed: the check is about someone else's."""
    env, logs, _home = _isolated(tmp_path)
    real = tmp_path / "real.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    launch = tuilaunch("--log-dir", str(logs), "--journal", str(link), NOOP, env=env)
    assert launch.wait(120) == 0, launch.output[-3000:]
    assert '"kind": "run_finished"' in real.read_text()


@pytest.mark.slow
def test_replay_refresh_hz_absurd(tmp_path):
    """`tuilaunch replay --refresh-hz 1e9` opened a dashboard that never drew, at 100 % CPU,
    deaf to q, ^C and SIGTERM; now it is one line and exit 2 (the journal is a real one)."""
    from tui_launch.core.journal.writer import Journal
    from tui_launch.testing import builders

    journal = tmp_path / "journal.jsonl"
    writer = Journal(str(journal))
    writer.write(builders.run_started())
    writer.close()
    # The five refusals run side by side: each is an interpreter start and nothing else.
    rates = ("1e9", "0", "-1", "inf", "x")
    started = {
        hz: Launch(
            [sys.executable, "-m", "tui_launch", "replay", str(journal), "--refresh-hz", hz],
            ROOT,
            base_env(TUILAUNCH_TEST_TOKEN=uuid.uuid4().hex),
        )
        for hz in rates
    }
    codes: dict[str, int] = {}
    try:
        for hz, launch in started.items():
            codes[hz] = launch.wait(timeout=60)
    finally:
        for launch in started.values():
            launch.kill()
    for hz, launch in started.items():
        assert codes[hz] == 2, (hz, launch.output)
        lines = own_lines(launch.stderr)
        assert len(lines) == 1 and "Traceback" not in launch.output, (hz, launch.stderr)
        assert lines[0].startswith("tuilaunch replay: error: --refresh-hz"), (hz, lines[0])
        assert leftovers(launch.token) == []


# --------------------------------------------------------------------------- lost rendezvous
#
# "nothing answered there ... give it is_host=1" was said for every RendezvousConnectionError,
# even 10 s into a run whose rendezvous had completed. What the launcher saw now decides:
# a store that answered and then went away is "lost"; an etcd server, "stopped answering"; a
# round already complete without this node, another launch with the same --rdzv-id.

ELASTIC = str(WORKERS / "elastic.py")
FAST_RDZV = "join_timeout=40,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"


def _rdzv_args(backend: str, endpoint: str, run_id: str, nnodes: str) -> list[str]:
    return [
        "--nproc-per-node", "1", "--monitor-interval", "0.2", "--max-restarts", "0",
        "--nnodes", nnodes, "--rdzv-backend", backend, "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id, "--rdzv-conf", FAST_RDZV,
    ]  # fmt: skip


def _ranks_up(log: Path, count: int, timeout: float = 90) -> None:
    wait_for(
        lambda: len(log.read_text().splitlines()) >= count, timeout, what=f"{count} rank(s) up"
    )


# A run whose store host died ends as a rendezvous error when its agent notices first, or as
# a worker failure when its ranks die of the broken collective first (a race): either line
# must say the store was lost.
def _lost_line(launch: Launch, expected: int = INFRA) -> str:
    """Exit ``expected``, no traceback, one run-error line that is not the never-connected
    one."""
    code = launch.wait(timeout=120)
    assert code == expected, launch.output[-4000:]
    ended = (RUN_ERROR.format(expected), f"[tuilaunch] run failed (exit code {expected}): ")
    # The workers' own tracebacks ("[rank1]: Traceback ...") are theirs; the launcher has none.
    assert not any(ln.startswith("Traceback") for ln in launch.stderr.splitlines())
    errors = [ln for ln in launch.stderr.splitlines() if ln.startswith(ended)]
    assert len(errors) == 1, launch.stderr[-4000:]
    line = errors[0]
    assert "nothing answered" not in line and "is_host" not in line, line
    assert wait_gone(launch.token, 10) == []
    return line


def _listener(pids: list[int], port: int) -> int | None:
    import psutil

    for pid in pids:
        proc = psutil.Process(pid)
        conns = getattr(proc, "net_connections", proc.connections)(kind="tcp")
        if any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in conns):
            return pid
    return None


def test_store_host_lost_mid_run(tuilaunch, tmp_path):
    """Two nodes on c10d; the launcher hosting the store is SIGKILLed once both ranks run:
    the other says it lost the store, and until when it answered."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    log, stop = tmp_path / "ranks.log", tmp_path / "stop"
    log.touch()
    args = [*_rdzv_args("c10d", endpoint, "lost-host", "2"), ELASTIC, str(log), str(stop)]
    a = tuilaunch(*args)
    b = tuilaunch(*args)
    _ranks_up(log, 2)
    host = wait_for(lambda: _listener([a.pid, b.pid], port), 30, what="the store's host")
    survivor = b if host == a.pid else a
    killed_at = time.time()
    (a if survivor is b else b).kill()
    line = _lost_line(survivor)
    assert f"lost the rendezvous store at {endpoint}" in line, line
    until = re.search(r"answered until at least (\d\d):(\d\d):(\d\d)", line)
    assert until, line
    seen = time.localtime(killed_at)
    told = seen.tm_hour * 3600 + seen.tm_min * 60 + seen.tm_sec
    said = int(until[1]) * 3600 + int(until[2]) * 60 + int(until[3])
    assert 0 <= (told - said) % 86400 <= 60, (line, time.strftime("%H:%M:%S", seen))


def test_etcd_server_stopped_mid_run(tuilaunch, tmp_path, etcd_to_stop):
    proc, endpoint = etcd_to_stop
    log, stop = tmp_path / "ranks.log", tmp_path / "stop"
    log.touch()
    launch = tuilaunch(
        *_rdzv_args("etcd-v2", endpoint, "etcd-gone", "1"), ELASTIC, str(log), str(stop)
    )
    _ranks_up(log, 1)
    proc.terminate()
    proc.wait(20)
    line = _lost_line(launch)
    assert f"the etcd server at {endpoint} stopped answering" in line, line
    assert "answered until at least" in line, line


def test_etcd_server_never_there_is_not_a_store_host(tuilaunch, tmp_path):
    """An etcd endpoint nobody serves: 'nothing answered', but no is_host advice (etcd is a
    server of its own, no node hosts it)."""
    pytest.importorskip("etcd", reason="python-etcd (the test extra) is not installed")
    endpoint = f"127.0.0.1:{free_port()}"
    launch = tuilaunch(
        *_rdzv_args("etcd-v2", endpoint, "no-etcd", "1"), ELASTIC, str(tmp_path / "l"), "x"
    )
    line = check_run_error(launch, INFRA)
    assert f"could not reach the etcd server at {endpoint}: nothing answered" in line, line
    assert "is_host" not in line, line


def _spares(endpoint: str, run_id: str) -> int:
    """How many nodes wait outside the complete round, read from the c10d store itself."""
    import pickle
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    host, port = endpoint.split(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    got = C10dRendezvousBackend(store, run_id).get_state()
    if got is None:
        return 0
    return len(getattr(pickle.loads(got[0]), "redundancy_list", ()))


def test_second_launch_with_the_same_run_id(tuilaunch, tmp_path):
    """A second launch with a --rdzv-id whose round is complete elsewhere waits as a spare;
    when the first run ends, it says so (it said 'nothing answered there', or torch's own
    AttributeError)."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    log, stop = tmp_path / "ranks.log", tmp_path / "stop"
    log.touch()
    args = [*_rdzv_args("c10d", endpoint, "twice", "1"), ELASTIC, str(log), str(stop)]
    first = tuilaunch(*args)
    _ranks_up(log, 1)
    second = tuilaunch(*args)
    wait_for(lambda: _spares(endpoint, "twice") >= 1, 60, what="the second launch as a spare")
    stop.touch()
    assert first.wait(120) == 0, first.output[-3000:]
    line = _lost_line(second, 1)  # a mistake (the same --rdzv-id), not the infrastructure
    assert f"the rendezvous at {endpoint} (c10d) was already complete with 1 of 1" in line, line
    assert "same --rdzv-id" in line, line
    assert len(log.read_text().splitlines()) == 1  # the second launch never started a rank
    # While it waited, it said so once (torch parks a spare without a word).
    assert second.stderr.count("none of them this one; this node waits as a spare") == 1, (
        second.stderr[-3000:]
    )


RDZV_CONFS = [
    "", "a=1", "a=1,b=2", " a = 1 , b=x ", "foo", "a=", "=1", "a=1,", ",a=1", "a=b=c",
    "read_timeout=5", "read_timeout=x", "read_timeout=-3", "join_timeout=0", "join_timeout=1",
    "last_call_timeout=x", "heartbeat_timeout=x", "keep_alive_interval=-1",
    "keep_alive_max_attempt=y", "is_host=YES", "is_host=0", "is_host=2", "store_type=File",
    "store_type=etcd",
]  # fmt: skip


@pytest.mark.parametrize("conf", RDZV_CONFS)
def test_rdzv_conf_is_refused_exactly_where_torch_refuses_it(conf: str) -> None:
    """The launcher's check of ``--rdzv-conf`` agrees with torch's own parse and the c10d
    handler's reads of the options (torch's functions, called here as the handler does)."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    from tui_launch.core.launch.args import parse
    from tui_launch.core.launch.validate import UsageError, validate

    def torch_refuses() -> bool:
        try:
            params = RendezvousParameters("c10d", "", "x", 1, 1, **_parse_rendezvous_config(conf))
            timeouts = {}
            for name in ("join", "last_call", "close", "heartbeat"):
                value = params.get_as_int(f"{name}_timeout")
                timeouts[name] = None if value is None else timedelta(seconds=value)
            RendezvousTimeout(**timeouts)
            params.get_as_int("keep_alive_interval")
            params.get_as_int("keep_alive_max_attempt")
            params.get_as_bool("is_host")
            if (params.get_as_int("read_timeout", 60) or 0) <= 0:
                return True
            return params.get("store_type", "tcp").strip().lower() not in ("tcp", "file")
        except ValueError:
            return True

    args, _ = parse(["--standalone", "--rdzv-conf", conf, NOOP])
    try:
        validate(args)
        refused = False
    except UsageError:
        refused = True
    assert refused == torch_refuses(), conf
