"""Unit tests for TimerTaskEntry and TimerTaskList (one bucket)."""

from __future__ import annotations

from tickwheel import TimerTask, TimerTaskEntry, TimerTaskList
from tickwheel._task_list import CANCELLED, TaskCounter


def _entries(n: int) -> list[TimerTaskEntry]:
    return [TimerTaskEntry(expiration_ms=100 + i) for i in range(n)]


def test_add_keeps_order_and_counts() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    bucket.set_expiration(100)
    entries = _entries(4)
    for entry in entries:
        bucket.add(entry)
    assert list(bucket) == entries
    assert len(bucket) == 4
    assert counter.value == 4
    assert all(entry.list is bucket for entry in entries)
    assert bucket._check() == 4


def test_remove_is_o1_unlink_and_idempotent() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    bucket.set_expiration(100)
    a, b, c = _entries(3)
    for entry in (a, b, c):
        bucket.add(entry)
    assert bucket.remove(b) is True
    assert bucket.remove(b) is False
    assert b.list is None and b._next is None and b._prev is None
    assert list(bucket) == [a, c]
    assert counter.value == 2
    assert c.remove() is True  # the entry's own remove
    assert c.remove() is False
    assert list(bucket) == [a]
    assert counter.value == 1
    bucket._check()
    other = TimerTaskList(counter)
    assert other.remove(a) is False  # not in that list
    assert list(bucket) == [a]


def test_add_moves_an_entry_between_lists() -> None:
    counter = TaskCounter()
    first, second = TimerTaskList(counter), TimerTaskList(counter)
    first.set_expiration(100)
    second.set_expiration(100)
    a, b = _entries(2)
    first.add(a)
    first.add(b)
    second.add(a)
    assert list(first) == [b]
    assert list(second) == [a]
    assert counter.value == 2
    assert first._check() == 1 and second._check() == 1


def test_flush_empties_resets_expiration_and_returns_in_order() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    assert bucket.set_expiration(1000) is True
    entries = _entries(3)
    for entry in entries:
        bucket.add(entry)
    flushed = bucket.flush()
    assert flushed == entries
    assert list(bucket) == []
    assert bucket.expiration_ms == -1
    assert counter.value == 0
    assert all(entry.list is None for entry in entries)
    assert bucket._check() == 0
    assert bucket.flush() == []


def test_set_expiration_reports_change() -> None:
    bucket = TimerTaskList(TaskCounter())
    assert bucket.expiration_ms == -1
    assert bucket.set_expiration(500) is True
    assert bucket.set_expiration(500) is False
    assert bucket.set_expiration(800) is True
    assert bucket.expiration_ms == 800
    bucket.flush()
    assert bucket.set_expiration(800) is True  # re-used after a flush: queued again


def test_foreach_skips_cancelled_entries() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    a, b, c = _entries(3)
    for entry in (a, b, c):
        bucket.add(entry)
    # An entry marked cancelled while still linked (as a racing cancel could see it).
    b._list = CANCELLED
    seen: list[TimerTaskEntry] = []
    bucket.foreach(seen.append)
    assert seen == [a, c]


def test_task_is_its_own_entry() -> None:
    counter = TaskCounter()
    bucket = TimerTaskList(counter)
    task = TimerTask(10)
    assert isinstance(task, TimerTaskEntry)
    task.expiration_ms = 10
    bucket.add(task)
    assert task.list is bucket and task.is_pending and not task.cancelled
    assert task.cancel() is True
    assert task.cancelled and task.is_cancelled and task.list is None
    assert counter.value == 0
    assert list(bucket) == []
    assert task.cancel() is False


def test_check_detects_a_broken_link() -> None:
    bucket = TimerTaskList(TaskCounter())
    a, b = _entries(2)
    bucket.add(a)
    bucket.add(b)
    b._prev = b  # corrupt
    try:
        bucket._check()
    except AssertionError:
        pass
    else:  # pragma: no cover - the check must catch it
        raise AssertionError("_check missed a broken prev link")
