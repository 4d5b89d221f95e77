"""TimerCore: the wheel, its delay queue and the staging list, shared by both timers.

Kafka's ``SystemTimer`` is a timing wheel, a ``DelayQueue`` of its buckets and a
thread model. The first two are the same whether the timer is driven by
threads (:class:`~tickwheel.SystemTimer`) or by an asyncio loop
(:class:`~tickwheel.aio.AsyncTimer`), so they live here, once, and each timer
is a driver on top of this class:

* :meth:`_add_entry` is Kafka's ``addTimerTaskEntry`` without the executor: it
  either keeps the entry or says it is due now;
* :meth:`_advance` is the body of Kafka's ``advanceClock`` without the wait:
  flush every due bucket, cascading its entries down, and collect the due ones.

Staging
-------
Adds are *staged*, as Netty's ``HashedWheelTimer`` queues new timeouts and
moves them to their buckets on the next tick: an entry that is not due is
linked at the tail of one staging list, and the next :meth:`_advance` (or a
snapshot) first places every staged entry in the wheel with
:meth:`TimingWheel.add <tickwheel.TimingWheel.add>`. The wheel does not move
in between, so each entry lands in the very bucket an immediate add would
have chosen, in the same order. The staging list is a :class:`TimerTaskList`
sharing the timer's lock and counter, so ``cancel`` and ``size`` treat a staged
entry as pending, and an entry cancelled before the next advance (the common
fate of a timeout) never touches the wheel.

This module is the pure-Python reference; ``tickwheel._speedups`` is its
compiled twin, with the same names and behaviour.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._accel import speedups
from ._delay_queue import BucketDelayQueue
from ._snapshot import BucketSnapshot, LevelSnapshot, WheelSnapshot
from ._task_list import TaskCounter, TimerTaskEntry, TimerTaskList
from ._wheel import TimingWheel

__all__ = ["NEVER", "Lock", "TimerCore"]

#: The lock type of a timer: every list of the timer shares one. (The compiled
#: twin is a lock its C code takes without a Python call.)
Lock = threading.Lock

#: The "no time" (the largest int64): the earliest staged expiration when
#: nothing is staged, and the like. Times are int64 milliseconds on both paths.
NEVER = (1 << 63) - 1


class TimerCore:
    """A hierarchical timing wheel with its delay queue and staging list (see the module doc).

    Not thread-safe by itself: the driver holds ``lock`` around every call, or,
    for an asyncio timer, calls it from the loop's thread only. ``lock`` is the
    lock every list of this timer shares (``TimerTask.cancel`` takes it).
    """

    def __init__(
        self, tick_ms: int, wheel_size: int, start_ms: int, lock: threading.Lock | None = None
    ) -> None:
        self._lock = lock if lock is not None else Lock()
        self._counter = TaskCounter()
        self._queue = BucketDelayQueue()
        self._wheel = TimingWheel(
            tick_ms, wheel_size, start_ms, self._counter, self._queue, self._lock
        )
        self._staged = TimerTaskList(self._counter, self._lock, level=-1)
        # The earliest expiration staged since the last placement (a cancel does
        # not raise it): when a staged entry can be due at the earliest.
        self._staged_min_ms = NEVER

    def _add_entry(self, entry: TimerTaskEntry) -> bool:
        """Keep ``entry`` (its ``expiration_ms`` set) until it is due; False if it is due now.

        Kafka's ``timingWheel.add``: an entry whose expiration is before the
        wheel's current time + tick is due, and is left in no list for the
        caller to run. Any other is staged, moving it if it is pending in this
        timer. O(1).
        """
        if entry.expiration_ms < self._wheel._tick_end_ms:
            entry.remove()
            return False
        self._staged.add(entry)
        if entry.expiration_ms < self._staged_min_ms:
            self._staged_min_ms = entry.expiration_ms
        return True

    def _place_staged(self) -> None:
        """Move every staged entry into its bucket, in order. O(staged × levels)."""
        if self._staged_min_ms == NEVER:
            return  # nothing was staged since the last placement
        self._staged_min_ms = NEVER
        for entry in self._staged.flush():
            # Staged entries are not due: the wheel has not moved since they were.
            placed = self._wheel.add(entry)
            assert placed

    def _advance(self, now_ms: int, due: list[TimerTaskEntry]) -> bool:
        """Flush every bucket due at ``now_ms``; append the entries now due to ``due``.

        Kafka's ``advanceClock`` after its wait: for each due bucket, advance the
        wheel to the bucket's expiration, flush it and re-add each entry, which
        cascades it to a finer level or, being due, goes to ``due``. Staged
        entries are placed first. Returns True if a bucket was due. O(staged +
        due buckets + entries moved).
        """
        self._place_staged()
        bucket = self._queue.poll(now_ms)
        if bucket is None:
            return False
        while bucket is not None:
            self._wheel.advance_clock(bucket.expiration_ms)
            for entry in bucket.flush():
                if not self._wheel.add(entry):
                    due.append(entry)
            bucket = self._queue.poll(now_ms)
        return True

    def _next_expiration_ms(self) -> int:
        """The earliest time (ms) a bucket or a staged entry can be due; NEVER if none. O(1)."""
        head = self._queue.head_expiration_ms()
        staged = self._staged_min_ms
        if staged != NEVER:
            staged -= staged % self._wheel.tick_ms
        return staged if head is None or staged < head else head

    def _due_at(self, now_ms: int) -> bool:
        """True when :meth:`_advance` at ``now_ms`` would find something due. O(1)."""
        return self._next_expiration_ms() <= now_ms

    # -- inspection -----------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of entries held, staged or in buckets; drops at once on cancel. O(1)."""
        return self._counter.value

    @property
    def tick_ms(self) -> int:
        """The finest level's tick. O(1)."""
        return self._wheel.tick_ms

    @property
    def wheel_size(self) -> int:
        """Buckets per level. O(1)."""
        return self._wheel.wheel_size

    def _snapshot(self) -> WheelSnapshot:
        """Place the staged entries, then picture every level, bucket and the queue.

        Caller holds the lock. O(levels × buckets + n).
        """
        self._place_staged()
        return snapshot_of(self)

    def _clear(self) -> list[TimerTaskEntry]:
        """Remove every entry, staged or in a bucket, and empty the queue; return the entries.

        For closing a timer. O(n + levels × buckets).
        """
        entries = self._staged.flush()
        self._staged_min_ms = NEVER
        for wheel in self._wheel.levels():
            for bucket in wheel.buckets:
                entries.extend(bucket.flush())
        while self._queue.poll(NEVER) is not None:
            pass
        return entries

    def _check(self) -> None:
        """Assert every invariant: links, counters, bucket expirations, queue contents."""
        check_core(self)


# The inspection below is written once, as functions, and run on both twins.


def snapshot_of(core: TimerCore) -> WheelSnapshot:
    """Every level, bucket and the queue of ``core``, as it stands. O(levels × buckets + n)."""
    levels = tuple(
        LevelSnapshot(
            tick_ms=wheel.tick_ms,
            wheel_size=wheel.wheel_size,
            interval_ms=wheel.interval_ms,
            current_time_ms=wheel.current_time_ms,
            buckets=tuple(
                BucketSnapshot(
                    index=bucket.index,
                    expiration_ms=bucket.expiration_ms,
                    task_expirations=tuple(e.expiration_ms for e in bucket),
                )
                for bucket in wheel.buckets
            ),
        )
        for wheel in core._wheel.levels()
    )
    queued = tuple((exp, bucket.level, bucket.index) for exp, bucket in core._queue.entries())
    return WheelSnapshot(levels=levels, queue=queued, size=core._counter.value)


def check_core(core: TimerCore) -> None:
    """Assert every invariant of ``core``: links, counters, bucket expirations, queue."""
    held = core._wheel._check() + check_staged(core)
    assert held == core._counter.value, f"size {core._counter.value} != {held} held"
    core._queue._check()
    queued = {id(bucket) for _, bucket in core._queue.entries()}
    for wheel in core._wheel.levels():
        for bucket in wheel.buckets:
            if bucket.expiration_ms != -1:
                assert id(bucket) in queued, f"{bucket!r} has an expiration but is not queued"
            else:
                assert id(bucket) not in queued, f"{bucket!r} is queued without expiration"


def check_staged(core: TimerCore) -> int:
    """Assert the staging list's invariants; return its length."""
    staged = core._staged
    assert staged.expiration_ms == -1, "the staging list has an expiration"
    count = staged._check_links()
    tick_end = core._wheel._tick_end_ms
    for entry in staged:
        assert entry.expiration_ms >= tick_end, "a due entry is staged"
        assert entry.expiration_ms >= core._staged_min_ms, "staged below the staged minimum"
    return count


if not TYPE_CHECKING and speedups is not None:
    from ._speedups import Lock, TimerCore
