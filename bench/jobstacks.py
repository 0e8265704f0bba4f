"""The steady cost of job-wide stack dumps: the cluster loop's tick with and without the rider.

Every node's cluster loop (``tuilaunch-cluster``) publishes its status into the job's store
each interval; with more than one node it also carries :class:`~tui_launch.core.job.jobstacks.
JobDumps`, which reads the request counter once per tick (one more round trip) and does nothing
else until a dump is asked for. This runs the real :class:`~tui_launch.core.job.view.ClusterView`
against a real ``TCPStore`` on loopback (hosted by this process), ``--ticks`` ticks without the
rider and as many with it, and reports the thread CPU and wall time per tick of each. At the
default 2 s interval, a tick's CPU over 2 s is the loop's share of a core.

Usage::

    .venv/bin/python bench/jobstacks.py --ticks 500
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import timedelta

from torch.distributed import TCPStore

from tui_launch.core.diagnosis.dumps import Dumper
from tui_launch.core.job.jobstacks import JobDumps
from tui_launch.core.job.view import ClusterView, TCPStoreKV
from tui_launch.core.model.store import RunStore
from tui_launch.core.workers.table import RankTable


def measure(port: int, ticks: int, rider: bool, tmp: str) -> tuple[float, float]:
    """(CPU ms, wall ms) per tick of one ClusterView, with or without the job-dump rider."""
    store = RunStore()
    view = ClusterView(
        post=store.post,
        snapshot=store.snapshot,
        host="bench",
        handler=None,
        endpoint=lambda h: f"127.0.0.1:{port}",
        run_id=f"bench-{rider}",
        interval=0.0,  # every tick reads every record too (the worst case)
        connector=lambda h, ep: TCPStoreKV("127.0.0.1", port),
    )
    if rider:
        dumper = Dumper(store.post, RankTable(), lambda: tmp, dict)
        jobs = JobDumps(store.post, dumper, view.node, "bench", store.snapshot, view.wake)
        view.rider = jobs.tick
    view.tick()  # connect and register outside the measurement
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(ticks):
        view.tick()
    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    return 1000 * cpu / ticks, 1000 * wall / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=500)
    ns = parser.parse_args()
    server = TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )
    with tempfile.TemporaryDirectory() as tmp:
        plain = measure(server.port, ns.ticks, False, tmp)
        ridden = measure(server.port, ns.ticks, True, tmp)
    print(f"ticks: {ns.ticks} each, one node, TCPStore on loopback")
    print(f"without the rider: {plain[0]:.3f} ms CPU, {plain[1]:.3f} ms wall per tick")
    print(f"with the rider:    {ridden[0]:.3f} ms CPU, {ridden[1]:.3f} ms wall per tick")
    extra = ridden[0] - plain[0]
    print(f"extra: {extra:.3f} ms CPU per tick = {100 * extra / 2000:.4f} % of a core at 2 s")


if __name__ == "__main__":
    main()
