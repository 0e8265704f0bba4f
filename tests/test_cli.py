"""The command line: exactly torchrun's options plus tuilaunch's group; --help, --version, PET_*."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PY, ROOT, WORKERS, base_env, leftovers, read_journal
from torch.distributed.run import get_args_parser
from torch.distributed.run import parse_args as torch_parse_args

import tui_launch
from tui_launch.cli import SUBCOMMANDS
from tui_launch.core.diagnosis import hangwatch
from tui_launch.core.launch import args as tl_args
from tui_launch.core.launch.options import Flag, Options, flag_of
from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.model import exitcodes, policy
from tui_launch.core.run.config import RunConfig

HELP = {"-h", "--help"}
OURS_EXPECTED = {"--no-tui", "--journal", "--version"}


def option_strings(actions) -> set[str]:
    return {s for a in actions for s in a.option_strings}


def torch_options() -> set[str]:
    return option_strings(get_args_parser()._actions)


def group(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    found = [g for g in parser._action_groups if g.title == title]
    assert len(found) == 1, [g.title for g in parser._action_groups]
    return found[0]


def test_accepted_options_equal_torchrun():
    parser = tl_args.build_parser()
    accepted = option_strings(parser._actions)
    ours = option_strings(group(parser, "tuilaunch options")._group_actions)
    theirs = torch_options()

    assert accepted - ours - HELP == theirs - HELP
    assert option_strings(group(parser, "torchrun options")._group_actions) == theirs - HELP
    # Both spellings of torchrun's options, e.g.:
    assert {
        "--nproc-per-node",
        "--nproc_per_node",
        "--rdzv-endpoint",
        "--rdzv_endpoint",
    } <= accepted
    # The helper the project exposes for this comparison agrees with torch's parser.
    assert tl_args.torch_option_strings() == theirs


def test_own_options_do_not_collide_with_torchrun():
    parser = tl_args.build_parser()
    ours = option_strings(group(parser, "tuilaunch options")._group_actions)
    assert ours >= OURS_EXPECTED
    assert ours & torch_options() == set()
    # Nor do their destinations: nothing of ours reaches torch's namespace.
    torch_dests = {a.dest for a in get_args_parser()._actions}
    our_dests = {a.dest for a in group(parser, "tuilaunch options")._group_actions}
    assert our_dests & torch_dests == set()


def _sample_value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [list(action.choices)[-1]]
    if action.type is int:
        return ["3"]
    if action.type is float:
        return ["0.5"]
    if action.dest == "nnodes":
        return ["1:2"]
    return ["a,b" if "filters" in action.dest else "some-value"]


def _torch_option_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for action in get_args_parser()._actions:
        for opt in action.option_strings:
            if opt not in HELP:
                cases.append((opt, [opt, *_sample_value(action)]))
    return cases


def test_every_torchrun_option_parses_like_torchrun():
    """Each spelling of each option gives the namespace torchrun's own parser gives."""
    cases = _torch_option_cases()
    # Both spellings of every option (~25 options in torch 2.6, ~30 in 2.13).
    assert len(cases) >= 40
    for opt, argv in [*cases, ("(defaults)", [])]:
        full = [*argv, "train.py", "--lr", "1"]
        ours, opts = tl_args.parse(full)
        assert vars(ours) == vars(torch_parse_args(full)), opt
        assert opts == tl_args.Options(no_tui=False, journal=None)


def test_own_options_are_stripped_and_script_args_untouched():
    argv = [
        "--no-tui",
        "--journal",
        "j.jsonl",
        "--nproc_per_node",
        "2",
        "train.py",
        "--nproc-per-node",
        "7",
        "--no-tui",
        "--journal",
        "x",
        "--",
        "-m",
    ]
    ours, opts = tl_args.parse(argv)
    assert opts == tl_args.Options(no_tui=True, journal="j.jsonl")
    assert ours.training_script == "train.py"
    assert ours.training_script_args == [
        "--nproc-per-node",
        "7",
        "--no-tui",
        "--journal",
        "x",
        "--",
        "-m",
    ]
    assert ours.nproc_per_node == "2"
    assert not [k for k in vars(ours) if k.startswith("tl_")]
    assert vars(ours) == vars(torch_parse_args(argv[3:]))


def _our_option_params() -> list:
    parser = tl_args.build_parser()
    params = []
    for opt in sorted(option_strings(group(parser, "tuilaunch options")._group_actions)):
        params.append(pytest.param(opt, id=opt))
    return params


@pytest.mark.parametrize("opt", _our_option_params())
def test_own_option_after_script_belongs_to_script(opt):
    """tuilaunch's options after the script are the script's arguments, untouched."""
    script_args = ["--lr", "1", opt, "value", "--nproc-per-node", "7"]
    ours, opts = tl_args.parse(["--nproc-per-node", "2", "train.py", *script_args])
    assert ours.training_script == "train.py"
    assert ours.training_script_args == script_args
    assert ours.nproc_per_node == "2"
    assert opts == tl_args.Options(no_tui=False, journal=None)


def test_every_option_has_one_default():
    """An option's default is declared once, as its field of Options: argparse stores that
    default (or ``unset``, which parse turns into it), parse returns it, and RunConfig's
    defaults are the ones a command line without tuilaunch's options gives."""
    parser = tl_args.build_parser()
    _, parsed = tl_args.parse(["train.py"])
    declared = [f for f in dataclasses.fields(Options) if flag_of(f.name) is not None]
    flags = {spec.flag for f in declared if (spec := flag_of(f.name)) is not None}
    assert flags == option_strings(group(parser, "tuilaunch options")._group_actions) - {
        "--version"
    }
    for f in declared:
        spec = flag_of(f.name)
        assert spec is not None
        stored = parser.get_default("tl_" + f.name)
        assert stored == (f.default if spec.unset is Flag.unset else spec.unset), f.name
        assert getattr(parsed, f.name) == f.default, f.name
    assert parsed == Options()
    assert RunConfig.from_options(Options()) == RunConfig()
    assert RunConfig().hang_timeout == Options.hang_timeout == hangwatch.AUTO == "auto"


def test_choices_are_the_models_tuples():
    """A choice is the model's word list itself, not a copy typed again in the parser."""
    by_dest = {a.dest: a for a in tl_args.build_parser()._actions}
    assert by_dest["tl_restart_policy"].choices is policy.POLICIES
    assert by_dest["tl_exit_codes"].choices is exitcodes.STYLES
    assert by_dest["tl_on_hang"].choices is hangwatch.ACTIONS
    for f in dataclasses.fields(Options):
        spec = flag_of(f.name)
        if spec is not None and spec.choices is not None:
            assert f.default in spec.choices, f.name


def test_torchrun_arguments_are_read_once_into_a_record(monkeypatch):
    """What tuilaunch reads of torchrun's namespace is one typed record; an attribute an older
    torch (or a test's namespace) lacks takes the record's default."""
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    ns, _ = tl_args.parse(["--nnodes", "1:3", "--rdzv-id", "j", "--max-restarts", "2", "t.py"])
    read = TorchrunArgs.read(ns)
    assert read.namespace is ns and read.rdzv_id == "j" and read.max_restarts == 2
    assert read.node_range == (1, 3) and read.elastic
    assert read.monitor_interval == ns.monitor_interval
    assert read.shutdown_timeout == float(getattr(ns, "shutdown_timeout", None) or 30.0)
    bare = TorchrunArgs.read(argparse.Namespace(nnodes="2"))
    assert (bare.rdzv_id, bare.signals_to_handle, bare.log_dir) == (None, None, None)
    assert (bare.max_restarts, bare.monitor_interval, bare.shutdown_timeout) == (0, 0.1, 30.0)
    assert bare.node_range == (2, 2) and not bare.elastic and not bare.no_python
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7")
    assert TorchrunArgs.read(argparse.Namespace()).shutdown_timeout == 7.0


def test_no_getattr_on_torchruns_namespace_outside_the_record():
    """The run reads torchrun's arguments through TorchrunArgs, never ``getattr(args, ...)``
    with a default of its own (the command line's checks and the seam read torch's namespace
    before and beside the record)."""
    package = Path(tui_launch.__file__).parent
    allowed = {package / "core" / "launch", package / "core" / "seam"}
    found = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        if not any(path.is_relative_to(a) for a in allowed)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "getattr(args," in line or "getattr(self._args," in line
    ]
    assert not found


def test_pet_environment_defaults(monkeypatch):
    monkeypatch.setenv("PET_MAX_RESTARTS", "3")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_RDZV_ID", "from-env")
    monkeypatch.setenv("PET_STANDALONE", "1")
    ours, _ = tl_args.parse(["train.py"])
    assert ours.max_restarts == 3
    assert ours.nproc_per_node == "4"
    assert ours.rdzv_id == "from-env"
    assert ours.standalone is True
    assert vars(ours) == vars(torch_parse_args(["train.py"]))
    # The command line still wins over the environment, as in torchrun.
    ours, _ = tl_args.parse(["--max-restarts", "5", "train.py"])
    assert ours.max_restarts == 5


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tui_launch", *args],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def help_run() -> subprocess.CompletedProcess[str]:
    """One ``tuilaunch --help`` for the tests that read it (it imports torch for its options)."""
    return _run("--help")


@pytest.mark.slow
def test_help_shows_both_groups(help_run):
    p = help_run
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "usage: tuilaunch" in out
    assert "torchrun options:" in out
    assert "tuilaunch options:" in out
    # Each group lists its own options under its heading.
    torch_part = out[out.index("torchrun options:") : out.index("tuilaunch options:")]
    our_part = out[out.index("tuilaunch options:") :]
    assert "--nproc-per-node" in torch_part and "--nproc_per_node" in torch_part
    assert "--no-tui" not in torch_part
    assert "--no-tui" in our_part and "--journal" in our_part and "--version" in our_part
    assert "--nproc-per-node" not in our_part
    for opt in torch_options() | OURS_EXPECTED:
        assert opt in out, opt
    assert "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", ["console-script", "python-m"])
def test_version(how):
    if how == "console-script":
        # The console script installed beside the interpreter running the tests (any venv).
        exe = Path(sys.executable).parent / "tuilaunch"
        assert exe.is_file(), f"tuilaunch is not installed in {exe.parent}"
        p = subprocess.run(
            [str(exe), "--version"],
            cwd=ROOT,
            env=base_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    else:
        p = _run("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"tuilaunch {tui_launch.__version__}\n"
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_help_lists_the_subcommands(help_run):
    """`--help` names ls, attach and replay, each with a line of its own (they are not options,
    so argparse alone never mentioned them)."""
    p = help_run
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    for sub in SUBCOMMANDS:
        found = [ln for ln in lines if ln.strip().startswith(f"tuilaunch {sub}")]
        assert len(found) == 1, (sub, p.stdout[-1500:])
        assert len(found[0].split(None, 2)) == 3 and len(found[0]) > 40, found[0]


VERSION_PROBE = """
import sys
from tui_launch import cli
code = cli.run({argv!r})
print("CODE", code, "TORCH", "torch" in sys.modules, "TEXTUAL", "textual" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [["--version"], ["--no-tui", "--version"], ["--version", "script.py"]],
    ids=["alone", "after-an-option", "before-a-script"],
)
def test_version_does_not_import_torch(argv):
    """`--version` answers without torch (importing it took 1 s, 3.8 s on a busy machine)."""
    p = subprocess.run(
        [PY, "-c", VERSION_PROBE.format(argv=argv)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"tuilaunch {tui_launch.__version__}\nCODE 0 TORCH False TEXTUAL False\n"


def test_version_after_the_script_is_the_scripts(tuilaunch):
    """After the script, --version is the script's own argument (as under torchrun)."""
    launch = tuilaunch("--nproc-per-node", "1", str(WORKERS / "noop.py"), "--version")
    assert launch.wait(120) == 0, launch.output[-3000:]
    assert "tuilaunch 0" not in launch.stdout


def test_pet_nproc_and_script_args_pass_through(tuilaunch, tmp_path):
    """PET_NPROC_PER_NODE starts that many workers; flag-like script args reach the worker."""
    out = tmp_path / "out"
    journal = tmp_path / "j.jsonl"
    script_args = [str(out), "--nproc-per-node", "7", "--no-tui", "--journal", "nope", "-m"]
    launch = tuilaunch(
        "--standalone",
        "--journal",
        str(journal),
        str(WORKERS / "env_dump.py"),
        *script_args,
        env=base_env(PET_NPROC_PER_NODE="2"),
    )
    assert launch.wait() == 0, launch.output[-4000:]
    assert leftovers(launch.token) == []

    dumps = {p.name: json.loads(p.read_text()) for p in out.glob("env_*.json")}
    assert sorted(dumps) == ["env_0.json", "env_1.json"]
    for rank in (0, 1):
        d = dumps[f"env_{rank}.json"]
        assert d["argv"] == [str(WORKERS / "env_dump.py"), *script_args]
        assert d["env"]["WORLD_SIZE"] == "2"
        assert d["env"]["LOCAL_WORLD_SIZE"] == "2"
    assert not (tmp_path / "nope").exists() and not (ROOT / "nope").exists()

    events = read_journal(journal)
    started = [e for e in events if e["kind"] == "workers_started"]
    assert len(started) == 1
    assert sorted(w["local_rank"] for w in started[0]["workers"]) == [0, 1]


@pytest.mark.slow
def test_gc_off_while_loading_then_frozen(tmp_path):
    """No collection runs while torch loads; what is loaded is frozen; the GC is back on after.

    A full collection over torch's ~170,000 objects costs ~80 ms (165 ms in a log flood, on
    the dashboard's thread): the launcher freezes them instead (cli.main, apps.launch.main).
    """
    probe = (
        "import atexit, gc, json, sys\n"
        "seen = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and "
        "seen.append((info['generation'], 'torch' in sys.modules, gc.get_freeze_count())))\n"
        "atexit.register(lambda: print(json.dumps({'collections': seen, "
        "'frozen': gc.get_freeze_count(), 'enabled': gc.isenabled()})))\n"
        "from tui_launch.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    p = subprocess.run(
        [
            PY,
            "-c",
            probe,
            "--no-tui",
            "--standalone",
            "--nproc-per-node",
            "1",
            "--no-python",
            "true",
        ],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    state = json.loads(p.stdout.strip().splitlines()[-1])
    assert state["enabled"] is True
    assert state["frozen"] > 100_000, state["frozen"]  # torch and tuilaunch, loaded
    loading = [gen for gen, torch_in, frozen in state["collections"] if torch_in and not frozen]
    assert loading == [], f"collections while torch was loading: {loading}"
    assert any(frozen for _, _, frozen in state["collections"])  # and on again after


@pytest.mark.parametrize("argv", [["ls"], ["ls", "--help"], ["status", "--help"]])
def test_a_reader_that_left_costs_no_traceback(argv, tmp_path):
    # `tuilaunch ls | head -1` with more lines than head reads: the write meets a closed pipe.
    read, write = os.pipe()
    os.close(read)
    env = base_env(XDG_RUNTIME_DIR=str(tmp_path))
    p = subprocess.run(
        [PY, "-m", "tui_launch", *argv], stdout=write, stderr=subprocess.PIPE, text=True, env=env
    )
    os.close(write)
    assert p.stderr == "" and p.returncode in (0, 141), (p.returncode, p.stderr)
