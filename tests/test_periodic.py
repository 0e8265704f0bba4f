"""core.periodic: the one loop helper every sampler and watcher runs on."""

from __future__ import annotations

import threading

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
