"""TimerTaskEntry and TimerTaskList: one bucket of the timing wheel.

As in Kafka, a bucket is a doubly linked cyclic list with a dummy root, so a
task is added or removed in O(1), and the list carries the bucket's expiration,
the key under which it waits in the delay queue.

One difference from Kafka, made for memory: the entry is *intrusive*. Kafka
allocates a separate ``TimerTaskEntry`` that points at its ``TimerTask`` each
time a task is added; here :class:`~tickwheel.TimerTask` inherits the entry's
four slots, so a pending timer is one object (80 bytes on CPython 3.11) instead
of two. The roles are Kafka's: the entry is what sits in a list, with its
expiration; re-adding a task moves its entry from the old list to the new one.

Ground rules
------------
* Lists are not locked on their own. Every list of a timer shares that timer's
  lock, and whoever touches a list holds it (``SystemTimer`` does). One lock is
  enough under CPython, and halves the cost of an add compared with Kafka's
  per-list plus per-entry monitors.
* ``entry._list`` is the list holding the entry, ``None`` when it is in no list,
  or :data:`CANCELLED` once ``cancel()`` removed it. It is only written under the
  owning timer's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from ._accel import speedups

__all__ = ["CANCELLED", "TaskCounter", "TimerTaskEntry", "TimerTaskList"]


class TaskCounter:
    """The number of entries held in all lists of one timer (Kafka's ``taskCounter``)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class TimerTaskEntry:
    """An element of a :class:`TimerTaskList`: a task's link into a bucket, with its expiration.

    ``expiration_ms`` is the absolute time the task is due. ``TimerTask`` is a
    subclass, so every task is its own entry (see the module doc).
    """

    __slots__ = ("_list", "_next", "_prev", "expiration_ms")

    _list: TimerTaskList | None
    _next: TimerTaskEntry | None
    _prev: TimerTaskEntry | None

    def __init__(self, expiration_ms: int = -1) -> None:
        self.expiration_ms = expiration_ms
        self._list = None
        self._next = None
        self._prev = None

    @property
    def list(self) -> TimerTaskList | None:
        """The list holding this entry, or None. O(1).

        That is its bucket, or, from an add until the timer's next advance, the
        timer's staging list (see :class:`~tickwheel.SystemTimer`).
        """
        lst = self._list
        return None if lst is CANCELLED else lst

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` removed this entry from a timer. O(1)."""
        return self._list is CANCELLED

    def remove(self) -> bool:
        """Remove this entry from its list, if any. Caller holds the timer lock. O(1)."""
        lst = self._list
        if lst is None or lst is CANCELLED:
            return False
        return lst.remove(self)


class TimerTaskList:
    """A bucket: a doubly linked cyclic list of entries sharing one expiration.

    ``expiration_ms`` is the start of the time range the bucket covers, or -1
    while it is not queued. Kafka re-uses a bucket for a later range once it has
    been flushed, so ``set_expiration`` says whether the key changed, and only
    then is the bucket queued again.
    """

    __slots__ = ("_counter", "_expiration_ms", "_lock", "_root", "index", "level")

    def __init__(
        self,
        counter: TaskCounter,
        lock: threading.Lock | None = None,
        level: int = 0,
        index: int = 0,
    ) -> None:
        root = TimerTaskEntry()
        root._next = root
        root._prev = root
        self._root = root
        self._expiration_ms = -1
        self._counter = counter
        self._lock = lock if lock is not None else threading.Lock()
        self.level = level
        self.index = index

    @property
    def expiration_ms(self) -> int:
        """The bucket's expiration (start of its range), or -1 when unset. O(1)."""
        return self._expiration_ms

    def set_expiration(self, expiration_ms: int) -> bool:
        """Set the expiration; return True if it changed (the bucket must be queued). O(1)."""
        changed = self._expiration_ms != expiration_ms
        self._expiration_ms = expiration_ms
        return changed

    def add(self, entry: TimerTaskEntry) -> None:
        """Append ``entry``, first removing it from the list it is in (a move). O(1)."""
        old = entry._list
        if old is not None and old is not CANCELLED:
            old.remove(entry)
        root = self._root
        tail = root._prev
        assert tail is not None
        entry._next = root
        entry._prev = tail
        entry._list = self
        tail._next = entry
        root._prev = entry
        self._counter.value += 1

    def remove(self, entry: TimerTaskEntry) -> bool:
        """Unlink ``entry`` if it is in this list; return whether it was. O(1)."""
        if entry._list is not self:
            return False
        nxt = entry._next
        prev = entry._prev
        assert nxt is not None and prev is not None
        nxt._prev = prev
        prev._next = nxt
        entry._next = entry._prev = None
        entry._list = None
        self._counter.value -= 1
        return True

    def flush(self) -> list[TimerTaskEntry]:
        """Remove every entry, reset the expiration to -1, and return the entries in order.

        Kafka's ``flush(f)`` applies ``f`` to each entry as it goes; here the
        caller loops over the returned entries, which may re-add each one to
        another list as it goes. O(n).
        """
        root = self._root
        entries: list[TimerTaskEntry] = []
        append = entries.append
        node = root._next
        while node is not root:
            assert node is not None
            nxt = node._next
            node._next = node._prev = None
            node._list = None
            append(node)
            node = nxt
        root._next = root._prev = root
        self._counter.value -= len(entries)
        self._expiration_ms = -1
        return entries

    def foreach(self, f: Callable[[TimerTaskEntry], object]) -> None:
        """Apply ``f`` to each entry that is not cancelled, in order. O(n)."""
        for entry in self:
            if entry._list is not CANCELLED:
                f(entry)

    def __iter__(self) -> Iterator[TimerTaskEntry]:
        """Iterate over the entries, in insertion order. O(n)."""
        root = self._root
        node = root._next
        while node is not root:
            assert node is not None
            nxt = node._next
            yield node
            node = nxt

    def __len__(self) -> int:
        """Number of entries. O(n): only snapshots and checks need it."""
        return sum(1 for _ in self)

    def _check(self) -> int:
        """Assert the bucket's invariants; return its length."""
        return check_bucket(self)

    def _check_links(self) -> int:
        """Assert the links and every entry's ``_list``; return the length."""
        return check_links(self)

    def __repr__(self) -> str:
        return (
            f"TimerTaskList(level={self.level}, index={self.index}, "
            f"expiration_ms={self._expiration_ms})"
        )


class _CancelledMarker(TimerTaskList):
    """The type of :data:`CANCELLED`; never holds entries."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CANCELLED"


def check_links(lst: TimerTaskList) -> int:
    """Assert ``lst``'s links and every entry's ``_list``; return its length.

    A function, not only a method, so that the compiled twin's checks run this
    same code (see ``_accel``).
    """
    root = lst._root
    prev = root
    node = root._next
    count = 0
    while node is not root:
        assert node is not None, "broken chain"
        assert node._prev is prev, "prev link does not match"
        assert node._list is lst, "entry's list is not this list"
        count += 1
        prev = node
        node = node._next
    assert root._prev is prev, "root.prev is not the tail"
    return count


def check_bucket(lst: TimerTaskList) -> int:
    """Assert a bucket's invariants (links, and an expiration when it holds entries)."""
    count = check_links(lst)
    if count:
        assert lst.expiration_ms != -1, "non-empty bucket without expiration"
    return count


#: Stored in ``entry._list`` once ``cancel()`` has removed the entry: the task stays cancelled.
CANCELLED: Final[TimerTaskList] = _CancelledMarker(TaskCounter(), level=-1, index=-1)


if not TYPE_CHECKING and speedups is not None:
    from ._speedups import CANCELLED, TaskCounter, TimerTaskEntry, TimerTaskList
