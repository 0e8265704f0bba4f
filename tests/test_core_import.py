"""``tui_launch.core`` imports neither Textual nor rich (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess

from conftest import PY, ROOT, base_env

CHECK = r"""
import importlib, json, pkgutil, sys
import tui_launch.core as core

imported = []
for info in pkgutil.walk_packages(core.__path__, core.__name__ + "."):
    importlib.import_module(info.name)
    imported.append(info.name)
ui = sorted(
    m for m in sys.modules
    if m in ("textual", "rich") or m.startswith(("textual.", "rich."))
)
print(json.dumps({"imported": imported, "ui": ui}))
"""

EXPECTED = {
    "tui_launch.core." + name
    for name in (
        "runner",
        "store",
        "events",
        "logs",
        "journal",
        "args",
        "errors",
        "text",
        "reaper",
        "agent",
        "control",
        "failures",
        "faults",
        "handle",
        "logspecs",
        "membership",
        "reports",
        "rundir",
        "shutdown",
        "workers",
    )
}


def test_core_imports_neither_textual_nor_rich():
    p = subprocess.run(
        [PY, "-c", CHECK], cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    # Every core module was imported (the walk found them), not just the package.
    assert set(result["imported"]) >= EXPECTED, result["imported"]
    assert result["ui"] == []


def test_ui_packages_are_importable():
    """The check above is meaningful: textual and rich are installed and would show up."""
    p = subprocess.run(
        [
            PY,
            "-c",
            "import sys, rich.console, textual.app; "
            "print(sorted(m for m in sys.modules if m in ('rich', 'textual')))",
        ],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['rich', 'textual']"
