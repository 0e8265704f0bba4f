"""The README's two set-up commands are the ones CI and users run."""

from __future__ import annotations

import re

from conftest import ROOT


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n([^\n]*?python3 -m venv [^\n]+)\n```", text)


def test_readme_has_exactly_two_setup_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    demo, tests = cmds
    assert "tuilaunch " in demo and "examples/train_ddp.py" in demo
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in ci


def test_demo_script_exists():
    assert (ROOT / "examples" / "train_ddp.py").is_file()
