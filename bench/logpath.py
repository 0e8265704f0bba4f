"""Benchmark the log path, headless, against torchrun, in all three console modes.

4 ranks x 2,000,000 lines of 100 bytes (``workloads/flood.py``: a barrier, then every rank writes
its lines flat out through ``sys.stdout.write``), under::

    python -m torch.distributed.run --standalone --nproc-per-node 4 MODE --log-dir D flood.py
    python -m tui_launch --no-tui  --standalone --nproc-per-node 4 MODE --log-dir D flood.py

with MODE one of: nothing (the default: the workers' output goes to the launcher's console),
``--redirects 3`` (to files only) and ``--tee 3`` (files, and the console through torch's tail
threads, or tuilaunch's tailer). The launcher's stdout and stderr are ``/dev/null``
(``--console devnull``, the issue's set-up) or a regular file (``--console file``: every byte
the console gets is really written, so a copy made in Python shows).

Per launch: wall time from ``Popen`` to exit (the figure compared), the workers' wall
(max(end) - min(start) from flood.py's marks), the CPU of the whole launch (launcher and
workers, ``RUSAGE_CHILDREN``) and what other processes used meanwhile. For tuilaunch it also
checks that every rank's ``stdout.log`` holds all its bytes (``files_ok``). The launchers
alternate (torchrun, tuilaunch; ``--abba`` flips every other round) within each mode, modes in
turn, so that both see the same machine. Targets (tuilaunch / torchrun wall): default <= 1.1,
redirects <= 1.05, tee <= 0.33.

The launcher's own CPU during the flood (``launcher_flood_cpu_s``: its ``/proc/PID/stat``
utime + stime, read every 0.1 s, between the first worker's start mark and the last one's end
mark) is what the launcher takes from the workers on a machine with fewer cores than ranks.
``--profile DIR`` also records tuilaunch's launcher with ``py-spy record --nonblocking``
(collapsed stacks, ``DIR/<mode>-<round>.txt``): where that CPU goes.

Usage::

    .venv/bin/python bench/logpath.py --repeat 3 [--lines 2000000] [--console devnull|file]

Markdown on stdout, progress on stderr, every sample in ``bench/results/logpath-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import (
    RESULTS,
    WORKLOADS,
    base_env,
    busy_cpu_s,
    children_cpu_s,
    code_info,
    kill_token,
    median,
    settle,
    snapshot_code,
)

from tui_launch.core.model import layout

MODES: dict[str, tuple[str, ...]] = {
    "default": (),
    "redirects": ("--redirects", "3"),
    "tee": ("--tee", "3"),
}
TARGETS = {"default": 1.1, "redirects": 1.05, "tee": 0.33}
LAUNCHERS = {
    "torchrun": ("-m", "torch.distributed.run"),
    "tuilaunch": ("-m", "tui_launch", "--no-tui"),
}


def _proc_cpu(pid: int) -> float | None:
    """utime + stime of one process (not its children), in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            fields = fp.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuTrace:
    """(wall time, CPU s) of one process every ``every`` seconds, on a thread, until it ends."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid, self.every = pid, every
        self.points: list[tuple[float, float]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            cpu = _proc_cpu(self.pid)
            if cpu is None:
                return
            self.points.append((time.time(), cpu))
            time.sleep(self.every)

    def join(self) -> None:
        self._thread.join(timeout=5)

    def at(self, t: float) -> float | None:
        """The CPU seconds at wall time ``t`` (the nearest sample at or before it)."""
        before = [cpu for when, cpu in self.points if when <= t]
        return before[-1] if before else None

    def between(self, t0: float, t1: float) -> float | None:
        a, b = self.at(t0), self.at(t1)
        return None if a is None or b is None else b - a


def one(launcher: str, mode: str, opts: argparse.Namespace, pythonpath: str | None) -> dict:
    """One launch of the flood; its wall, workers' wall, CPU and whether the files are whole."""
    token = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix="tlbench_logpath_"))
    marks = tmp / "marks"
    marks.mkdir()
    cmd = [
        opts.python,
        *LAUNCHERS[launcher],
        "--standalone",
        "--nproc-per-node",
        str(opts.nproc),
        *MODES[mode],
        "--log-dir",
        str(tmp / "logs"),
        str(WORKLOADS / "flood.py"),
        str(marks),
        str(opts.lines),
    ]
    env = base_env(token, {}, pythonpath)
    sample: dict[str, Any] = {"launcher": launcher, "mode": mode}
    console = os.devnull if opts.console == "devnull" else str(tmp / "console.txt")
    try:
        with open(console, "wb") as out:
            busy0, cpu0 = busy_cpu_s(), children_cpu_s()
            launched = time.time()
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                cmd,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
            trace = CpuTrace(proc.pid)
            spy = None
            if opts.profile and launcher == "tuilaunch":
                Path(opts.profile).mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    ["py-spy", "record", "--nonblocking", "--pid", str(proc.pid), "--rate",
                     "100", "--format", "raw", "--threads", "-o",
                     str(Path(opts.profile) / f"{mode}-{opts.round}.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            try:
                rc: int | None = proc.wait(timeout=opts.timeout)
            except subprocess.TimeoutExpired:
                rc = None
                kill_token(token)
                proc.kill()
                proc.wait()
            wall = time.perf_counter() - t0
            exited = time.time()
            cpu = children_cpu_s() - cpu0
            trace.join()
            if spy is not None:
                spy.wait(timeout=30)
            foreign = max(0.0, busy_cpu_s() - busy0 - cpu)
        starts = [float((marks / f"start_{r}").read_text()) for r in range(opts.nproc)]
        ends = [float((marks / f"end_{r}").read_text()) for r in range(opts.nproc)]
        cpus = [(marks / f"cpu_{r}").read_text().split() for r in range(opts.nproc)]
        sample.update(
            ok=rc == 0,
            exit_code=rc,
            wall_s=wall,
            workers_wall_s=max(ends) - min(starts),
            head_s=min(starts) - launched,  # launch to the first line (start-up, rendezvous)
            tail_s=exited - max(ends),  # the last line to the launcher's exit
            launcher_flood_cpu_s=trace.between(min(starts), max(ends)),
            cpu_s=cpu,
            # What the ranks' own loops took (user, system), summed over the ranks: the
            # system seconds are the cost of their write(2)s (file or /dev/null).
            workers_user_s=sum(float(u) for u, _ in cpus),
            workers_sys_s=sum(float(s) for _, s in cpus),
            foreign_load=foreign / (wall * (os.cpu_count() or 1)),
            leftover_processes=settle(token, grace=5.0),
        )
        if opts.console == "file":
            sample["console_bytes"] = os.path.getsize(console)
        if launcher == "tuilaunch" or mode != "default":
            sizes = sorted(
                p.stat().st_size for p in (tmp / "logs").rglob(layout.log_name(layout.STDOUT))
            )
            sample["files_ok"] = sizes == [opts.lines * 100] * opts.nproc
    except (OSError, ValueError) as e:
        sample.update(ok=False, error=str(e), wall_s=None)
    finally:
        kill_token(token)
        shutil.rmtree(tmp, ignore_errors=True)
    return sample


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The log path: tuilaunch vs torchrun, headless.")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--lines", type=int, default=2_000_000)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--modes", default="default,redirects,tee")
    p.add_argument("--console", choices=("devnull", "file"), default="devnull")
    p.add_argument("--abba", action="store_true")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--code", default="worktree", metavar="worktree|installed|REV")
    p.add_argument("--results-dir", default=str(RESULTS))
    p.add_argument("--profile", default=None, metavar="DIR")
    opts = p.parse_args(argv)
    modes = [m for m in opts.modes.split(",") if m]
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="tlbench_code_"))
    samples: list[dict] = []
    try:
        pythonpath = snapshot_code(opts.code, work, opts.python)
        for r in range(-opts.warmup, opts.repeat):
            for mode in modes:
                order = ["torchrun", "tuilaunch"]
                if opts.abba and r % 2:
                    order.reverse()
                for launcher in order:
                    opts.round = r
                    s = one(launcher, mode, opts, pythonpath)
                    s["round"] = r
                    samples.append(s)
                    print(
                        f"[logpath {r + 1}/{opts.repeat}] {mode:<9} {launcher:<9} "
                        f"wall {s['wall_s'] or 0:.2f}s (head {s.get('head_s', 0):.2f}s, tail "
                        f"{s.get('tail_s', 0):.2f}s) workers {s.get('workers_wall_s', 0):.2f}s "
                        f"cpu {s.get('cpu_s', 0):.2f}s (ranks user {s.get('workers_user_s', 0):.2f}"
                        f" sys {s.get('workers_sys_s', 0):.2f}) launcher-in-flood "
                        f"{s.get('launcher_flood_cpu_s') or 0:.2f}s ok={s['ok']} "
                        f"files={s.get('files_ok')} "
                        f"others {s.get('foreign_load', 0):.0%}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for mode in modes:
        row: dict[str, Any] = {"mode": mode}
        for name in LAUNCHERS:
            mine = [s for s in samples if s["round"] >= 0 and s["mode"] == mode]
            mine = [s for s in mine if s["launcher"] == name and s["ok"]]
            for key in (
                "wall_s",
                "workers_wall_s",
                "cpu_s",
                "launcher_flood_cpu_s",
                "head_s",
                "tail_s",
                "workers_user_s",
                "workers_sys_s",
            ):
                row[f"{name}_{key}"] = median([s[key] for s in mine if s.get(key) is not None])
            row[f"{name}_files_ok"] = all(s.get("files_ok", True) for s in mine)
        t, u = row["torchrun_wall_s"], row["tuilaunch_wall_s"]
        row["ratio"] = u / t if t and u else None
        by_round = {
            s["round"]: s["wall_s"]
            for s in samples
            if s["mode"] == mode and s["launcher"] == "torchrun" and s["ok"] and s["round"] >= 0
        }
        pairs = [
            s["wall_s"] / by_round[s["round"]]
            for s in samples
            if s["mode"] == mode and s["launcher"] == "tuilaunch" and s["ok"]
            if s["round"] in by_round
        ]
        row["paired_ratio"] = median(pairs)
        rows.append(row)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    out = Path(opts.results_dir) / f"logpath-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "code": code_info(opts.code),
                "opts": vars(opts),
                "rows": rows,
                "samples": samples,
            },
            indent=1,
        )
        + "\n"
    )
    others = median([s["foreign_load"] for s in samples if s.get("foreign_load") is not None])
    print(
        f"### log path: {opts.nproc} ranks x {opts.lines:,} lines of 100 bytes, console "
        f"{opts.console}, {opts.repeat} rounds (others used {others or 0:.0%} of the CPUs)\n"
    )
    print(
        "| console mode | torchrun wall | tuilaunch wall | ratio | paired | goal | "
        "workers' wall (torchrun / tuilaunch) | CPU s (torchrun / tuilaunch) | "
        "launcher CPU s in the flood (torchrun / tuilaunch) | start-up to first line, s "
        "(torchrun / tuilaunch) | last line to exit, s (torchrun / tuilaunch) | "
        "ranks' loop CPU s, user + sys (torchrun / tuilaunch) | files whole |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        m = row["mode"]

        def f(x: float | None, spec: str = ".2f") -> str:
            return "n/a" if x is None else format(x, spec)

        print(
            f"| {m} | {f(row['torchrun_wall_s'])} s | {f(row['tuilaunch_wall_s'])} s "
            f"| **{f(row['ratio'])}x** | {f(row['paired_ratio'])}x | <= {TARGETS[m]}x "
            f"| {f(row['torchrun_workers_wall_s'])} / {f(row['tuilaunch_workers_wall_s'])} s "
            f"| {f(row['torchrun_cpu_s'])} / {f(row['tuilaunch_cpu_s'])} "
            f"| {f(row['torchrun_launcher_flood_cpu_s'])} / "
            f"{f(row['tuilaunch_launcher_flood_cpu_s'])} "
            f"| {f(row['torchrun_head_s'])} / {f(row['tuilaunch_head_s'])} "
            f"| {f(row['torchrun_tail_s'])} / {f(row['tuilaunch_tail_s'])} "
            f"| {f(row['torchrun_workers_user_s'])} + {f(row['torchrun_workers_sys_s'])} / "
            f"{f(row['tuilaunch_workers_user_s'])} + {f(row['tuilaunch_workers_sys_s'])} "
            f"| {'yes' if row['tuilaunch_files_ok'] else '**no**'} |"
        )
    by_mode = {row["mode"]: row for row in rows}
    if "default" in by_mode and "redirects" in by_mode:
        d, r = by_mode["default"], by_mode["redirects"]
        for key, what in (("wall_s", "wall"), ("workers_wall_s", "workers' wall")):
            floor = r[f"torchrun_{key}"] / d[f"torchrun_{key}"] if d[f"torchrun_{key}"] else 0
            ours = d[f"tuilaunch_{key}"] / r[f"torchrun_{key}"] if r[f"torchrun_{key}"] else 0
            print(
                f"\n{what}: torchrun --redirects / torchrun default = {floor:.2f} (what writing "
                f"every byte to files costs torchrun itself); tuilaunch default / torchrun "
                f"--redirects = {ours:.2f}"
            )
    print(f"\nRaw data: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
