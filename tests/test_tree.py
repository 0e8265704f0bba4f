"""The tree is the map: what the import contracts and the module lists cannot see for themselves.

``lint-imports`` (tests/test_static.py) checks every ``import`` statement against the layers of
pyproject.toml, but an import by name (``importlib.import_module("tui_launch....")``,
``__import__``) is a string to it: such an edge would climb the layers unseen. So an import by
name is allowed only where a test below says why.
"""

from __future__ import annotations

import ast

from conftest import ROOT

PACKAGE = ROOT / "tui_launch"

# Every module of the package that imports by name, and why it must.
BY_NAME = {
    # the subcommand's module, picked from argv: `tuilaunch ls` never imports the launcher's.
    "cli.py": "tui_launch",
    # the PEP 562 lazy face: `tuilaunch.metrics.X` imports its module on first use only.
    "metrics/__init__.py": "tui_launch",
    # the MCP SDK's ToolError, whose module moved between mcp 1 and 2: not ours.
    "apps/mcp.py": "mcp",
    # --warm-import: the user's modules, imported ahead in the spare interpreter: not ours.
    "core/workers/spare.py": "the user's",
}
# Where the names imported are our own modules; elsewhere a name may never be ours.
OURS = {path for path, whose in BY_NAME.items() if whose == "tui_launch"}


def _by_name(tree: ast.AST) -> list[ast.Call]:
    """The calls of ``importlib.import_module``, ``import_module`` and ``__import__``."""
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in ("import_module", "__import__"):
            calls.append(node)
    return calls


def _names_ours(call: ast.Call) -> bool:
    """Whether the call's first argument can be seen to name a module of tui_launch."""
    if not call.args:
        return False
    arg = call.args[0]
    text = ast.unparse(arg)
    return "tui_launch" in text or "__name__" in text or "__package__" in text


def _modules() -> list[tuple[str, ast.AST]]:
    return [
        (p.relative_to(PACKAGE).as_posix(), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def test_imports_by_name_only_where_needed() -> None:
    found = {path for path, tree in _modules() if _by_name(tree)}
    assert found <= set(BY_NAME), (
        f"{sorted(found - set(BY_NAME))} import by name, which the import contracts cannot see: "
        "use an import statement (a function-level one keeps a start fast)"
    )
    assert set(BY_NAME) <= found, f"{sorted(set(BY_NAME) - found)} no longer import by name"


def test_only_the_lazy_faces_import_our_modules_by_name() -> None:
    for path, tree in _modules():
        for call in _by_name(tree):
            if _names_ours(call):
                assert path in OURS, f"{path}:{call.lineno}: {ast.unparse(call)} hides an import"


def test_the_check_sees_a_hidden_import() -> None:
    """Not vacuous: the by-name imports the check exists for are found."""
    for line in (
        'importlib.import_module("tui_launch.core.seam.flightrec")',
        "__import__('tui_launch.core.seam')",
        'import_module(f"{__name__}.x")',
    ):
        (call,) = _by_name(ast.parse(line))
        assert _names_ours(call)
    (call,) = _by_name(ast.parse("__import__(name)"))
    assert not _names_ours(call)
