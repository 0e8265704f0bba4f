"""What tuilaunch adds to the workers' environment so that their progress bars can be read.

A rank's stdout is a file under tuilaunch (its log), and rich draws its live display only on
a terminal: on a file, Lightning's default progress bar (``RichProgressBar``, chosen whenever
rich imports, which it does next to tuilaunch) prints nothing until training ends. rich (14
and later) takes ``TTY_COMPATIBLE=1`` to treat the file as a terminal; then it draws the bar in
place, with ``\\r`` and cursor codes, which the log view and the parser strip. Only rich reads
the variable, and only in the workers: the launcher's own console is left alone. A user who
set ``TTY_COMPATIBLE`` (any value; empty means rich's own detection, as under torchrun) keeps
their setting.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["RICH_TTY_ENV", "worker_env_defaults"]

#: rich's switch: ``1`` the output is a terminal, ``0`` it is not, empty or unset: ask isatty.
RICH_TTY_ENV = "TTY_COMPATIBLE"


def worker_env_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to every worker's environment, given the launcher's ``environ``
    (nothing the user set is overridden)."""
    return {} if RICH_TTY_ENV in environ else {RICH_TTY_ENV: "1"}
