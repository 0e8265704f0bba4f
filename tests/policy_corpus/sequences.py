"""The labelled failure sequences of the restart policy's corpus.

Each sequence is a real program launched with ``tuilaunch --standalone --nproc-per-node 2``
(``capture.py`` runs it under ``--restart-policy torchrun``, so that every attempt torchrun
would run is captured) and the truth about it: ``stop`` for a deterministic bug (a restart
cannot help), ``retry`` for a transient failure (the program finishes when restarted, as it
does under torchrun). ``missed`` says why the evidence of a deterministic bug cannot prove it
(no traceback, no step seen): the policy restarts those as torchrun does.

``{tmp}`` in the arguments is a fresh directory per capture; ``{ckpt}`` a checkpoint in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOOP = "tests/policy_corpus/programs/loop.py"
DDP = "tests/policy_corpus/programs/ddp.py"
TRAINER = "tests/workers/epoch_trainer.py"
MISSING_MODULE = "tests/workers/missing_module.py"
TYPO = "{tmp}/typo.py"  # written by capture.py: a SyntaxError can't live in the repository

NO_TRACEBACK = "an exit code or a signal, no traceback: never proof"
NO_STEP = "no step seen: never proof of no progress"


@dataclass(frozen=True)
class Sequence:
    """One labelled sequence: its program, arguments and the truth about it."""

    id: str
    program: str
    args: tuple[str, ...]
    expect: str  # "stop" or "retry"
    why: str
    missed: str = ""  # a deterministic bug whose evidence proves nothing, and why
    max_restarts: int = 3
    launch: tuple[str, ...] = field(default=())  # tuilaunch's own options


def _loop(id: str, expect: str, why: str, *args: str, missed: str = "") -> Sequence:
    return Sequence(id, LOOP, args, expect, why, missed)


def _ddp(id: str, expect: str, why: str, *args: str, missed: str = "") -> Sequence:
    return Sequence(id, DDP, args, expect, why, missed)


CKPT = ("--ckpt", "{ckpt}")
FIRST_TWO = ("--attempts", "0,1")

SEQUENCES: tuple[Sequence, ...] = (
    # Deterministic bugs: a restart cannot help.
    _loop("raise-step5", "stop", "ValueError at step 5, every attempt", "--fail", "raise"),
    _loop(
        "raise-resume",
        "stop",
        "ValueError at step 5, resumed from the step-4 checkpoint each time",
        "--fail", "raise", *CKPT, "--save-every", "2",
    ),
    _loop(
        "raise-varying-message",
        "stop",
        "the message names the step, rank, pid, an address and the attempt",
        "--fail", "raise", "--at", "6", "--exc", "RuntimeError",
        "--msg", "tensor {addr} of rank {rank} (pid {pid}) bad at step {step}, attempt {attempt}",
    ),
    _loop("raise-own-type", "stop", "the program's own exception type", "--fail", "raise",
          "--exc", "TrainingError", "--msg", "no labels in shard 3"),
    _loop("raise-keyerror", "stop", "a KeyError at step 4", "--fail", "raise", "--exc",
          "KeyError", "--msg", "input_ids", "--at", "4"),
    _loop("raise-indexerror-ckpt", "stop", "IndexError at step 7, resumed from step 5",
          "--fail", "raise", "--exc", "IndexError", "--msg", "list index out of range",
          "--at", "7", *CKPT, "--save-every", "5"),
    _loop("raise-typeerror", "stop", "TypeError at step 2", "--fail", "raise", "--exc",
          "TypeError", "--msg", "unsupported operand type(s) for +: 'int' and 'str'", "--at", "2"),
    _loop("raise-rank0", "stop", "rank 0 raises at step 5", "--fail", "raise", "--rank", "0"),
    _loop("raise-mid-import", "stop", "an ImportError of a lazy import mid-training",
          "--fail", "raise", "--exc", "ImportError", "--msg", "cannot import name 'x' from 'y'"),
    _loop("json-stdlib", "stop", "the error is raised in the standard library's json",
          "--fail", "json", "--at", "3"),
    _loop("recursion", "stop", "RecursionError at step 2", "--fail", "recursion", "--at", "2"),
    _loop("assert-shape", "stop", "an assert on a batch shape at step 4", "--fail", "assert",
          "--at", "4"),
    _loop("chained", "stop", "KeyError handled by raising ValueError from it", "--fail",
          "chained", "--at", "6"),
    _loop("raise-late", "stop", "ValueError at step 10 of 12", "--fail", "raise", "--at", "10"),
    _loop("raise-zerodiv", "stop", "ZeroDivisionError at step 3", "--fail", "raise", "--exc",
          "ZeroDivisionError", "--msg", "division by zero", "--at", "3"),
    _loop("missing-file", "stop", "a data file that does not exist, before the first step",
          "--fail", "missing", "--path", "{tmp}/no-such-shard.bin"),
    _loop("raise-first-step", "stop", "ValueError at the very first step", "--fail", "raise",
          "--at", "0", missed=NO_STEP),
    _loop("raise-before-steps", "stop", "a config error before the first step", "--fail",
          "raise", "--exc", "KeyError", "--msg", "model.hidden_size", "--at", "-1"),
    _loop("raise-no-lines", "stop", "ValueError at step 5 of a loop that prints nothing",
          "--fail", "raise", "--lines", "none", missed=NO_STEP),
    _loop("raise-epoch-lines", "stop", "ValueError at epoch 5 of `epoch E rank R` lines",
          "--fail", "raise", "--lines", "epoch"),
    _loop("exit3", "stop", "os._exit(3) at step 5, every attempt", "--fail", "exit", "--code",
          "3", "--msg", "giving up", missed=NO_TRACEBACK),
    _loop("sysexit", "stop", "sys.exit('fatal: ...') at step 5", "--fail", "sysexit", "--msg",
          "fatal: tokenizer vocab does not match the model", missed=NO_TRACEBACK),
    _loop("segv", "stop", "a NULL read (SIGSEGV) at step 4", "--fail", "segv", "--at", "4",
          missed=NO_TRACEBACK),
    _loop("abort", "stop", "os.abort() at step 4", "--fail", "abort", "--at", "4",
          missed=NO_TRACEBACK),
    Sequence("module-not-found", MISSING_MODULE, (), "stop", "import of a missing module"),
    Sequence("syntax-error", TYPO, (), "stop", "a SyntaxError in the script"),
    _loop("import-optional", "stop", "an optional dependency missing before the first step",
          "--fail", "raise", "--exc", "ModuleNotFoundError", "--msg", "No module named 'wandb'",
          "--at", "-1"),
    _loop("argparse", "stop", "an unknown argument: argparse exits 2", "--no-such-option"),
    _ddp("ddp-shape", "stop", "torch.cat of mismatched shapes at step 4 (raised in torch)",
         "--fail", "shape"),
    _ddp("ddp-nan-record", "stop", "a NaN check raises at step 3, @record", "--fail", "nan",
         "--at", "3", "--record"),
    _ddp("ddp-shape-record", "stop", "torch.cat of mismatched shapes, @record", "--fail",
         "shape", "--at", "5", "--record"),
    _ddp("ddp-nan-rank0", "stop", "rank 0's NaN check raises at step 6", "--fail", "nan",
         "--at", "6", "--rank", "0"),
    # Transient failures: the program finishes when restarted.
    Sequence(
        "issue32-trainer",
        TRAINER,
        (),
        "retry",
        "issue 32: rank 1 os._exit(1) at epoch 2 on attempts 0 and 1, then trains to the end",
    ),
    _loop("issue32-loop", "retry", "issue 32's shape without torch: exit 1 at epoch 2 twice, "
          "a line naming the attempt", "--fail", "exit", "--lines", "epoch", "--at", "2",
          *FIRST_TWO, *CKPT, "--msg", "rank {rank}: simulated failure in epoch {step}, attempt "
          "{attempt}"),
    _loop("exit-twice-steps", "retry", "exit 1 at step 5 twice, steps seen", "--fail", "exit",
          *FIRST_TWO, "--msg", "error: lost the data server"),
    _loop("exit-twice-no-lines", "retry", "exit 1 twice, nothing printed", "--fail", "exit",
          *FIRST_TWO, "--lines", "none", "--msg", ""),
    _loop("exit-once", "retry", "a flaky exit 1 once", "--fail", "exit", "--attempts", "0",
          "--msg", "Error: worker {rank} failed"),
    _loop("exit137-twice", "retry", "exit 137 twice (a wrapper's SIGKILL)", "--fail", "exit",
          "--code", "137", *FIRST_TWO, "--msg", "Killed"),
    _loop("sysexit-once", "retry", "sys.exit with a message once", "--fail", "sysexit",
          "--attempts", "0", "--msg", "error: data server unavailable"),
    _loop("kill-twice", "retry", "SIGKILL at step 5 twice (the OOM killer, a scheduler)",
          "--fail", "kill", *FIRST_TWO, *CKPT, "--save-every", "4"),
    _loop("kill-once", "retry", "SIGKILL once", "--fail", "kill", "--attempts", "0"),
    _loop("kill-no-lines", "retry", "SIGKILL twice, nothing printed", "--fail", "kill",
          *FIRST_TWO, "--lines", "none"),
    _loop("term-twice", "retry", "SIGTERM twice at step 3", "--fail", "term", *FIRST_TWO,
          "--at", "3"),
    _loop("segv-once", "retry", "SIGSEGV once", "--fail", "segv", "--attempts", "0"),
    _loop("abort-twice", "retry", "SIGABRT twice at step 4, then fine", "--fail", "abort",
          *FIRST_TWO, "--at", "4"),
    _loop("memory-twice", "retry", "MemoryError twice at step 3 (one batch size too big)",
          "--fail", "memory", *FIRST_TWO, "--at", "3"),
    _loop("memory-once", "retry", "MemoryError once", "--fail", "memory", "--attempts", "0"),
    _loop("memory-no-lines", "retry", "MemoryError twice, nothing printed", "--fail", "memory",
          *FIRST_TWO, "--lines", "none"),
    _loop("connect-twice", "retry", "a service refuses connections twice at step 2",
          "--fail", "connect", *FIRST_TWO, "--at", "2"),
    _loop("connect-before-steps", "retry", "a service refuses connections twice at start",
          "--fail", "connect", *FIRST_TWO, "--at", "-1"),
    _loop("race-steps", "retry", "a data race: the same line twice, at steps 4 and 7",
          "--fail", "race", *FIRST_TWO, "--at", "4"),
    Sequence("race-ckpt", LOOP, ("--fail", "race", *FIRST_TWO, "--at", "6", *CKPT,
             "--save-every", "3"), "retry", "a data race after resuming: the same line, "
             "steps 6 and 9"),
    _loop("race-no-lines", "retry", "a data race, the same line twice, nothing printed",
          "--fail", "race", *FIRST_TWO, "--lines", "none"),
    _loop("race-epoch-lines", "retry", "a data race, the same line twice, `epoch E` lines",
          "--fail", "race", *FIRST_TWO, "--lines", "epoch"),
    _loop("missing-then-written", "retry", "rank 1 reads a file rank 0 has not written yet",
          "--fail", "missing", "--path", "{tmp}/ready.txt", "--writer"),
    _loop("raise-once", "retry", "ValueError once (a bad record in a shuffled stream)",
          "--fail", "raise", "--attempts", "0", "--msg", "bad record"),
    _loop("raise-once-before-steps", "retry", "an exception before the first step, once",
          "--fail", "raise", "--attempts", "0", "--at", "-1", "--exc", "RuntimeError",
          "--msg", "tokenizer cache busy"),
    _loop("raise-twice-no-lines", "retry", "the same exception twice, nothing printed, "
          "then fine", "--fail", "raise", *FIRST_TWO, "--lines", "none", "--exc",
          "RuntimeError", "--msg", "CUBLAS handle busy"),
    _ddp("ddp-peer-twice", "retry", "rank 0 dies (SIGKILL) at step 4 twice: rank 1's "
         "all_reduce breaks", "--fail", "peer", "--rank", "0", *FIRST_TWO),
    _ddp("ddp-peer-once", "retry", "rank 1 dies once", "--fail", "peer", "--attempts", "0"),
    _ddp("ddp-store-twice", "retry", "a store blip: the side store is down on two attempts",
         "--fail", "store", *FIRST_TWO),
    _ddp("ddp-store-record", "retry", "a store blip once, @record", "--fail", "store",
         "--attempts", "0", "--record"),
    _ddp("ddp-timeout", "retry", "rank 0 stalls past the gloo timeout once: rank 1 times out",
         "--fail", "timeout", "--rank", "0", "--attempts", "0"),
    _ddp("ddp-cpu-oom-twice", "retry", "torch's CPU allocator cannot allocate, twice at "
         "step 4 (one batch size too big)", "--fail", "oom", *FIRST_TWO),
)  # fmt: skip
