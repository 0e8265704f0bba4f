"""Secrets out of what a run shows: arguments, variables and values that look like a secret.

Everything a run shows others goes through here: ``status`` (text and JSON), the MCP tools,
``report`` (HTML and Markdown), the headless lines and the dashboard header (both from the
journal's ``RunStarted``, redacted when it is made), the run index record (``ls``). Two tests,
either is enough:

- **by name**: the value of a command-line option or an environment variable whose *name*
  looks like a secret's (token, key, secret, password, credential, ...), in every form:
  ``--api-key X``, ``--api-key=X``, ``HF_TOKEN=X``, ``api_key:X``;
- **by shape**: a value that looks like a credential whatever it is passed as: AWS access key
  ids (``AKIA...``), Hugging Face (``hf_...``), GitHub (``ghp_...``, ``github_pat_...``),
  OpenAI-style (``sk-...``) and Slack (``xox.-...``) tokens, JWTs, long hex strings (32 or
  more digits) and long base64 strings (32 or more characters mixing upper case, lower case
  and digits), and the password of a URL (``scheme://user:password@host``).

A secret passed under an innocent name *and* of an innocent shape cannot be told from any
other value. Every function is idempotent (redacting twice gives the same text). Pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

REDACTED = "***"

# A name is a secret's when one of these words is part of it (HF_TOKEN, --api-key, db_password).
SECRET_NAME = re.compile(r"token|key|secret|passw|credential|auth|cookie|session", re.I)
# The password of a URL: scheme://user:password@host.
URL_PASSWORD = re.compile(r"(\w+://[^/\s:@]+:)[^/\s@]+(@)")
# A NAME=value assignment (an environment variable on a command line, a key=value option).
ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)([=:])(.*)$", re.S)

# Values shaped like a credential, wherever they stand (a bare argument, a value, inside text).
# Each is bounded by characters that cannot be part of it, so a longer word never half-matches.
_EDGE_L = r"(?<![A-Za-z0-9_+/=-])"
_EDGE_R = r"(?![A-Za-z0-9_+/=-])"
SECRET_SHAPES = re.compile(
    _EDGE_L
    + "(?:"
    + "|".join(
        (
            r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{12,}",  # AWS key ids
            r"hf_[A-Za-z0-9]{16,}",  # Hugging Face
            r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}",  # GitHub tokens
            r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained tokens
            r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI, Anthropic and the like
            r"xox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
            r"glpat-[A-Za-z0-9_-]{16,}",  # GitLab
            r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
            r"[0-9a-fA-F]{32,}",  # long hex: API keys, session ids, HMACs
        )
    )
    + ")"
    + _EDGE_R
)
# A long base64 (or base64url) word: 32 characters or more.
_BASE64 = re.compile(_EDGE_L + r"[A-Za-z0-9+/_-]{32,}={0,2}" + _EDGE_R)


def secret_name(name: str) -> bool:
    """Whether ``name`` (a flag or a variable, dashes and all) names a secret."""
    return SECRET_NAME.search(name) is not None


def _looks_base64(word: str) -> bool:
    # A random string of 32 base64 characters holds about 13 capitals, 13 small letters
    # and 5 digits; a path or a run's name (``runs/ResNet50_Epoch100``) is made of words,
    # with few capitals, and an absolute path starts with /.
    if word.startswith("/") or "//" in word:
        return False
    upper = sum(c.isupper() for c in word)
    lower = sum(c.islower() for c in word)
    return upper >= 4 and lower >= 4 and any(c.isdigit() for c in word)


def redact_text(value: str) -> str:
    """``value`` with the passwords of the URLs in it and every secret-shaped word in it
    replaced."""
    out = URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<2>", value)
    out = SECRET_SHAPES.sub(REDACTED, out)
    return _BASE64.sub(lambda m: REDACTED if _looks_base64(m.group(0)) else m.group(0), out)


def redact_args(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with secrets replaced: the values of secret-named options (``--token=abc``,
    ``--token abc``, the next argument unless it is itself an option, ``HF_TOKEN=abc``) and
    secret-shaped values anywhere (:func:`redact_text`)."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        m = ASSIGNMENT.match(arg)
        if m is not None and "://" not in arg[: m.end(2) + 2]:
            name, sep, value = m.groups()
            hidden = secret_name(name)
            out.append(f"{name}{sep}{REDACTED if hidden else redact_text(value)}")
            continue
        if arg.startswith("-") and secret_name(arg):
            hide_next = True
        out.append(redact_text(arg))
    return tuple(out)


def redact_env(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Environment ``(name, value)`` pairs with the values of secret-named variables
    replaced (and secret-shaped values, URL passwords, in the others)."""
    return tuple(
        (name, REDACTED if secret_name(name) else redact_text(value)) for name, value in items
    )


__all__ = [
    "REDACTED",
    "SECRET_SHAPES",
    "redact_args",
    "redact_env",
    "redact_text",
    "secret_name",
]
