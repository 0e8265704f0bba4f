"""tuilaunch's command line: torchrun's own parser plus a group of tuilaunch options.

The torchrun part is ``torch.distributed.run.get_args_parser()`` itself, so every flag of the
installed torch, both spellings, its defaults and its ``PET_*`` environment defaults work
unchanged, including flags added in later releases. tuilaunch's options (each declared once,
as a field of :class:`~.options.Options`) live in their own argument group, with names torchrun
does not use, and are removed from the namespace handed to torch. Errors are one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import fields
from typing import NoReturn

from tui_launch import __version__
from tui_launch.core.launch import slurm
from tui_launch.core.launch.demo import DEMO_INJECT, demo_argv
from tui_launch.core.launch.options import Options, flag_of
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
            "with a token\n"
            "  tuilaunch why [RUN|DUMP_DIR] [--json]  Flight Recorder dumps from anywhere: "
            "which rank the others wait on"
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
    for f in fields(Options):  # in the order of the fields: --help lists them so
        spec = flag_of(f.name)
        if spec is not None:
            spec.add_to(ours, _OURS + f.name, f.default)
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
        for name, value in ours.items():
            spec = flag_of(name)
            if spec is not None and spec.check is not None:
                spec.check(spec.flag, value)
    except UsageError as e:
        parser.error(str(e))
    ours["inject"] = tuple(ours["inject"] or ())
    slurm_plan = None
    if not ours["no_slurm"] and not ns.tl_demo:
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
        storm = ours["restart_storm"]
        ours["restart_storm"] = (
            Options.restart_storm if storm is None else parse_storm(str(storm or "0"))
        )
    except ValueError as e:
        parser.error(f"--restart-storm: {e}" if "--restart-storm" not in str(e) else str(e))
    bad = unknown_signals(ours["preempt_signals"] or "")
    if bad:
        parser.error(f"--preempt-signals: not a signal that can be handled: {', '.join(bad)}")
    try:
        ours["warm_import"] = warm_modules(ours["warm_import"], bool(ours["warm_start"]))
    except UsageError as e:
        parser.error(str(e))
    try:
        ours["metrics_bind"] = check_metrics_options(
            ours["metrics_port"],
            ours["metrics_bind"],
            ours["metrics_textfile"],
            default_bind=Options.metrics_bind,
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
