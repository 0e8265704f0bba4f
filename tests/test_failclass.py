"""Failure classes, the restart policy's rules and the exit-code table, as pure functions."""

from __future__ import annotations

import signal

import pytest

from tui_launch.core.model import exitcodes, failclass, policy
from tui_launch.core.model.failclass import FailureClass
from tui_launch.core.model.policy import AttemptRecord, PolicyConfig, RestartPolicy, parse_storm


def classify(**kw):
    base = {"exit_code": 1, "message": "", "traceback": None, "stderr_tail": ()}
    return failclass.classify(**{**base, **kw})


TB = 'Traceback (most recent call last):\n  File "/x/train.py", line 3, in <module>\n'


@pytest.mark.parametrize(
    ("kw", "cls"),
    [
        ({"traceback": TB + "ModuleNotFoundError: No module named 'foo'"}, "startup"),
        ({"traceback": TB + "SyntaxError: invalid syntax"}, "startup"),
        (
            {"stderr_tail": ("python: can't open file '/x/tarin.py': [Errno 2] No such file",)},
            "startup",
        ),
        (
            {"exit_code": 2, "stderr_tail": ("usage: t.py", "t.py: error: unrecognized x")},
            "startup",
        ),
        ({"traceback": TB + "ImportError: cannot import name 'x'", "step": 40}, "exception"),
        ({"traceback": TB + "ValueError: bad batch", "step": 3}, "exception"),
        ({"traceback": TB + "torch.OutOfMemoryError: CUDA out of memory. Tried"}, "oom"),
        (
            {
                "traceback": TB + "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. "
                "DefaultCPUAllocator: not enough memory: you tried to allocate 703687441 bytes."
            },
            "oom",
        ),
        ({"exit_code": -9, "oom_kill": "the run's cgroup (memory.events oom_kill +1)"}, "oom"),
        ({"exit_code": -9, "oom_kill": "the kernel log: Killed process 42"}, "oom-outside"),
        ({"exit_code": -9}, "signal"),
        ({"exit_code": -15, "caused_by": "sent by tuilaunch (inject)"}, "signal"),
        ({"exit_code": -11}, "crash"),
        ({"traceback": TB + "torch.distributed.DistBackendError: NCCL error in: x"}, "backend"),
        ({"stderr_tail": ("RuntimeError: Connection reset by peer",)}, "backend"),
        ({"exit_code": -6, "main_returned": True}, "teardown"),
        ({"exit_code": -15, "collateral": True}, "collateral"),
        ({"hung": True, "exit_code": 0}, "hang"),
    ],
)
def test_classify(kw, cls):
    assert classify(**kw).cls == cls


# What the GPU rules must not take (tests/gpu_failures/ has the posted text they must take).
NCCL_INFO = "host:1:2 [0] NCCL WARN NET/Plugin: could not find libnccl-net.so, using internal"


@pytest.mark.parametrize(
    ("kw", "cls"),
    [
        # The program's own exception after a harmless NCCL WARN at init stays the program's.
        ({"stderr_tail": (NCCL_INFO, *TB.splitlines(), "ValueError: bad batch")}, "exception"),
        # Xid 13 and 43 are the program's faults in the kernel log; 48 (ECC) is the GPU's.
        (
            {"stderr_tail": ("NVRM: Xid (PCI:0000:01:00): 13, pid=7, Graphics Exception",)},
            "exception",
        ),
        (
            {
                "stderr_tail": (
                    "NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=python, "
                    "An uncorrectable double bit error",
                )
            },
            "gpu-fault",
        ),
        # A program that logs the GPU's ECC counters has not had a GPU fault.
        ({"stderr_tail": ("gpu0 uncorrectable ECC errors: 0", "ValueError: x")}, "exception"),
        # A segfault whose backtrace is not in NCCL is the program's crash.
        ({"exit_code": -11, "stderr_tail": ("[ 1] /x/myext.so(+0x12)[0x7f]",)}, "crash"),
        # A worker that segfaulted is not out of memory.
        (
            {
                "stderr_tail": (
                    "RuntimeError: DataLoader worker (pid 7) is killed by signal: "
                    "Segmentation fault.",
                )
            },
            "exception",
        ),
        # The watchdog's timeout alone is NCCL's; with the program's CUDA fault, the program's.
        (
            {
                "exit_code": -6,
                "stderr_tail": (
                    "[E ProcessGroupNCCL.cpp:1] [Rank 0] NCCL "
                    "watchdog thread terminated with exception: CUDA "
                    "error: an illegal memory access was encountered",
                ),
            },
            "crash",
        ),
    ],
)
def test_gpu_rules_take_only_their_own(kw, cls):
    assert classify(**kw).cls == cls


def test_gpu_fault_stops_only_when_the_next_attempt_faults_again():
    def rec(attempt, cls, deliberate=False):
        return AttemptRecord(attempt, float(attempt), cls, "", 5, deliberate=deliberate)

    p = RestartPolicy()
    assert p.decide(rec(0, "gpu-fault"), 3).action == "restart"
    assert p.decide(rec(1, "backend"), 2).action == "restart"  # not the GPU this time
    assert p.decide(rec(2, "gpu-fault"), 1).action == "restart"
    d = p.decide(rec(3, "gpu-fault"), 1)
    assert (d.action, d.rule) == ("stop", "gpu-fault") and "attempt 2" in d.reason
    # An injected failure between two faults does not count, as for every rule.
    p = RestartPolicy()
    p.decide(rec(0, "gpu-fault"), 3)
    assert p.decide(rec(1, "signal", deliberate=True), 2).action == "restart"
    assert p.decide(rec(2, "gpu-fault"), 2).rule == "gpu-fault"


def test_exception_detail_names_type_and_step():
    c = classify(traceback=TB + "ValueError: bad batch", step=7)
    assert c.detail == "ValueError at step 7"


def rec(attempt, cls="exception", sig="ValueError: x @ f", step=None, t=0.0, **kw):
    return AttemptRecord(attempt=attempt, time=t, cls=cls, signature=sig, step=step, **kw)


def test_startup_error_stops_at_once():
    d = RestartPolicy().decide(rec(0, cls="startup"), 3)
    assert (d.action, d.rule) == ("stop", "startup")


def test_same_failure_at_same_step_stops_the_second_time():
    p = RestartPolicy()
    assert p.decide(rec(0, step=5, fail_step=3), 3).action == "restart"
    d = p.decide(rec(1, step=5, fail_step=3), 2)
    assert (d.action, d.rule) == ("stop", "same-failure")
    assert "the same exception as attempt 0 at step 3 (ValueError: x @ f)" in d.reason


def test_same_failure_after_progress_restarts():
    p = RestartPolicy()
    p.decide(rec(0, fail_step=3), 3)
    assert p.decide(rec(1, fail_step=9), 2).action == "restart"


def test_storm_needs_steps_and_no_gain():
    p = RestartPolicy(PolicyConfig(storm_failures=3, storm_minutes=10))
    assert p.decide(rec(0, cls="signal", sig="a", step=4, t=0), 9).action == "restart"
    assert p.decide(rec(1, cls="signal", sig="b", step=4, t=60), 8).action == "restart"
    d = p.decide(rec(2, cls="signal", sig="c", step=3, t=120), 7)
    assert (d.action, d.rule) == ("stop", "storm")
    # Steps gained: no storm.
    q = RestartPolicy()
    for i, step in enumerate((4, 8, 12)):
        assert q.decide(rec(i, cls="signal", sig=str(i), step=step, t=i), 9).action == "restart"
    # No progress lines: no evidence, no storm.
    r = RestartPolicy()
    for i in range(5):
        assert r.decide(rec(i, cls="signal", sig=str(i), t=i), 9).action == "restart"
    # Outside the window: no storm.
    w = RestartPolicy(PolicyConfig(storm_failures=3, storm_minutes=1))
    for i in range(4):
        d = w.decide(rec(i, cls="signal", sig=str(i), step=4, t=i * 120.0), 9)
        assert d.action == "restart"


def test_storm_is_off_by_default():
    # Three signals at the same step within a minute: a pattern, not proof (a store blip, a
    # flaky node); the default policy spends the budget as torchrun does.
    p = RestartPolicy()
    for i in range(5):
        d = p.decide(rec(i, cls="signal", sig="", step=4, fail_step=4, t=i), 9)
        assert (d.action, d.rule) == ("restart", "restart")


def tb(*frames: tuple[str, int, str], last: str) -> str:
    body = "".join(f'  File "{f}", line {n}, in {fn}\n    x()\n' for f, n, fn in frames)
    return f"Traceback (most recent call last):\n{body}{last}"


LIB = "/usr/lib/python3.12/site-packages/torch/functional.py"


def test_fingerprint_is_the_type_the_masked_message_and_the_innermost_own_frame():
    a = tb(
        ("/home/u/train.py", 80, "<module>"),
        ("/home/u/train.py", 41, "step"),
        (LIB, 200, "cat"),
        last="RuntimeError: size 3 != 4 on rank 1 (tensor at 0x7f00aa)",
    )
    b = a.replace("size 3 != 4 on rank 1", "size 7 != 9 on rank 0").replace("0x7f00aa", "0x1")
    fa = failclass.fingerprint("", a, ())
    assert fa == "RuntimeError: size # != # on rank # (tensor at #) @ /home/u/train.py:41 in step"
    assert failclass.fingerprint("", b, ()) == fa
    # Another line of the program's code, another message: another failure.
    assert failclass.fingerprint("", a.replace("line 41", "line 42"), ()) != fa
    assert failclass.fingerprint("", a.replace("size", "shape"), ()) != fa
    # From the stderr tail, with torch's rank prefixes, the same.
    tail = tuple(f"[rank1]: {ln}" for ln in a.splitlines())
    assert failclass.fingerprint("", None, tail) == fa


@pytest.mark.parametrize(
    "evidence",
    [
        {"message": "exit 1", "traceback": None, "stderr_tail": ()},
        {"message": "", "traceback": None, "stderr_tail": ("rank 1: error in attempt 0",)},
        {"message": "", "traceback": tb((LIB, 3, "f"), last="ValueError: x"), "stderr_tail": ()},
        {
            "message": "",
            "traceback": tb(("/home/u/t.py", 3, "f"), last="KeyboardInterrupt"),
            "stderr_tail": (),
        },
    ],
    ids=["exit-code", "printed-line", "no-own-frame", "stopped"],
)
def test_fingerprint_is_empty_without_proof(evidence):
    assert failclass.fingerprint(**evidence) == ""


def test_an_exit_code_twice_is_not_the_same_failure():
    # Issue 32: rank 1 exits 1 at the same place twice, no traceback, no step seen.
    p = RestartPolicy()
    assert p.decide(rec(0, sig=""), 3).action == "restart"
    assert p.decide(rec(1, sig=""), 2).action == "restart"
    # Steps seen, the same step, still no traceback: no proof.
    q = RestartPolicy()
    q.decide(rec(0, sig="", step=5, fail_step=5), 3)
    assert q.decide(rec(1, sig="", step=5, fail_step=5), 2).action == "restart"


def test_the_same_traceback_with_no_step_seen_is_not_proof():
    p = RestartPolicy()
    p.decide(rec(0), 3)
    assert p.decide(rec(1), 2).action == "restart"


@pytest.mark.parametrize("cls", ["oom", "backend", "signal", "crash", "hang"])
def test_only_an_exception_can_be_the_same_failure(cls):
    p = RestartPolicy()
    p.decide(rec(0, cls=cls, step=5, fail_step=5), 3)
    assert p.decide(rec(1, cls=cls, step=5, fail_step=5), 2).action == "restart"


def test_a_missing_file_stops_only_when_it_is_missing_again():
    sig = "FileNotFoundError: [Errno #] No such file: 'data.bin' @ /u/t.py:3 in load"
    p = RestartPolicy()
    first = rec(0, cls="startup", sig=sig, etype="FileNotFoundError")
    assert p.decide(first, 3).action == "restart"
    d = p.decide(rec(1, cls="startup", sig=sig, etype="FileNotFoundError"), 2)
    assert (d.action, d.rule) == ("stop", "startup")


def test_attempt_record_reads_the_root_cause():
    from tui_launch.core.model.events import Failure
    from tui_launch.core.model.policy import attempt_record

    trace = tb(("/home/u/train.py", 9, "main"), last="ValueError: bad batch 7")
    base = {"host": "h", "signal": None, "hint": None, "message": "", "error_file": None}
    root = Failure(
        attempt=2, local_rank=1, global_rank=1, pid=10, exit_code=1, time=5.0,
        traceback=trace, stderr_tail=(), failure_class="exception", step=None, **base,
    )  # fmt: skip
    peer = Failure(
        attempt=2, local_rank=0, global_rank=0, pid=11, exit_code=-15, time=6.0,
        traceback=None, stderr_tail=(), collateral=True, failure_class="collateral", **base,
    )  # fmt: skip
    r = attempt_record(2, (peer, root), time=7.0, step=12, exits={1: 1}, local_ranks=(0, 1))
    assert r is not None
    assert (r.cls, r.etype, r.step, r.fail_step, r.deliberate) == (
        "exception",
        "ValueError",
        12,
        12,
        False,
    )
    assert r.signature == "ValueError: bad batch # @ /home/u/train.py:9 in main"
    assert attempt_record(2, (), time=7.0, step=None, exits={}, local_ranks=()) is None


def test_deliberate_failures_do_not_count():
    p = RestartPolicy()
    p.decide(rec(0, fail_step=3), 3)
    assert p.decide(rec(1, fail_step=3, deliberate=True), 2).action == "restart"


def test_teardown_on_every_rank_is_not_restarted():
    d = RestartPolicy().decide(rec(0, cls="teardown", all_returned=True), 3)
    assert (d.action, d.rule) == ("stop", "teardown")


def test_torchrun_policy_restarts_until_the_budget_is_spent():
    p = RestartPolicy(PolicyConfig(mode="torchrun"))
    assert p.decide(rec(0, cls="startup"), 1).action == "restart"
    assert p.decide(rec(1, cls="startup"), 0).rule == "budget"


def test_parse_storm():
    assert parse_storm("3,10") == (3, 10.0)
    assert parse_storm("5") == (5, 10.0)
    assert parse_storm("0")[0] == 0
    for bad in ("1,10", "3,0", "x"):
        with pytest.raises(ValueError):
            parse_storm(bad)


@pytest.mark.parametrize(
    ("outcome", "cls", "torchrun", "ours"),
    [
        ("succeeded", "", 0, 0),
        ("succeeded", "teardown", 1, 0),
        ("failed", "startup", 1, 1),
        ("failed", "exception", 1, 1),
        ("failed", "oom", 1, 1),
        ("failed", "oom-outside", 1, 75),
        ("failed", "signal", 1, 75),
        ("failed", "backend", 1, 75),
        ("failed", "hang", 1, 75),
        ("error", "node-lost", 1, 75),
        ("preempted", "preempted", 128 + signal.SIGUSR1, 143),
        ("stopped", "", 130, 130),
        ("usage", "", 2, 2),
    ],
)
def test_exit_code_table(outcome, cls, torchrun, ours):
    assert exitcodes.exit_code(outcome, cls, torchrun, "tuilaunch") == ours
    assert exitcodes.exit_code(outcome, cls, torchrun, "torchrun") == torchrun


@pytest.mark.parametrize("cls", list(FailureClass))
def test_every_failure_class_has_a_policy_rule_an_exit_code_and_words(cls):
    # A new class added to the enum fails here until policy, exitcodes and describe know it.
    assert policy.RULES[cls] in ("startup", "same-failure", "teardown", "gpu-fault", "restart")
    assert exitcodes.CLASS_MEANINGS[cls] in ("program", "infrastructure")
    assert failclass.WORDS[cls] and failclass.describe(cls, "") == failclass.WORDS[cls]
    # What each table says is what the policy and the exit code do, for the member and for
    # the plain word a journal reads back.
    code = exitcodes.exit_code("failed", cls, 1, "tuilaunch")
    expected = exitcodes.INFRASTRUCTURE if exitcodes.CLASS_MEANINGS[cls] == "infrastructure" else 1
    assert code == expected == exitcodes.exit_code("failed", cls.value, 1, "tuilaunch")
    assert policy.rule_of(cls) == policy.rule_of(cls.value) == policy.RULES[cls]


def test_the_tables_are_exactly_the_classes():
    assert set(policy.RULES) == set(exitcodes.CLASS_MEANINGS) == set(failclass.WORDS)
    assert set(policy.RULES) == set(FailureClass)
    assert tuple(c.value for c in FailureClass) == failclass.CLASSES
    # The class sets the rest of the launcher reads agree with the exit-code table.
    infra = {c for c, m in exitcodes.CLASS_MEANINGS.items() if m == "infrastructure"}
    assert infra == failclass.INFRASTRUCTURE | {FailureClass.OOM_OUTSIDE}
    program = {c for c, m in exitcodes.CLASS_MEANINGS.items() if m == "program"}
    assert program >= failclass.PROGRAM


def test_unknown_or_no_class_is_a_program_failure_restarted_by_the_policy():
    # "" (no class) and a word from a newer journal: as before the enum.
    for cls in ("", "from-the-future"):
        assert exitcodes.meaning("failed", cls) == "program"
        assert policy.rule_of(cls) == "restart"
        assert failclass.describe(cls, "x") == f"{cls} (x)"


def test_the_options_choices_are_the_enums_words():
    assert policy.POLICIES == ("smart", "torchrun") == tuple(p.value for p in policy.Policy)
    assert exitcodes.STYLES == ("tuilaunch", "torchrun")
    assert tuple(s.value for s in exitcodes.ExitStyle) == exitcodes.STYLES


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--restart-storm", "1,5"], "N must be >= 2"),
        (["--restart-storm", "x"], "--restart-storm"),
        (["--preempt-signals", "SIGKILL"], "not a signal that can be handled: SIGKILL"),
        (["--restart-policy", "maybe"], "invalid choice"),
        (["--exit-codes", "posix"], "invalid choice"),
    ],
)
def test_bad_policy_options_are_one_line_usage_errors(capsys, argv, words):
    from tui_launch.core.launch.args import parse

    with pytest.raises(SystemExit) as e:
        parse([*argv, "train.py"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_policy_options_reach_the_run_configuration():
    from tui_launch.core.launch.args import parse
    from tui_launch.core.run.config import RunConfig

    _, opts = parse(
        ["--restart-storm", "4,2.5", "--exit-codes", "torchrun", "--preempt-signals", "USR2",
         "--restart-policy", "torchrun", "train.py"]
    )  # fmt: skip
    config = RunConfig.from_options(opts)
    assert (config.policy.mode, config.policy.storm_failures) == ("torchrun", 4)
    assert config.policy.storm_minutes == 2.5 and config.exit_codes == "torchrun"
    assert config.preempt_signals == (signal.SIGUSR2,)
    default = RunConfig.from_options(parse(["train.py"])[1])
    assert default.preempt_signals == (signal.SIGTERM, signal.SIGUSR1)
    assert default.policy.mode == "smart" and default.exit_codes == "tuilaunch"


def test_header_shows_preempted_with_the_grace_left():
    from rich.text import Text

    from tui_launch.core.model.events import Preempted
    from tui_launch.core.model.store import RunStore
    from tui_launch.tui.panels.render import header

    store = RunStore()
    e = Preempted(signal="SIGUSR1", grace=30.0, deadline=0.0, mono=100.0, wall=0.0)
    snap = store.post(e)
    text = header(snap, now=108.2)
    assert isinstance(text, Text)
    assert text.plain.startswith(" PREEMPTED  22s grace left"), text.plain
    assert "PREEMPTED  0s grace left" in header(snap, now=200.0).plain
