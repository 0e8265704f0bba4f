"""Scale-down and scale-up recovery of an elastic c10d job: tuilaunch against torchrun, same run.

Two agents on localhost form one job (``--nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint
127.0.0.1:PORT --max-restarts 3``, short ``--rdzv-conf`` timeouts as in the tests: heartbeats
every second, a node dead after 3 missed), headless (``--no-tui`` for tuilaunch), the same flags
for every launcher. Workers run ``workloads/elastic.py``: once past ``init_process_group`` and
one ``all_reduce`` each writes ``up_<pid>`` (``time.time()``, world size, rank, restart count,
``TORCHELASTIC_MAX_RESTARTS``), then does an ``all_reduce`` every ~50 ms until a stop file
appears.

``down`` (scale-down)
    Agents A and B are started at once; their workers come up in a world of 2 nodes (if one
    node started alone, that took a scale-up first: torchrun's default cannot, see ``up``).
    Then every process of the agent that does not host the c10d store (agent and workers, by
    its own session and the token in its environment) is SIGKILLed at once, as a machine that
    vanished. Recovery = from the kill until all of the survivor's workers are up again in a
    world of 1 node. Also recorded: whether
    A recovered at all, and how much failure budget that cost (see the workload: ``--max-restarts``
    minus ``MAX_RESTARTS - RESTART_COUNT`` of the recovered workers).

``up`` (scale-up)
    Agent A alone, its workers up in a world of 1 node; then agent B is started. Recovery = from
    B's start until all workers of both nodes are up in a world of 2 nodes (B's interpreter and
    ``import torch`` included, the same for every launcher).

Launchers: ``tuilaunch`` (which sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` itself),
``torchrun`` (torch's default: the variable unset; its scale-up is expected to deadlock, see
DESIGN.md §3, and is given ``--up-timeout`` before it counts as failed) and ``torchrun+env``
(torchrun with the variable set to 1, for a fair comparison). They alternate in every round
(A, B, C, A, B, C, ...; ``--abba`` reverses every other round); each figure is the median of the
successful samples of ``--repeat`` rounds; ratios are tuilaunch's median over each torchrun's.

Every launch runs in sessions of its own, output to files, each agent with a token in its
environment (inherited by its workers): after each sample whatever still carries a token is
killed and counted ("leftover processes", which should be 0). The harness is a child subreaper,
so a killed agent's orphaned workers are reaped here and their CPU counted as ours, not as
"other processes" (the noise figure, as in ``run.py``).

    .venv/bin/python bench/elastic.py --repeat 3 [--scenarios down,up] [--nproc 1]

Markdown on stdout, progress on stderr, every sample in ``bench/results/elastic-<time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import run as harness
from rendezvous import c10d_command
from run import (
    SHARE_STORE_ENV,
    Launcher,
    Settings,
    SetupError,
    base_env,
    become_subreaper,
    busy_cpu_s,
    children_cpu_s,
    free_port,
    holds_socket,
    kill_token,
    listening_sockets,
    median,
    reap_orphans,
    settle,
    snapshot_code,
)

WORKLOAD = harness.WORKLOADS / "elastic.py"
RDZV_CONF = "join_timeout=40,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
MAX_RESTARTS = 3
LAUNCHERS = (
    harness.TUILAUNCH,
    Launcher("torchrun", harness.TORCHRUN.module_args, {SHARE_STORE_ENV: None}),
    Launcher("torchrun+env", harness.TORCHRUN.module_args, {SHARE_STORE_ENV: "1"}),
)
SCENARIOS = ("down", "up")

Sample = dict[str, Any]


@dataclass
class Agent:
    """One launcher process (a "node"), in a session of its own, with its token."""

    proc: subprocess.Popen[bytes]
    token: str
    output: Path
    started: float  # time.time() just before Popen


class Job:
    """One elastic job of up to two agents: its directory, port, run id and records."""

    def __init__(self, launcher: Launcher, nproc: int, settings: Settings) -> None:
        self.launcher, self.nproc, self.settings = launcher, nproc, settings
        self.tmp = Path(tempfile.mkdtemp(prefix="tlelastic_"))
        self.marks = self.tmp / "marks"
        self.marks.mkdir()
        self.stop_file = self.tmp / "stop"
        self.port, self.run_id = free_port(), f"el{uuid.uuid4().hex[:8]}"
        self.agents: list[Agent] = []

    def start_agent(self) -> Agent:
        i = len(self.agents)
        token = uuid.uuid4().hex
        cmd = c10d_command(
            self.settings.python,
            self.launcher.module_args,
            "1:2",
            self.nproc,
            self.port,
            self.run_id,
            [str(WORKLOAD), str(self.marks), str(self.stop_file)],
            extra=[
                "--rdzv-conf",
                RDZV_CONF,
                "--max-restarts",
                str(MAX_RESTARTS),
                "--log-dir",
                str(self.tmp / f"logs{i}"),
            ],
        )
        env = base_env(token, {**self.launcher.env}, self.settings.pythonpath)
        env["PYTHONUNBUFFERED"] = "1"
        output = self.tmp / f"agent{i}.txt"
        with open(output, "wb") as out:
            t = time.time()
            proc = subprocess.Popen(
                cmd,
                cwd=self.tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        agent = Agent(proc, token, output, t)
        self.agents.append(agent)
        return agent

    def records(self) -> list[dict[str, Any]]:
        out = []
        for p in self.marks.glob("up_*"):
            if p.suffix == ".tmp":
                continue
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_text()))
        return out

    def wait_world(self, nodes: int, since: float, timeout: float) -> list[dict[str, Any]] | None:
        """Every rank of a ``nodes``-node world up after ``since``; None at the timeout."""
        world = nodes * self.nproc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            recs = [r for r in self.records() if r["world"] == world and r["t"] > since]
            if len({r["rank"] for r in recs}) == world:
                return recs
            if all(a.proc.poll() is not None for a in self.agents):
                return None  # nothing left that could bring the world up
            time.sleep(0.02)
        return None

    def kill_agent(self, agent: Agent) -> None:
        """The node vanishes: its session and everything carrying its token, SIGKILLed."""
        with contextlib.suppress(OSError):
            os.killpg(agent.proc.pid, signal.SIGKILL)
        kill_token(agent.token)
        agent.proc.wait()

    def finish(self, grace: float) -> dict[str, Any]:
        """Ask the workers to stop; wait for the agents; kill and count what is left."""
        self.stop_file.touch()
        deadline = time.monotonic() + grace
        codes: list[int | None] = []
        for a in self.agents:
            try:
                codes.append(a.proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        killed = 0
        for a, code in zip(self.agents, codes, strict=True):
            if code is None:
                with contextlib.suppress(OSError):
                    os.killpg(a.proc.pid, signal.SIGKILL)
                killed += kill_token(a.token)
                a.proc.wait()
        leftovers = sum(settle(a.token, grace=5.0) for a in self.agents)
        reap_orphans()
        return {"exit_codes": codes, "killed_at_end": killed, "leftover_processes": leftovers}

    def kill_all(self) -> None:
        for a in self.agents:
            if a.proc.returncode is None:
                self.kill_agent(a)
            kill_token(a.token)

    def tails(self, n: int = 2500) -> list[str]:
        return [a.output.read_bytes()[-n:].decode(errors="replace") for a in self.agents]

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def budget_spent(recs: Sequence[dict[str, Any]]) -> int:
    """Failure restarts spent, from the workers' restart count and max restarts (workload)."""
    return max(MAX_RESTARTS - (r["max_restarts"] - r["restart"]) for r in recs)


def sample_down(job: Job, opts: argparse.Namespace) -> Sample:
    # Both agents at once, so that the first round already has both nodes: torchrun with its
    # shared store cannot scale up (the "up" scenario), and the setup must not depend on it.
    first, second = job.start_agent(), job.start_agent()
    if job.wait_world(2, 0.0, opts.timeout) is None:
        scaled = any(r["world"] == opts.nproc for r in job.records())
        why = " (one node started alone, then the scale-up failed)" if scaled else ""
        return {"ok": False, "reason": f"never formed a world of 2 nodes{why}"}
    # The node that goes is the one not hosting the c10d store (the store dies with its host).
    sockets = listening_sockets(job.port)
    host = first if holds_socket(first.proc.pid, sockets) else second
    lost = second if host is first else first
    time.sleep(opts.settle)
    t_kill = time.time()
    job.kill_agent(lost)
    recs = job.wait_world(1, t_kill, opts.timeout)
    if recs is None:
        why = "the host exited" if host.proc.poll() is not None else f"not in {opts.timeout:g}s"
        return {"ok": False, "reason": f"no world of 1 node after the kill ({why})"}
    return {
        "ok": True,
        "recovery_s": max(r["t"] for r in recs) - t_kill,
        "budget_spent": budget_spent(recs),
        "restart_count": max(r["restart"] for r in recs),
        # One node ran alone before the other joined (a scale-up happened first).
        "started_alone_first": any(
            r["world"] == opts.nproc and r["t"] < t_kill for r in job.records()
        ),
    }


def sample_up(job: Job, opts: argparse.Namespace) -> Sample:
    job.start_agent()
    if job.wait_world(1, 0.0, opts.timeout) is None:
        return {"ok": False, "reason": "A's workers never came up"}
    time.sleep(opts.settle)
    b = job.start_agent()
    recs = job.wait_world(2, b.started, opts.up_timeout)
    if recs is None:
        up = [r for r in job.records() if r["t"] > b.started]
        return {
            "ok": False,
            "reason": f"no world of 2 nodes within {opts.up_timeout:g}s of B's start "
            f"({len(up)} rank(s) came up since; agents alive: "
            f"{sum(x.proc.poll() is None for x in job.agents)}/2)",
        }
    return {
        "ok": True,
        "recovery_s": max(r["t"] for r in recs) - b.started,
        "budget_spent": budget_spent(recs),
        "restart_count": max(r["restart"] for r in recs),
    }


SAMPLERS: dict[str, Callable[[Job, argparse.Namespace], Sample]] = {
    "down": sample_down,
    "up": sample_up,
}


def run_sample(scenario: str, launcher: Launcher, opts: argparse.Namespace, s: Settings) -> Sample:
    job = Job(launcher, opts.nproc, s)
    sample: Sample = {"scenario": scenario, "launcher": launcher.name, "nproc": opts.nproc}
    load0, busy0, cpu0, t0 = os.getloadavg()[0], busy_cpu_s(), children_cpu_s(), time.time()
    try:
        try:
            sample.update(SAMPLERS[scenario](job, opts))
        except BaseException:
            job.kill_all()
            raise
        if not sample["ok"]:
            sample["output_tails"] = job.tails()
            job.kill_all()
        sample.update(job.finish(opts.finish_grace))
        wall = time.time() - t0
        ours = children_cpu_s() - cpu0
        foreign = max(0.0, busy_cpu_s() - busy0 - ours)
        sample.update(
            wall_s=wall,
            loadavg1=max(load0, os.getloadavg()[0]),
            foreign_load=foreign / (wall * (os.cpu_count() or 1)),
        )
    finally:
        job.close()
    return sample


# --------------------------------------------------------------------------- report


def summarize(
    samples: list[Sample], scenario: str, launchers: Sequence[Launcher]
) -> dict[str, Any]:
    """Per launcher: median recovery, successes, failure budget spent, why runs failed."""
    rows: dict[str, Any] = {}
    for launcher in launchers:
        mine = [s for s in samples if s["scenario"] == scenario and s["launcher"] == launcher.name]
        ok = [s for s in mine if s["ok"]]
        vals = [s["recovery_s"] for s in ok]
        rows[launcher.name] = {
            "median": median(vals),
            "min": min(vals) if vals else None,
            "max": max(vals) if vals else None,
            "succeeded": len(ok),
            "runs": len(mine),
            "budget_spent": sorted({s["budget_spent"] for s in ok}),
            "reasons": sorted({s["reason"] for s in mine if not s["ok"]}),
            "leftover_processes": sum(s["leftover_processes"] for s in mine),
        }
    return rows


def _cell(r: dict[str, Any]) -> str:
    if r["median"] is None:
        return "failed"
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def table(summaries: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| scenario | launcher | recovery s, median (min-max) | ratio tuilaunch / this "
        "| recovered | failure budget spent | leftover processes |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario, rows in summaries.items():
        ours = rows.get("tuilaunch", {}).get("median")
        for name, r in rows.items():
            ratio = "-" if name == "tuilaunch" else harness._r(harness.ratio(ours, r["median"]))
            spent = "/".join(str(x) for x in r["budget_spent"]) or "-"
            lines.append(
                f"| {scenario} | {name} | {_cell(r)} | {ratio} | {r['succeeded']}/{r['runs']} "
                f"| {spent} | {r['leftover_processes']} |"
            )
    notes = [
        f"- {scenario}, {name}: {reason}"
        for scenario, rows in summaries.items()
        for name, r in rows.items()
        for reason in r["reasons"]
    ]
    return "\n".join(lines + (["", *notes] if notes else []))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (samples per launcher)")
    ap.add_argument("--scenarios", default="down,up", help="comma-separated: down, up")
    ap.add_argument("--nproc", type=int, default=1, help="--nproc-per-node of each agent")
    ap.add_argument("--timeout", type=float, default=90.0, help="s for any one step")
    ap.add_argument(
        "--up-timeout", type=float, default=60.0, help="s before a scale-up counts as failed"
    )
    ap.add_argument("--settle", type=float, default=1.0, help="s of steps before the change")
    ap.add_argument("--finish-grace", type=float, default=30.0, help="s for agents to exit")
    ap.add_argument("--abba", action="store_true", help="reverse the order every other round")
    ap.add_argument("--launchers", default=",".join(x.name for x in LAUNCHERS))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--code", default="worktree", metavar="worktree|installed|REV")
    ap.add_argument("--results-dir", default=str(harness.RESULTS))
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, harness._on_sigterm)
    become_subreaper()
    scenarios = [x for x in opts.scenarios.split(",") if x]
    wanted = opts.launchers.split(",")
    launchers = [x for x in LAUNCHERS if x.name in wanted]
    settings = Settings(
        python=opts.python,
        nprocs=[opts.nproc],
        repeat=opts.repeat,
        warmup=0,
        timeout=opts.timeout,
        abba=opts.abba,
        code=opts.code,
    )
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="tlelastic_code_"))
    samples: list[Sample] = []
    try:
        settings.pythonpath = snapshot_code(settings.code, work, settings.python)
        info = harness.machine_info(settings)
        for r in range(opts.repeat):
            for scenario in scenarios:
                order = list(launchers)
                if opts.abba and r % 2:
                    order.reverse()
                for launcher in order:
                    s = run_sample(scenario, launcher, opts, settings)
                    s["round"] = r
                    samples.append(s)
                    rec = f"{s['recovery_s']:.2f}s" if s["ok"] else f"FAILED: {s['reason']}"
                    print(
                        f"[{r + 1}/{opts.repeat}] {scenario:<4} {launcher.name:<12} {rec} "
                        f"budget {s.get('budget_spent', '-')} exit {s['exit_codes']} "
                        f"leftovers {s['leftover_processes']} others {s['foreign_load']:.0%}",
                        file=sys.stderr,
                        flush=True,
                    )
    except SetupError as e:
        print(f"elastic.py: {e}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["loadavg_at_end"] = os.getloadavg()
    summaries = {sc: summarize(samples, sc, launchers) for sc in scenarios}
    out_dir = Path(opts.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    out_path = out_dir / f"elastic-{stamp}.json"
    doc = {
        "argv": list(sys.argv[1:] if argv is None else argv),
        "started": started,
        "duration_s": time.time() - started,
        "machine": info,
        "options": vars(opts),
        "rdzv_conf": RDZV_CONF,
        "summary": summaries,
        "samples": samples,
    }
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    loads = [s["foreign_load"] for s in samples]
    print(
        "\n".join(
            [
                f"## Elastic recovery — {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}",
                "",
                f"{info['cpu_count']} CPUs ({info['cpu_model'] or 'unknown'}), Python "
                f"{info['python']}, torch {info['torch']}, tuilaunch {info['tuilaunch']} "
                f"({harness._code_label(info)}); --nnodes 1:2 --nproc-per-node {opts.nproc} "
                f"--max-restarts {MAX_RESTARTS}, --rdzv-conf {RDZV_CONF}; {opts.repeat} rounds.",
                f"Machine noise: other processes used a median "
                f"{statistics.median(loads):.0%} (max {max(loads):.0%}) of the CPUs; load "
                f"average {statistics.median(s['loadavg1'] for s in samples):.2f} (median).",
                "",
                table(summaries),
                "",
                f"Leftover processes: {sum(s['leftover_processes'] for s in samples)}. "
                f"Raw data: {out_path}",
            ]
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
