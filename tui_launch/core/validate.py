"""Checks of the command line that torchrun would only make after starting (or never).

Each raises :class:`UsageError` with one line; the CLI prints it and exits with
:data:`USAGE_ERROR` (2) before anything starts. :mod:`.args` parses; this module judges.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import shutil
import socket
import sys
import tempfile

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad input that must end the launch before anything starts (exit status 2)."""


def warm_modules(text: str | None, warm_start: bool) -> tuple[str, ...]:
    """``--warm-import MOD,...`` as module names; :class:`UsageError` on a bad name, or
    without ``--warm-start``."""
    if text is None:
        return ()
    if not warm_start:
        raise UsageError("--warm-import needs --warm-start")
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(f"--warm-import: not a module name: {name!r}")
    if not names:
        raise UsageError("--warm-import needs at least one module name")
    return names


def validate_warm(args: argparse.Namespace, warm_start: bool) -> None:
    """``--warm-start`` with a launch it cannot serve is refused. Raises UsageError."""
    if not warm_start:
        return
    if args.no_python:
        raise UsageError(
            "--warm-start runs Python workers in spare interpreters; --no-python starts "
            f"{args.training_script} as a program of its own (use one or the other)"
        )
    if getattr(args, "numa_binding", None) is not None:
        raise UsageError(
            "--warm-start cannot apply --numa-binding: the spares are already running when "
            "the binding would be set (use one or the other)"
        )


def check_metrics_options(port: int | None, bind: str | None, textfile: str | None) -> str:
    """Check ``--metrics-port/-bind/-textfile`` before anything starts; return the bind address.

    The port is tried for real (bound, then closed at once) so that one already in use is a
    usage error here, not a failure after workers started. The exporter binds it again later
    and reports the rare port taken in between the same way.
    """
    if bind is not None and port is None:
        raise UsageError("--metrics-bind needs --metrics-port")
    bind = bind or "127.0.0.1"
    if port is not None:
        if not 1 <= port <= 65535:
            raise UsageError(f"--metrics-port must be 1-65535, got {port}")
        try:
            family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
        except ValueError:
            raise UsageError(
                f"--metrics-bind must be an IP address (127.0.0.1, 0.0.0.0, ::), got {bind!r}"
            ) from None
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As the server will: SO_REUSEADDR ignores TIME_WAIT, never a live listener.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((bind, port))
            except OSError as e:
                reason = e.strerror or type(e).__name__
                raise UsageError(
                    f"--metrics-port {port}: cannot listen on {bind}:{port} ({reason})"
                ) from None
    if textfile is not None:
        if not os.path.isdir(textfile):
            raise UsageError(f"--metrics-textfile {textfile} is not an existing directory")
        try:
            with tempfile.NamedTemporaryFile(dir=textfile, prefix=".tuilaunch-probe-"):
                pass
        except OSError as e:
            reason = e.strerror or type(e).__name__
            raise UsageError(
                f"--metrics-textfile {textfile} is not a writable directory ({reason})"
            ) from None
    return bind


def min_max_nodes(nnodes: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX`` as two ints; :class:`UsageError` on anything else."""
    parts = str(nnodes).split(":")
    try:
        if len(parts) == 1:
            lo = hi = int(parts[0])
        elif len(parts) == 2:
            lo, hi = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise UsageError(f"--nnodes must be N or MIN:MAX, got {nnodes!r}") from None
    if not 0 < lo <= hi:
        raise UsageError(f"--nnodes needs 0 < MIN <= MAX, got {nnodes!r}")
    return lo, hi


def validate(args: argparse.Namespace) -> None:
    """Check what torchrun would only find out after starting (or never). Raises UsageError."""
    min_max_nodes(args.nnodes)
    _check_nproc(args.nproc_per_node)
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.monitor_interval <= 0:
        raise UsageError(f"--monitor-interval must be > 0, got {args.monitor_interval}")
    if args.module and args.no_python:
        raise UsageError("-m/--module and --no-python cannot be used together")
    if args.local_ranks_filter:
        try:
            ranks = {int(r) for r in args.local_ranks_filter.split(",")}
        except ValueError:
            ranks = set()
        if not ranks or min(ranks) < 0:
            raise UsageError(
                f"--local-ranks-filter must be a comma-separated list of local ranks, "
                f"got {args.local_ranks_filter!r}"
            )
    _check_backend(args.rdzv_backend, args.standalone)
    _check_logs_specs(getattr(args, "logs_specs", None))
    _check_script(args)
    if args.log_dir:
        _check_log_dir(args.log_dir)


def validate_dump_options(args: argparse.Namespace, via_faulthandler: bool) -> None:
    """``--dump-via-faulthandler`` needs Python workers: with ``--no-python`` the program is
    not started through the worker bootstrap, so nothing could register faulthandler and every
    dump would silently be py-spy's. Refused (exit 2) rather than ignored: the user asked for
    dumps without ptrace, and would only find out at the first dump that there are none."""
    if via_faulthandler and args.no_python:
        raise UsageError(
            f"--dump-via-faulthandler needs a Python worker, and --no-python runs "
            f"{args.training_script} as a plain program (drop --dump-via-faulthandler: stacks "
            f"are then taken with py-spy, which needs ptrace)"
        )


def validate_injections(args: argparse.Namespace, texts: tuple[str, ...]) -> None:
    """Check every ``--inject`` before anything starts. Raises UsageError.

    Ranks are checked against the world size here when it is already certain (a fixed
    number of nodes and workers); otherwise the runner checks them once the rendezvous is done.
    """
    from tui_launch.core import inject

    try:
        specs = inject.parse_specs(texts)
        if args.no_python:
            for s in specs:
                if s.kind in inject.SHIM_KINDS:
                    raise inject.InjectError(
                        f"--inject {s.text!r}: {s.kind} needs a Python worker, and --no-python "
                        f"runs {args.training_script} as a plain program (use kill, hang, slow "
                        f"or node)"
                    )
        lo, hi = min_max_nodes(args.nnodes)
        if lo == hi and str(args.nproc_per_node).isdigit():
            inject.check_world_size(specs, hi * int(args.nproc_per_node))
    except inject.InjectError as e:
        raise UsageError(str(e)) from None


def _check_nproc(value: str) -> None:
    if value in ("auto", "cpu", "xpu"):
        return
    if value == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--nproc-per-node gpu: CUDA is not available on this machine")
        return
    try:
        n = int(value)
    except ValueError:
        raise UsageError(
            f"--nproc-per-node must be a positive integer or auto, cpu, gpu, xpu; got {value!r}"
        ) from None
    if n <= 0:
        raise UsageError(f"--nproc-per-node must be at least 1, got {n}")


def _check_backend(backend: str, standalone: bool) -> None:
    if standalone:
        return
    try:
        from torch.distributed.elastic.rendezvous import registry

        known = set(registry.handler_registry._registry)
    except Exception:  # private API moved: let torch itself complain
        return
    if known and backend not in known:
        raise UsageError(
            f"--rdzv-backend {backend!r} is not known; choose from {', '.join(sorted(known))}"
        )
    if backend in ("etcd", "etcd-v2") and importlib.util.find_spec("etcd") is None:
        # torch would fail later, inside the agent, with an import error.
        raise UsageError(
            f"--rdzv-backend {backend} needs the python-etcd package: "
            "pip install 'tuilaunch[etcd]' (or pip install python-etcd)"
        )


def _check_logs_specs(name: str | None) -> None:
    # torch looks the name up only inside the launch, after the run directory exists, and
    # fails with a ValueError (exit 1): a misspelt name is bad input, found before anything.
    if name is None:
        return
    from importlib import metadata

    known = sorted({ep.name for ep in metadata.entry_points(group="torchrun.logs_specs")})
    if name not in known:
        choices = f"installed: {', '.join(known)}" if known else "none is installed"
        raise UsageError(
            f"--logs-specs {name!r} is not a torchrun.logs_specs entry point ({choices})"
        )


def _check_script(args: argparse.Namespace) -> None:
    script = args.training_script
    if args.run_path or not (args.module or args.no_python):
        if not os.path.isfile(script):
            raise UsageError(f"training script not found: {script}")
        return
    if args.no_python:
        if os.sep in script:
            if not os.path.isfile(script):
                raise UsageError(f"program not found: {script}")
            if not os.access(script, os.X_OK):
                raise UsageError(f"program is not executable: {script}")
        elif shutil.which(script) is None:
            raise UsageError(f"program not found on PATH: {script}")
        return
    # -m: look the top-level package up the way `python -m` will, from the current directory.
    top = script.split(".")[0]
    if not top:
        raise UsageError(f"not a module name: {script!r}")
    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        sys.path.pop(0)
    if not found:
        raise UsageError(f"module not found: {top} (for -m {script})")


def _check_log_dir(path: str) -> None:
    if path == os.devnull:
        return
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tuilaunch-probe-"):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UsageError(f"--log-dir {path} is not a writable directory ({reason})") from None
