"""Feed the corpus's captured evidence to the restart policy; count false and missed stops.

    python tests/policy_corpus/evaluate.py [--policy smart|torchrun] [-v]

For each sequence of ``sequences.py``, the failed attempts of ``captured/ID.json`` go through
the same code as a live run: each failure classified
(:func:`~tui_launch.core.model.failclass.classify`), the attempt made a record
(:func:`~tui_launch.core.model.policy.attempt_record`), the policy asked
(:meth:`~tui_launch.core.model.policy.RestartPolicy.decide`) with the restarts left. A stop
other than the budget's on a ``retry`` sequence is a false stop (the job would have finished);
a ``stop`` sequence the policy lets run to the budget is a missed stop (torchrun's behaviour).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: policy_corpus is its package

from policy_corpus.sequences import SEQUENCES, Sequence  # noqa: E402

from tui_launch.core.model import failclass  # noqa: E402
from tui_launch.core.model.events import Failure  # noqa: E402
from tui_launch.core.model.policy import (  # noqa: E402
    Decision,
    PolicyConfig,
    RestartPolicy,
    attempt_record,
)

CAPTURED = HERE / "captured"
FIELDS = {f.name for f in dataclasses.fields(Failure)}


@dataclass(frozen=True)
class Result:
    """What the policy did with one sequence: the attempt it stopped after (None: it never
    stopped before the budget ran out, or the run finished) and every decision."""

    seq: Sequence
    stopped_at: int | None
    rule: str
    decisions: tuple[Decision, ...]

    @property
    def false_stop(self) -> bool:
        return self.seq.expect == "retry" and self.stopped_at is not None

    @property
    def missed_stop(self) -> bool:
        return self.seq.expect == "stop" and self.stopped_at is None


def load(seq: Sequence) -> dict:
    """The capture of ``seq``."""
    return json.loads((CAPTURED / f"{seq.id}.json").read_text())


def failure(data: dict) -> Failure:
    """A journaled failure, classified again from its evidence."""
    fields: dict[str, Any] = {
        k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in FIELDS
    }
    f = Failure(**fields)
    detail = data.get("failure_detail") or ""
    c = failclass.classify(
        exit_code=f.exit_code,
        message=f.message,
        traceback=f.traceback,
        stderr_tail=f.stderr_tail,
        caused_by=f.caused_by,
        collateral=f.collateral,
        hung=f.hung,
        step=f.step,
        main_returned=data.get("failure_class") == failclass.TEARDOWN,
        oom_kill=detail if "OOM killer" in detail else None,
    )
    return dataclasses.replace(f, failure_class=c.cls, failure_detail=c.detail)


def replay(seq: Sequence, mode: str = "smart") -> Result:
    """The policy's decisions over the captured attempts of ``seq``."""
    captured = load(seq)
    policy = RestartPolicy(PolicyConfig(mode))
    left = captured["max_restarts"]
    decisions = []
    for a in captured["attempts"]:
        failures = tuple(failure(f) for f in a["failures"])
        rec = attempt_record(
            a["attempt"],
            failures,
            time=a["time"],
            step=a["step"],
            exits={int(k): v for k, v in a["exits"].items()},
            local_ranks=a["local_ranks"],
        )
        if rec is None:
            continue
        d = policy.decide(rec, left)
        decisions.append(d)
        if d.action == "stop":
            at = None if d.rule == "budget" else a["attempt"]
            return Result(seq, at, d.rule, tuple(decisions))
        left -= 1
    return Result(seq, None, "", tuple(decisions))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", choices=("smart", "torchrun"), default="smart")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    results = [replay(s, a.policy) for s in SEQUENCES]
    for r in results:
        if a.verbose or r.false_stop or r.missed_stop:
            what = "FALSE STOP" if r.false_stop else "missed" if r.missed_stop else "ok"
            at = (
                f"stop after attempt {r.stopped_at} ({r.rule})"
                if r.stopped_at is not None
                else "no stop"
            )
            print(f"{what:10} {r.seq.expect:5} {r.seq.id:26} {at}  {r.seq.missed}")
    must_stop = [r for r in results if r.seq.expect == "stop"]
    must_retry = [r for r in results if r.seq.expect == "retry"]
    false = sum(r.false_stop for r in results)
    missed = sum(r.missed_stop for r in results)
    print(
        f"policy {a.policy}: {len(results)} sequences ({len(must_stop)} deterministic, "
        f"{len(must_retry)} transient): {false} false stop(s), {missed} missed stop(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
