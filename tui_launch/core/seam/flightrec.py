"""torch's Flight Recorder, armed for the workers: the launcher's side.

:func:`worker_env` names the variables that arm the Flight Recorder in every worker
(``TORCH_FR_BUFFER_SIZE``; for NCCL the dump-on-timeout, dump file and dump pipe variables:
the dump files straight into ``<run dir>/flightrec/``, named with host, attempt and rank as
torch's analyser reads them, so that they outlive the job and its node-local temporary
directories; the pipes beside the sockets) and names the responders' directory. The run arms
it by default (the worker bootstrap is on unless ``--no-bootstrap``). A value the user set
wins; ``TORCH_FR_BUFFER_SIZE=0`` turns the recorder off and tuilaunch then falls back to stacks
alone.

The worker's side, the responder that reads the recorder inside each rank, runs in the worker
process and lives with the worker bootstrap: :mod:`tui_launch.core.workers.responder`. Only
variables are set here, none of torch's private API is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from tui_launch.core.workers.shim import RESPONDER_ENV

__all__ = ["BUFFER_ENV", "DEFAULT_BUFFER", "PIPE_STEM", "VARIABLES", "worker_env"]

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
# Entries each rank keeps: enough for a few steps of a model with many buckets, small in memory.
DEFAULT_BUFFER = "2000"
# NCCL only: dump on a watchdog timeout, into files of the run directory, and a pipe that
# triggers a dump when written to.
NCCL_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
NCCL_TEMP_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
FR_TEMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
NCCL_PIPE_FILE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
# Every variable :func:`worker_env` may set: the workers' environment differs from torchrun's
# by these (docs/differences.md lists them; tests/test_parity.py compares).
VARIABLES = (
    BUFFER_ENV,
    NCCL_DUMP_ON_TIMEOUT,
    NCCL_TEMP_FILE,
    FR_TEMP_FILE,
    NCCL_PIPE_FILE,
    RESPONDER_ENV,
)


# The pipes NCCL's watchdog reads (``<stem><rank>.pipe``): a byte written asks that rank's
# NCCL Flight Recorder to dump into its temp file.
PIPE_STEM = "nccl_pipe_rank_"


def worker_env(env: Mapping[str, str], socket_dir: str, dump_stem: str) -> dict[str, str] | None:
    """The variables that arm the Flight Recorder in one attempt's workers.

    ``env``: the launcher's environment (the workers inherit it: a variable the user set there
    is left to them); ``socket_dir``: a node-local directory for the responders' sockets and
    NCCL's pipes; ``dump_stem``: the start of the path of NCCL's own dump files of this attempt
    (the rank follows), in the run directory so that they outlive the job. None when the user
    turned the recorder off (``TORCH_FR_BUFFER_SIZE=0``): nothing is set then, not even the
    responder's directory.
    """
    size = env.get(BUFFER_ENV, env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "")).strip()
    if size == "0":
        return None
    wanted = {
        BUFFER_ENV: size or DEFAULT_BUFFER,
        NCCL_DUMP_ON_TIMEOUT: "1",
        NCCL_TEMP_FILE: dump_stem,
        FR_TEMP_FILE: dump_stem,
        NCCL_PIPE_FILE: os.path.join(socket_dir, PIPE_STEM),
    }
    out = {name: value for name, value in wanted.items() if name not in env}
    out[RESPONDER_ENV] = socket_dir
    return out
