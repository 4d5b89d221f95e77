"""Unit tests for TimingWheel placement, overflow creation and clock advance."""

from __future__ import annotations

import pytest

from tickwheel import TimerTaskEntry, TimingWheel
from tickwheel._delay_queue import BucketDelayQueue
from tickwheel._task_list import CANCELLED, TaskCounter


def _wheel(tick: int = 1, size: int = 20, start: int = 0) -> TimingWheel:
    return TimingWheel(tick, size, start, TaskCounter(), BucketDelayQueue())


def _held(wheel: TimingWheel) -> dict[tuple[int, int], list[int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for wheel_level in wheel.levels():
        for bucket in wheel_level.buckets:
            if bucket.expiration_ms != -1:
                out[(wheel_level.level, bucket.index)] = [e.expiration_ms for e in bucket]
    return out


def test_geometry_and_rounding() -> None:
    wheel = _wheel(tick=10, size=8, start=1234)
    assert wheel.interval_ms == 80
    assert wheel.current_time_ms == 1230
    assert len(wheel.buckets) == 8
    assert wheel.overflow_wheel is None
    assert wheel.levels() == [wheel]


@pytest.mark.parametrize(("tick", "size"), [(0, 20), (-1, 20), (1, 1), (1, 0)])
def test_bad_geometry(tick: int, size: int) -> None:
    with pytest.raises(ValueError, match=r"tick_ms|wheel_size"):
        _wheel(tick=tick, size=size)


def test_placement_in_the_first_level() -> None:
    wheel = _wheel(tick=10, size=8, start=1000)
    entry = TimerTaskEntry(1047)  # < 1000 + 80
    assert wheel.add(entry) is True
    bucket = wheel.buckets[(1047 // 10) % 8]
    assert entry.list is bucket
    assert bucket.expiration_ms == 1040
    assert wheel._queue.entries() == [(1040, bucket)]
    assert wheel._counter.value == 1
    assert wheel.overflow_wheel is None
    # Same bucket again: not queued twice.
    assert wheel.add(TimerTaskEntry(1049)) is True
    assert len(wheel._queue) == 1
    assert wheel._check() == 2


def test_already_due_and_cancelled_are_refused() -> None:
    wheel = _wheel(tick=10, size=8, start=1000)
    assert wheel.add(TimerTaskEntry(1009)) is False  # < current + tick
    assert wheel.add(TimerTaskEntry(5)) is False
    assert wheel.add(TimerTaskEntry(1010)) is True  # first tick after current
    cancelled = TimerTaskEntry(1050)
    cancelled._list = CANCELLED
    assert wheel.add(cancelled) is False
    assert wheel._counter.value == 1


def test_overflow_created_on_demand_with_lower_interval_and_current() -> None:
    wheel = _wheel(tick=10, size=8, start=1234)  # current 1230, covers < 1310
    assert wheel.add(TimerTaskEntry(1309)) is True
    assert wheel.overflow_wheel is None
    assert wheel.add(TimerTaskEntry(1310)) is True
    level1 = wheel.overflow_wheel
    assert level1 is not None
    assert (level1.tick_ms, level1.wheel_size, level1.interval_ms) == (80, 8, 640)
    assert level1.current_time_ms == 1230 - 1230 % 80 == 1200
    assert level1.level == 1
    assert level1.overflow_wheel is None
    # 1310 // 80 = 16 -> index 0, bucket expiration 1280
    assert _held(wheel)[(1, 0)] == [1310]
    assert level1.buckets[0].expiration_ms == 1280
    # Level 2: tick 640, current 640, covers [640, 5760).
    assert wheel.add(TimerTaskEntry(5230)) is True
    level2 = level1.overflow_wheel
    assert level2 is not None
    assert (level2.tick_ms, level2.current_time_ms) == (640, 1200 - 1200 % 640)
    assert level2.current_time_ms == 640
    assert [w.level for w in wheel.levels()] == [0, 1, 2]
    assert _held(wheel)[(2, 0)] == [5230]  # 5230 // 640 = 8 -> index 0
    assert level2.buckets[0].expiration_ms == 5120
    # Level 3: tick 5120, current 0, covers [0, 40960).
    assert wheel.add(TimerTaskEntry(5760)) is True
    level3 = level2.overflow_wheel
    assert level3 is not None
    assert (level3.tick_ms, level3.current_time_ms, level3.level) == (5120, 0, 3)
    assert _held(wheel)[(3, 1)] == [5760]
    assert wheel._check() == 4


def test_advance_clock_rounds_each_level_down() -> None:
    wheel = _wheel(tick=10, size=4, start=0)  # intervals 40, 160
    wheel.add(TimerTaskEntry(200))  # creates levels 1 (tick 40) and 2 (tick 160)
    assert [w.tick_ms for w in wheel.levels()] == [10, 40, 160]
    wheel.advance_clock(5)  # less than a tick: nothing moves
    assert [w.current_time_ms for w in wheel.levels()] == [0, 0, 0]
    wheel.advance_clock(57)
    assert [w.current_time_ms for w in wheel.levels()] == [50, 40, 0]
    wheel.advance_clock(199)
    assert [w.current_time_ms for w in wheel.levels()] == [190, 160, 160]
    wheel.advance_clock(150)  # never backwards
    assert [w.current_time_ms for w in wheel.levels()] == [190, 160, 160]


def test_bucket_reused_for_a_later_range_is_queued_again() -> None:
    wheel = _wheel(tick=1, size=4, start=0)
    first = TimerTaskEntry(2)
    wheel.add(first)
    bucket = wheel.buckets[2]
    assert bucket.expiration_ms == 2
    queue = wheel._queue
    assert queue.poll(2) is bucket
    wheel.advance_clock(3)
    assert bucket.flush() == [first]
    # Now covering [4, 7): 6 maps to the same index 2 but a new range.
    assert wheel.add(TimerTaskEntry(6)) is True
    assert bucket.expiration_ms == 6
    assert queue.entries() == [(6, bucket)]
    assert wheel._check() == 1


def test_move_keeps_count() -> None:
    wheel = _wheel(tick=1, size=8, start=0)
    entry = TimerTaskEntry(3)
    wheel.add(entry)
    entry.expiration_ms = 5
    wheel.add(entry)
    assert wheel._counter.value == 1
    assert _held(wheel) == {(0, 3): [], (0, 5): [5]}
