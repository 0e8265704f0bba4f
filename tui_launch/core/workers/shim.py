"""The worker bootstrap: how every Python worker starts, unless ``--no-bootstrap``.

By default the runner starts each Python worker as::

    python -u -m tui_launch.core.workers.shim DIR script.py ARGS...     (or DIR -m module ARGS...)

instead of torchrun's ``python -u script.py ARGS...`` (``--no-bootstrap`` keeps torchrun's).
The bootstrap starts the Flight Recorder's responder, installs one handler for
:data:`INJECT_SIGNAL`, and then runs the user's script or module exactly as ``python`` would
(:func:`_run`): a fresh ``__main__`` with the script's absolute ``__file__`` and a source
loader (``runpy``'s own ``python -m`` entry for a module), the same ``sys.argv`` and
``sys.path[0]``, so ``@record``, ``if __name__ == "__main__"``, pickling and
``multiprocessing``'s spawn work, and an uncaught exception's traceback is python's, without
the bootstrap's frames (:func:`_report_without_bootstrap`). It leaves ``returned.<pid>`` in
``DIR`` once the program's main returned, so that a crash in the interpreter's teardown
after it is known as such. The user's program is not changed and nothing is imported beyond
the standard library. What a program can still tell (a thread, the command line, the
variables) is the contract in ``docs/differences.md``, tested by ``tests/test_parity.py``.

To inject, the runner writes ``DIR/<pid>.json`` (``{"kind": "exit", "code": 3}`` or
``{"kind": "exception", "message": "boom"}``) and sends :data:`INJECT_SIGNAL` to the worker.
Python runs signal handlers in the main thread, so the exception is raised there, in whatever
the training loop was doing -- but never inside torch or the standard library: torch catches
and converts exceptions in its own Python code (an op lookup once turned the injected failure
into ``AttributeError: ... has no overload name 'out'``), so when the signal lands there the
exception is held until the main thread is next in the program's own code (the script, its
modules, or a framework such as transformers), see :func:`_raise_in_program`. A rank that never
gets there (blocked in a wait of the standard library's) gets it after a while in that wait, but
never while a module is being imported or torch's Python code runs, where torch could convert it.

Stack dumps without ptrace (``--dump-via-faulthandler``): when ``TUILAUNCH_FAULTHANDLER_SIGNAL``
(:data:`FAULTHANDLER_ENV`) names a real-time signal, the bootstrap also registers
``faulthandler`` on it, for every thread and without chaining. That signal then makes the rank
print every thread's stack to its stderr and carry on, even while the main thread holds the GIL
in native code; :mod:`tui_launch.core.diagnosis.stacks` cuts the dump out of the rank's stderr log.

The responder (on by default): when ``TUILAUNCH_RESPONDER_DIR`` names a directory, the
bootstrap starts :func:`tui_launch.core.workers.responder.serve` before the program, a daemon
thread that answers on ``<dir>/<RANK>.sock`` with the rank's Flight Recorder and every thread's
stack.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import signal
import sys
import threading
import time
import types
from types import FrameType
from typing import TYPE_CHECKING

# Every worker starts through this module: what it imports, each worker pays at its start
# (bench/bootstrap.py start), so what only an injection needs is imported when it comes.
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# A real-time signal: nothing else uses it, and its default action (terminate) never matters
# because it is only sent to workers that installed the handler.
INJECT_SIGNAL = signal.SIGRTMIN + 7

# The signal tuilaunch asks for with --dump-via-faulthandler. Real-time as well, and never
# SIGUSR1/SIGUSR2: a program may use those itself, and an unhandled SIGUSR1 kills the rank.
FAULTHANDLER_SIGNAL = signal.SIGRTMIN + 8
FAULTHANDLER_ENV = "TUILAUNCH_FAULTHANDLER_SIGNAL"

# The directory argument that means "no order directory": the bootstrap only runs the program
# (--warm-start starts every Python worker through it, injections or not).
NO_ORDERS = "-"

_dir = ""
# An exception held until the program's code runs again (:func:`_raise_in_program`), with what
# undoes its tracing and when the hold began. After HOLD_AT_MOST seconds it is raised in a wait
# of the standard library's (a rank blocked there would otherwise never get it); while the main
# thread imports a module or runs torch's Python code the hold goes on, since code there may
# catch and convert it, up to HOLD_BUSY_AT_MOST seconds in all (an import that never ends).
_held: tuple[BaseException, Callable[[], None], float] | None = None
HOLD_AT_MOST = 2.0
HOLD_BUSY_AT_MOST = 60.0


class InjectedFailure(RuntimeError):
    """The exception an ``exception`` injection raises in the worker's main thread."""


def _on_signal(signum: int, frame: Any) -> None:
    global _held
    if _held is not None:  # the held exception's time is up (the timer's signal)
        exc, untrace, since = _held
        if _busy(frame) and time.monotonic() - since < HOLD_BUSY_AT_MOST:
            _arm(exc)
            return
        _held = None
        untrace()
        raise exc
    import json

    path = os.path.join(_dir, f"{os.getpid()}.json")
    try:
        with open(path) as fp:
            order = json.load(fp)
        os.unlink(path)
    except (OSError, ValueError):
        return  # no order for us: ignore the stray signal
    if order.get("kind") == "exit":
        # Exit at once, as a crash would: no finally blocks or atexit hooks that could wait
        # on peers (a collective, destroy_process_group) and turn an exit into a hang.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(int(order.get("code", 1)))
    _raise_in_program(frame, InjectedFailure(str(order.get("message") or "injected by tuilaunch")))


def _torch_dir() -> str | None:
    """torch's package directory, ending in a separator, once torch is imported."""
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    return os.path.join(os.path.dirname(torch_file), "") if torch_file else None


def _library_dirs() -> tuple[str, ...]:
    """Directories whose code is not the program's: the standard library, torch, tuilaunch."""
    import sysconfig  # only when an exception is injected: not on every worker's start

    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib") if k in paths}
    torch_dir = _torch_dir()
    if torch_dir:
        dirs.add(torch_dir)
    # tui_launch itself (this file is tui_launch/core/workers/shim.py)
    dirs.add(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return tuple(os.path.join(d, "") for d in dirs)


def _in_program(frame: FrameType, library: tuple[str, ...]) -> bool:
    """Whether ``frame`` runs the program's code rather than torch's or the standard library's."""
    name = frame.f_code.co_filename
    return not name.startswith("<") and not os.path.abspath(name).startswith(library)


def _busy(frame: FrameType | None) -> bool:
    """Whether the main thread, interrupted in ``frame``, imports a module or runs torch's code.

    The held exception is raised only in a wait of the standard library's: an import runs
    library code that may catch exceptions (torch's op tables convert them), and it ends.
    """
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            return True
        f = f.f_back
    torch_dir = _torch_dir()
    return bool(frame and torch_dir and frame.f_code.co_filename.startswith(torch_dir))


def _arm(exc: BaseException) -> None:
    """Signal the main thread again in :data:`HOLD_AT_MOST` seconds, if ``exc`` is still held."""
    main = threading.main_thread().ident
    timer = threading.Timer(HOLD_AT_MOST, _time_up, args=(exc, main))
    timer.daemon = True
    timer.start()


def _raise_in_program(frame: FrameType | None, exc: BaseException) -> None:
    """Raise ``exc`` now if ``frame`` is the program's code, else at its next line there.

    "Next" is whichever comes first: a frame of the program further up the stack resumes (its
    next line, once the torch call under it returns), or the main thread calls a function of
    the program. Until then a trace function watches the main thread's calls (nothing else is
    traced); it is removed before the exception is raised. A trace function that raises makes
    the exception appear in the traced frame, as if that line had raised it. A main thread
    blocked in library code (a wait of the standard library's) gets it there after
    :data:`HOLD_AT_MOST` seconds, but not while it imports or runs torch's code (:func:`_busy`).
    """
    global _held
    library = _library_dirs()
    if frame is None or _in_program(frame, library):
        raise exc

    def untrace() -> None:
        sys.settrace(None)
        for f in waiting:
            f.f_trace = None

    def fire() -> None:
        global _held
        _held = None
        untrace()
        raise exc

    def local(f: FrameType, event: str, arg: Any) -> Any:
        if event in ("line", "return"):
            fire()
        return local

    def on_call(f: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and _in_program(f, library):
            fire()
        return None  # nothing to trace inside library frames

    waiting = []
    f: FrameType | None = frame.f_back
    while f is not None:
        if _in_program(f, library):
            f.f_trace = local
            f.f_trace_lines = True
            waiting.append(f)
        f = f.f_back
    if not waiting:  # nothing of the program's below: it would never resume, raise here
        raise exc
    _held = (exc, untrace, time.monotonic())
    sys.settrace(on_call)
    _arm(exc)


def _time_up(exc: BaseException, main: int | None) -> None:
    """``exc`` is still held after :data:`HOLD_AT_MOST`: signal the main thread to raise it."""
    if _held is not None and _held[0] is exc and main is not None:
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_kill(main, INJECT_SIGNAL)


def install(directory: str) -> None:
    """Install the injection handler; orders are read from ``directory``."""
    global _dir
    _dir = directory
    signal.signal(INJECT_SIGNAL, _on_signal)


def install_faulthandler() -> int | None:
    """Register faulthandler on the signal that ``TUILAUNCH_FAULTHANDLER_SIGNAL`` names.

    Returns the signal number, or None when the variable is unset or names no usable signal:
    only real-time signals other than :data:`INJECT_SIGNAL` are taken, and a bad value is
    reported on stderr and ignored rather than failing the user's program.
    """
    value = os.environ.get(FAULTHANDLER_ENV, "").strip()
    if not value:
        return None
    try:
        signum = int(value)
    except ValueError:
        signum = -1
    if not signal.SIGRTMIN <= signum <= signal.SIGRTMAX or signum == INJECT_SIGNAL:
        sys.stderr.write(
            f"tuilaunch: {FAULTHANDLER_ENV}={value!r} is not a free real-time signal "
            f"({int(signal.SIGRTMIN)}..{int(signal.SIGRTMAX)}, not {int(INJECT_SIGNAL)}); "
            "stack dumps through faulthandler are off\n"
        )
        return None
    # chain=False: the signal is ours alone, and its default action would kill the rank.
    faulthandler.register(signum, all_threads=True, chain=False)
    return signum


# ----------------------------------------------------------------- main returned
# When the program's main returns (no exception), the bootstrap leaves an empty marker file,
# ``DIR/returned.<pid>``: a rank that dies after it (a gloo/NCCL race in the interpreter's
# teardown, an atexit handler) finished its work, and the launcher's restart policy does not
# redo it. Nothing is written with no order directory (``-``).
RETURNED_PREFIX = "returned."


def returned_path(directory: str, pid: int) -> str:
    """The marker a worker with ``pid`` leaves in ``directory`` once its main returned."""
    return os.path.join(directory, f"{RETURNED_PREFIX}{pid}")


def _mark_returned(directory: str) -> None:
    if directory == NO_ORDERS:
        return
    with contextlib.suppress(OSError), open(returned_path(directory, os.getpid()), "w"):
        pass


# The directory (set by the launcher, inherited by the workers) where each rank's responder
# listens on ``<global rank>.sock``.
RESPONDER_ENV = "TUILAUNCH_RESPONDER_DIR"


def start_responder() -> None:
    """Start the Flight Recorder responder when the launcher asked for one."""
    directory = os.environ.get(RESPONDER_ENV, "")
    if not directory:
        return
    # Imported only here: a worker whose recorder is off (TORCH_FR_BUFFER_SIZE=0) loads no more.
    from tui_launch.core.workers import responder

    responder.serve(directory, os.environ.get("RANK", str(os.getpid())))


def run_path_entry(directory: str, training_script: str, *training_script_args: str) -> None:
    """``--run-path`` workers: install the handlers, then torch's own ``run_script_path``."""
    from torch.distributed.run import run_script_path

    install_faulthandler()
    start_responder()
    install(directory)
    run_script_path(training_script, *training_script_args)
    _mark_returned(directory)


def main(argv: list[str]) -> None:
    """``DIR script ARGS...``, ``DIR -m module ARGS...`` or ``DIR --run-path script ARGS...``:
    run it as ``python`` (or torchrun's ``--run-path``) would. ``DIR`` ``-``: no orders."""
    directory, rest = argv[0], argv[1:]
    install_faulthandler()
    start_responder()
    if directory != NO_ORDERS:
        install(directory)
    try:
        _run(rest)
    except SystemExit as e:  # sys.exit(0) at the end of main is a return too
        if e.code in (0, None):
            _mark_returned(directory)
        raise
    except BaseException:
        # Uncaught: the interpreter reports it as for `python script.py` (exit 1, or death by
        # SIGINT for a KeyboardInterrupt), and the traceback it prints starts where python's
        # would, without the bootstrap's frames.
        _report_without_bootstrap()
        raise
    _mark_returned(directory)


def _report_without_bootstrap() -> None:
    """Make the interpreter's report of the uncaught exception skip the bootstrap's frames.

    Set only once the program has ended by raising, so the program never sees a
    ``sys.excepthook`` of ours; the hook it set (or Python's) prints the report.
    """
    hook = sys.excepthook
    here = os.path.abspath(__file__)

    def trimmed(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        first, t = tb, tb
        while t is not None:  # from the frame after the last of the bootstrap's
            if os.path.abspath(t.tb_frame.f_code.co_filename) == here:
                first = t.tb_next
            t = t.tb_next
        first = first if first is not None else tb
        # Python's own hook prints the exception's __traceback__, not its argument.
        hook(kind, value.with_traceback(first), first)

    sys.excepthook = trimmed


def _fresh_main() -> types.ModuleType:
    """A ``__main__`` module as the interpreter makes it, put in ``sys.modules``."""
    import builtins

    main = types.ModuleType("__main__")
    main.__dict__.update(__annotations__={}, __builtins__=builtins)
    sys.modules["__main__"] = main
    return main


def _run(rest: list[str]) -> None:
    import runpy

    if rest and rest[0] == "--run-path":
        # As torchrun's --run-path worker: run_script_path under @record (torch's spawned
        # function is wrapped in record, so an uncaught error always writes the error file).
        from torch.distributed.elastic.multiprocessing.errors import record
        from torch.distributed.run import run_script_path

        record(run_script_path)(*rest[1:])
    elif rest and rest[0] == "-m":
        module, args = rest[1], rest[2:]
        # `python -m shim` already put the current directory first on sys.path, as `-m module`.
        # runpy's own entry point of `python -m`: the same __main__, sys.argv[0], frames.
        sys.argv = ["-m", *args]
        _fresh_main()
        runpy._run_module_as_main(module)  # type: ignore[attr-defined]
    else:
        script, args = rest[0], rest[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        if not os.path.isfile(script):  # a directory or zip with __main__.py: as python does
            runpy.run_path(script, run_name="__main__")
            return
        # What `python script.py` does: the script's code compiled with its absolute path, run
        # in a fresh __main__ with a source loader, none of this module's __future__ flags.
        path = os.path.abspath(script)
        from importlib.machinery import SourceFileLoader

        main = _fresh_main()
        main.__dict__.update(
            __file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path)
        )
        with io.open_code(path) as fp:
            code = compile(fp.read(), path, "exec", dont_inherit=True)
        exec(code, main.__dict__)


if __name__ == "__main__":
    # Run from the imported module, not this `__main__` copy: runpy is about to hand
    # `__main__` to the user's script, and InjectedFailure should keep its real name.
    from tui_launch.core.workers import shim as _shim

    _shim.main(sys.argv[1:])
