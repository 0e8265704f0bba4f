"""The run directory's layout: one module names every file (``core/model/layout.py``).

The unit tests pin the layout itself (old run directories must still read, so a name may not
change), torch's own ``DefaultLogsSpecs`` is checked to lay out what the module says, and a
contract refuses a layout string built anywhere else in the package.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from conftest import ROOT

from tui_launch.core.model import layout
from tui_launch.core.model.layout import STDERR, STDOUT, RunDirLayout

PACKAGE = ROOT / "tui_launch"
LAYOUT_MODULE = PACKAGE / "core" / "model" / "layout.py"


# ------------------------------------------------------------------ the layout


def test_every_path_of_a_run_directory():
    d = RunDirLayout("/runs/r_x1")
    assert d.journal == "/runs/r_x1/journal.jsonl"
    assert d.agent_log == "/runs/r_x1/agent.log"
    assert d.console_log == "/runs/r_x1/console.log"
    assert d.control_socket == "/runs/r_x1/control.sock"
    assert d.attempt_dir(3) == "/runs/r_x1/attempt_3"
    assert d.rank_dir(3, 1) == "/runs/r_x1/attempt_3/1"
    assert d.rank_log(3, 1, STDOUT) == "/runs/r_x1/attempt_3/1/stdout.log"
    assert d.rank_log(0, 0, STDERR) == "/runs/r_x1/attempt_0/0/stderr.log"
    assert d.error_file(2, 7) == "/runs/r_x1/attempt_2/7/error.json"
    assert d.stacks_dir == "/runs/r_x1/stacks"
    assert d.dump_dir("20261128-101500.123-hang") == "/runs/r_x1/stacks/20261128-101500.123-hang"
    assert d.flightrec_dir == "/runs/r_x1/flightrec"


def test_a_layout_over_nothing_is_relative_to_the_run_directory():
    d = RunDirLayout("")
    assert d.rank_log(1, 0, STDERR) == "attempt_1/0/stderr.log"
    assert d.journal == "journal.jsonl"


def test_paths_below_an_attempt_and_a_dump():
    assert layout.STREAMS == ("stdout", "stderr")
    assert layout.rank_log_in("/r/attempt_2", 3, STDOUT) == "/r/attempt_2/3/stdout.log"
    assert layout.stream_log("/r/attempt_2/3", STDERR) == "/r/attempt_2/3/stderr.log"
    assert layout.attempt_dir_of("/r/attempt_2/3") == "/r/attempt_2"
    assert layout.run_dir_of("/r/attempt_2") == "/r"
    assert layout.run_dir_of("/r/journal.jsonl") == "/r"
    assert layout.dump_files("/r/stacks/d") == ("/r/stacks/d/stacks.json", "/r/stacks/d/stacks.txt")
    assert layout.dump_record("/r/stacks/d", 5) == "/r/stacks/d/flightrec/rank5.json"
    assert layout.job_files("/r/stacks/d") == ("/r/stacks/d/job.json", "/r/stacks/d/job.txt")


def test_a_run_directory_or_its_journal_names_the_journal(tmp_path):
    assert layout.journal_of(str(tmp_path)) == str(tmp_path / "journal.jsonl")
    given = str(tmp_path / "elsewhere.jsonl")
    assert layout.journal_of(given) == given


def test_local_ranks_are_the_numbered_directories_of_an_attempt(tmp_path):
    d = RunDirLayout(str(tmp_path))
    for name in ("10", "2", "0", "filtered_stdout.log", "x1"):
        target = Path(d.attempt_dir(1)) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.mkdir() if name[0].isdigit() else target.write_text("")
    assert d.local_ranks(1) == [0, 2, 10]
    with pytest.raises(OSError):
        d.local_ranks(2)


def test_torch_lays_out_what_the_layout_says(tmp_path):
    """torch's DefaultLogsSpecs writes the rank files tuilaunch reads (and its own fallback
    writes, core/seam/logspecs.py): an upgrade that moves them fails here."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std

    specs = DefaultLogsSpecs(log_dir=str(tmp_path), redirects=Std.ALL, tee=Std.NONE)
    env = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "2"}
    dest = specs.reify({0: dict(env), 1: dict(env)})
    (run_dir,) = (p for p in tmp_path.iterdir() if p.name.startswith("job_"))
    d = RunDirLayout(str(run_dir))
    for lr in (0, 1):
        assert dest.stdouts[lr] == d.rank_log(2, lr, STDOUT)
        assert dest.stderrs[lr] == d.rank_log(2, lr, STDERR)
        assert dest.error_files[lr] == d.error_file(2, lr)
    assert d.local_ranks(2) == [0, 1]


# ------------------------------------------------------------------ the contract

# A string that is one of the run directory's names, whole (prose, which has spaces, is not).
_NAMES = re.compile(
    r"(^|/)(journal\.jsonl|agent\.log|console\.log|control\.sock|error\.json"
    r"|stacks\.(json|txt)|job\.(json|txt)|(stdout|stderr)\.log|rank\{\}\.json)$"
    r"|(^|/)attempt_(\d+|\{\})?(/|$)|^\{\}\.log$"
)
# Names that are words elsewhere too (a tab, a JSON key, a thread group): refused only where
# a path is built of them.
_DIRS = {"stacks", "flightrec"}


def _template(node: ast.JoinedStr) -> str:
    """An f-string with ``{}`` for each value: ``f"attempt_{n}"`` is ``attempt_{}``."""
    parts = []
    for v in node.values:
        parts.append(v.value if isinstance(v, ast.Constant) else "{}")
    return "".join(str(p) for p in parts)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _in_path(node: ast.AST) -> list[ast.AST]:
    """The operands a path is built of: ``os.path.join(...)``, ``Path(...)``, ``a / b``."""
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("join", "Path", "PurePath"):
            return list(node.args)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return [node.left, node.right]
    return []


def offences(source: str, filename: str = "<src>") -> list[str]:
    """Each place in ``source`` that builds a run-directory path from a layout string."""
    tree = ast.parse(source, filename)
    docs = _docstrings(tree)
    inside_fstring = {
        id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values
    }
    out = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.JoinedStr):
            text = _template(node)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and id(node) not in inside_fstring
        ):
            text = node.value
        text = text.strip() if text is not None else None  # a line's end is no prose
        if text is not None and not re.search(r"\s", text) and _NAMES.search(text):
            out.append(f"{filename}:{getattr(node, 'lineno', 0)}: {text!r}")
        for part in _in_path(node):
            if isinstance(part, ast.Constant) and part.value in _DIRS:
                out.append(f"{filename}:{part.lineno}: {part.value!r} in a path")
    return out


def test_the_contract_finds_what_it_refuses():
    src = '''
"""A docstring may say journal.jsonl and attempt_N/0/stdout.log."""
import os
from pathlib import Path
HELP = "the journal.jsonl in the run directory"
a = os.path.join(d, f"attempt_{n}", str(r), f"{stream}.log")
b = os.path.join(d, "stacks")
c = Path(d) / "flightrec" / f"rank{g}.json"
e = f"{d}/job.txt\\n"
f = "agent.log"
tab = {"stacks": 1}
'''
    found = sorted(line.split(": ", 1)[1] for line in offences(src))
    assert found == sorted(
        [
            "'attempt_{}'",
            "'{}.log'",
            "'stacks' in a path",
            "'flightrec' in a path",
            "'rank{}.json'",
            "'{}/job.txt'",
            "'agent.log'",
        ]
    )
    # and the layout module itself is where they are (the scan sees real code)
    assert offences(LAYOUT_MODULE.read_text(), str(LAYOUT_MODULE))


def test_no_layout_string_is_built_outside_the_layout_module():
    """Not in the package, and not in bench/, whose benchmarks lay out run directories too."""
    found = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "bench").glob("*.py")]):
        if path == LAYOUT_MODULE:
            continue
        found += offences(path.read_text(), os.path.relpath(path, ROOT))
    assert not found, (
        "the run directory's layout is core/model/layout.py's: take these paths from it\n"
        + "\n".join(found)
    )
