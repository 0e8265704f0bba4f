"""Slurm without Slurm: the hostlist syntax, the allocation read from the environment, the
options it fills in, the user's flags and ``PET_*`` variables winning, and the refusals.

The same code against a real slurmctld and slurmd is in ``tests/test_slurm_real.py``.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from conftest import WORKERS, base_env

from tui_launch.core.launch import args as tl_args
from tui_launch.core.launch import slurm
from tui_launch.core.launch.slurm import SlurmError, SlurmJob, expand_hostlist
from tui_launch.core.model.text import describe
from tui_launch.core.remote.runindex import Entry, format_table
from tui_launch.testing.builders import run_started


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node[01-03,07],gpu1", ["node01", "node02", "node03", "node07", "gpu1"]),
        ("a[8-11]b[1-2]", ["a8b1", "a8b2", "a9b1", "a9b2", "a10b1", "a10b2", "a11b1", "a11b2"]),
        ("rack1-n[09-11]", ["rack1-n09", "rack1-n10", "rack1-n11"]),
        ("n[9-10]", ["n9", "n10"]),
        ("foo[010-012]", ["foo010", "foo011", "foo012"]),
        ("x[1,3-4],y", ["x1", "x3", "x4", "y"]),
        ("a,b,c", ["a", "b", "c"]),
        ("localhost,vm", ["localhost", "vm"]),
        ("single", ["single"]),
        ("", []),
    ],
)
def test_expand_hostlist(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("n[1-", "unbalanced"),
        ("n[3-1]", "counts down"),
        ("n[a]", "is not N or N-M"),
        ("n]1", "']' without '['"),
        ("n[1-2]]", "']' without '['"),
        ("n[[1]]", "unbalanced"),
        ("n[1-9999999]", "too long"),
    ],
)
def test_expand_hostlist_refuses(text, needle):
    with pytest.raises(SlurmError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        expand_hostlist(text)


def step_env(nodes="n[1-2]", count=2, node_id=0, name="n1", tasks=None, **extra):
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_NUM_NODES": str(count),
        "SLURM_STEP_NUM_TASKS": str(tasks if tasks is not None else count),
        "SLURM_NODEID": str(node_id),
        "SLURMD_NODENAME": name,
    }
    env.update(extra)
    return env


def batch_env(nodes="n1", count=1):
    return {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": nodes, "SLURM_NNODES": str(count)}


def test_detect_outside_slurm():
    assert slurm.detect({"PATH": "/bin"}) is None


def test_detect_a_step():
    job = slurm.detect(step_env(node_id=1, name="n2", SLURM_GPUS_ON_NODE="4"))
    assert job == SlurmJob(
        job_id="4242",
        step_id="0",
        node_name="n2",
        node_id=1,
        hosts=("n1", "n2"),
        tasks=2,
        gpus_on_node=4,
    )
    assert job.in_step and job.nnodes == 2


def test_detect_a_step_on_part_of_the_job():
    # srun -N2 inside a 4-node job: the step's nodes, not the job's.
    env = step_env(nodes="n[3-4]", name="n3", SLURM_JOB_NODELIST="n[1-4]")
    job = slurm.detect(env)
    assert job is not None and job.hosts == ("n3", "n4")


def test_detect_the_batch_script():
    job = slurm.detect(batch_env())
    assert job is not None and not job.in_step and job.hosts == ("n1",) and job.node_id == 0


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        (step_env(count=3), "names 2 node"),
        (step_env(node_id=5), "SLURM_NODEID=5"),
        (step_env(SLURM_STEP_NUM_NODES="two"), "is not a number"),
        (step_env(nodes="n[1-"), "unbalanced"),
        ({"SLURM_JOB_ID": "5", "SLURM_NNODES": "2"}, "no node list"),
    ],
)
def test_detect_refuses_a_contradiction(env, needle):
    with pytest.raises(SlurmError, match=needle):
        slurm.detect(env)


def test_rendezvous_port_is_the_same_on_every_node_and_below_the_ephemeral_range():
    assert slurm.rendezvous_port("4242") == 24242
    assert slurm.rendezvous_port("123456") == 23456
    assert 20000 <= slurm.rendezvous_port("het+job") < 30000
    assert slurm.rendezvous_port("het+job") == slurm.rendezvous_port("het+job")


def plan_for(env, given=(), backend="static"):
    job = slurm.detect(env)
    assert job is not None
    return slurm.plan(job, set(given), backend)


def test_two_nodes_first_host_serves_the_store():
    first = plan_for(step_env(node_id=0, name="n1"))
    second = plan_for(step_env(node_id=1, name="n2"))
    for p in (first, second):
        assert p.values["nnodes"] == "2"
        assert p.values["rdzv_backend"] == "c10d"
        assert p.values["rdzv_endpoint"] == "n1:24242"
        assert p.values["rdzv_id"] == "4242"
        assert "node_rank" not in p.values  # c10d numbers the nodes itself
        assert "nproc_per_node" not in p.values  # no GPUs: torch's default
    assert first.rdzv_conf == ("is_host=1",) and second.rdzv_conf == ("is_host=0",)
    assert "c10d store at n1:24242 (the first node: this one)" in first.notes[0]
    assert "c10d store at n1:24242 (the first node)" in second.notes[0]
    assert "node 1 of 2 (n2)" in second.notes[0]


def test_one_node_is_a_local_store_on_a_free_port():
    p = plan_for(step_env(nodes="n1", count=1))
    assert p.values["rdzv_endpoint"] == "localhost:0"
    assert p.values["nnodes"] == "1"
    assert p.rdzv_conf == ()


def test_gpus_on_the_node_are_the_workers():
    p = plan_for(step_env(SLURM_GPUS_ON_NODE="8"))
    assert p.values["nproc_per_node"] == "8"
    assert "8 worker(s) per node (its GPUs)" in p.notes[0]


def test_given_options_are_kept():
    p = plan_for(
        step_env(SLURM_GPUS_ON_NODE="8"),
        given={"nnodes", "nproc_per_node", "rdzv_id", "rdzv_endpoint", "rdzv_backend"},
        backend="c10d",
    )
    # The user chose where the store is: no backend, endpoint or is_host of ours.
    assert p.values == {}
    assert p.notes[1] == (
        "slurm: kept your --nnodes, --nproc-per-node, --rdzv-backend, --rdzv-endpoint, --rdzv-id"
    )
    # The static backend (torch's default) at the user's endpoint: each node says its rank.
    static = plan_for(step_env(node_id=1, name="n2"), given={"rdzv_endpoint"})
    assert static.values["node_rank"] == 1


def test_static_rendezvous_gets_the_node_rank():
    p = plan_for(step_env(node_id=1, name="n2"), given={"master_addr"}, backend="static")
    assert p.values["node_rank"] == 1
    assert "rdzv_backend" not in p.values and "rdzv_endpoint" not in p.values


def test_own_rdzv_conf_gets_is_host_unless_it_says_it():
    assert slurm.merge_rdzv_conf("join_timeout=900", "is_host=1") == "join_timeout=900,is_host=1"
    assert slurm.merge_rdzv_conf("is_host=0, x=1", "is_host=1") == "is_host=0, x=1"
    assert slurm.merge_rdzv_conf("", "is_host=1") == "is_host=1"


def test_parse_adds_is_host_to_the_user_rdzv_conf(monkeypatch):
    args, _ = parse_in(monkeypatch, step_env(), ["--rdzv-conf", "join_timeout=900", "t.py"])
    assert args.rdzv_conf == "join_timeout=900,is_host=1"
    args, _ = parse_in(monkeypatch, step_env(), ["--rdzv-conf", "is_host=0", "t.py"])
    assert args.rdzv_conf == "is_host=0"


def test_standalone_is_this_node_alone():
    p = plan_for(step_env(tasks=4), given={"standalone"})
    assert p.values == {}
    assert "--standalone" in p.notes[0]


def test_several_tasks_per_node_are_refused():
    with pytest.raises(SlurmError, match="srun started 4 tasks on 2 node"):
        plan_for(step_env(tasks=4))
    # --nnodes given: the user launches as they set it up.
    assert "nnodes" not in plan_for(step_env(tasks=4), given={"nnodes"}).values


def test_a_batch_script_of_several_nodes_is_refused():
    with pytest.raises(SlurmError, match="not a job step: run srun --ntasks-per-node=1"):
        plan_for(batch_env(nodes="n[1-3]", count=3))
    p = plan_for(batch_env())
    assert p.values["nnodes"] == "1" and "(batch)" in p.notes[0]


# ---------------------------------------------------------------- the command line


def parse_in(monkeypatch, env, argv):
    for k in list(os.environ):
        if k.startswith(("SLURM", "PET_")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return tl_args.parse(argv)


def test_parse_fills_the_options(monkeypatch):
    args, opts = parse_in(monkeypatch, step_env(), ["train.py", "--lr", "1"])
    assert (args.nnodes, args.rdzv_backend, args.rdzv_endpoint) == ("2", "c10d", "n1:24242")
    assert args.rdzv_id == "4242" and args.rdzv_conf == "is_host=1"
    assert args.training_script_args == ["--lr", "1"]
    assert opts.slurm_job == "4242" and opts.slurm_notes[0].startswith("slurm: step 4242.0")


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["--nnodes", "1:2", "t.py"], ("nnodes", "1:2")),
        (["--nnodes=3", "t.py"], ("nnodes", "3")),
        (["--nproc_per_node", "3", "t.py"], ("nproc_per_node", "3")),
        (["--nproc-per", "5", "t.py"], ("nproc_per_node", "5")),  # an abbreviation
        (["--rdzv-endpoint=h:1", "t.py"], ("rdzv_endpoint", "h:1")),
        (["--rdzv_id", "mine", "t.py"], ("rdzv_id", "mine")),
    ],
)
def test_flags_win(monkeypatch, argv, kept):
    args, _ = parse_in(monkeypatch, step_env(SLURM_GPUS_ON_NODE="2"), argv)
    assert getattr(args, kept[0]) == kept[1]


def test_pet_variables_win(monkeypatch):
    env = step_env(PET_NNODES="1:4", PET_RDZV_ENDPOINT="store:29400", PET_NPROC_PER_NODE="3")
    args, opts = parse_in(monkeypatch, env, ["t.py"])
    assert (args.nnodes, args.rdzv_endpoint, args.nproc_per_node) == ("1:4", "store:29400", "3")
    assert args.rdzv_backend == "static"  # torch's default: the user set the store up
    assert args.rdzv_id == "4242" and opts.slurm_job == "4242"


def test_repeatable_options_parse_inside_slurm(monkeypatch):
    argv = ["--inject", "kill:rank=0", "--inject", "hang:rank=0", "--warm-start"]
    argv += ["--duplicate-stdout-filters", "x", "--nproc-per-node", "2", "t.py"]
    args, opts = parse_in(monkeypatch, step_env(), argv)
    assert opts.inject == ("kill:rank=0", "hang:rank=0")
    assert args.nproc_per_node == "2" and args.nnodes == "2"
    assert tl_args.given_options(argv) >= {"nproc_per_node", "duplicate_stdout_filters"}


def test_a_flag_after_the_script_is_the_script_own(monkeypatch):
    args, _ = parse_in(monkeypatch, step_env(), ["t.py", "--nnodes", "7"])
    assert args.nnodes == "2" and args.training_script_args == ["--nnodes", "7"]


@pytest.mark.parametrize(
    ("env", "argv", "alone"),
    [
        ({"PET_STANDALONE": "1"}, ["t.py"], True),
        ({"PET_STANDALONE": "0"}, ["t.py"], False),
        ({}, ["--standalone", "t.py"], True),
    ],
)
def test_standalone_flag_or_variable(monkeypatch, env, argv, alone):
    args, opts = parse_in(monkeypatch, {**step_env(), **env}, argv)
    assert opts.slurm_job == "4242"
    assert (args.nnodes == "2") is not alone
    assert ("--standalone" in opts.slurm_notes[0]) is alone


def test_no_slurm(monkeypatch):
    args, opts = parse_in(monkeypatch, step_env(), ["--no-slurm", "t.py"])
    assert (args.nnodes, args.rdzv_backend, args.rdzv_id) == ("1:1", "static", "none")
    assert opts.slurm_job is None and opts.slurm_notes == ()


def test_outside_slurm_nothing_changes(monkeypatch):
    args, opts = parse_in(monkeypatch, {}, ["t.py"])
    assert (args.nnodes, args.rdzv_backend, args.rdzv_id) == ("1:1", "static", "none")
    assert opts.slurm_job is None


@pytest.mark.parametrize("var", ["SLURM_JOB_ID", "SLURM_JOBID"])
def test_a_job_id_alone_launches_as_torchrun_with_one_note(monkeypatch, var):
    """A job id with nothing else of an allocation (a shell that kept it, no srun): torchrun's
    options untouched, one note that says why."""
    job = slurm.detect({var: "123", "SLURM_NTASKS": "1"})
    assert job is not None and job.stray and not job.in_step
    p = slurm.plan(job, set())
    assert p.values == {} and p.rdzv_conf == ()
    args, opts = parse_in(monkeypatch, {var: "123"}, ["t.py"])
    alone, _ = parse_in(monkeypatch, {}, ["t.py"])
    assert vars(args) == vars(alone)
    assert len(opts.slurm_notes) == 1 and "\n" not in opts.slurm_notes[0]
    assert "SLURM_JOB_ID=123" in opts.slurm_notes[0] and "as torchrun would" in opts.slurm_notes[0]


@pytest.mark.slow
def test_a_job_id_alone_runs_where_torchrun_runs(tuilaunch):
    launch = tuilaunch(
        "--nproc-per-node", "1", str(WORKERS / "noop.py"), env=base_env(SLURM_JOB_ID="123")
    )
    assert launch.wait(120) == 0, launch.output
    notes = [ln for ln in launch.output.splitlines() if "SLURM_JOB_ID=123" in ln]
    assert notes == [
        "[tuilaunch] slurm: SLURM_JOB_ID=123 is set but nothing else of an allocation "
        "(no node list, not a job step): launching as torchrun would"
    ], launch.output
    assert "error" not in launch.stderr.lower(), launch.stderr


def test_refusal_is_one_line_and_exit_2(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        parse_in(monkeypatch, step_env(tasks=4), ["t.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "srun started 4 tasks on 2 node(s)" in err
    assert "--no-slurm: launch without the allocation" in err


def test_unreadable_slurm_environment_is_one_line(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        parse_in(monkeypatch, step_env(nodes="n[1-"), ["t.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad Slurm node list 'n[1-'" in err and "--no-slurm" in err
    # --no-slurm: the broken environment is not read at all.
    _, opts = parse_in(monkeypatch, step_env(nodes="n[1-"), ["--no-slurm", "t.py"])
    assert opts.slurm_job is None


# ---------------------------------------------------------------- where the job id shows


def test_run_started_line_names_the_job():
    line = describe(dataclasses.replace(run_started(2, 0), slurm_job="9"))
    assert line is not None and line.endswith("| slurm job 9")
    assert "slurm" not in (describe(run_started(2, 0)) or "")


def entry(**kw) -> Entry:
    base = dict(pid=1, host="h", run_id="r", argv=("tuilaunch", "t.py"), started=time.time())
    return Entry(proc_start=None, **{**base, **kw})


def test_ls_shows_the_slurm_job_column_only_when_a_run_has_one():
    plain = format_table([entry()], host="h")
    assert "SLURM JOB" not in plain.splitlines()[0]
    table = format_table([entry(slurm_job="4242"), entry(pid=2)], host="h").splitlines()
    assert table[0].split()[:4] == ["STATE", "AGE", "NODE", "SLURM"]
    assert table[1].split()[3] == "4242" and table[2].split()[3] == "-"
    assert Entry.from_json(entry(slurm_job="4242").to_json()).slurm_job == "4242"


def test_dashboard_header_and_rendezvous_panel_name_the_job():
    from rich.console import Console

    from tui_launch.core.model.store import RunStore
    from tui_launch.tui.panels.render import header, rendezvous_panel

    store = RunStore()
    store.post(dataclasses.replace(run_started(2, 0), slurm_job="4242"))
    snap = store.snapshot()
    assert "slurm job 4242" in header(snap, 0.0).plain
    console = Console(width=120, record=True)
    console.print(rendezvous_panel(snap, 0.0))
    assert "slurm job 4242" in console.export_text()
    plain = RunStore()
    plain.post(run_started(2, 0))
    assert "slurm" not in header(plain.snapshot(), 0.0).plain
