"""Shared helpers: run tuilaunch and torchrun as real processes, and find what they leave behind.

Every launch gets a unique token in its environment (``TUILAUNCH_TEST_TOKEN``); workers
inherit it, so ``leftovers(token)`` finds every process of that launch, grandchildren
included, by reading ``/proc/*/environ``.
"""

from __future__ import annotations

import atexit
import compileall
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefork import OFF_VAR as FORK_OFF_VAR
from prefork import Forked, Zygote

from tui_launch.core.launch.args import torch_option_strings
from tui_launch.testing.procs import env_holders

# Tests that use torchrun's --shutdown-timeout (torch >= 2.8) skip on the older torch we support.
needs_shutdown_timeout = pytest.mark.skipif(
    "--shutdown-timeout" not in torch_option_strings(),
    reason="this torch has no --shutdown-timeout (added in torch 2.8)",
)

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "tests" / "workers"
EXAMPLES = ROOT / "examples"
PY = sys.executable
TOKEN_VAR = "TUILAUNCH_TEST_TOKEN"


# The session's temp directory for launches (pytest's, under its basetemp): see _launch.
LAUNCH_TMP: list[Path] = []


@pytest.fixture(autouse=True, scope="session")
def _launch_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    LAUNCH_TMP.append(tmp_path_factory.mktemp("launch-tmp"))
    # Every launch registers in the per-user run index ($XDG_RUNTIME_DIR/tuilaunch, else
    # $XDG_STATE_HOME/tuilaunch): the suite's runs go to pytest's temp directory, never into
    # the index of the person running the tests.
    index_home = tmp_path_factory.mktemp("run-index")
    names = ("XDG_RUNTIME_DIR", "XDG_STATE_HOME", "COLUMNS", "LINES")
    saved = {k: os.environ.get(k) for k in names}
    os.environ["XDG_RUNTIME_DIR"] = str(index_home)
    os.environ["XDG_STATE_HOME"] = str(index_home)
    # pytest-xdist's workers get COLUMNS=80 and LINES=24 (for their report lines); a dashboard
    # started by a test would take them over the size of the terminal it was given (tmux's).
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    # A suite run inside a Slurm job: the in-process parses must not take its allocation.
    for k in [k for k in os.environ if k.startswith(("SLURM_", "SLURMD_"))]:
        saved[k] = os.environ.pop(k)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def base_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything that changes a launch's behaviour."""
    env = {
        k: v
        for k, v in os.environ.items()
        # SLURM_*: a suite run inside a Slurm job must not make every launch a Slurm one.
        if not k.startswith(("PET_", "TORCHELASTIC_", "TORCH_DISABLE_SHARE", "SLURM_", "SLURMD_"))
        and k not in ("OMP_NUM_THREADS", "LOGLEVEL")
    }
    env["PYTHONUNBUFFERED"] = "1"
    if LAUNCH_TMP:
        # torch's default log directories (torchelastic_*) go to pytest's temp directory.
        env["TMPDIR"] = str(LAUNCH_TMP[0])
    env.update(extra)
    return env


# One zygote per pytest process, started at its first launch (tests/prefork.py).
_ZYGOTE: list[Zygote] = []
_ZYGOTE_LOCK = threading.Lock()


_FRESH_ONLY: list[bool] = [False]  # the running test is marked fresh_launcher


@pytest.fixture(autouse=True)
def _fresh_launcher(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``fresh_launcher`` start their launchers as fresh interpreters: the
    suite keeps covering a launcher's own start (its imports, the spare racing them)."""
    _FRESH_ONLY[0] = request.node.get_closest_marker("fresh_launcher") is not None
    yield
    _FRESH_ONLY[0] = False


def _zygote() -> Zygote | None:
    """This process's zygote; None for a ``fresh_launcher`` test, with TUILAUNCH_TEST_FORK=0,
    or when it cannot start. A new one when the last is gone, or when this process's own
    environment changed in a variable read at import: importing Lightning in a test sets
    PYTORCH_NVML_BASED_CUDA_CHECK=1 for good, which every later launch inherits. (The older
    one goes on reporting the launchers it forked.)"""
    if _FRESH_ONLY[0] or os.environ.get(FORK_OFF_VAR) == "0":
        return None
    with _ZYGOTE_LOCK:
        env = base_env()
        if not _ZYGOTE or not _ZYGOTE[-1].alive or _ZYGOTE[-1].differs(env) is not None:
            if _ZYGOTE and not _ZYGOTE[-1].alive:
                print(f"conftest: a new zygote: {_ZYGOTE[-1].gone()}", file=sys.stderr)
            folder = LAUNCH_TMP[0] if LAUNCH_TMP else Path(tempfile.gettempdir())
            log = folder / f"zygote-{os.getpid()}-{len(_ZYGOTE)}.log"
            try:
                _ZYGOTE.append(Zygote(PY, env, str(log)))
            except (OSError, RuntimeError) as e:
                print(f"conftest: no zygote ({e}); launches start fresh", file=sys.stderr)
                return None
            atexit.register(_ZYGOTE[-1].close)
        return _ZYGOTE[-1]


class Launch:
    """A launcher process started by a test: forked from the zygote where it can be
    (tests/prefork.py says when), else a fresh ``subprocess.Popen``. ``proc`` answers as a
    ``Popen`` (text mode, stdin from /dev/null, a session of its own) either way."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.token = env[TOKEN_VAR]
        self.cmd = cmd
        zygote = _zygote()
        forked = zygote.spawn(cmd, str(cwd), env) if zygote is not None else None
        self.proc: subprocess.Popen[str] | Forked = forked or subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.stdout = ""
        self.stderr = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = 120) -> int:
        """Wait for the launcher to exit and collect its output."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            raise AssertionError(
                f"launcher did not finish in {timeout}s: {self.cmd}\n{out[-3000:]}\n{err[-5000:]}"
            ) from None
        self.stdout, self.stderr = out, err
        return self.proc.wait()

    def kill(self) -> None:
        """Kill the launcher and everything with its token (cleanup after a failed test)."""
        for pid in [self.proc.pid, *leftovers(self.token)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _launch(
    cmd: list[str], cwd: Path | None, env: dict[str, str] | None, tmp: Path | None = None
) -> Launch:
    return Launch(cmd, cwd or ROOT, launch_env(env, tmp))


def launch_env(env: dict[str, str] | None = None, tmp: Path | None = None) -> dict[str, str]:
    """A launch's environment: ``env`` (default :func:`base_env`) with a token of its own."""
    env = dict(env or base_env())
    env.setdefault(TOKEN_VAR, uuid.uuid4().hex)
    tmp = tmp or (LAUNCH_TMP[0] if LAUNCH_TMP else None)
    if tmp is not None:
        # torch's default log directories (torchelastic_*) and anything else a launch puts in
        # the temp directory land in pytest's, not in /tmp.
        env.setdefault("TMPDIR", str(tmp))
    return env


# TUILAUNCH_TEST_WARM=1 runs every launch of the `tuilaunch` fixture with --warm-start (but
# those with --no-python, which refuses it): the launcher tests in the warm-start mode.
WARM_ALL = os.environ.get("TUILAUNCH_TEST_WARM") == "1"


WARM = ["--warm-start"] if WARM_ALL else []
"""What tests that build a tuilaunch command line themselves (tmux, --detach) put after
``-m tui_launch``: ``--warm-start`` in the warm-start mode, else nothing."""


def tuilaunch_cmd(*args: str) -> list[str]:
    """The tuilaunch command line, headless (and warm with ``TUILAUNCH_TEST_WARM=1``)."""
    plain = "--no-python" in args or "--no-bootstrap" in args
    warm = ["--warm-start"] if WARM_ALL and not plain else []
    return [PY, "-m", "tui_launch", "--no-tui", *warm, *args]


def torchrun_cmd(*args: str) -> list[str]:
    """torchrun of the same interpreter."""
    return [PY, "-m", "torch.distributed.run", *args]


@pytest.fixture
def launches() -> Iterator[list[Launch]]:
    """Launches made by the test; any still running at the end are killed, then checked."""
    made: list[Launch] = []
    yield made
    for launch in made:
        if launch.proc.poll() is None:
            launch.kill()
            launch.proc.wait(10)
    for launch in made:
        left = wait_gone(launch.token, 10)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind by {launch.cmd}: {left}"


@pytest.fixture
def tuilaunch(launches: list[Launch]):
    """Start ``tuilaunch --no-tui ARGS``; returns a :class:`Launch`."""

    def start(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Launch:
        launch = _launch(tuilaunch_cmd(*args), cwd, env)
        launches.append(launch)
        return launch

    return start


@pytest.fixture
def torchrun(launches: list[Launch]):
    """Start ``torchrun ARGS``; returns a :class:`Launch`."""

    def start(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Launch:
        launch = _launch(torchrun_cmd(*args), cwd, env)
        launches.append(launch)
        return launch

    return start


def leftovers(token: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment holds ``token``."""
    return env_holders(TOKEN_VAR, token)


def wait_gone(token: str, timeout: float) -> list[int]:
    """Wait until no process holds ``token``; return those still there at the timeout."""
    deadline = time.monotonic() + timeout
    left = leftovers(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(token)
    return left


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def journaled_hang(launch: Launch, timeout: float, only: bool = True) -> dict:
    """The run's first ``hang`` event (``only``: and its only one), confirmed within
    ``timeout`` (its ``--hang-timeout``) + 30 s of the last output."""
    hangs = [e for e in read_journal(journal_path(launch.output)) if e["kind"] == "hang"]
    assert hangs and (len(hangs) == 1 or not only), launch.output[-3000:]
    assert hangs[0]["silence"] <= timeout + 30, hangs[0]
    return hangs[0]


def rich_text(renderable: object, width: int = 120) -> str:
    """What a rich renderable shows, as plain text, on a console ``width`` cells wide."""
    import io

    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def read_journal(path: Path) -> list[dict]:
    """The journal's JSON objects, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def live_journal(path: str | Path) -> list[dict]:
    """A running run's journal: its JSON objects so far (the last line may be half written)."""
    out = []
    with open(path) as fp:
        for line in fp:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


# Ports handed to tests: below the kernel's ephemeral range (32768-60999 on Linux), where
# bind(0) and every outgoing connection draw theirs, so that a port found free there was taken
# by another test's job before it was used (EADDRINUSE, once in a suite run); a block of its
# own for each pytest-xdist worker, and never the same port twice from one worker.
_PORTS_FROM = 10000
_PORTS_PER_WORKER = 1500
_next_port = itertools.count()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, from this test process's own block (see above)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    base = _PORTS_FROM + (int(worker) if worker.isdigit() else 0) * _PORTS_PER_WORKER
    for _ in range(_PORTS_PER_WORKER):
        port = base + next(_next_port) % _PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + _PORTS_PER_WORKER - 1} on {host}")


def journal_path(output: str) -> Path:
    """The journal path that the headless summary printed."""
    for line in output.splitlines():
        if line.startswith("journal: "):
            return Path(line[len("journal: ") :].strip())
    raise AssertionError(f"no journal line in output:\n{output[-3000:]}")


# Fixtures that start a launcher, torchrun, workers or an etcd server (some through a job
# recorded or left hanging for a whole module): a test that uses one, directly or through
# another fixture, is in the slow lane. Tests that start such processes by other means (a
# Runner with workers, a subprocess of `-m tui_launch`, tmux, a fresh interpreter that imports
# the package) are marked where they are, one by one or with a module's `pytestmark`. A
# `sleep` standing in for a rank costs milliseconds and stays in the fast lane; a test that
# takes more than a couple of seconds in-process (a long pilot session, a race repeated many
# times) is marked where it is.
SLOW_FIXTURES = frozenset(
    {
        "launches",
        "tuilaunch",
        "torchrun",
        "etcd_server",
        "etcd_to_stop",
        "real_run",
        "recorded",
        "stepping",
        "hang_job",
        "failed_run",
        "live",
        "unreachable_rdzv",
        "refusals",
    }
)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package and the test programs once, before any launch imports them.

    Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), no interpreter
    writes its bytecode, so each of the suite's ~450 launchers compiled the package's modules
    again: 0.3 to 0.9 s of CPU each, a quarter of a short launcher's. ``compileall`` writes
    the caches whatever the flag says; an edited file is still recompiled (its mtime).
    """
    # The same flag made pytest rewrite every test module's asserts again in each of its
    # processes (6 CPU-s of the 12 a collection takes); let it keep them (tests/__pycache__).
    sys.dont_write_bytecode = False
    if hasattr(session.config, "workerinput"):  # pytest-xdist's workers: the controller did it
        return
    for folder in (ROOT / "tui_launch", ROOT / "tests" / "workers", ROOT / "tests" / "corpus"):
        compileall.compile_dir(folder, quiet=1)


# The tests that take 30 s or more (pytest --durations on the whole suite), started first under
# pytest-xdist: one of them drawn last would keep a worker busy after the others are done. An
# optimisation only: a name missing here costs time, never a result.
LONG_TESTS = frozenset(
    {
        "test_mypy_package_and_tests",
        "test_lightning_rank_in_training_step_named_from_stacks",
        "test_trainer_rank_that_never_issued_the_all_reduce",
        "test_rank_killed_ten_times_recovers_ten_times",
        "test_straggler_from_an_injected_slow_rank_is_named",
        "test_ddp_loop_stopped_rank_is_named",
        "test_flight_recorder_bootstrap_differs_only_as_documented",
        "test_torch_messages_pass_through_as_torchrun_shows_them",
        "test_straggler_with_more_work_per_step_is_named",
        "test_demo_fails_restarts_resumes_and_goes_on",
        "test_killed_rank_leaves_a_survivor_dump_with_frames",
        "test_corpus_program_shows_live_progress",
        "test_worker_env_equals_torchrun",
        "test_a_second_run_trains_after_the_first_was_stopped",
        "test_example_trainer_resumes_from_snapshot",
        "test_killed_rank_leaves_its_survivor_where_it_was",
    }
)


# tryfirst: pytest-xdist turns the xdist_group marks into node ids in its own hook, which
# must see the marks added here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that start real processes ``slow``; skip SVG snapshots without the plugin.

    ``-m "not slow"`` is the fast lane for daily work. Without pytest-textual-snapshot there
    is no ``snap_compare`` fixture, and those tests would error: they skip, with the reason.

    Under pytest-xdist (``--dist loadgroup``) the tests that share a module-scoped fixture (a
    job recorded once for a whole module) are one group, so that job runs once, on one
    worker, instead of once on every worker that gets one of its tests. The longest tests
    (``LONG_TESTS``) come first.
    """
    # Stable: the rest keep their order (pytest-xdist puts the grouped ones first anyway).
    items.sort(key=lambda item: getattr(item, "originalname", item.name) not in LONG_TESTS)
    slow = pytest.mark.slow
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(slow)
        module = getattr(item, "module", None)
        if module is not None and _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(module.__name__))
    if config.pluginmanager.hasplugin("textual-snapshot"):
        return
    skip = pytest.mark.skip(reason="pytest-textual-snapshot is not installed (no snap_compare)")
    for item in items:
        if "snap_compare" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.fixture
def chromium() -> str:
    """Chromium's executable (Debian's ``chromium``, or a name it goes by elsewhere), or the
    test skips, saying why (ask for it first, so that it skips before a run starts for it)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")


def _etcd_argv(exe: str, data_dir: Path, client: int, peer: int) -> list[str]:
    """A one-member etcd with the v2 API on (torch's etcd backends use it), on loopback."""
    return [
        exe,
        "--enable-v2",
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        f"http://127.0.0.1:{client}",
        "--advertise-client-urls",
        f"http://127.0.0.1:{client}",
        "--listen-peer-urls",
        f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{peer}",
        "--initial-cluster",
        f"default=http://127.0.0.1:{peer}",
    ]


@contextlib.contextmanager
def _etcd(directory: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A real etcd on free loopback ports, its data and log in ``directory``: the process and
    its client port, once it answers (skips where etcd or python-etcd is missing)."""
    exe = shutil.which("etcd")
    if exe is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    pytest.importorskip("etcd", reason="python-etcd (the test extra) is not installed")
    client, peer = free_port(), free_port()
    with open(directory / "etcd.log", "w") as err:
        proc = subprocess.Popen(
            _etcd_argv(exe, directory / "data", client, peer),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        import etcd

        def up() -> bool:
            try:
                etcd.Client(host="127.0.0.1", port=client).read("/")
                return True
            except Exception:
                return False

        wait_for(up, 20, what="etcd to answer")
        yield proc, client
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """One real etcd (v2 API on) for a module's tests: its host and client port."""
    with _etcd(tmp_path_factory.mktemp("etcd")) as (_, port):
        yield "127.0.0.1", port


@pytest.fixture
def etcd_to_stop(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A real etcd of the test's own, which it may stop: the process and its endpoint."""
    directory = tmp_path / "etcd"
    directory.mkdir()
    with _etcd(directory) as (proc, port):
        yield proc, f"127.0.0.1:{port}"


# TUILAUNCH_TEST_CPU=FILE: append one line per test to FILE, "<cpu seconds> <wall seconds>
# <node id>", where the CPU is the test process's own and that of every process it started and
# reaped (a launcher counts its workers': it reaps them). The suite is bound by CPU on 2 cores,
# so this, not --durations, says which tests to make cheaper. Off by default.
_CPU_LOG = os.environ.get("TUILAUNCH_TEST_CPU")


def _cpu_now() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    forked = sum(z.cpu for z in _ZYGOTE)  # launchers the zygotes reaped
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + forked


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``TUILAUNCH_TEST_CPU``: how many launches each zygote forked, and why the others
    started fresh (one comment line per zygote)."""
    if _CPU_LOG:
        with open(_CPU_LOG, "a") as fp:
            for z in _ZYGOTE:
                fp.write(f"# zygote {z.proc.pid}: {dict(z.tally)}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``TUILAUNCH_TEST_CPU``: the CPU each test cost (see above)."""
    if not _CPU_LOG:
        yield
        return
    cpu, wall = _cpu_now(), time.monotonic()
    yield
    line = f"{_cpu_now() - cpu:.2f} {time.monotonic() - wall:.2f} {item.nodeid}\n"
    with open(_CPU_LOG, "a") as fp:
        fp.write(line)
