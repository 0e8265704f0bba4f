"""core.periodic: the one loop helper every sampler and watcher runs on."""

from __future__ import annotations

import threading
import time

from tui_launch.core.periodic import Periodic


def test_calls_on_its_own_named_thread_until_stopped() -> None:
    names: list[str] = []
    three = threading.Event()

    def tick() -> None:
        names.append(threading.current_thread().name)
        if len(names) >= 3:
            three.set()

    loop = Periodic("tuilaunch-test", 0.01, tick).start()
    assert three.wait(10)
    loop.stop(timeout=5)
    assert not loop.running
    n = len(names)
    assert set(names) == {"tuilaunch-test"}
    assert loop.ticks == n  # no call after stop returned


def test_wake_runs_the_next_call_at_once() -> None:
    called = threading.Event()
    loop = Periodic("tuilaunch-test", 3600, called.set, first_delay=3600).start()
    try:
        assert not called.is_set()
        loop.wake()
        assert called.wait(10)
    finally:
        loop.stop(timeout=5)
    assert not loop.running


def test_an_error_does_not_end_the_loop() -> None:
    seen: list[BaseException] = []
    calls = 0
    second = threading.Event()

    def tick() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("boom")
        second.set()

    loop = Periodic("tuilaunch-test", 0.01, tick, on_error=seen.append).start()
    assert second.wait(10)
    loop.stop(timeout=5)
    assert [str(e) for e in seen] == ["boom"]


def test_returned_delay_replaces_the_grid_and_final_call_runs_once_on_stop() -> None:
    calls: list[str] = []
    first = threading.Event()

    def tick() -> float:
        calls.append("tick")
        first.set()
        return 3600.0  # back off: no second call before stop

    loop = Periodic("tuilaunch-test", 0.001, tick, final_call=True).start()
    assert first.wait(10)
    loop.stop(timeout=5)
    assert calls == ["tick", "tick"]  # the first call, then the final one


def test_setup_runs_first_on_the_thread_and_its_cpu_is_counted() -> None:
    """``setup`` (opening NVML, say) runs once on the loop's thread before the first call;
    its CPU time is in ``cpu_seconds`` and ``setup_cpu_seconds``."""
    order: list[tuple[str, str]] = []
    first = threading.Event()

    def setup() -> None:
        order.append(("setup", threading.current_thread().name))
        deadline = time.thread_time() + 0.02
        while time.thread_time() < deadline:  # some CPU to count
            pass

    def tick() -> None:
        order.append(("tick", threading.current_thread().name))
        first.set()

    loop = Periodic("tuilaunch-test", 3600, tick, setup=setup).start()
    assert first.wait(10)
    loop.stop(timeout=5)
    assert order == [("setup", "tuilaunch-test"), ("tick", "tuilaunch-test")]
    assert loop.setup_cpu_seconds >= 0.02
    assert loop.cpu_seconds >= loop.setup_cpu_seconds


def test_a_failing_setup_is_reported_and_the_loop_goes_on() -> None:
    seen: list[BaseException] = []
    called = threading.Event()

    def setup() -> None:
        raise OSError("no library")

    loop = Periodic("tuilaunch-test", 3600, called.set, setup=setup, on_error=seen.append)
    loop.start()
    assert called.wait(10)
    loop.stop(timeout=5)
    assert [str(e) for e in seen] == ["no library"]


def test_stopped_before_the_first_call_makes_none() -> None:
    """Stop during ``setup``: the loop ends without calling ``fn`` (no final_call asked)."""
    calls: list[int] = []
    in_setup, release = threading.Event(), threading.Event()

    def setup() -> None:
        in_setup.set()
        release.wait(10)

    loop = Periodic("tuilaunch-test", 0.01, lambda: calls.append(1), setup=setup).start()
    assert in_setup.wait(10)
    loop.stop()
    release.set()
    loop.stop(timeout=5)
    assert not loop.running and calls == []
