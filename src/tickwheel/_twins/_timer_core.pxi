# The compiled twin of ``tickwheel._timer_core``: the timers' Lock (``Lock`` there is
# ``threading.Lock``) and TimerCore. The C fields are declared in _timer_core.pxd.


# -- the lock ---------------------------------------------------------------------


@cython.final
cdef class Lock:
    """A non-reentrant lock like ``threading.Lock``, taken by C code without a Python call.

    ``acquire(blocking=True, timeout=-1)``, ``release()``, ``locked()`` and the
    context manager behave as ``threading.Lock``'s, so ``threading.Condition``
    accepts it. A blocked acquire releases the GIL; unlike ``threading.Lock``'s
    it is not interrupted by signals (the timers hold it for O(1) steps).
    """


    def __cinit__(self):
        self._handle = PyThread_allocate_lock()
        if self._handle is NULL:
            raise MemoryError("cannot allocate a lock")

    def __dealloc__(self):
        if self._handle is not NULL:
            if self._held:
                PyThread_release_lock(self._handle)
            PyThread_free_lock(self._handle)

    cdef int _take(self) except -1:
        if not PyThread_acquire_lock(self._handle, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self._handle, WAIT_LOCK)
        self._held = True
        return 0

    cdef void _give(self) noexcept:
        self._held = False
        PyThread_release_lock(self._handle)

    def acquire(self, bint blocking=True, double timeout=-1):
        """Take the lock; False if not blocking (or after ``timeout`` s) and it is held."""
        cdef long long microseconds
        cdef int status
        if PyThread_acquire_lock(self._handle, NOWAIT_LOCK):
            self._held = True
            return True
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return False
        if timeout < 0:
            if timeout != -1:
                raise ValueError("timeout value must be a non-negative number")
            with nogil:
                PyThread_acquire_lock(self._handle, WAIT_LOCK)
        else:
            microseconds = <long long>(timeout * 1e6)
            with nogil:
                status = PyThread_acquire_lock_timed(self._handle, microseconds, 0)
            if status != PY_LOCK_ACQUIRED:
                return False
        self._held = True
        return True

    def release(self):
        """Release the lock; RuntimeError if it is not held."""
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self._give()

    def locked(self):
        """True while the lock is held."""
        return self._held

    def __enter__(self):
        self._take()
        return True

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return f"<tickwheel._speedups.Lock {'locked' if self._held else 'unlocked'}>"


cdef inline int _lock_take(Lock fast, object lock) except -1:
    """Take a list's lock: in C when it is a :class:`Lock`, else through ``acquire()``."""
    if fast is not None:
        return fast._take()
    lock.acquire()
    return 0


cdef inline int _lock_give(Lock fast, object lock) except -1:
    if fast is not None:
        fast._give()
    else:
        lock.release()
    return 0


# -- TimerCore: what both timers share -------------------------------------------------


cdef class TimerCore:
    """The wheel, its delay queue and the staging list (see ``tickwheel._timer_core``)."""


    def __init__(self, tick_ms, wheel_size, long long start_ms, lock=None):
        self._lock = lock if lock is not None else Lock()
        self._fast_lock = self._lock if type(self._lock) is Lock else None
        self._counter = TaskCounter()
        self._queue = BucketDelayQueue()
        self._wheel = TimingWheel(
            tick_ms, wheel_size, start_ms, self._counter, self._queue, self._lock
        )
        self._staged = TimerTaskList(self._counter, self._lock, level=-1)
        self._staged_min_ms = NEVER_C

    cdef bint _add_entry_c(self, TimerTaskEntry entry) noexcept:
        cdef TimerTaskList old
        if entry.expiration_ms < self._wheel._tick_end_ms:
            old = entry._list
            if old is not None and old is not CANCELLED_C:
                old._remove(entry)
            return False
        self._staged._add(entry)
        if entry.expiration_ms < self._staged_min_ms:
            self._staged_min_ms = entry.expiration_ms
        return True

    cdef int _place_staged_c(self) except -1:
        """Move every staged entry into its bucket, in order (TimingWheel.add on each)."""
        cdef TimerTaskList staged = self._staged
        cdef TimerTaskEntry root = staged._root
        cdef TimerTaskEntry node = root._next
        cdef TimerTaskEntry nxt
        cdef long long count = 0
        self._staged_min_ms = NEVER_C
        if node is root:
            return 0
        root._next = root
        root._prev = root
        while node is not root:
            nxt = node._next
            node._list = None
            self._wheel._add(node)
            count += 1
            node = nxt
        # _add counted each entry again as it linked it.
        self._counter.value -= count
        return 0

    cdef bint _advance_c(self, long long now_ms, list due) except -1:
        """Kafka's ``advanceClock`` after its wait; appends the due entries to ``due``."""
        cdef TimerTaskList bucket
        cdef TimerTaskEntry root, node, nxt
        cdef TimingWheel wheel = self._wheel
        cdef long long moved
        self._place_staged_c()
        bucket = self._queue._poll(now_ms)
        if bucket is None:
            return False
        while bucket is not None:
            wheel._advance_clock(bucket._expiration_ms)
            # TimerTaskList.flush, re-adding each entry as it goes.
            root = bucket._root
            node = root._next
            root._next = root
            root._prev = root
            bucket._expiration_ms = -1
            moved = 0
            while node is not root:
                nxt = node._next
                node._list = None
                moved += 1
                if not wheel._add(node):
                    node._next = None
                    node._prev = None
                    due.append(node)
                node = nxt
            self._counter.value -= moved
            bucket = self._queue._poll(now_ms)
        return True

    cdef long long _next_expiration_c(self) noexcept:
        cdef long long head = self._queue._head()
        cdef long long staged = self._staged_min_ms
        if staged != NEVER_C:
            staged = _floordiv(staged, self._wheel.tick_ms) * self._wheel.tick_ms
        return staged if staged < head else head

    def _add_entry(self, TimerTaskEntry entry):
        """Keep ``entry`` until it is due; False if it is due now. O(1)."""
        return self._add_entry_c(entry)

    def _place_staged(self):
        """Move every staged entry into its bucket, in order. O(staged × levels)."""
        self._place_staged_c()

    def _advance(self, long long now_ms, list due):
        """Flush every bucket due at ``now_ms``; append the entries now due to ``due``."""
        return self._advance_c(now_ms, due)

    def _next_expiration_ms(self):
        """The earliest time (ms) a bucket or a staged entry can be due; NEVER if none. O(1)."""
        return self._next_expiration_c()

    def _due_at(self, long long now_ms):
        """True when :meth:`_advance` at ``now_ms`` would find something due. O(1)."""
        return self._next_expiration_c() <= now_ms

    @property
    def size(self):
        """Number of entries held, staged or in buckets; drops at once on cancel. O(1)."""
        return self._counter.value

    @property
    def tick_ms(self):
        """The finest level's tick. O(1)."""
        return self._wheel.tick_ms

    @property
    def wheel_size(self):
        """Buckets per level. O(1)."""
        return self._wheel.wheel_size

    def _snapshot(self):
        """Place the staged entries, then picture every level, bucket and the queue."""
        from tickwheel._timer_core import snapshot_of

        self._place_staged_c()
        return snapshot_of(self)

    def _clear(self):
        """Remove every entry, staged or in a bucket, and empty the queue; return the entries."""
        cdef list entries = self._staged._flush()
        self._staged_min_ms = NEVER_C
        for wheel in self._wheel.levels():
            for bucket in (<TimingWheel>wheel).buckets:
                entries.extend((<TimerTaskList>bucket)._flush())
        while self._queue._poll(NEVER_C) is not None:
            pass
        return entries

    def _check(self):
        """Assert every invariant: links, counters, bucket expirations, queue contents."""
        from tickwheel._timer_core import check_core

        check_core(self)

    def _check_staged(self):
        """Assert the staging list's invariants; return its length."""
        from tickwheel._timer_core import check_staged

        return check_staged(self)
