"""Unit tests for SystemClock and ManualClock."""

from __future__ import annotations

import threading
import time

import pytest

from tickwheel import Clock, ManualClock, SystemClock


def test_system_clock_is_monotonic_ms() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    before = time.monotonic_ns() // 1_000_000
    first = clock.now_ms()
    after = time.monotonic_ns() // 1_000_000
    assert type(first) is int
    assert before <= first <= after  # the monotonic clock, in ms (not wall time)
    readings = [clock.now_ms() for _ in range(1000)]
    assert readings == sorted(readings)
    assert readings[0] >= first


def test_manual_clock_starts_sets_and_advances() -> None:
    clock = ManualClock()
    assert isinstance(clock, Clock)
    assert clock.now_ms() == 0
    clock = ManualClock(start_ms=100)
    assert clock.now_ms() == 100
    clock.set(100)  # same time is fine
    clock.set(250)
    assert clock.now_ms() == 250
    assert clock.advance(50) == 300
    assert clock.advance(0) == 300
    assert clock.now_ms() == 300
    assert "300" in repr(clock)


def test_manual_clock_rejects_moving_backwards() -> None:
    clock = ManualClock(1000)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(999)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    assert clock.now_ms() == 1000


@pytest.mark.parametrize("bad", [True, False, 1.0, 2.5, "3", None])
def test_manual_clock_type_errors_name_the_argument(bad: object) -> None:
    with pytest.raises(TypeError, match="start_ms"):
        ManualClock(bad)  # type: ignore[arg-type]
    clock = ManualClock()
    with pytest.raises(TypeError, match="ms"):
        clock.set(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ms"):
        clock.advance(bad)  # type: ignore[arg-type]
    assert clock.now_ms() == 0


def test_manual_clock_times_stay_in_0_to_2_pow_62() -> None:
    # Kafka's times are never negative (a bucket's -1 means "none"), and a time plus
    # the longest delay (2**62) must stay an int64 for the compiled core.
    with pytest.raises(ValueError, match=r"start_ms must lie in \[0, 2\*\*62\) ms, got -1"):
        ManualClock(-1)
    clock = ManualClock((1 << 62) - 2)
    assert clock.advance(1) == (1 << 62) - 1
    with pytest.raises(ValueError, match=r"now_ms \+ ms \(\d+ \+ 1\) must lie in \[0, 2"):
        clock.advance(1)
    with pytest.raises(ValueError, match=r"ms must lie in"):
        clock.set(1 << 62)
    assert clock.now_ms() == (1 << 62) - 1  # a refused move changes nothing


def test_wait_for_change_wakes_when_the_clock_moves() -> None:
    clock = ManualClock(5)
    assert clock.wait_for_change(4, 0.0) is True  # already different
    assert clock.wait_for_change(5, 0.01) is False  # times out
    result: list[bool] = []
    started = threading.Event()

    def waiter() -> None:
        started.set()
        result.append(clock.wait_for_change(5, 10.0))

    thread = threading.Thread(target=waiter, name="test-waiter")
    thread.start()
    assert started.wait(5.0)
    clock.advance(1)
    thread.join(5.0)
    assert not thread.is_alive()
    assert result == [True]


class _Listener:
    def __init__(self) -> None:
        self.calls = 0

    def on_move(self) -> None:
        self.calls += 1


def test_listeners_are_called_and_held_weakly() -> None:
    clock = ManualClock()
    listener = _Listener()
    clock.add_listener(listener.on_move)
    clock.advance(1)
    clock.set(5)
    assert listener.calls == 2
    del listener
    clock.advance(1)  # the dead listener is dropped, not called
    assert clock._listeners == []
