"""``tuilaunch [torchrun options] script ...``: parse, validate, pick a front end, handle signals.

The metrics exporters (``--metrics-port``, ``--metrics-textfile``) wrap the run: started after
validation and before the runner, so a port taken meanwhile is still a usage error with nothing
started; closed after the run, so the textfile's last write says the run finished.

Exit status: the table of :mod:`tui_launch.core.model.exitcodes` (0 success, 1 a program
failure, 2 bad input, 75 an infrastructure failure, 143 preempted, 128 + N stopped by another
signal N), or torchrun's with ``--exit-codes torchrun``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
import warnings
from typing import TYPE_CHECKING, TextIO

# Everything that imports torch or Textual is imported inside main, so that cli.main can
# switch the cyclic GC off before any of it loads (see main).
if TYPE_CHECKING:
    import argparse

    from tui_launch.core.launch.args import Options
    from tui_launch.core.model.store import RunStore
    from tui_launch.core.remote.detach import Console
    from tui_launch.core.run.handle import RunHandle
    from tui_launch.core.workers.warm import WarmPool

DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


def _signals(names: str) -> list[signal.Signals]:
    out: list[signal.Signals] = []
    for name in names.split(","):
        sig = getattr(signal, name.strip(), None)
        if isinstance(sig, signal.Signals) and sig not in (signal.SIGKILL, signal.SIGSTOP):
            out.append(sig)
    return out


def install_signal_handlers(runner: RunHandle, names: str) -> dict[signal.Signals, object]:
    """Route torchrun's handled signals (``--signals-to-handle``) to ``runner.stop``."""
    from tui_launch.core.run.shutdown import received

    def handler(signum: int, frame: object) -> None:
        sig = signal.Signals(signum)
        runner.stop(sig, reason=received(sig))

    previous: dict[signal.Signals, object] = {}
    for sig in _signals(names):
        previous[sig] = signal.signal(sig, handler)
    return previous


def quiet_own_imports() -> None:
    """Keep warnings raised by the launcher's own imports off its console.

    A CPU torch without NumPy warns "Failed to initialize NumPy" when it is imported; that
    import is the launcher's own business (its parser, its agent), so the warning would precede
    even ``--version``. The filter lives in this process only: the workers are separate
    interpreters, and their output is theirs, untouched.
    """
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)


def main(argv: list[str] | None = None) -> int:
    """Run tuilaunch with ``argv`` and return the exit status."""
    quiet_own_imports()
    saved = guard_consoles()
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def guard_consoles() -> tuple[TextIO, TextIO]:
    """Make ``sys.stdout`` and ``sys.stderr`` consoles whose going away cannot break the run.

    ``tuilaunch ... | head -2``: once ``head`` exits, every write to the pipe fails
    (``EPIPE``). torchrun's workers, which write to that pipe themselves, die of it; here the
    workers write to their files, and a console that went away costs nothing but the console
    (:class:`~tui_launch.core.logs.console.ConsoleStream`): the run goes on, its journal and
    its exit status are the run's. Returns the streams to put back.
    """
    from tui_launch.core.logs.console import ConsoleStream

    saved = (sys.stdout, sys.stderr)
    if sys.stdout is not None and not isinstance(sys.stdout, ConsoleStream):
        sys.stdout = ConsoleStream(sys.stdout, "stdout")
    if sys.stderr is not None and not isinstance(sys.stderr, ConsoleStream):
        sys.stderr = ConsoleStream(sys.stderr, "stderr")
    return saved


def _main(argv: list[str] | None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if _asks_version(given):
        # Without torch's parser: importing torch took 1 s (3.8 s on a busy machine).
        from tui_launch import __version__

        print(f"tuilaunch {__version__}")
        return 0
    # --warm-start: the spare starts importing torch now, while this process imports it too.
    from tui_launch.core.workers.warm import prestart

    pool = prestart(given)
    try:
        return _parse_and_run(argv, given, pool)
    finally:
        if pool is not None:
            pool.close()  # the runner closed it already unless the launch never began


def _asks_version(given: list[str]) -> bool:
    # --version among the launcher's leading options (argparse would print it wherever it
    # stands before the script; after the script it is the script's own argument). Only the
    # flags before the first value are looked at: `--nnodes 2 --version` still gets its
    # answer, from argparse, after torch is imported.
    for arg in given:
        if arg == "--version":
            return True
        if arg == "--" or not arg.startswith("-"):
            return False
    return False


def _parse_and_run(argv: list[str] | None, given: list[str], pool: WarmPool | None) -> int:
    from tui_launch.core.launch.args import parse
    from tui_launch.core.launch.validate import (
        USAGE_ERROR,
        UsageError,
        validate,
        validate_bootstrap,
        validate_dump_options,
        validate_log_dir,
        validate_warm,
    )
    from tui_launch.core.model.store import RunStore
    from tui_launch.core.run.inject import needs_shim, parse_specs, validate_injections

    args, opts = parse(argv)
    try:
        validate(args)
        validate_injections(args, opts.inject)
        validate_dump_options(args, opts.dump_via_faulthandler)
        validate_warm(args, opts.warm_start)
        injects = needs_shim(parse_specs(opts.inject))
        validate_bootstrap(opts.no_bootstrap, _bootstrap_needed_by(opts, injects))
        validate_log_dir(args)  # last: it creates the directory
    except UsageError as e:
        print(f"tuilaunch: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    if opts.warm_start:
        from tui_launch.core.workers.warm import WarmPool

        if opts.detach and pool is not None:
            # The spare is a child of this process, which hands the run to a grandchild:
            # that one starts its own (WarmPool.configure).
            pool.close()
            pool = None
        pool = pool or WarmPool()
        pool.modules = opts.warm_import
    elif pool is not None:
        pool.close()  # "--warm-start" was an argument of the script's
        pool = None

    console = None
    if opts.detach:
        # Before anything starts (no thread yet): the launcher goes on in a grandchild.
        from tui_launch.core.remote import detach

        pid = detach.daemonize()
        if pid is not None:
            print(detach.attach_hint(pid))
            return 0
        console = detach.Console(_spare_dir())
        console.detach(None)
    terminal = _isatty(sys.stdout) and _isatty(sys.stdin)
    use_tui = not opts.no_tui and not opts.detach and terminal and _knows_term()
    if not opts.no_tui and not opts.detach and not use_tui:
        why = "stdout or stdin is not a terminal" if not terminal else "TERM is not set"
        print(f"tuilaunch: {why}: running headless (as --no-tui)", file=sys.stderr)
    store = RunStore()
    from tui_launch import metrics

    # After validation, before anything starts: a port taken since parse() probed it is still a
    # usage error with nothing to clean up. With neither option this starts nothing at all.
    try:
        exporters = metrics.start_exporters(opts, store)
    except metrics.MetricsError as e:
        print(f"tuilaunch: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    try:
        return _run(args, opts, store, use_tui, given, console, pool)
    finally:
        # After the run: the textfile's last write says the run finished; the port closes.
        exporters.close()


def _bootstrap_needed_by(opts: Options, injects: bool) -> list[str]:
    """The options given that work through the worker bootstrap, as their flags."""
    given = (
        (opts.inject_ready, "--inject-ready"),
        (opts.flight_recorder, "--flight-recorder"),
        (opts.dump_via_faulthandler, "--dump-via-faulthandler"),
        (opts.warm_start, "--warm-start"),
        (injects, "--inject exit/exception"),
    )
    return [flag for on, flag in given if on]


def _run(
    args: argparse.Namespace,
    opts: Options,
    store: RunStore,
    use_tui: bool,
    given: list[str],
    console: Console | None = None,
    pool: WarmPool | None = None,
) -> int:
    """Build the runner, start it, and follow it with the dashboard or headless (``given``:
    the command line, for the run index; ``console``: the launcher runs detached; ``pool``:
    --warm-start's spares)."""
    from tui_launch.core.logs.stderr import StderrPipe
    from tui_launch.core.run.config import RunConfig
    from tui_launch.core.run.runner import Runner
    from tui_launch.core.telemetry import Telemetry
    from tui_launch.headless import Headless
    from tui_launch.summary import print_summary

    telemetry = Telemetry(
        store.post,
        interval=opts.gpu_interval,
        gpu=not opts.no_gpu,
        journal_every=opts.journal_samples,
        # The demo trains on CPU: its GPUs come from the fake NVML, marked as simulated.
        fake_nvml="2" if opts.demo else None,
        view=lambda: store.snapshot().telemetry,
    )
    config = RunConfig.from_options(opts, mute_agent_console=use_tui)
    runner = Runner(args, store, config, telemetry=telemetry, warm=pool)
    runner.before_exit(_say_node_dies)
    # The per-user run index (`tuilaunch ls`): this run's entry lives as long as the run.
    from tui_launch.core.remote import runindex

    index = runindex.Registration.register(
        ["tuilaunch", *given], runner.torchrun.rdzv_id or "", opts.journal, opts.slurm_job
    )
    runindex.follow(
        index,
        lambda listener: store.subscribe(listener, replay=False),
        lambda: (runner.files.run_dir, runner.files.journal.path),
    )
    runner.before_exit(lambda: index.close("killed (inject node)"))
    # The control socket (attach --control): off unless asked for (--control-socket,
    # --detach, or D in the dashboard); it listens once the run directory exists.
    from tui_launch.core.remote.controlsock import ControlServer
    from tui_launch.core.remote.detach import Console, detach_message, ignore_hangup, ready

    control = ControlServer(runner, _spare_dir(), on_listen=index.set_control)
    store.subscribe(control.listener, replay=False)
    runner.before_exit(control.close)  # a `node` injection SIGKILLs us: no socket left behind
    consoles: list[Console] = [console] if console is not None else []
    store.subscribe(lambda e: _console_follows(e, consoles, runner), replay=False)
    if opts.control_socket or console is not None:
        control.enable()
    if console is not None:
        index.set_detached()
        ready()  # --detach's first process may return: `tuilaunch attach PID` finds the run
    # --signals-to-handle appeared in torch 2.8; before it torchrun handled these four.
    handled = runner.torchrun.signals_to_handle or DEFAULT_SIGNALS
    # The preemption signals too (--preempt-signals: SIGTERM and Slurm's SIGUSR1 warning),
    # which would otherwise kill the launcher and leave its workers behind.
    extra = [s.name for s in config.preempt_signals if s not in _signals(handled)]
    previous = install_signal_handlers(runner, ",".join([handled, *extra]))
    if console is not None:
        ignore_hangup()  # detached from the start: a hang-up stops nothing
    if use_tui:
        from tui_launch.tui.run import DETACHED, run_dashboard  # Textual: before the freeze
    # What is loaded by now (torch alone is ~170,000 objects) lives as long as the process.
    # Move it out of the cyclic GC's reach: otherwise every full collection walks all of it,
    # 80 ms of CPU on an idle core, and 165 ms of the dashboard's main thread in a log flood
    # (the tailer's allocations trigger them), during which no key is answered. What the run
    # creates from here on is collected as usual.
    gc.freeze()
    gc.enable()
    # Headless, fd 2 goes through a filter from the start: torch's C++ retries of a
    # rendezvous store become one line each (their full text goes to agent.log).
    pipe = StderrPipe(runner.agent_log, store.post) if not use_tui else None
    try:
        if pipe is not None:
            pipe.__enter__()
        runner.start()
        if use_tui:
            code, error = run_dashboard(
                runner,
                refresh_hz=opts.refresh_hz,
                confirm=not opts.no_confirm,
                exit_on_finish=opts.exit_on_finish,
            )
            if code == DETACHED:
                # D: the terminal is released; the job goes on headless, its console output
                # in the run directory, deaf to SIGHUP, and listening for attach --control.
                ignore_hangup()  # before saying the terminal may be closed
                print(detach_message(os.getpid(), runner.files.run_dir), flush=True)
                detached = Console(_spare_dir())
                detached.detach(runner.files.run_dir)
                # torch's own log lines went to the dashboard's agent log tab; from now on
                # they go to the console (console.log), as in a headless run.
                runner.agent_log.unmute()
                consoles.append(detached)
                index.set_detached()
                control.enable()
                print(f"tuilaunch: detached from the dashboard at {time.strftime('%H:%M:%S')}")
            elif error is None and code is not None:
                runner.wait()
                print_summary(store.snapshot(), runner, sys.stderr, verbose=opts.verbose)
                return runner.exit_code if runner.exit_code is not None else code
            else:
                print(
                    f"tuilaunch: the dashboard failed ({type(error).__name__}: {error}); "
                    "the job goes on headless. Every log line is in the run's log files.",
                    file=sys.stderr,
                )
        headless = Headless(store, runner, verbose=opts.verbose)
        if pipe is not None:
            pipe.console = headless.say
        return headless.run()
    finally:
        control.close()
        if runner.files.run_dir:
            index.set_run_dir(runner.files.run_dir, runner.files.journal.path)
        index.close(runner.phase, runner.exit_code)
        if opts.demo:
            # The demo's snapshot is the launcher's own file, not the user's: leave no litter.
            from tui_launch.core.launch.demo import demo_snapshot_path

            with contextlib.suppress(OSError):
                os.remove(demo_snapshot_path())
        if pipe is not None:
            pipe.__exit__(None, None, None)
        for sig, old in previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]


def _spare_dir() -> str | None:
    # The run index directory (0700, the user's own): the control socket's and the console
    # file's place when the run directory cannot hold them (yet).
    from tui_launch.core.remote import runindex

    try:
        return str(runindex.index_dir())
    except (OSError, runindex.UnsafeIndexDir):
        return None


def _console_follows(event: object, consoles: list[Console], runner: RunHandle) -> None:
    # A store listener: a console detached before torch made the run directory moves into it.
    from tui_launch.core.model.events import WorkersStarted

    if isinstance(event, WorkersStarted) and consoles and runner.run_dir:
        consoles[-1].move_to(runner.run_dir)


def _say_node_dies() -> None:
    # A direct write: the dashboard captures sys.stderr, and the process dies right after.
    line = b"[tuilaunch] inject node: SIGKILL to this node's workers and to tuilaunch itself\n"
    stream = sys.__stderr__ or sys.stderr
    os.write(stream.fileno(), line)


def _knows_term() -> bool:
    # A terminal nobody named (no TERM, or TERM=dumb: a container's log, an editor's shell)
    # cannot be drawn on: the dashboard's escapes would land in the log as text.
    return os.environ.get("TERM", "dumb") not in ("", "dumb")


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False
