"""The tree is the map: the checks that keep the contracts and the module map true to the files.

- Imports by name: ``lint-imports`` (tests/test_static.py) checks every ``import`` statement
  against the layers of pyproject.toml, but an import by name
  (``importlib.import_module("tui_launch....")``, ``__import__``) is a string to it: such an
  edge would climb the layers unseen. So an import by name is allowed only where
  :data:`BY_NAME` says why.
- Private names stay in their module: a module that imports another's ``_name`` shares an
  implementation detail, which is a sign the two were cut by size rather than by concept.
- The module map: docs/ARCHITECTURE.md lists every package (and the modules outside one), each
  package's ``__init__`` docstring lists its modules; a module missing from either, or a name
  there that is no longer a module, fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


def test_no_private_name_crosses_a_module() -> None:
    crossing = [
        f"{path}: from {node.module} import {alias.name}"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.level > 0 or (node.module or "").startswith("tui_launch"))
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert not crossing, f"private names imported from another module: {crossing}"


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# A docstring's list item that names a module: "- ``name``: what it is".
ITEM = re.compile(r"^\s*- ``([A-Za-z_][\w]*)``", re.MULTILINE)


def _packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def _members(package: Path) -> set[str]:
    """The modules and subpackages of ``package``, by the name an import uses."""
    names = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return names | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def _docstring(package: Path) -> str:
    tree = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    return ast.get_docstring(tree) or ""


def test_every_package_docstring_lists_its_modules() -> None:
    missing = {
        package.relative_to(ROOT).as_posix(): sorted(
            m for m in _members(package) if f"``{m}``" not in _docstring(package)
        )
        for package in _packages()
    }
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"modules missing from their package's docstring (as ``name``): {missing}"


def test_no_package_docstring_lists_a_module_that_is_gone() -> None:
    gone = {
        package.relative_to(ROOT).as_posix(): sorted(
            set(ITEM.findall(_docstring(package))) - _members(package)
        )
        for package in _packages()
    }
    gone = {k: v for k, v in gone.items() if v}
    assert not gone, f"package docstrings list modules that do not exist: {gone}"


def _map_section() -> str:
    """docs/ARCHITECTURE.md's "Packages" section, where every path is relative to tui_launch/."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("\n## Packages\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_architecture_lists_every_package() -> None:
    section = _map_section()
    named = set(re.findall(r"`([\w/]+/)`", section))
    packages = {p.relative_to(PACKAGE).as_posix() + "/" for p in _packages() if p != PACKAGE}
    assert packages <= named, f"packages missing from docs/ARCHITECTURE.md: {packages - named}"
    assert named <= packages, (
        f"docs/ARCHITECTURE.md names packages that are gone: {named - packages}"
    )
    # The modules that are in no package but the root (and core's own loop).
    loose = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    loose |= {f"core/{p.name}" for p in (PACKAGE / "core").glob("*.py") if p.name != "__init__.py"}
    files = set(re.findall(r"`([\w/]+\.py)`", section))
    assert loose <= files, f"modules missing from docs/ARCHITECTURE.md: {loose - files}"
    gone = {f for f in files if not (PACKAGE / f).is_file()}
    assert not gone, f"docs/ARCHITECTURE.md names modules that are gone: {gone}"


def test_the_map_checks_see_a_drift() -> None:
    """Not vacuous: a list item is read as a module name, and the members include subpackages."""
    assert ITEM.findall("Intro.\n\n- ``table``: the rank table.\n- ``shim``: the bootstrap.") == [
        "table",
        "shim",
    ]
    assert {"events", "reducers", "store"} <= _members(PACKAGE / "core" / "model")
