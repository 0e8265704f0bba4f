"""The example trainer (``examples/train_ddp.py``) with one failure, under each launcher.

For each ``--nproc`` and round, runs the trainer under torchrun, tuilaunch and
``tuilaunch --warm-start`` (interleaved, ``--abba`` flips every other round) with the same
arguments: ``--standalone --max-restarts 1 --redirects 3 --log-dir D``, the trainer with
``--epochs E``. The harness reads the ranks' ``stdout.log`` files every 20 ms:

- **first launch**: from ``Popen`` to the moment every rank of attempt 0 has printed its
  ``start`` line (past ``init_process_group``);
- **restart**: once the failing rank (rank 1; rank 0 at one rank) has printed the end of epoch
  ``--fail-epoch``, the harness SIGKILLs it; the latency is from the kill to the moment every
  rank of attempt 1 has printed its ``start`` line (failure noticed, survivors stopped,
  rendezvous, new workers, imports, ``init_process_group``);
- **wall**: ``Popen`` to the launcher's exit (the job resumes from its snapshot and finishes).

A run counts when the launcher exits 0 and both attempts' ranks came up. Every process of a
launch carries a token in its environment; whatever is left after a launch is killed and
counted. The tuilaunch measured is a frozen copy of the working tree (``bench/run.py``'s
``--code worktree``). Markdown on stdout, every sample as JSON on stderr.

Usage::

    .venv/bin/python bench/trainer.py --nproc 1,2,4 --repeat 3 --abba
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as harness  # bench/run.py: environment, tokens, the frozen copy

from tui_launch.core.model import layout

ROOT = harness.ROOT
TRAINER = ROOT / "examples" / "train_ddp.py"
START = re.compile(r"\[RANK (\d+)\] start: restart_count=(\d+) world_size=\d+ pid=(\d+)")
LAUNCHERS = {
    "torchrun": ("-m", "torch.distributed.run"),
    "tuilaunch": ("-m", "tui_launch", "--no-tui"),
    "tuilaunch-warm": ("-m", "tui_launch", "--no-tui", "--warm-start"),
}


def read_logs(logs: Path) -> str:
    text = []
    for f in logs.rglob(layout.log_name(layout.STDOUT)):
        with contextlib.suppress(OSError):
            text.append(f.read_text(errors="replace"))
    return "\n".join(text)


def one(launcher: str, n: int, args: argparse.Namespace, pythonpath: str | None) -> dict:
    token = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix="tltrainer_"))
    logs = tmp / "logs"
    env = harness.base_env(token, {harness.SHARE_STORE_ENV: "1"}, pythonpath)
    victim = 1 if n > 1 else 0
    cmd = [
        args.python, *LAUNCHERS[launcher], "--standalone", "--nproc-per-node", str(n),
        "--max-restarts", "1", "--redirects", "3", "--log-dir", str(logs),
        str(TRAINER), "--epochs", str(args.epochs), "--snapshot-path", str(tmp / "snap.pt"),
    ]  # fmt: skip
    sample: dict[str, Any] = {"launcher": launcher, "nproc": n}
    t0 = time.time()
    with open(tmp / "out.txt", "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    seen: dict[tuple[int, int], float] = {}
    pids: dict[int, int] = {}
    killed_at: float | None = None
    fail_line = f"[RANK {victim}] Epoch {args.fail_epoch} |"
    deadline = t0 + args.timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            text = read_logs(logs)
            now = time.time()
            for m in START.finditer(text):
                key = (int(m.group(2)), int(m.group(1)))
                if key not in seen:
                    seen[key] = now
                    if key[0] == 0:
                        pids[key[1]] = int(m.group(3))
            if killed_at is None and fail_line in text and victim in pids:
                with contextlib.suppress(OSError):
                    os.kill(pids[victim], signal.SIGKILL)
                killed_at = time.time()
            time.sleep(0.02)
        if proc.poll() is None:
            harness.kill_token(token)
        proc.wait(timeout=30)
    finally:
        sample["leftovers"] = harness.settle(token, 10)
    end = time.time()
    first = [seen.get((0, r)) for r in range(n)]
    again = [seen.get((1, r)) for r in range(n)]
    complete = killed_at is not None and None not in first and None not in again
    sample.update(
        ok=proc.returncode == 0 and complete,
        rc=proc.returncode,
        wall_s=round(end - t0, 3),
        first_ready_s=round(max(first) - t0, 3) if None not in first else None,  # type: ignore[type-var, operator]
        restart_s=round(max(again) - killed_at, 3) if complete else None,  # type: ignore[type-var, operator]
    )
    if not sample["ok"]:
        sample["tail"] = (tmp / "out.txt").read_text(errors="replace")[-2000:]
    return sample


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--abba", action="store_true")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--fail-epoch", type=int, default=1, help="kill after this epoch's line")
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--code", default="worktree", help="as bench/run.py's --code")
    args = parser.parse_args()
    code_dir = Path(tempfile.mkdtemp(prefix="tltrainer_code_"))
    pythonpath = harness.snapshot_code(args.code, code_dir, args.python)
    samples: list[dict] = []
    loads = []
    names = list(LAUNCHERS)
    for rnd in range(args.repeat):
        for n in (int(x) for x in args.nproc.split(",")):
            order = names[::-1] if args.abba and rnd % 2 else names
            for name in order:
                loads.append(os.getloadavg()[0])
                s = one(name, n, args, pythonpath)
                s["round"] = rnd
                samples.append(s)
                print(json.dumps(s), file=sys.stderr, flush=True)
    print(f"Load average (1 min) during the run: median {statistics.median(loads):.2f}, "
          f"max {max(loads):.2f}\n")  # fmt: skip
    print("| nproc | metric | torchrun | tuilaunch | tuilaunch --warm-start | warm / torchrun "
          "| paired | ok (torchrun / tuilaunch / warm) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.nproc.split(",")):
        for metric, label in (
            ("restart_s", "restart"),
            ("first_ready_s", "first launch"),
            ("wall_s", "wall"),
        ):
            cells, oks = {}, {}
            for name in names:
                mine = [s for s in samples if s["launcher"] == name and s["nproc"] == n]
                cells[name] = med([s[metric] for s in mine if s["ok"]])
                oks[name] = f"{sum(s['ok'] for s in mine)}/{len(mine)}"
            pairs = []
            for rnd in range(args.repeat):
                a = [s for s in samples if s["round"] == rnd and s["nproc"] == n and s["ok"]]
                t = [s[metric] for s in a if s["launcher"] == "torchrun"]
                w = [s[metric] for s in a if s["launcher"] == "tuilaunch-warm"]
                if t and w:
                    pairs.append(w[0] / t[0])
            t, w = cells["torchrun"], cells["tuilaunch-warm"]
            ratio = f"{w / t:.3f}" if t and w else "n/a"
            paired = f"{statistics.median(pairs):.3f}" if pairs else "n/a"
            fmt = {k: (f"{v:.3f}" if v is not None else "n/a") for k, v in cells.items()}
            print(
                f"| {n} | {label} | {fmt['torchrun']} | {fmt['tuilaunch']} "
                f"| {fmt['tuilaunch-warm']} | {ratio} | {paired} "
                f"| {oks['torchrun']} / {oks['tuilaunch']} / {oks['tuilaunch-warm']} |"
            )
    left = sum(s["leftovers"] for s in samples)
    print(f"\nLeftover processes killed after launches: {left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
