"""The agent's transitions as events, built from torch's objects.

Pure builders: each takes torch's worker spec, worker group or rendezvous handler (through the
typed shapes of :mod:`.agent` and the accessors of :mod:`.rendezvous`) and returns the event
the runner posts. Keeping them apart leaves the runner with the sequencing only.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from tui_launch import __version__
from tui_launch.core.launch.torchrun import TorchrunArgs
from tui_launch.core.launch.validate import min_max_nodes
from tui_launch.core.model import errors
from tui_launch.core.model.events import (
    Connecting,
    RankExited,
    RendezvousCompleted,
    RendezvousSample,
    RendezvousStarted,
    Restart,
    RunStarted,
    WorkerInfo,
)
from tui_launch.core.model.redact import redact_args, redact_env, redact_text, secret_name
from tui_launch.core.seam import rendezvous
from tui_launch.core.seam.agent import WorkerGroup, WorkerSpec
from tui_launch.core.workers.table import RankExit


def rdzv_conf(torchrun: TorchrunArgs) -> dict[str, str]:
    """``--rdzv-conf key=value,key=value`` as a dict (what torch would parse, leniently)."""
    out = {}
    for item in torchrun.rdzv_conf.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _seconds(value: str | None, default: float | None) -> float | None:
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default


def connecting(torchrun: TorchrunArgs) -> Connecting:
    """What the launcher contacts first, and for how long torch will try (before any agent)."""
    conf = rdzv_conf(torchrun)
    standalone = torchrun.standalone
    backend = "c10d" if standalone else torchrun.rdzv_backend
    endpoint = "localhost:0" if standalone else torchrun.rdzv_endpoint
    if backend == "static" and not endpoint:
        args = torchrun.namespace
        endpoint = f"{args.master_addr}:{args.master_port}"
    lo, hi = torchrun.node_range
    # torch's defaults: c10d's TCPStore waits read_timeout (60 s) for its store; every round
    # waits join_timeout (600 s) for MIN nodes.
    timeout = _seconds(conf.get("read_timeout"), 60.0) if backend == "c10d" else None
    return Connecting(
        backend=backend,
        endpoint=endpoint,
        min_nodes=lo,
        max_nodes=hi,
        timeout=timeout,
        join_timeout=_seconds(conf.get("join_timeout"), 600.0),
    )


def run_started(
    spec: WorkerSpec, args: argparse.Namespace, host: str, notes: tuple[str, ...]
) -> RunStarted:
    """The run as torch's agent was built: the command, the sizes, the rendezvous."""
    import torch

    handler = spec.rdzv_handler
    min_nodes, max_nodes = min_max_nodes(args.nnodes)
    script = [args.training_script, *args.training_script_args]
    if args.module:
        script = ["-m", *script]
    return RunStarted(
        # Redacted here, once: the journal, the headless lines, the dashboard and every
        # reader of the journal show these.
        entrypoint=redact_text(" ".join(script[:1])),
        args=redact_args(script[1:]),
        role=spec.role,
        nproc_per_node=spec.local_world_size,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        max_restarts=spec.max_restarts,
        backend=rendezvous.backend_name(handler, args),
        endpoint=rendezvous.endpoint(handler, args),
        run_id=rendezvous.run_id(handler, args),
        host=host,
        launcher_pid=os.getpid(),
        torch_version=torch.__version__,
        notes=notes,
        tuilaunch_version=__version__,
        command=redact_args(["tuilaunch", *sys.argv[1:]]),
        env=redact_env(run_env(os.environ)),
    )


# The environment variables that shape a run, by prefix (CUDA, NCCL, torch and its launcher,
# threads, the Python path, Hugging Face, Slurm); a secret-named one is listed, its value
# redacted, whatever its prefix.
RUN_ENV = (
    "CUDA_",
    "NCCL_",
    "TORCH",
    "PET_",
    "OMP_",
    "MKL_",
    "GLOO_",
    "MASTER_",
    "PYTHON",
    "HF_",
    "TRANSFORMERS_",
    "NVIDIA_",
    "SLURM_JOB",
    "SLURM_NTASKS",
    "WANDB_",
    "LD_LIBRARY_PATH",
    "CUBLAS_",
    "CUDNN_",
    "PYTORCH_",
    "KMP_",
    "FI_",
    "UCX_",
)
RUN_ENV_KEPT = 200  # variables at most, each value cut to RUN_ENV_VALUE characters
RUN_ENV_VALUE = 500


def run_env(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The variables of ``environ`` a report shows (sorted; not yet redacted)."""
    names = sorted(n for n in environ if n.startswith(RUN_ENV) or secret_name(n))
    return [(n, environ[n][:RUN_ENV_VALUE]) for n in names[:RUN_ENV_KEPT]]


def rendezvous_started(handler: Any, args: argparse.Namespace, attempt: int) -> RendezvousStarted:
    """A rendezvous round for ``attempt`` begins."""
    return RendezvousStarted(
        attempt=attempt,
        backend=rendezvous.backend_name(handler, args),
        endpoint=rendezvous.endpoint(handler, args),
        run_id=rendezvous.run_id(handler, args),
    )


def rendezvous_completed(
    wg: WorkerGroup,
    live: RendezvousSample | None,
    args: argparse.Namespace,
    attempt: int,
    duration: float,
) -> RendezvousCompleted:
    """The round is complete: this node's group rank, the world, the master, the members."""
    handler = wg.spec.rdzv_handler
    return RendezvousCompleted(
        attempt=attempt,
        round=live.round if live else None,
        backend=rendezvous.backend_name(handler, args),
        endpoint=rendezvous.endpoint(handler, args),
        run_id=rendezvous.run_id(handler, args),
        group_rank=int(wg.group_rank),
        group_world_size=int(wg.group_world_size),
        master_addr=str(wg.master_addr),
        master_port=int(wg.master_port or 0),
        participants=tuple(p.node for p in live.participants) if live else (),
        duration=duration,
    )


def workers(wg: WorkerGroup, pids: Mapping[int, Any]) -> tuple[WorkerInfo, ...]:
    """The attempt's workers with their pids (``pids``: torch's ``{local_rank: pid}``)."""
    return tuple(
        WorkerInfo(
            local_rank=w.local_rank,
            global_rank=w.global_rank,
            role_rank=w.role_rank,
            world_size=w.world_size,
            pid=int(pids[w.local_rank]),
        )
        for w in wg.workers
    )


def restart(cause: str, attempt: int, budget_left: int) -> Restart:
    """torch restarts the group after ``attempt`` (every restart so far counts in
    ``restarts_used``; only failures spend the budget)."""
    return Restart(
        cause=cause,
        from_attempt=attempt,
        to_attempt=attempt + 1,
        restarts_used=attempt + 1,
        budget_left=budget_left,
    )


def rank_exited(x: RankExit, attempt: int) -> RankExited:
    """A rank's exit, as the rank table first recorded it (same time stamp)."""
    return RankExited(
        attempt=attempt,
        local_rank=x.local_rank,
        global_rank=x.global_rank,
        pid=x.pid,
        exit_code=x.exit_code,
        signal=errors.signal_name(x.exit_code),
        by_agent=x.by_agent,
        wall=x.wall,
    )
