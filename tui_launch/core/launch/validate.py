"""Checks of the command line that torchrun would only make after starting (or never).

Each raises :class:`UsageError` with one line; the CLI prints it and exits with
:data:`USAGE_ERROR` (2) before anything starts. :mod:`.args` parses; this module judges.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import ipaddress
import math
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile

from tui_launch.core.model.layout import RunDirLayout

USAGE_ERROR = 2

# The dashboard's redraw rate: a terminal shows no more than ~60 frames a second, and at
# 1e9 Hz the refresh timer starved the event loop (no frame, 100 % CPU, q and ^C unanswered).
MAX_REFRESH_HZ = 60.0
# torch keeps ranks and world sizes in 32-bit C ints: a larger world fails deep inside a
# C++ binding (pybind's TypeError) instead of as bad input.
MAX_WORLD_SIZE = 2**31 - 1
# The longest delay or interval any option takes (``--inject`` durations too). Longer ones are
# typing mistakes (1e20s, inf) that used to reach a timer and kill its thread with an
# OverflowError, the feature gone silently; a year is longer than any run and far below
# threading.TIMEOUT_MAX.
MAX_SECONDS = 365 * 24 * 3600.0


class UsageError(Exception):
    """Bad input that must end the launch before anything starts (exit status 2)."""


def seconds(option: str, value: float, *, zero: bool) -> float:
    """``value`` if it is a finite number of seconds within ``MAX_SECONDS`` (and > 0 unless
    ``zero`` allows 0, which means off); :class:`UsageError` otherwise."""
    low = ">= 0" if zero else "> 0"
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise UsageError(f"{option} must be a finite number of seconds {low}, got {value:g}")
    if value > MAX_SECONDS:
        raise UsageError(
            f"{option} {value:g}: at most {MAX_SECONDS:.0f} seconds (a year) is accepted"
        )
    return value


def refresh_hz(option: str, value: float) -> float:
    """A redraw rate: ``0 < value <= MAX_REFRESH_HZ``; :class:`UsageError` otherwise."""
    if not (math.isfinite(value) and 0 < value <= MAX_REFRESH_HZ):
        raise UsageError(
            f"{option} must be > 0 and at most {MAX_REFRESH_HZ:g} (frames a second; a "
            f"terminal shows no more), got {value:g}"
        )
    return value


def check_journal(path: str | None) -> None:
    """``--journal PATH``: a file in an existing directory, never created here, and not
    through another user's symlink. :class:`UsageError` otherwise.

    The symlink rule is the kernel's ``fs.protected_symlinks`` one, applied whatever that
    sysctl says: a link is followed only when its owner is us or the directory's owner. In a
    shared sticky directory (``/tmp``), another user could otherwise point the name at any
    file of ours (root's) and have the journal appended to it.
    """
    if path is None:
        return
    if path == "" or path.endswith(os.sep):
        raise UsageError(f"--journal needs a file path, got {path!r}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(
            f"--journal {path}: directory {parent} does not exist (create it first; "
            f"tuilaunch does not create it for a journal)"
        )
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        link = None
    except OSError as e:
        raise UsageError(f"--journal {path}: {e.strerror or type(e).__name__}") from None
    if link is not None and stat.S_ISLNK(link.st_mode):
        owner = os.stat(parent).st_uid
        if link.st_uid not in (os.geteuid(), owner):
            raise UsageError(
                f"--journal {path} is a symbolic link owned by uid {link.st_uid}, not by "
                f"you or the owner of {parent}: refused (it could point at any of your files)"
            )
    if os.path.isdir(path):
        example = RunDirLayout(path).journal
        raise UsageError(f"--journal {path} is a directory: give a file path (e.g. {example})")
    kind = _special_file(path)
    if kind is not None:
        # A FIFO's open() waits for a reader (the launch hung before its first line); a
        # terminal or a disk device would get JSON lines that replay, attach and status
        # cannot read back. /dev/null stays allowed: a run whose journal is thrown away.
        raise UsageError(
            f"--journal {path} is a {kind}, not a regular file: give a file path "
            "(the journal is read back by replay, attach and status)"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--journal {path}: directory {parent} is not writable")


_SPECIAL = (
    (stat.S_ISFIFO, "named pipe (FIFO)"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def _special_file(path: str) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor ``/dev/null``."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # not there (yet): the journal creates it
    if stat.S_ISREG(st.st_mode):
        return None
    with contextlib.suppress(OSError):
        null = os.stat(os.devnull)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev:
            return None
    return next((kind for test, kind in _SPECIAL if test(st.st_mode)), "special file")


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


def validate_bootstrap(no_bootstrap: bool, needs: list[str]) -> None:
    """``--no-bootstrap`` with an option that works through the worker bootstrap (``needs``:
    those given, as their flags) is refused. Raises UsageError."""
    if no_bootstrap and needs:
        raise UsageError(
            f"{needs[0]} works through tuilaunch's worker bootstrap, which --no-bootstrap "
            "turns off (use one or the other)"
        )


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


def check_metrics_options(
    port: int | None, bind: str | None, textfile: str | None, *, default_bind: str
) -> str:
    """Check ``--metrics-port/-bind/-textfile`` before anything starts; return the bind address
    (``default_bind``, the option's default, when ``--metrics-bind`` is not given).

    The port is tried for real (bound, then closed at once) so that one already in use is a
    usage error here, not a failure after workers started. The exporter binds it again later
    and reports the rare port taken in between the same way.
    """
    if bind is not None and port is None:
        raise UsageError("--metrics-bind needs --metrics-port")
    bind = bind or default_bind
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
    _, max_nodes = min_max_nodes(args.nnodes)
    nproc = _check_nproc(args.nproc_per_node)
    if max_nodes * (nproc or 1) > MAX_WORLD_SIZE:
        raise UsageError(
            f"--nnodes {args.nnodes} with {nproc or 1} worker(s) per node is a world of more "
            f"than {MAX_WORLD_SIZE} ranks (torch keeps ranks in 32-bit integers)"
        )
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    seconds("--monitor-interval", args.monitor_interval, zero=False)
    _check_run_id(getattr(args, "rdzv_id", None))
    _check_signals(getattr(args, "signals_to_handle", None))
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
    _check_torch_config(args)
    _check_script(args)


def validate_log_dir(args: argparse.Namespace) -> None:
    """``--log-dir``: created and probed for writing, so it comes after every other check
    (a refused launch must leave no directory behind). Raises UsageError."""
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


def max_nproc() -> int:
    """The most workers per node accepted: 8 per CPU of this machine, at least 64.

    Every worker is a process of its own (a Python interpreter, usually with torch: hundreds
    of MB); far more than the CPUs only thrash. An absurd count (99999999999999999999999) was
    accepted and torch's per-worker tables grew by 250 MB a second before anything started.
    """
    return max(64, 8 * (os.cpu_count() or 1))


def _check_nproc(value: str) -> int | None:
    """The number of workers per node, None for auto, cpu, gpu and xpu."""
    if value in ("auto", "cpu", "xpu"):
        return None
    if value == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--nproc-per-node gpu: CUDA is not available on this machine")
        return None
    try:
        n = int(value)
    except ValueError:
        raise UsageError(
            f"--nproc-per-node must be a positive integer or auto, cpu, gpu, xpu; got {value!r}"
        ) from None
    if n <= 0:
        raise UsageError(f"--nproc-per-node must be at least 1, got {n}")
    limit = max_nproc()
    if n > limit:
        raise UsageError(
            f"--nproc-per-node {n}: at most {limit} workers per node are accepted (8 per CPU "
            f"of this machine's {os.cpu_count() or 1}, at least 64; each worker is a process "
            f"of its own)"
        )
    return n


def _check_run_id(run_id: str | None) -> None:
    # The run directory is --log-dir/<rdzv-id>_XXXX: a separator would put it elsewhere
    # (--rdzv-id ../../x), and torch uses the id in store and etcd key paths as well.
    if run_id is None:
        return
    bad = [c for c in (os.sep, os.altsep, "\0") if c and c in run_id]
    if not run_id:
        raise UsageError("--rdzv-id must not be empty")
    if bad:
        raise UsageError(
            f"--rdzv-id {run_id!r}: it names the run's directory under --log-dir, so it "
            f"must hold no {' or '.join(repr(c) for c in bad)}"
        )


def _check_signals(names: str | None) -> None:
    # torch skips a name it does not know (with a log line) and then handles nothing of it:
    # SIGBOGUS would leave the launch deaf to the signals the user meant.
    if names is None:
        return
    for name in names.split(","):
        sig = getattr(signal, name.strip(), None)
        if not isinstance(sig, signal.Signals):
            raise UsageError(
                f"--signals-to-handle: {name.strip()!r} is not a signal name (e.g. SIGTERM,SIGUSR1)"
            )
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"--signals-to-handle: {sig.name} cannot be caught by any process")


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


# --rdzv-conf options torch reads as numbers or words, by backend (torch's c10d and static
# rendezvous handlers, created only once the launch has started): option -> (kind, rule).
_POSITIVE, _INT, _BOOL = "a whole number of seconds > 0", "a whole number", "true or false"
_RDZV_OPTIONS: dict[str, dict[str, str]] = {
    "c10d": {
        "read_timeout": _POSITIVE,
        "join_timeout": _POSITIVE,
        "last_call_timeout": _POSITIVE,
        "close_timeout": _POSITIVE,
        "heartbeat_timeout": _POSITIVE,
        "keep_alive_interval": _INT,
        "keep_alive_max_attempt": _INT,
        "is_host": _BOOL,
        "store_type": "tcp or file",
    },
    "static": {"timeout": _INT},
}
_STD = "0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank such as 0:3,1:2"


def _check_torch_config(args: argparse.Namespace) -> None:
    """What torch checks of its configuration only once the launch has started (in
    ``config_from_args`` and as it creates the rendezvous handler), where a mistake ends the
    run as the program's failure (exit 1) and leaves a run directory: ``--redirects`` and
    ``--tee``, ``--rdzv-conf`` and the options its backend reads, the endpoint's port and
    host. Judged with torch's own parsers where they are public."""
    from torch.distributed.elastic.multiprocessing import Std
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    for option in ("redirects", "tee"):
        value = getattr(args, option, None)
        try:
            Std.from_str(str(value if value is not None else "0"))
        except ValueError:
            raise UsageError(f"--{option} must be {_STD}; got {value!r}") from None
    conf = _rdzv_conf(str(getattr(args, "rdzv_conf", "") or ""))
    backend = "c10d" if args.standalone else args.rdzv_backend
    rules = _RDZV_OPTIONS.get(backend, {})
    for key, value in conf.items():
        if not _fits(rules.get(key), value):
            raise UsageError(f"--rdzv-conf {key}={value}: {key} must be {rules[key]}")
    if args.standalone:  # torch puts its own endpoint (localhost:0) in place of the user's
        return
    given = f"--rdzv-endpoint {args.rdzv_endpoint!r}"
    endpoint = args.rdzv_endpoint
    if backend == "static" and not endpoint:
        if getattr(args, "master_port", None) is None:
            return
        given, endpoint = (
            f"--master-port {args.master_port}",
            f"{args.master_addr}:{args.master_port}",
        )
    try:
        parse_rendezvous_endpoint(endpoint, default_port=0)
    except ValueError as e:
        what = (
            "port must be a number from 0 to 65535"
            if "port" in str(e)
            else ("host must be a name, an IPv4 address or an IPv6 address in brackets")
        )
        raise UsageError(f"{given}: the {what}") from None


def _rdzv_conf(text: str) -> dict[str, str]:
    """``--rdzv-conf KEY=VALUE,...`` as torch parses it, UsageError where torch would raise."""
    conf: dict[str, str] = {}
    if not text.strip():
        return conf
    for item in text.strip().split(","):
        key, _, value = (part.strip() for part in item.partition("="))
        if not key or not value:
            raise UsageError(
                f"--rdzv-conf {text!r}: every option must be KEY=VALUE, comma-separated "
                f"({item.strip()!r} is not)"
            )
        conf[key] = value
    return conf


def _fits(rule: str | None, value: str) -> bool:
    if rule in (_POSITIVE, _INT):
        try:
            number = int(value)
        except ValueError:
            return False
        return number > 0 or rule == _INT
    if rule == _BOOL:
        return value.lower() in ("1", "true", "t", "yes", "y", "0", "false", "f", "no", "n")
    if rule is not None:  # one of the words it names
        return value.lower() in rule.split(" or ")
    return True


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
