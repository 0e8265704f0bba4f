"""One dispatch style on the event type: tables filled by decorators, no ``isinstance`` chains.

Whatever is done per event type (reduce it, describe it, mark it on the report's time axis,
print it headless, tally it for the metrics, note it for the progress watcher) is an
:class:`~tui_launch.core.model.events.EventTable`. These checks keep it so: every event type has
a line or is silent on purpose, the tables refuse a second handler, and no function of the
package tells event types apart by a chain of ``isinstance`` tests.
"""

from __future__ import annotations

import ast
import io

import pytest
from conftest import ROOT

from tui_launch.core.journal import marks
from tui_launch.core.journal.timeline import MOMENTS
from tui_launch.core.model import events as ev
from tui_launch.core.model import text
from tui_launch.core.model.store import RunStore
from tui_launch.headless import Headless
from tui_launch.testing import builders

PACKAGE = ROOT / "tui_launch"
EVENTS_MODULE = "tui_launch.core.model.events"
EVENT_NAMES = frozenset(c.__name__ for c in ev.EVENT_TYPES.values())


def test_every_event_type_has_a_describer_or_is_silent() -> None:
    """A new event type fails here until it is given a line (``@describes``) or named in
    ``SILENT``: headless and the journal's readers cannot forget it unnoticed."""
    missing = [c.__name__ for c in ev.EVENT_TYPES.values() if text.DESCRIBERS.get(c) is None]
    assert missing == []
    # Silent is a choice made once per type (a second describer for it would be refused).
    for cls in text.SILENT:
        assert text.DESCRIBERS.get(cls) is text.DESCRIBERS.get(ev.LogMark)
    # A journaled twin is as silent as its sample.
    assert text.DESCRIBERS.get(ev.TelemetryRecord) is text.DESCRIBERS.get(ev.TelemetrySample)
    assert text.DESCRIBERS.get(ev.ProgressRecord) is text.DESCRIBERS.get(ev.ProgressSample)


def test_describe_dispatches_by_type() -> None:
    started = builders.run_started()
    assert text.describe(started) is not None
    assert text.describe(started).startswith("launch ")  # type: ignore[union-attr]
    assert text.describe(ev.LogMark(offsets=())) is None
    assert text.describe(ev.Event()) is None  # the base: no line, and no error

    unsaid = type("Unsaid", (ev.Event,), {})
    assert text.describe(unsaid()) is None

    @text.describes(unsaid)
    def _line(e: ev.Event) -> str:
        return "said"

    assert text.describe(unsaid()) == "said"
    with pytest.raises(ValueError, match="two describers for Notice"):
        text.describes(ev.Notice)(lambda e: "again")


def test_the_tables_refuse_a_second_handler_and_follow_the_mro() -> None:
    table: ev.EventTable[str] = ev.EventTable("handler")
    table.add(ev.TelemetrySample, "sample")
    assert table.get(ev.TelemetryRecord) == "sample"  # its base class's, not its own
    assert table.get(ev.Notice) is None
    table.add(ev.TelemetryRecord, "record")  # its own now wins, cached lookups or not
    assert table.get(ev.TelemetryRecord) == "record"
    assert len(table) == 2
    assert table.kinds() == {ev.TelemetrySample, ev.TelemetryRecord}
    with pytest.raises(ValueError, match="two handlers for TelemetrySample"):
        table.add(ev.TelemetrySample, "again")

    @table.on(ev.Notice, ev.Shutdown)
    def handler() -> None:
        pass

    assert table.get(ev.Notice) is table.get(ev.Shutdown) is handler


def test_marks_and_moments_name_real_event_types() -> None:
    """The report's marks and the replay's ]/[ moments are keyed by event types, so a renamed
    kind cannot leave them pointing at nothing."""
    registered = set(ev.EVENT_TYPES.values())
    assert marks.MARKS.kinds() <= registered
    assert set(ev.EVENT_TYPES[k] for k in MOMENTS) <= marks.MARKS.kinds()
    notice = ev.Notice(message="fyi", level="info")
    assert marks.mark_of(notice) is None  # a maker may decline one event of its type
    m = marks.mark_of(ev.Notice(message="disk full", level="error"))
    assert m is not None
    assert (m.kind, m.text) == ("notice", "error: disk full")
    assert marks.mark_of(ev.LogMark(offsets=())) is None


class _Runner:
    """As much of a RunHandle as printing events needs: the dumps it is asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def stack_dump(self, path: str) -> None:
        self.asked.append(path)


@pytest.mark.parametrize("nodes", [(1, 1), (1, 2)])
def test_headless_prints_by_type(nodes: tuple[int, int]) -> None:
    """The exit barrier is said only when there are other nodes to wait for; a dump's stacks
    are printed once (not for a suspicion: its confirmation brings them again)."""
    store, runner, err = RunStore(), _Runner(), io.StringIO()
    out = Headless(store, runner, out=io.StringIO(), err=err, status_line=False)  # type: ignore[arg-type]
    store.post(builders.run_started(nodes=nodes))
    store.post(ev.ExitBarrier(attempt=0, done=False))
    for reason in ("hang-suspected", "hang-confirm"):
        store.post(
            ev.StacksDumped(
                reason=reason, attempt=0, ranks=(0,), verdict="v", odd_ranks=(), path=reason
            )
        )
    out._print_new_events()
    text = err.getvalue()
    assert text.startswith("[tuilaunch] launch ")
    assert ("exit barrier" in text) == (nodes != (1, 1))
    assert text.count("[tuilaunch] stacks (hang-") == 2
    assert runner.asked == ["hang-confirm"]


def _event_names(tree: ast.Module) -> set[str]:
    """Local names bound to event types by the module's imports from the events package."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(EVENTS_MODULE):
            for alias in node.names:
                if alias.name == "Event" or alias.name in EVENT_NAMES:
                    names.add(alias.asname or alias.name)
    return names


def _is_event_test(call: ast.Call, event_names: set[str]) -> bool:
    """``isinstance(x, T)``, ``isinstance(x, (T, U))`` or ``isinstance(x, T | U)`` with an
    event type among them (``T`` or ``ev.T``)."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "isinstance"):
        return False
    if len(call.args) != 2:
        return False
    for node in ast.walk(call.args[1]):
        if isinstance(node, ast.Name) and node.id in event_names:
            return True
        if isinstance(node, ast.Attribute) and node.attr in EVENT_NAMES:
            return True
    return False


def _chains(source: str, where: str) -> list[str]:
    """``where:line function`` of each function of ``source`` with an isinstance chain."""
    tree = ast.parse(source, where)
    names = _event_names(tree)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        # The function's own body: a nested function is checked on its own.
        own: list[ast.AST] = []
        todo: list[ast.AST] = list(fn.body)
        while todo:
            node = todo.pop()
            own.append(node)
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                todo.extend(ast.iter_child_nodes(node))
        tests = [n for n in own if isinstance(n, ast.Call) and _is_event_test(n, names)]
        if len(tests) > 1:
            lines = ", ".join(str(t.lineno) for t in sorted(tests, key=lambda t: t.lineno))
            found.append(f"{where}:{fn.lineno} {fn.name} (isinstance at {lines})")
    return found


def test_no_isinstance_chain_over_event_types() -> None:
    """Two or more ``isinstance`` tests on event types in one function is a dispatch on the
    event type: give the types a table (``EventTable``) and a handler each instead. One test
    (a filter such as ``isinstance(e, WorkersStarted)`` in a listener) is not a chain."""
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100  # the package, not an empty folder
    chains = [c for p in paths for c in _chains(p.read_text(), str(p.relative_to(ROOT)))]
    assert chains == []


def test_the_chain_check_sees_a_chain() -> None:
    """The check above would catch the style it forbids (and an ``ev.`` prefix, a tuple)."""
    source = (
        "from tui_launch.core.model.events import Notice, Shutdown\n"
        "from tui_launch.core.model import events as ev\n"
        "def f(e):\n"
        "    if isinstance(e, Notice):\n"
        "        return 1\n"
        "    if isinstance(e, (ev.RunFinished, int)):\n"
        "        return 2\n"
        "def g(e):\n"
        "    return isinstance(e, Shutdown)\n"
    )
    assert _chains(source, "x.py") == ["x.py:3 f (isinstance at 4, 6)"]
    assert _event_names(ast.parse(source)) == {"Notice", "Shutdown"}
