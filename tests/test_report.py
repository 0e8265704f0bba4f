"""``tuilaunch report``: the report model from a journal, its HTML and Markdown, redaction, and
bad input (fast); a real run with a failure, a restart and a hang, its report opened in headless
Chromium with no network request (slow: ``test_report_browser.py``)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tui_launch.core.journal.report import POINTS, NotAJournal, build
from tui_launch.core.journal.writer import Journal
from tui_launch.core.model.events import (
    HangDetected,
    Injected,
    ProgressRecord,
    RankProgress,
    RunFinished,
    TelemetryRecord,
)
from tui_launch.core.model.redact import REDACTED, redact_args, redact_env
from tui_launch.report import html, markdown
from tui_launch.testing import builders

PY = sys.executable


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--token=abc", "--epochs", "3"], ["--token=***", "--epochs", "3"]),
        (["--token", "abc", "--lr", "1"], ["--token", "***", "--lr", "1"]),
        (["--api-key", "k1", "x.py"], ["--api-key", "***", "x.py"]),
        (["HF_TOKEN=hf_x", "A=1"], ["HF_TOKEN=***", "A=1"]),
        (["--db-password=pw"], ["--db-password=***"]),
        (["--secret", "--verbose"], ["--secret", "--verbose"]),  # no value to hide
        (["--url", "https://me:pw@host/x"], ["--url", "https://me:***@host/x"]),
        (["--epochs=3", "--monkey", "x"], ["--epochs=3", "--monkey", "***"]),  # 'key' in it
    ],
)
def test_redact_args(args: list[str], want: list[str]) -> None:
    assert redact_args(args) == tuple(want)


def test_redact_env() -> None:
    env = redact_env([("HF_TOKEN", "hf_x"), ("AWS_SECRET_ACCESS_KEY", "s"), ("CUDA_HOME", "/c")])
    assert env == (("HF_TOKEN", REDACTED), ("AWS_SECRET_ACCESS_KEY", REDACTED), ("CUDA_HOME", "/c"))


def _write(run_dir: Path, events: list) -> Path:
    """Write ``events`` through the real journal writer into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    journal = Journal(str(run_dir / "journal.jsonl"))
    for e in events:
        journal.write(e)
    journal.close()
    return run_dir / "journal.jsonl"


def _progress(attempt: int, t: float, step: int, loss: float) -> ProgressRecord:
    ranks = tuple(
        RankProgress(g, g, "stdout", step, 1000, rate=10.0 + g, loss=loss + g) for g in range(2)
    )
    return ProgressRecord(
        attempt=attempt,
        leader=0,
        ranks=ranks,
        first_step=0 if attempt == 0 else 40,
        time_to_first_step=1.0,
        steps_reached=step,
        progress_time=t - 1.0 - (30.0 if attempt else 0.0),
        **builders.at(t),
    )


def _run_events(samples: int = 20) -> list:
    """A run of 2 ranks: attempt 0 fails (with a traceback), a restart, attempt 1 hangs."""
    started = builders.run_started(2, max_restarts=1)
    started = dataclasses.replace(
        started,
        args=("--token=abc123secret", "--epochs", "3"),
        command=("tuilaunch", "--nproc-per-node", "2", "train.py", "--token=***"),
        env=(("HF_TOKEN", "***"), ("NCCL_DEBUG", "INFO")),
        tuilaunch_version="9.9.9",
    )
    events: list = [started, *builders.attempt(0, 2, 0.5, 100)]
    for k, e in enumerate(builders.telemetry(0, 2, 100, 1.0, samples, gpus=2)):
        fields = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
        events.append(TelemetryRecord(**fields))
        events.append(_progress(0, 1.0 + k, 4 * k, 1.0 / (k + 1)))
    events.append(
        Injected(
            spec="exception:rank=1",
            fault="exception",
            attempt=0,
            global_rank=1,
            local_rank=1,
            pid=101,
            count=1,
            times=1,
            source="inject",
            ok=True,
            **builders.at(25.0),
        )
    )
    events.append(builders.failed_attempt(0, 26.0))
    events.append(_restart())
    events += builders.attempt(1, 2, 30.0, 200)
    events.append(_progress(1, 32.0, 40, 0.3))
    events.append(_progress(1, 40.0, 80, 0.2))
    events.append(
        HangDetected(
            attempt=1,
            silence=12.0,
            interval=5.0,
            still_ranks=(0, 1),
            confirmation="hung: no main-thread stack moved in 5 s (ranks 0, 1)",
            verdict="rank 1 is not in a collective: train.py:46 in load_batch",
            odd_ranks=(1,),
            first_path="/nowhere/a",
            second_path="/nowhere/b",
            action="stop",
            **builders.at(60.0),
        )
    )
    events.append(RunFinished(outcome="failed", exit_code=1, message="hung", **builders.at(62.0)))
    return events


def _restart():
    from tui_launch.core.model.events import Restart

    return Restart(
        cause="failure",
        from_attempt=0,
        to_attempt=1,
        restarts_used=1,
        budget_left=0,
        **builders.at(26.5),
    )


def test_model_from_a_journal(tmp_path: Path) -> None:
    path = _write(tmp_path / "run", _run_events())
    report = build(str(path.parent))
    assert report.outcome == "failed" and not report.running
    assert report.snapshot.finished is not None and report.snapshot.finished.exit_code == 1
    assert [s.number for s in report.spans] == [0, 1]
    kinds = [m.kind for m in report.marks]
    for kind in ("injection", "failure", "restart", "hang", "finished"):
        assert kind in kinds, kinds
    assert report.duration == pytest.approx(62.0)
    # Every telemetry and progress record is plotted (fewer than POINTS: none merged).
    assert report.telemetry["cpu"].rows == 20 and len(report.telemetry["cpu"].t) == 20
    assert [n for n, _ in report.progress["rate"].columns] == ["rank 0", "rank 1"]
    assert report.progress["loss"].column("rank 0")[0] == pytest.approx(1.0)
    assert report.goodput is not None and len(report.goodput.attempts) == 2
    assert report.command[-1] == "--token=***" and report.tuilaunch_version == "9.9.9"
    assert report.snapshot.hang is not None


def test_series_are_cut_to_points(tmp_path: Path) -> None:
    path = _write(tmp_path / "run", _run_events(samples=50))
    report = build(str(path), points=10)
    cpu = report.telemetry["cpu"]
    assert cpu.rows == 50 and len(cpu.t) == 10
    assert all(len(values) == 10 for _, values in cpu.columns)
    assert POINTS <= 1000  # a day's series stay small in the page


def test_same_snapshot_as_the_full_replay(tmp_path: Path) -> None:
    # The report skips reducing most records; the state it shows is the full replay's.
    from tui_launch.core.journal.writer import read_journal
    from tui_launch.core.model.store import replay

    path = _write(tmp_path / "run", _run_events(samples=90))
    full = replay(read_journal(str(path)))
    got = build(str(path)).snapshot
    assert got.version == full.version and got.events == full.events
    assert got.progress == full.progress
    assert (got.attempts, got.failures, got.root_cause, got.hang, got.finished) == (
        full.attempts,
        full.failures,
        full.root_cause,
        full.hang,
        full.finished,
    )
    assert got.telemetry is not None and full.telemetry is not None
    assert got.telemetry.latest == full.telemetry.latest
    assert got.telemetry.rank_cpu == full.telemetry.rank_cpu


def test_html_is_self_contained(tmp_path: Path) -> None:
    report = build(str(_write(tmp_path / "run", _run_events())))
    page = html.render(report)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp is not None and "default-src &#x27;none&#x27;" in csp.group(1)
    # Nothing to fetch: no src/href to anything, no url() in the styles, no @import.
    assert not re.search(r"""\s(?:src|href)\s*=""", page, re.I)
    assert "@import" not in page and not re.search(r"url\((?!data:)", page)
    # Each inline script is allowed by its hash, and the plot data is valid JSON.
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert data is not None
    plots = json.loads(data.group(1))["plots"]
    assert {p["id"] for p in plots} >= {
        "plot-rate",
        "plot-loss",
        "plot-cpu",
        "plot-rss",
        "plot-gpu-util",  # the fake NVML's GPUs, mapped to the ranks by pid
        "plot-gpu-mem",
    }
    assert "abc123secret" not in page and "--token=***" in page
    assert "rank 1 is not in a collective" in page and "uPlot" in page


def test_a_nan_loss_is_a_gap(tmp_path: Path) -> None:
    # A diverging run prints "loss nan": the page is still made, its data valid JSON.
    events = [*_run_events(), _progress(1, 61.0, 90, float("nan"))]
    page = html.render(build(str(_write(tmp_path / "run", events))))
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert data is not None
    (loss,) = [p for p in json.loads(data.group(1))["plots"] if p["id"] == "plot-loss"]
    assert loss["values"][0][-1] is None


def test_markdown(tmp_path: Path) -> None:
    report = build(str(_write(tmp_path / "run", _run_events())))
    text = markdown.render(report)
    assert text.startswith("# tuilaunch report: examples/train_ddp.py: FAILED (exit code 1)")
    assert "## Root cause" in text and "**verdict**: rank 1 is not in a collective" in text
    assert "| restart |" in text and "| injection |" in text
    assert "abc123secret" not in text and "| HF_TOKEN | *** |" in text
    assert "<script" not in text


def test_the_flight_recorders_verdict_has_its_section(tmp_path: Path) -> None:
    """Issue 34: NCCL's dumps judged while the run ran (the journaled FlightRecorderVerdict,
    made by ``tuilaunch why``'s judge from frgen's NCCL-format pickles): the report's Flight
    Recorder section says the verdict, what was read, the culprits and the groups that wait,
    in Markdown and in HTML; a run without one says so."""
    from tui_launch.core.diagnosis import frdump, frjudge
    from tui_launch.testing import frgen

    frgen.generate(str(tmp_path / "dumps"), 4, (1,), tp=2, pp=2, ep=2)
    verdict = frjudge.judge(frdump.load_dir(str(tmp_path / "dumps")))
    stem = "/runs/x/flightrec/node0.attempt1.rank_"
    fr = dataclasses.replace(verdict.event(1, "nccl", stem), **builders.at(58.0))
    events = _run_events()
    events.insert(-2, fr)
    report = build(str(_write(tmp_path / "run", events)))
    text = markdown.render(report)
    section = text[text.index("## Flight Recorder") : text.index("## Last lines")]
    assert f"- **verdict**: {verdict.text}" in section
    assert verdict.text.startswith("rank 1 never issued _all_gather_base #1001 of ")
    assert "- **read**: 4 NCCL dumps of attempt 1, at +" in section
    assert "- **culprits**: 1" in section and f"- **files**: {stem}*" in section
    assert "10 of 13 process groups wait:" in section
    assert "- TENSOR_MODEL_PARALLEL_GROUP pg 1 (ranks 0, 1): rank 1 never issued " in section
    # On the time axis too, at its moment.
    assert "flight recorder (4 NCCL dumps): rank 1 never issued" in text
    page = html.render(report)
    assert '<h2 id="flight-recorder">Flight Recorder</h2>' in page
    assert '<ul id="fr-groups">' in page and "10 of 13 process groups wait" in page
    without = markdown.render(build(str(_write(tmp_path / "bare", _run_events()))))
    assert "## Flight Recorder\n\nno Flight Recorder dump was judged while the run ran" in without


def test_running_run(tmp_path: Path) -> None:
    # No run_finished yet: a report of a run still going (or whose launcher was killed).
    events = [e for e in _run_events() if not isinstance(e, RunFinished | HangDetected)]
    report = build(str(_write(tmp_path / "run", events)))
    assert report.running and report.outcome == "running"
    assert "running" in markdown.render(report)


def _report(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tui_launch", "report", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def test_cli_writes_both_formats(tmp_path: Path) -> None:
    run = _write(tmp_path / "run", _run_events()).parent
    out = _report(str(run), "-o", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    out = _report(str(run), "--format", "md", "-o", "-")
    assert out.returncode == 0 and out.stdout.startswith("# tuilaunch report")
    out = _report(str(run / "journal.jsonl"), cwd=tmp_path)  # default: run.html here
    assert out.returncode == 0 and (tmp_path / "run.html").exists()


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (None, ["/nonexistent/run"], "no journal at /nonexistent/run"),
        ("empty-dir", [], "no journal at"),
        ("not-journal", [], "holds no tuilaunch event"),
        ("journal", ["--format", "pdf"], "--format must be html or md"),
        ("journal", ["--bogus"], "unexpected argument '--bogus'"),
        ("journal", ["-o"], "-o needs a value"),
        (None, [], "a run directory or journal is needed"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, make: str | None, args: list[str], message: str
) -> None:
    target: list[str] = []
    if make == "empty-dir":
        target = [str(tmp_path)]
    elif make == "not-journal":
        (tmp_path / "x.jsonl").write_text("hello\nworld\n")
        target = [str(tmp_path / "x.jsonl")]
    elif make == "journal":
        target = [str(_write(tmp_path / "run", _run_events()))]
    out = _report(*target, *args, cwd=tmp_path)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("tuilaunch report: error: ") and message in out.stderr
    assert not os.path.exists(tmp_path / "run.html")


def test_unwritable_output_is_exit_1(tmp_path: Path) -> None:
    run = _write(tmp_path / "run", _run_events()).parent
    out = _report(str(run), "-o", str(tmp_path / "no" / "such" / "dir" / "r.html"))
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "cannot write" in out.stderr


def test_not_a_journal_error_type(tmp_path: Path) -> None:
    with pytest.raises(NotAJournal):
        build(str(tmp_path))


def test_a_long_synthetic_journal(tmp_path: Path) -> None:
    # bench/report.py's generator (a day of 1M events there), for 20 minutes at 12 log marks
    # a second: every record is read, the plots stay at POINTS, the page small.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_report", Path(__file__).parent.parent / "bench" / "report.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "run" / "journal.jsonl"
    path.parent.mkdir()
    events = bench.write_journal(str(path), 12, 1200)
    report = build(str(path))
    assert report.events == events > 14_000
    assert report.telemetry["cpu"].rows == 119 and report.progress["rate"].rows == 119
    assert len(report.telemetry["cpu"].columns) == 8
    page = html.render(report)
    assert len(page.encode()) < 1_000_000


def test_log_tails_are_plain_text(tmp_path: Path) -> None:
    from tui_launch.core.logs.lastlines import tail_lines

    log = tmp_path / "stdout.log"
    log.write_bytes(
        b"\x1b[1;31merror\x1b[0m: bad\n"
        b"train:  10%|#  | 1/10\rtrain:  20%|## | 2/10\r\n"
        b"\x1b]0;title\x07plain\n"
    )
    size, lines = tail_lines(str(log), 10) or (0, ())
    assert size == log.stat().st_size
    assert lines == ("error: bad", "train:  20%|## | 2/10", "plain")


def test_many_attempts_share_one_lane(tmp_path: Path) -> None:
    events: list = [builders.run_started(2, max_restarts=40)]
    for n in range(30):
        events += builders.attempt(n, 2, 10.0 * n, 100 + 10 * n)
    page = html.render(build(str(_write(tmp_path / "run", events))))
    assert page.count('<div class="lane">') == 2 and "attempts 0-29" in page
    assert page.count('<div class="span ') == 30


def test_run_env_keeps_what_shapes_a_run() -> None:
    from tui_launch.core.run.reports import run_env

    env = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "MY_TOKEN": "s", "PWD": "/", "HOME": "/"}
    assert run_env(env) == [("CUDA_VISIBLE_DEVICES", "0,1"), ("MY_TOKEN", "s")]
    assert redact_env(run_env(env))[1] == ("MY_TOKEN", REDACTED)


def test_a_flood_of_marks_keeps_the_key_ones() -> None:
    from tui_launch.core.journal.report import Mark

    marks = [Mark(float(i), "slowdown", 0, "slow") for i in range(5000)]
    marks.insert(4000, Mark(4000.5, "failure", 0, "boom"))
    kept = html.drawn(marks)
    assert len(kept) == html.MARKS_DRAWN and any(m.kind == "failure" for m in kept)
    assert [m.wall for m in kept] == sorted(m.wall for m in kept)


def _tqdm_epoch(steps: int) -> bytes:
    """One epoch of a tqdm bar as its log holds it: every redraw after a carriage return, no
    newline until the bar closes."""
    return b"".join(
        b"\rEpoch 1: %3d%%|%-10s| %d/%d [00:%02d<00:00, 812.3it/s, loss=0.%03d]"
        % (100 * k // steps, b"#" * (10 * k // steps), k, steps, k % 60, k % 1000)
        for k in range(steps + 1)
    )


@pytest.mark.parametrize("closed", [False, True], ids=["bar-running", "bar-closed"])
def test_a_last_line_longer_than_the_tail(tmp_path: Path, closed: bool) -> None:
    # A tqdm bar redrawn for a whole epoch is one line of megabytes: the lines before it and
    # the bar as the terminal last showed it are the rank's last lines, not nothing.
    path = _write(tmp_path / "run", _run_events())
    log = path.parent / "attempt_1" / "0" / "stdout.log"
    log.parent.mkdir(parents=True)
    bar = _tqdm_epoch(20_000)
    assert len(bar) > 1_000_000
    log.write_bytes(b"loading shards\nrank 0: 5000 batches\n" + bar + (b"\n" if closed else b""))
    report = build(str(path.parent))
    (got,) = [g for g in report.logs if g.path == "attempt_1/0/stdout.log"]
    last = "Epoch 1: 100%|##########| 20000/20000 [00:20<00:00, 812.3it/s, loss=0.000]"
    assert got.lines == ("loading shards", "rank 0: 5000 batches", last)
    assert got.size == log.stat().st_size
    page = html.render(report)
    assert "last 3 lines: attempt_1/0/stdout.log" in page
    assert last.replace("<", "&lt;") in page
    assert last in markdown.render(report)


def test_a_single_line_too_long_to_show_says_what_is_cut(tmp_path: Path) -> None:
    from tui_launch.core.logs.lastlines import LINE_CHARS, tail_lines

    log = tmp_path / "stdout.log"
    log.write_bytes(b"first\n" + b"x" * 300_000 + b"END\nlast\n")
    size, lines = tail_lines(str(log), 10) or (0, ())
    assert size == log.stat().st_size and lines[0] == "first" and lines[2] == "last"
    assert lines[1].startswith("[298,003 bytes of this line left out] x")
    assert lines[1].endswith("xEND") and len(lines[1]) < LINE_CHARS + 60


HOSTILE = "<img src=x onerror=alert(1)> | `rm -rf /` [a](javascript:alert(2)) &amp; <!--\ncut"


def test_markdown_shows_hostile_worker_output_as_text(tmp_path: Path) -> None:
    # A worker's exception, its environment and a notice full of markup: rendered by a real
    # Markdown parser (CommonMark with tables, raw HTML allowed as GitHub allows some), the
    # report shows that text and nothing of it becomes a tag, a link, a code span or a cell.
    from markdown_it import MarkdownIt

    from tui_launch.core.model.events import AttemptFailed, Notice

    events = _run_events()
    started = dataclasses.replace(events[0], env=(("EVIL", HOSTILE), ("OK", "1")))
    bad = builders.failure(0, 1, pid=5101, at=26.0, message=HOSTILE, traceback="T <b>x</b>")
    hostile = [Notice("error", HOSTILE, **builders.at(27.0)), AttemptFailed(0, (bad,))]
    events = [started, *events[1:-2], *hostile, *events[-2:]]
    text = markdown.render(build(str(_write(tmp_path / "run", events))))
    page = MarkdownIt("commonmark").enable("table").render(text)
    for tag in ("<img", "<a ", "<!--", "<b>"):
        assert tag not in page, tag
    shown = "&lt;img src=x onerror=alert(1)&gt; | `rm -rf /` [a](javascript:alert(2)) &amp;amp;"
    # The environment's row: the whole value in one cell, as text.
    assert f"<td>EVIL</td>\n<td>{shown} &lt;!-- cut</td>" in page
    assert f"<td>error: {shown} &lt;!-- cut</td>" in page  # the notice, in the events
    assert "<strong>rank 1 (local 1, pid 5101) exit 1: " + shown in page
    assert "<code>" not in page.split("<table>")[1]  # the header table: no code span
    # Every table row has as many cells as its head.
    for table in page.split("<table>")[1:]:
        body = table.split("</table>")[0]
        head = len(re.findall(r"<th[ >]", body))
        rows = body.split("<tr>")[2:]
        assert rows and all(len(re.findall(r"<td[ >]", r)) == head for r in rows), body[:500]


def test_the_step_rate_falls_to_zero_when_steps_stop(tmp_path: Path) -> None:
    # A hang: the ranks' step counters stop for 60 s while every progress record repeats the
    # tracker's last rate (10 steps/s). The plotted rate is the counters' own: 0 while hung.
    events: list = [builders.run_started(2), *builders.attempt(0, 2, 0.5, 100)]
    steps = [10 * k for k in range(10)] + [90] * 6 + [100, 110]  # a record every 1 s, then 10 s
    walls = [1.0 + k for k in range(10)] + [20.0 + 10 * k for k in range(6)] + [71.0, 72.0]
    for t, step in zip(walls, steps, strict=True):
        events.append(_progress(0, t, step, 0.5))
    report = build(str(_write(tmp_path / "run", events)))
    rate = report.progress["rate"].column("rank 0")
    assert rate[0] is None  # no earlier record to count from
    assert rate[1:10] == (10.0,) * 9
    assert rate[10] == pytest.approx(0.0) and rate[11:16] == (0.0,) * 5  # hung: 0, not 10
    assert rate[16:] == (10.0, 10.0)  # moving again
    assert "| rank 0 | 10 |" in markdown.render(report)
