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


# How the README writes a key -> how the action table does.
_README_KEY = {"↑": "up", "↓": "down"}


def _dashboard_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## The dashboard")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def _readme_key_table() -> dict[str, str]:
    """The README's ``| key | action |`` table: each documented key -> its row's action."""
    lines = _dashboard_section().splitlines()
    first = lines.index("| key | action |") + 2  # past the |---|---| line
    keys: dict[str, str] = {}
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        key_cell, action_cell = line.strip("|").split("|", 1)
        for key in re.findall(r"`([^`]+)`", key_cell):
            keys[_README_KEY.get(key, key)] = action_cell.strip()
    return keys


def test_readme_key_table_matches_the_action_table():
    """Every key of the dashboard's action table is in the README, and nothing else is."""
    from tui_launch.tui.actions import ACTIONS

    documented = _readme_key_table()
    ours = {key for action in ACTIONS for key in action.keys}
    assert sorted(ours - documented.keys()) == [], "keys missing from the README's table"
    assert sorted(documented.keys() - ours) == [], "README keys the dashboard does not have"


def test_readme_destructive_keys_match_the_action_table():
    from tui_launch.tui.actions import ACTIONS

    sentence = re.search(r"Destructive keys \(([^)]*)\)", _dashboard_section())
    assert sentence is not None
    documented = set(re.findall(r"`([^`]+)`", sentence.group(1)))
    assert documented == {key for a in ACTIONS if a.destructive for key in a.keys}


# ------------------------------------------------------------ links between the documents

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _anchors(path) -> set[str]:
    """The #anchors GitHub makes for a Markdown file's headings."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _documents() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_relative_links_resolve():
    """Every relative link in README.md and docs/*.md names an existing file, and every
    #anchor a heading of the file it points to."""
    broken = []
    for doc in _documents():
        for line in _prose(doc.read_text()):
            for target in _LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                path = (doc.parent / file).resolve() if file else doc
                where = f"{doc.relative_to(ROOT)}: {target}"
                if not path.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and (path.suffix != ".md" or anchor not in _anchors(path)):
                    broken.append(f"{where} (no such heading)")
    assert broken == []


def test_readme_links_every_docs_page():
    """The README is the front page: each page of docs/ is reachable from it."""
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for line in _prose((ROOT / "README.md").read_text())
        for target in _LINK.findall(line)
    }
    assert [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked] == []


# ------------------------------------------------------------ the exit status, said everywhere

# A statement of the exit status: a sentence that starts so.
_EXIT_STATEMENT = re.compile(r"^(\*\*)?(The exit status is|Exit codes|Exit status)\b")
_NUMBER = re.compile(r"(?<![\w.+#/-])(\d{1,3})(?![\w.%:/-])")
# What a statement may say of torchrun's own codes: "torchrun's (0, or 1 for every failure)".
_TORCHRUNS = re.compile(r"torchrun's \([^)]*\)")
# How the README said the wrong thing: the exit status is not torchrun's.
_TORCHRUN_CLAIM = re.compile(r"exit status is torchrun's|\(as torchrun\)", re.IGNORECASE)


def _sentences(lines: list[str]) -> list[str]:
    """The sentences of prose lines (paragraphs joined; table rows and list items apart)."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        text = line.strip()
        if not text or text.startswith(("|", "- ", "#")):
            paragraphs.append(" ".join(current))
            current = [text] if text.startswith("- ") else []
        else:
            current.append(text)
    return [s for p in paragraphs for s in re.split(r"(?<=\.)\s+(?=[A-Z`*])", p) if s]


def _exit_texts() -> dict[str, list[str]]:
    """The documents, the ``tuilaunch`` command's docstring and ``--help``, as prose lines."""
    from tui_launch import cli
    from tui_launch.core.launch.args import build_parser

    texts = {str(doc.relative_to(ROOT)): _prose(doc.read_text()) for doc in _documents()}
    texts["tui_launch/cli.py"] = (cli.__doc__ or "").splitlines()
    texts["tuilaunch --help"] = build_parser().format_help().splitlines()
    return texts


def test_exit_status_statements_match_the_table():
    """Each statement of the exit status (the README's, the command line page's, the
    command's docstring) lists the table of core/model/exitcodes.py: every code of it and no
    other but 128 + N; torchrun's codes only named as torchrun's, in parentheses. Nowhere does
    a text say the exit status is torchrun's."""
    from tui_launch.core.model.exitcodes import MEANINGS

    table = set(MEANINGS)
    signals = {128 + n for n in range(1, 65)}
    statements, claims = [], []
    for where, lines in _exit_texts().items():
        for sentence in _sentences(lines):
            if _TORCHRUN_CLAIM.search(sentence):
                claims.append(f"{where}: {sentence}")
            if _EXIT_STATEMENT.match(sentence):
                statements.append((where, sentence))
    assert claims == []
    assert {w for w, _ in statements} >= {"README.md", "docs/command-line.md", "tui_launch/cli.py"}
    wrong = []
    for where, sentence in statements:
        said = re.sub(r"128 ?\+ ?N\b", "", _TORCHRUNS.sub("", sentence))
        codes = {int(c) for c in _NUMBER.findall(said)}
        if not table <= codes or not codes <= table | signals:
            wrong.append(f"{where}: {sentence} (codes {sorted(codes)})")
    assert wrong == []


def test_on_hang_stop_transcripts_exit_75():
    """A transcript of `--on-hang stop` in the docs ends with the table's code for a hang."""
    from tui_launch.core.model.exitcodes import INFRASTRUCTURE

    wrong = []
    for doc in _documents():
        for block in re.findall(r"```[^\n]*\n(.*?)```", doc.read_text(), re.DOTALL):
            if "--on-hang stop" in block:
                codes = {int(c) for c in re.findall(r"exit code (\d+)", block)}
                if codes - {INFRASTRUCTURE}:
                    wrong.append(f"{doc.name}: exit code {sorted(codes)}")
    assert wrong == []
