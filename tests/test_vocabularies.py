"""The vocabularies as enums: the same words in the journal, the status JSON and the text.

``tests/fixtures/journal/before-enums.jsonl`` and its ``.status.json`` were written by the tree
before the vocabularies became enums (commit 736d457) from the events :func:`_events` builds:
a run whose rank 1 raised twice (classes ``exception`` and ``collateral``), whose GPU library
was missing in one attempt and a GPU was lost in the other, stopped by the policy.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tui_launch.core.journal.writer import Journal, read_journal
from tui_launch.core.model.events import (
    AttemptFailed,
    Event,
    Failure,
    GpuState,
    PolicyDecision,
    RunFinished,
    TelemetryRecord,
    TelemetrySample,
    from_dict,
    to_dict,
)
from tui_launch.core.model.exitcodes import ExitStyle
from tui_launch.core.model.failclass import FailureClass
from tui_launch.core.model.policy import Policy
from tui_launch.core.model.store import OUTCOMES, Phase, RankState, replay
from tui_launch.core.model.words import Word
from tui_launch.core.remote.status import Target, status
from tui_launch.testing import scenarios
from tui_launch.testing.builders import at, telemetry

FIXTURES = Path(__file__).parent / "fixtures" / "journal"
BEFORE = FIXTURES / "before-enums.jsonl"
VOCABULARIES: list[type[Word]] = [Phase, RankState, FailureClass, GpuState, Policy, ExitStyle]


def _events() -> list[Event]:
    """The events of the fixture journal, built with today's builders and members."""
    events = [e for e in scenarios.failed_with_traceback().events if not isinstance(e, RunFinished)]
    classes = {True: FailureClass.COLLATERAL, False: FailureClass.EXCEPTION}

    def classified(f: Failure) -> Failure:
        return dataclasses.replace(
            f, failure_class=classes[f.collateral], failure_detail="RuntimeError"
        )

    events = [
        dataclasses.replace(e, failures=tuple(classified(f) for f in e.failures))
        if isinstance(e, AttemptFailed)
        else e
        for e in events
    ]
    events += telemetry(1, 2, 5200, 60.0, 12, gpus=2, lose_after=6, lost_gpus={1})
    # As the sampler journals them: records, not samples.
    events = [
        TelemetryRecord(**{f.name: getattr(e, f.name) for f in dataclasses.fields(e)})
        if type(e) is TelemetrySample
        else e
        for e in events
    ]
    events.sort(key=lambda e: e.mono)
    events += [
        PolicyDecision(
            attempt=1,
            action="stop",
            rule="budget",
            reason="--max-restarts spent",
            failure_class=FailureClass.EXCEPTION,
            saved=0,
            step=None,
            **at(70.4),
        ),
        RunFinished(
            outcome=Phase.FAILED,
            exit_code=1,
            message="rank 1 failed",
            failure_class=FailureClass.EXCEPTION,
            meaning="program",
            **at(70.5),
        ),
    ]
    return events


def test_a_journal_is_written_byte_for_byte_as_before(tmp_path):
    journal = Journal(str(tmp_path / "journal.jsonl"))
    for e in _events():
        journal.write(e)
    journal.close()
    assert (tmp_path / "journal.jsonl").read_bytes() == BEFORE.read_bytes()


def test_a_journal_written_before_reads_the_same(tmp_path):
    old = read_journal(str(BEFORE))
    new = _events()
    assert old == new  # a member equals the plain word read back
    # Read back, every event writes the very line it was read from.
    lines = [json.loads(line) for line in BEFORE.read_text().splitlines()]
    again = [{"seq": d["seq"], **to_dict(e)} for d, e in zip(lines, old, strict=True)]
    assert json.loads(json.dumps(again)) == lines
    snap, fresh = replay(old), replay(new)
    assert snap == fresh
    assert snap.phase is Phase.FAILED and snap.phase in OUTCOMES
    assert [r.state for r in snap.ranks] == [RankState.EXITED, RankState.FAILED]
    assert all(type(r.state) is RankState for r in snap.ranks)
    assert snap.root_cause is not None and snap.root_cause.failure_class == FailureClass.EXCEPTION
    assert snap.telemetry is not None and snap.telemetry.latest.gpu_state == GpuState.OK
    assert [g.state for g in snap.telemetry.latest.gpus] == [GpuState.OK, GpuState.LOST]


def test_status_json_is_the_same_as_before():
    doc = status(Target(str(BEFORE), None, False), socket=False, now=1.0e9)
    doc["run"].update(journal="<journal>", run_dir="<run_dir>")
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    assert text == (FIXTURES / "before-enums.status.json").read_text()


@pytest.mark.parametrize("vocabulary", VOCABULARIES, ids=lambda v: v.__name__)
def test_a_word_is_its_string(vocabulary):
    for word in vocabulary:
        value = word.value
        assert isinstance(word, str) and word == value and hash(word) == hash(value)
        assert str(word) == f"{word}" == f"{word:>0}" == "{}".format(word) == value  # noqa: UP032
        assert json.dumps({"w": word}) == json.dumps({"w": value})
        assert vocabulary(value) is word
        assert {value: 1}[word] == 1 and {word: 1}[value] == 1


def test_an_event_with_a_member_round_trips_to_the_plain_word():
    e = PolicyDecision(
        attempt=0, action="stop", rule="startup", reason="r", failure_class=FailureClass.STARTUP
    )
    back = from_dict(json.loads(json.dumps(to_dict(e))))
    assert isinstance(back, PolicyDecision)
    assert back == e and type(back.failure_class) is str
