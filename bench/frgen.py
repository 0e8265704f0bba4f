"""``tuilaunch why``'s time on real and synthetic Flight Recorder dump sets.

Each row is the wall and the CPU time (user + system: on a loaded machine, what the wall time
would be on a quiet one, the command being one thread) of the whole command
(``python -m tui_launch why DIR --json``: the interpreter's start, the imports, reading every
dump, the verdict, the JSON), median of ``--repeat``, and whether it named exactly the ranks
that were made to fail:

- ``nvrx/<set>``: NVIDIA's four real 16-rank sets (``tests/fixtures/frdumps/nvrx``). Target:
  at most 2 s each on 2 cores.
- ``synthetic <world> x<N> <fault>``: a Megatron-style job (tp 8, pp 4, ep 8; the default
  group lists every rank in every dump, as torch writes it) written by
  :mod:`tui_launch.testing.frgen`, with 1 and 2 culprits that hang, or stall. Target: at most
  10 s at 4,096 ranks.

``--entries N`` keeps N completed entries per group before the outstanding ones (a full ring,
as a dump without torch's only-active option holds); ``--quick`` runs 512 ranks and one
repeat. The load (``/proc/loadavg``) is printed beside the table: compare rows of one run.

Usage: ``python bench/frgen.py [--world 4096] [--entries 0] [--repeat 3] [--quick]``;
``python bench/frgen.py write DIR --world N --culprits 5,9 [--fault stall]`` only writes a set.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tui_launch.testing import frgen  # noqa: E402

PY = sys.executable
NVRX = ROOT / "tests" / "fixtures" / "frdumps" / "nvrx"


def _injected(directory: Path) -> set[int]:
    first = (directory / "fault_injection.log").read_text().splitlines()[0]
    return set(json.loads(first.split(": ", 1)[1]))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time_why(directory: str, repeat: int) -> tuple[float, float, list[int], str]:
    """Median wall and CPU seconds of the command (the CPU time is what a quiet machine's
    wall time would be: the command is one thread), the ranks named, the verdict."""
    walls, cpus = [], []
    doc: dict = {}
    for _ in range(repeat):
        c0, t0 = _cpu(), time.perf_counter()
        out = subprocess.run(
            [PY, "-m", "tui_launch", "why", directory, "--json"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
        if out.returncode != 0:
            raise SystemExit(f"why failed on {directory}: {out.stderr.strip()}")
        doc = json.loads(out.stdout)
    named = [c["rank"] for c in doc["culprits"]]
    return statistics.median(walls), statistics.median(cpus), named, doc["verdict"]


def _row(
    name: str, wall: float, cpu: float, named: list[int], want: set[int], verdict: str
) -> None:
    ok = "yes" if set(named) == want else "NO"
    line = f"| {name} | {wall:.2f} | {cpu:.2f} | {','.join(map(str, named)) or '-'} | {ok} |"
    print(line, flush=True)
    print(f"|   | | | {verdict[:100]}{'...' if len(verdict) > 100 else ''} | |", flush=True)


def main() -> None:
    """Run the table (or ``write`` one set)."""
    if len(sys.argv) > 1 and sys.argv[1] == "write":
        p = argparse.ArgumentParser(prog="frgen.py write")
        p.add_argument("directory")
        p.add_argument("--world", type=int, default=4096)
        p.add_argument("--culprits", default="")
        p.add_argument("--fault", choices=("hang", "stall"), default="hang")
        p.add_argument("--entries", type=int, default=0)
        a = p.parse_args(sys.argv[2:])
        culprits = [int(x) for x in a.culprits.split(",") if x]
        frgen.generate(a.directory, a.world, culprits, a.fault, completed_kept=a.entries)
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4096)
    p.add_argument("--entries", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.world, a.repeat = 512, 1
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load before: {' '.join(load)}; repeat {a.repeat}; entries kept {a.entries}\n")
    print("| set | wall s | CPU s | named | = injected |")
    print("|---|---|---|---|---|")
    for d in sorted(NVRX.iterdir()):
        if d.is_dir():
            wall, cpu, named, verdict = _time_why(str(d), a.repeat)
            _row(f"nvrx/{d.name}", wall, cpu, named, _injected(d), verdict)
    a1, a2 = a.world // 3 + 1, (2 * a.world) // 3 + 5
    for culprits, fault in (((a1,), "hang"), ((a1, a2), "hang"), ((a1, a2), "stall")):
        tmp = tempfile.mkdtemp(prefix="frgen-")
        try:
            frgen.generate(tmp, a.world, culprits, fault, completed_kept=a.entries)
            size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 1e6
            wall, cpu, named, verdict = _time_why(tmp, a.repeat)
            name = f"synthetic {a.world} x{len(culprits)} {fault} ({size:.0f} MB)"
            _row(name, wall, cpu, named, set(culprits), verdict)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nload after: {' '.join(load)}")


if __name__ == "__main__":
    main()
