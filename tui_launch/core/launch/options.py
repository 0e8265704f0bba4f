"""tuilaunch's own options, each declared once: a field of :class:`Options`.

A field made with :func:`option` carries everything about its option: the default, the flag,
the help, the ``choices`` (the model's own tuples: ``policy.POLICIES``, ``exitcodes.STYLES``,
``hangwatch.ACTIONS``) and a check of its single value. :func:`~.args.build_parser` adds one
argument per such field with the field's default, :func:`~.args.parse` runs the checks, and
:class:`~tui_launch.core.run.config.RunConfig` takes its defaults from these fields, so no option
has a second default that could drift (``tests/test_cli.py`` compares the three).

``unset`` is what argparse stores when an option is not given, for the few whose text
:func:`~.args.parse` turns into the value (``--restart-storm N,MINUTES``, ``--inject``,
``--warm-import``, ``--metrics-bind``): not given, they take the field's default.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from tui_launch.core.diagnosis.hangwatch import ACTIONS, AUTO
from tui_launch.core.launch import validate
from tui_launch.core.model.exitcodes import STYLES
from tui_launch.core.model.policy import POLICIES, STORM_FAILURES, STORM_MINUTES, PolicyConfig

_T = TypeVar("_T")
# The key of a field's metadata that holds its Flag.
FLAG = "tuilaunch.flag"


class _Default:
    """Flag.unset when argparse stores the field's default itself."""

    def __repr__(self) -> str:
        return "<the field's default>"


_DEFAULT: Any = _Default()


@dataclass(frozen=True)
class Flag:
    """How one option is given on the command line (the metadata of its :class:`Options` field).

    ``check(flag, value)`` raises :class:`~.validate.UsageError` for a bad value (bad input:
    one line, exit 2, before anything starts).
    """

    flag: str
    help: str
    action: str = "store"
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    unset: Any = _DEFAULT
    check: Callable[[str, Any], object] | None = None

    def add_to(self, group: argparse._ArgumentGroup, dest: str, default: Any) -> None:
        """Add the option to ``group``, stored as ``dest``, with the field's ``default``."""
        how: dict[str, Any] = {
            "dest": dest,
            "help": self.help,
            "default": default if self.unset is _DEFAULT else self.unset,
        }
        if self.action != "store":
            how["action"] = self.action
        if self.type is not None:
            how["type"] = self.type
        if self.metavar is not None:
            how["metavar"] = self.metavar
        if self.choices is not None:
            how["choices"] = self.choices
        group.add_argument(self.flag, **how)


def option(default: _T, flag: str, *, help: str, **how: Any) -> _T:
    """A field of :class:`Options`: its ``default`` and how the option is given (:class:`Flag`)."""
    return cast(_T, field(default=default, metadata={FLAG: Flag(flag, help, **how)}))


def flag_of(name: str) -> Flag | None:
    """The :class:`Flag` of the field ``name`` of :class:`Options` (None: not an option)."""
    spec = Options.__dataclass_fields__[name].metadata.get(FLAG)
    return spec if isinstance(spec, Flag) else None


_seconds_or_off = functools.partial(validate.seconds, zero=True)


def _hang_timeout(text: str) -> float | str:
    """``--hang-timeout``: ``auto`` or a number of seconds."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected auto, 0 (off) or a number of seconds, got {text!r}"
        ) from None


def _hang_timeout_check(flag: str, value: float | str) -> object:
    return value if value == AUTO else _seconds_or_off(flag, float(value))


_positive_seconds = functools.partial(validate.seconds, zero=False)


def _journal(flag: str, path: str | None) -> None:
    validate.check_journal(path)


@dataclass(frozen=True)
class Options:
    """tuilaunch's own options (and what :func:`~.args.parse` learnt from a Slurm job)."""

    no_tui: bool = option(
        False,
        "--no-tui",
        action="store_true",
        help="Run headless: one line per event, worker output as torchrun shows it, and a "
        "summary at the end (the default when stdout is not a terminal).",
    )
    journal: str | None = option(
        None,
        "--journal",
        metavar="PATH",
        check=_journal,
        help="Write the run's event journal (JSON lines) to PATH instead of "
        "journal.jsonl in the run's log directory.",
    )
    no_confirm: bool = option(
        False,
        "--no-confirm",
        action="store_true",
        help="Dashboard: do not ask y/n before kill, SIGTERM, stop, restart or quit.",
    )
    refresh_hz: float = option(
        4.0,
        "--refresh-hz",
        type=float,
        metavar="HZ",
        check=validate.refresh_hz,
        help="Dashboard redraw rate, at most 60 (default 4; it redraws only when something "
        "changed).",
    )
    exit_on_finish: bool = option(
        False,
        "--exit-on-finish",
        action="store_true",
        help="Dashboard: leave as soon as the job ends instead of staying on the final state.",
    )
    demo: bool = option(
        False,
        "--demo",
        action="store_true",
        help="Run the dashboard on a small real CPU job (the example DDP trainer, 2 workers, "
        "one injected failure). No script needed.",
    )
    gpu_interval: float = option(
        1.0,
        "--gpu-interval",
        type=float,
        metavar="SECONDS",
        check=_positive_seconds,
        help="Seconds between telemetry samples: every rank's CPU, RSS and state (psutil) and "
        "every GPU (NVML); temperature and power every fifth sample (default 1).",
    )
    no_gpu: bool = option(
        False,
        "--no-gpu",
        action="store_true",
        help="Do not use NVML at all (process telemetry stays on).",
    )
    journal_samples: float = option(
        10.0,
        "--journal-samples",
        type=float,
        metavar="SECONDS",
        check=_seconds_or_off,
        help="Write a telemetry and a progress sample to the journal every SECONDS (default 10; "
        "0: never, but each attempt's last progress).",
    )
    stack_samples: float = option(
        5.0,
        "--stack-samples",
        type=float,
        metavar="SECONDS",
        check=_seconds_or_off,
        help="Read every rank's Python stack every SECONDS to infer a straggler (the live "
        "poll's where it has a new one, else py-spy --nonblocking; default 5; 0: off).",
    )
    inject: tuple[str, ...] = option(
        (),
        "--inject",
        action="append",
        metavar="KIND[:KEY=VALUE,...]",
        unset=None,
        help="Inject a failure on purpose, to rehearse recovery (repeatable). KIND: kill "
        "(signal=SIGKILL), hang (for=), slow (duty=50, period=1s, for=), exit (code=1), "
        "exception (message=), node (the node's workers and agent die at once). Keys for all: "
        "rank (global rank or random; 0), after (since the attempt's start: 500ms, 10s, 2m; "
        "0s), attempt (only in that attempt), times (in all, once per attempt; 1). E.g. "
        "--inject kill:rank=1,after=10s,times=3",
    )
    inject_seed: int | None = option(
        None,
        "--inject-seed",
        type=int,
        metavar="N",
        help="Seed for rank=random in --inject: the same seed gives the same schedule.",
    )
    inject_ready: bool = option(
        False,
        "--inject-ready",
        action="store_true",
        help="Accepted for old command lines: Python workers start through tuilaunch's "
        "bootstrap by default, so the dashboard can always inject exit and exception faults.",
    )
    flight_recorder: bool = option(
        False,
        "--flight-recorder",
        action="store_true",
        help="Accepted for old command lines: every rank's Flight Recorder (torch's record of "
        "its collectives) is collected by default through the bootstrap's responder "
        "(TORCH_FR_BUFFER_SIZE=0 turns the recorder off, --no-bootstrap the bootstrap).",
    )
    no_bootstrap: bool = option(
        False,
        "--no-bootstrap",
        action="store_true",
        help="Start Python workers exactly as torchrun does (python -u script.py), without "
        "tuilaunch's bootstrap: no Flight Recorder collected, no exit/exception injections, "
        "and a crash after main returned counts as a failure (docs/differences.md).",
    )
    verbose: bool = option(
        False,
        "--verbose",
        action="store_true",
        help="End with the full summary (ranks, resources, attempts) even after a clean run; "
        "by default a clean success ends with a few lines.",
    )
    hang_timeout: float | str = option(
        AUTO,
        "--hang-timeout",
        type=_hang_timeout,
        metavar="auto|SECONDS",
        check=_hang_timeout_check,
        help="auto (default): suspect a hang when the job's steps (read from its logs) stop "
        "for longer than its own rhythm allows (5 x the 90th percentile of its recent step "
        "times, at least 6 s; output silence of at least 90 s before steps are seen), and "
        "confirm it when a second stack dump 3 s later shows nothing moved (docs/hangs.md). "
        "SECONDS: the fixed rule, a hang when no rank wrote output for SECONDS, confirmed "
        "about 10 s later. 0: off.",
    )
    on_hang: str = option(
        ACTIONS[0],
        "--on-hang",
        choices=ACTIONS,
        help="What a confirmed hang does: dump (the stacks; flag the ranks; keep running), "
        "restart (as a failure: spends the --max-restarts budget) or stop (exit 75, an "
        "infrastructure failure).",
    )
    no_dump_on_failure: bool = option(
        False,
        "--no-dump-on-failure",
        action="store_true",
        help="Do not dump the surviving ranks' stacks when a rank fails (before torch "
        "terminates them; it adds up to 1 s to the restart).",
    )
    dump_via_faulthandler: bool = option(
        False,
        "--dump-via-faulthandler",
        action="store_true",
        help="Dump stacks without ptrace: Python workers start through tuilaunch's bootstrap "
        "with faulthandler on a real-time signal, and dumps are cut out of their stderr logs.",
    )
    metrics_port: int | None = option(
        None,
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="Serve Prometheus metrics (workers, restarts, per-rank and per-GPU telemetry) at "
        "http://127.0.0.1:PORT/metrics while the run lasts (off by default; see "
        "docs/metrics.md).",
    )
    metrics_bind: str = option(
        "127.0.0.1",
        "--metrics-bind",
        metavar="ADDR",
        unset=None,
        help="The IP address --metrics-port listens on (default 127.0.0.1: this machine only; "
        "0.0.0.0 or :: for a Prometheus elsewhere).",
    )
    metrics_textfile: str | None = option(
        None,
        "--metrics-textfile",
        metavar="DIR",
        help="Write the same metrics every 10 s to DIR/tuilaunch_<run-id>_<node>.prom, "
        "atomically, for node_exporter's textfile collector (no port); the last write marks "
        "the run finished. DIR must exist.",
    )
    warm_start: bool = option(
        False,
        "--warm-start",
        action="store_true",
        help="Keep a spare Python process with torch already imported and fork each "
        "attempt's workers (the first one too) from it, so a restart does not pay for "
        "importing torch again. Not with --no-python or --numa-binding.",
    )
    warm_import: tuple[str, ...] = option(
        (),
        "--warm-import",
        metavar="MOD,...",
        unset=None,
        help="With --warm-start: modules the spare also imports ahead of need "
        "(e.g. transformers,mypkg.model), found as the worker would find them.",
    )
    control_socket: bool = option(
        False,
        "--control-socket",
        action="store_true",
        help="Listen on a Unix socket in the run directory (mode 0600, this user and root "
        "only; never TCP) so that 'tuilaunch attach --control' can kill, stop, restart, "
        "inject, dump and stop the job from another terminal. Off by default.",
    )
    detach: bool = option(
        False,
        "--detach",
        action="store_true",
        help="Start the job in the background, detached from this terminal (headless, its "
        "console output in console.log of the run directory, a hang-up does not stop it; "
        "implies --control-socket), print how to attach, and return at once.",
    )
    no_slurm: bool = option(
        False,
        "--no-slurm",
        action="store_true",
        help="Inside a Slurm job, do not take the rendezvous from the allocation (nodes, "
        "first host, job id, GPUs per node); by default each option you do not give comes "
        "from it (see docs/slurm-kubernetes.md).",
    )
    # Set by parse() inside a Slurm job (not options): the job id, and how the allocation
    # filled in torchrun's options (said when the run starts).
    slurm_job: str | None = None
    slurm_notes: tuple[str, ...] = ()
    restart_policy: str = option(
        PolicyConfig.mode,
        "--restart-policy",
        choices=POLICIES,
        help="smart (default): no restart for a startup error, for the same exception at the "
        "same step twice (proven by its traceback), or for a crash after every rank's main "
        "returned; torchrun: restart every failure until --max-restarts is spent. "
        "See docs/restart-policy.md.",
    )
    restart_storm: tuple[int, float] = option(
        (STORM_FAILURES, STORM_MINUTES),
        "--restart-storm",
        metavar="N,MINUTES",
        unset=None,
        help="With --restart-policy smart: also stop after N failures within MINUTES minutes "
        "with no training step gained, whatever they were (default 0: off).",
    )
    exit_codes: str = option(
        STYLES[0],
        "--exit-codes",
        choices=STYLES,
        help="tuilaunch (default): 0 success, 1 a program failure a retry will not fix, 2 bad "
        "usage, 75 an infrastructure failure a retry may fix, 143 preempted, 128+N another "
        "signal; torchrun: torchrun's (1 for every failure). See docs/restart-policy.md.",
    )
    preempt_signals: str = option(
        "SIGTERM,SIGUSR1",
        "--preempt-signals",
        metavar="SIG,...",
        help="Signals to the launcher that mean preemption (default SIGTERM,SIGUSR1: Slurm's "
        "--signal=B:USR1@60): forwarded to the workers, shown as PREEMPTED with the grace "
        "left (--shutdown-timeout), exit status 143. Empty: none.",
    )
