"""torchrun's arguments as tuilaunch reads them: one typed, frozen record.

torch's own namespace (``torch.distributed.run.parse_args``) goes to torch unchanged
(:attr:`TorchrunArgs.namespace`); what tuilaunch itself reads of it is read here, once, each
field with the value it takes when the namespace has no such attribute: an older torch
(``--signals-to-handle`` appeared in 2.8, ``--shutdown-timeout`` later), or a namespace a test
made by hand. The parts of a run read these fields instead of ``getattr(args, name, default)``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from tui_launch.core.launch.validate import min_max_nodes

# torch's agent waits this long between its SIGTERM and its SIGKILL when neither
# --shutdown-timeout nor TORCH_ELASTIC_SHUTDOWN_TIMEOUT says otherwise.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0


@dataclass(frozen=True)
class TorchrunArgs:
    """The torchrun arguments tuilaunch reads itself (:meth:`read` them from the namespace).

    Attributes:
        namespace: torch's own namespace, for torch (``run``) and the seam.
        nnodes: ``--nnodes``: ``N`` or ``MIN:MAX``.
        nproc_per_node: ``--nproc-per-node`` as given (a number, or auto, cpu, gpu, xpu).
        rdzv_id: ``--rdzv-id`` (None: the namespace has none).
        rdzv_backend, rdzv_endpoint, rdzv_conf: the rendezvous options ("" when absent).
        standalone: ``--standalone``.
        max_restarts: ``--max-restarts``.
        monitor_interval: ``--monitor-interval`` in seconds (0.1 when absent or 0).
        shutdown_timeout: seconds between torch's SIGTERM and its SIGKILL: ``--shutdown-timeout``
            where torch has it, else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30.
        signals_to_handle: ``--signals-to-handle`` (None: torch before 2.8, or not given).
        no_python: ``--no-python``.
        log_dir: ``--log-dir`` (None: torch picks a temporary directory).
        duplicate_stdout_filters, duplicate_stderr_filters: the duplicate filters of each
            stream (torch's ``--duplicate-stdout-filters``, ``--duplicate-stderr-filters``).
    """

    namespace: argparse.Namespace = field(compare=False, repr=False)
    nnodes: str = "1"
    nproc_per_node: str = "1"
    rdzv_id: str | None = None
    rdzv_backend: str = ""
    rdzv_endpoint: str = ""
    rdzv_conf: str = ""
    standalone: bool = False
    max_restarts: int = 0
    monitor_interval: float = 0.1
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    signals_to_handle: str | None = None
    no_python: bool = False
    log_dir: str | None = None
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()

    @classmethod
    def read(cls, ns: argparse.Namespace) -> TorchrunArgs:
        """Read torchrun's namespace once (an attribute it lacks takes the field's default)."""

        def get(name: str, default: Any = None) -> Any:
            return getattr(ns, name, default)

        return cls(
            namespace=ns,
            nnodes=str(get("nnodes", "1")),
            nproc_per_node=str(get("nproc_per_node", "1")),
            rdzv_id=None if get("rdzv_id") is None else str(get("rdzv_id")),
            rdzv_backend=str(get("rdzv_backend") or ""),
            rdzv_endpoint=str(get("rdzv_endpoint") or ""),
            rdzv_conf=str(get("rdzv_conf") or ""),
            standalone=bool(get("standalone", False)),
            max_restarts=int(get("max_restarts", 0)),
            monitor_interval=float(get("monitor_interval", 0.1) or 0.1),
            shutdown_timeout=_shutdown_timeout(get("shutdown_timeout")),
            signals_to_handle=get("signals_to_handle"),
            no_python=bool(get("no_python", False)),
            log_dir=get("log_dir"),
            duplicate_stdout_filters=tuple(get("duplicate_stdout_filters") or ()),
            duplicate_stderr_filters=tuple(get("duplicate_stderr_filters") or ()),
        )

    @property
    def node_range(self) -> tuple[int, int]:
        """``--nnodes`` as (MIN, MAX)."""
        return min_max_nodes(self.nnodes)

    @property
    def elastic(self) -> bool:
        """Whether ``--nnodes`` is a range (MIN < MAX): nodes may come and go."""
        lo, hi = self.node_range
        return lo < hi


def _shutdown_timeout(given: Any) -> float:
    t: Any = given
    if t is None:
        t = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(DEFAULT_SHUTDOWN_TIMEOUT))
    try:
        return float(t)
    except ValueError:
        return DEFAULT_SHUTDOWN_TIMEOUT
