"""The worker environment and argv under tuilaunch equal torchrun's for the same command line.

Each case runs an env-dumping worker under ``torchrun`` and then (never at the same time) under
``tuilaunch --no-tui`` with the same arguments and the same output directory, and compares what
every rank saw. Only these values may differ, and each is checked for what it must be instead:

* ``TUILAUNCH_TEST_TOKEN``: the test's per-launch token (each launch's own).
* ``TORCHELASTIC_ERROR_FILE``: under the run's fresh temporary log directory; the part below
  it (``attempt_0/<local rank>/error.json``) is the same.
* ``MASTER_PORT``: a free port picked per launch -- except with static rendezvous and an
  explicit ``--master-port``, where it must be equal.
* ``TORCHELASTIC_RUN_ID``: a generated uuid with ``--standalone`` -- equal otherwise.
* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` and ``TORCHELASTIC_USE_AGENT_STORE``: tuilaunch's one
  deliberate difference (a fresh rendezvous store per attempt): ``1`` and ``False`` under
  tuilaunch with the c10d rendezvous, unless the user set the variable, where both are equal.
* ``TTY_COMPATIBLE``: the other deliberate difference (rich draws its progress bars on the
  rank's log file: Lightning's default bar, docs/dashboard.md): ``1`` under tuilaunch, absent
  under torchrun, unless the user set it, where both are equal.

* the Flight Recorder's variables (``flightrec.VARIABLES``, docs/differences.md): set by
  tuilaunch's default worker bootstrap, absent under torchrun; with ``--no-bootstrap``
  (``plain``) and ``--no-python`` (no Python worker to bootstrap) absent in both.

Every other key must be present in both with an identical value.

Each case runs torchrun once and tuilaunch three times against it: as is (``cold``), with
``--warm-start`` (``warm``: workers start in spare interpreters that imported torch ahead;
``--no-python`` refuses it, so that case runs cold only) and with ``--no-bootstrap``
(``plain``: torchrun's exact worker process).
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import WORKERS, base_env, free_port, wait_gone

from tui_launch.core.seam import flightrec

SHARE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
TTY = "TTY_COMPATIBLE"
TOKEN = "TUILAUNCH_TEST_TOKEN"
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"

SHELL_DUMP = r"""#!/bin/sh
mkdir -p "$1"
env -0 > "$1/env_$RANK.txt"
printf '%s\0' "$0" "$@" > "$1/argv_$RANK.txt"
"""


@dataclass
class Case:
    launcher_args: list[str]
    script: list[str]  # the entry point (and -m); the output directory and extra args follow
    nproc: int
    fmt: str = "json"  # json: env_<rank>.json; env0: env -0 and argv of a shell script
    cwd: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    standalone: bool = True
    master_port: int | None = None  # fixed with static rendezvous


def make_case(name: str, tmp_path: Path) -> Case:
    env_dump = str(WORKERS / "env_dump.py")
    if name.startswith("standalone-"):
        n = int(name.split("-")[1])
        return Case(["--standalone", "--nproc-per-node", str(n)], [env_dump], n)
    if name == "static":
        port = free_port()
        args = [
            "--nnodes",
            "1",
            "--node-rank",
            "0",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
        ]
        return Case(args, [env_dump], 2, standalone=False, master_port=port)
    if name == "no-python":
        script = tmp_path / "dump.sh"
        script.write_text(SHELL_DUMP)
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return Case(
            ["--standalone", "--nproc-per-node", "2", "--no-python"], [str(script)], 2, fmt="env0"
        )
    if name == "module":
        return Case(["--standalone", "--nproc_per_node", "2", "-m"], ["pkg.envmod"], 2, cwd=WORKERS)
    if name == "run-path":
        return Case(["--standalone", "--nproc-per-node", "1", "--run-path"], [env_dump], 1)
    if name == "user-share-0":
        # A cheap worker: what is compared is the environment the launcher gives it.
        return Case(
            ["--standalone", "--nproc-per-node", "2", "-m"],
            ["pkg.envmod"],
            2,
            cwd=WORKERS,
            extra_env={SHARE: "0"},
        )
    raise AssertionError(name)


def read_dumps(out: Path, fmt: str) -> dict[int, tuple[list[str], dict[str, str]]]:
    dumps = {}
    if fmt == "json":
        for f in out.glob("env_*.json"):
            data = json.loads(f.read_text())
            dumps[int(f.stem.split("_")[1])] = (data["argv"], data["env"])
    else:
        for f in out.glob("env_*.txt"):
            rank = int(f.stem.split("_")[1])
            env = dict(item.split("=", 1) for item in f.read_text().split("\0") if item)
            argv = (out / f"argv_{rank}.txt").read_text().split("\0")[:-1]
            dumps[rank] = (argv, env)
    return dumps


def run_all(
    case: Case, tmp_path: Path, torchrun, tuilaunch, variants: dict[str, tuple[str, ...]]
) -> dict[str, tuple[dict[int, tuple[list[str], dict[str, str]]], object]]:
    """Run torchrun, then tuilaunch once per variant (its flags first), one after the other;
    return (dumps, launch) by name ("torchrun" and each variant's)."""
    out = tmp_path / "out"
    results = {}
    runs = [("torchrun", torchrun, ())] + [(n, tuilaunch, f) for n, f in variants.items()]
    for name, start, flags in runs:
        env = base_env(**case.extra_env)
        launch = start(
            *flags,
            *case.launcher_args,
            *case.script,
            str(out),
            "--flag-like",
            "x y",
            cwd=case.cwd,
            env=env,
        )
        assert launch.wait() == 0, f"{name} failed:\n{launch.output[-4000:]}"
        # Nothing of this launch may linger while the next one runs.
        assert wait_gone(launch.token, 10) == []
        dest = tmp_path / name
        out.rename(dest)  # the next launch writes to the same path: argv stays identical
        results[name] = (read_dumps(dest, case.fmt), launch)
    return results


CASES = [
    "standalone-1",
    # Both launchers fresh interpreters, as a user starts them; the others are forked from
    # the suite's pre-imported one (tests/prefork.py), whose launch environment is the same.
    pytest.param("standalone-2", marks=pytest.mark.fresh_launcher),
    "standalone-4",
    "static",
    "no-python",
    "module",
    "run-path",
    "user-share-0",
]


@pytest.mark.parametrize("name", CASES)
def test_worker_env_equals_torchrun(name, tmp_path, torchrun, tuilaunch):
    case = make_case(name, tmp_path)
    # One torchrun run is the reference for both modes (--no-python cannot start warm).
    variants = (
        {"cold": ()}
        if name == "no-python"
        else {"cold": (), "warm": ("--warm-start",), "plain": ("--no-bootstrap",)}
    )
    results = run_all(case, tmp_path, torchrun, tuilaunch, variants)
    theirs, t_launch = results["torchrun"]
    assert sorted(theirs) == list(range(case.nproc)), f"torchrun dumps: {sorted(theirs)}"
    for mode in variants:
        ours, o_launch = results[mode]
        assert sorted(ours) == list(range(case.nproc)), f"tuilaunch {mode}: {sorted(ours)}"
        compare(case, mode, tmp_path, theirs, t_launch, ours, o_launch)


def compare(case: Case, mode: str, tmp_path: Path, theirs, t_launch, ours, o_launch) -> None:
    """Every rank's argv and environment under tuilaunch (``mode``) against torchrun's."""
    dynamic = case.standalone  # the c10d rendezvous; static never shares a fresh store
    user_share = case.extra_env.get(SHARE)
    for rank in range(case.nproc):
        t_argv, t_env = theirs[rank]
        o_argv, o_env = ours[rank]

        # argv: the script's own arguments, flag-like ones included, untouched.
        assert o_argv == t_argv
        assert o_argv[-3:] == [str(tmp_path / "out"), "--flag-like", "x y"]

        # The dump is a real worker environment, not something trivially equal.
        assert o_env["RANK"] == str(rank)
        assert o_env["LOCAL_RANK"] == str(rank)
        assert o_env["WORLD_SIZE"] == str(case.nproc)

        ignored: set[str] = {TOKEN, ERROR_FILE}
        assert t_env[TOKEN] == t_launch.token
        assert o_env[TOKEN] == o_launch.token
        suffix = os.path.join("attempt_0", str(rank), "error.json")
        assert t_env[ERROR_FILE].endswith(os.sep + suffix), t_env[ERROR_FILE]
        assert o_env[ERROR_FILE].endswith(os.sep + suffix), o_env[ERROR_FILE]

        if case.master_port is None:
            ignored.add("MASTER_PORT")
            assert 0 < int(t_env["MASTER_PORT"]) < 65536
            assert 0 < int(o_env["MASTER_PORT"]) < 65536
        else:
            assert o_env["MASTER_PORT"] == t_env["MASTER_PORT"] == str(case.master_port)
            assert o_env["MASTER_ADDR"] == t_env["MASTER_ADDR"] == "127.0.0.1"
            assert o_env["TORCHELASTIC_RUN_ID"] == t_env["TORCHELASTIC_RUN_ID"] == "none"

        if case.standalone:
            ignored.add("TORCHELASTIC_RUN_ID")
            uuid.UUID(t_env["TORCHELASTIC_RUN_ID"])
            uuid.UUID(o_env["TORCHELASTIC_RUN_ID"])

        if user_share is not None:
            # The user's setting wins in both: nothing differs.
            assert o_env[SHARE] == t_env[SHARE] == user_share
            assert o_env[AGENT_STORE] == t_env[AGENT_STORE] == "True"
        else:
            ignored.add(SHARE)
            assert SHARE not in t_env
            assert o_env[SHARE] == "1"
            if dynamic:
                ignored.add(AGENT_STORE)
                assert t_env[AGENT_STORE] == "True"
                assert o_env[AGENT_STORE] == "False"
            else:
                assert o_env[AGENT_STORE] == t_env[AGENT_STORE] == "True"

        if mode != "plain" and case.fmt != "env0":  # the bootstrap arms the Flight Recorder
            for key in flightrec.VARIABLES:
                assert key not in t_env and o_env.pop(key), (mode, key)
        if TTY in t_env:  # the user's setting wins in both
            assert o_env[TTY] == t_env[TTY]
        else:
            assert o_env.pop(TTY) == "1"

        assert set(o_env) - {SHARE} == set(t_env) - {SHARE}, (
            f"{mode}: keys only under tuilaunch: {sorted(set(o_env) - set(t_env))}; "
            f"only under torchrun: {sorted(set(t_env) - set(o_env))}"
        )
        differing = {
            k: (t_env[k], o_env[k]) for k in t_env if k not in ignored and t_env[k] != o_env[k]
        }
        assert differing == {}, (
            f"{mode} rank {rank}: (torchrun, tuilaunch) values differ: {differing}"
        )
