"""How often a finished DDP job dies of SIGABRT in its teardown, per launcher and store arrangement.

PyTorch's DDP tutorial program (``workloads/multinode.py``, CPU/gloo, ends with
``destroy_process_group``) sometimes aborts after its last epoch with "terminate called
without an active exception" (a gloo teardown race, pytorch/pytorch#179291). Whether the
workers share the agent's rendezvous TCPStore (torch's default since 2.5) or each attempt's
rank 0 hosts a fresh one (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, tuilaunch's default) may
change how often. This runs N launches of the same program each way, interleaved (one launch
of each mode per round, so a patch of load hits every mode alike), and counts:

- ``abort``: the launcher failed and its output names SIGABRT (signal 6 / exit code -6);
- ``other``: the launcher failed otherwise;
- ``ok``: exit status 0.

Modes (``--modes``): ``tuilaunch`` (its default: fresh store), ``tuilaunch-shared``
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0``: torch's shared store), ``torchrun`` (torch's default:
shared), ``torchrun-fresh`` (``=1``). Every launch has its own token in the environment;
anything still carrying it after the launcher exits is SIGKILLed and counted as leftover.

Usage (run it niced while other work loads the machine; that is the "under load")::

    nice .venv/bin/python bench/teardown.py --runs 30 --nproc 2 --epochs 3 --out teardown.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tui_launch.testing.procs import env_holders

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PROGRAM = BENCH / "workloads" / "multinode.py"
TOKEN_VAR = "TUILAUNCH_BENCH_TOKEN"
SHARE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"

MODES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "tuilaunch": (("-m", "tui_launch", "--no-tui"), {}),
    "tuilaunch-shared": (("-m", "tui_launch", "--no-tui"), {SHARE: "0"}),
    "torchrun": (("-m", "torch.distributed.run"), {}),
    "torchrun-fresh": (("-m", "torch.distributed.run"), {SHARE: "1"}),
}
ABORT = re.compile(r"SIGABRT|Signal 6\b|exitcode\s*:\s*-6\b|exit code -6\b|signal 6\b", re.I)


def token_pids(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (workers inherit it)."""
    return env_holders(TOKEN_VAR, token)


def run_once(mode: str, nproc: int, epochs: int, timeout: float) -> dict[str, object]:
    """One launch of the tutorial program; its outcome and the tail of its output."""
    launcher, changes = MODES[mode]
    token = uuid.uuid4().hex
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", SHARE)) and k != "LOGLEVEL"
    }
    env.update(changes)
    env[TOKEN_VAR] = token
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH")) if x)
    with tempfile.TemporaryDirectory(prefix="teardown-") as tmp:
        cmd = [
            sys.executable,
            *launcher,
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--log-dir",
            f"{tmp}/logs",
            str(PROGRAM),
            str(epochs),
            "1",
            "--snapshot",
            f"{tmp}/snapshot.pt",
        ]
        t0 = time.monotonic()
        with open(f"{tmp}/out", "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        wall = time.monotonic() - t0
        text = Path(f"{tmp}/out").read_text(errors="replace")
        # The workers' own files too: tuilaunch's summary names the signal, torchrun's
        # error file may not reach stdout.
        for f in Path(f"{tmp}/logs").rglob("*"):
            if f.is_file() and f.stat().st_size < 1_000_000:
                text += f.read_text(errors="replace")
        left = token_pids(token)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    outcome = "ok" if rc == 0 else "abort" if ABORT.search(text) else "other"
    return {"mode": mode, "rc": rc, "outcome": outcome, "wall": round(wall, 2),
            "leftover": len(left), "tail": text[-1500:] if rc else ""}  # fmt: skip


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a rate k/n."""
    if n == 0:
        return (0.0, 1.0)
    z, p = 1.96, k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def table(results: list[dict[str, object]], modes: list[str]) -> str:
    """One row per mode: runs, aborts (rate and 95% interval), other failures, leftovers."""
    lines = [
        "| mode | runs | SIGABRT | rate (95% CI) | other failures | median wall | leftovers |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        rs = [r for r in results if r["mode"] == m]
        n = len(rs)
        k = sum(r["outcome"] == "abort" for r in rs)
        lo, hi = wilson(k, n)
        walls = sorted(float(str(r["wall"])) for r in rs)
        med = walls[len(walls) // 2] if walls else 0.0
        lines.append(
            f"| {m} | {n} | {k} | {k / max(n, 1):.0%} ({lo:.0%}-{hi:.0%}) | "
            f"{sum(r['outcome'] == 'other' for r in rs)} | {med:.1f} s | "
            f"{sum(int(str(r['leftover'])) for r in rs)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="launches per mode")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--modes", default="tuilaunch,torchrun,tuilaunch-shared")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--out", help="write every launch's record here (JSON)")
    a = p.parse_args(argv)
    modes = a.modes.split(",")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (one of {', '.join(MODES)})")
    results: list[dict[str, object]] = []
    t0 = time.monotonic()
    for i in range(a.runs):
        # Rotate the order each round: no mode always runs right after another.
        for m in modes[i % len(modes) :] + modes[: i % len(modes)]:
            r = run_once(m, a.nproc, a.epochs, a.timeout)
            results.append(r)
            print(f"[{time.monotonic() - t0:6.0f}s] round {i + 1} {m}: {r['outcome']} "
                  f"rc={r['rc']} {r['wall']}s", flush=True)  # fmt: skip
            if a.out:
                Path(a.out).write_text(json.dumps(results, indent=1))
    print(table(results, modes))
    with contextlib.suppress(OSError):
        print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
