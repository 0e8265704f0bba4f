"""tuilaunch's command line: torchrun's own parser plus a group of tuilaunch options.

The torchrun part is ``torch.distributed.run.get_args_parser()`` itself, so every flag of the
installed torch, both spellings, its defaults and its ``PET_*`` environment defaults work
unchanged, including flags added in later releases. tuilaunch's options live in their own
argument group, with names torchrun does not use, and are removed from the namespace handed
to torch. Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from tui_launch import __version__
from tui_launch.core.launch import slurm, validate
from tui_launch.core.launch.demo import DEMO_INJECT, demo_argv
from tui_launch.core.launch.signals import unknown_signals
from tui_launch.core.launch.slurm import SlurmError, SlurmPlan
from tui_launch.core.launch.validate import (
    USAGE_ERROR,
    UsageError,
    check_metrics_options,
    warm_modules,
)
from tui_launch.core.model.policy import parse_storm

_OURS = "tl_"


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
    flight_recorder: bool = False
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
    control_socket: bool = False
    detach: bool = False
    no_slurm: bool = False
    # Set by parse() inside a Slurm job (not an option): the job id, and how the allocation
    # filled in torchrun's options (said when the run starts).
    slurm_job: str | None = None
    slurm_notes: tuple[str, ...] = ()
    restart_policy: str = "smart"
    restart_storm: tuple[int, float] = (0, 10.0)
    exit_codes: str = "tuilaunch"
    preempt_signals: str = "SIGTERM,SIGUSR1"


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
            "unless you set it); a SIGKILLed launcher leaves no workers behind.\n\n"
            "subcommands (as the first argument; each has its own --help):\n"
            "  tuilaunch ls                           list this user's live, stale and "
            "recently ended runs\n"
            "  tuilaunch attach [RUN_DIR|PID|RUN_ID]  a read-only dashboard on a live run "
            "(--control: act on it)\n"
            "  tuilaunch replay RUN_DIR|JOURNAL       a run's journal in the dashboard, with "
            "a cursor to move through it\n"
            "  tuilaunch report RUN_DIR|JOURNAL       a run as one self-contained HTML page "
            "(--format md: Markdown)\n"
            "  tuilaunch status [RUN] [--json]        a run's state for scripts (versioned "
            "JSON schema)\n"
            "  tuilaunch ctl RUN VERB [--rank N]      kill|term|stop|cont|restart|dump|inject "
            "over the control socket\n"
            "  tuilaunch mcp [--control]              an MCP server (stdio) for coding agents "
            "on this user's runs\n"
            "  tuilaunch serve [RUN] [--control]      the dashboard in a browser, on 127.0.0.1 "
            "with a token"
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
        help="Dashboard redraw rate, at most 60 (default 4; it redraws only when something "
        "changed).",
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
        help="Write a telemetry and a progress sample to the journal every SECONDS (default 10; "
        "0: never, but each attempt's last progress).",
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
        "--flight-recorder",
        dest=_OURS + "flight_recorder",
        action="store_true",
        help="Collect every rank's Flight Recorder (torch's record of its collectives) and "
        "stacks through a responder thread of tuilaunch's bootstrap, for a collective-level "
        "hang verdict (implies the bootstrap; TORCH_FR_BUFFER_SIZE=0 turns it off).",
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
        "restart (as a failure: spends the --max-restarts budget) or stop (exit 75, an "
        "infrastructure failure).",
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
        "http://127.0.0.1:PORT/metrics while the run lasts (off by default; see "
        "docs/metrics.md).",
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
        help="Keep a spare Python process with torch already imported and fork each "
        "attempt's workers (the first one too) from it, so a restart does not pay for "
        "importing torch again. Not with --no-python or --numa-binding.",
    )
    ours.add_argument(
        "--warm-import",
        dest=_OURS + "warm_import",
        default=None,
        metavar="MOD,...",
        help="With --warm-start: modules the spare also imports ahead of need "
        "(e.g. transformers,mypkg.model), found as the worker would find them.",
    )
    ours.add_argument(
        "--control-socket",
        dest=_OURS + "control_socket",
        action="store_true",
        help="Listen on a Unix socket in the run directory (mode 0600, this user and root "
        "only; never TCP) so that 'tuilaunch attach --control' can kill, stop, restart, "
        "inject, dump and stop the job from another terminal. Off by default.",
    )
    ours.add_argument(
        "--detach",
        dest=_OURS + "detach",
        action="store_true",
        help="Start the job in the background, detached from this terminal (headless, its "
        "console output in console.log of the run directory, a hang-up does not stop it; "
        "implies --control-socket), print how to attach, and return at once.",
    )
    ours.add_argument(
        "--no-slurm",
        dest=_OURS + "no_slurm",
        action="store_true",
        help="Inside a Slurm job, do not take the rendezvous from the allocation (nodes, "
        "first host, job id, GPUs per node); by default each option you do not give comes "
        "from it (see docs/slurm-kubernetes.md).",
    )
    ours.add_argument(
        "--restart-policy",
        dest=_OURS + "restart_policy",
        choices=("smart", "torchrun"),
        default="smart",
        help="smart (default): no restart for a startup error, for the same exception at the "
        "same step twice (proven by its traceback), or for a crash after every rank's main "
        "returned; torchrun: restart every failure until --max-restarts is spent. "
        "See docs/restart-policy.md.",
    )
    ours.add_argument(
        "--restart-storm",
        dest=_OURS + "restart_storm",
        default="0",
        metavar="N,MINUTES",
        help="With --restart-policy smart: also stop after N failures within MINUTES minutes "
        "with no training step gained, whatever they were (default 0: off).",
    )
    ours.add_argument(
        "--exit-codes",
        dest=_OURS + "exit_codes",
        choices=("tuilaunch", "torchrun"),
        default="tuilaunch",
        help="tuilaunch (default): 0 success, 1 a program failure a retry will not fix, 2 bad "
        "usage, 75 an infrastructure failure a retry may fix, 143 preempted, 128+N another "
        "signal; torchrun: torchrun's (1 for every failure). See docs/restart-policy.md.",
    )
    ours.add_argument(
        "--preempt-signals",
        dest=_OURS + "preempt_signals",
        default="SIGTERM,SIGUSR1",
        metavar="SIG,...",
        help="Signals to the launcher that mean preemption (default SIGTERM,SIGUSR1: Slurm's "
        "--signal=B:USR1@60): forwarded to the workers, shown as PREEMPTED with the grace "
        "left (--shutdown-timeout), exit status 143. Empty: none.",
    )
    ours.add_argument("--version", action="version", version=f"tuilaunch {__version__}")
    return parser


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
    try:
        # Non-finite and absurd values are refused here: inf or 1e20 reached a timer and
        # killed its thread with a traceback, the feature gone for the rest of the run.
        validate.seconds("--gpu-interval", ours.get("gpu_interval", 1.0), zero=False)
        validate.seconds("--hang-timeout", ours.get("hang_timeout", 0.0), zero=True)
        validate.seconds("--journal-samples", ours.get("journal_samples", 0.0), zero=True)
        validate.seconds("--stack-samples", ours.get("stack_samples", 0.0), zero=True)
        validate.refresh_hz("--refresh-hz", ours.get("refresh_hz", 4.0))
        validate.check_journal(ours.get("journal"))
    except UsageError as e:
        parser.error(str(e))
    ours["inject"] = tuple(ours.get("inject") or ())
    slurm_plan = None
    if not ours.get("no_slurm") and not ns.tl_demo:
        try:
            slurm_plan = _slurm_plan(argv, os.environ, ns)
        except SlurmError as e:
            hint = "" if "--no-slurm" in str(e) else " (--no-slurm: launch without the allocation)"
            parser.error(f"{e}{hint}")
    if slurm_plan is not None:
        ns = slurm_plan.apply(ns)
        ours["slurm_job"] = slurm_plan.job.job_id
        ours["slurm_notes"] = slurm_plan.notes
    try:
        ours["restart_storm"] = parse_storm(str(ours.get("restart_storm") or "0"))
    except ValueError as e:
        parser.error(f"--restart-storm: {e}" if "--restart-storm" not in str(e) else str(e))
    bad = unknown_signals(ours.get("preempt_signals") or "")
    if bad:
        parser.error(f"--preempt-signals: not a signal that can be handled: {', '.join(bad)}")
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


class _Unset:
    def __repr__(self) -> str:
        return "<not given>"


_UNSET = _Unset()


def given_options(argv: list[str] | None) -> set[str]:
    """The torchrun options (namespace names) the command line sets explicitly.

    argparse cannot tell a value given from its default, so the line is parsed again by a
    parser whose every default is a marker: what is not the marker afterwards was given (both
    spellings and abbreviations count, as argparse accepts them).
    """
    parser = build_parser()
    for action in parser._actions:
        if action.dest in ("help", "version"):
            continue
        # Actions that add to their value (append, count) start from None, not a marker.
        adds = isinstance(
            action, (argparse._AppendAction, argparse._CountAction, argparse._ExtendAction)
        )
        action.default = None if adds else _UNSET
    ns = parser.parse_args(argv)
    return {
        k
        for k, v in vars(ns).items()
        if v is not _UNSET and v is not None and not k.startswith(_OURS)
    }


def _slurm_plan(
    argv: list[str] | None, environ: Mapping[str, str], ns: argparse.Namespace
) -> SlurmPlan | None:
    # Inside a Slurm job: the options the allocation implies, each one the user gave (flag or
    # PET_* variable) left alone.
    job = slurm.detect(environ)
    if job is None:
        return None
    given = given_options(argv)
    given |= slurm.given_from_env(environ, (*slurm.FILLED_DESTS, *slurm.RENDEZVOUS_DESTS))
    # --standalone is a switch: PET_STANDALONE=0 is set, not given; what counts is its value.
    given.discard("standalone")
    if ns.standalone:
        given.add("standalone")
    return slurm.plan(job, given, str(ns.rdzv_backend))
