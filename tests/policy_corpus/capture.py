"""Run the corpus's programs with tuilaunch and keep the evidence the restart policy reads.

    python tests/policy_corpus/capture.py [ID ...]     # every sequence, or those named

Each sequence (``sequences.py``) runs as ``tuilaunch --no-tui --standalone --nproc-per-node 2
--max-restarts N --restart-policy torchrun --journal J PROGRAM ARGS`` (torchrun's policy, so
that every attempt torchrun would run is seen), two at a time. ``captured/ID.json`` keeps, for
every failed attempt, what the journal says of it: the failures (message, traceback, stderr
tail, exit code, the rank's step...), the furthest step the attempt reached (the policy's
``step``), the ranks' exit codes; and how the run ended. ``evaluate.py`` feeds them to the
policy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))  # tests/: policy_corpus is its package

from policy_corpus.sequences import SEQUENCES, TYPO, Sequence  # noqa: E402

OUT = HERE / "captured"


def capture(seq: Sequence) -> str:
    """Run one sequence and write its capture; a line saying what happened."""
    with tempfile.TemporaryDirectory(prefix=f"corpus-{seq.id}-") as tmp:
        if seq.program == TYPO:
            Path(tmp, "typo.py").write_text("import os\nfor step in range(3)\n    print(step)\n")

        def fill(text: str) -> str:
            return text.replace("{tmp}", tmp).replace("{ckpt}", f"{tmp}/ckpt")

        program = fill(seq.program)
        args = [fill(a) for a in seq.args]
        journal = Path(tmp, "journal.jsonl")
        cmd = [
            sys.executable, "-m", "tui_launch", "--no-tui", "--standalone",
            "--nproc-per-node", "2", "--max-restarts", str(seq.max_restarts),
            "--restart-policy", "torchrun", "--journal", str(journal), *seq.launch,
            program, *args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC"))}
        env["PYTHONUNBUFFERED"] = "1"
        env["TMPDIR"] = tmp
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        events = (
            [json.loads(ln) for ln in journal.read_text().splitlines()] if journal.exists() else []
        )
        attempts = []
        for e in events:
            if e["kind"] != "attempt_failed":
                continue
            n = e["attempt"]
            decision: dict[str, Any] = next(
                (d for d in events if d["kind"] == "policy_decision" and d["attempt"] == n), {}
            )
            started: dict[str, Any] = next(
                (s for s in events if s["kind"] == "workers_started" and s["attempt"] == n), {}
            )
            exits = {
                str(x["local_rank"]): x["exit_code"]
                for x in events
                if x["kind"] == "rank_exited" and x["attempt"] == n
            }
            attempts.append(
                {
                    "attempt": n,
                    "time": e["wall"],
                    "step": decision.get("step"),
                    "exits": exits,
                    "local_ranks": [w["local_rank"] for w in started.get("workers", [])],
                    "failures": e["failures"],
                }
            )
        fin = events[-1] if events and events[-1]["kind"] == "run_finished" else {}
        record = {
            "id": seq.id,
            "command": ["tuilaunch", *cmd[3:]],
            "exit_code": proc.returncode,
            "outcome": fin.get("outcome", ""),
            "max_restarts": seq.max_restarts,
            "attempts": attempts,
            "stderr_tail": proc.stderr.splitlines()[-15:],
        }
    OUT.mkdir(exist_ok=True)
    (OUT / f"{seq.id}.json").write_text(json.dumps(record, indent=1) + "\n")
    return (
        f"{seq.id}: exit {proc.returncode}, {len(attempts)} failed attempt(s), {record['outcome']}"
    )


def main(argv: list[str]) -> int:
    chosen = [s for s in SEQUENCES if not argv or s.id in argv]
    with ThreadPoolExecutor(2) as pool:
        for line in pool.map(capture, chosen):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
