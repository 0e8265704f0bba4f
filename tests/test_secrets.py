"""Issue 32: no secret of a run's command line reaches anything a run shows.

Unit: :mod:`tui_launch.core.model.redact` by name (one-word and two-word forms) and by value
shape (AWS, Hugging Face, GitHub, OpenAI-style keys, JWTs, long hex and base64, URL
passwords), and what it must leave alone (paths, ports, run ids, a run's name).

A real launch whose program arguments and environment carry a secret of each form: none of
the secret values is in the headless output, the journal (or any file of the run directory
but the worker's own output), the run index, ``status`` (text and JSON), ``ls``, the MCP
tools (the SDK's own client), the report (HTML and Markdown) or the dashboard's header.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PY, ROOT, WORKERS, base_env, journal_path

from tui_launch.core.model.redact import REDACTED, redact_args, redact_env, redact_text
from tui_launch.core.remote import runindex

GHP = "ghp_0123456789abcdefghijABCDEFGHIJ08"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMCJ9.c2lnbmF0dXJlLXNlY3JldC0xMA"
HEX = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822c"
B64 = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLE12"
# (argument(s), the secret in them): each form once.
SECRETS: list[tuple[list[str], str]] = [
    (["--api-key", "AKIAZ3EXAMPLE7SECRT1"], "AKIAZ3EXAMPLE7SECRT1"),  # two-word, AWS shape
    (["--token=tok-name-only-secret-2"], "tok-name-only-secret-2"),  # one-word
    (["--password", "hunter2-secret-3"], "hunter2-secret-3"),
    (["--secret=s3cr3t-value-4"], "s3cr3t-value-4"),
    (["MY_SERVICE_KEY=svc-key-secret-5"], "svc-key-secret-5"),  # *_KEY=
    (["--db_passwd", "pwd-secret-6"], "pwd-secret-6"),
    # By shape alone, under innocent names or none.
    (["hf_AbCdEfGhIjKlMnOpQrStUv07"], "hf_AbCdEfGhIjKlMnOpQrStUv07"),
    (["--repo-ref", GHP], GHP),
    (["--model-ref", "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm09"], "sk-proj-Zx9Yw8Vu7Ts6Rq5Po4Nm09"),
    (["--header", JWT], JWT),
    (["--run-tag", HEX], HEX),
    (["--blob=" + B64], B64),
    (["--data-url", "https://alice:pa55-secret-13@example.com/d"], "pa55-secret-13"),
]
ENV_SECRETS = {"WANDB_API_KEY": "env-secret-value-14", "HF_TOKEN": "env-secret-value-15"}
# What must survive: the program, its innocent options, a path, a run's name.
KEPT = ["--ticks", "3", "--out", "/data/runs/ResNet50_ep100", "--tag", "ResNet50_Epoch100_lr1e-3"]


@pytest.mark.parametrize(("args", "secret"), SECRETS)
def test_each_form_is_redacted(args: list[str], secret: str) -> None:
    out = redact_args(args)
    assert secret not in " ".join(out) and REDACTED in " ".join(out), out
    assert redact_args(out) == out  # idempotent: a record redacted twice is the same


def test_innocent_values_are_kept() -> None:
    args = [*KEPT, "localhost:29500", "--lr=0.001", "17d96a0f-fe4a-4c4e-877e-b831e124c018"]
    assert redact_args(args) == tuple(args)
    assert redact_text("see https://example.com/a/b?x=1") == "see https://example.com/a/b?x=1"
    assert redact_env([("CUDA_HOME", "/usr/local/cuda")]) == (("CUDA_HOME", "/usr/local/cuda"),)
    leaked = redact_env([("WANDB_BASE_URL", "https://u:pw9@h"), ("PYTHONX", "hf_" + "a1B2" * 6)])
    assert leaked == (("WANDB_BASE_URL", f"https://u:{REDACTED}@h"), ("PYTHONX", REDACTED))


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "tui_launch", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.timeout(600)
def test_no_secret_in_any_output_of_a_real_run(tuilaunch, tmp_path: Path) -> None:
    secret_args = [a for args, _ in SECRETS for a in args]
    env = base_env(**ENV_SECRETS)
    job = tuilaunch(
        "--standalone", "--nproc-per-node", "1", "--log-dir", str(tmp_path / "logs"),
        str(WORKERS / "ticker.py"), *KEPT, *secret_args, env=env,
    )  # fmt: skip
    assert job.wait(120) == 0, job.output[-3000:]
    secrets = [s for _, s in SECRETS] + list(ENV_SECRETS.values())
    journal = journal_path(job.output)
    run_dir = journal.parent
    outputs: dict[str, str] = {"launcher output": job.output}
    # Every file of the run directory but the worker's own output (what the program prints
    # is its business), and every file of the run index.
    for path in run_dir.rglob("*"):
        if path.is_file() and path.name not in ("stdout.log", "stderr.log"):
            outputs[str(path)] = path.read_text(errors="replace")
    for path in runindex.index_dir(create=False).iterdir():
        outputs[str(path)] = path.read_text(errors="replace")
    status_json = _run("status", str(job.pid), "--json", env=env)
    outputs["status --json"] = status_json.stdout
    outputs["status"] = _run("status", str(job.pid), env=env).stdout
    outputs["ls"] = _run("ls", env=env).stdout
    for fmt in ("html", "md"):
        out = tmp_path / f"report.{fmt}"
        done = _run("report", str(run_dir), "-o", str(out), "--format", fmt, env=env)
        assert done.returncode == 0, done.stderr
        outputs[f"report {fmt}"] = out.read_text()
    if _has_mcp():
        calls = [
            ["status", {"run": str(job.pid)}],
            ["why", {"run": str(job.pid)}],
            ["list_runs", {}],
        ]
        done = subprocess.run(
            [PY, str(ROOT / "tests" / "mcp_client.py"), json.dumps(calls)],
            env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads(done.stdout)["results"]
        assert not any(error for error, _ in results), results
        outputs["mcp"] = "\n".join(text for _, text in results)
    outputs["dashboard header"] = _header(journal)
    # What was shown is the run: the program and its innocent arguments are there.
    doc = json.loads(status_json.stdout)
    assert doc["run"]["entrypoint"][: 1 + len(KEPT)] == [str(WORKERS / "ticker.py"), *KEPT]
    assert f"ticker.py {' '.join(KEPT)} " in outputs["dashboard header"]
    leaks = [(where, s) for where, text in outputs.items() for s in secrets if s in text]
    assert leaks == [], leaks
    assert all(REDACTED in outputs[k] for k in ("ls", "report md", "status --json"))


def _has_mcp() -> bool:
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


def _header(journal: Path) -> str:
    """The dashboard's header over the run's journal, as its replay shows it."""
    from tui_launch.core.journal.writer import read_journal
    from tui_launch.core.model.store import replay
    from tui_launch.tui.panels.render import header

    snap = replay(read_journal(str(journal)))
    return header(snap, time.monotonic()).plain
