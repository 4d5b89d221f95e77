"""TimingWheel: one level of Kafka's hierarchical timing wheel."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._accel import speedups
from ._delay_queue import BucketDelayQueue
from ._task_list import CANCELLED, TaskCounter, TimerTaskEntry, TimerTaskList

__all__ = ["TimingWheel"]


class TimingWheel:
    """A hierarchical timing wheel (Kafka's ``TimingWheel``, after Varghese & Lauck).

    The algorithm
    -------------
    A wheel is a circular array of ``wheel_size`` buckets; each bucket is a
    :class:`TimerTaskList` that holds the tasks expiring within one tick::

        interval  = tick_ms * wheel_size        # the time span the wheel covers
        current   = start_ms - start_ms % tick_ms
        bucket(e) = buckets[(e // tick_ms) % wheel_size]
        bucket expiration = (e // tick_ms) * tick_ms

    A task with expiration ``e`` goes to:

    * nowhere, if ``e < current + tick_ms``: it is already due and the timer
      runs it at once;
    * ``bucket(e)``, if ``e < current + interval``;
    * otherwise the *overflow wheel*, created on demand with
      ``tick = interval`` of this wheel and ``start = current`` of this wheel,
      and so on up (a watch's second, minute and hour hands).

    When a bucket's expiration changes it is queued in the timer's
    :class:`~tickwheel._delay_queue.BucketDelayQueue`. When the queue says a
    bucket is due, the timer advances every level to the bucket's expiration
    (``advance_clock``, which rounds down to each level's tick) and re-inserts
    each of its tasks: a task from a coarse level now falls into a finer one
    (it *cascades down*) or, once within the finest tick, runs. A task therefore
    runs no earlier than the start of the finest tick holding its expiration,
    and each task moves at most once per level.

    Worked example
    --------------
    ``tick_ms=1000, wheel_size=3, start_ms=1675752020558``; tasks with delays
    1000, 2000, … 7000 ms (expirations …21558 to …27558). Times below are the
    last five digits.

    ===== ======= ======== ======== ================================= ===========================
    level tick_ms interval current  covers                            tasks → bucket expiration
    ===== ======= ======== ======== ================================= ===========================
    0     1000    3000     20000    [21000, 23000) in 1 s buckets     1 s → 21000, 2 s → 22000
    1     3000    9000     18000    [21000, 27000) in 3 s buckets     3 s → 21000, 4/5/6 s → 24000
    2     9000    27000    12000    [21000, 39000) in 9 s buckets     7 s → 21000
    ===== ======= ======== ======== ================================= ===========================

    At clock 21000 three buckets are due. Level 0's 21000 bucket runs the 1 s
    task. Level 1's 21000 bucket re-inserts the 3 s task (23558) into level 0's
    23000 bucket. Level 2's 21000 bucket re-inserts the 7 s task (27558) into
    level 1's 27000 bucket. From then on each whole second runs exactly one
    task: 22000 the 2 s task, 23000 the 3 s one, 24000 flushes level 1's 24000
    bucket (runs 4 s, cascades 5 s and 6 s into level 0), and so on to 27000.
    ``tickwheel trace`` prints every state of this example.

    Ground rules
    ------------
    * Not thread-safe by itself: ``SystemTimer`` holds its lock around every call.
    * All levels share one :class:`TaskCounter` and one delay queue.
    * Invariant: ``current`` of level k+1 is ``current`` of level k rounded down
      to level k+1's tick.
    * ``_tick_end_ms`` (``current + tick``) and ``_end_ms`` (``current +
      interval``) are kept beside ``current_time_ms`` (:meth:`_set_current`
      writes all three), so that an insertion compares an expiration with one
      bound; ``_check`` asserts they agree.
    """

    __slots__ = (
        "_counter",
        "_end_ms",
        "_lock",
        "_queue",
        "_tick_end_ms",
        "buckets",
        "current_time_ms",
        "interval_ms",
        "level",
        "overflow_wheel",
        "tick_ms",
        "wheel_size",
    )

    def __init__(
        self,
        tick_ms: int,
        wheel_size: int,
        start_ms: int,
        task_counter: TaskCounter,
        queue: BucketDelayQueue,
        lock: threading.Lock | None = None,
        level: int = 0,
    ) -> None:
        if type(tick_ms) is not int or tick_ms < 1:
            raise ValueError(f"tick_ms must be an int >= 1, got {tick_ms!r}")
        if type(wheel_size) is not int or wheel_size < 2:
            raise ValueError(f"wheel_size must be an int >= 2, got {wheel_size!r}")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = tick_ms * wheel_size
        self._set_current(start_ms - (start_ms % tick_ms))
        self.level = level
        self._counter = task_counter
        self._queue = queue
        self._lock = lock if lock is not None else threading.Lock()
        self.buckets = [
            TimerTaskList(task_counter, self._lock, level, index) for index in range(wheel_size)
        ]
        self.overflow_wheel: TimingWheel | None = None

    def _set_current(self, current_ms: int) -> None:
        """Set ``current_time_ms`` (a multiple of tick) and the two bounds cached from it."""
        self.current_time_ms = current_ms
        self._tick_end_ms = current_ms + self.tick_ms
        self._end_ms = current_ms + self.interval_ms

    def _add_overflow_wheel(self) -> TimingWheel:
        """Create the next coarser level: tick = this interval, start = this current time."""
        if self.overflow_wheel is None:
            self.overflow_wheel = TimingWheel(
                tick_ms=self.interval_ms,
                wheel_size=self.wheel_size,
                start_ms=self.current_time_ms,
                task_counter=self._counter,
                queue=self._queue,
                lock=self._lock,
                level=self.level + 1,
            )
        return self.overflow_wheel

    def add(self, entry: TimerTaskEntry) -> bool:
        """Put ``entry`` in the bucket of the first level that covers its expiration.

        Returns False when the entry is cancelled or already due (expiration <
        current + tick); the caller then drops or runs it. O(levels), and the
        number of levels is logarithmic in the longest delay: with the default
        1 ms × 20 buckets, four levels cover 160 s.
        """
        expiration = entry.expiration_ms
        if entry._list is CANCELLED:
            return False
        if expiration < self._tick_end_ms:
            return False
        if expiration < self._end_ms:
            virtual_id = expiration // self.tick_ms
            bucket = self.buckets[virtual_id % self.wheel_size]
            bucket.add(entry)
            # A bucket is (re)queued only when it starts a new range.
            if bucket.set_expiration(virtual_id * self.tick_ms):
                self._queue.offer(bucket)
            return True
        overflow = self.overflow_wheel
        if overflow is None:
            overflow = self._add_overflow_wheel()
        return overflow.add(entry)

    def advance_clock(self, time_ms: int) -> None:
        """Move this level and those above to ``time_ms``, rounded down to each tick. O(levels)."""
        wheel: TimingWheel | None = self
        while wheel is not None and time_ms >= wheel._tick_end_ms:
            time_ms -= time_ms % wheel.tick_ms
            wheel._set_current(time_ms)
            wheel = wheel.overflow_wheel

    def levels(self) -> list[TimingWheel]:
        """This wheel and its overflow wheels, finest first. O(levels)."""
        out: list[TimingWheel] = []
        wheel: TimingWheel | None = self
        while wheel is not None:
            out.append(wheel)
            wheel = wheel.overflow_wheel
        return out

    def _check(self) -> int:
        """Assert every level's invariants; return the number of entries held."""
        return check_wheel(self)


#: The largest int64: the compiled twin stores a level's span or end beyond it as it.
INT64_MAX = (1 << 63) - 1


def _equal_in_int64(stored: int, value: int) -> bool:
    """``stored == value``, or ``value`` is beyond int64 and ``stored`` saturated to it."""
    return stored == value or (value > INT64_MAX and stored == INT64_MAX)


def check_wheel(wheel: TimingWheel) -> int:
    """Assert the invariants of ``wheel`` and the levels above; return the entries held.

    A function, so that the compiled twin's ``_check`` runs this same code.
    """
    total = 0
    lower: TimingWheel | None = None
    for level in wheel.levels():
        tick = level.tick_ms
        assert level.current_time_ms % tick == 0, "current time not a multiple of tick"
        assert _equal_in_int64(level.interval_ms, tick * level.wheel_size)
        assert _equal_in_int64(level._tick_end_ms, level.current_time_ms + tick), (
            "stale _tick_end_ms"
        )
        assert _equal_in_int64(level._end_ms, level.current_time_ms + level.interval_ms), (
            "stale _end_ms"
        )
        if lower is not None:
            assert tick == lower.interval_ms, "overflow tick != lower interval"
            expected = lower.current_time_ms - lower.current_time_ms % tick
            assert level.current_time_ms == expected, "levels' current times disagree"
        for index, bucket in enumerate(level.buckets):
            total += bucket._check()
            exp = bucket.expiration_ms
            if exp == -1:
                continue
            assert exp % tick == 0, "bucket expiration not a multiple of tick"
            assert (exp // tick) % level.wheel_size == index, "bucket at the wrong index"
            for entry in bucket:
                assert exp <= entry.expiration_ms < exp + tick, (
                    f"entry {entry.expiration_ms} outside bucket [{exp}, {exp + tick})"
                )
        lower = level
    return total


if not TYPE_CHECKING and speedups is not None:
    from ._speedups import TimingWheel
