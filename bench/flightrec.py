"""Cost of ``--flight-recorder``: step rate, gathering every rank, the bootstrap's start.

Three measurements, each against its baseline in the same run:

- ``steps``: a lockstep gloo loop (``tests/workers/lockstep.py``: every step a busy compute of
  ``--work`` s and one all_reduce) under ``tuilaunch --no-tui`` with and without
  ``--flight-recorder`` (the recorder at 2000 entries, the responder answering the live poll
  every 2 s with records and every thread's stack), alternating A B B A; the steps/s of rank 0.
  Target: at most 1 % slower.
- ``gather``: ``--ranks`` (8) plain gloo processes started through the bootstrap with the
  responder, blocked in an all_reduce that one rank never joins; the wall time of one
  ``gather`` of every rank's records and stacks, median of ``--repeat``. Target: at most 1 s.
- ``start``: the wall time of ``python -c pass``-like start of an empty script, plain
  (``python -u empty.py``) against through the bootstrap with the responder
  (``python -u -m tui_launch.core.workers.shim - empty.py``), median of ``--repeat``.
  Target: at most 50 ms more.
- ``record``: what recording alone costs, with no launcher and no poll: one process, a
  one-rank gloo group, 20,000 ``all_reduce`` calls of 1 kB, microseconds a call with
  ``TORCH_FR_BUFFER_SIZE=2000`` against ``0``, alternating A B B A; then two ranks issuing
  four asynchronous all_reduces and waiting on them, as ``tests/corpus/async_collective.py``
  does each step. A step of N collectives pays N times the difference.

Usage: ``python bench/flightrec.py [steps|gather|start|record|all] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui_launch.core.diagnosis.records import gather  # noqa: E402

PY = sys.executable
LOCKSTEP = str(ROOT / "tests" / "workers" / "lockstep.py")
HANGER = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1024)
for _ in range(int(os.environ.get("FILL", "1"))):
    dist.all_reduce(t)
open(os.environ["READY"] + str(dist.get_rank()), "w").close()
if dist.get_rank() == 1:
    while True:
        time.sleep(0.5)
dist.all_reduce(t)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def steps_once(fr: bool, steps: int, work: float, nproc: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "rate")
        cmd = [PY, "-m", "tui_launch", "--no-tui", "--log-dir", d]
        cmd += ["--flight-recorder"] if fr else []
        cmd += ["--standalone", "--nproc-per-node", str(nproc), LOCKSTEP]
        cmd += ["--steps", str(steps), "--work", str(work), "--report", report]
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        return float(Path(report).read_text())


def bench_steps(repeat: int, steps: int, work: float, nproc: int) -> None:
    on: list[float] = []
    off: list[float] = []
    for i in range(repeat):
        order = (False, True) if i % 2 == 0 else (True, False)
        for fr in order:
            (on if fr else off).append(steps_once(fr, steps, work, nproc))
    ratio = statistics.median(on) / statistics.median(off)
    pairs = statistics.median(a / b for a, b in zip(on, off, strict=True))
    print(f"steps: off {statistics.median(off):.2f} steps/s, on {statistics.median(on):.2f}")
    print(f"steps: on/off {ratio:.4f} (paired {pairs:.4f}); samples off {off} on {on}")


def bench_gather(repeat: int, ranks: int, fill: int = 1) -> None:
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "hang.py")
        Path(script).write_text(HANGER)
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_port()),
            "WORLD_SIZE": str(ranks),
            "TUILAUNCH_RESPONDER_DIR": d,
            "READY": os.path.join(d, "ready"),
            "FILL": str(fill),
            "TORCH_FR_BUFFER_SIZE": "2000",
        }
        procs = [
            subprocess.Popen(
                [PY, "-u", "-m", "tui_launch.core.workers.shim", "-", script],
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for r in range(ranks)
        ]
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if all(os.path.exists(env["READY"] + str(r)) for r in range(ranks)):
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # every rank but 1 is inside its second all_reduce
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                answers = gather(d, range(ranks), "dump", 10.0)
                times.append(time.perf_counter() - t0)
                assert all(a.record.last is not None for a in answers.values()), answers
            print(
                f"gather: {ranks} ranks, {fill} collectives each, records + stacks: "
                f"median {statistics.median(times):.4f} s,"
                f" max {max(times):.4f} s"
            )
        finally:
            for p in procs:
                p.kill()
                p.wait()


def bench_start(repeat: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        empty = os.path.join(d, "empty.py")
        Path(empty).write_text("")
        plain = [PY, "-u", empty]
        boot = [PY, "-u", "-m", "tui_launch.core.workers.shim", "-", empty]
        env = {**os.environ, "TUILAUNCH_RESPONDER_DIR": d, "RANK": "0"}
        a: list[float] = []
        b: list[float] = []
        ca: list[float] = []
        cb: list[float] = []
        for i in range(repeat):
            for which in (0, 1) if i % 2 == 0 else (1, 0):
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run(plain if which == 0 else boot, check=True, env=env)
                (a if which == 0 else b).append(time.perf_counter() - t0)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                (ca if which == 0 else cb).append(cpu)
        pa, pb = statistics.median(a), statistics.median(b)
        qa, qb = statistics.median(ca), statistics.median(cb)
        print(f"start: plain {pa * 1000:.1f} ms, bootstrap + responder {pb * 1000:.1f} ms wall")
        print(f"start: the bootstrap adds {(pb - pa) * 1000:.1f} ms wall")
        print(
            f"start: CPU plain {qa * 1000:.1f} ms, bootstrap {qb * 1000:.1f} ms "
            f"(+{(qb - qa) * 1000:.1f} ms)"
        )


_RECORD = """
import sys, time, torch, torch.distributed as dist
rank, world, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=rank, world_size=world)
t = torch.ones(256)
ts = [torch.ones(k) for k in (2048, 64, 64, 1)]  # a step's gradients, as async_collective.py's

def once():
    if world == 1:
        dist.all_reduce(t)
        return 1
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    for w in works:
        w.wait()
    return len(works)

for _ in range(n // 10):
    once()
dist.barrier()
t0, done = time.perf_counter(), 0
while done < n:
    done += once()
print((time.perf_counter() - t0) / done * 1e6, flush=True)
dist.destroy_process_group()  # without it, gloo's teardown sometimes aborts the process
"""


def bench_record(repeat: int, world: int = 1) -> None:
    """One rank's synchronous all_reduce (``world`` 1), or with ``world`` ranks four
    asynchronous ones waited on together (async_collective.py's step); µs a collective."""
    runs: dict[str, list[float]] = {"0": [], "2000": []}
    n = 20000 if world == 1 else 12000
    for i in range(repeat):
        for size in ("0", "2000") if i % 2 == 0 else ("2000", "0"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size}
            procs = [
                subprocess.Popen(
                    [PY, "-c", _RECORD % port, str(r), str(world), str(n)],
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for r in range(world)
            ]
            outs = [p.communicate(timeout=600)[0] for p in procs]
            runs[size].append(float(outs[0].split()[0]))
    off, on = statistics.median(runs["0"]), statistics.median(runs["2000"])
    what = "all_reduce" if world == 1 else f"async all_reduce, {world} ranks"
    print(
        f"record: {what} {off:.1f} us off, {on:.1f} us with the recorder: +{on - off:.1f} us"
        f" (medians of {repeat}; samples off {[round(x, 1) for x in runs['0']]},"
        f" on {[round(x, 1) for x in runs['2000']]})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument(
        "what", nargs="?", default="all", choices=("steps", "gather", "start", "record", "all")
    )
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--work", type=float, default=0.02)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument(
        "--fill", type=int, default=1, help="collectives before the hang (2000: a full ring)"
    )
    args = p.parse_args()
    if args.what in ("start", "all"):
        bench_start(args.repeat * 4)
    if args.what in ("gather", "all"):
        bench_gather(args.repeat * 4, args.ranks, args.fill)
    if args.what in ("record", "all"):
        bench_record(args.repeat * 2)
        bench_record(args.repeat * 2, world=2)
    if args.what in ("steps", "all"):
        bench_steps(args.repeat, args.steps, args.work, args.nproc)


if __name__ == "__main__":
    main()
