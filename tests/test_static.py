"""Static guards, run by the suite so that the README's one test command (and CI) runs them:
ruff (lint and format), mypy over the package and the tests, and the import contracts in
pyproject.toml (``[tool.importlinter]``: the layers, what the core may import, no cycles).

Each check runs the tool as a subprocess from the repository root, exactly as a developer
would (``ruff check``, ``ruff format --check``, ``mypy``, ``lint-imports``), and shows the
tool's own report when it fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def _tool(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[test]')")


def test_ruff_check() -> None:
    _tool("ruff")
    p = _run("ruff", "check", ".")
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_format() -> None:
    _tool("ruff")
    p = _run("ruff", "format", "--check", ".")
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.slow
def test_mypy_package_and_tests() -> None:
    _tool("mypy")
    p = _run("mypy")  # files, paths and strictness: [tool.mypy] in pyproject.toml
    assert p.returncode == 0, p.stdout + p.stderr


def test_import_contracts() -> None:
    _tool("importlinter")
    exe = Path(sys.executable).parent / "lint-imports"
    p = subprocess.run(
        [str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert " 0 broken" in p.stdout, p.stdout
