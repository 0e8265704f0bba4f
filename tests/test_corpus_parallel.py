"""Jobs of many process groups (issue 34): the Megatron-style and torchtitan-style programs.

``tests/corpus/megatron_style.py`` (tensor x pipeline parallel, Megatron's groups) and
``tests/corpus/torchtitan_style.py`` (FSDP2 x tensor parallel on a 2-D mesh) run unchanged and
the same under torchrun, tuilaunch and ``tuilaunch --no-bootstrap``; a rank of a tensor-parallel
group that stops issuing is confirmed hung with no flag and named, alone, as the culprit, in
its group, by the in-run verdict and by ``tuilaunch why``.

The records and dumps the unit tests judge are built as gloo (torch 2.13) writes them in those
programs (taken from real runs): entries named by their group (``["14",
"TENSOR_MODEL_PARALLEL_GROUP"]``) with a local ``pg_id`` that differs from it, ``pg_status``
keyed by that local id and no default group in it, and ``pg_config`` a nameless group with no
ranks; the NCCL one carries each group's ranks and the pipeline's sends and receives.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, ROOT, WORKERS, base_env, journal_path, read_journal

from tui_launch.core.diagnosis import frdump, frjudge
from tui_launch.core.diagnosis.records import parse_record, with_groups
from tui_launch.core.diagnosis.stacks.collective import collective_verdict
from tui_launch.core.model.exitcodes import INFRASTRUCTURE

CORPUS = WORKERS.parent / "corpus"
MEGATRON = CORPUS / "megatron_style.py"
TITAN = CORPUS / "torchtitan_style.py"

# --------------------------------------------------------------------------------------------
# Dumps as gloo writes them
# --------------------------------------------------------------------------------------------

# Megatron at TP=2, PP=2 on 4 ranks: group name -> (description, ranks) as new_group made them
# (names count up on every rank alike; only the groups with collectives here).
MEGATRON_GROUPS = {
    "5": ("DATA_PARALLEL_GROUP", [0]),
    "6": ("DATA_PARALLEL_GROUP", [1]),
    "7": ("DATA_PARALLEL_GROUP", [2]),
    "8": ("DATA_PARALLEL_GROUP", [3]),
    "13": ("MODEL_PARALLEL_GROUP", [0, 1, 2, 3]),
    "14": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1]),
    "15": ("TENSOR_MODEL_PARALLEL_GROUP", [2, 3]),
    "16": ("PIPELINE_MODEL_PARALLEL_GROUP", [0, 2]),
    "17": ("EMBEDDING_GROUP", [0, 2]),
    "18": ("PIPELINE_MODEL_PARALLEL_GROUP", [1, 3]),
    "19": ("EMBEDDING_GROUP", [1, 3]),
}
# Each rank's groups with collectives, in the order it made them: its local ids count up.
MEGATRON_MEMBER = {0: ["5", "13", "14", "17"], 1: ["6", "13", "14", "19"]}
MEGATRON_MEMBER |= {2: ["7", "13", "15", "17"], 3: ["8", "13", "15", "19"]}


def gloo_dump(rank: int, member: list[str], groups: dict, seqs: dict[str, tuple[int, int, str]]):
    """Rank ``rank``'s Flight Recorder as gloo's writes it: ``seqs`` per group name, the last
    sequence number issued, the last completed and the op of the last (all_reduce before)."""
    entries: list[dict[str, Any]] = []
    status: dict[str, dict[str, str]] = {}
    record = 0
    for uid, name in enumerate(member, start=2):  # local ids 0 and 1: the default groups
        issued, completed, op = seqs[name]
        status[str(uid)] = {
            "last_enqueued_collective": str(issued),
            "last_started_collective": "-1",
            "last_completed_collective": str(completed),
        }
        for seq in range(max(1, issued - 3), issued + 1):
            entries.append(
                {
                    "record_id": record,
                    "pg_id": uid,
                    "process_group": [name, groups[name][0]],
                    "collective_seq_id": seq,
                    "p2p_seq_id": 0,
                    "op_id": seq,
                    "profiling_name": f"gloo:{op if seq == issued else 'all_reduce'}",
                    "time_created_ns": 1_000 + record,
                    "input_sizes": [[16, 2, 32]],
                    "input_dtypes": ["Float"],
                    "output_sizes": [[16, 2, 32]],
                    "output_dtypes": ["Float"],
                    "state": "scheduled",
                    "is_p2p": False,
                    "frames": [],
                }
            )
            record += 1
    entries.sort(key=lambda e: (e["collective_seq_id"], e["record_id"]))
    for i, e in enumerate(entries):
        e["record_id"] = i
    return {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
        "pg_status": status,
        "entries": entries,
    }


def responder_groups(rank: int, member: list[str], groups: dict) -> dict[str, dict[str, str]]:
    """What the responder adds from c10d's table (:func:`responder.group_config`)."""
    out = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    for name in member:
        out[name] = {"name": name, "desc": groups[name][0], "ranks": str(groups[name][1])}
    return out


def megatron_tp_hang() -> dict[int, dict]:
    """Rank 1 stopped at the top of an iteration: rank 0 waits in the tensor-parallel
    broadcast #73 of pg 14 rank 1 never issued; stage 2 (ranks 2, 3) waits in its recv,
    which gloo does not record."""
    done = {"13": (3, 3, "all_reduce")}
    seqs = {
        0: {**done, "5": (3, 3, "all_reduce"), "14": (73, 72, "broadcast"), "17": (4, 4, "")},
        1: {**done, "6": (3, 3, "all_reduce"), "14": (72, 72, "all_reduce"), "19": (4, 4, "")},
        2: {**done, "7": (3, 3, "all_reduce"), "15": (108, 108, "all_reduce"), "17": (4, 4, "")},
        3: {**done, "8": (3, 3, "all_reduce"), "15": (108, 108, "all_reduce"), "19": (4, 4, "")},
    }
    return {r: gloo_dump(r, MEGATRON_MEMBER[r], MEGATRON_GROUPS, seqs[r]) for r in range(4)}


def megatron_stage_hang() -> dict[int, dict]:
    """Rank 2 (stage 2) stopped: rank 3 waits in broadcast #109 of pg 15; rank 0, sending to
    rank 2, never issued #77 of pg 14, where rank 1 waits."""
    done = {"13": (3, 3, "all_reduce")}
    seqs = {
        0: {**done, "5": (3, 3, "all_reduce"), "14": (76, 76, "all_reduce"), "17": (4, 4, "")},
        1: {**done, "6": (3, 3, "all_reduce"), "14": (77, 76, "broadcast"), "19": (4, 4, "")},
        2: {**done, "7": (3, 3, "all_reduce"), "15": (108, 108, "all_reduce"), "17": (4, 4, "")},
        3: {**done, "8": (3, 3, "all_reduce"), "15": (109, 108, "broadcast"), "19": (4, 4, "")},
    }
    return {r: gloo_dump(r, MEGATRON_MEMBER[r], MEGATRON_GROUPS, seqs[r]) for r in range(4)}


def _records(dumps: dict[int, dict]):
    return [parse_record(r, fr, None) for r, fr in sorted(dumps.items())]


def test_a_record_of_several_groups_is_keyed_by_group_name_and_counts_every_group():
    fr = megatron_tp_hang()[0]
    record = parse_record(0, fr, None)
    # By the group's name (every member's), not the local pg_id (2 on every rank, for four
    # different data-parallel groups).
    assert {c.pg for c in record.collectives} == {"5", "13", "14", "17"}
    # Every group's numbers together: the default group, idle, is not in pg_status at all.
    assert (record.last_enqueued, record.last_completed, record.groups) == (83, 82, 4)
    last = record.last
    assert last is not None and (last.op, last.seq, last.pg) == ("broadcast", 73, "14")
    assert last.desc == "TENSOR_MODEL_PARALLEL_GROUP"


def test_the_in_run_verdict_names_the_tensor_parallel_rank_that_stopped():
    records = _records(megatron_tp_hang())
    v = collective_verdict(records, {1: "_hooks.py:52 in wandered_off"}, waiting={0, 2, 3})
    assert v is not None and v.odd == (1,) and v.kind == "behind", v
    assert v.text == (
        "rank 1 never issued broadcast #73 of TENSOR_MODEL_PARALLEL_GROUP pg 14 (it is in "
        "_hooks.py:52 in wandered_off); rank 0 waits in it"
    )


def test_a_pipeline_stage_that_never_posts_its_recv_is_named_not_the_stage_sending_to_it():
    """gloo records no send/recv: rank 0, stuck sending to rank 2, looks as behind in its
    tensor-parallel group as rank 2 does in its own. The stacks tell them apart: rank 0 waits
    (in the send), rank 2 is in its own code."""
    records = _records(megatron_stage_hang())
    where = {2: "_hooks.py:52 in wandered_off"}
    v = collective_verdict(records, where, waiting={0, 1, 3})
    assert v is not None and v.odd == (2,) and v.kind == "held", v
    assert v.text.startswith("rank 2 never issued broadcast #109 of TENSOR_MODEL_PARALLEL_GROUP")
    assert "rank 0 is behind in TENSOR_MODEL_PARALLEL_GROUP pg 14 too, but waits itself" in v.text
    assert v.text.endswith("; rank 1 waits behind it")
    # Without the stacks, nothing tells them apart: the first group's rank, as before.
    assert collective_verdict(records, where, None).odd == (0,)


def test_fsdp_times_tp_names_the_rank_the_others_wait_on_from_the_records():
    """torchtitan_style at dp=2 x tp=2, rank 1 asleep: rank 3 waits in the dp all-gather rank 1
    never issued, so it never issued its tp all-reduce either; rank 0 waits in rank 1's."""
    groups = {
        "1": ("mesh_dp", [0, 2]),
        "2": ("mesh_dp", [1, 3]),
        "3": ("mesh_tp", [0, 1]),
        "4": ("mesh_tp", [2, 3]),
    }
    member = {0: ["1", "3"], 1: ["2", "3"], 2: ["1", "4"], 3: ["2", "4"]}
    seqs = {
        0: {"1": (34, 34, "all_gather"), "3": (98, 97, "all_reduce")},
        1: {"2": (33, 33, "all_gather"), "3": (97, 97, "all_reduce")},
        2: {"1": (34, 34, "all_gather"), "4": (98, 97, "all_reduce")},
        3: {"2": (34, 33, "all_gather"), "4": (97, 97, "all_reduce")},
    }
    dumps = {r: gloo_dump(r, member[r], groups, seqs[r]) for r in range(4)}
    v = collective_verdict(_records(dumps), {1: "_hooks.py:52 in wandered_off"}, {0, 2, 3})
    assert v is not None and v.odd == (1,) and v.kind == "behind", v
    assert v.text.startswith("rank 1 never issued all_gather #34 of mesh_dp pg 2 (it is in ")
    assert v.text.endswith(
        "rank 3 waits in it (1 more group points at it); ranks 0, 2 wait behind it"
    )


def test_gloo_dumps_with_the_responders_groups_are_judged_per_group():
    """``tuilaunch why``'s judge needs each group's members; gloo's recorder writes none, the
    responder's table fills them in, and the one culprit is rank 1, in its group."""
    found = frdump.DumpSet("")
    for r, fr in megatron_tp_hang().items():
        full = with_groups(fr, responder_groups(r, MEGATRON_MEMBER[r], MEGATRON_GROUPS))
        assert "" not in full["pg_config"]  # the nameless, rankless group is gone
        found.dumps[r] = frdump.dump_from_dict(r, "", full)
    v = frjudge.judge(found)
    assert v.kind == "culprit" and v.culprit_ranks == (1,), v.text
    assert v.text == (
        "rank 1 never issued broadcast #73 of TENSOR_MODEL_PARALLEL_GROUP pg 14; rank 0 waits in it"
    )
    (waiting,) = v.waiting_groups()
    assert (waiting.label, waiting.ranks) == ("TENSOR_MODEL_PARALLEL_GROUP pg 14", (0, 1))
    # Without the table, each rank's groups are its own: no group of two to judge.
    bare = frdump.DumpSet("")
    for r, fr in megatron_tp_hang().items():
        bare.dumps[r] = frdump.dump_from_dict(r, "", fr)
    assert frjudge.judge(bare).culprit_ranks != (1,)


def test_with_groups_keeps_what_the_recorder_wrote():
    fr = {"pg_config": {"3": {"name": "3", "desc": "mine", "ranks": "[0, 1]"}}, "entries": []}
    out = with_groups(fr, {"3": {"name": "3", "desc": "theirs", "ranks": "[0]"}})
    assert out["pg_config"]["3"]["desc"] == "mine"
    assert with_groups(fr, None) is fr


def nccl_pipeline_hang() -> frdump.DumpSet:
    """The same stage hang on NCCL, whose recorder keeps each group's ranks and the pipeline's
    sends and receives: rank 0's send to rank 2 is outstanding, rank 2 posted nothing."""
    found = frdump.DumpSet("")
    seqs = {
        0: {"14": (76, 76), "16": (0, 0)},
        1: {"14": (77, 76), "18": (0, 0)},
        2: {"15": (108, 108), "16": (0, 0)},
        3: {"15": (109, 108), "18": (0, 0)},
    }
    for r in range(4):
        groups = [g for g in seqs[r]]
        config = {
            g: {"name": g, "desc": MEGATRON_GROUPS[g][0], "ranks": str(MEGATRON_GROUPS[g][1])}
            for g in groups
        }
        entries: list[dict] = []
        status: dict[str, dict] = {}
        for uid, g in enumerate(groups, start=1):
            issued, completed = seqs[r][g]
            status[str(uid)] = {
                "last_enqueued_collective": issued,
                "last_completed_collective": completed,
            }
            if issued > completed:
                entries.append(_nccl_entry(len(entries), uid, g, issued, "broadcast", "scheduled"))
        if r == 0:  # the stage-1 rank's send to the stage-2 rank (local 0 -> 1 in pg 16)
            entries.append(_nccl_entry(len(entries), 1 + 1, "16", 0, "send 0->1", "started", 5))
        found.dumps[r] = frdump.dump_from_dict(
            r, "", {"version": "2.10", "pg_config": config, "pg_status": status, "entries": entries}
        )
    return found


def _nccl_entry(i, uid, group, seq, op, state, p2p_seq=0):
    return {
        "record_id": i,
        "pg_id": uid,
        "process_group": [group, MEGATRON_GROUPS[group][0]],
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1_000 + i,
        "input_sizes": [[16, 2, 32]],
        "output_sizes": [[16, 2, 32]],
        "input_dtypes": ["Float"],
        "output_dtypes": ["Float"],
        "state": state,
        "is_p2p": op.startswith(("send", "recv")),
    }


def test_nccl_dumps_of_the_stage_hang_name_the_stage_that_posted_no_recv():
    v = frjudge.judge(nccl_pipeline_hang())
    assert v.culprit_ranks == (2,), v.text
    assert v.text.startswith("rank 2 never issued broadcast #109 of TENSOR_MODEL_PARALLEL_GROUP")


def test_two_stages_that_both_send_wait_on_each_other():
    """A schedule whose order is wrong on one side: stage 1 sends its activations while stage
    2 sends its gradients, and neither posts the recv. Each send is answered only by a recv
    (as torch's analyser pairs them), so each waits on the other; a send toward the rank is
    no answer to the rank's own send."""
    found = frdump.DumpSet("")
    for r, op in ((0, "send 0->1"), (2, "send 1->0")):
        config = {"16": {"name": "16", "desc": MEGATRON_GROUPS["16"][0], "ranks": "[0, 2]"}}
        entries = [_nccl_entry(0, 1, "16", 0, op, "started", 9)]
        status = {"1": {"last_enqueued_collective": 0, "last_completed_collective": 0}}
        found.dumps[r] = frdump.dump_from_dict(
            r, "", {"version": "2.10", "pg_config": config, "pg_status": status, "entries": entries}
        )
    v = frjudge.judge(found)
    assert v.kind == "culprit" and v.culprit_ranks == (0, 2), v.text
    (group,) = v.waiting_groups()
    assert group.kind == "p2p" and "which posted none to match" in group.text, group.text


def test_the_responder_reads_every_group_from_c10d(tmp_path):
    """A real gloo process group and two made as Megatron makes them: the responder's table
    has each (name, description, global ranks), which gloo's recorder leaves out."""
    script = (
        "import json, torch.distributed as dist\n"
        "from tui_launch.core.workers import responder\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0,"
        " world_size=1)\n"
        "dist.new_group([0], group_desc='TENSOR_MODEL_PARALLEL_GROUP')\n"
        "dist.new_group([0], group_desc='PIPELINE_MODEL_PARALLEL_GROUP')\n"
        "print(json.dumps(responder.group_config()))\n"
        "dist.destroy_process_group()\n"
    )
    out = subprocess.run(
        [PY, "-c", script], cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    groups = json.loads(out.stdout.strip().splitlines()[-1])
    assert groups["1"] == {"name": "1", "desc": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": "[0]"}
    assert groups["2"]["desc"] == "PIPELINE_MODEL_PARALLEL_GROUP"
    assert groups["0"]["ranks"] == "[0]"


# --------------------------------------------------------------------------------------------
# The programs, launched
# --------------------------------------------------------------------------------------------

LAUNCHERS = {"torchrun": None, "tuilaunch": (), "no-bootstrap": ("--no-bootstrap",)}
# The printing rank's step lines, less what changes from run to run (times, throughput).
STEP_LINE = {
    "megatron_style.py": (
        3,
        re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*lm loss: (\S+) \|.*grad norm: (\S+) \|"),
    ),
    "torchtitan_style.py": (0, re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)")),
}


def _steps(logs: Path, rank: int, pattern: re.Pattern[str]) -> list[tuple[str, ...]]:
    path = _rank_log(logs, rank)
    return [m.groups() for line in path.read_text().splitlines() if (m := pattern.search(line))]


def _rank_log(logs: Path, rank: int) -> Path:
    """The rank's log with its step lines: torchtitan's logger writes to stderr, Megatron's
    ``print`` to stdout."""
    (out,) = logs.glob(f"*/attempt_0/{rank}/stdout.log")
    (err,) = logs.glob(f"*/attempt_0/{rank}/stderr.log")
    return err if "[titan]" in err.read_text() else out


@pytest.mark.slow
@pytest.mark.parametrize("program", ["megatron_style.py", "torchtitan_style.py"])
def test_the_programs_run_the_same_under_torchrun_and_tuilaunch(
    torchrun, tuilaunch, tmp_path, program
):
    """Exit 0 under each launcher, and the same step lines (step, loss, gradient norm): the
    runs are seeded, and gloo's sums of two or four floats come out the same each time."""
    rank, pattern = STEP_LINE[program]
    seen = {}
    for name, flags in LAUNCHERS.items():
        logs = tmp_path / name
        args = (
            *("--standalone", "--nproc-per-node", "4", "--redirects", "3"),
            *("--log-dir", str(logs), str(CORPUS / program)),
        )
        start = torchrun if flags is None else tuilaunch
        launch = start(*(flags or ()), *args, env=base_env(CORPUS_STEPS="4"), cwd=tmp_path)
        assert launch.wait(180) == 0, (name, launch.output[-3000:])
        seen[name] = _steps(logs, rank, pattern)
    assert [s[0] for s in seen["torchrun"]] == ["1", "2", "3", "4"], seen
    assert seen["tuilaunch"] == seen["torchrun"] == seen["no-bootstrap"], seen


@pytest.mark.slow
def test_a_tensor_parallel_rank_that_stops_is_the_one_culprit_with_no_flag(tuilaunch, tmp_path):
    """Megatron-style TP=2 x PP=2: rank 1 sleeps at iteration 3. With no flag the hang is
    confirmed from the collectives (the default group is idle: every collective is in another
    group), and the in-run verdict and ``tuilaunch why`` name rank 1, alone, in its group."""
    launch = tuilaunch(
        *("--on-hang", "stop", "--log-dir", str(tmp_path), "--standalone", "--nproc-per-node"),
        *("4", str(MEGATRON)),
        cwd=tmp_path,
        env=base_env(CORPUS_HANG_RANK="1", CORPUS_HANG_STEP="3", CORPUS_STEPS="1000"),
    )
    assert launch.wait(150) == INFRASTRUCTURE, launch.output[-3000:]
    events = read_journal(journal_path(launch.output))
    (hang,) = [e for e in events if e["kind"] == "hang"]
    assert hang["odd_ranks"] == [1], hang
    assert hang["stood_still"].startswith("no collective for "), hang
    assert (
        hang["verdict"].startswith("rank 1 never issued broadcast #")
        and "of TENSOR_MODEL_PARALLEL_GROUP pg 14 (it is in _hooks.py" in hang["verdict"]
    ), hang
    assert "no record" not in hang["verdict"] and "rank 2" not in hang["verdict"], hang
    # Seconds, not the output rule's 90 s of silence.
    assert hang["silence"] <= 30.0, hang
    run = str(journal_path(launch.output).parent)
    why = subprocess.run(
        [PY, "-m", "tui_launch", "why", run, "--json"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert why.returncode == 0, why.stderr
    doc = json.loads(why.stdout)
    assert [c["rank"] for c in doc["culprits"]] == [1], doc
    assert doc["culprits"][0]["groups"] == ["TENSOR_MODEL_PARALLEL_GROUP pg 14"], doc
    (group,) = doc["groups"]
    assert (group["desc"], group["ranks"], group["culprits"]) == (
        "TENSOR_MODEL_PARALLEL_GROUP",
        [0, 1],
        [1],
    ), group


@pytest.mark.slow
def test_a_pipeline_stage_that_stops_is_named_not_the_stage_stuck_sending_to_it(
    tuilaunch, tmp_path
):
    """Megatron-style TP=2 x PP=2: rank 2 (the second stage) sleeps at iteration 3. Rank 0,
    stuck in its send to rank 2, is as far behind in its own tensor-parallel group as rank 2
    is in its: with no flag the in-run verdict names rank 2 alone, and says why not rank 0."""
    launch = tuilaunch(
        *("--on-hang", "stop", "--log-dir", str(tmp_path), "--standalone", "--nproc-per-node"),
        *("4", str(MEGATRON)),
        cwd=tmp_path,
        env=base_env(CORPUS_HANG_RANK="2", CORPUS_HANG_STEP="3", CORPUS_STEPS="1000"),
    )
    assert launch.wait(150) == INFRASTRUCTURE, launch.output[-3000:]
    (hang,) = [e for e in read_journal(journal_path(launch.output)) if e["kind"] == "hang"]
    assert hang["odd_ranks"] == [2], hang
    assert (
        hang["verdict"].startswith("rank 2 never issued broadcast #")
        and "of TENSOR_MODEL_PARALLEL_GROUP pg 15 (it is in _hooks.py" in hang["verdict"]
    ), hang
    assert (
        "rank 0 is behind in TENSOR_MODEL_PARALLEL_GROUP pg 14 too, but waits" in (hang["verdict"])
    ), hang
    assert hang["silence"] <= 30.0, hang
