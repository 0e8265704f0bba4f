"""A survivor's last words read as a stack (core/diagnosis/stacks/lastwords.py), from stderr
as real ranks print it: torch's ``[rank0]:`` tags, a tqdm bar that never ended its line,
chained exceptions, a traceback still being written; and the verdict's wording of it."""

from __future__ import annotations

import dataclasses
import json

from tui_launch.core.diagnosis.stacks.lastwords import (
    exiting,
    short_exception,
    stack_of_traceback,
)
from tui_launch.core.diagnosis.stacks.model import Frame, ProcessStack, RankStack, ThreadStack
from tui_launch.core.diagnosis.stacks.verdict import place_of

GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:53140. This is typically caused by a remote worker "
    "crashing. Check the logs of the remote worker before reporting an error. GLHF!"
)
# As the HF Trainer's rank 0 printed it: tqdm's bar, then the traceback on the same line.
TRAINER = [
    "  13%|#3        | 394/3000 [00:10<01:08, 38.31it/s]\r 13%|#3        | 395/3000 "
    "[00:10<01:08, 38.31it/s][rank0]: Traceback (most recent call last):",
    '[rank0]:   File "/w/tests/corpus/hf_trainer.py", line 76, in <module>',
    "[rank0]:     main()",
    '[rank0]:   File "/w/.venv/lib/python3.11/site-packages/transformers/trainer.py", '
    "line 2126, in training_step",
    "[rank0]:     self.accelerator.backward(loss, **kwargs)",
    '[rank0]:   File "/w/.venv/lib/python3.11/site-packages/torch/autograd/graph.py", '
    "line 979, in _engine_run_backward",
    "[rank0]:     return Variable._execution_engine.run_backward(",
    "[rank0]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f"[rank0]: {GLOO}",
]


def test_trainer_traceback_after_a_progress_bar_is_read_innermost_first():
    said = stack_of_traceback(TRAINER)
    assert said is not None
    assert said.exception == GLOO
    assert [(f.function, f.file, f.line) for f in said.frames] == [
        ("_engine_run_backward", "torch/autograd/graph.py", 979),
        ("training_step", "transformers/trainer.py", 2126),
        ("<module>", "hf_trainer.py", 76),
    ]
    assert said.frames[-1].path == "/w/tests/corpus/hf_trainer.py"


def test_the_last_of_chained_tracebacks_is_taken():
    lines = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "ValueError: first",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "b.py", line 9, in handler',
        "    raise KeyError('second')",
        "KeyError: 'second'",
    ]
    said = stack_of_traceback(lines)
    assert said is not None and said.exception == "KeyError: 'second'"
    assert [f.where for f in said.frames] == ["b.py:9 in handler"]


def test_no_traceback_or_one_still_being_written_is_none():
    assert stack_of_traceback([]) is None
    assert stack_of_traceback(["iter 5: loss 2.1", "step 6/10"]) is None
    # The exception line is not written yet: not the rank's last words.
    assert stack_of_traceback(TRAINER[:-1]) is None


def test_short_exception_drops_gloos_source_line_and_advice():
    assert short_exception(GLOO) == "RuntimeError: Connection closed by peer [127.0.0.1]:53140"
    assert short_exception("ValueError: bad") == "ValueError: bad"
    long = "RuntimeError: " + "x" * 300
    assert len(short_exception(long)) == 120 and short_exception(long).endswith("\u2026")


def _main(*frames: tuple[str, str, int]) -> ThreadStack:
    return ThreadStack(1, "MainThread", tuple(Frame(f, p, n) for f, p, n in frames), main=True)


def test_exit_handlers_and_no_frame_are_exiting_the_program_is_not():
    assert exiting(None)
    assert exiting(_main())
    # What py-spy found in the Trainer's rank 0, 20 ms after gloo raised in it.
    assert exiting(
        _main(
            ("_del_library", "torch/library.py", 665),
            ("finalize.__call__", "weakref.py", 590),
            ("finalize._exitfunc", "weakref.py", 666),
        )
    )
    assert not exiting(_main(("step", "train.py", 9), ("<module>", "train.py", 30)))


def test_the_place_of_a_survivor_read_from_its_traceback_says_what_it_raised():
    said = stack_of_traceback(TRAINER)
    assert said is not None
    main = ThreadStack(0, "MainThread", said.frames, main=True)
    proc = ProcessStack(7, "", "traceback on stderr", (main,), raised=said.exception)
    place = place_of(RankStack(0, 0, proc))
    assert place.collective is not None and place.collective.startswith("backward")
    assert place.place.endswith(
        "where it raised RuntimeError: Connection closed by peer [127.0.0.1]:53140"
    )


def test_native_frames_render_group_and_survive_json() -> None:
    # What py-spy --native read of a DDP rank waiting at the end of backward (the hang test
    # in test_verdict_programs reads it from a real run).
    from tui_launch.core.diagnosis.stacks import group_stacks
    from tui_launch.core.diagnosis.stacks.model import (
        StackDump,
        dump_from_dict,
        dump_to_dict,
        native_summary,
    )
    from tui_launch.core.diagnosis.stacks.save import render_text

    lib = "/site-packages/torch/lib/libtorch_cpu.so"
    native = (
        Frame("pthread_cond_wait", "libc.so.6", 0),
        Frame("std::condition_variable::wait", "libstdc++.so.6", 0),
        Frame("c10d::Reducer::finalize_backward", "libtorch_cpu.so", 0, lib),
        Frame("torch::autograd::Engine::execute", "libtorch_cpu.so", 0, lib),
    )
    assert native_summary(native) == (
        "c10d::Reducer::finalize_backward < torch::autograd::Engine::execute"
    )
    assert native_summary(native[:1]) == "pthread_cond_wait"
    py = (("_engine_run_backward", "torch/autograd/graph.py", 979), ("<module>", "t.py", 9))
    waiting = dataclasses.replace(_main(*py), native=native)
    ranks = tuple(
        RankStack(g, g, ProcessStack(100 + g, "S", "py-spy", (t,)))
        for g, t in enumerate([waiting, waiting, _main(*py)])  # rank 2: native not read
    )
    dump = StackDump("hang-confirm", 0.0, 1.0, ranks)
    groups = group_stacks(dump)
    assert [(g.ranks, len(g.native)) for g in groups] == [((0, 1), 4), ((2,), 0)]
    text = render_text(dump)
    assert "    [C/C++] c10d::Reducer::finalize_backward (libtorch_cpu.so)" in text
    assert text.count("[C/C++] pthread_cond_wait") == 1  # once, for the group of two
    back = dump_from_dict(json.loads(json.dumps(dump_to_dict(dump))))
    assert back == dump
