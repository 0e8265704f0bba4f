"""Secrets out of what a run shows others: arguments and variables named like a secret.

A report or a journal is shared (attached to an issue, pasted in a channel), so the values of
command-line arguments and environment variables whose *name* looks like a secret (token, key,
secret, password, credential, ...) are replaced by :data:`REDACTED`, as are passwords in URLs
(``scheme://user:password@host``). The test is on names, not values: a secret that is passed
under an innocent name cannot be told from any other value. Pure functions, no I/O.
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
ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.S)


def secret_name(name: str) -> bool:
    """Whether ``name`` (a flag or a variable, dashes and all) names a secret."""
    return SECRET_NAME.search(name) is not None


def redact_text(value: str) -> str:
    """``value`` with the passwords of the URLs in it replaced."""
    return URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<2>", value)


def redact_args(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with the values of secret-named options replaced: ``--token=abc``,
    ``--token abc`` (the next argument, unless it is itself an option), ``HF_TOKEN=abc``."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        m = ASSIGNMENT.match(arg)
        if m is not None:
            name, value = m.groups()
            out.append(
                f"{name}={REDACTED}" if secret_name(name) else f"{name}={redact_text(value)}"
            )
            continue
        if arg.startswith("-") and secret_name(arg):
            hide_next = True
        out.append(redact_text(arg))
    return tuple(out)


def redact_env(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Environment ``(name, value)`` pairs with the values of secret-named variables
    replaced (and URL passwords in the others)."""
    return tuple(
        (name, REDACTED if secret_name(name) else redact_text(value)) for name, value in items
    )


__all__ = ["REDACTED", "redact_args", "redact_env", "redact_text", "secret_name"]
