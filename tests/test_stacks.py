"""Stack dumps of every rank (issue 14): py-spy and faulthandler on real gloo workers, the
verdict, persistence, and the pure hang detector.

The real-process tests share one two-rank job (tests/workers/hang.py, started through the worker
bootstrap with faulthandler on a real-time signal): rank 0 blocks in ``dist.all_reduce`` while
rank 1 sleeps in ``load_batch``. Every process a test starts carries a token in its environment
and is killed in a ``finally`` block; the test then checks that none is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    PY,
    ROOT,
    TOKEN_VAR,
    WORKERS,
    base_env,
    free_port,
    leftovers,
    wait_for,
    wait_gone,
)

from tui_launch.core.diagnosis.stacks import (
    CONFIRM,
    DUMP,
    NO_PYSPY,
    NOTHING,
    Frame,
    HangDetector,
    ProcessStack,
    RankStack,
    StackDump,
    ThreadStack,
    collective_of,
    confirm,
    dump_ranks,
    dump_via_faulthandler,
    dumped_event,
    find_pyspy,
    group_stacks,
    hang_event,
    load,
    parse_faulthandler,
    parse_pyspy_json,
    ptrace_fix,
    rank_list,
    render_text,
    save,
    verdict,
)
from tui_launch.core.diagnosis.stacks import pyspy as pyspy_mod
from tui_launch.core.diagnosis.stacks.model import RankRecord
from tui_launch.core.journal.writer import Journal, read_journal
from tui_launch.core.model import events as ev
from tui_launch.core.workers.shim import FAULTHANDLER_ENV, FAULTHANDLER_SIGNAL, INJECT_SIGNAL

needs_pyspy = pytest.mark.skipif(find_pyspy() is None, reason="py-spy is not installed")


def _kill_token(token: str) -> None:
    for pid in leftovers(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    left = wait_gone(token, 10)
    assert not left, f"processes left behind: {left}"


@dataclasses.dataclass
class Job:
    procs: list[subprocess.Popen[bytes]]
    stderr: dict[int, str]
    token: str

    @property
    def targets(self) -> list[tuple[int, int, int]]:
        return [(r, r, p.pid) for r, p in enumerate(self.procs)]


@pytest.fixture(scope="module")
def hang_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """Two gloo ranks through the bootstrap, faulthandler on; rank 1 never joins rank 0."""
    tmp = tmp_path_factory.mktemp("hang")
    token = uuid.uuid4().hex
    port = str(free_port())
    procs: list[subprocess.Popen[bytes]] = []
    stderr: dict[int, str] = {}
    shim = [PY, "-u", "-m", "tui_launch.core.workers.shim", str(tmp)]
    try:
        for rank in range(2):
            env = base_env(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                **{TOKEN_VAR: token, FAULTHANDLER_ENV: str(int(FAULTHANDLER_SIGNAL))},
            )
            out, err = tmp / f"out{rank}.log", tmp / f"err{rank}.log"
            stderr[rank] = str(err)
            with open(out, "wb") as fo, open(err, "wb") as fe:
                procs.append(
                    subprocess.Popen(
                        [*shim, str(WORKERS / "hang.py"), "--children", "2", "--seconds", "240"],
                        cwd=ROOT,
                        env=env,
                        stdout=fo,
                        stderr=fe,
                        stdin=subprocess.DEVNULL,
                    )
                )
        for rank in range(2):
            wait_for(
                lambda rank=rank: "ready" in (tmp / f"out{rank}.log").read_text(),
                120,
                what=f"rank {rank} ready",
            )
        yield Job(procs, stderr, token)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        _kill_token(token)


def _hung_dump(job: Job) -> StackDump:
    """A py-spy dump once rank 0 is inside all_reduce (it prints 'ready' just before)."""

    def attempt() -> StackDump | None:
        dump = dump_ranks(job.targets, "test")
        return dump if verdict(dump).odd == (1,) else None

    return wait_for(attempt, 30, interval=0.2, what="rank 0 in all_reduce")


# --------------------------------------------------------------------------- py-spy, real


@needs_pyspy
def test_pyspy_verdict_names_rank_1_in_load_batch(hang_job: Job) -> None:
    dump = _hung_dump(hang_job)
    v = verdict(dump)
    assert v.odd == (1,)
    assert v.text.startswith("rank 1 is not in a collective: hang.py:"), v.text
    assert "in load_batch; rank 0 waits in all_reduce" in v.text, v.text
    r0, r1 = v.places
    assert r0.collective == "all_reduce" and r0.top is not None
    assert r0.top.file == "torch/distributed/distributed_c10d.py"
    assert r1.collective is None and r1.top is not None and r1.top.function == "load_batch"
    assert dump.note is None
    for rank in dump.ranks:
        threads = rank.process.threads
        # Every thread, the main thread first; the worker's own "watchdog" thread is there too.
        assert threads[0].main and threads[0].native_id == rank.pid
        assert "watchdog" in [t.name for t in threads[1:]]
        assert rank.process.method == "py-spy" and rank.process.state in ("S", "R")
    assert dump.duration < 1.0


@needs_pyspy
def test_pyspy_includes_child_processes(hang_job: Job) -> None:
    dump = dump_ranks(hang_job.targets, "children")
    for rank in dump.ranks:
        assert len(rank.children) == 2, rank
        for child in rank.children:
            main = child.main_thread
            assert main is not None, child
            assert main.frames[0].function == "loader_worker"
            assert child.pid != rank.pid
        assert rank.more_children == 0
    # A limit on children per rank: the rest are counted, not dumped; 0 dumps none.
    capped = dump_ranks(hang_job.targets, "capped", max_children=1)
    assert [(len(r.children), r.more_children) for r in capped.ranks] == [(1, 1), (1, 1)]
    assert "1 children (+1 not dumped)" in render_text(capped)
    assert all(not r.children for r in dump_ranks(hang_job.targets, "x", max_children=0).ranks)


@needs_pyspy
def test_faulthandler_path_gives_the_same_verdict(hang_job: Job) -> None:
    by_pyspy = verdict(_hung_dump(hang_job))
    dump = dump_via_faulthandler(hang_job.targets, hang_job.stderr, "no-ptrace")
    v = verdict(dump)
    assert dump.method == "faulthandler"
    assert v.text == by_pyspy.text
    assert v.odd == (1,)
    for rank in dump.ranks:
        assert rank.process.threads[0].main
        assert len(rank.process.threads) >= 2  # main and watchdog at least
    # The handler printed and the ranks carry on.
    assert all(p.poll() is None for p in hang_job.procs)
    assert dump.duration < 1.0


def test_faulthandler_path_without_pyspy(hang_job: Job) -> None:
    """Where py-spy cannot help at all, the faulthandler dump alone names the odd rank."""
    assert dump_ranks(hang_job.targets, "x", pyspy=None).note == NO_PYSPY
    v = verdict(dump_via_faulthandler(hang_job.targets, hang_job.stderr, "again"))
    if v.odd != (1,):  # rank 0 may not have entered all_reduce yet when run alone
        time.sleep(1)
        v = verdict(dump_via_faulthandler(hang_job.targets, hang_job.stderr, "again"))
    assert v.odd == (1,) and "load_batch" in v.text and "all_reduce" in v.text, v.text


def _fake_pyspy(tmp_path: Path, message: str) -> str:
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
    fake.chmod(0o755)
    return str(fake)


def test_ptrace_denied_says_so_in_one_line_with_the_fix(
    hang_job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_pyspy(tmp_path, "Error: Operation not permitted (os error 1)")
    # Found on PATH: the one beside the interpreter wins, so test the PATH branch explicitly.
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(pyspy_mod.sys, "executable", str(tmp_path / "nowhere" / "python"))
    assert find_pyspy() == fake
    dump = dump_ranks(hang_job.targets, "denied")
    assert dump.note == ptrace_fix()
    assert dump.note is not None and "\n" not in dump.note
    assert dump.note.startswith("py-spy cannot attach: ptrace is not permitted")
    assert "--cap-add SYS_PTRACE" in dump.note and "--dump-via-faulthandler" in dump.note
    for rank in dump.ranks:
        assert rank.process.error == "Error: Operation not permitted (os error 1)"
    v = verdict(dump)
    assert v.odd == () and v.text.startswith("no stacks: py-spy cannot attach"), v.text
    # A py-spy path that does not exist is "no py-spy", with the same way out.
    missing = dump_ranks(hang_job.targets, "missing", pyspy=str(tmp_path / "absent"))
    assert missing.note == NO_PYSPY and "--dump-via-faulthandler" in NO_PYSPY


@needs_pyspy
@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv"
)
def test_real_ptrace_denial_says_so_with_the_fix(hang_job: Job, tmp_path: Path) -> None:
    """The real py-spy, really refused: run as nobody, without capabilities, on root's ranks."""
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(
        "#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "
        f'--bounding-set=-all {find_pyspy()} "$@"\n'
    )
    wrapper.chmod(0o755)
    dump = dump_ranks(hang_job.targets, "denied", pyspy=str(wrapper))
    assert dump.note == ptrace_fix(), [r.process.error for r in dump.ranks]
    for rank in dump.ranks:
        assert rank.process.error is not None and "Permission Denied" in rank.process.error


def test_save_writes_text_and_json_and_the_journal_points_to_them(
    hang_job: Job, tmp_path: Path
) -> None:
    dump = dump_via_faulthandler(hang_job.targets, hang_job.stderr, "key d")
    saved = save(dump, tmp_path)
    directory = Path(saved.directory)
    assert directory.parent == tmp_path / "stacks" and directory.name.endswith("-key-d")
    text = Path(saved.text).read_text()
    assert text.splitlines()[0] == verdict(dump).text
    assert load(saved.directory) == dump
    data = json.loads(Path(saved.json).read_text())
    assert data["verdict"]["text"] == verdict(dump).text
    event = dumped_event(dump, saved, attempt=0)
    journal = Journal(str(tmp_path / "journal.jsonl"))
    journal.write(event)
    journal.close()
    (back,) = read_journal(str(tmp_path / "journal.jsonl"))
    assert back == event and isinstance(back, ev.StacksDumped)
    assert back.path == saved.directory and back.ranks == (0, 1)
    assert ev.EVENT_TYPES["stacks_dumped"] is ev.StacksDumped and ev.StacksDumped.journaled


# ---------------------------------------------------------------- single processes, real


@contextlib.contextmanager
def _sleeper(body: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        [PY, "-c", textwrap.dedent(body)],
        env=base_env(**{TOKEN_VAR: token}, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.communicate(timeout=10)
        _kill_token(token)


# "up" is printed from inside nap(), so the main thread is in nap() once the test reads it.
SLEEPER = """
    import time
    def nap():
        print("up", flush=True)
        time.sleep(600)
    nap()
"""


@needs_pyspy
def test_stopped_rank_is_dumped_nonblocking() -> None:
    with _sleeper(SLEEPER) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: pyspy_mod.proc_state(proc.pid) == "T", 10, what="state T")
        dump = dump_ranks([(0, 0, proc.pid)], "stopped")
        (rank,) = dump.ranks
        assert rank.process.state == "T" and rank.process.method == "py-spy --nonblocking"
        main = rank.process.main_thread
        assert main is not None and main.frames[0].function == "nap", rank
        assert pyspy_mod.proc_state(proc.pid) == "T"  # still stopped: py-spy did not resume it


def test_rank_in_d_state_is_not_attached_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank in D (faked: a real one needs a stuck filesystem) gets its wchan, no py-spy."""
    with _sleeper(SLEEPER) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        # Printed "up" is not asleep yet: on a loaded machine it may still run (no wchan).
        real_state = pyspy_mod.proc_state
        wait_for(lambda: real_state(proc.pid) == "S", 10, what="the sleeper asleep")
        monkeypatch.setattr(pyspy_mod, "proc_state", lambda pid: "D")
        calls: list[object] = []
        monkeypatch.setattr(pyspy_mod.subprocess, "run", lambda *a, **k: calls.append(a))
        dump = dump_ranks([(0, 3, proc.pid)], "d")
        (rank,) = dump.ranks
        assert calls == []
        assert rank.process.method == "wchan" and rank.process.state == "D"
        assert rank.process.wchan  # the sleeper waits somewhere in the kernel
        v = verdict(dump)
        assert v.places[0].place.startswith("in D state, kernel wait ")


def test_hard_time_limit_kills_pyspy(tmp_path: Path) -> None:
    """A py-spy that never answers is killed after the limit, and the dump goes on."""
    token = uuid.uuid4().hex
    slow = tmp_path / "py-spy"
    slow.write_text(f"#!/bin/sh\nexport {TOKEN_VAR}={token}\nexec sleep 60\n")
    slow.chmod(0o755)
    try:
        with _sleeper(SLEEPER) as proc:
            assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
            start = time.monotonic()
            dump = dump_ranks([(0, 0, proc.pid), (1, 1, proc.pid)], "slow", 0.5, pyspy=str(slow))
            assert time.monotonic() - start < 3  # in parallel: about one limit, not two
            for rank in dump.ranks:
                assert rank.process.error == "py-spy did not answer in 0.5s; killed"
            assert wait_gone(token, 5) == []  # the hung py-spy was killed, not left running
    finally:
        _kill_token(token)


def test_shim_registers_faulthandler_only_on_a_free_realtime_signal() -> None:
    code = "from tui_launch.core.workers import shim; print(shim.install_faulthandler())"

    def run(value: str | None) -> subprocess.CompletedProcess[str]:
        env = base_env()
        env.pop(FAULTHANDLER_ENV, None)
        if value is not None:
            env[FAULTHANDLER_ENV] = value
        return subprocess.run(
            [PY, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )

    assert run(None).stdout.strip() == "None"
    ok = run(str(int(FAULTHANDLER_SIGNAL)))
    assert ok.stdout.strip() == str(int(FAULTHANDLER_SIGNAL)) and ok.stderr == ""
    for bad in (str(int(signal.SIGUSR1)), str(int(signal.SIGUSR2)), str(int(INJECT_SIGNAL)), "x"):
        p = run(bad)
        assert p.stdout.strip() == "None" and "not a free real-time signal" in p.stderr, bad


def test_faulthandler_signal_prints_and_the_process_lives(tmp_path: Path) -> None:
    """A plain program (no torch) through the shim's registration: dump, and it keeps running."""
    body = """
        import time
        from tui_launch.core.workers import shim
        shim.install_faulthandler()
        def load_batch():
            time.sleep(600)
        print("up", flush=True)
        load_batch()
    """
    err = tmp_path / "err.log"
    token = uuid.uuid4().hex
    env = base_env(**{FAULTHANDLER_ENV: str(int(FAULTHANDLER_SIGNAL)), TOKEN_VAR: token})
    with open(err, "wb") as fe:
        proc = subprocess.Popen(
            [PY, "-c", textwrap.dedent(body)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=fe
        )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"

        def in_load_batch() -> ThreadStack | None:
            # "up" is printed just before load_batch is entered: dump until it is there.
            dump = dump_via_faulthandler([(0, 0, proc.pid)], {0: str(err)}, "fh")
            main = dump.ranks[0].process.main_thread
            return main if main is not None and main.frames[0].function == "load_batch" else None

        main = wait_for(in_load_batch, 20, what="the main thread in load_batch")
        assert main.frames[0].file == "<string>" and main.frames[-1].function == "<module>"
        assert proc.poll() is None
        # Stopped: not signalled (it would print later, into another dump's window).
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: pyspy_mod.proc_state(proc.pid) == "T", 10, what="state T")
        (stopped,) = dump_via_faulthandler([(0, 0, proc.pid)], {0: str(err)}, "fh").ranks
        assert stopped.process.error is not None and "stopped (T)" in stopped.process.error
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        _kill_token(token)


# --------------------------------------------------------------------------- pure


def _f(function: str, file: str, line: int = 1) -> Frame:
    return Frame(function=function, file=file, line=line, path=f"/x/site-packages/{file}")


def _user(function: str, line: int) -> Frame:
    return Frame(function=function, file="train.py", line=line, path="/work/train.py")


COLL = (
    _f("all_reduce", "torch/distributed/distributed_c10d.py", 3252),
    _f("_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83),
    _user("step", 42),
    _user("main", 90),
)
LOAD = (_user("load_batch", 87), _user("step", 40), _user("main", 90))


def _rank(g: int, frames: tuple[Frame, ...] | None, **proc: object) -> RankStack:
    threads = () if frames is None else (ThreadStack(g + 100, "MainThread", frames, main=True),)
    fields: dict[str, object] = {"pid": 1000 + g, "state": "S", "method": "py-spy"}
    fields.update(proc)
    return RankStack(g, g, ProcessStack(threads=threads, **fields))  # type: ignore[arg-type]


def _dump(*ranks: RankStack, wall: float = 1000.0) -> StackDump:
    return StackDump(reason="t", wall=wall, duration=0.1, ranks=ranks)


def test_collective_classifier() -> None:
    assert collective_of(COLL) == "all_reduce"
    assert collective_of(LOAD) is None
    # A "wait" of the user's own is not a collective; one inside torch.distributed is.
    assert collective_of((_user("wait", 3), *LOAD)) is None
    assert collective_of((_f("Work.wait", "torch/distributed/distributed_c10d.py"), *LOAD))
    assert collective_of((_f("synchronize", "torch/cuda/__init__.py"), *LOAD)) == "synchronize"
    assert collective_of((_f("_next_data", "torch/utils/data/dataloader.py"), *LOAD)) is None
    # Outermost matching frame of the library run: the call the user wrote.
    barrier = (_f("_store_based_barrier", "torch/distributed/distributed_c10d.py"),)
    assert collective_of((*barrier, _f("barrier", "torch/distributed/distributed_c10d.py"))) == (
        "barrier"
    )
    # Beyond the first user frame nothing counts (a collective further out is not a wait).
    assert collective_of((_user("f", 1), *COLL)) is None


def test_rank_list() -> None:
    assert rank_list([0, 2, 3, 4, 5, 6, 7]) == "0, 2-7"
    assert rank_list([5, 1, 2]) == "1, 2, 5"
    assert rank_list([]) == ""


def test_verdict_names_the_odd_rank_of_eight_and_groups_stacks() -> None:
    dump = _dump(*[_rank(g, LOAD if g == 3 else COLL) for g in range(8)])
    v = verdict(dump)
    assert v.text == (
        "rank 3 is not in a collective: train.py:87 in load_batch; "
        "ranks 0-2, 4-7 wait in all_reduce"
    )
    assert v.odd == (3,)
    assert [p.top.function if p.top else None for p in v.places][:4] == [
        "all_reduce",
        "all_reduce",
        "all_reduce",
        "load_batch",
    ]
    groups = group_stacks(dump)
    assert [g.ranks for g in groups] == [(0, 1, 2, 4, 5, 6, 7), (3,)]
    text = render_text(dump, v)
    assert text.splitlines()[0] == v.text
    assert "main thread of ranks 0-2, 4-7 (\u00d7 7 ranks):" in text
    # Each distinct stack once: eight ranks, two stacks.
    assert text.count("\n    train.py:87 in load_batch") == 1
    assert text.count("\n    torch/distributed/distributed_c10d.py:3252 in all_reduce") == 1


def test_verdict_every_rank_in_the_same_place() -> None:
    v = verdict(_dump(*[_rank(g, COLL) for g in range(4)]))
    assert v.same_place and v.odd == ()
    assert (
        v.text == "every rank is in the same place: all_reduce (train.py:42 in step) (a collective)"
    )
    v = verdict(_dump(*[_rank(g, LOAD) for g in range(2)]))
    assert v.text == "every rank is in the same place: train.py:87 in load_batch (no collective)"


def test_verdict_other_shapes() -> None:
    bcast = (_f("broadcast", "torch/distributed/distributed_c10d.py"), _user("sync", 7))
    v = verdict(_dump(_rank(0, COLL), _rank(1, COLL), _rank(2, bcast)))
    assert v.odd == (2,)
    assert (
        v.text
        == "ranks are in different collectives: ranks 0, 1 wait in all_reduce; rank 2 in broadcast"
    )
    other = (_user("save_checkpoint", 12), _user("main", 90))
    v = verdict(_dump(_rank(0, COLL), _rank(1, LOAD), _rank(2, other)))
    assert v.odd == (1, 2)
    assert v.text.startswith("ranks 1, 2 are not in a collective: rank 1 at train.py:87")
    v = verdict(_dump(_rank(0, COLL), _rank(1, LOAD), _rank(2, None, error="process is gone")))
    assert v.text.endswith("; no stack for rank 2 (process is gone)"), v.text
    assert v.odd == (1,)
    gone = verdict(_dump(_rank(0, None, error="process is gone")))
    assert gone.text == "no stacks: rank 0 (process is gone)"
    assert verdict(_dump()).text == "no stacks: no ranks"
    d = _rank(1, None, method="wchan", state="D", wchan="nfs_wait_bit_killable")
    v = verdict(_dump(_rank(0, COLL), d))
    assert v.text == (
        "rank 1 is not in a collective: in D state, kernel wait nfs_wait_bit_killable; "
        "rank 0 waits in all_reduce"
    )


def test_parse_pyspy_json_puts_the_main_thread_first() -> None:
    threads = [
        {"thread_id": 2, "thread_name": "helper", "os_thread_id": 11, "active": False,
         "owns_gil": False, "frames": [{"name": "run",
         "filename": "/usr/lib/python3.11/threading.py", "line": 9}]},
        {"thread_id": 1, "thread_name": "MainThread", "os_thread_id": 10, "active": True,
         "owns_gil": True, "frames": [{"name": "load_batch", "filename": "/w/train.py",
         "line": 87}]},
    ]  # fmt: skip
    main, helper = parse_pyspy_json(json.dumps(threads), pid=10)
    assert main.main and main.name == "MainThread" and main.owns_gil
    assert main.frames == (Frame("load_batch", "train.py", 87, "/w/train.py"),)
    assert helper.frames[0].file == "threading.py" and not helper.main


FH_TEXT = """\
step 1 done
Thread 0x00007f840531d6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/w/train.py", line 4 in worker

some other line written meanwhile
Current thread 0x00007f8405e8cb80 (most recent call first):
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/w/train.py", line 42 in step
  File "/w/train.py", line 90 in <module>
Thread 0x00007f8405e8cb81 (most recent call first):
  <no Python frame>
"""


def test_parse_faulthandler_cuts_the_first_dump_main_thread_first() -> None:
    # Output between blocks ends a block but not the dump; a second dump (the same thread ids
    # again) is not part of this one.
    threads = parse_faulthandler(FH_TEXT)
    assert [t.thread_id for t in threads] == [0x7F8405E8CB81, 0x7F840531D6C0, 0x7F8405E8CB80]
    assert threads[0].main and threads[0].frames == ()
    assert threads[1].frames[0] == Frame(
        "wait", "threading.py", 320, "/usr/lib/python3.11/threading.py"
    )
    assert threads[2].frames[0].file == "torch/distributed/distributed_c10d.py"
    assert parse_faulthandler("nothing here\n") == ()
    two = FH_TEXT.replace("some other line written meanwhile\n", "") + "\nlater output\n" + FH_TEXT
    assert len(parse_faulthandler(two)) == 3


def test_confirm_compares_main_thread_stacks() -> None:
    first = _dump(_rank(0, COLL), _rank(1, LOAD), wall=100.0)
    same = _dump(_rank(0, COLL), _rank(1, LOAD), wall=110.0)
    c = confirm(first, same)
    assert c.hung and c.still == (0, 1) and c.moved == () and c.interval == 10.0
    assert c.text == "hung: no main-thread stack moved in 10 s (ranks 0, 1)"
    moved = _dump(_rank(0, COLL), _rank(1, (_user("load_batch", 88), *LOAD[1:])), wall=110.0)
    c = confirm(first, moved)
    assert not c.hung and c.moved == (1,) and c.still == (0,)
    c = confirm(first, _dump(_rank(0, None, error="gone"), _rank(1, None, error="gone")))
    assert not c.hung and c.unknown == (0, 1)


def test_confirm_takes_a_rank_stopped_in_both_dumps_as_still() -> None:
    # SIGSTOPped while its interpreter started: no Python frame to read in either dump, and
    # it has not moved (before, it was never confirmed: a suspicion every few seconds, forever).
    first = _dump(_rank(0, None, state="T"), wall=100.0)
    c = confirm(first, _dump(_rank(0, None, state="T"), wall=104.0))
    assert c.hung and c.still == (0,) and c.unknown == ()
    # Continued between the dumps: nothing proves a hang.
    c = confirm(first, _dump(_rank(0, None, state="S"), wall=104.0))
    assert not c.hung and c.unknown == (0,)


def test_confirm_counts_collectives_that_advanced_as_moving() -> None:
    # A loop caught at the same all-reduce line in both dumps still moves: its Flight
    # Recorder numbers advanced between them.
    def records(*seqs: int) -> tuple[RankRecord, ...]:
        return tuple(RankRecord(g, last_enqueued=n) for g, n in enumerate(seqs))

    first = dataclasses.replace(_dump(_rank(0, COLL), _rank(1, COLL), wall=100.0),
                                records=records(840, 840))  # fmt: skip
    later = dataclasses.replace(_dump(_rank(0, COLL), _rank(1, COLL), wall=104.0),
                                records=records(900, 899))  # fmt: skip
    c = confirm(first, later)
    assert not c.hung and c.moved == (0, 1) and c.still == ()
    assert c.text == "not hung: the collectives of ranks 0, 1 advanced in 4 s"
    stuck = dataclasses.replace(later, records=records(840, 840))
    assert confirm(first, stuck).hung
    # Two looks within one dump that saw it move are enough too.
    looked = dataclasses.replace(
        stuck,
        records=(RankRecord(0, last_enqueued=840), RankRecord(1, last_enqueued=840, looks=(838,))),
    )
    c = confirm(first, looked)
    assert not c.hung and c.moved == (1,) and c.still == (0,)


def test_a_suspicion_cleared_says_so() -> None:
    from tui_launch.core.model.text import describe

    e = ev.HangCleared(0, (), "stacks", "not hung: the stacks of ranks 0, 1 moved in 4 s",
                       suspected=True)  # fmt: skip
    assert describe(e) == (
        "hang suspicion cleared (attempt 0): not hung: the stacks of ranks 0, 1 moved in 4 s"
    )
    assert ev.from_dict(json.loads(json.dumps(ev.to_dict(e)))) == e
    named = dataclasses.replace(e, ranks=(1,), why="output", detail="rank 1 wrote output again")
    assert describe(named) == (
        "hang suspicion cleared (attempt 0, ranks 1): rank 1 wrote output again"
    )


def test_hang_detector_suspects_after_silence_on_all_ranks_and_confirms() -> None:
    det = HangDetector(timeout=300, confirm_after=10)
    det.start(0.0, ranks=[0, 1])
    det.output(0, 100.0)
    det.output(1, 250.0)  # e.g. a tqdm "\r" update: output without a newline counts
    assert det.poll(399.0) == NOTHING  # rank 0 has been silent for 299 s, rank 1 for less
    assert det.poll(549.0) == NOTHING
    assert det.poll(550.0) == DUMP  # 300 s since the last output of any rank
    assert det.poll(551.0) == NOTHING  # asked once; waits for the first dump
    first = _dump(_rank(0, COLL), _rank(1, LOAD), wall=550.0)
    det.first(first, 551.0)
    assert det.poll(560.0) == NOTHING
    assert det.poll(561.0) == CONFIRM
    c = det.second(_dump(_rank(0, COLL), _rank(1, LOAD), wall=561.0), 561.5)
    assert c.hung and det.state == "hung"
    assert det.poll(9999.0) == NOTHING  # confirmed once; no more dumps while nothing changes
    event = hang_event(c, first, attempt=0, silence=det.silence(561.5), first_path="a",
                       second_path="b")  # fmt: skip
    assert event.still_ranks == (0, 1) and event.odd_ranks == (1,) and event.silence == 311.5
    assert ev.from_dict(json.loads(json.dumps(ev.to_dict(event)))) == event
    det.output(1, 10000.0)  # the job moved again: watch afresh
    assert det.state == "watching" and det.poll(10299.0) == NOTHING and det.poll(10300.0) == DUMP


def test_hang_detector_quiet_progress_with_moving_stacks_is_not_a_hang() -> None:
    det = HangDetector(timeout=60, confirm_after=10)
    det.start(0.0, ranks=[0])
    assert det.poll(60.0) == DUMP
    det.first(_dump(_rank(0, COLL), wall=60.0), 60.0)
    assert det.poll(70.0) == CONFIRM
    c = det.second(_dump(_rank(0, LOAD), wall=70.0), 70.0)
    assert not c.hung and det.state == "watching"
    # Re-armed: the next suspicion is a full timeout after the second dump, not at once.
    assert det.poll(71.0) == NOTHING and det.poll(129.0) == NOTHING and det.poll(130.0) == DUMP


def test_hang_detector_output_cancels_a_suspicion_and_zero_turns_it_off() -> None:
    det = HangDetector(timeout=5, confirm_after=10)
    det.start(0.0, ranks=[0, 1])
    assert det.poll(5.0) == DUMP
    det.first(_dump(_rank(0, COLL), _rank(1, COLL)), 5.0)
    det.output(0, 7.0)
    assert det.state == "watching" and det.poll(11.0) == NOTHING and det.poll(12.0) == DUMP
    with pytest.raises(RuntimeError):
        HangDetector(5).second(_dump(), 1.0)
    off = HangDetector(timeout=0)
    off.start(0.0, [0])
    assert not off.enabled and off.poll(1e9) == NOTHING
