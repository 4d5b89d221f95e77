# The compiled twin of ``tickwheel._task_list``: TaskCounter, TimerTaskEntry, TimerTaskList
# and the CANCELLED marker. The pure module explains the list; the C fields are declared
# in _task_list.pxd.


# -- the task list ---------------------------------------------------------------


@cython.final
cdef class TaskCounter:
    """The number of entries held in all lists of one timer (Kafka's ``taskCounter``)."""


    def __init__(self):
        self.value = 0



cdef class TimerTaskEntry:
    """An element of a :class:`TimerTaskList`: a task's link into a bucket, with its expiration."""


    def __init__(self, long long expiration_ms=-1):
        self.expiration_ms = expiration_ms

    @property
    def list(self):
        """The list holding this entry, or None. O(1)."""
        return None if self._list is CANCELLED_C else self._list

    @property
    def cancelled(self):
        """True once ``cancel()`` removed this entry from a timer. O(1)."""
        return self._list is CANCELLED_C

    def remove(self):
        """Remove this entry from its list, if any. Caller holds the timer lock. O(1)."""
        cdef TimerTaskList lst = self._list
        if lst is None or lst is CANCELLED_C:
            return False
        return lst._remove(self)


cdef class TimerTaskList:
    """A bucket: a doubly linked cyclic list of entries sharing one expiration."""


    def __init__(self, TaskCounter counter, lock=None, int level=0, int index=0):
        root = TimerTaskEntry()
        root._next = root
        root._prev = root
        self._root = root
        self._expiration_ms = -1
        self._counter = counter
        self._lock = lock if lock is not None else Lock()
        self._fast_lock = self._lock if type(self._lock) is Lock else None
        self.level = level
        self.index = index

    @property
    def expiration_ms(self):
        """The bucket's expiration (start of its range), or -1 when unset. O(1)."""
        return self._expiration_ms

    cpdef bint set_expiration(self, long long expiration_ms):
        """Set the expiration; return True if it changed (the bucket must be queued). O(1)."""
        cdef bint changed = self._expiration_ms != expiration_ms
        self._expiration_ms = expiration_ms
        return changed

    cdef void _link(self, TimerTaskEntry entry) noexcept:
        """Append an entry that is in no list."""
        cdef TimerTaskEntry root = self._root
        cdef TimerTaskEntry tail = root._prev
        entry._next = root
        entry._prev = tail
        entry._list = self
        tail._next = entry
        root._prev = entry
        self._counter.value += 1

    cdef bint _remove(self, TimerTaskEntry entry) noexcept:
        if entry._list is not self:
            return False
        entry._next._prev = entry._prev
        entry._prev._next = entry._next
        entry._next = None
        entry._prev = None
        entry._list = None
        self._counter.value -= 1
        return True

    cdef void _add(self, TimerTaskEntry entry) noexcept:
        cdef TimerTaskList old = entry._list
        if old is not None and old is not CANCELLED_C:
            old._remove(entry)
        self._link(entry)

    def add(self, TimerTaskEntry entry):
        """Append ``entry``, first removing it from the list it is in (a move). O(1)."""
        self._add(entry)

    def remove(self, TimerTaskEntry entry):
        """Unlink ``entry`` if it is in this list; return whether it was. O(1)."""
        return self._remove(entry)

    cdef list _flush(self):
        cdef TimerTaskEntry root = self._root
        cdef TimerTaskEntry node = root._next
        cdef TimerTaskEntry nxt
        cdef list entries = []
        while node is not root:
            nxt = node._next
            node._next = None
            node._prev = None
            node._list = None
            entries.append(node)
            node = nxt
        root._next = root
        root._prev = root
        self._counter.value -= len(entries)
        self._expiration_ms = -1
        return entries

    def flush(self):
        """Remove every entry, reset the expiration to -1, and return the entries in order. O(n)."""
        return self._flush()

    def foreach(self, f):
        """Apply ``f`` to each entry that is not cancelled, in order. O(n)."""
        for entry in self:
            if (<TimerTaskEntry>entry)._list is not CANCELLED_C:
                f(entry)

    def __iter__(self):
        """Iterate over the entries, in insertion order. O(n)."""
        cdef TimerTaskEntry root = self._root
        cdef TimerTaskEntry node = root._next
        cdef TimerTaskEntry nxt
        while node is not root:
            nxt = node._next
            yield node
            node = nxt

    def __len__(self):
        """Number of entries. O(n): only snapshots and checks need it."""
        cdef Py_ssize_t n = 0
        cdef TimerTaskEntry root = self._root
        cdef TimerTaskEntry node = root._next
        while node is not root:
            n += 1
            node = node._next
        return n

    def _check(self):
        """Assert the bucket's invariants; return its length."""
        from tickwheel._task_list import check_bucket

        return check_bucket(self)

    def _check_links(self):
        """Assert the links and every entry's ``_list``; return the length."""
        from tickwheel._task_list import check_links

        return check_links(self)

    def __repr__(self):
        return (
            f"TimerTaskList(level={self.level}, index={self.index}, "
            f"expiration_ms={self._expiration_ms})"
        )


cdef class _CancelledMarker(TimerTaskList):
    """The type of :data:`CANCELLED`; never holds entries."""

    def __repr__(self):
        return "CANCELLED"


cdef TimerTaskList CANCELLED_C = _CancelledMarker(TaskCounter(), level=-1, index=-1)
CANCELLED = CANCELLED_C
