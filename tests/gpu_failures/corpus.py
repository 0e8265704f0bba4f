"""Real error output of GPU jobs, as people posted it in public issue threads, run through the
code a live run uses; the class and the restart policy's decisions a person would give.

    python tests/gpu_failures/corpus.py [-v]

Each ``*.txt`` here is one excerpt: a header (``key: value`` lines, up to a line ``---``) and
the lines as posted, trimmed to the relevant ones and otherwise verbatim. The header says
where it comes from (``url``, ``repo``, ``title``), what kind of failure it is (``kind``), how
the rank ended as the excerpt implies (``exit``: an exit code or a signal's name), the
training step it was at (``step``: a number, or ``none`` before the first step), the class a
person would give it (``class``) and ``why``, and the restart policy's decisions:

- ``first``: after this failure, with restarts left (``restart``, or ``stop RULE``);
- ``repeat``: after the same failure again on the next attempt, at the same step.

:func:`replay` writes the excerpt to a rank's stderr log and goes the live run's way: the
failure collected from the log (:func:`~tui_launch.core.run.failures.collect_failures`),
classified (:func:`~tui_launch.core.run.failures.classified`), made the attempt's record
(:func:`~tui_launch.core.model.policy.attempt_record`) and decided
(:meth:`~tui_launch.core.model.policy.RestartPolicy.decide`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from tui_launch.core.model.events import Failure
from tui_launch.core.model.policy import PolicyConfig, RestartPolicy, attempt_record
from tui_launch.core.run.failures import classified, collect_failures
from tui_launch.core.workers.table import RanksView

HERE = Path(__file__).resolve().parent
FIELDS = ("url", "repo", "title", "kind", "exit", "step", "class", "why", "first", "repeat")
BUDGET = 3  # --max-restarts of the replayed run


@dataclass(frozen=True)
class Excerpt:
    """One posted excerpt and what a person would say of it."""

    name: str
    url: str
    repo: str
    title: str
    kind: str
    exit_code: int
    step: int | None
    cls: str
    why: str
    first: str
    repeat: str
    text: str


@dataclass(frozen=True)
class Result:
    """What the launcher made of an excerpt: the failure (classified) and the two decisions."""

    failure: Failure
    first: str
    repeat: str


def exit_code(text: str) -> int:
    """``1`` -> 1, ``SIGABRT`` -> -6: the exit code torch's agent reports."""
    text = text.strip()
    if text.startswith("SIG"):
        return -int(signal.Signals[text])
    return int(text)


def load(path: Path) -> Excerpt:
    """One excerpt file; raises ValueError on a missing or unknown header field."""
    head, sep, body = path.read_text().partition("\n---\n")
    if not sep:
        raise ValueError(f"{path.name}: no '---' line after the header")
    fields: dict[str, str] = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        if key not in FIELDS:
            raise ValueError(f"{path.name}: unknown header field {key!r}")
        fields[key] = value.strip()
    missing = [k for k in FIELDS if not fields.get(k)]
    if missing:
        raise ValueError(f"{path.name}: missing {', '.join(missing)}")
    step = fields["step"]
    return Excerpt(
        name=path.stem,
        url=fields["url"],
        repo=fields["repo"],
        title=fields["title"],
        kind=fields["kind"],
        exit_code=exit_code(fields["exit"]),
        step=None if step == "none" else int(step),
        cls=fields["class"],
        why=fields["why"],
        first=fields["first"],
        repeat=fields["repeat"],
        text=body,
    )


def excerpts() -> list[Excerpt]:
    """Every excerpt of the corpus, by file name."""
    return [load(p) for p in sorted(HERE.glob("*.txt"))]


def _failure(ex: Excerpt, attempt: int, log: Path) -> Failure:
    """The excerpt as the failure of rank 0 in ``attempt``, collected and classified."""
    log.write_text(ex.text)
    pid = 1000 + attempt
    ranks = RanksView(
        attempt=attempt,
        pids={0: pid},
        global_ranks={0: 0},
        exits={0: ex.exit_code},
        exit_times={0: 1000.0 + 600 * attempt},
    )
    pf = SimpleNamespace(local_rank=0, pid=pid, exitcode=ex.exit_code, error_file="")
    collected = collect_failures(
        reported={0: pf},
        workers=[SimpleNamespace(local_rank=0, global_rank=0)],
        ranks=ranks,
        error_files={},
        stderr_paths={0: str(log)},
        host="node0",
    )
    (out,) = classified(
        collected,
        steps={0: ex.step},
        returned=lambda _pid: False,
        oom_kill=lambda _pid: None,
    )
    return out


def _words(action: str, rule: str) -> str:
    return "restart" if action == "restart" else f"stop {rule}"


def replay(ex: Excerpt) -> Result:
    """The live run's path for ``ex``: once, then the same failure on the next attempt."""
    policy = RestartPolicy(PolicyConfig())
    said = []
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in (0, 1):
            f = _failure(ex, attempt, Path(tmp) / f"rank0.attempt{attempt}.err")
            rec = attempt_record(
                attempt,
                (f,),
                time=f.time,
                step=ex.step,
                exits={0: ex.exit_code},
                local_ranks=[0],
            )
            assert rec is not None
            d = policy.decide(rec, BUDGET - attempt)
            said.append((f, _words(d.action, d.rule)))
            if d.action == "stop":
                # The run ended: a repeat is never seen.
                said.append((f, "(stopped)"))
                break
    return Result(failure=said[0][0], first=said[0][1], repeat=said[1][1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="one line per excerpt")
    a = p.parse_args(argv)
    all_ = excerpts()
    wrong = 0
    kinds: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    for ex in all_:
        r = replay(ex)
        got = (r.failure.failure_class, r.first, r.repeat)
        ok = got == (ex.cls, ex.first, ex.repeat)
        wrong += not ok
        kinds[ex.kind] += 1
        classes[ex.cls] += 1
        if a.verbose or not ok:
            mark = "ok" if ok else "WRONG"
            print(
                f"{mark:5} {ex.name:34} {r.failure.failure_class:11} first: {r.first:18}"
                f" repeat: {r.repeat:20} {r.failure.failure_detail[:60]}"
            )
            if not ok:
                print(f"      expected {ex.cls} / {ex.first} / {ex.repeat}")
    print(f"{len(all_)} excerpts, {wrong} wrong")
    print("by kind:  " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    print("by class: " + ", ".join(f"{k} {n}" for k, n in sorted(classes.items())))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
