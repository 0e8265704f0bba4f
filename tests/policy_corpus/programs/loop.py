"""A training loop without torch that fails on request, the way real programs fail.

Every rank steps ``--steps`` times, ``--interval`` seconds each, printing its progress in
``--lines`` form (``step``: ``step N/T loss L``, which the progress parser reads; ``epoch``:
``epoch E rank R``, which it need not; ``none``). With ``--ckpt`` it resumes from the step
its rank saved (every ``--save-every`` steps). ``--fail KIND`` on ``--rank`` at ``--at``, on the
attempts ``--attempts`` names (``all``, or ``0,1``: ``TORCHELASTIC_RESTART_COUNT``):

  raise      raise ``--exc`` with ``--msg`` (``{step}``, ``{rank}``, ``{attempt}``, ``{addr}``,
             ``{pid}`` filled in) in a helper of the loop
  json       parse a corrupt record with the standard library (the error is raised there)
  exit       print ``--msg`` then ``os._exit(--code)``: no traceback
  sysexit    ``sys.exit(--msg)``: the message on stderr, exit 1, no traceback
  kill       SIGKILL itself (what the OOM killer or a scheduler does)
  term       SIGTERM itself
  segv       a NULL read through ctypes (SIGSEGV)
  abort      ``os.abort()`` (SIGABRT)
  memory     allocate ``--mb`` megabytes at once (a real ``MemoryError`` when it is too much)
  recursion  recurse without end (``RecursionError``)
  assert     ``assert`` a shape that does not hold (``AssertionError``)
  chained    a ``KeyError`` handled by raising ``ValueError`` from it
  connect    connect to a TCP port nobody listens on (``ConnectionRefusedError``)
  missing    open ``--path`` (``FileNotFoundError``) before the first step, unless it exists;
             with ``--writer`` rank 0 starts a helper that writes it 0.2 s later:
             rank 1 misses it on the first attempt and finds it on the next (a race)
  race       raise ``RuntimeError`` from the same line at step ``--at`` + attempt x ``--drift``

``--at -1`` fails before the first step.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time


class TrainingError(Exception):
    """A program's own exception type."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--lines", choices=("step", "epoch", "none"), default="step")
    p.add_argument("--ckpt", default="")
    p.add_argument("--save-every", type=int, default=1)
    p.add_argument("--fail", default="")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--attempts", default="all")
    p.add_argument("--exc", default="ValueError")
    p.add_argument("--msg", default="bad batch")
    p.add_argument("--code", type=int, default=1)
    p.add_argument("--mb", type=int, default=1 << 30)
    p.add_argument("--path", default="")
    p.add_argument("--writer", action="store_true")
    p.add_argument("--drift", type=int, default=3)
    return p.parse_args()


def fill(template: str, step: int, rank: int, attempt: int) -> str:
    return template.format(
        step=step, rank=rank, attempt=attempt, addr=hex(id(object())), pid=os.getpid()
    )


def raise_it(a: argparse.Namespace, step: int, rank: int, attempt: int) -> None:
    types: dict[str, type[Exception]] = {
        "ValueError": ValueError,
        "RuntimeError": RuntimeError,
        "KeyError": KeyError,
        "TypeError": TypeError,
        "IndexError": IndexError,
        "ZeroDivisionError": ZeroDivisionError,
        "TrainingError": TrainingError,
        "ImportError": ImportError,
        "ModuleNotFoundError": ModuleNotFoundError,
    }
    raise types[a.exc](fill(a.msg, step, rank, attempt))


def recurse(n: int) -> int:
    return recurse(n + 1) + 1


def fail(a: argparse.Namespace, step: int, rank: int, attempt: int) -> None:
    kind = a.fail
    if kind == "raise":
        raise_it(a, step, rank, attempt)
    elif kind == "json":
        json.loads('{"tokens": [1, 2,')
    elif kind == "exit":
        print(fill(a.msg, step, rank, attempt), flush=True)
        os._exit(a.code)
    elif kind == "sysexit":
        sys.exit(fill(a.msg, step, rank, attempt))
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif kind == "segv":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    elif kind == "memory":
        hog = bytearray(a.mb << 20)
        del hog
    elif kind == "recursion":
        recurse(0)
    elif kind == "assert":
        shape = (step % 3 + 2, 4)
        assert shape == (4, 4), f"batch shape {shape}"
    elif kind == "chained":
        vocab = {"a": 0}
        try:
            vocab[f"token{step}"]
        except KeyError as e:
            raise ValueError(f"unknown token at step {step}") from e
    elif kind == "connect":
        with socket.socket() as s:
            s.settimeout(1.0)
            s.connect(("127.0.0.1", 9))
    elif kind == "race":
        raise RuntimeError(f"dictionary changed size during iteration (step {step})")


def main() -> None:
    a = parse()
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    failing = a.attempts == "all" or str(attempt) in a.attempts.split(",")
    on_me = a.fail and failing and rank == a.rank
    at = a.at + attempt * a.drift if a.fail == "race" else a.at
    if a.writer and rank == 0 and not os.path.exists(a.path):
        # A download helper of its own session (it outlives a terminated rank): the file is
        # there 0.2 s later, after rank 1 has looked for it.
        code = "import sys, time; time.sleep(0.2); open(sys.argv[1], 'w').write('ready')"
        subprocess.Popen([sys.executable, "-c", code, a.path], start_new_session=True)
    if a.fail == "missing" and rank == a.rank:
        if a.writer and attempt > 0:
            # The helper started in attempt 0 writes the file; on a loaded machine its
            # interpreter may still be starting when this attempt begins: wait for it, as a
            # program waits for a download in progress (attempt 0 never waits: it misses it).
            deadline = time.monotonic() + 60
            while not os.path.exists(a.path) and time.monotonic() < deadline:
                time.sleep(0.05)
        with open(a.path) as fp:  # before the first step: the data, a config, a snapshot
            fp.read()
    start = 0
    ckpt = f"{a.ckpt}.{rank}" if a.ckpt else ""
    if ckpt and os.path.exists(ckpt):
        with open(ckpt) as fp:
            start = int(fp.read() or 0)
        print(f"rank {rank} resumed at step {start}", flush=True)
    if on_me and at < 0:
        fail(a, 0, rank, attempt)
    for step in range(start, a.steps):
        if on_me and step == at:
            fail(a, step, rank, attempt)
        if a.lines == "step":
            print(f"step {step + 1}/{a.steps} loss {1.0 / (step + 1):.4f}", flush=True)
        elif a.lines == "epoch":
            print(f"epoch {step} rank {rank}", flush=True)
        if ckpt and (step + 1) % a.save_every == 0:
            with open(ckpt, "w") as fp:
                fp.write(str(step + 1))
        time.sleep(a.interval)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
