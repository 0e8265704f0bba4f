"""``tui_launch.core`` imports neither Textual nor rich (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import PY, ROOT, base_env

# Every test imports the package in a fresh interpreter.
pytestmark = pytest.mark.slow

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
    "tui_launch.core.run.runner",
    "tui_launch.core.model.store",
    "tui_launch.core.model.events",
    "tui_launch.core.logs.tail",
    "tui_launch.core.journal.writer",
    "tui_launch.core.launch.args",
    "tui_launch.core.model.errors",
    "tui_launch.core.model.text",
    "tui_launch.core.workers.reaper",
    "tui_launch.core.seam.agent",
    "tui_launch.core.run.control",
    "tui_launch.core.run.failures",
    "tui_launch.core.run.faults",
    "tui_launch.core.run.handle",
    "tui_launch.core.seam.logspecs",
    "tui_launch.core.run.membership",
    "tui_launch.core.run.reports",
    "tui_launch.core.run.rundir",
    "tui_launch.core.run.shutdown",
    "tui_launch.core.workers.table",
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


HEAVY = r"""
import json, sys
{code}
print(json.dumps(sorted(m for m in ("pynvml", "psutil") if m in sys.modules)))
"""


def _loaded_after(code: str) -> list[str]:
    """Which of pynvml and psutil a fresh interpreter has loaded after running ``code``."""
    env = base_env()
    env.pop("TUILAUNCH_FAKE_NVML", None)  # the real module, as in a real run
    p = subprocess.run(
        [PY, "-c", HEAVY.format(code=code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_store_and_the_telemetry_package_load_neither_nvml_nor_psutil():
    """The pure reducer needs only the telemetry view; the package's names load on first use;
    the samplers' modules load NVML and psutil only when a sampler opens."""
    assert _loaded_after("import tui_launch.core.model.store") == []
    assert _loaded_after("import tui_launch.core.telemetry, tui_launch.core.model.telemetry") == []
    assert _loaded_after("from tui_launch.core.telemetry import Telemetry, RankTarget") == []


def test_the_check_above_sees_nvml_and_psutil_when_they_load():
    """Opening the sampler does load them, so the empty lists above mean something."""
    code = "from tui_launch.core.telemetry import Telemetry\nTelemetry(print).open()"
    assert _loaded_after(code) == ["psutil", "pynvml"]
