"""Issue 34 (part B): ``tuilaunch why``: Flight Recorder dumps from anywhere, read and judged.

On NVIDIA's four real 16-rank dump sets (a Megatron MoE job on GPUs, two ranks injected with a
GPU error or a held GIL: ``tests/fixtures/frdumps/nvrx/``) the verdict names exactly the
injected ranks; on their JSON form the same; a pickle that names a global is refused (and never
runs); a rank with no dump, or an unreadable one, is a suspect; every case of torch's own
``test_fr_analysis.py`` gets torch's class; synthetic Megatron-style sets (``testing/frgen``)
with one and two culprits, a stall, a mismatch and none; the command's bad input; and a real
gloo run whose hung rank ``tuilaunch why RUN_DIR`` names.
"""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, ROOT, base_env, journal_path, read_journal, wait_for

from tui_launch.apps import mcp
from tui_launch.core.diagnosis import frdump, ncclwatch
from tui_launch.core.diagnosis.frdump import HostileDump, load_dir, load_file
from tui_launch.core.diagnosis.frjudge import MatchClass, judge, match
from tui_launch.core.diagnosis.ncclwatch import NcclDumpWatch
from tui_launch.core.model.events import FlightRecorderVerdict
from tui_launch.core.model.exitcodes import INFRASTRUCTURE
from tui_launch.core.model.layout import RunDirLayout, analyser_stem
from tui_launch.core.model.text import describe
from tui_launch.testing import frgen

NVRX = ROOT / "tests" / "fixtures" / "frdumps" / "nvrx"
SETS = ("gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd")
DDP_LOOP = str(ROOT / "tests" / "programs" / "ddp_loop.py")
NCCL_WRITER = str(ROOT / "tests" / "programs" / "nccl_dump_writer.py")


def _injected(name: str) -> set[int]:
    """The ranks NVIDIA injected a fault into, from the set's own log."""
    first = (NVRX / name / "fault_injection.log").read_text().splitlines()[0]
    assert first.startswith("Fault ranks: ")
    return set(json.loads(first.split(": ", 1)[1]))


def _why(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tui_launch", "why", *args],
        env=env or base_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line_error(out: subprocess.CompletedProcess[str], code: int) -> str:
    assert out.returncode == code, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuilaunch why: error: "), out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


# --- NVIDIA's dumps ---------------------------------------------------------------------


def test_fixtures_are_real_pickles_not_lfs_pointers():
    for name in SETS:
        dumps = sorted((NVRX / name).glob("_dump_*"))
        assert len(dumps) == 16
        for p in dumps:
            assert p.read_bytes()[:1] == b"\x80", p  # a pickle's PROTO opcode


@pytest.mark.parametrize("name", SETS)
def test_nvrx_set_names_exactly_the_injected_ranks(name):
    verdict = judge(load_dir(str(NVRX / name)))
    assert set(verdict.culprit_ranks) == _injected(name), verdict.text
    assert verdict.kind == "culprit" and verdict.dumps == 16 and not verdict.missing


def test_gpu_error_first_set_one_culprit_per_cause():
    """Rank 12 never issued the all_to_all its expert peers wait in (five groups point at it:
    one line); rank 14 issued everything but its work stopped completing, which NVIDIA's own
    analysis misses: its peers completed the collectives still outstanding on it."""
    v = judge(load_dir(str(NVRX / "gpu_error_1st")))
    assert v.text.startswith(
        "rank 12 never issued all_to_all #20537 of EXPERT_MODEL_PARALLEL_GROUP pg 74; "
        "ranks 13-15 wait in it (4 more groups point at it)"
    ), v.text
    by_rank = {c.rank: c for c in v.culprits}
    assert by_rank[12].why == ("never_issued", "stalled")
    assert len(by_rank[12].groups) == 5
    assert by_rank[14].why == ("stalled",)
    assert "rank 14's work stopped completing while it kept issuing" in v.text
    assert (
        "rank 14's work stopped completing while it kept issuing: _all_gather_base #42806 of "
        "TENSOR_MODEL_PARALLEL_GROUP pg 42 is outstanding on it and rank 15 completed it "
        "(21 outstanding on it, 8 on its peers): a GPU or stream fault, not a program path"
    ) in v.text
    # The twelve ranks of the other pipeline stages wait behind them: symptoms, not culprits.
    assert v.text.endswith("; ranks 0-11 wait behind them"), v.text
    pg42 = next(g for g in v.groups if g.name == "42")
    assert pg42.kind == "stalled" and pg42.stalled == (14,)


def test_lock_gil_sets_one_line_for_two_ranks_in_one_group():
    v = judge(load_dir(str(NVRX / "lock_gil_1st")))
    assert v.text.startswith(
        "ranks 9, 14 never issued all_to_all #45265 of EXPERT_MODEL_PARALLEL_GROUP pg 72; "
        "ranks 8, 10-13, 15 wait in it"
    ), v.text
    # The pipeline peers of 8-15 wait in sends nobody received: behind them, not named.
    pipeline = next(g for g in v.groups if g.name == "39")
    assert pipeline.kind == "p2p" and "rank 0 waits in send/recv with rank 8" in pipeline.text
    assert all(c.why == ("never_issued",) for c in v.culprits)


def test_pg_status_is_mapped_onto_group_names():
    """``pg_status`` is keyed by local id: the entries name some ids, creation order the rest
    (rank 4 has no expert entry, yet its expert group's status is read)."""
    d = load_file(str(NVRX / "gpu_error_1st" / "_dump_4"))
    assert d.rank == 4 and d.version == "2.9"
    assert d.status["72"] == frdump.PgStatus(20544, 20544)
    assert d.status["37"].enqueued == 30837 and d.status["37"].completed == 30834
    assert d.groups["72"].desc == "EXPERT_MODEL_PARALLEL_GROUP"
    assert d.groups["72"].ranks == (4, 5, 6, 7)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def test_json_dumps_are_judged_like_the_pickles(tmp_path):
    """torch's JSON form (``_dump_nccl_trace_json``: tuples become lists), as tuilaunch's
    responders save it (``rank<N>.json``)."""
    for p in sorted((NVRX / "gpu_error_2nd").glob("_dump_*")):
        data = pickle.loads(p.read_bytes())
        rank = int(p.name.rsplit("_", 1)[1])
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(_plain(data)))
    v = judge(load_dir(str(tmp_path)))
    assert set(v.culprit_ranks) == {9, 14}, v.text
    assert v.text == judge(load_dir(str(NVRX / "gpu_error_2nd"))).text


def test_a_rank_with_no_dump_is_a_suspect(tmp_path):
    shutil.copytree(NVRX / "lock_gil_2nd", tmp_path / "set")
    (tmp_path / "set" / "_dump_15").unlink()
    v = judge(load_dir(str(tmp_path / "set")))
    assert set(v.culprit_ranks) == {10, 15}, v.text
    (c15,) = [c for c in v.culprits if c.rank == 15]
    assert c15.why == ("no_dump",) and c15.text.startswith("rank 15 left no dump; ")
    assert v.missing == (15,)


def test_a_truncated_dump_is_a_suspect_not_a_crash(tmp_path):
    shutil.copytree(NVRX / "lock_gil_2nd", tmp_path / "set")
    path = tmp_path / "set" / "_dump_10"
    path.write_bytes(path.read_bytes()[:700])
    found = load_dir(str(tmp_path / "set"))
    assert 10 in found.unreadable and "not a readable pickle" in found.unreadable[10]
    v = judge(found)
    assert set(v.culprit_ranks) == {10, 15}, v.text
    assert "rank 10 left unreadable dump: not a readable pickle" in v.text
    out = _why(str(tmp_path / "set"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == v.text
    assert "rank 10: unreadable dump (not a readable pickle" in out.stdout


# --- hostile pickles ------------------------------------------------------------------------


class _Boom:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _hostile_pickles(marker: Path) -> dict[str, bytes]:
    dump = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [_Boom(marker)]}
    return {
        "reduce": pickle.dumps(dump, protocol=4),
        # Protocol 2, GLOBAL opcode ("c" module newline name).
        "global": b"\x80\x02cos\nsystem\nq\x00X\x0b\x00\x00\x00touch /tmp/xq\x01\x85q\x02Rq\x03.",
        "persistent_id": b"\x80\x02X\x01\x00\x00\x00aQ.",
    }


@pytest.mark.parametrize("kind", ["reduce", "global", "persistent_id"])
def test_a_hostile_pickle_is_refused_and_never_runs(tmp_path, kind):
    marker = tmp_path / "ran"
    data = _hostile_pickles(marker)[kind]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(data)
    with pytest.raises(HostileDump, match="refused a pickle"):
        load_file(str(path))
    assert not marker.exists()


def test_why_refuses_a_directory_holding_a_hostile_pickle(tmp_path):
    shutil.copytree(NVRX / "lock_gil_1st", tmp_path / "set")
    marker = tmp_path / "ran"
    (tmp_path / "set" / "_dump_3").write_bytes(_hostile_pickles(marker)["reduce"])
    line = _one_line_error(_why(str(tmp_path / "set")), 2)
    assert "refused" in line and "posix.system" in line and "_dump_3" in line, line
    assert not marker.exists()


# --- the command ---------------------------------------------------------------------------


def test_why_prints_the_verdict_first_then_each_group():
    out = _why(str(NVRX / "lock_gil_2nd"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("rank 10 never issued all_to_all #20947 of "), lines[0]
    assert "rank 15 never issued all_to_all #20947 of EXPERT_MODEL_PARALLEL_GROUP pg 74" in lines[0]
    assert lines[2] == "28 of 65 process groups wait:"
    assert lines[3].startswith("  TENSOR_MODEL_PARALLEL_GROUP pg 40 (ranks 10, 11): rank 10")


def test_why_json_for_scripts():
    out = _why(str(NVRX / "gpu_error_1st"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == 1 and doc["kind"] == "culprit" and doc["dumps"] == 16
    assert [c["rank"] for c in doc["culprits"]] == [12, 14]
    assert doc["culprits"][1]["why"] == ["stalled"]
    assert doc["verdict"].startswith("rank 12 never issued all_to_all #20537")
    g74 = next(g for g in doc["groups"] if g["name"] == "74")
    assert g74["kind"] == "never_issued" and g74["culprits"] == [12]
    assert g74["waiting"] == [13, 14, 15] and g74["seq"] == 20537 and g74["op"] == "all_to_all"
    assert g74["stalled"] == [12, 14]
    assert g74["stall"]["14"] == {
        "seq": 20530,
        "op": "all_to_all",
        "completed_by": [13, 15],
        "outstanding": 9,
        "peers_outstanding": 2,
    }


def test_why_reads_one_dump_file():
    out = _why(str(NVRX / "lock_gil_1st" / "_dump_9"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["dumps"] == 1


def test_why_bad_input(tmp_path):
    assert "no such file or directory" in _one_line_error(_why(str(tmp_path / "nope")), 3)
    assert "no run 'no-such-run'" in _one_line_error(_why("no-such-run"), 3)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes_1.txt").write_text("1")
    (tmp_path / "empty" / "other_2").write_text("not a dump")
    line = _one_line_error(_why(str(tmp_path / "empty")), 2)
    assert line.endswith(f"no Flight Recorder dump in {tmp_path / 'empty'}"), line
    corrupt = tmp_path / "nccl_trace_rank_0"
    corrupt.write_bytes(b"\x80\x04\x95garbage")
    assert "not a readable pickle" in _one_line_error(_why(str(corrupt)), 2)
    assert "unexpected argument '--bogus'" in _one_line_error(_why("--bogus"), 2)
    helped = _why("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: tuilaunch why")


# --- synthetic Megatron-style sets ----------------------------------------------------------


@pytest.mark.parametrize(
    ("culprits", "fault"),
    [((37,), "hang"), ((37, 200), "hang"), ((37,), "stall"), ((5, 130), "stall")],
)
def test_synthetic_culprits_named_and_nobody_else(tmp_path, culprits, fault):
    frgen.generate(str(tmp_path), 256, culprits, fault)
    v = judge(load_dir(str(tmp_path)))
    assert v.culprit_ranks == culprits, v.text
    want = "never_issued" if fault == "hang" else "stalled"
    assert all(want in c.why for c in v.culprits), v.culprits


def test_every_rank_at_the_same_collective(tmp_path):
    frgen.generate(str(tmp_path), 64)
    v = judge(load_dir(str(tmp_path)))
    assert v.kind == "same" and not v.culprits
    assert v.text.startswith("every rank is at the same collective (_all_gather_base #1001"), v.text
    assert v.text.endswith("no rank out of step; suspect the network, a GPU or NCCL")


def test_a_mismatch_is_named_with_torchs_class(tmp_path):
    frgen.generate(str(tmp_path), 64, mismatch=3)
    v = judge(load_dir(str(tmp_path)))
    assert v.kind == "mismatch" and v.culprit_ranks == (3,), v.text
    assert "rank 3 called _all_gather_base of [2048] BFloat16" in v.text
    assert "SIZE_OR_SYNTAX_MISMATCH" in v.text


def test_no_outstanding_collective_shows_no_hang(tmp_path):
    data = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_enqueued_collective": 7, "last_completed_collective": 7}},
        "entries": [],
    }
    for r in (0, 1):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(data))
    v = judge(load_dir(str(tmp_path)))
    assert (
        v.kind == "idle" and v.text == "no collective is outstanding in 2 dumps: they show no hang"
    )


def test_old_dumps_without_status_or_group_names(tmp_path):
    """torch 2.4's dumps (``version`` "2.2"): ``seq_id``, ``pg_id`` and no ``pg_status``;
    gloo's entries never complete: each rank waits in its newest."""
    for rank, last in ((0, 12), (1, 11), (2, 12)):
        entries = [
            {
                "seq_id": s,
                "pg_id": 0,
                "profiling_name": "gloo:all_reduce",
                "input_sizes": [[4]],
                "output_sizes": [[4]],
                "state": "scheduled",
            }
            for s in range(last - 3, last + 1)
        ]
        data = {
            "version": "2.2",
            "entries": entries,
            "pg_config": {"0": {"desc": "default_pg", "ranks": [0, 1, 2]}},
        }
        (tmp_path / f"trace_{rank}").write_bytes(pickle.dumps(data, protocol=2))
    v = judge(load_dir(str(tmp_path)))
    assert v.culprit_ranks == (1,), v.text
    assert v.text.startswith(
        "rank 1 never issued all_reduce #12 of default_pg pg 0; ranks 0, 2 wait in it"
    )


# --- torch's own test_fr_analysis.py, ported ----------------------------------------------
# (test/distributed/flight_recorder/test_fr_analysis.py: the same inputs, torch's class.)


def create_one_event(
    collective_name: str,
    pg_info: tuple[str, str],
    input_sizes: list[list[int]],
    output_sizes: list[list[int]],
    state: str = "scheduled",
    collective_seq_id: int = 0,
    p2p_seq_id: int = 0,
    output_dtypes: str = "float32",
) -> dict[str, Any]:
    return {
        "profiling_name": f"nccl:{collective_name}",
        "state": state,
        "process_group": pg_info,
        "input_sizes": input_sizes,
        "output_sizes": output_sizes,
        "input_dtypes": "float32",
        "output_dtypes": output_dtypes,
        "collective_seq_id": str(collective_seq_id),
        "p2p_seq_id": str(p2p_seq_id),
        "time_created_ns": 0,
        "frames": [],
    }


def _match(a: dict[str, Any], b: dict[str, Any], pg_size: int = 2) -> MatchClass:
    return match(frdump.entry_from_dict(a), frdump.entry_from_dict(b), pg_size)


def test_torch_match_one_event():
    pg = ("0", "default")
    e1 = create_one_event("all_reduce", pg, [[4, 4]], [[4, 4]], "scheduled", 1)
    assert _match(e1, e1) is MatchClass.FULLY_MATCHED
    e2 = create_one_event("all_gather", pg, [[4, 4]], [[4, 4]], "scheduled", 1)
    assert _match(e1, e2) is MatchClass.COLLECTIVE_TYPE_MISMATCH
    e3 = create_one_event("all_to_all", pg, [[4, 4]], [[4, 4]], "scheduled", 1)
    e4 = create_one_event("all_to_all", pg, [[4, 4]], [[4, 4]], "scheduled", 1)
    assert _match(e3, e4) is MatchClass.UNDECIDED
    e5 = create_one_event("all_reduce", pg, [[5, 4]], [[4, 4]], "scheduled", 1, 1)
    assert _match(e1, e5) is MatchClass.SIZE_OR_SYNTAX_MISMATCH
    e6 = create_one_event("all_reduce", pg, [[4, 4]], [[5, 4]], "scheduled", 1, 2)
    assert _match(e1, e6) is MatchClass.SIZE_OR_SYNTAX_MISMATCH
    e7 = create_one_event("all_reduce", pg, [[4, 4]], [[5, 4]], "scheduled", 2)
    assert _match(e7, e7) is MatchClass.SIZE_OR_SYNTAX_MISMATCH
    e9 = create_one_event("all_reduce", pg, [[4, 4]], [[4, 4]], "completed", 1)
    assert _match(e1, e9) is MatchClass.COLLECTIVE_STATE_MISMATCH
    e10 = create_one_event(
        "all_reduce", pg, [[4, 4]], [[4, 4]], "completed", 1, output_dtypes="float16"
    )
    assert _match(e10, e9) is MatchClass.COLLECTIVE_DTYPE_MISMATCH
    e11 = create_one_event(
        "gather", pg, [[4, 4]], [[4, 4], [4, 4]], "completed", 1, output_dtypes="float32"
    )
    e12 = create_one_event("gather", pg, [[4, 4]], [[]], "completed", 1, output_dtypes="")
    assert _match(e11, e12) is MatchClass.FULLY_MATCHED
    e13 = create_one_event("gather", pg, [[4, 4]], [[4, 4]], "completed", 1, output_dtypes="")
    assert _match(e11, e13) is MatchClass.FULLY_MATCHED


# torch's types.COLLECTIVES, as of torch 2.13.
TORCH_COLLECTIVES = (
    "broadcast", "_broadcast_oop", "reduce", "_reduce_oop", "all_gather", "all_gather_single",
    "all_gather_v", "all_reduce", "_all_gather_base", "all_gather_into_tensor_coalesced",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_v",
    "reduce_scatter_tensor_coalesced", "_reduce_scatter_base", "gather", "scatter",
    "all_to_all", "all_to_all_single", "all_to_all_v_single", "all_reduce_barrier", "barrier",
    "split", "new_window", "allreduce_coalesced", "ALLGATHER_coalesced",
    "REDUCE_SCATTER_coalesced",
)  # fmt: skip


@pytest.mark.parametrize("collective", sorted(TORCH_COLLECTIVES))
def test_torch_all_events(collective):
    input_sizes = [[4, 4]]
    output_sizes = [[4, 4]]
    expected = MatchClass.FULLY_MATCHED
    if collective in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):
        output_sizes = [[input_sizes[0][0] * 2]]
    if collective in ("all_gather", "_all_gather_base", "all_gather_into_tensor_coalesced"):
        output_sizes = [[math.prod(input_sizes[0]) * 2]]
    if collective == "all_to_all":
        expected = MatchClass.UNDECIDED
    event = create_one_event(
        collective, ("0", "default"), input_sizes, output_sizes, "scheduled", 1
    )
    assert _match(event, event) is expected


def test_torch_collective_names_are_torchs():
    """The list above is torch's (so a new collective in torch shows up here)."""
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    assert set(TORCH_COLLECTIVES) == set(types.COLLECTIVES)


@pytest.mark.parametrize("backend", ["nccl", "ncclx", "gloo", "xccl"])
def test_torch_op_backends(backend):
    e = frdump.entry_from_dict(
        {"profiling_name": f"{backend}:all_reduce", "state": "completed", "collective_seq_id": "1"}
    )
    assert e.op == "all_reduce" and e.seq == 1


def _entry(
    record_id: int, name: str, inp: list, out: list, pg: tuple[str, str] = ("0", "default")
) -> dict:
    event = create_one_event(name, pg, inp, out, "completed", 0, 0, "float32")
    event.update({"record_id": record_id, "is_p2p": False})
    return event


TEMPLATE: dict[int, dict[str, Any]] = {
    0: {
        "entries": [],
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
            "1": {"name": "1", "desc": "sub_pg", "ranks": "[0]"},
        },
        "version": "2.8",
    },
    1: {
        "entries": [],
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
            "1": {"name": "1", "desc": "sub_pg", "ranks": "[1]"},
        },
        "version": "2.8",
    },
}


def _build(entries0: list[dict], entries1: list[dict]) -> list[Any]:
    """torch's ``testBuildDB`` cases: both ranks' entries judged; the mismatches found."""
    details = copy.deepcopy(TEMPLATE)
    details[0]["entries"] = entries0
    details[1]["entries"] = entries1
    found = frdump.DumpSet("mem")
    for r, d in details.items():
        found.dumps[r] = frdump.dump_from_dict(r, f"rank{r}", d)
    # Every entry completed: mismatches are looked for only where ranks wait, so the
    # comparison is asked of each group directly.
    from tui_launch.core.diagnosis.frjudge import _groups, _mismatches

    return [m for g in _groups(found) for m in _mismatches(g)]


def test_torch_build_db_cases():
    ar = lambda r, pg=("0", "default"), n=4: _entry(r, "all_reduce", [[n, n]], [[n, n]], pg)  # noqa: E731
    # 1: matched all_reduce, in the default group and in each rank's own sub group.
    sub = ("1", "sub_pg")
    assert _build([ar(0), ar(1, sub, 5)], [ar(0), ar(1, sub, 5)]) == []
    # 2: matched allreduce_coalesced.
    c = _entry(0, "allreduce_coalesced", [[4, 4]], [[4, 4]])
    assert _build([c], [copy.deepcopy(c)]) == []
    # 3: two broadcasts coalesced (one sequence number), matched.
    b = [_entry(0, "broadcast", [[4, 4]], [[4, 4]]), _entry(1, "broadcast", [[4, 4]], [[4, 4]])]
    b.append(_entry(2, "coalesced", [[]], [[]]))
    assert _build(b, copy.deepcopy(b)) == []
    # 4: uneven _broadcast_oop inside ALLGATHER_coalesced: record 1 differs in size.
    r0 = [
        _entry(0, "_broadcast_oop", [[4, 4]], [[4, 4]]),
        _entry(1, "_broadcast_oop", [[5, 5]], [[5, 5]]),
    ]
    r1 = [
        _entry(0, "_broadcast_oop", [[4, 4]], [[4, 4]]),
        _entry(1, "_broadcast_oop", [[4, 4]], [[4, 4]]),
    ]
    r0.append(_entry(2, "ALLGATHER_coalesced", [[]], [[]]))
    r1.append(_entry(2, "ALLGATHER_coalesced", [[]], [[]]))
    (m,) = _build(r0, r1)
    assert m.cls is MatchClass.SIZE_OR_SYNTAX_MISMATCH and m.record_id == 1
    assert m.op.startswith("_broadcast_oop") and m.ambiguous
    # 5: matched _reduce_oop inside REDUCE_SCATTER_coalesced.
    rs = [
        _entry(0, "_reduce_oop", [[4, 4]], [[4, 4]]),
        _entry(1, "_reduce_oop", [[4, 4]], [[4, 4]]),
    ]
    rs.append(_entry(2, "REDUCE_SCATTER_coalesced", [[]], [[]]))
    assert _build(rs, copy.deepcopy(rs)) == []
    # 6: rank 0 has no coalesced call where rank 1 has one: not a mismatch.
    extra = [
        ar(0),
        _entry(1, "_reduce_oop", [[4, 4]], [[4, 4]]),
        _entry(2, "_reduce_oop", [[4, 4]], [[4, 4]]),
    ]
    extra.append(_entry(3, "REDUCE_SCATTER_coalesced", [[]], [[]]))
    assert _build([ar(0)], extra) == []


# --- a real run -------------------------------------------------------------------------------


@pytest.mark.slow
def test_why_on_a_real_hung_run(tuilaunch, tmp_path):
    """A gloo DDP job whose rank 1 wandered off: its run directory, and its run id through
    the run index, give the verdict from the records the responders saved."""
    launch = tuilaunch(
        *("--flight-recorder", "--hang-timeout", "4", "--on-hang", "stop"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(DDP_LOOP, "--wander-rank", "1", "--seconds", "200"),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    run_dir = journal_path(launch.output).parent
    out = _why(str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [c["rank"] for c in doc["culprits"]] == [1], doc["verdict"]
    assert doc["verdict"].startswith("rank 1 never issued all_reduce #"), doc["verdict"]
    assert doc["verdict"].endswith(" of default_pg pg 0; rank 0 waits in it"), doc["verdict"]
    run_id = read_journal(run_dir / "journal.jsonl")[0]["run_id"]
    by_id = _why(run_id)
    assert by_id.returncode == 0, by_id.stderr
    assert by_id.stdout.splitlines()[0] == doc["verdict"]
    # The same verdict in `status --json` (and its text), and in the MCP server's why tool.
    status = subprocess.run(
        [PY, "-m", "tui_launch", "status", str(run_dir), "--json"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    fr = json.loads(status.stdout)["flight_recorder"]
    assert fr["verdict"] == doc["verdict"] and fr["culprits"][0]["rank"] == 1
    text = subprocess.run(
        [PY, "-m", "tui_launch", "status", str(run_dir)],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"  flight recorder: {doc['verdict']}" in text.stdout.splitlines()
    assert mcp.why(str(run_dir))["flight_recorder"]["verdict"] == doc["verdict"]


# --- NCCL's dumps, read the moment they appear ----------------------------------------------


def test_nccl_dumps_judged_once_complete_and_a_fifo_never_opened(tmp_path):
    """The watch judges a set when it stopped changing for one look, not half-written; a
    FIFO beside the dumps (NCCL's dump pipe) is passed over, never opened."""
    posted: list[Any] = []
    os.mkfifo(tmp_path / "nccl_pipe_rank_0")
    os.mkfifo(tmp_path / "nccl_trace_rank_999")
    watch = NcclDumpWatch(posted.append, lambda: str(tmp_path / ncclwatch.PREFIX), interval=0.05)
    frgen.generate(str(tmp_path), 64, (5,), prefix=ncclwatch.PREFIX)
    watch.look()
    assert posted == []  # first look: not yet known to be complete
    watch.start()
    try:
        wait_for(lambda: posted, 30, what="the verdict on the dumps")
    finally:
        watch.stop()
    (verdict,) = posted
    assert isinstance(verdict, FlightRecorderVerdict), verdict
    assert verdict.source == "nccl" and verdict.dumps == 64 and verdict.culprits == (5,)
    assert describe(verdict).startswith("flight recorder (64 NCCL dumps): rank 5 never issued ")
    assert verdict.groups and verdict.groups[0].kind == "never_issued", verdict.groups
    # More files (a second timeout): judged again; the same files: not again.
    frgen.generate(str(tmp_path / "more"), 64, (5,), prefix=ncclwatch.PREFIX)
    watch.look()
    watch.look()
    assert len(posted) == 1


@pytest.mark.slow
def test_nccl_dumps_of_a_live_run_judged_while_it_runs(tuilaunch, tmp_path):
    """With no flag, each rank writes what NCCL's watchdog writes on a timeout into the file
    the launcher pointed ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` at; the verdict is in the journal
    before any rank exits, and the files are kept in the run directory, named with host,
    attempt and rank, where ``why`` reads them."""
    launch = tuilaunch(
        *("--log-dir", str(tmp_path), "--standalone"),
        *("--nproc-per-node", "3", NCCL_WRITER, "--linger", "20"),
    )
    assert launch.wait(120) == 0, launch.output[-3000:]
    want = "rank 1 never issued all_reduce #8 of default_pg pg 0; ranks 0, 2 wait in it"
    assert f"flight recorder (3 NCCL dumps): {want}" in launch.output
    journal = journal_path(launch.output)
    events = read_journal(journal)
    kinds = [e["kind"] for e in events]
    (at,) = [i for i, e in enumerate(events) if e["kind"] == "flight_recorder_verdict"]
    assert at < kinds.index("rank_exited"), kinds
    fr = events[at]
    assert (fr["verdict"], fr["culprits"], fr["dumps"], fr["source"]) == (want, [1], 3, "nccl")
    assert fr["groups"] == [
        {
            "label": "default_pg pg 0",
            "ranks": "0-2",
            "kind": "never_issued",
            "text": "rank 1 never issued all_reduce #8; ranks 0, 2 wait in it",
        }
    ], fr["groups"]
    kept = sorted(os.listdir(RunDirLayout(str(journal.parent)).flightrec_dir))
    assert kept == [f"{analyser_stem(socket.gethostname(), 0)}{r}" for r in range(3)]
    out = _why(str(journal.parent))
    assert out.returncode == 0 and out.stdout.splitlines()[0] == want, out.stdout
    # The report's section, from the journal alone.
    report = subprocess.run(
        [PY, "-m", "tui_launch", "report", str(journal.parent), "--format", "md", "-o", "-"],
        env=base_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    section = report.stdout[report.stdout.index("## Flight Recorder") :]
    assert f"- **verdict**: {want}" in section and "- **culprits**: 1" in section, section
    # A replay of the journal shows it first in the Stacks tab.
    assert _replayed_stacks_tab(journal).splitlines()[1] == want


def _replayed_stacks_tab(journal: Path) -> str:
    """The Stacks tab of ``tuilaunch replay``'s dashboard at the journal's end, as text."""
    import asyncio

    from tui_launch.core.journal.timeline import Timeline
    from tui_launch.tui.app import Dashboard
    from tui_launch.tui.modes import ReplayMode
    from tui_launch.tui.sources.replay import ReplaySource

    src = ReplaySource(Timeline(str(journal)))
    app = Dashboard(src, refresh_hz=20, mode=ReplayMode(src))
    shown: list[str] = []

    async def main() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            app._tabs.active = "stacks-tab"
            for _ in range(200):  # the tab draws once shown: poll with a deadline
                await pilot.pause(0.05)
                text = getattr(app.panel("stacks").content, "plain", "")
                if "flight recorder" in text:
                    shown.append(text)
                    return

    asyncio.run(main())
    assert shown, "the replayed Stacks tab never showed the Flight Recorder's verdict"
    return shown[0]
