"""Prometheus metrics (issue 18): families from snapshots, the endpoint, the textfile, the options.

Fast tests build snapshots from real event sequences posted to a real :class:`RunStore` and
parse the exposition with prometheus_client's own parser. One real 2-rank CPU run (a Runner on
steady.py, as tests/test_control.py builds it, with the fake NVML for GPU families) is scraped
over a real socket before and after a SIGKILL, and, where Debian's ``prometheus`` is installed,
by a real Prometheus server whose query API must return the series. The scrape config and the
alert rules of docs/metrics.md are checked and unit-tested with ``promtool``.
The command line itself (tuilaunch processes, two agents as two nodes) is in
tests/test_metrics_cli.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TOKEN_VAR, WORKERS, free_port, wait_for, wait_gone
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tui_launch import metrics
from tui_launch.core.launch.args import Options, parse
from tui_launch.core.model import events as ev
from tui_launch.core.model.commands import SignalRank
from tui_launch.core.model.store import RunStore
from tui_launch.metrics import families as fam
from tui_launch.metrics import serve
from tui_launch.testing import builders
from tui_launch.testing.builders import exited

NODE = "node-a"
ALLOWED_LABELS = {"node", "rank", "local_rank", "gpu", "state", "cause", "reason"}
INFO_LABELS = {"run_id", "version", "torch", "uuid", "name"}
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

# ----------------------------------------------------------------------- event builders


def _workers(attempt: int, pid0: int = 100) -> ev.WorkersStarted:
    """Attempt ``attempt``'s 2 workers (pids ``pid0``, ``pid0 + 1``), their logs nowhere."""
    w = builders.workers_started(attempt, 2, pid0)
    return dataclasses.replace(w, log_dir=f"/nonexistent/attempt_{attempt}")


def _run_started() -> ev.RunStarted:
    """The run's first event (2 ranks, 3 restarts) on this node, as run ``job-42``."""
    return dataclasses.replace(builders.run_started(2, 3, at=None), run_id="job-42", host=NODE)


def _sample(attempt: int, cpu: float = 50.0) -> ev.TelemetrySample:
    gpus = tuple(
        ev.GpuReading(
            index=i,
            name="Fake GPU",
            uuid=f"GPU-{i}",
            util=40 + i,
            mem_used=2 << 30,
            mem_total=16 << 30,
            temp=60,
            power=150.5,
        )
        for i in range(2)
    )
    ranks = tuple(
        ev.RankReading(
            local_rank=i,
            global_rank=i,
            pid=100 + i,
            cpu=cpu,
            rss=(500 + i) << 20,
            threads=4,
            status="running",
            gpus=(i,),
            mapping="pid",
            gpu_mem=1 << 30,
            gpu_util=40,
        )
        for i in range(2)
    )
    return ev.TelemetrySample(
        attempt=attempt, gpu_state="ok", gpu_note="", gpus=gpus, ranks=ranks, simulated=True
    )


def _failure(local_rank: int, code: int, collateral: bool) -> ev.Failure:
    """Attempt 0's ``local_rank`` killed by signal ``-code``, on this node."""
    return builders.failure(
        0, local_rank, pid=100 + local_rank, at=0.0, code=code, collateral=collateral, host=NODE
    )


def _kill_rank_1(store: RunStore) -> None:
    """What the runner posts when rank 1 is SIGKILLed and the group restarts on failure."""
    store.post(exited(0, 1, 101, -9))
    store.post(exited(0, 0, 100, -15, by_agent=True))
    store.post(
        ev.AttemptFailed(
            attempt=0,
            failures=(_failure(1, -9, False), _failure(0, -15, True)),
        )
    )
    store.post(
        ev.Restart(cause="failure", from_attempt=0, to_attempt=1, restarts_used=1, budget_left=2)
    )
    store.post(_workers(1, 200))


def _exporter(store: RunStore) -> tuple[fam.RunCollector, fam.EventTally]:
    tally = fam.EventTally()
    store.subscribe(tally, replay=True)
    return fam.RunCollector(store.snapshot, fam.RunInfo(node=NODE), tally=tally), tally


def _text(collector: fam.RunCollector) -> str:
    from prometheus_client.exposition import generate_latest

    return generate_latest(collector.registry()).decode()


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)], from prometheus_client's own parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    hits = [
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    ]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


# ------------------------------------------------------------------------- families


def test_families_and_labels_of_a_running_two_rank_run():
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    store.post(_workers(0))
    store.post(_sample(0))
    s = _samples(_text(collector))

    info = s["tuilaunch_info"]
    assert info == [
        (
            {
                "run_id": "job-42",
                "node": NODE,
                "version": metrics.RunInfo(node="x").version,
                "torch": "2.13.0",
            },
            1.0,
        )
    ]
    assert _value(s, "tuilaunch_workers", state="running") == 2
    assert _value(s, "tuilaunch_workers", state="failed") == 0
    assert {lab["cause"] for lab, _ in s["tuilaunch_restarts_total"]} == {
        "failure",
        "manual",
        "membership",
    }
    assert _value(s, "tuilaunch_restart_budget_remaining") == 3
    assert _value(s, "tuilaunch_attempt") == 0
    assert _value(s, "tuilaunch_run_finished") == 0
    assert "tuilaunch_run_exit_code" not in s  # a 0 before the end would read as success
    for rank in ("0", "1"):
        assert _value(s, "tuilaunch_rank_up", rank=rank, local_rank=rank, node=NODE) == 1
        assert _value(s, "tuilaunch_rank_rss_bytes", rank=rank) == (500 + int(rank)) << 20
        assert _value(s, "tuilaunch_rank_gpu_memory_bytes", rank=rank, gpu=rank) == 1 << 30
        # 50 % of a core over one 1 s sample.
        assert _value(s, "tuilaunch_rank_cpu_seconds_total", rank=rank) == pytest.approx(0.5)
    assert _value(s, "tuilaunch_gpu_utilization_ratio", gpu="1") == pytest.approx(0.41)
    assert _value(s, "tuilaunch_gpu_memory_used_bytes", gpu="0") == 2 << 30
    assert _value(s, "tuilaunch_gpu_memory_total_bytes", gpu="0") == 16 << 30
    assert _value(s, "tuilaunch_gpu_power_watts", gpu="0") == 150.5
    assert _value(s, "tuilaunch_gpu_temperature_celsius", gpu="0") == 60
    assert _value(s, "tuilaunch_gpu_info", gpu="0")
    assert [lab["uuid"] for lab, _ in s["tuilaunch_gpu_info"]] == ["GPU-0", "GPU-1"]
    assert "tuilaunch_rank_exits_total" not in s  # no exit yet: an empty family

    # Bounded labels only: never a pid, never an attempt.
    for name, rows in s.items():
        for labels, _ in rows:
            extra = set(labels) - ALLOWED_LABELS
            if name.endswith("_info"):
                extra -= INFO_LABELS
            assert not extra, (name, labels)
            assert labels.get("node") == NODE, (name, labels)


def test_after_a_kill_the_restart_and_exit_counters_move():
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    store.post(_workers(0))
    before = _samples(_text(collector))
    _kill_rank_1(store)
    after = _samples(_text(collector))

    assert _value(before, "tuilaunch_restarts_total", cause="failure") == 0
    assert _value(after, "tuilaunch_restarts_total", cause="failure") == 1
    assert _value(after, "tuilaunch_restarts_total", cause="manual") == 0
    assert _value(after, "tuilaunch_restart_budget_remaining") == 2
    assert _value(after, "tuilaunch_attempt") == 1
    exits = after["tuilaunch_rank_exits_total"]
    assert sorted((lab["rank"], lab["reason"], v) for lab, v in exits) == [
        ("0", "SIGTERM", 1.0),
        ("1", "SIGKILL", 1.0),
    ]
    # The runner may see one exit twice (monitor, then reaper): still one.
    store.post(
        ev.RankExited(
            attempt=0,
            local_rank=1,
            global_rank=1,
            pid=101,
            exit_code=-9,
            signal="SIGKILL",
            by_agent=False,
        )
    )
    again = _samples(_text(collector))
    assert _value(again, "tuilaunch_rank_exits_total", rank="1", reason="SIGKILL") == 1

    # A manual restart's SIGTERMs are exits of an attempt the snapshot no longer holds: the
    # counter keeps them.
    store.post(
        ev.RankExited(
            attempt=1,
            local_rank=0,
            global_rank=0,
            pid=200,
            exit_code=1,
            signal=None,
            by_agent=False,
        )
    )
    store.post(
        ev.Restart(cause="manual", from_attempt=1, to_attempt=2, restarts_used=2, budget_left=2)
    )
    store.post(_workers(2, 300))
    last = _samples(_text(collector))
    assert _value(last, "tuilaunch_restarts_total", cause="manual") == 1
    assert _value(last, "tuilaunch_rank_exits_total", rank="0", reason="exit_1") == 1
    assert _value(last, "tuilaunch_rank_exits_total", rank="1", reason="SIGKILL") == 1


def test_a_tally_subscribed_late_replays_the_history():
    store = RunStore()
    store.post(_run_started())
    store.post(_workers(0))
    _kill_rank_1(store)
    collector, _ = _exporter(store)  # the CLI subscribes before the run; replay covers later
    s = _samples(_text(collector))
    assert _value(s, "tuilaunch_rank_exits_total", rank="1", reason="SIGKILL") == 1


def test_finished_run_and_exit_code():
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    store.post(_workers(0))
    for lr in (0, 1):
        store.post(
            ev.RankExited(
                attempt=0,
                local_rank=lr,
                global_rank=lr,
                pid=100 + lr,
                exit_code=0,
                signal=None,
                by_agent=False,
            )
        )
    store.post(ev.RunFinished(outcome="succeeded", exit_code=0, message="ok"))
    s = _samples(_text(collector))
    assert _value(s, "tuilaunch_run_finished") == 1
    assert _value(s, "tuilaunch_run_exit_code") == 0
    assert _value(s, "tuilaunch_workers", state="exited") == 2
    assert _value(s, "tuilaunch_rank_up", rank="0") == 0
    assert _value(s, "tuilaunch_rank_exits_total", rank="0", reason="exit_0") == 1


def test_exit_reasons_are_bounded_names():
    assert fam.exit_reason(-9, "SIGKILL") == "SIGKILL"
    assert fam.exit_reason(-9, None) == "SIGKILL"
    assert fam.exit_reason(1, None) == "exit_1"
    assert fam.exit_reason(0, None) == "exit_0"


def test_stale_telemetry_of_an_earlier_attempt_is_not_exported():
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    store.post(_workers(0))
    store.post(_sample(0))
    _kill_rank_1(store)  # attempt 1, no sample of it yet
    s = _samples(_text(collector))
    assert "tuilaunch_rank_rss_bytes" not in s
    # The CPU counter covers every attempt and stays.
    assert _value(s, "tuilaunch_rank_cpu_seconds_total", rank="1") == pytest.approx(0.5)


def test_cpu_counter_never_goes_down():
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    store.post(_workers(0))
    for _ in range(3):
        store.post(_sample(0, cpu=100.0))
    first = _value(_samples(_text(collector)), "tuilaunch_rank_cpu_seconds_total", rank="0")
    assert first == pytest.approx(3.0)
    snap = store.snapshot()
    assert snap.telemetry is not None
    # The sampler's end totals may hold a sample fewer than the store's fold.
    fewer = tuple(
        t.__class__(**{**t.__dict__, "cpu_sum": t.cpu_sum - 100.0, "samples": t.samples - 1})
        for t in snap.telemetry.totals
    )
    store.post(ev.TelemetryTotals(totals=fewer))
    later = _value(_samples(_text(collector)), "tuilaunch_rank_cpu_seconds_total", rank="0")
    assert later == pytest.approx(3.0)


def test_last_output_time_from_the_rank_log_files(tmp_path):
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    w = _workers(0)
    store.post(ev.WorkersStarted(attempt=0, workers=w.workers, log_dir=str(tmp_path)))
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("hello\n")
    os.utime(tmp_path / "0" / "stdout.log", (1000.0, 1000.0))
    (tmp_path / "0" / "stderr.log").write_text("")
    os.utime(tmp_path / "0" / "stderr.log", (2000.0, 2000.0))
    s = _samples(_text(collector))
    assert s["tuilaunch_rank_last_output_timestamp_seconds"] == [
        ({"node": NODE, "rank": "0", "local_rank": "0"}, 2000.0)
    ]  # rank 1 wrote nothing yet: no series, rather than a 0 that would read as 1970


def test_progress_and_hang_families_come_from_the_snapshot():
    from tui_launch.testing import builders, scenarios

    def broken(snap):
        raise RuntimeError("a hook bug")

    # Progress: rank 0 prints steps (as most frameworks, from one rank); the real watcher
    # folds its lines into the snapshot, and the scrape reads them from there.
    store = RunStore()
    store.post(_run_started())
    store.post(builders.workers_started(0, 2, 5100, at=0.1))
    for e in builders.progress(0, 2, 0.1, 30.0, 10.0, total=1000, fmt="plain"):
        store.post(e)
    snap = store.snapshot()
    assert snap.progress is not None
    (p,) = snap.progress.latest.ranks
    assert p.step and p.rate and p.last_step_ago is not None
    collector = fam.RunCollector(store.snapshot, fam.RunInfo(node=NODE), extra=(broken,))
    s = _samples(_text(collector))
    assert _value(s, metrics.PROGRESS_STEP, rank="0") == p.step
    assert _value(s, metrics.PROGRESS_STEPS_PER_SECOND, rank="0") == pytest.approx(p.rate)
    assert _value(s, metrics.PROGRESS_LAST_STEP, rank="0") == pytest.approx(
        snap.progress.latest.wall - p.last_step_ago
    )
    assert [labels["rank"] for labels, _ in s[metrics.PROGRESS_STEP]] == ["0"]  # rank 1: silent
    assert _value(s, metrics.HANG_SUSPECTED, rank="1") == 0
    assert _value(s, "tuilaunch_workers", state="running") == 2  # the broken hook cost nothing

    # A confirmed hang flags the odd rank out, not the ranks that wait for it.
    hung = scenarios.hung().snapshot()
    assert hung.hung_ranks == (1,)
    s = _samples(_text(fam.RunCollector(lambda: hung, fam.RunInfo(node=NODE))))
    assert _value(s, metrics.HANG_SUSPECTED, rank="1") == 1
    assert _value(s, metrics.HANG_SUSPECTED, rank="0") == 0


# ----------------------------------------------------------------------------- HTTP


def _get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def test_http_endpoint_on_loopback(tmp_path):
    store = RunStore()
    collector, _ = _exporter(store)
    store.post(_run_started())
    store.post(_workers(0))
    server = serve.MetricsServer(collector.registry(), 0).start()
    try:
        host, port = server.address
        assert host == "127.0.0.1"
        code, ctype, body = _get(server.url)
        assert code == 200 and ctype.startswith("text/plain"), ctype
        assert _value(_samples(body), "tuilaunch_rank_up", rank="1") == 1
        _kill_rank_1(store)  # a scrape reads the latest snapshot
        _, _, body = _get(server.url)
        assert _value(_samples(body), "tuilaunch_restarts_total", cause="failure") == 1
        code, _, body = _get(f"http://127.0.0.1:{port}/")
        assert code == 404 and "/metrics" in body
        assert _get(f"http://127.0.0.1:{port}/metricsx")[0] == 404
        code, ctype, body = _get(server.url, accept="application/openmetrics-text; version=1.0.0")
        assert code == 200 and ctype.startswith("application/openmetrics-text"), ctype
        assert body.rstrip().endswith("# EOF")
        assert "tuilaunch_restarts_total" in body
    finally:
        server.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_a_failing_scrape_is_a_500_and_prints_nothing(capfd):
    class Broken(fam.RunCollector):
        def collect(self) -> Iterator[Metric]:
            raise RuntimeError("boom")

    server = serve.MetricsServer(Broken(RunStore().snapshot, fam.RunInfo(node=NODE)).registry(), 0)
    server.start()
    try:
        code, _, body = _get(server.url)
        assert code == 500 and "RuntimeError: boom" in body, body
        # A client that hangs up before the answer: no traceback on the run's console either.
        with socket.create_connection(server.address, timeout=5) as c:
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _get(server.url)[0] == 500  # still serving
    finally:
        server.close()
    assert capfd.readouterr().err == ""


def test_bind_fails_on_a_port_in_use_before_serving():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = serve.MetricsServer(
            fam.RunCollector(RunStore().snapshot, fam.RunInfo(node=NODE)).registry(), port
        )
        with pytest.raises(metrics.MetricsError, match=rf"127\.0\.0\.1:{port} .*in use"):
            server.bind()
        server.close()  # nothing to close: no error either


def _listening_inodes() -> set[str]:
    """Socket inodes of this process that listen on TCP (IPv4 or IPv6)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    listening = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fp:
            for line in fp.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A":  # TCP_LISTEN
                    listening.add(cols[9])
    return mine & listening


def _options(**kw: Any) -> Options:
    return Options(no_tui=True, journal=None, **kw)


def test_nothing_listens_or_runs_when_the_options_are_off():
    before = _listening_inodes()
    threads = {t.name for t in threading.enumerate()}
    store = RunStore()
    exporters = metrics.start_exporters(_options(), store)
    assert exporters.server is None and exporters.textfile is None
    assert _listening_inodes() == before
    assert {t.name for t in threading.enumerate()} == threads
    exporters.close()
    # And the same check sees the server when it is on (the check is not blind).
    on = metrics.start_exporters(_options(metrics_port=free_port()), store)
    try:
        assert len(_listening_inodes() - before) == 1
    finally:
        on.close()
    assert _listening_inodes() == before


# ------------------------------------------------------------------------- textfile


@pytest.mark.slow
def test_textfile_is_never_seen_half_written(tmp_path):
    store = RunStore()
    store.post(_run_started())
    store.post(_workers(0))
    store.post(_sample(0))
    exporters = metrics.start_exporters(
        _options(metrics_textfile=str(tmp_path)), store, metrics.RunInfo(node="node/a b")
    )
    assert exporters.textfile is not None
    exporters.textfile._loop.interval = 0.01  # write as fast as it can while a reader reads
    exporters.textfile._loop.wake()
    path = tmp_path / "tuilaunch_job-42_node_a_b.prom"
    reads: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            try:
                s = _samples(text)
                assert text.endswith("\n")
                assert _value(s, "tuilaunch_workers", state="running") == 2
                reads.append(1)
            except BaseException as e:
                errors.append(e)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        wait_for(lambda: exporters.textfile and exporters.textfile.writes >= 100, 30, what="writes")
        for i in range(50):  # the content changes while being read
            store.post(_sample(0, cpu=float(i)))
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors[0]
    assert len(reads) > 10
    writer = exporters.textfile
    assert writer.path == str(path)
    exporters.close()
    final = _samples(path.read_text())
    assert _value(final, "tuilaunch_run_finished") == 1  # the last write marks it finished
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert not writer._loop.running


def test_textfile_waits_for_the_run_id_and_the_last_write_marks_finished(tmp_path):
    store = RunStore()
    exporters = metrics.start_exporters(
        _options(metrics_textfile=str(tmp_path)), store, metrics.RunInfo(node=NODE)
    )
    writer = exporters.textfile
    assert writer is not None
    # The writer has ticked (and finished the tick) without a run id: no file named "unknown".
    wait_for(lambda: writer._loop.ticks >= 1, 10, what="the first tick")
    assert list(tmp_path.iterdir()) == [] and writer.writes == 0
    store.post(_run_started())  # the rendezvous names the run
    path = tmp_path / f"tuilaunch_job-42_{NODE}.prom"
    wait_for(path.exists, 10, what="the first write")
    assert _value(_samples(path.read_text()), "tuilaunch_run_finished") == 0
    exporters.close()
    assert _value(_samples(path.read_text()), "tuilaunch_run_finished") == 1


def test_textfile_error_is_one_notice(tmp_path):
    store = RunStore()
    store.post(_run_started())
    gone = tmp_path / "gone"
    gone.mkdir()
    exporters = metrics.start_exporters(
        _options(metrics_textfile=str(gone)), store, metrics.RunInfo(node=NODE)
    )
    assert exporters.textfile is not None
    wait_for(lambda: exporters.textfile and exporters.textfile.writes >= 1, 10, what="a write")
    shutil.rmtree(gone)
    exporters.textfile._loop.interval = 0.01
    exporters.textfile._loop.wake()
    wait_for(lambda: store.snapshot().notices, 10, what="the notice")
    # More failed writes after the first (every tick fails now): still one notice.
    writer = exporters.textfile
    failed = writer._loop.ticks
    wait_for(lambda: writer._loop.ticks >= failed + 3, 10, what="three more ticks")
    exporters.close()
    notices = [n for n in store.snapshot().notices if "--metrics-textfile" in n.message]
    assert len(notices) == 1, notices


# --------------------------------------------------------------------------- options


def test_options_parse_and_defaults(tmp_path):
    port = free_port()
    _, opts = parse(["--metrics-port", str(port), "--metrics-textfile", str(tmp_path), "x.py"])
    assert (opts.metrics_port, opts.metrics_bind, opts.metrics_textfile) == (
        port,
        "127.0.0.1",
        str(tmp_path),
    )
    _, opts = parse(["--metrics-port", str(port), "--metrics-bind", "0.0.0.0", "x.py"])
    assert opts.metrics_bind == "0.0.0.0"
    _, opts = parse(["x.py"])
    assert (opts.metrics_port, opts.metrics_textfile) == (None, None)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--metrics-port", "-1"], ["--metrics-port", "1-65535", "-1"]),
        (["--metrics-port", "abc"], ["--metrics-port", "'abc'"]),
        (["--metrics-port", "8000", "--metrics-bind", "nowhere"], ["--metrics-bind", "nowhere"]),
        (["--metrics-port", "8000", "--metrics-bind", "192.0.2.1"], ["192.0.2.1:8000"]),
        (["--metrics-bind", "127.0.0.1"], ["--metrics-bind needs --metrics-port"]),
        (["--metrics-textfile", "/nonexistent-dir"], ["--metrics-textfile", "/nonexistent-dir"]),
        (["--metrics-textfile", "/proc"], ["--metrics-textfile", "/proc", "not a writable"]),
    ],
)
def test_bad_options_are_one_line_exit_2_in_process(capsys, argv, needles):
    with pytest.raises(SystemExit) as e:
        parse([*argv, "x.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tuilaunch: error: "), err
    for needle in needles:
        assert needle in err[0], (needle, err)


# The real command line with a bad --metrics-port: tests/test_metrics_cli.py.


# ------------------------------------------------------------------ alert rules (promtool)


def _yaml_blocks() -> list[str]:
    """The YAML blocks of docs/metrics.md (the scrape config, the rules)."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)


def _rules_file(tmp_path: Path) -> Path:
    rules = next(b for b in _yaml_blocks() if b.startswith("groups:"))
    path = tmp_path / "rules.yml"
    path.write_text(rules)
    return path


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt install prometheus)"
)
def test_readme_rules_and_scrape_config_pass_promtool(tmp_path):
    rules = _rules_file(tmp_path)
    p = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 rules found" in p.stdout, p.stdout
    scrape = next(b for b in _yaml_blocks() if b.startswith("scrape_configs:"))
    (tmp_path / "prometheus.yml").write_text(scrape + "rule_files: [rules.yml]\n")
    p = subprocess.run(
        [PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _job_series(
    run_id: str, port: int, out: tuple[str, str], finished: str, restarts: str
) -> list[dict]:
    """A two-node job as Prometheus stores it: each node's target has its own ``instance``."""
    series = []
    for i, node in enumerate(("n1", "n2")):
        where = {"instance": f"{node}:{port}", "job": "tuilaunch", "node": node}
        series += [
            _series("tuilaunch_info", "1x45", run_id=run_id, version="0", torch="2", **where),
            _series(
                "tuilaunch_rank_last_output_timestamp_seconds",
                out[i],
                rank=str(i),
                local_rank="0",
                **where,
            ),
            _series("tuilaunch_run_finished", finished, **where),
            _series("tuilaunch_restarts_total", restarts, cause="failure", **where),
        ]
    return series


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt install prometheus)"
)
def test_readme_alert_rules_fire_as_written(tmp_path):
    """``promtool test rules`` on docs/metrics.md's rules, over the series tuilaunch exports.

    Run ``r1`` (two nodes): rank 0 on n1 prints every minute until minute 5, rank 1 on n2 never
    prints (its files' mtime stays at the start); one failure restart at minute 30, seen by both
    nodes. Run ``r2`` (the same two hosts, another port): silent from the start but finished,
    never restarted. Expected: one no-progress alert for r1 from minute 16 on (not at 10: n1
    printed until 5), none for r2; one restart alert for r1 (not one per node).
    """
    _rules_file(tmp_path)
    silent_then = "0 60 120 180 240 300 300x40"
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    *_job_series("r1", 9400, (silent_then, "0x45"), "0x45", "0x29 1x60"),
                    *_job_series("r2", 9401, ("0x45", "0x45"), "1x45", "0x90"),
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "TuilaunchNoProgress", "exp_alerts": []},
                    {
                        "eval_time": "16m",
                        "alertname": "TuilaunchNoProgress",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "run_id": "r1"},
                                "exp_annotations": {
                                    "summary": "tuilaunch run r1: no output from any rank for "
                                    "10 minutes"
                                },
                            }
                        ],
                    },
                    {"eval_time": "20m", "alertname": "TuilaunchRestarted", "exp_alerts": []},
                    {
                        "eval_time": "40m",
                        "alertname": "TuilaunchRestarted",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "info",
                                    "run_id": "r1",
                                    "cause": "failure",
                                },
                                "exp_annotations": {
                                    "summary": "tuilaunch run r1 restarted its workers (failure) "
                                    "in the last hour"
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    # JSON is YAML: no yaml dependency for the test.
    (tmp_path / "test.yml").write_text(json.dumps(test))
    p = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr


# ----------------------------------------------------------- a real run, a real Prometheus

STEADY = str(WORKERS / "steady.py")


class _Prometheus:
    """Debian's prometheus on a free loopback port, scraping ``target`` every second."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: tuilaunch\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 (closed in stop)
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def ready(self) -> bool:
        with contextlib.suppress(OSError):
            return _get(f"http://127.0.0.1:{self.port}/-/ready")[0] == 200
        return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        code, _, body = _get(url)
        assert code == 200, body
        data = json.loads(body)
        assert data["status"] == "success", data
        return list(data["data"]["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A real 2-rank CPU run with the exporters on; rank 1 SIGKILLed once; scraped at each step.

    Where Debian's prometheus is installed, a real server scrapes the run every second and is
    queried while attempt 1 runs. Returns what the tests below check.
    """
    from tui_launch.core.run.config import RunConfig
    from tui_launch.core.run.runner import SHARE_STORE_ENV, Runner
    from tui_launch.core.telemetry import Telemetry

    tmp = tmp_path_factory.mktemp("metrics_run")
    token = uuid.uuid4().hex
    out: dict[str, Any] = {"textfile_dir": tmp / "textfile"}
    (tmp / "textfile").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_VAR, token)
        mp.setenv(SHARE_STORE_ENV, "x")
        mp.delenv(SHARE_STORE_ENV)
        mp.setenv("TUILAUNCH_FAKE_NVML", "2")  # GPU families on a CPU machine, marked simulated
        args, opts = parse(
            [
                "--standalone",
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "2",
                "--metrics-port",
                str(free_port()),
                "--metrics-textfile",
                str(tmp / "textfile"),
                "--gpu-interval",
                "0.5",
                STEADY,
                "--seconds",
                "120",
            ]
        )
        store = RunStore()
        telemetry = Telemetry(store.post, interval=opts.gpu_interval, journal_every=0)
        runner = Runner(
            args,
            store,
            RunConfig(echo=False, journal_path=str(tmp / "j.jsonl")),
            telemetry=telemetry,
        )
        exporters = metrics.start_exporters(opts, store)
        assert exporters.server is not None
        url = exporters.server.url
        out["url"] = url
        prom = _Prometheus(tmp, f"127.0.0.1:{opts.metrics_port}") if PROMETHEUS else None
        try:

            def attempt_running(n: int):
                def ready():
                    s = store.snapshot()
                    if s.attempt != n or len(s.ranks) != 2:
                        return None
                    if any(r.state != "running" for r in s.ranks):
                        return None
                    tv = s.telemetry
                    ok = tv is not None and tv.latest.attempt == n and len(tv.latest.ranks) == 2
                    return s if ok and all(r.rss for r in tv.latest.ranks) else None

                return wait_for(ready, 120, what=f"attempt {n} running, with telemetry")

            runner.start()
            attempt_running(0)
            out["before"] = _get(url)[2]
            runner.execute(SignalRank(1, signal.SIGKILL))
            attempt_running(1)
            out["after"] = _get(url)[2]
            if prom is not None:
                wait_for(prom.ready, 60, what="prometheus ready")

                def scraped():
                    restarts = prom.query('tuilaunch_restarts_total{cause="failure"}')
                    if not restarts or restarts[0]["value"][1] != "1":
                        return None
                    up = prom.query("tuilaunch_rank_up == 1")
                    return (restarts, up) if len(up) == 2 else None

                out["prometheus"] = wait_for(scraped, 60, interval=0.5, what="prometheus scrape")
                out["prometheus_exits"] = prom.query("tuilaunch_rank_exits_total")
                out["prometheus_targets"] = _get(f"http://127.0.0.1:{prom.port}/api/v1/targets")[2]
            runner.stop()
            out["exit_code"] = runner.wait(60)
        finally:
            if prom is not None:
                prom.stop()
            if not runner.done:
                runner.stop()
                runner.stop()
                runner.wait(30)
            exporters.close()
            left = wait_gone(token, 10)
        assert left == [], f"workers left behind: {left}"
    out["files"] = sorted((tmp / "textfile").iterdir())
    out["snapshot"] = store.snapshot()
    return out


def test_real_run_endpoint_families_and_labels(real_run):
    s = _samples(real_run["before"])
    node = socket.gethostname()
    run_id = real_run["snapshot"].run.run_id
    (info,) = s["tuilaunch_info"]
    assert info[0]["run_id"] == run_id and info[0]["node"] == node
    assert info[0]["torch"] and info[0]["version"]
    assert _value(s, "tuilaunch_workers", state="running") == 2
    for rank in ("0", "1"):
        assert _value(s, "tuilaunch_rank_up", rank=rank, local_rank=rank) == 1
        # In bytes (a reading in kB or pages would be far below a MiB); a rank sampled before
        # its imports holds about 10 MB, so no more is asked for.
        assert _value(s, "tuilaunch_rank_rss_bytes", rank=rank) > 1 << 20
        assert _value(s, "tuilaunch_rank_cpu_seconds_total", rank=rank) >= 0
        assert _value(s, "tuilaunch_rank_last_output_timestamp_seconds", rank=rank) > 0
    gpus = {lab["gpu"] for lab, _ in s["tuilaunch_gpu_utilization_ratio"]}
    assert gpus == {"0", "1"}
    for _, v in s["tuilaunch_gpu_utilization_ratio"]:
        assert 0 <= v <= 1
    for name, rows in s.items():
        for labels, _ in rows:
            extra = (
                set(labels) - ALLOWED_LABELS - (INFO_LABELS if name.endswith("_info") else set())
            )
            assert not extra, (name, labels)


def test_real_run_kill_moves_restart_and_exit_counters(real_run):
    before, after = _samples(real_run["before"]), _samples(real_run["after"])
    assert _value(before, "tuilaunch_restarts_total", cause="failure") == 0
    assert "tuilaunch_rank_exits_total" not in before
    assert _value(after, "tuilaunch_restarts_total", cause="failure") == 1
    assert _value(after, "tuilaunch_rank_exits_total", rank="1", reason="SIGKILL") == 1
    assert _value(after, "tuilaunch_attempt") == 1
    assert _value(after, "tuilaunch_restart_budget_remaining") == 1


def test_real_run_textfile_final_write(real_run):
    snap = real_run["snapshot"]
    files = real_run["files"]
    assert [f.name for f in files] == [serve.textfile_name(snap.run.run_id, socket.gethostname())]
    s = _samples(files[0].read_text())
    assert _value(s, "tuilaunch_run_finished") == 1
    assert _value(s, "tuilaunch_run_exit_code") == real_run["exit_code"]
    assert _value(s, "tuilaunch_restarts_total", cause="failure") == 1


@pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian's prometheus is not installed (apt install prometheus)"
)
def test_real_prometheus_scrapes_the_run(real_run):
    restarts, up = real_run["prometheus"]
    assert restarts[0]["metric"]["__name__"] == "tuilaunch_restarts_total"
    assert restarts[0]["metric"]["job"] == "tuilaunch"
    assert sorted(r["metric"]["rank"] for r in up) == ["0", "1"]
    assert {r["metric"]["local_rank"] for r in up} == {"0", "1"}
    exits = real_run["prometheus_exits"]
    assert any(
        e["metric"]["rank"] == "1" and e["metric"]["reason"] == "SIGKILL" and e["value"][1] == "1"
        for e in exits
    ), exits
    targets = json.loads(real_run["prometheus_targets"])["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
