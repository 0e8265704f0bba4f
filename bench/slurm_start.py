"""How long the Slurm test fixture takes: daemons up, a first job step, the teardown.

``tests/slurm_cluster.py`` starts munged, slurmctld and two slurmd (one where the host cannot
hold two) in a temporary directory and waits until ``sinfo`` shows every node idle. This runs
that start ``--runs`` times and reports the medians of:

- ``ready``: from starting munged to every node idle in ``sinfo`` (what a test module waits);
- ``srun``: then ``srun -N<nodes> true``, the first job step (allocation, launch on every
  slurmd, completion);
- ``stop``: cancelling what runs and stopping the daemons.

Needs root and Debian's ``slurmctld slurmd slurm-client munge``. Usage::

    nice .venv/bin/python bench/slurm_start.py --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_cluster import ClusterUnavailable, start_cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    ready: list[float] = []
    srun: list[float] = []
    stop: list[float] = []
    nodes = 0
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="tl-slurm-bench-") as tmp:
            try:
                cluster = start_cluster(Path(tmp))
            except ClusterUnavailable as e:
                print(f"no Slurm here: {e}", file=sys.stderr)
                return 1
            try:
                nodes = len(cluster.nodes)
                ready.append(cluster.started_in)
                t0 = time.monotonic()
                out = subprocess.run(
                    ["srun", f"-N{nodes}", "true"], env=cluster.env(), capture_output=True
                )
                srun.append(time.monotonic() - t0)
                if out.returncode != 0:
                    print(out.stderr.decode(errors="replace"), file=sys.stderr)
                    return 1
            finally:
                t0 = time.monotonic()
                cluster.stop()
                stop.append(time.monotonic() - t0)
        print(f"run {i + 1}: ready {ready[-1]:.2f}s  srun {srun[-1]:.2f}s  stop {stop[-1]:.2f}s")
    print(
        f"{nodes} node(s), {args.runs} runs, medians: ready {statistics.median(ready):.2f}s  "
        f"first srun {statistics.median(srun):.2f}s  stop {statistics.median(stop):.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
