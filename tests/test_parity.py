"""The bootstrap's parity contract (docs/differences.md, "The worker bootstrap"), line by line.

One program (``tests/workers/parity.py``) records what a program can see of how it was
started, by ordinary means, and ends in each of the ways a program ends. It runs under
``torchrun``, under ``tuilaunch`` as a user gets it (the bootstrap and the Flight Recorder
on) and under ``tuilaunch --no-bootstrap`` (torchrun's exact worker process), one launch after
another with the same arguments, and what it saw is compared:

- identical in all three: ``sys.argv``, ``sys.path``, ``__main__`` (name, ``__file__``,
  ``__spec__``, ``__package__``, loader, builtins), the signal handlers it starts with, a
  handler it installs itself, ``fork`` and ``spawn`` children and DataLoader workers (their
  argv and ``__main__``, a class of ``__main__`` pickled to them), ``atexit``, the exit status
  of ``sys.exit``, ``os._exit``, an uncaught exception and a death by signal, a program's own
  SIGTERM handler answering the launcher's stop, and the bytes of stdout and stderr (an
  uncaught exception's traceback included);
- the environment: identical but for the per-launch values and tuilaunch's documented
  variables, and with the bootstrap the Flight Recorder's (each named in the page);
- what differs with the bootstrap, as the page says: one more thread
  (``tuilaunch-responder``), ``/proc/<pid>/cmdline`` and ``sys.orig_argv``; with
  ``--no-bootstrap`` those are torchrun's too.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
from conftest import ROOT, WORKERS, base_env, journal_path, read_journal, wait_for, wait_gone

from tui_launch.core.seam import flightrec

PARITY = str(WORKERS / "parity.py")
MODES = {"torchrun": None, "tuilaunch": (), "no-bootstrap": ("--no-bootstrap",)}
# Per launch: the test's token, a free port, a generated run id, the error file's directory.
PER_LAUNCH = {"TUILAUNCH_TEST_TOKEN", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
# tuilaunch's own, with or without the bootstrap (differences 1 and 10).
TUILAUNCH_VARS = {
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TTY_COMPATIBLE",
}
DIFFERENCES = ROOT / "docs" / "differences.md"

pytestmark = pytest.mark.slow


def _launch_all(
    torchrun, tuilaunch, tmp_path: Path, mode: str, nproc: int, *, term=False, script=PARITY
):
    """Run ``parity.py OUT mode`` under each launcher, one after the other; return
    ``{launcher: (out dir, log dir, launch)}``. ``term``: SIGTERM the launcher once every rank
    waits for it. ``script``: the program's path as given (relative ones from ``WORKERS``)."""
    out = tmp_path / "out"  # the same path for each: argv stays comparable
    results = {}
    for name, flags in MODES.items():
        logs = tmp_path / f"logs-{name}"
        args = (
            *("--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "0"),
            *("--redirects", "3", "--log-dir", str(logs), script, str(out), mode),
        )
        env = base_env()
        start = torchrun if flags is None else tuilaunch
        launch = start(*(flags or ()), *args, env=env, cwd=WORKERS)
        if term:
            ready = [out / f"ready_{r}" for r in range(nproc)]
            wait_for(lambda r=ready: all(p.exists() for p in r), 120, what="every rank waits")
            os.kill(launch.pid, signal.SIGTERM)
        launch.wait(180)
        assert wait_gone(launch.token, 10) == []
        dest = tmp_path / name
        out.rename(dest)
        results[name] = (dest, logs, launch)
    return results


def _seen(out: Path, rank: int) -> dict:
    return json.loads((out / f"seen_{rank}.json").read_text())


def _log(logs: Path, rank: int, stream: str) -> bytes:
    (path,) = logs.glob(f"*/attempt_0/{rank}/{stream}.log")
    return path.read_bytes()


def _documented_variables() -> set[str]:
    """The variables docs/differences.md's bootstrap item names as the Flight Recorder's."""
    text = DIFFERENCES.read_text()
    item = text[text.index("**The worker bootstrap") :]
    item = item[: item.index("\n1") if "\n1" in item else len(item)]
    return set(re.findall(r"`((?:TORCH|TUILAUNCH)_[A-Z_]+)`", item))


def _env_differences(theirs: dict, ours: dict) -> dict:
    """The keys whose values differ, or that one side lacks, less the per-launch ones."""
    keys = (set(theirs) | set(ours)) - PER_LAUNCH - {"TORCHELASTIC_ERROR_FILE"}
    return {k: (theirs.get(k), ours.get(k)) for k in keys if theirs.get(k) != ours.get(k)}


@pytest.mark.parametrize("script", [PARITY, "parity.py"], ids=["absolute", "relative"])
def test_a_program_sees_what_it_sees_under_torchrun(torchrun, tuilaunch, tmp_path, script):
    # A relative path too: python makes __main__.__file__ absolute, sys.argv[0] stays as given.
    runs = _launch_all(torchrun, tuilaunch, tmp_path, "ok", 2, script=script)
    for name, (_, _, launch) in runs.items():
        assert launch.proc.returncode == 0, f"{name}:\n{launch.output[-3000:]}"
    ref_out, ref_logs, _ = runs["torchrun"]
    fr_vars = {*flightrec.VARIABLES}
    assert _documented_variables() == fr_vars
    for rank in range(2):
        ref = _seen(ref_out, rank)
        assert ref["main"]["name"] == "__main__" and ref["handlers_ran"] == ["SIGUSR1"]
        assert ref["main"]["file"] == PARITY and ref["argv"][0] == script
        for name in ("tuilaunch", "no-bootstrap"):
            out, logs, _ = runs[name]
            seen = _seen(out, rank)
            for key in ("argv", "path", "main", "handlers", "handlers_ran"):
                assert seen[key] == ref[key], (name, key, seen[key], ref[key])
            for child in ("fork", "spawn"):
                for key in ("tag", "argv", "main_file", "exitcode"):
                    assert seen[child][key] == ref[child][key], (name, child, key)
            assert [(v["tag"], v["argv"], v["main_file"]) for v in seen["loader"]] == [
                (v["tag"], v["argv"], v["main_file"]) for v in ref["loader"]
            ]
            assert (out / f"atexit_{rank}").read_text() == "ran"
            for stream in ("stdout", "stderr"):
                assert _log(logs, rank, stream) == _log(ref_logs, rank, stream), (name, stream)
            added = fr_vars if name == "tuilaunch" else set()
            diff = _env_differences(ref["env"], seen["env"])
            assert set(diff) == TUILAUNCH_VARS | added, (name, diff)
            assert all(diff[k][0] is None for k in added), diff  # set by us, not changed
            for child in ("fork", "spawn"):
                assert set(seen[child]["env_keys"]) ^ set(ref[child]["env_keys"]) <= (
                    TUILAUNCH_VARS | added
                )
            if name == "no-bootstrap":  # torchrun's exact worker process
                assert seen["threads"] == ref["threads"]
                assert seen["cmdline"] == ref["cmdline"] and seen["orig_argv"] == ref["orig_argv"]
            else:  # the differences the page lists: one thread, the command line
                assert seen["threads"] == sorted([*ref["threads"], "tuilaunch-responder"])
                assert seen["cmdline"][:4] == [
                    ref["cmdline"][0],
                    "-u",
                    "-m",
                    "tui_launch.core.workers.shim",
                ]
                assert seen["cmdline"][5:] == ref["cmdline"][2:]
                assert seen["orig_argv"] == seen["cmdline"]
    # The bytes a rank wrote, as written: no newline at the end, a \r, bytes not UTF-8.
    assert _log(ref_logs, 0, "stdout") == b"out: plain line\nno newline, then \r carriage return "
    assert _log(ref_logs, 0, "stderr").endswith(b"err: bytes \xff\xfe not utf-8\n")


@pytest.mark.parametrize(
    ("mode", "code", "atexit"),
    [
        ("exit:3", 3, True),
        ("os_exit:5", 5, False),
        ("raise", 1, True),
        ("signal:SIGSEGV", -11, False),
    ],
)
def test_a_program_ends_as_under_torchrun(torchrun, tuilaunch, tmp_path, mode, code, atexit):
    runs = _launch_all(torchrun, tuilaunch, tmp_path, mode, 1)
    ref_out, ref_logs, ref_launch = runs["torchrun"]
    assert f"exitcode  : {code} " in ref_launch.stderr, ref_launch.stderr[-2000:]
    for name in ("tuilaunch", "no-bootstrap"):
        out, logs, launch = runs[name]
        events = read_journal(journal_path(launch.output))
        assert [e["exit_code"] for e in events if e["kind"] == "rank_exited"] == [code], name
        assert (out / "atexit_0").exists() == atexit == (ref_out / "atexit_0").exists()
        for stream in ("stdout", "stderr"):
            assert _log(logs, 0, stream) == _log(ref_logs, 0, stream), (name, mode, stream)
    if mode == "raise":  # the traceback starts at the program's own frame, as python's
        err = _log(ref_logs, 0, "stderr").decode(errors="replace")
        assert f'Traceback (most recent call last):\n  File "{PARITY}", line' in err, err


def test_a_programs_own_sigterm_handler_answers_the_stop(torchrun, tuilaunch, tmp_path):
    runs = _launch_all(torchrun, tuilaunch, tmp_path, "term", 2, term=True)
    for name, (out, _, launch) in runs.items():
        for rank in range(2):
            assert (out / f"term_{rank}").read_text() == "handled", (name, launch.output[-2000:])
