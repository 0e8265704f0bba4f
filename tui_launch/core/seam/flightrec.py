"""torch's Flight Recorder, armed for the workers (``--flight-recorder``): the launcher's side.

:func:`arm` sets the variables that arm the Flight Recorder in every worker
(``TORCH_FR_BUFFER_SIZE``; for NCCL the dump-on-timeout, dump file and dump pipe variables,
pointed into the directory it is given: a temporary one, whose files the run moves to
``<run dir>/flightrec/`` at its end) and names the responders' directory. A value the user set
wins; ``TORCH_FR_BUFFER_SIZE=0`` turns the recorder off and tuilaunch then falls back to stacks
alone.

The worker's side, the responder that reads the recorder inside each rank, runs in the worker
process and lives with the worker bootstrap: :mod:`tui_launch.core.workers.responder`. Only
variables are set here, none of torch's private API is used.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from tui_launch.core.workers.shim import RESPONDER_ENV

__all__ = ["BUFFER_ENV", "DEFAULT_BUFFER", "VARIABLES", "arm"]

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
# Entries each rank keeps: enough for a few steps of a model with many buckets, small in memory.
DEFAULT_BUFFER = "2000"
# NCCL only: dump on a watchdog timeout, into files of the run directory, and a pipe that
# triggers a dump when written to.
NCCL_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
NCCL_TEMP_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
FR_TEMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
NCCL_PIPE_FILE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
# Every variable :func:`arm` may set: the workers' environment differs from torchrun's by these
# (docs/differences.md lists them; tests/test_parity.py compares).
VARIABLES = (
    BUFFER_ENV,
    NCCL_DUMP_ON_TIMEOUT,
    NCCL_TEMP_FILE,
    FR_TEMP_FILE,
    NCCL_PIPE_FILE,
    RESPONDER_ENV,
)


def arm(env: MutableMapping[str, str], fr_dir: str, socket_dir: str | None) -> bool:
    """Arm the Flight Recorder in ``env`` (the launcher's, inherited by the workers).

    Returns False when the user turned it off (``TORCH_FR_BUFFER_SIZE=0``): nothing is set
    then, not even the responder's directory.
    """
    size = env.get(BUFFER_ENV, env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "")).strip()
    if size == "0":
        return False
    env.setdefault(BUFFER_ENV, size or DEFAULT_BUFFER)
    env.setdefault(NCCL_DUMP_ON_TIMEOUT, "1")
    stem = os.path.join(fr_dir, "nccl_trace_rank_")
    env.setdefault(NCCL_TEMP_FILE, stem)
    env.setdefault(FR_TEMP_FILE, stem)
    env.setdefault(NCCL_PIPE_FILE, os.path.join(fr_dir, "nccl_pipe_rank_"))
    if socket_dir:
        env[RESPONDER_ENV] = socket_dir
    return True
