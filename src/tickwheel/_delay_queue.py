"""The delay queue of buckets that drives the clock (Kafka's ``DelayQueue[TimerTaskList]``).

The wheel is good at adding and removing tasks in O(1) but cannot tell when the
next one is due without scanning. The queue holds only *non-empty buckets*
(there are at most ``levels × wheel_size`` of them, whatever the number of
tasks), ordered by expiration, so the timer jumps straight to the next due
bucket and never ticks through empty ones. A bucket is queued when its
expiration changes, so it is in the queue at most once.

The queue is not locked on its own: ``SystemTimer`` calls it under its lock and
does the waiting itself, on a condition of that same lock.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

from ._accel import speedups
from ._task_list import TimerTaskList

__all__ = ["BucketDelayQueue"]


class BucketDelayQueue:
    """A min-heap of buckets keyed by ``(expiration_ms, insertion order)``."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, TimerTaskList]] = []
        # Ties between buckets of the same expiration break by queueing order.
        self._seq = itertools.count()

    def offer(self, bucket: TimerTaskList) -> bool:
        """Queue ``bucket`` under its current expiration; True if it is the new head. O(log b)."""
        heap = self._heap
        item = (bucket.expiration_ms, next(self._seq), bucket)
        heapq.heappush(heap, item)
        return heap[0] is item

    def head_expiration_ms(self) -> int | None:
        """The expiration of the first bucket, or None when empty. O(1)."""
        heap = self._heap
        return heap[0][0] if heap else None

    def poll(self, now_ms: int) -> TimerTaskList | None:
        """Remove and return the first bucket if it is due at ``now_ms``; else None. O(log b)."""
        heap = self._heap
        if heap and heap[0][0] <= now_ms:
            return heapq.heappop(heap)[2]
        return None

    def __len__(self) -> int:
        """Number of queued buckets. O(1)."""
        return len(self._heap)

    def entries(self) -> list[tuple[int, TimerTaskList]]:
        """``(expiration_ms, bucket)`` for every queued bucket, in due order. O(b log b)."""
        return [(exp, bucket) for exp, _, bucket in sorted(self._heap, key=lambda e: e[:2])]

    def _check(self) -> None:
        """Assert the heap property and that every entry matches its bucket's expiration."""
        check_queue(self)


def check_queue(queue: BucketDelayQueue) -> None:
    """Assert ``queue``'s heap property, and that each entry matches its bucket.

    A function, so that the compiled twin's ``_check`` runs this same code.
    """
    heap = queue._heap
    for i, (exp, _seq, bucket) in enumerate(heap):
        assert exp == bucket.expiration_ms, f"stale queue entry for {bucket!r} at {exp}"
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                assert heap[i][:2] <= heap[child][:2], "heap order broken"
    buckets = [id(bucket) for _, _, bucket in heap]
    assert len(buckets) == len(set(buckets)), "a bucket is queued twice"


if not TYPE_CHECKING and speedups is not None:
    from ._speedups import BucketDelayQueue
