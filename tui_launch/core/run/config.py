"""What a run is asked to do, beyond torchrun's own arguments: one frozen :class:`RunConfig`.

Built once from tuilaunch's :class:`~tui_launch.core.launch.options.Options`
(:meth:`RunConfig.from_options`) and handed to the
:class:`~tui_launch.core.run.runner.Runner`, which hands it on to the parts that read it (the
watchers, the worker bootstrap's directory, the injections), so no option is relayed field by
field. Tests build one directly; a field that an option sets takes its default from that
option's field of ``Options``, so ``RunConfig()`` is the run a command line without tuilaunch's
options asks for (worker output echoed).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from tui_launch.core.launch.options import Options
from tui_launch.core.launch.signals import preempt_signals
from tui_launch.core.model.policy import PolicyConfig
from tui_launch.core.run import inject
from tui_launch.core.run.inject import InjectSpec

# The defaults of the fields whose option's text becomes another type: its default, converted.
_INJECT = inject.parse_specs(Options.inject)
_POLICY = PolicyConfig(Options.restart_policy, *Options.restart_storm)
_PREEMPT_SIGNALS = preempt_signals(Options.preempt_signals)


@dataclass(frozen=True)
class RunConfig:
    """tuilaunch's settings for one run.

    Attributes:
        echo: whether worker output that torchrun would print goes to the console sinks.
        journal_path: ``--journal``; default: ``journal.jsonl`` in the run's log directory.
        mute_agent_console: keep torch's own log lines off stderr (the dashboard shows them).
        inject: the ``--inject`` specs (the dashboard may add more while the run goes on).
        inject_seed: ``--inject-seed`` for ``rank=random`` (None: a fresh one, shown in a note).
        inject_ready: start Python workers through the injection bootstrap even without an
            ``exit``/``exception`` spec, so that the dashboard can inject those.
        hang_timeout: ``--hang-timeout``: ``"auto"`` (the adaptive rule of
            :mod:`~tui_launch.core.diagnosis.rhythm`), or seconds of silence on every rank
            before a hang is suspected (0: no detection).
        on_hang: ``--on-hang``: dump, restart or stop once a hang is confirmed.
        dump_on_failure: dump the surviving ranks before torch terminates a failed group
            (``--no-dump-on-failure`` turns it off).
        dump_via_faulthandler: start Python workers through the bootstrap with faulthandler on
            a real-time signal, and dump through it instead of py-spy.
        stack_samples: seconds between two stack samples of every rank, for the straggler
            inference (0: off).
        journal_samples: ``--journal-samples``: seconds between two progress records in the
            journal (0: only each attempt's last one); telemetry takes it from the options.
        slurm_job: the Slurm job the run belongs to (recorded with ``RunStarted``).
        notes: lines said when the run starts (how the Slurm allocation filled the options).
        policy: ``--restart-policy`` and ``--restart-storm`` (:mod:`~.core.model.policy`).
        exit_codes: ``--exit-codes``: ``tuilaunch`` (the table of
            :mod:`~tui_launch.core.model.exitcodes`) or ``torchrun``.
        preempt_signals: ``--preempt-signals``: a stop by one of these is a preemption.
        flight_recorder: ``--flight-recorder``: arm torch's Flight Recorder in the workers and
            collect it (and every thread's stack) through the bootstrap's responder.
    """

    echo: bool = True
    journal_path: str | None = Options.journal
    mute_agent_console: bool = False
    inject: tuple[InjectSpec, ...] = _INJECT
    inject_seed: int | None = Options.inject_seed
    inject_ready: bool = Options.inject_ready
    hang_timeout: float | str = Options.hang_timeout
    on_hang: str = Options.on_hang
    dump_on_failure: bool = not Options.no_dump_on_failure
    dump_via_faulthandler: bool = Options.dump_via_faulthandler
    stack_samples: float = Options.stack_samples
    journal_samples: float = Options.journal_samples
    slurm_job: str | None = Options.slurm_job
    notes: tuple[str, ...] = Options.slurm_notes
    policy: PolicyConfig = _POLICY
    exit_codes: str = Options.exit_codes
    preempt_signals: tuple[signal.Signals, ...] = _PREEMPT_SIGNALS
    flight_recorder: bool = Options.flight_recorder

    @classmethod
    def from_options(cls, opts: Options, *, mute_agent_console: bool = False) -> RunConfig:
        """The run's settings from the command line (``mute_agent_console``: the dashboard
        runs, and shows torch's log lines itself). Raises :class:`~.inject.InjectError` for a
        bad ``--inject`` spec."""
        return cls(
            journal_path=opts.journal,
            mute_agent_console=mute_agent_console,
            inject=inject.parse_specs(opts.inject),
            inject_seed=opts.inject_seed,
            inject_ready=opts.inject_ready,
            hang_timeout=opts.hang_timeout,
            on_hang=opts.on_hang,
            dump_on_failure=not opts.no_dump_on_failure,
            dump_via_faulthandler=opts.dump_via_faulthandler,
            stack_samples=opts.stack_samples,
            journal_samples=opts.journal_samples,
            slurm_job=opts.slurm_job,
            notes=opts.slurm_notes,
            policy=PolicyConfig(opts.restart_policy, *opts.restart_storm),
            exit_codes=opts.exit_codes,
            preempt_signals=preempt_signals(opts.preempt_signals),
            flight_recorder=opts.flight_recorder,
        )

    @property
    def bootstrap(self) -> bool:
        """Whether Python workers start through tuilaunch's bootstrap (``--inject-ready``,
        ``--dump-via-faulthandler``, ``--flight-recorder``, or an ``exit``/``exception`` spec)."""
        return (
            self.inject_ready
            or self.dump_via_faulthandler
            or self.flight_recorder
            or inject.needs_shim(self.inject)
        )
