"""Test worker: record what a program can see of how it was started, by ordinary means.

Usage: ``parity.py OUT MODE``. Every rank writes ``OUT/seen_<RANK>.json``: ``sys.argv``,
``sys.path``, its ``__main__`` (name, file, spec, package, loader's type, builtins' type),
``os.environ``, the signal handlers it starts with (SIGTERM, SIGINT, SIGUSR1, SIGUSR2), its
threads' names, what a ``fork`` child, a ``spawn`` child and two DataLoader workers see
(argv, ``__main__``'s file, a class of ``__main__`` pickled to them), and whether handlers it
installs for SIGTERM and SIGUSR1 run. It prints fixed bytes on stdout and stderr (no newline
at the end, a ``\\r``, bytes that are not UTF-8) and registers an ``atexit`` hook that writes
``OUT/atexit_<RANK>``. Then MODE decides the end:

- ``ok``: return from main (exit 0);
- ``exit:N``: ``sys.exit(N)``;
- ``os_exit:N``: ``os._exit(N)`` (the atexit hook must not run);
- ``raise``: an uncaught ``ValueError`` (its traceback on stderr, exit 1);
- ``signal:NAME``: kill itself with that signal (death by signal);
- ``term``: wait for SIGTERM, which its own handler answers by writing ``OUT/term_<RANK>``
  and exiting 0 (``TERM_READY`` in ``OUT/ready_<RANK>`` once it waits).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

OUT = sys.argv[1]
MODE = sys.argv[2]
RANK = os.environ.get("RANK", "0")


class Probe:
    """A class of ``__main__``: pickled to the children, as a program's own classes are."""

    def __init__(self, tag: str) -> None:
        self.tag = tag


def child_view(probe: Probe) -> dict:
    import __main__

    return {
        "tag": probe.tag,
        "argv": sys.argv,
        "main_file": getattr(__main__, "__file__", None),
        "env_keys": sorted(os.environ),
    }


def _child(queue: multiprocessing.Queue, probe: Probe) -> None:
    queue.put(child_view(probe))


def in_child(method: str) -> dict:
    ctx: Any = multiprocessing.get_context(method)  # fork or spawn: a context with Process
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, Probe(method)))
    proc.start()
    view = queue.get(timeout=120)
    proc.join(120)
    view["exitcode"] = proc.exitcode
    return view


class Views:
    """A dataset whose items are what each DataLoader worker sees."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> dict:
        return child_view(Probe(f"loader{i}"))


def loader_views() -> list[dict]:
    from torch.utils.data import DataLoader

    loader = DataLoader(Views(), batch_size=None, num_workers=2)
    return [dict(v) for v in loader]


def _write(name: str, text: str) -> None:
    tmp = os.path.join(OUT, f".{name}.tmp")
    with open(tmp, "w") as fp:
        fp.write(text)
    os.replace(tmp, os.path.join(OUT, name))


def main() -> None:
    import __main__

    os.makedirs(OUT, exist_ok=True)
    handlers = {
        name: repr(signal.getsignal(getattr(signal, name)))
        for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
    }
    ran = []
    signal.signal(signal.SIGUSR1, lambda s, f: ran.append("SIGUSR1"))
    os.kill(os.getpid(), signal.SIGUSR1)
    seen: dict[str, Any] = {
        "argv": sys.argv,
        "path": sys.path,
        "main": {
            "name": __main__.__name__,
            "file": getattr(__main__, "__file__", None),
            "spec": getattr(getattr(__main__, "__spec__", None), "name", None),
            "package": getattr(__main__, "__package__", None),
            "loader": type(getattr(__main__, "__loader__", None)).__name__,
            "builtins": type(getattr(__main__, "__builtins__", None)).__name__,
            "doc": __main__.__doc__ is not None,
            "is_this_module": sys.modules["__main__"] is __main__
            and sys.modules["__main__"].__dict__ is globals(),
        },
        "env": dict(os.environ),
        "cmdline": Path("/proc/self/cmdline").read_bytes().decode().split("\0")[:-1],
        "orig_argv": sys.orig_argv,
        "handlers": handlers,
        "handlers_ran": ran,
        "threads": sorted(t.name for t in threading.enumerate()),
        "fork": in_child("fork"),
        "spawn": in_child("spawn"),
    }
    if MODE == "ok":  # torch only where the DataLoader is asked for
        seen["loader"] = loader_views()
    _write(f"seen_{RANK}.json", json.dumps(seen, sort_keys=True))
    atexit.register(_write, f"atexit_{RANK}", "ran")
    sys.stdout.write("out: plain line\nno newline, then \r carriage return ")
    sys.stdout.flush()
    sys.stderr.buffer.write(b"err: bytes \xff\xfe not utf-8\n")
    sys.stderr.flush()
    if MODE.startswith("exit:"):
        sys.exit(int(MODE.split(":")[1]))
    if MODE.startswith("os_exit:"):
        sys.stdout.flush()
        os._exit(int(MODE.split(":")[1]))
    if MODE == "raise":
        raise ValueError(f"rank {RANK} raised on purpose")
    if MODE.startswith("signal:"):
        os.kill(os.getpid(), getattr(signal, MODE.split(":")[1]))
        time.sleep(30)  # not reached: the signal's default action ends the process
    if MODE == "term":

        def on_term(signum: int, frame: object) -> None:
            _write(f"term_{RANK}", "handled")
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
        _write(f"ready_{RANK}", "TERM_READY")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
