"""What ``--warm-start``'s spare costs while a job trains: its memory and CPU.

Runs ``tuilaunch --no-tui --warm-start`` on ``workloads/steady.py`` (a light all_reduce loop)
for each ``--nproc`` and, while it trains, looks at the spare the workers were forked from:
the process of the launch that runs ``tui_launch.core.workers.spare`` and is not a worker (the
journal's ``workers_started`` pids; forked workers show the spare's command line). For it:
RSS (``VmRSS``), PSS and private memory (``smaps_rollup``: pages it shares with the workers it
forked count once between them), the CPU it used to get ready (its imports, ``utime + stime``
once it stops growing) and the CPU it used while waiting afterwards (over ``--window``
seconds). The workers' CPU over the same window and their RSS / PSS are shown beside it.

Usage::

    .venv/bin/python bench/warm.py --nproc 1,2,4 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tui_launch.core.model import layout
from tui_launch.testing.procs import cpu_s, env_holders, rss_mb

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TOKEN_VAR = "TUILAUNCH_BENCH_TOKEN"


def token_pids(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (workers inherit it)."""
    return env_holders(TOKEN_VAR, token)


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return fp.read()
    except OSError:
        return b""


def smaps_mb(pid: int) -> dict[str, float]:
    """``Pss`` and private (``Private_Clean + Private_Dirty``) memory, MB."""
    out = {"pss": 0.0, "private": 0.0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fp:
            for line in fp:
                name, _, rest = line.partition(":")
                if name == "Pss":
                    out["pss"] = int(rest.split()[0]) / 1024
                elif name in ("Private_Clean", "Private_Dirty"):
                    out["private"] += int(rest.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return {k: round(v, 1) for k, v in out.items()}


def worker_pids(journal: Path) -> set[int]:
    pids: set[int] = set()
    try:
        text = journal.read_text()
    except OSError:
        return pids
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("kind") == "workers_started":
            pids |= {w["pid"] for w in e["workers"]}
    return pids


def measure(nproc: int, seconds: float, window: float) -> dict[str, object]:
    token = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix="tlwarm_"))
    journal = tmp / layout.JOURNAL_NAME
    env = dict(os.environ, **{TOKEN_VAR: token, "PYTHONPATH": str(ROOT)})
    cmd = [
        sys.executable, "-m", "tui_launch", "--no-tui", "--warm-start", "--journal", str(journal),
        "--standalone", "--nproc-per-node", str(nproc), "--log-dir", str(tmp / "logs"),
        str(BENCH / "workloads" / "steady.py"), str(tmp), str(seconds),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    result: dict[str, object] = {"nproc": nproc}
    try:
        deadline = time.monotonic() + seconds
        spares: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            workers = worker_pids(journal)
            spares = [
                p
                for p in token_pids(token)
                if b"core.workers.spare" in cmdline(p) and p not in workers
            ]
            if workers and spares:
                break
            time.sleep(0.2)
        # Ready: its CPU stops growing (imports done).
        last: dict[int, float] = {}
        while time.monotonic() < deadline:
            now = {p: c for p in spares if (c := cpu_s(p)) is not None}
            if now and now == last:
                break
            last = now
            time.sleep(0.5)
        ready_cpu = dict(last)
        workers = sorted(worker_pids(journal))
        w0 = {p: cpu_s(p) or 0.0 for p in workers}
        time.sleep(window)
        idle_cpu = {p: (cpu_s(p) or 0.0) - ready_cpu.get(p, 0.0) for p in spares}
        w1 = {p: cpu_s(p) or 0.0 for p in workers}
        result.update(
            spares=len(spares),
            rss_mb_each=[round(rss_mb(p) or 0.0, 1) for p in spares],
            spare_smaps_mb=[smaps_mb(p) for p in spares],
            worker_smaps_mb=[smaps_mb(p) for p in workers],
            ready_cpu_s_each=[round(c, 2) for c in ready_cpu.values()],
            idle_cpu_s_each=[round(c, 3) for c in idle_cpu.values()],
            window_s=window,
            workers_cpu_s_in_window=round(sum(w1[p] - w0[p] for p in workers), 3),
            worker_rss_mb_each=[round(rss_mb(p) or 0.0, 1) for p in workers],
        )
    finally:
        proc.wait(timeout=seconds + 120)
        result["exit_code"] = proc.returncode
        result["leftovers"] = len(token_pids(token))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the job trains")
    parser.add_argument("--window", type=float, default=5.0, help="idle window, seconds")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    rows = [measure(int(n), args.seconds, args.window) for n in args.nproc.split(",")]
    print(
        "| nproc | spares | spare RSS / PSS / private MB | CPU s to get ready, per spare "
        "| CPU s while waiting (window) | workers' CPU s (same window) "
        "| worker RSS MB | worker PSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        rss = r["rss_mb_each"]
        ready = r["ready_cpu_s_each"]
        assert isinstance(rss, list) and isinstance(ready, list)
        print(
            f"| {r['nproc']} | {r['spares']} | {statistics.median(rss) if rss else 'n/a'} / "
            f"{' '.join(str(m['pss']) + ' / ' + str(m['private']) for m in r['spare_smaps_mb'])} "  # type: ignore[attr-defined]
            f"| {round(statistics.median(ready), 2) if ready else 'n/a'} "
            f"| {sum(r['idle_cpu_s_each']) if r['idle_cpu_s_each'] else 0:.3f} "  # type: ignore[arg-type]
            f"({r['window_s']} s) | {r['workers_cpu_s_in_window']} "
            f"| {r['worker_rss_mb_each']} "
            f"| {[m['pss'] for m in r['worker_smaps_mb']]} |"  # type: ignore[attr-defined]
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
