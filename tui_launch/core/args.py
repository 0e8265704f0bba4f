"""tuilaunch's command line: torchrun's own parser plus a group of tuilaunch options.

The torchrun part is ``torch.distributed.run.get_args_parser()`` itself, so every flag of the
installed torch, both spellings, its defaults and its ``PET_*`` environment defaults work
unchanged, including flags added in later releases. tuilaunch's options live in their own
argument group, with names torchrun does not use, and are removed from the namespace handed
to torch. Errors are one line on stderr and exit status 2.
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
from dataclasses import dataclass
from typing import NoReturn

from tui_launch import __version__

USAGE_ERROR = 2
_OURS = "tl_"


class UsageError(Exception):
    """Bad input that must end the launch before anything starts (exit status 2)."""


@dataclass(frozen=True)
class Options:
    """tuilaunch's own options."""

    no_tui: bool
    journal: str | None
    no_confirm: bool = False
    refresh_hz: float = 4.0
    exit_on_finish: bool = False
    demo: bool = False
    gpu_interval: float = 1.0
    no_gpu: bool = False
    journal_samples: float = 10.0
    stack_samples: float = 5.0
    inject: tuple[str, ...] = ()
    inject_seed: int | None = None
    inject_ready: bool = False
    verbose: bool = False
    hang_timeout: float = 300.0
    on_hang: str = "dump"
    no_dump_on_failure: bool = False
    dump_via_faulthandler: bool = False
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"
    metrics_textfile: str | None = None
    warm_start: bool = False
    warm_import: tuple[str, ...] = ()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage block; one line is easier to read in CI logs.
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """torchrun's parser, renamed, with tuilaunch's option group added."""
    from torch.distributed.run import get_args_parser

    torch_parser = get_args_parser()
    parser = _Parser(
        prog="tuilaunch",
        description=(
            "torchrun with a cockpit: the same elastic launch (every torchrun flag below), "
            "a live dashboard on a terminal, root causes, logs, and restarts that work."
        ),
        epilog=(
            "Differences from torchrun: every rank's output is always kept in per-rank files; "
            f"restarts use a fresh rendezvous store ({'TORCH_DISABLE_SHARE_RDZV_TCP_STORE'}=1 "
            "unless you set it); a SIGKILLed launcher leaves no workers behind."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = parser.add_argument_group("torchrun options")
    for action in torch_parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if action.dest == "training_script":
            # Optional here so that `tuilaunch --demo` needs none; parse() requires it otherwise.
            action.nargs = "?"
            action.default = None
        group._add_action(action)
    ours = parser.add_argument_group("tuilaunch options")
    ours.add_argument(
        "--no-tui",
        dest=_OURS + "no_tui",
        action="store_true",
        help="Run headless: one line per event, worker output as torchrun shows it, and a "
        "summary at the end (the default when stdout is not a terminal).",
    )
    ours.add_argument(
        "--journal",
        dest=_OURS + "journal",
        metavar="PATH",
        default=None,
        help="Write the run's event journal (JSON lines) to PATH instead of "
        "journal.jsonl in the run's log directory.",
    )
    ours.add_argument(
        "--no-confirm",
        dest=_OURS + "no_confirm",
        action="store_true",
        help="Dashboard: do not ask y/n before kill, SIGTERM, stop, restart or quit.",
    )
    ours.add_argument(
        "--refresh-hz",
        dest=_OURS + "refresh_hz",
        type=float,
        default=4.0,
        metavar="HZ",
        help="Dashboard redraw rate (default 4; it redraws only when something changed).",
    )
    ours.add_argument(
        "--exit-on-finish",
        dest=_OURS + "exit_on_finish",
        action="store_true",
        help="Dashboard: leave as soon as the job ends instead of staying on the final state.",
    )
    ours.add_argument(
        "--demo",
        dest=_OURS + "demo",
        action="store_true",
        help="Run the dashboard on a small real CPU job (the example DDP trainer, 2 workers, "
        "one injected failure). No script needed.",
    )
    ours.add_argument(
        "--gpu-interval",
        dest=_OURS + "gpu_interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="Seconds between telemetry samples: every rank's CPU, RSS and state (psutil) and "
        "every GPU (NVML); temperature and power every fifth sample (default 1).",
    )
    ours.add_argument(
        "--no-gpu",
        dest=_OURS + "no_gpu",
        action="store_true",
        help="Do not use NVML at all (process telemetry stays on).",
    )
    ours.add_argument(
        "--journal-samples",
        dest=_OURS + "journal_samples",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="Write a telemetry sample to the journal every SECONDS (default 10; 0: never).",
    )
    ours.add_argument(
        "--stack-samples",
        dest=_OURS + "stack_samples",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="Read every rank's Python stack (py-spy --nonblocking) every SECONDS to infer a "
        "straggler (default 5; 0: off).",
    )
    ours.add_argument(
        "--inject",
        dest=_OURS + "inject",
        action="append",
        default=[],
        metavar="KIND[:KEY=VALUE,...]",
        help="Inject a failure on purpose, to rehearse recovery (repeatable). KIND: kill "
        "(signal=SIGKILL), hang (for=), slow (duty=50, period=1s, for=), exit (code=1), "
        "exception (message=), node (the node's workers and agent die at once). Keys for all: "
        "rank (global rank or random; 0), after (since the attempt's start: 500ms, 10s, 2m; "
        "0s), attempt (only in that attempt), times (in all, once per attempt; 1). E.g. "
        "--inject kill:rank=1,after=10s,times=3",
    )
    ours.add_argument(
        "--inject-seed",
        dest=_OURS + "inject_seed",
        type=int,
        default=None,
        metavar="N",
        help="Seed for rank=random in --inject: the same seed gives the same schedule.",
    )
    ours.add_argument(
        "--inject-ready",
        dest=_OURS + "inject_ready",
        action="store_true",
        help="Start Python workers through tuilaunch's small bootstrap so that the dashboard "
        "can inject exit and exception faults (implied by an --inject of those kinds).",
    )
    ours.add_argument(
        "--verbose",
        dest=_OURS + "verbose",
        action="store_true",
        help="End with the full summary (ranks, resources, attempts) even after a clean run; "
        "by default a clean success ends with a few lines.",
    )
    ours.add_argument(
        "--hang-timeout",
        dest=_OURS + "hang_timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="Suspect a hang when no rank has written any output for SECONDS (default 300, "
        "below NCCL's 10-minute collective timeout; 0: off); confirmed by a second stack dump "
        "about 10 s later whose stacks did not move.",
    )
    ours.add_argument(
        "--on-hang",
        dest=_OURS + "on_hang",
        choices=("dump", "restart", "stop"),
        default="dump",
        help="What a confirmed hang does: dump (the stacks; flag the ranks; keep running), "
        "restart (as a failure: spends the --max-restarts budget) or stop (exit 1).",
    )
    ours.add_argument(
        "--no-dump-on-failure",
        dest=_OURS + "no_dump_on_failure",
        action="store_true",
        help="Do not dump the surviving ranks' stacks when a rank fails (before torch "
        "terminates them; it adds up to 1 s to the restart).",
    )
    ours.add_argument(
        "--dump-via-faulthandler",
        dest=_OURS + "dump_via_faulthandler",
        action="store_true",
        help="Dump stacks without ptrace: Python workers start through tuilaunch's bootstrap "
        "with faulthandler on a real-time signal, and dumps are cut out of their stderr logs.",
    )
    ours.add_argument(
        "--metrics-port",
        dest=_OURS + "metrics_port",
        type=int,
        default=None,
        metavar="PORT",
        help="Serve Prometheus metrics (workers, restarts, per-rank and per-GPU telemetry) at "
        "http://127.0.0.1:PORT/metrics while the run lasts (off by default; see the README's "
        "Metrics section).",
    )
    ours.add_argument(
        "--metrics-bind",
        dest=_OURS + "metrics_bind",
        default=None,
        metavar="ADDR",
        help="The IP address --metrics-port listens on (default 127.0.0.1: this machine only; "
        "0.0.0.0 or :: for a Prometheus elsewhere).",
    )
    ours.add_argument(
        "--metrics-textfile",
        dest=_OURS + "metrics_textfile",
        default=None,
        metavar="DIR",
        help="Write the same metrics every 10 s to DIR/tuilaunch_<run-id>_<node>.prom, "
        "atomically, for node_exporter's textfile collector (no port); the last write marks "
        "the run finished. DIR must exist.",
    )
    ours.add_argument(
        "--warm-start",
        dest=_OURS + "warm_start",
        action="store_true",
        help="Keep a spare Python process per local rank with torch already imported; each "
        "attempt's workers (the first one too) start in the spares, so a restart does not pay "
        "for importing torch again. Spares are replaced at low priority while workers run. "
        "Not with --no-python or --numa-binding.",
    )
    ours.add_argument(
        "--warm-import",
        dest=_OURS + "warm_import",
        default=None,
        metavar="MOD,...",
        help="With --warm-start: modules the spares also import ahead of need "
        "(e.g. transformers,mypkg.model), found as the worker would find them.",
    )
    ours.add_argument("--version", action="version", version=f"tuilaunch {__version__}")
    return parser


DEMO_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "train_ddp.py")


def demo_argv() -> list[str]:
    """``--demo``: the example trainer, 2 workers, 3 restarts allowed."""
    return [
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        DEMO_SCRIPT,
        "--epochs",
        "12",
        "--snapshot-path",
        demo_snapshot_path(),
    ]


def demo_snapshot_path() -> str:
    """Where ``--demo``'s trainer keeps its snapshot: the launcher removes it at the end."""
    return os.path.join(tempfile.gettempdir(), f"tuilaunch-demo-{os.getpid()}.pt")


# --demo's failure: rank 1 SIGKILLed once, a few epochs into the first attempt, so that the
# dashboard shows a root cause and a restart that resumes from the snapshot.
DEMO_INJECT = "kill:rank=1,after=10s,attempt=0"


def torch_option_strings() -> set[str]:
    """Every option string torchrun accepts (for the parity test)."""
    from torch.distributed.run import get_args_parser

    return {s for a in get_args_parser()._actions for s in a.option_strings}


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Options]:
    """Parse the command line into torchrun's namespace and tuilaunch's options."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.tl_demo:
        if ns.training_script is not None:
            parser.error("--demo runs its own script: give no training script with it")
        given = [*(sys.argv[1:] if argv is None else argv)]
        ns = parser.parse_args([*given, "--inject", DEMO_INJECT, *demo_argv()])
    elif ns.training_script is None:
        parser.error("the following arguments are required: training_script")
    ours = {k[len(_OURS) :]: v for k, v in vars(ns).items() if k.startswith(_OURS)}
    if not ours.get("gpu_interval", 1.0) > 0:
        parser.error(f"--gpu-interval must be > 0, got {ours['gpu_interval']}")
    if not ours.get("hang_timeout", 0.0) >= 0:
        parser.error(f"--hang-timeout must be >= 0, got {ours['hang_timeout']}")
    if not ours.get("journal_samples", 0.0) >= 0:
        parser.error(f"--journal-samples must be >= 0, got {ours['journal_samples']}")
    if not ours.get("stack_samples", 0.0) >= 0:
        parser.error(f"--stack-samples must be >= 0, got {ours['stack_samples']}")
    ours["inject"] = tuple(ours.get("inject") or ())
    try:
        ours["warm_import"] = warm_modules(ours.get("warm_import"), bool(ours.get("warm_start")))
    except UsageError as e:
        parser.error(str(e))
    try:
        ours["metrics_bind"] = check_metrics_options(
            ours.get("metrics_port"), ours.get("metrics_bind"), ours.get("metrics_textfile")
        )
    except UsageError as e:
        parser.error(str(e))
    torch_args = argparse.Namespace(
        **{k: v for k, v in vars(ns).items() if not k.startswith(_OURS)}
    )
    return torch_args, Options(**ours)


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
