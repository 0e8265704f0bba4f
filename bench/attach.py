"""Benchmark: ``tuilaunch attach`` to a running headless job, in a real terminal (tmux).

Two jobs, each ``python -m tui_launch --no-tui --standalone`` with 2 ranks of
``tests/workers/ticker.py`` (no torch import in the ranks: the launcher is what is timed),
its own run index (``XDG_RUNTIME_DIR``) and log directory:

- **first frame**: the first job runs untouched; ``--repeat`` times, ``tuilaunch attach
  RUN_DIR`` is started in a fresh tmux pane (160x45, private server) and the pane is captured
  as fast as tmux answers until it shows the full dashboard: the ``ATTACHED read-only`` bar,
  the footer, and every rank's pid in the Workers table. Reported: from starting the tmux
  session (the attach process's own interpreter start-up included) to that capture.
- **event latency**: the second job has a kill of rank 1 injected ``--kill-after`` s into each
  of attempts 0..``--kills``-1 (``--max-restarts`` as many), with one attached client that
  stays. For each ``rank_exited`` of rank 1 (state ``failed`` in its row) and each
  ``workers_started`` after the first (the new attempt's pids in the table): the event's wall
  time as the agent wrote it in the journal, to the first capture of the pane showing it.
  The client refreshes at ``--refresh-hz`` (4, the default: one refresh is 0.25 s).
- **long** (``--long JOURNAL``): attach to a run directory whose journal is a long one (e.g.
  ``bench/replay.py``'s synthetic 24-hour journal): the first frame needs the state at the end.

Targets (issue 16): attach to first full frame ≤ 1 s; an event in the agent visible in the
attached client within one refresh (≤ 0.5 s at 4 Hz).

Usage::

    .venv/bin/python bench/attach.py [--repeat 5] [--kills 3] [--long JOURNAL]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dashboard import Tmux
from run import base_env, settle

from tui_launch.core.model import layout

ROOT = Path(__file__).resolve().parent.parent
TICKER = ROOT / "tests" / "workers" / "ticker.py"
BAR = "ATTACHED read-only"
FOOTER = "^p palette"


class Job:
    """A headless tuilaunch job with its own run index, log directory and token."""

    def __init__(self, tmp: Path, launcher: list[str], ticks: int) -> None:
        self.tmp = tmp
        self.token = uuid.uuid4().hex
        index = tmp / "index"
        index.mkdir(mode=0o700)
        self.env = base_env(self.token, {"XDG_RUNTIME_DIR": str(index), "PYTHONUNBUFFERED": "1"})
        cmd = [sys.executable, "-m", "tui_launch", "--no-tui", "--standalone"]
        cmd += ["--nproc-per-node", "2", "--log-dir", str(tmp / "logs"), *launcher]
        cmd += [str(TICKER), "--ticks", str(ticks)]
        self.out = open(tmp / "output.txt", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, env=self.env, stdout=self.out, stderr=subprocess.STDOUT, cwd=tmp
        )

    def journal(self, timeout: float = 120) -> Path:
        """The job's journal, once it records the first workers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in glob.glob(
                str(self.tmp / "logs" / "**" / layout.JOURNAL_NAME), recursive=True
            ):
                if '"workers_started"' in Path(path).read_text():
                    return Path(path)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"no journal with workers: {(self.tmp / 'output.txt').read_text()}")

    def close(self) -> int:
        """Stop the job (if still running); return how many processes had to be killed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        self.out.close()
        return settle(self.token, grace=10.0)


def events(journal: Path) -> list[dict]:
    """The journal's lines as dicts."""
    with open(journal) as fp:
        return [json.loads(line) for line in fp if line.endswith("\n")]


def last_pids(journal: Path) -> list[int]:
    """The pids of the last workers_started."""
    started = [e for e in events(journal) if e["kind"] == "workers_started"]
    return [w["pid"] for w in started[-1]["workers"]]


class Watcher:
    """Captures a tmux pane as fast as tmux answers, on a thread, keeping (wall, text)."""

    def __init__(self, tmux: Tmux) -> None:
        self.tmux = tmux
        self.frames: list[tuple[float, str]] = []
        self.costs: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def _loop(self) -> None:
        last = None
        while not self._stop.is_set():
            t = time.time()
            text = self.tmux.capture()
            self.costs.append(time.time() - t)
            if text != last:  # keep changes only; a frame's time is when it was asked for
                self.frames.append((t, text))
                last = text
            time.sleep(0.005)

    def first(self, test: Callable[[str], bool], after: float = 0.0) -> float | None:
        """Wall time of the first capture (asked for after ``after``) passing ``test``."""
        for t, text in list(self.frames):
            if t >= after and test(text):
                return t
        return None

    def wait(self, test: Callable[[str], bool], timeout: float, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.first(test, after)
            if t is not None:
                return t
            time.sleep(0.02)
        last = self.frames[-1][1] if self.frames else "(nothing captured)"
        raise RuntimeError(f"not shown within {timeout} s; pane:\n{last}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def full_frame(pids: list[int]) -> Callable[[str], bool]:
    """The dashboard is all there: the attach bar, the footer, every rank's pid."""
    return lambda text: BAR in text and FOOTER in text and all(str(p) in text for p in pids)


def attach(tmp: Path, env: dict[str, str], target: str, hz: float) -> tuple[Tmux, Watcher, float]:
    """Start ``tuilaunch attach target`` in a fresh tmux pane; return it, its watcher, t0."""
    tmux = Tmux(tmp)
    cmd = shlex.join(
        [sys.executable, "-m", "tui_launch", "attach", target, "--refresh-hz", str(hz)]
    )
    t0 = time.time()
    tmux.start(cmd, env)
    return tmux, Watcher(tmux).start(), t0


def stats(values: list[float]) -> str:
    if not values:
        return "no samples"
    ms = sorted(v * 1e3 for v in values)
    return (
        f"median {statistics.median(ms):.0f} ms, max {ms[-1]:.0f} ms, min {ms[0]:.0f} ms "
        f"(n={len(ms)})"
    )


def startup(repeat: int) -> list[float]:
    """Wall time of a bare ``python -c 'import tui_launch.tui.sources.replay'`` (interpreter,
    Textual
    and the dashboard's modules): the floor under any first frame."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import tui_launch.tui.sources.replay"], check=True)
        times.append(time.perf_counter() - t)
    return times


def source_at_end(journal: Path) -> float:
    """Seconds to build the attached source in this process: index, state at the end, logs."""
    from tui_launch.core.journal.timeline import Timeline
    from tui_launch.tui.sources.attach import AttachSource

    t = time.perf_counter()
    AttachSource(Timeline(str(journal))).timeline.close()
    return time.perf_counter() - t


def bench_first_frame(a: argparse.Namespace) -> list[float]:
    tmp = Path(tempfile.mkdtemp(prefix="tlbench_attach_"))
    job = Job(tmp, [], ticks=100000)
    times = []
    try:
        journal = job.journal()
        pids = last_pids(journal)
        print(f"interpreter and imports alone: {stats(startup(a.repeat))}")
        print(f"the attached source, in process: {source_at_end(journal) * 1e3:.0f} ms")
        for k in range(a.repeat):
            d = tmp / f"client{k}"
            d.mkdir()
            tmux, watch, t0 = attach(d, job.env, str(journal.parent), a.refresh_hz)
            try:
                t1 = watch.wait(full_frame(pids), 60)
            finally:
                watch.stop()
                tmux.kill()
            times.append(t1 - t0)
            print(f"  attach {k}: first full frame {(t1 - t0) * 1e3:.0f} ms", file=sys.stderr)
    finally:
        left = job.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"first full frame (job of 2 ranks, {a.repeat} attaches): {stats(times)}")
    if left:
        print(f"  ({left} leftover processes killed)")
    return times


def bench_events(a: argparse.Namespace) -> dict[str, list[float]]:
    tmp = Path(tempfile.mkdtemp(prefix="tlbench_attach_ev_"))
    launcher = ["--max-restarts", str(a.kills)]
    for k in range(a.kills):
        launcher += ["--inject", f"kill:rank=1,after={a.kill_after}s,attempt={k}"]
    job = Job(tmp, launcher, ticks=int(a.kill_after * 20))
    out: dict[str, list[float]] = {"rank_exited": [], "workers_started": []}
    capture_costs: list[float] = []
    try:
        journal = job.journal()
        pids = last_pids(journal)
        d = tmp / "client"
        d.mkdir()
        tmux, watch, t0 = attach(d, job.env, str(journal.parent), a.refresh_hz)
        try:
            watch.wait(full_frame(pids), 60)
            job.proc.wait(60 + a.kills * (a.kill_after + 30))
            time.sleep(1.0)  # the client's last refreshes
        finally:
            watch.stop()
            tmux.kill()
        capture_costs = watch.costs
        seen_first = False
        for e in events(journal):
            if e["kind"] == "rank_exited" and e["local_rank"] == 1 and e.get("signal"):
                pid = e["pid"]

                def failed(text: str, pid: int = pid) -> bool:
                    return any(str(pid) in ln and "failed" in ln for ln in text.splitlines())

                shown = watch.first(failed, after=t0)
                if shown is not None:
                    out["rank_exited"].append(shown - e["wall"])
            elif e["kind"] == "workers_started":
                if not seen_first:
                    seen_first = True
                    continue
                new = [w["pid"] for w in e["workers"]]
                shown = watch.first(full_frame(new), after=t0)
                if shown is not None:
                    out["workers_started"].append(shown - e["wall"])
    finally:
        left = job.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"event to attached pane ({a.kills} injected kills, --refresh-hz {a.refresh_hz:g}; "
        f"one tmux capture-pane: {stats(capture_costs)}):"
    )
    for kind, values in out.items():
        print(f"  {kind}: {stats(values)}")
    if left:
        print(f"  ({left} leftover processes killed)")
    return out


def bench_long(a: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="tlbench_attach_long_"))
    run_dir = tmp / "run"
    run_dir.mkdir()
    os.symlink(os.path.abspath(a.long), run_dir / layout.JOURNAL_NAME)
    started = None
    with open(a.long, "rb") as fp:  # the last workers_started: its pids must show
        fp.seek(max(0, os.path.getsize(a.long) - (64 << 20)))
        for line in fp:
            if b'"kind": "workers_started"' in line:
                started = json.loads(line)
    pids = [w["pid"] for w in started["workers"]] if started else []
    print(f"the attached source for {a.long}, in process: {source_at_end(Path(a.long)):.2f} s")
    env = base_env(uuid.uuid4().hex, {"XDG_RUNTIME_DIR": str(tmp)})
    tmux, watch, t0 = attach(tmp, env, str(run_dir), a.refresh_hz)
    try:
        t1 = watch.wait(full_frame(pids), 600)
    finally:
        watch.stop()
        tmux.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"first full frame, attached to {a.long}: {(t1 - t0) * 1e3:.0f} ms")


def main() -> None:
    """Run the three measurements."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="attaches for the first frame")
    parser.add_argument("--kills", type=int, default=3, help="injected kills (one an attempt)")
    parser.add_argument("--kill-after", type=float, default=5.0)
    parser.add_argument("--refresh-hz", type=float, default=4.0)
    parser.add_argument("--long", default=None, help="a long journal to attach to as well")
    a = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if a.repeat:
        bench_first_frame(a)
    if a.kills:
        bench_events(a)
    if a.long:
        bench_long(a)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
