"""Rendezvous time with 1, 2 and 4 agents on localhost: tuilaunch against torchrun, same run.

For each agent count N, N launchers of one kind are started at once as N "nodes" of one c10d
rendezvous (``--nnodes N --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:PORT``), headless (``--no-tui`` for tuilaunch). Every worker writes ``time.time()``
to ``up_<rank>`` once past ``init_process_group`` and one ``all_reduce``
(``workloads/up.py``), then leaves. Two figures per launch, from the moment the agents were
started: **ready** = max(up_*) (the rendezvous plus the workers' start: what a user waits
for), and **wall** = until the last agent exited. tuilaunch and torchrun alternate (A, B, A,
B); each figure is a median of ``--repeat`` launches; the ratio is tuilaunch/torchrun.
Both run with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (what tuilaunch sets by default).

    .venv/bin/python bench/rendezvous.py --repeat 3 [--agents 1,2,4]

Scale-up and scale-down recovery are timed by ``bench/elastic.py``, which reuses
:func:`c10d_command`. Markdown on stdout; every sample in ``bench/results/rendezvous-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from run import free_port, median

ROOT = Path(__file__).resolve().parent.parent
UP = ROOT / "bench" / "workloads" / "up.py"
LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run"],
    "tuilaunch": ["-m", "tui_launch", "--no-tui"],
}


def c10d_command(
    python: str,
    module_args: Sequence[str],
    nnodes: str,
    nproc: int,
    port: int,
    run_id: str,
    script: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """One agent of a c10d job on ``127.0.0.1:port``; the same flags for either launcher."""
    return [
        python,
        *module_args,
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        *extra,
        *script,
    ]


def run_once(python: str, launcher: str, agents: int, timeout: float) -> dict[str, float | None]:
    """Start ``agents`` launchers as one job; return ready and wall seconds (None: failed)."""
    port, run_id = free_port(), f"bench{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="tl-rdzv-") as tmp:
        env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}
        cmd = c10d_command(
            python, LAUNCHERS[launcher], str(agents), 1, port, run_id, [str(UP), tmp]
        )
        t0 = time.time()
        procs = [
            subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for _ in range(agents)
        ]
        ok = True
        try:
            for p in procs:
                left = max(1.0, timeout - (time.time() - t0))
                ok = p.wait(left) == 0 and ok
        except subprocess.TimeoutExpired:
            ok = False
        wall = time.time() - t0
        for p in procs:  # whatever is left of a failed launch
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        ups = [float(f.read_text()) for f in Path(tmp).glob("up_*")]
        ready = max(ups) - t0 if ok and len(ups) == agents else None
        return {"ready": ready, "wall": wall if ok else None}


def med(xs: list[float | None]) -> float | None:
    """Median of the successful samples."""
    return median([x for x in xs if x is not None])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--agents", default="1,2,4")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--python", default=sys.executable)
    ns = ap.parse_args(argv)
    counts = [int(x) for x in ns.agents.split(",")]
    samples: dict[str, dict[int, list[dict[str, float | None]]]] = {
        name: {n: [] for n in counts} for name in LAUNCHERS
    }
    for r in range(ns.repeat):
        for n in counts:
            for name in LAUNCHERS if r % 2 == 0 else reversed(list(LAUNCHERS)):
                s = run_once(ns.python, name, n, ns.timeout)
                samples[name][n].append(s)
                print(f"round {r} {name} x{n}: {s}", file=sys.stderr)
    print(
        "| agents | torchrun ready s | tuilaunch ready s | ratio | torchrun wall s "
        "| tuilaunch wall s | ratio | failed (torchrun/tuilaunch) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in counts:
        row = [str(n)]
        for key in ("ready", "wall"):
            a = med([s[key] for s in samples["torchrun"][n]])
            b = med([s[key] for s in samples["tuilaunch"][n]])
            ratio = f"{b / a:.2f}" if a and b else "-"
            row += [f"{a:.2f}" if a else "-", f"{b:.2f}" if b else "-", ratio]
        fails = [sum(s["wall"] is None for s in samples[k][n]) for k in LAUNCHERS]
        row.append(f"{fails[0]}/{fails[1]}")
        print("| " + " | ".join(row) + " |")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rendezvous-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"samples": samples}, indent=1))
    print(f"\nsamples: {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
