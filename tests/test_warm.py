"""``--warm-start``: workers are forked from a spare interpreter that imported torch ahead of need.

Real launches. What is checked is behaviour, never time: the worker is forked from a process
that existed before the failure it replaces, with torch already imported when the script
starts, and it is the very process torch monitors (its pid is the one in the journal); the
worker sees what a cold worker sees (argv, ``sys.path[0]``, working directory, ``__main__``,
thread count from ``OMP_NUM_THREADS``, nice value); the spare and its workers die with a
SIGKILLed launcher; ``--no-python`` is refused. The environment itself is compared with
torchrun's in ``test_env_parity.py``, which runs every case in both modes.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import WORKERS, base_env, journal_path, leftovers, read_journal, wait_for, wait_gone

PROBE = str(WORKERS / "warm_probe.py")


def probes(out: Path) -> dict[tuple[int, int], dict]:
    """``(attempt, rank) -> probe`` of every worker that ran."""
    found = {}
    for f in out.glob("probe_*.json"):
        _, attempt, rank = f.stem.split("_")
        found[(int(attempt), int(rank))] = json.loads(f.read_text())
    return found


def worker_pids(journal: list[dict], attempt: int) -> set[int]:
    started = [e for e in journal if e["kind"] == "workers_started" and e["attempt"] == attempt]
    assert len(started) == 1, started
    return {w["pid"] for w in started[0]["workers"]}


def test_restart_runs_in_spares_started_before_the_failure(tmp_path, tuilaunch):
    out = tmp_path / "out"
    launch = tuilaunch(
        "--warm-start",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        PROBE,
        str(out),
        "crash",
    )
    assert launch.wait() == 0, launch.output[-4000:]
    seen = probes(out)
    assert sorted(seen) == [(0, 0), (0, 1), (1, 0), (1, 1)], sorted(seen)
    failed_at = seen[(0, 0)]["failed_at"]
    journal = read_journal(journal_path(launch.output))
    for attempt in (0, 1):
        # The process torch started, signals and polls is the one that ran the script.
        assert {seen[(attempt, r)]["pid"] for r in (0, 1)} == worker_pids(journal, attempt)
        for r in (0, 1):
            p = seen[(attempt, r)]
            assert p["preloaded"]["torch"] is True, p  # the first attempt is warm too
            assert p["nice"] == 0, p  # a spare imports at low priority; workers do not run so
            assert p["pgid"] == p["sid"] == p["pid"], p  # own session, as torch's workers
    spares = {seen[key]["ppid"] for key in seen}
    assert len(spares) == 1, seen  # every worker of both attempts forked from one spare
    for r in (0, 1):
        # The restarted workers were forked from a spare that existed before rank 0 failed.
        assert seen[(1, r)]["parent_started"] < failed_at, (seen[(1, r)], failed_at)
    failed = [e for e in journal if e["kind"] == "attempt_failed"]
    assert [f["exit_code"] for f in failed[0]["failures"] if f["global_rank"] == 0] == [3]
    notices = [e["message"] for e in journal if e["kind"] == "notice"]
    assert any("attempt 1: local rank(s) 0, 1 started in spares" in n for n in notices), notices
    # Spares are never workers: two ranks per attempt in every event that lists workers.
    assert all(len(e["workers"]) == 2 for e in journal if e["kind"] == "workers_started")


@pytest.mark.parametrize("nproc, omp", [(2, None), (1, "1")])
def test_worker_sees_what_a_cold_worker_sees(nproc, omp, tmp_path, tuilaunch, torchrun):
    """argv, sys.path[0], cwd, __main__, OMP_NUM_THREADS (read when torch loads), nice,
    /proc/<pid>/environ showing the worker's environment and /proc/<pid>/cmdline naming the
    script equal torchrun's; pkg.mod from
    --warm-import is imported ahead, found beside the script."""
    extra = {"OMP_NUM_THREADS": omp} if omp else {}
    results = {}
    for name, start, flags in (
        ("torchrun", torchrun, []),
        ("warm", tuilaunch, ["--warm-start", "--warm-import", "pkg.mod"]),
    ):
        out = tmp_path / "out"
        launch = start(
            *flags, "--standalone", "--nproc-per-node", str(nproc), PROBE, str(out),
            cwd=tmp_path, env=base_env(**extra),
        )  # fmt: skip
        assert launch.wait() == 0, launch.output[-4000:]
        assert wait_gone(launch.token, 10) == []
        dest = tmp_path / name
        out.rename(dest)
        results[name] = probes(dest)
        if name == "warm":
            journal = read_journal(journal_path(launch.output))
            notices = [e["message"] for e in journal if e["kind"] == "notice"]
            output = launch.output
    theirs, ours = results["torchrun"], results["warm"]
    assert sorted(theirs) == sorted(ours) == [(0, r) for r in range(nproc)]
    for key in theirs:
        t, o = theirs[key], ours[key]
        for field in (
            *("argv", "path0", "cwd", "name", "threads", "omp", "nice"),
            *("proc_environ", "cmdline_names_script"),
        ):
            assert o[field] == t[field], (field, t[field], o[field])
        assert t["preloaded"] == {"torch": False, "pkg.mod": False}
        assert o["preloaded"] == {"torch": True, "pkg.mod": True}, (notices, output[-3000:])
    if omp:
        assert ours[(0, 0)]["threads"] == 1  # not the core count, the default for one rank


def test_module_and_script_args_with_run_path(tmp_path, tuilaunch):
    """-m and --run-path run through the spares too (the env parity test compares them)."""
    out = tmp_path / "out"
    launch = tuilaunch(
        "--warm-start", "--standalone", "--nproc-per-node", "1", "--run-path", PROBE, str(out)
    )
    assert launch.wait() == 0, launch.output[-4000:]
    p = probes(out)[(0, 0)]
    assert p["argv"] == [PROBE, str(out)]
    assert p["name"] == "__main__"
    assert p["preloaded"]["torch"] is True


def test_spare_and_workers_die_with_a_sigkilled_launcher(tmp_path, tuilaunch):
    launch = tuilaunch(
        "--warm-start",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKERS / "steady.py"),
        "--seconds",
        "60",
    )

    def spare_and_workers() -> list[int]:
        procs = leftovers(launch.token)
        spares = [p for p in procs if b"core.workers.spare" in _cmdline(p)]
        workers = [p for p in procs if b"steady.py" in _cmdline(p) and _ppid(p) in spares]
        return [*spares, *workers] if len(spares) == 1 and len(workers) == 2 else []

    # The spare and the two workers forked from it (they show the worker's command line).
    pids = wait_for(spare_and_workers, 60, what="the spare and two workers forked from it")
    os.kill(launch.pid, signal.SIGKILL)
    launch.wait()
    assert wait_gone(launch.token, 15) == [], [_cmdline(p) for p in leftovers(launch.token)]
    # A dying process's environment reads empty before it is gone: wait for the pids too.
    wait_for(
        lambda: all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in pids),
        15,
        what="the spares and workers to be gone",
    )


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return fp.read()
    except OSError:
        return b""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize(
    "args, message",
    [
        (["--no-python", "true"], "--warm-start runs Python workers in spare interpreters"),
        (["--warm-import", "a..b", "x.py"], "--warm-import: not a module name"),
    ],
)
def test_refused_with_one_line(args, message, tmp_path, tuilaunch):
    launch = tuilaunch("--warm-start", "--standalone", *args, cwd=tmp_path)
    assert launch.wait() == 2
    assert message in launch.stderr, launch.stderr
    assert "Traceback" not in launch.output
    assert len(launch.stderr.strip().splitlines()) == 1, launch.stderr
    assert wait_gone(launch.token, 10) == []


def test_warm_import_needs_warm_start(tmp_path, tuilaunch):
    launch = tuilaunch("--warm-import", "json", "--standalone", "x.py", cwd=tmp_path)
    assert launch.wait() == 2
    assert "--warm-import needs --warm-start" in launch.stderr


def test_a_spare_workers_environment_is_the_one_it_was_handed():
    """/proc/<pid>/environ shows a spare's start environment, not the worker's it applied in
    process: the launcher's record answers instead (telemetry's GPU inference and the fake
    NVML's placement read it), and only for that very process, not a later one with its pid."""
    import subprocess
    import sys

    from tui_launch.core.telemetry import fake_nvml as fake_pynvml
    from tui_launch.core.workers import env as workerenv

    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE, env=base_env())  # fmt: skip
    try:
        assert b"LOCAL_RANK" not in b"".join(workerenv.read_proc(proc.pid))
        assert "LOCAL_RANK" not in workerenv.environ(proc.pid)
        handed = {**base_env(), "LOCAL_RANK": "1", "RANK": "3"}
        workerenv.record(proc.pid, handed)
        assert workerenv.environ(proc.pid) == handed
        # The fake NVML puts it where a script calling torch.cuda.set_device(1) would be.
        fake_pynvml.configure(2)
        placed = fake_pynvml._discover()
        assert [pid for pid, _mem in placed.get(1, [])] == [proc.pid], placed
        # A record whose process start time differs (the pid now names another process).
        workerenv.record(proc.pid, handed)
        with workerenv._lock:
            began, env = workerenv._handed[proc.pid]
            workerenv._handed[proc.pid] = ((began or 0) + 1, env)
        assert workerenv.handed(proc.pid) is None
        assert "LOCAL_RANK" not in workerenv.environ(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        workerenv.forget(proc.pid)


def test_after_the_imports_the_spare_counts_only_its_own_threads():
    """The spare forks only when it runs one thread, and counts them from /proc right after
    joining its import thread. ``Thread.join`` returns a moment before the OS thread leaves
    /proc (seen in ~1 of 400 joins on a loaded 2-core machine), which once sent every rank of
    a CI run cold; the join now waits for it. 3,000 joins in a fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import socket\n"
        "from tui_launch.core.workers import spare\n"
        "a, b = socket.socketpair()\n"
        "extra = 0\n"
        "for _ in range(3000):\n"
        "    imp = spare._Importer(a, low=False)\n"
        "    imp.start((), say_ready=False)\n"
        "    imp.join()\n"
        "    extra += spare._thread_count() - 1\n"
        "print(extra)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=base_env(), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], done.stdout


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return int(fp.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_dead_spare_means_a_cold_restart_and_a_new_spare(tmp_path, tuilaunch):
    """The spare SIGKILLed while its workers train: they train on; after a worker fails, the
    next attempt starts cold (as torchrun would) and a new spare is started for later ones."""
    journal, restarts = tmp_path / "journal.jsonl", tmp_path / "restarts.txt"
    launch = tuilaunch(
        "--warm-start", "--journal", str(journal), "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "1", str(WORKERS / "steady.py"), "--seconds", "600",
        "--restart-log", str(restarts),
    )  # fmt: skip

    def attempt(n: int) -> dict[int, int]:
        text = restarts.read_text() if restarts.exists() else ""
        rows = [line.split() for line in text.splitlines() if len(line.split()) == 3]
        found = {int(r): int(p) for r, a, p in rows if int(a) == n}
        return found if len(found) == 2 else {}

    try:
        first = wait_for(lambda: attempt(0), 120, what="attempt 0's two workers")
        spare = _ppid(first[0])
        assert spare is not None and b"core.workers.spare" in _cmdline(spare), _cmdline(spare or 0)
        assert _ppid(first[1]) == spare  # both forked from the one spare
        os.kill(spare, signal.SIGKILL)
        wait_for(lambda: _zombie(spare), 15, what="the spare to be gone")
        os.kill(first[0], signal.SIGKILL)
        second = wait_for(lambda: attempt(1), 120, what="attempt 1's two workers")
        # Cold: started by torch itself, children of the launcher.
        assert {_ppid(p) for p in second.values()} == {launch.pid}

        def notices() -> list[str]:
            events = read_journal(journal) if journal.exists() else []
            return [e["message"] for e in events if e["kind"] == "notice"]

        cold = "warm start: attempt 1: local rank(s) none started in spares; 0, 1 cold"
        wait_for(lambda: any(cold in n for n in notices()), 30, what="the cold-start notice")

        def new_spare() -> list[int]:
            return [
                p for p in leftovers(launch.token)
                if p != spare and b"core.workers.spare" in _cmdline(p) and _ppid(p) == launch.pid
            ]  # fmt: skip

        wait_for(new_spare, 30, what="a new spare for later attempts")
    finally:
        launch.proc.send_signal(signal.SIGTERM)
        launch.wait()
    assert wait_gone(launch.token, 15) == [], [_cmdline(p) for p in leftovers(launch.token)]


def test_a_warm_import_that_starts_threads_means_a_cold_start(tmp_path, tuilaunch):
    """Forking a process that runs threads could copy a lock one of them holds: the rank
    starts cold instead (same process, exec), and says so on its stderr."""
    (tmp_path / "threadmod.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    out = tmp_path / "out"
    launch = tuilaunch(
        "--warm-start", "--warm-import", "threadmod", "--standalone", "--nproc-per-node", "1",
        PROBE, str(out), env=base_env(PYTHONPATH=str(tmp_path)),
    )  # fmt: skip
    assert launch.wait() == 0, launch.output[-4000:]
    p = probes(out)[(0, 0)]
    assert p["preloaded"]["torch"] is False, p  # a fresh interpreter: the cold command
    assert "could deadlock; this rank starts cold" in launch.output, launch.output[-4000:]
    assert wait_gone(launch.token, 10) == []
