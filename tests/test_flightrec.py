"""The Flight Recorder, armed and collected through the bootstrap's responder.

The pure part (torch's record to a :class:`RankRecord`, the collective-level verdict) on
records shaped as torch 2.13 dumps them; the real part on real gloo workers through the real
``tuilaunch --flight-recorder``: a rank that never issued the collective, ranks that disagree,
the records saved beside the stacks, ``TORCH_FR_BUFFER_SIZE=0`` turning it off, and the
responder answering while the main thread waits in C++.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PY, free_port, journal_path, read_journal, wait_for

from tui_launch.core.diagnosis.records import gather, parse_record, poke_nccl_pipes
from tui_launch.core.diagnosis.stacks.collective import collective_verdict
from tui_launch.core.diagnosis.straggler import is_stopped
from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside
from tui_launch.core.model.text import fmt_bytes
from tui_launch.core.seam import flightrec
from tui_launch.core.workers.shim import RESPONDER_ENV

PROGRAMS = Path(__file__).parent / "programs"
DDP_LOOP = str(PROGRAMS / "ddp_loop.py")
MISMATCH = str(PROGRAMS / "mismatch.py")
TIMEOUT = 4.0


def _entry(seq: int, op: str, numel: int, out: int | None = None) -> dict:
    return {
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "pg_id": 0,
        "is_p2p": False,
        "input_sizes": [[numel]],
        "input_dtypes": ["Float"],
        "output_sizes": [[out or numel]],
        "output_dtypes": ["Float"],
        "state": "scheduled",
    }


def _fr(*entries: dict) -> dict:
    last = max(e["collective_seq_id"] for e in entries)
    status = {"0": {"last_enqueued_collective": str(last), "last_completed_collective": "-1"}}
    return {"entries": list(entries), "pg_status": status, "version": "2.10"}


def test_record_parsed_with_sizes_and_sequence():
    rec = parse_record(
        3, _fr(_entry(1, "all_reduce", 1024), _entry(2, "all_gather", 256, 1024)), None
    )
    assert rec.last is not None and rec.last.seq == 2 and rec.last.op == "all_gather"
    assert rec.last.in_bytes == 1024 and rec.last.out_bytes == 4096
    assert rec.last_enqueued == 2
    assert parse_record(0, None, "no process group yet").error == "no process group yet"


def test_verdict_names_the_rank_that_never_issued_it():
    recs = [
        parse_record(0, _fr(_entry(40, "all_reduce", 10), _entry(41, "all_reduce", 10)), None),
        parse_record(1, _fr(_entry(40, "all_reduce", 10)), None),
        parse_record(2, _fr(_entry(41, "all_reduce", 10)), None),
    ]
    v = collective_verdict(recs, {1: "train.py:17 in wandered_off"}, {0, 2})
    assert v is not None and v.odd == (1,) and v.kind == "behind"
    assert v.text == (
        "rank 1 never issued all_reduce #41 (it is in train.py:17 in wandered_off); "
        "ranks 0, 2 wait in it"
    )


@pytest.mark.parametrize(
    "issued",
    [
        {0: 41, 1: 40, 2: 41},  # rank 1 never issued #41
        {r: 9 for r in range(8)},  # every rank at #9
    ],
)
def test_the_in_run_verdict_and_whys_judge_agree_on_the_same_records(issued):
    """Issue 34: one run shows the in-run verdict (the records with the stacks) beside
    ``tuilaunch why``'s (frjudge, the dumps alone: the Stacks tab, status, the report). On the
    same records they name the same ranks in the same words; the in-run one adds where the odd
    rank's stack is."""
    from tui_launch.core.diagnosis import frdump, frjudge

    world = len(issued)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    raw = {
        r: {**_fr(*(_entry(s, "all_reduce", 10) for s in range(n - 1, n + 1))), "pg_config": config}
        for r, n in issued.items()
    }
    places = {1: "train.py:17 in wandered_off"} if len(set(issued.values())) > 1 else {}
    cv = collective_verdict(
        [parse_record(r, fr, None) for r, fr in raw.items()], places, set(issued) - set(places)
    )
    found = frdump.DumpSet("mem")
    for r, fr in raw.items():
        found.dumps[r] = frdump.dump_from_dict(r, f"rank{r}.json", fr)
    fv = frjudge.judge(found)
    assert cv is not None
    assert tuple(cv.odd) == fv.culprit_ranks
    (group,) = [g for g in fv.groups if g.kind != "idle"]
    if cv.odd:
        assert cv.text.replace(" (it is in train.py:17 in wandered_off)", "") == group.text
        assert fv.text.startswith("rank 1 never issued all_reduce #41 of default_pg pg 0; ")
    else:
        assert cv.text == fv.text.replace(" of default_pg pg 0", "")


def test_a_dump_whose_verdict_saw_more_than_its_records_leads_why_and_status(tmp_path):
    """Issue 34: ``d`` on a job that still moves: rank 1's record is one collective behind,
    but both ranks' numbers advanced between two looks (not a hang). ``tuilaunch why`` and
    ``status``'s ``flight_recorder`` on that dump's records alone would name rank 1; they lead
    with the dump's own verdict instead, and keep the records' line beside it."""
    from tui_launch.core.diagnosis.stacks import verdict
    from tui_launch.core.diagnosis.stacks.save import save
    from tui_launch.core.model.layout import dump_record
    from tui_launch.core.remote.status import flight_recorder
    from tui_launch.testing.builders import fake_dump

    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    raw = {
        0: {
            **_fr(_entry(844, "all_reduce", 10), _entry(845, "all_reduce", 10)),
            "pg_config": config,
        },
        1: {
            **_fr(_entry(843, "all_reduce", 10), _entry(844, "all_reduce", 10)),
            "pg_config": config,
        },
    }
    records = (
        replace(parse_record(0, raw[0], None), looks=(836,)),
        replace(parse_record(1, raw[1], None), looks=(835,)),
    )
    dump = replace(fake_dump("key", [(0, 0, 100), (1, 1, 101)]), records=records)
    v = verdict(dump)
    assert v.collective == "moving" and v.odd == (), v
    saved = save(dump, tmp_path, v)
    os.makedirs(os.path.dirname(dump_record(saved.directory, 0)))
    for r, fr in raw.items():
        Path(dump_record(saved.directory, r)).write_text(json.dumps(fr))
    records_dir = os.path.dirname(dump_record(saved.directory, 0))
    out = subprocess.run(
        [PY, "-m", "tui_launch", "why", records_dir],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == v.text and " move on (" in lines[0], lines
    assert lines[1] == (
        "(the records alone: rank 1 never issued all_reduce #845 of default_pg pg 0; "
        "rank 0 waits in it)"
    ), lines
    doc = flight_recorder(str(tmp_path))
    assert doc is not None and doc["verdict"] == v.text, doc
    assert (doc["kind"], doc["culprits"]) == ("moving", []), doc
    assert doc["records_alone"].startswith("rank 1 never issued all_reduce #845"), doc
    # The same records under a dump whose verdict came from them alone: the judge's line.
    plain = save(replace(dump, records=tuple(replace(r, looks=()) for r in records)), tmp_path)
    os.makedirs(os.path.dirname(dump_record(plain.directory, 0)))
    for r, fr in raw.items():
        Path(dump_record(plain.directory, r)).write_text(json.dumps(fr))
    again = subprocess.run(
        [PY, "-m", "tui_launch", "why", os.path.dirname(dump_record(plain.directory, 0))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.stdout.splitlines()[0].startswith("rank 1 never issued all_reduce #845 of "), (
        again.stdout
    )


def test_verdict_says_where_ranks_disagree():
    mb = 256 * 1024
    recs = [parse_record(r, _fr(_entry(57, "all_reduce", mb)), None) for r in (0, 1, 3)]
    recs.append(parse_record(2, _fr(_entry(57, "all_gather", mb, 4 * mb)), None))
    v = collective_verdict(recs, {}, {0, 1, 2, 3})
    assert v is not None and v.odd == (2,) and v.kind == "mismatch"
    assert (
        v.text
        == "ranks disagree at #57: rank 2 called all_gather of 4 MB, the others all_reduce of 1 MB"
    )


def test_every_rank_at_one_collective_names_none():
    recs = [parse_record(r, _fr(_entry(9, "all_reduce", 10)), None) for r in range(8)]
    v = collective_verdict(recs, {}, set(range(8)))
    assert v is not None and v.odd == () and v.kind == "same"
    assert v.text == (
        "every rank is at the same collective (all_reduce #9): no rank out of step; "
        "suspect the network, a GPU or NCCL"
    )
    assert collective_verdict(recs[:1], {}, ()) is None
    assert fmt_bytes(3 << 20, words=True) == "3 MB"


def test_ranks_gone_on_past_their_last_collective_are_not_at_it():
    # A job that stands still in its own code after its last collective completed (a sleep, a
    # file barrier, an input wait): gloo's records still say "scheduled", but no stack waits in
    # a collective. Not "every rank is at the same collective; suspect the network".
    recs = [parse_record(r, _fr(_entry(1, "all_reduce", 8)), None) for r in range(8)]
    places = {r: "sleep (idle.py:9)" for r in range(8)}
    v = collective_verdict(recs, places, set())
    assert v is not None and v.odd == () and v.kind == "past"
    assert v.text == (
        "no rank waits in a collective: every rank went on past all_reduce #1, the last one "
        "issued (ranks 0-7 in sleep (idle.py:9))"
    )
    places[3] = "load (data.py:40)"
    v = collective_verdict(recs, places, set())
    assert (
        v is not None
        and v.kind == "past"
        and v.text.endswith("(ranks 0-2, 4-7 in sleep (idle.py:9); rank 3 in load (data.py:40))")
    )
    # Without the stacks (waiting unknown), the records alone cannot tell: as before.
    v = collective_verdict(recs, {}, None)
    assert v is not None and v.kind == "same"


def test_a_skew_between_moving_ranks_names_no_rank():
    # One look shows rank 1 a collective behind rank 0, but both numbers advanced between the
    # looks (the live poll before the dump, a status request after it): a healthy loop.
    recs = [
        replace(parse_record(0, _fr(_entry(849, "all_reduce", 10)), None), looks=(845, 853)),
        replace(parse_record(1, _fr(_entry(848, "all_reduce", 10)), None), looks=(844, 852)),
    ]
    v = collective_verdict(recs, {1: "train.py:30 in step"}, {0})
    assert v is not None and v.odd == () and v.kind == "moving"
    assert v.text == (
        "ranks 0, 1 move on (rank 0 #845 to #853, rank 1 #844 to #852 between two looks): "
        "not a hang"
    )
    # Only the one behind moves (it catches up): still no culprit.
    recs[0] = replace(recs[0], looks=(849, 849))
    v = collective_verdict(recs, {1: "train.py:30 in step"}, {0})
    assert v is not None and v.odd == () and v.kind == "moving", v
    # The same skew with numbers that did not move between the looks: rank 1 is named.
    still = [replace(r, looks=(r.last_enqueued,)) for r in recs]
    v = collective_verdict(still, {1: "train.py:30 in step"}, {0})
    assert v is not None and v.odd == (1,) and v.kind == "behind", v
    # Every record at one number, a stack elsewhere: "left" only when that rank is not moving.
    at = [parse_record(r, _fr(_entry(9, "all_reduce", 10)), None) for r in (0, 1)]
    left = collective_verdict(at, {1: "train.py:30 in step"}, {0})
    assert left is not None and left.kind == "left" and left.odd == (1,)
    at[1] = replace(at[1], looks=(7,))
    v = collective_verdict(at, {1: "train.py:30 in step"}, {0})
    assert v is not None and v.kind == "moving" and v.odd == ()


def test_user_setting_wins_and_zero_turns_it_off(tmp_path):
    stem = str(tmp_path / "run" / "flightrec" / "host.attempt0.rank_")
    mine = {"TORCH_FR_BUFFER_SIZE": "50", "TORCH_FR_DUMP_TEMP_FILE": "/mine/fr_"}
    env = flightrec.worker_env(mine, str(tmp_path), stem)
    assert env is not None and env[RESPONDER_ENV] == str(tmp_path)
    # What the user set stays theirs: the workers inherit it from the launcher.
    assert "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_FR_DUMP_TEMP_FILE" not in env
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].startswith(str(tmp_path))
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == stem
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert flightrec.worker_env({"TORCH_FR_BUFFER_SIZE": "0"}, str(tmp_path), stem) is None
    assert flightrec.worker_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": " 0"}, "d", stem) is None
    fresh = flightrec.worker_env({}, str(tmp_path), stem)
    assert fresh is not None and fresh["TORCH_FR_BUFFER_SIZE"] == flightrec.DEFAULT_BUFFER
    assert set(fresh) == set(flightrec.VARIABLES)


def test_a_dump_asks_nccls_pipe_of_every_rank(tmp_path):
    # The FIFOs torch's NCCL watchdog reads (TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe):
    # one byte each asks that rank to dump; one nobody reads and other files are left alone.
    readers = []
    for rank in (0, 1, 2):
        pipe = tmp_path / f"{flightrec.PIPE_STEM}{rank}.pipe"
        os.mkfifo(pipe)
        if rank < 2:
            readers.append(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
    (tmp_path / "0.sock").write_text("")
    try:
        assert poke_nccl_pipes(str(tmp_path)) == 2
        assert [os.read(fd, 16) for fd in readers] == [b"1", b"1"]
    finally:
        for fd in readers:
            os.close(fd)
    assert poke_nccl_pipes(str(tmp_path / "gone")) == 0


@pytest.mark.slow
def test_responder_answers_while_the_main_thread_waits_in_cpp(tmp_path):
    # Two plain processes through the bootstrap: rank 1 wanders off, rank 0 blocks in DDP's
    # backward (the GIL released in C++), and still its responder answers.
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": "2",
        RESPONDER_ENV: str(tmp_path),
    }
    env["MASTER_PORT"] = str(free_port())
    procs = [
        subprocess.Popen(
            [PY, "-u", "-m", "tui_launch.core.workers.shim", "-", DDP_LOOP, "--wander-rank", "1",
             "--seconds", "180"],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for r in range(2)
    ]  # fmt: skip
    try:

        def behind() -> bool:
            ans = gather(str(tmp_path), [0, 1], "dump", 2.0)
            a0, a1 = ans[0].record.last, ans[1].record.last
            return bool(a0 and a1 and a0.seq > a1.seq)

        # Importing torch on a loaded machine can take most of a minute.
        wait_for(behind, 150, 0.5, "rank 0 ahead of rank 1 in the records")
        ans = gather(str(tmp_path), [0, 1], "dump", 2.0)
        assert ans[0].record.last_completed < ans[0].record.last_enqueued  # still waiting
        main0 = next(t for t in ans[0].threads or () if t.main)
        assert any(f.function == "_engine_run_backward" for f in main0.frames)
        main1 = next(t for t in ans[1].threads or () if t.main)
        assert main1.frames[0].function == "wandered_off"
        assert oct(os.stat(tmp_path / "0.sock").st_mode & 0o777) == "0o600"
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def _hang(launch) -> dict:
    events = read_journal(journal_path(launch.output))
    (hang,) = [e for e in events if e["kind"] == "hang"]
    assert hang["silence"] <= TIMEOUT + 30, hang
    return hang


def _analysed(directory: Path, tmp_path: Path):
    """torch's own analyser (``torchfrtrace``) run on a dump's records: its database."""
    out = tmp_path / "fr_db.pkl"
    done = subprocess.run(
        [PY, "-m", "torch.distributed.flight_recorder.fr_trace", str(directory), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _, db = pickle.loads(out.read_bytes())
    return db


def test_ddp_rank_that_never_issued_the_all_reduce(tuilaunch, tmp_path):
    # No flag: the Flight Recorder is collected by default.
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(DDP_LOOP, "--wander-rank", "1", "--seconds", "200"),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    hang = _hang(launch)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert hang["verdict"].startswith("rank 1 never issued all_reduce #"), hang["verdict"]
    assert "wandered_off" in hang["verdict"] and "rank 0 waits in it" in hang["verdict"]
    saved = Path(hang["second_path"])
    data = json.loads((saved / "stacks.json").read_text())
    assert sorted(r["global_rank"] for r in data["dump"]["records"]) == [0, 1]
    fr0 = json.loads((saved / "flightrec" / "rank0.json").read_text())
    assert any(e["profiling_name"] == "gloo:all_reduce" for e in fr0["entries"])
    # Every rank's record, named with host, attempt and rank, as torch's analyser reads it.
    host = socket.gethostname()
    names = sorted(p.name for p in (saved / "flightrec").iterdir() if not p.name.endswith(".json"))
    assert names == [f"{host}.attempt0.rank_0", f"{host}.attempt0.rank_1"], names
    db = _analysed(saved / "flightrec", tmp_path)
    assert {m.global_rank for m in db.memberships} == {0, 1}
    assert any("all_reduce" in c.collective_name for c in db.collectives), db.collectives[:3]
    assert "hung: rank 1 never issued all_reduce" in launch.stderr
    events = read_journal(journal_path(launch.output))
    found = [e for e in events if e["kind"] == "collective_verdict"]
    assert found and found[-1]["verdict_kind"] == "behind" and found[-1]["odd_ranks"] == [1]
    seqs = {r["global_rank"]: r["seq"] for r in found[-1]["ranks"]}
    assert seqs[0] == seqs[1] + 1, seqs
    # Each process group as tuilaunch why's judge sees the same records (the Stacks tab lists
    # them under the verdict).
    (group,) = found[-1]["groups"]
    assert (group["label"], group["ranks"], group["kind"]) == (
        "default_pg pg 0",
        "0, 1",
        "never_issued",
    )
    assert group["text"] == f"rank 1 never issued all_reduce #{seqs[0]}; rank 0 waits in it", group


def test_async_all_reduce_rank_that_never_issued_it(tuilaunch, tmp_path):
    # An asynchronous all_reduce waited for in the program's own sync_point(); no flag.
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(str(PROGRAMS / "async_sync.py"), "--wander-rank", "1", "--seconds", "200"),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    hang = _hang(launch)
    assert hang["odd_ranks"] == [1], hang["verdict"]
    assert hang["verdict"].startswith("rank 1 never issued all_reduce #"), hang["verdict"]
    assert "wandered_off" in hang["verdict"] and "rank 0 waits in it" in hang["verdict"]


def test_a_job_asleep_after_its_last_collective_is_not_said_to_wait_in_it(tuilaunch, tmp_path):
    # Each rank all-reduces once, then sleeps in its own code: the hang is said (nothing moves),
    # but not as "every rank is at the same collective; suspect the network, a GPU or NCCL".
    program = tmp_path / "asleep.py"
    program.write_text(
        "import time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "dist.all_reduce(torch.ones(8))\n"
        "time.sleep(200)\n"
    )
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop"),
        *("--log-dir", str(tmp_path / "logs"), "--standalone", "--nproc-per-node", "2"),
        str(program),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    hang = _hang(launch)
    assert hang["odd_ranks"] == [], hang["verdict"]
    assert (
        "no rank waits in a collective: every rank went on past all_reduce #1" in (hang["verdict"])
    ), hang["verdict"]
    assert "asleep.py:4" in hang["verdict"] and "suspect the network" not in launch.stderr


def test_mismatch_named_by_op_and_size(tuilaunch, tmp_path):
    launch = tuilaunch(
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "3"),
        *(MISMATCH, "--odd", "2", "--seconds", "200"),
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    hang = _hang(launch)
    assert hang["odd_ranks"] == [2], hang["verdict"]
    assert hang["verdict"].startswith("ranks disagree at #"), hang["verdict"]
    assert "rank 2 called all_gather of 3 MB" in hang["verdict"]
    assert "all_reduce of 1 MB" in hang["verdict"]


@pytest.mark.parametrize("off", ["buffer-0", "no-bootstrap"])
def test_recorder_off_falls_back_to_stacks(tuilaunch, tmp_path, off):
    # TORCH_FR_BUFFER_SIZE=0 set by the user, or torchrun's plain worker (--no-bootstrap).
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "0"} if off == "buffer-0" else None
    launch = tuilaunch(
        *(("--no-bootstrap",) if off == "no-bootstrap" else ()),
        *("--hang-timeout", str(TIMEOUT), "--on-hang", "stop"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(DDP_LOOP, "--wander-rank", "1", "--seconds", "200"),
        env=env,
    )
    assert launch.wait(260) == INFRASTRUCTURE, launch.output[-3000:]
    hang = _hang(launch)
    assert hang["odd_ranks"] == [1]
    assert hang["verdict"].startswith("rank 1 is not in a collective"), hang["verdict"]
    assert not (Path(hang["second_path"]) / "flightrec").exists()
    # Nor an empty directory for NCCL's dumps in the run directory.
    assert not list(tmp_path.glob("*/flightrec")), list(tmp_path.glob("*/flightrec"))


def test_killed_rank_leaves_a_survivor_dump_with_frames(tuilaunch, tmp_path):
    # gloo raises in rank 0 within milliseconds of rank 1's death: the dump taken when the
    # exit is seen finds it outside Python or gone, and the live poll's last answer stands in.
    # --flight-recorder, the default now, is still accepted (old command lines).
    launch = tuilaunch(
        *("--flight-recorder", "--log-dir", str(tmp_path)),
        *("--inject", "kill:rank=1,after=40s", "--standalone", "--nproc-per-node", "2"),
        *(DDP_LOOP, "--seconds", "150"),
    )
    assert launch.wait(200) == INFRASTRUCTURE, launch.output[-3000:]
    assert "rank 1 step 3" in launch.output, launch.output[-3000:]
    events = read_journal(journal_path(launch.output))
    dumps = [e for e in events if e["kind"] == "stacks_dumped" and e["reason"] == "before-kill"]
    assert len(dumps) == 1, [e["kind"] for e in events]
    data = json.loads((Path(dumps[0]["path"]) / "stacks.json").read_text())
    (rank0,) = [r for r in data["dump"]["ranks"] if r["global_rank"] == 0]
    main = next(t for t in rank0["process"]["threads"] if t["main"])
    assert main["frames"], rank0
    (failed,) = [e for e in events if e["kind"] == "attempt_failed"]
    cause = next(f for f in failed["failures"] if not f["collateral"])
    assert cause["global_rank"] == 1 and cause["peers"], cause
    assert cause["peers"][0].startswith("rank 0: ") and "no Python frame" not in cause["peers"][0]
    assert "ddp_loop.py" in cause["peers"][0] or "backward" in cause["peers"][0], cause["peers"]


POLL_PROBE = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://%s", rank=0, world_size=1)
from tui_launch.core.workers import responder
from tui_launch.core.model.exitcodes import INFRASTRUCTURE  # a hang, a kill from outside
t = torch.ones(4)
out = []
for _ in range(3):
    dist.all_reduce(t)
    out.append(responder.answer("poll")["fr"])
out.append(responder.answer("poll")["fr"])  # no collective since: the entries are read
out.append(responder.answer("dump")["fr"])
# poll-since: the first from another line than the last poll (the main thread moved: a whole
# answer), then nothing moved (same number, same line): a few bytes, twice.
same = [responder.answer("poll-since") for _ in range(3)]
dist.all_reduce(t)
moved = responder.answer("poll-since")  # the number moved: a whole answer again
print(json.dumps({"polls": out, "same": same, "moved": moved}), flush=True)
# Without it, gloo's threads are torn down by the interpreter's exit, which on a loaded machine
# once aborted the probe after its output ("terminate called without an active exception").
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_poll_reads_the_ring_only_once_a_rank_stops_moving(tmp_path):
    # A file store: a free port found first could be taken by another test's job meanwhile.
    done = subprocess.run(
        [PY, "-c", POLL_PROBE % (tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TORCH_FR_BUFFER_SIZE": "100"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    polls = got["polls"]
    seqs = [int(p["pg_status"]["0"]["last_enqueued_collective"]) for p in polls]
    assert seqs[1] == seqs[0] + 1 and seqs[2] == seqs[1] + 1 and seqs[3] == seqs[2]
    assert [bool(p.get("entries")) for p in polls[:3]] == [False, False, False]
    assert polls[3]["entries"][-1]["collective_seq_id"] == seqs[3]
    rec = parse_record(0, polls[1], None)
    assert rec.last is None and rec.last_enqueued == seqs[1] and rec.error is None
    assert len(polls[4]["entries"]) == seqs[3]
    # The probe asks from its main thread: where it asks from is where it is.
    first, *same = got["same"]
    assert "threads" in first and "same" not in first  # (the asking thread is left out)
    assert [sorted(a) for a in same] == [["duration", "pid", "same"]] * 2
    moved = got["moved"]
    assert int(moved["fr"]["pg_status"]["0"]["last_enqueued_collective"]) == seqs[3] + 1
    assert "threads" in moved and "same" not in moved


def test_the_group_where_ranks_part_is_judged():
    # Sequence numbers count per process group: the default group agrees, group 1 does not.
    def fr(rank_seq: int) -> dict:
        data = _fr(_entry(9, "all_reduce", 10))
        sub = _entry(rank_seq, "broadcast", 10)
        sub["pg_id"] = 1
        data["entries"].append(sub)
        return data

    recs = [parse_record(0, fr(5), None), parse_record(1, fr(4), None)]
    v = collective_verdict(recs, {1: "x.py:3 in f"}, {0})
    assert v is not None and v.odd == (1,)
    assert v.text == (
        "rank 1 never issued broadcast #5 of pg 1 (it is in x.py:3 in f); rank 0 waits in it"
    )
    many = _fr(*(_entry(s, "all_reduce", 10) for s in range(1, 30)))
    assert len(parse_record(0, many, None).collectives) == 8


def test_quiet_healthy_loop_gets_no_culprit_and_each_suspicion_clears(tuilaunch, tmp_path):
    # Fast steps, collectives running, a line only every 200 steps: silence longer than
    # --hang-timeout, so the watch suspects a hang, but the ranks' sequence numbers advance.
    launch = tuilaunch(
        *("--flight-recorder", "--hang-timeout", str(TIMEOUT), "--on-hang", "stop"),
        *("--log-dir", str(tmp_path), "--standalone", "--nproc-per-node", "2"),
        *(DDP_LOOP, "--steps", "801", "--print-every", "200", "--sleep", "0.02"),
        *("--seconds", "200"),
    )
    assert launch.wait(260) == 0, launch.output[-3000:]
    assert "rank 1 step 800" in launch.stdout
    events = read_journal(journal_path(launch.output))
    assert not [e for e in events if e["kind"] == "hang"]
    kinds = [e["kind"] for e in events]
    suspected = [
        i
        for i, e in enumerate(events)
        if e["kind"] == "stacks_dumped" and e["reason"] == "hang-suspected"
    ]
    assert suspected, kinds
    verdicts = {e["path"]: e for e in events if e["kind"] == "collective_verdict"}
    judged = 0
    for n, i in enumerate(suspected):
        dump = events[i]
        # Each suspicion ends with its cleared event before the next one, unless the workers
        # finish first (a rank leaving the loop for its teardown is quiet too).
        end = suspected[n + 1] if n + 1 < len(suspected) else len(events)
        cleared = [e for e in events[i:end] if e["kind"] == "hang_cleared"]
        if not cleared and "rank_exited" in kinds[i - 5 : end]:
            continue
        assert len(cleared) == 1 and cleared[0]["suspected"], (dump, kinds[i:end])
        assert cleared[0]["ranks"] == dump["odd_ranks"]
        cv = verdicts.get(dump["path"])
        if cv is None:
            continue  # before the first collective (torch still importing): stacks alone
        judged += 1
        # No culprit: the ranks moved between two looks, or (a look that caught them both at
        # one collective, the dump itself pausing them) every rank is at the same one.
        assert cv["odd_ranks"] == [] and cv["verdict_kind"] in ("moving", "same"), cv
        assert dump["odd_ranks"] == [], dump["verdict"]
        if cv["verdict_kind"] == "moving":
            assert " move on (" in dump["verdict"], dump["verdict"]
    assert judged, [events[i]["verdict"] for i in suspected]
    assert "hang suspicion cleared (attempt 0" in launch.stderr, launch.stderr[-3000:]


def test_a_dump_does_not_wait_long_for_a_rank_the_poll_found_silent(tmp_path):
    """Rank 1's responder accepts and never answers (a rank holding the GIL in a C call, or
    SIGSTOPped: its socket's backlog still takes the connection). When the live poll has not
    heard from it for two polls, a dump asks it for SILENT_WAIT only; otherwise it waits its
    2.5 s (every dump of such a hang was 2 s longer, its suspicion and its confirmation)."""
    import sys
    import time

    from tui_launch.core.diagnosis import dumps
    from tui_launch.core.diagnosis.records import Answer
    from tui_launch.core.diagnosis.stacks.model import RankRecord
    from tui_launch.core.workers.table import RankTable

    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in (0, 1)
    ]
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(tmp_path / "1.sock"))
    mute.listen(8)
    try:
        ranks = RankTable()
        ranks.begin_attempt({0: sleepers[0].pid, 1: sleepers[1].pid}, {0: 0, 1: 1}, 2)
        heard: dict[int, tuple[float, Answer]] = {}

        def took() -> float:
            d = dumps.Dumper(
                lambda e: None,
                ranks,
                lambda: str(tmp_path / "run"),
                dict,
                responders=lambda: str(tmp_path),
                recent=lambda: dict(heard),
            )
            t0 = time.monotonic()
            d.take("key", "dashboard")
            return time.monotonic() - t0

        assert took() >= 2.4  # not known silent: its 2.5 s
        old = Answer(RankRecord(1, last_enqueued=7, last_completed=6), None, {"same": False}, 0.0)
        heard[1] = (time.monotonic() - dumps.SILENT_AFTER - 1.0, old)
        assert took() < 2.0
    finally:
        mute.close()
        for p in sleepers:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_gather_asks_every_rank_at_once_on_its_own_thread(tmp_path, monkeypatch):
    # The live poll asks every rank every 2 s: a thread started per rank and poll was a third
    # of its CPU at idle. Real responders (plain processes through the bootstrap): three
    # answer, one is stopped (no answer within the limit), one has none.
    script = tmp_path / "idle.py"
    script.write_text("import time\ndef idling():\n    time.sleep(120)\nidling()\n")
    env = {**os.environ, RESPONDER_ENV: str(tmp_path)}
    procs = [
        subprocess.Popen(
            [PY, "-u", "-m", "tui_launch.core.workers.shim", "-", str(script)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(4)
    ]
    try:
        wait_for(lambda: all((tmp_path / f"{r}.sock").exists() for r in range(4)), 60)
        wait_for(
            lambda: all(a.threads for a in gather(str(tmp_path), range(4), "poll", 2.0).values()),
            60,
            what="every responder to answer",
        )
        os.kill(procs[3].pid, signal.SIGSTOP)
        wait_for(lambda: is_stopped(procs[3].pid), 10, what="rank 3 to be stopped")
        started: list[str] = []
        start = threading.Thread.start

        def counting(self: threading.Thread) -> None:
            started.append(self.name)
            start(self)

        monkeypatch.setattr(threading.Thread, "start", counting)
        t0 = time.monotonic()
        ans = gather(str(tmp_path), range(5), "poll", 0.5, {1: "poll-since"})
        took = time.monotonic() - t0
        monkeypatch.undo()
        assert started == []
        assert sorted(ans) == [0, 1, 2, 3, 4]
        for r in (0, 2):
            main = next(t for t in ans[r].threads or () if t.main)
            assert "idling" in [f.function for f in main.frames], main
        assert ans[1].record.error == "unchanged"  # its own request: it did not move
        assert ans[3].record.error == "no answer in 0.5 s" and ans[3].threads is None
        assert ans[4].record.error == "no responder"
        assert took < 0.5 + 1.0  # one limit for all, not one after another
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
