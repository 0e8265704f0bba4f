"""Benchmark: what ``--metrics-port`` and ``--metrics-textfile`` cost the launcher.

The store is filled with the events of a busy node: ``--ranks`` ranks (default 8) on as many
GPUs, 600 telemetry samples (10 minutes at 1 s), two failure restarts with their exits, and each
rank's ``stdout.log``/``stderr.log`` on disk (a scrape stats them for the last-output time).
Then, on this thread:

``scrape``   — CPU time (``time.thread_time``) of what the HTTP handler does per ``GET /metrics``:
               ``generate_latest(registry)`` over the collector (snapshot, families, text).
               Socket I/O excluded; the bytes served are reported.
``http``     — the same through the real server on loopback, timed by the process's CPU time
               (``time.process_time``: the client's urllib too, so an upper bound), and wall.
``textfile`` — one :class:`~tui_launch.metrics.TextfileWriter` tick: generate, write a temp
               file, fsync, chmod, rename. CPU ms, and wall ms (the fsync waits for the disk).

Each reports median, p90 and max over ``--repeat`` runs (after 20 warm-up runs). Compare with
the telemetry budget (bench/telemetry.py: a tick's median ≤ 5 ms per second of run): a scrape
every 15 s, a textfile write every 10 s.

Usage::

    .venv/bin/python bench/metrics.py [--ranks 8] [--repeat 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.exposition import generate_latest  # noqa: E402

from tui_launch import metrics  # noqa: E402
from tui_launch.core.launch.args import Options  # noqa: E402
from tui_launch.core.model import events as ev  # noqa: E402
from tui_launch.core.model import layout  # noqa: E402
from tui_launch.core.model.store import RunStore  # noqa: E402


def fill(store: RunStore, n: int, log_root: Path) -> None:
    """A node of ``n`` ranks after two failure restarts and 10 minutes of telemetry."""
    store.post(
        ev.RunStarted(
            entrypoint="train.py",
            args=(),
            role="default",
            nproc_per_node=n,
            min_nodes=1,
            max_nodes=1,
            max_restarts=3,
            backend="c10d",
            endpoint="localhost:29400",
            run_id="bench",
            host="bench-node",
            launcher_pid=1,
            torch_version="2.13.0",
        )
    )
    for attempt in range(3):
        log_dir = log_root / layout.attempt_name(attempt)
        for lr in range(n):
            (log_dir / str(lr)).mkdir(parents=True)
            for stream in layout.STREAMS:
                Path(layout.rank_log_in(str(log_dir), lr, stream)).write_text("step\n")
        workers = tuple(
            ev.WorkerInfo(local_rank=i, global_rank=i, role_rank=i, world_size=n, pid=1000 + i)
            for i in range(n)
        )
        store.post(ev.WorkersStarted(attempt=attempt, workers=workers, log_dir=str(log_dir)))
        for _ in range(200):
            store.post(sample(attempt, n))
        if attempt < 2:
            for lr in range(n):
                store.post(
                    ev.RankExited(
                        attempt=attempt,
                        local_rank=lr,
                        global_rank=lr,
                        pid=1000 + lr,
                        exit_code=-9 if lr == 1 else -15,
                        signal=None,
                        by_agent=lr != 1,
                    )
                )
            store.post(
                ev.Restart(
                    cause="failure",
                    from_attempt=attempt,
                    to_attempt=attempt + 1,
                    restarts_used=attempt + 1,
                    budget_left=2 - attempt,
                )
            )


def sample(attempt: int, n: int) -> ev.TelemetrySample:
    gpus = tuple(
        ev.GpuReading(
            index=i,
            name="Bench GPU",
            uuid=f"GPU-{i:08d}",
            util=87,
            mem_used=60 << 30,
            mem_total=80 << 30,
            temp=71,
            power=612.5,
        )
        for i in range(n)
    )
    ranks = tuple(
        ev.RankReading(
            local_rank=i,
            global_rank=i,
            pid=1000 + i,
            cpu=101.0,
            rss=12 << 30,
            threads=40,
            status="running",
            gpus=(i,),
            mapping="pid",
            gpu_mem=58 << 30,
            gpu_util=87,
        )
        for i in range(n)
    )
    return ev.TelemetrySample(
        attempt=attempt, gpu_state="ok", gpu_note="", gpus=gpus, ranks=ranks, simulated=True
    )


def measure(fn: Callable[[], object], repeat: int, clock: Callable[[], float]) -> list[float]:
    """Milliseconds of ``clock`` per call, after 20 warm-up calls."""
    for _ in range(20):
        fn()
    out = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        out.append((clock() - t0) * 1000)
    return out


def report(name: str, ms: list[float], extra: str = "") -> None:
    ms = sorted(ms)
    p90 = ms[int(len(ms) * 0.9) - 1]
    print(
        f"{name:<22} median {statistics.median(ms):7.3f} ms  p90 {p90:7.3f} ms  "
        f"max {ms[-1]:7.3f} ms  {extra}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=500)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore()
        fill(store, a.ranks, Path(tmp) / "logs")
        textdir = Path(tmp) / "textfile"
        textdir.mkdir()
        opts = Options(no_tui=True, journal=None, metrics_port=0, metrics_textfile=str(textdir))
        exporters = metrics.start_exporters(opts, store, metrics.RunInfo(node="bench-node"))
        assert exporters.collector is not None and exporters.server is not None
        assert exporters.textfile is not None
        exporters.textfile._loop.interval = 3600.0  # this bench calls its tick itself
        registry = exporters.collector.registry()
        body = generate_latest(registry)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        print(
            f"{a.ranks} ranks, {a.ranks} GPUs, {store.snapshot().events} events; "
            f"{series} series, {len(body)} bytes per scrape; {a.repeat} runs each"
        )
        report(
            "scrape (CPU)",
            measure(lambda: generate_latest(registry), a.repeat, time.thread_time),
        )
        url = exporters.server.url

        def get() -> bytes:
            with urllib.request.urlopen(url, timeout=10) as r:
                return bytes(r.read())

        report("http GET (CPU, both)", measure(get, a.repeat, time.process_time))
        report("http GET (wall)", measure(get, a.repeat, time.perf_counter))
        tick = exporters.textfile._tick
        report("textfile (CPU)", measure(tick, a.repeat, time.thread_time))
        report("textfile (wall)", measure(tick, a.repeat, time.perf_counter), "fsync included")
        exporters.close()
        print(f"files left in the textfile dir: {sorted(os.listdir(textdir))}")


if __name__ == "__main__":
    main()
