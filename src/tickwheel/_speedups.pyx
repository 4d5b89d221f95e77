# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled core: twins of the pure-Python hot classes, same names, same behaviour.

The pure modules (``_task_list``, ``_task``, ``_delay_queue``, ``_wheel``,
``_timer_core``, and the hot halves in ``_timer`` and ``aio``) are the
reference and explain the algorithm; this module does the same steps with
typed C fields and C calls between them. ``_accel`` decides which path runs,
and one test suite runs on both. The inspection code (``_check``, snapshots)
is not repeated here: it calls the pure modules' functions on these objects.

Thread safety is the pure path's: every list of a timer shares the timer's
lock, and whoever changes a list holds it. The timers' lock is this module's
:class:`Lock`, a ``threading.Lock`` twin that C code takes without a Python
call and that ``threading.Condition`` waits on like any lock. A list given
another lock object calls its ``acquire``/``release``.
"""

cimport cython


cdef extern from "pythread.h":
    # Not in Cython's cpython/pythread.pxd; part of CPython's C API since 3.2.
    int PyThread_acquire_lock_timed(void *lock, long long microseconds, int intr_flag) nogil

from cpython.list cimport PyList_GET_SIZE
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PY_LOCK_ACQUIRED,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.math cimport ceil, floor
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import contextvars
import functools
import heapq
import logging
import operator

logger = logging.getLogger("tickwheel")

cdef object _heappush = heapq.heappush
cdef object _heappop = heapq.heappop
cdef object _when_of = operator.attrgetter("_when")

cdef long long NEVER_C = 9223372036854775807  # (1 << 63) - 1, NEVER in _timer_core
cdef long long MAX_DELAY_MS_C = 4611686018427387904  # 1 << 62, MAX_DELAY_MS in _task


cdef inline long long _floordiv(long long a, long long b) noexcept:
    """Python's a // b for b > 0."""
    cdef long long q = cython.cdiv(a, b)
    if cython.cmod(a, b) != 0 and a < 0:
        q -= 1
    return q


cdef inline long long _monotonic_ms() noexcept nogil:
    """``time.monotonic_ns() // 1_000_000`` (CPython reads the same clock)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return (<long long>ts.tv_sec) * 1000 + ts.tv_nsec // 1000000


cdef inline double _monotonic_s() noexcept nogil:
    """``time.monotonic()``: the same nanoseconds, divided as CPython divides them."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>((<long long>ts.tv_sec) * 1000000000 + ts.tv_nsec) / 1e9


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


# -- TimerTask ---------------------------------------------------------------------


cdef object _check_delay_ms = None


cdef long long _delay_of(object value) except? -1:
    """``value`` as int64 ms, checked as ``check_delay_ms`` checks it (which raises)."""
    global _check_delay_ms
    if type(value) is int and -MAX_DELAY_MS_C <= value <= MAX_DELAY_MS_C:
        return value
    if _check_delay_ms is None:
        from tickwheel._task import check_delay_ms

        _check_delay_ms = check_delay_ms
    return _check_delay_ms(value)


cdef class TimerTask(TimerTaskEntry):
    """A task that a timer runs once its delay has passed (see ``tickwheel._task``)."""

    cdef public object _call
    cdef public long long _delay_ms

    def __init__(self, delay_ms, fn=None, *args):
        self._delay_ms = _delay_of(delay_ms)
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be callable or None, got {fn!r}")
        self._call = (fn, args) if args and fn is not None else fn
        self.expiration_ms = -1

    @property
    def delay_ms(self):
        """The delay in milliseconds, counted from the moment the task is added. O(1)."""
        return self._delay_ms

    @delay_ms.setter
    def delay_ms(self, value):
        self._delay_ms = _delay_of(value)

    cpdef run(self):
        """Run the task: call ``fn(*args)``. Subclasses may override. O(1) plus ``fn``."""
        cdef object call = self._call
        if type(call) is tuple:
            (<tuple>call)[0](*(<tuple>call)[1])
        elif call is not None:
            call()

    def cancel(self):
        """Remove the task from its timer. O(1); True if it was pending (see the pure doc)."""
        cdef TimerTaskList lst
        while True:
            lst = self._list
            if lst is None or lst is CANCELLED_C:
                return False
            # Every list of a timer shares its lock; once held, the task may have
            # been moved by a concurrent flush: then look again.
            _lock_take(lst._fast_lock, lst._lock)
            try:
                if self._list is lst:
                    lst._remove(self)
                    self._list = CANCELLED_C
                    return True
            finally:
                _lock_give(lst._fast_lock, lst._lock)

    @property
    def is_cancelled(self):
        """True once :meth:`cancel` has removed this task from a timer. O(1)."""
        return self._list is CANCELLED_C

    @property
    def is_pending(self):
        """True while the task sits in a timer's bucket. O(1)."""
        return self._list is not None and self._list is not CANCELLED_C

    def __repr__(self):
        from tickwheel._task import task_repr

        return task_repr(self)


# -- the delay queue ---------------------------------------------------------------


@cython.final
cdef inline bint _item_before(tuple a, tuple b) except -1:
    """``a < b`` for two ``(expiration_ms, seq, bucket)`` items: their keys compared in C."""
    cdef long long ea = a[0]
    cdef long long eb = b[0]
    if ea != eb:
        return ea < eb
    return <long long>a[1] < <long long>b[1]


cdef class BucketDelayQueue:
    """A min-heap of buckets keyed by ``(expiration_ms, insertion order)``.

    The heap is ``heapq``'s (the same list of tuples, the same sift steps), its
    keys compared as C integers instead of through tuple and int comparison.
    """


    def __init__(self):
        self._heap = []
        self._seq = 0

    cdef bint _offer(self, TimerTaskList bucket) except -1:
        cdef list heap = self._heap
        cdef tuple item = (bucket._expiration_ms, self._seq, bucket)
        cdef Py_ssize_t pos = PyList_GET_SIZE(heap)
        cdef Py_ssize_t parent
        self._seq += 1
        heap.append(item)
        # heapq's _siftdown(heap, 0, pos).
        while pos > 0:
            parent = (pos - 1) >> 1
            if not _item_before(item, <tuple>heap[parent]):
                break
            heap[pos] = heap[parent]
            pos = parent
        heap[pos] = item
        return pos == 0

    cdef tuple _pop(self):
        """heapq.heappop: the smallest item, the heap re-ordered."""
        cdef list heap = self._heap
        cdef tuple last = heap.pop()
        cdef tuple top
        cdef Py_ssize_t n = PyList_GET_SIZE(heap)
        cdef Py_ssize_t pos = 0
        cdef Py_ssize_t child
        if n == 0:
            return last
        top = heap[0]
        # heapq's _siftup(heap, 0): the hole goes down to a leaf, then last sifts up.
        child = 1
        while child < n:
            if child + 1 < n and not _item_before(<tuple>heap[child], <tuple>heap[child + 1]):
                child += 1
            heap[pos] = heap[child]
            pos = child
            child = 2 * pos + 1
        while pos > 0:
            child = (pos - 1) >> 1
            if not _item_before(last, <tuple>heap[child]):
                break
            heap[pos] = heap[child]
            pos = child
        heap[pos] = last
        return top

    cdef long long _head(self) noexcept:
        """The first bucket's expiration, or NEVER."""
        if PyList_GET_SIZE(self._heap) == 0:
            return NEVER_C
        return (<tuple>self._heap[0])[0]

    cdef TimerTaskList _poll(self, long long now_ms):
        if PyList_GET_SIZE(self._heap) and self._head() <= now_ms:
            return self._pop()[2]
        return None

    def offer(self, TimerTaskList bucket):
        """Queue ``bucket`` under its current expiration; True if it is the new head. O(log b)."""
        return self._offer(bucket)

    def head_expiration_ms(self):
        """The expiration of the first bucket, or None when empty. O(1)."""
        return self._heap[0][0] if self._heap else None

    def poll(self, long long now_ms):
        """Remove and return the first bucket if it is due at ``now_ms``; else None. O(log b)."""
        return self._poll(now_ms)

    def __len__(self):
        """Number of queued buckets. O(1)."""
        return len(self._heap)

    def entries(self):
        """``(expiration_ms, bucket)`` for every queued bucket, in due order. O(b log b)."""
        return [(exp, bucket) for exp, _, bucket in sorted(self._heap, key=lambda e: e[:2])]

    def _check(self):
        """Assert the heap property and that every entry matches its bucket's expiration."""
        from tickwheel._delay_queue import check_queue

        check_queue(self)


# -- the timing wheel ----------------------------------------------------------------


@cython.final
cdef class TimingWheel:
    """One level of Kafka's hierarchical timing wheel (see ``tickwheel._wheel`` for the algorithm)."""


    def __init__(
        self,
        tick_ms,
        wheel_size,
        long long start_ms,
        TaskCounter task_counter,
        BucketDelayQueue queue,
        lock=None,
        int level=0,
    ):
        if type(tick_ms) is not int or tick_ms < 1:
            raise ValueError(f"tick_ms must be an int >= 1, got {tick_ms!r}")
        if type(wheel_size) is not int or wheel_size < 2:
            raise ValueError(f"wheel_size must be an int >= 2, got {wheel_size!r}")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = self.tick_ms * self.wheel_size
        self._set_current(_floordiv(start_ms, self.tick_ms) * self.tick_ms)
        self.level = level
        self._counter = task_counter
        self._queue = queue
        self._lock = lock if lock is not None else Lock()
        self.buckets = [
            TimerTaskList(task_counter, self._lock, level, index) for index in range(wheel_size)
        ]
        self.overflow_wheel = None

    cdef void _set_current(self, long long current_ms) noexcept:
        self.current_time_ms = current_ms
        self._tick_end_ms = current_ms + self.tick_ms
        self._end_ms = current_ms + self.interval_ms

    cdef TimingWheel _add_overflow_wheel(self):
        if self.overflow_wheel is None:
            self.overflow_wheel = TimingWheel(
                self.interval_ms,
                self.wheel_size,
                self.current_time_ms,
                self._counter,
                self._queue,
                self._lock,
                self.level + 1,
            )
        return self.overflow_wheel

    cdef bint _add(self, TimerTaskEntry entry) except -1:
        """Kafka's ``add``, with the recursion to the overflow wheels as a loop."""
        cdef long long expiration = entry.expiration_ms
        cdef long long virtual_id
        cdef TimingWheel wheel = self
        cdef TimerTaskList bucket
        if entry._list is CANCELLED_C or expiration < self._tick_end_ms:
            return False
        while expiration >= wheel._end_ms:
            if wheel.overflow_wheel is None:
                wheel._add_overflow_wheel()
            wheel = wheel.overflow_wheel
        virtual_id = _floordiv(expiration, wheel.tick_ms)
        bucket = wheel.buckets[virtual_id % wheel.wheel_size]
        bucket._add(entry)
        # A bucket is (re)queued only when it starts a new range.
        if bucket.set_expiration(virtual_id * wheel.tick_ms):
            wheel._queue._offer(bucket)
        return True

    def add(self, TimerTaskEntry entry):
        """Put ``entry`` in its bucket; False when it is cancelled or already due. O(levels)."""
        return self._add(entry)

    cdef void _advance_clock(self, long long time_ms) noexcept:
        cdef TimingWheel wheel = self
        while wheel is not None and time_ms >= wheel._tick_end_ms:
            time_ms = _floordiv(time_ms, wheel.tick_ms) * wheel.tick_ms
            wheel._set_current(time_ms)
            wheel = wheel.overflow_wheel

    def advance_clock(self, long long time_ms):
        """Move this level and those above to ``time_ms``, rounded down to each tick. O(levels)."""
        self._advance_clock(time_ms)

    def levels(self):
        """This wheel and its overflow wheels, finest first. O(levels)."""
        out = []
        wheel = self
        while wheel is not None:
            out.append(wheel)
            wheel = wheel.overflow_wheel
        return out

    def _check(self):
        """Assert every level's invariants; return the number of entries held."""
        from tickwheel._wheel import check_wheel

        return check_wheel(self)


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


# -- SystemTimer's hot half ----------------------------------------------------------------


cdef void _log_task_error(object task):
    logger.exception("timer task %r raised", task)


def run_task(task):
    """Run ``task``, logging (not raising) an exception, so the caller keeps going."""
    try:
        task.run()
    except Exception:
        _log_task_error(task)


cdef class SystemTimerCore(TimerCore):
    """SystemTimer's hot half (see ``tickwheel._timer``): add, schedule, advance, dispatch."""

    cdef public bint _closed
    cdef public bint _manual
    cdef public bint _inline
    cdef public bint _system_clock
    cdef public object _now
    cdef public object _manual_clock
    cdef public object _own_executor
    cdef public object _executor
    cdef public long long _waiting
    cdef public long long _wake_at_ms

    cdef inline long long _now_c(self) except? -1:
        if self._manual_clock is not None:
            return self._manual_clock._now_ms
        if self._system_clock:
            return _monotonic_ms()
        return self._now()

    cdef int _add_c(self, TimerTask task) except -1:
        cdef bint staged = False
        cdef TimerTaskList lst
        _lock_take(self._fast_lock, self._lock)
        try:
            if self._closed:
                raise RuntimeError(f"timer {self.name!r} is closed")
            lst = task._list
            if lst is CANCELLED_C:
                return 0
            if lst is not None and lst._lock is not self._lock:
                raise ValueError(f"{task!r} is pending in another timer; cancel it first")
            task.expiration_ms = task._delay_ms + self._now_c()
            staged = self._add_entry_c(task)
            # _wake_for's own test first, in C: most adds wake nobody.
            if staged and self._waiting and _floordiv(
                task.expiration_ms, self._wheel.tick_ms
            ) * self._wheel.tick_ms < self._wake_at_ms:
                self._wake_for(task.expiration_ms)
        finally:
            _lock_give(self._fast_lock, self._lock)
        if not staged:
            self._dispatch_c([task])
        return 0

    def add(self, TimerTask task):
        """Schedule ``task`` to run ``task.delay_ms`` after the clock's current time. O(1).

        See :meth:`tickwheel.SystemTimer.add`.
        """
        self._add_c(task)

    def schedule(self, delay_ms, fn, *args):
        """Create a :class:`TimerTask` for ``fn(*args)`` after ``delay_ms``, add it, return it. O(1)."""
        cdef TimerTask task = TimerTask.__new__(TimerTask)
        task._delay_ms = _delay_of(delay_ms)
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be callable or None, got {fn!r}")
        task._call = (fn, args) if args and fn is not None else fn
        task.expiration_ms = -1
        self._add_c(task)
        return task

    def advance_clock(self, long long timeout_ms=0):
        """Run every due bucket, waiting up to ``timeout_ms`` for the first one.

        See :meth:`tickwheel.SystemTimer.advance_clock`. O(due buckets + tasks
        moved + tasks staged).
        """
        cdef list due
        cdef bint fired
        cdef long long now
        if (timeout_ms <= 0 or self._manual) and self._staged._root._next is self._staged._root:
            # Nothing staged: answer without the lock when no bucket is due (an
            # event-time loop calls this once per event).
            if self._queue._head() > self._now_c():
                return False
        due = []
        _lock_take(self._fast_lock, self._lock)
        try:
            if self._closed:
                return False
            now = self._now_c()
            fired = self._advance_c(now, due)
            if not fired and timeout_ms > 0 and not self._manual:
                fired = self._wait_for_bucket(now, timeout_ms, due)
        finally:
            _lock_give(self._fast_lock, self._lock)
        if due:
            self._dispatch_c(due)
        return fired

    cdef int _dispatch_c(self, list tasks) except -1:
        cdef Py_ssize_t i, n
        if self._inline:
            n = PyList_GET_SIZE(tasks)
            for i in range(n):
                task = tasks[i]
                try:
                    (<TimerTask>task).run()
                except Exception:
                    _log_task_error(task)
        elif self._own_executor is not None:
            self._own_executor.submit_many(tasks)
        else:
            for task in tasks:
                self._executor.submit(functools.partial(run_task, task))
        return 0

    def _dispatch(self, list tasks):
        """Hand due tasks to the executor. Called without the lock held."""
        self._dispatch_c(tasks)


# -- AsyncTimer's hot half ------------------------------------------------------------------


cdef inline long long _ceil_ms(double when) noexcept:
    """The smallest integer m with m / 1000 >= when (as ``aio._handle.ceil_ms``)."""
    cdef long long m = <long long>ceil(when * 1000.0)
    if <double>m / 1000.0 < when:
        m += 1
    elif <double>(m - 1) / 1000.0 >= when:
        m -= 1
    return m


cdef inline long long _floor_ms(double now) noexcept:
    """The largest integer m with m / 1000 <= now (as ``aio._handle.floor_ms``)."""
    cdef long long m = <long long>floor(now * 1000.0)
    if <double>m / 1000.0 > now:
        m -= 1
    elif <double>(m + 1) / 1000.0 <= now:
        m += 1
    return m


cdef object _check_delay_s = None
cdef object _check_when_s = None


cdef double _seconds(object value, bint is_delay) except? -1.0:
    """A delay (>= 0) or a loop time (not NaN) as a checked double, as ``aio._handle``'s checks."""
    global _check_delay_s, _check_when_s
    cdef double v
    if type(value) is float:
        v = value
        if (v >= 0.0) if is_delay else (v == v):
            return v
    if _check_delay_s is None:
        from tickwheel.aio._handle import check_delay, check_when

        _check_delay_s = check_delay
        _check_when_s = check_when
    return (_check_delay_s if is_delay else _check_when_s)(value)


cdef extern from "Python.h":
    int PyContext_Enter(object) except -1
    int PyContext_Exit(object) except -1
    object PyContext_CopyCurrent()  # contextvars.copy_context(), in C


cdef class TimerHandle(TimerTaskEntry):
    """A callback scheduled on an AsyncTimer, like :class:`asyncio.TimerHandle` (see ``aio._handle``)."""

    cdef public double _when
    cdef public object _callback
    cdef public object _args
    cdef public object _context

    def __init__(self, double when, callback, tuple args, context=None):
        self.expiration_ms = -1
        self._when = when
        self._callback = callback
        self._args = args
        self._context = context

    @property
    def _source_traceback(self):
        """The stack that created the handle: None outside debug mode (``DebugTimerHandle``)."""
        return None

    def when(self):
        """The deadline, in the loop's time (seconds). O(1)."""
        return self._when

    def cancel(self):
        """Cancel the callback; it will not run. O(1), idempotent."""
        cdef TimerTaskList lst = self._list
        if lst is CANCELLED_C:
            return
        if lst is not None:
            lst._remove(self)
        self._list = CANCELLED_C
        self._callback = None
        self._args = None
        self._context = None

    def cancelled(self):
        """True once :meth:`cancel` was called. O(1)."""
        return self._list is CANCELLED_C

    def _run(self):
        """Call the callback, in its context if it has one (the timer catches what it raises)."""
        _run_handle(self)

    def __repr__(self):
        from tickwheel.aio._handle import handle_repr

        return handle_repr(self)


cdef class DebugTimerHandle(TimerHandle):
    """A TimerHandle made in debug mode: it keeps the stack that created it (see ``aio._handle``)."""

    cdef object _stack

    @property
    def _source_traceback(self):
        """The stack that created the handle (``asyncio.format_helpers.extract_stack``)."""
        return self._stack

    @_source_traceback.setter
    def _source_traceback(self, stack):
        self._stack = stack


cdef TimerHandle _new_handle(double when, object callback, tuple args, object context):
    """``TimerHandle(when, callback, args, context)`` without the call of __init__."""
    cdef TimerHandle handle = TimerHandle.__new__(TimerHandle)
    handle.expiration_ms = -1
    handle._when = when
    handle._callback = callback
    handle._args = args
    handle._context = context
    return handle


cdef int _run_handle(TimerHandle handle) except -1:
    """Call the handle's callback, inside its context when it has one (``Context.run``)."""
    cdef object context = handle._context
    if context is None:
        handle._callback(*handle._args)
        return 0
    PyContext_Enter(context)
    try:
        handle._callback(*handle._args)
    finally:
        PyContext_Exit(context)
    return 0


@cython.final
cdef class RealTimerArm:
    """The compiled ``EventLoop._arm_real_timer``: arms the wheel's one real timer of an asyncio loop.

    ``arm(when, callback, context=ctx)`` does what the pure method does (see
    ``tickwheel.aio._loop``): the asyncio handle it armed last, once fired
    (neither cancelled nor queued), is pushed back on the loop's heap for the
    new deadline, else ``base_call_at`` (asyncio's own ``call_at``) makes a
    new one. It keeps that handle in a C field, and the compiled timer calls
    it in C: a re-arm reads only the handle's flags and the loop's heap, debug
    and closed state. O(log of the loop's heap).
    """

    cdef object _loop
    cdef object _base_call_at
    cdef object _handle

    def __init__(self, loop, base_call_at):
        self._loop = loop
        self._base_call_at = base_call_at

    def __call__(self, double when, callback, *, context):
        return self._arm(when, callback, context)

    cdef object _arm(self, double when, object callback, object context):
        loop = self._loop
        handle = self._handle
        if handle is not None and not (handle._scheduled or handle._cancelled or loop._debug):
            if loop._closed:
                raise RuntimeError("Event loop is closed")  # asyncio's _check_closed
            handle._when = when
            _heappush(loop._scheduled, handle)
            handle._scheduled = True
            return handle
        handle = self._base_call_at(when, callback, context=context)
        self._handle = handle
        return handle


cdef class AsyncTimerCore(TimerCore):
    """AsyncTimer's hot half (see ``tickwheel.aio._timer``): scheduling, the loop timer, running."""

    cdef public object _loop
    cdef public object _time
    cdef public object _call_at_loop
    cdef public object _context
    cdef public object _loop_handle
    cdef public long long _armed_ms
    cdef public list _ready
    cdef public bint _ready_scheduled
    cdef public object _batch
    cdef public bint _closed
    cdef public double _horizon_s
    cdef public TimerTaskList _parked
    # self._run_due, bound once: the loop timer's callback at every re-arm.
    cdef object _run_due_bound

    cdef inline double _now_s(self) except? -1.0:
        if self._time is _time_monotonic:
            return _monotonic_s()
        return self._time()

    def call_later(self, delay, callback, *args, context=None):
        """Run ``callback(*args)`` ``delay`` seconds from now; return its handle. O(1)."""
        cdef double d = _seconds(delay, True)
        self._check_call(callback)
        return self._add_c(_new_handle(self._now_s() + d, callback, args, context))

    def call_at(self, when, callback, *args, context=None):
        """Run ``callback(*args)`` once the loop's time reaches ``when``; return its handle. O(1)."""
        cdef double w = _seconds(when, False)
        self._check_call(callback)
        return self._add_c(_new_handle(w, callback, args, context))

    def _check_call(self, callback):
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")

    cdef TimerHandle _add_c(self, TimerHandle handle):
        cdef long long m, tick
        cdef double when = handle._when
        if -self._horizon_s < when < self._horizon_s:
            m = _ceil_ms(when)
            tick = self._wheel.tick_ms
            if tick != 1:
                m = -_floordiv(-m, tick) * tick
            handle.expiration_ms = m
            if self._add_entry_c(handle):
                if m < self._armed_ms:
                    self._arm_c(m)
                return handle
        elif when >= self._horizon_s:
            self._parked._add(handle)
            return handle
        self._run_soon_c(handle)
        return handle

    def _add(self, TimerHandle handle):
        """Keep ``handle`` until its deadline; return it. The caller checked that the timer is open."""
        return self._add_c(handle)

    cdef int _run_soon_c(self, TimerHandle handle) except -1:
        self._ready.append(handle)
        if not self._ready_scheduled:
            self._ready_scheduled = True
            self._loop.call_soon(self._on_ready, context=self._context)
        return 0

    def _run_soon(self, TimerHandle handle):
        """Run ``handle``, already due, on the next loop iteration, never synchronously."""
        self._run_soon_c(handle)

    cdef int _arm_c(self, long long expiration_ms) except -1:
        if self._loop_handle is not None:
            self._disarm_c()
        self._armed_ms = expiration_ms
        if self._run_due_bound is None:
            self._run_due_bound = self._run_due
        arm = self._call_at_loop
        if type(arm) is RealTimerArm:
            self._loop_handle = (<RealTimerArm>arm)._arm(
                expiration_ms / 1000, self._run_due_bound, self._context
            )
        else:
            self._loop_handle = arm(expiration_ms / 1000, self._run_due_bound, context=self._context)
        return 0

    cdef int _disarm_c(self) except -1:
        if self._loop_handle is not None:
            self._loop_handle.cancel()
            self._loop_handle = None
        self._armed_ms = NEVER_C
        return 0

    def _arm(self, long long expiration_ms):
        """Point the one loop timer at ``expiration_ms``. O(log of the loop's heap)."""
        self._arm_c(expiration_ms)

    def _disarm(self):
        """Release the loop timer, if held."""
        self._disarm_c()

    def _on_ready(self):
        """Run handles that were already due when scheduled."""
        self._ready_scheduled = False
        self._run_due_c(False)

    def _run_due(self, fired=True):
        """Flush every due bucket (cascading coarse ones), re-arm, then run callbacks in order."""
        self._run_due_c(fired)

    cdef int _run_due_c(self, bint fired) except -1:
        cdef list due
        cdef long long head
        if fired:
            self._loop_handle = None
            self._armed_ms = NEVER_C
        if self._closed:
            return 0
        due = self._ready
        self._ready = []
        self._advance_c(_floor_ms(self._now_s()), due)
        # Re-arm for the new head before running callbacks, which may add timers.
        if self._counter.value == 0:
            # Only empty buckets are left (all cancelled): forget them.
            self._clear()
            self._disarm_c()
        else:
            head = self._next_expiration_c()
            if head != self._armed_ms:
                self._arm_c(head)
        if PyList_GET_SIZE(due):
            if PyList_GET_SIZE(due) > 1:
                due.sort(key=_when_of)
            self._run_handles_c(due)
        return 0

    cdef int _run_handles_c(self, list handles) except -1:
        cdef Py_ssize_t i = 0
        cdef Py_ssize_t n = PyList_GET_SIZE(handles)
        cdef TimerHandle handle
        cdef object debug = None
        self._batch = handles  # so that close() from a callback cancels the rest
        if _in_debug_mode(self._loop):
            debug = _debug_run(self._loop, self._report_callback_error)
        while i < n:
            handle = handles[i]
            i += 1
            if handle._list is CANCELLED_C:
                continue
            try:
                if debug is None:
                    _run_handle(handle)
                else:
                    debug(handle)
            except (SystemExit, KeyboardInterrupt):
                self._run_next_iteration(handles[i:])
                raise
            except BaseException as exc:
                self._report_callback_error(handle, exc)
        self._batch = None
        if debug is not None:
            debug.finish()
        return 0

    def _run_handles(self, list handles):
        """Run each handle not cancelled meanwhile; report what a callback raises."""
        self._run_handles_c(handles)


cdef inline bint _in_debug_mode(object loop) except -1:
    """``loop.get_debug()``: asyncio's loops (and tickwheel's) read without a Python call."""
    debug = getattr(loop, "_debug", None)
    if debug is None:
        debug = loop.get_debug()
    return bool(debug)


cdef object _debug_run_class = None


cdef object _debug_run(object loop, object report):
    """``aio._debug.DebugRun(loop, report)``: debug mode's runner of a batch (cold, Python)."""
    global _debug_run_class
    if _debug_run_class is None:
        from tickwheel.aio._debug import DebugRun

        _debug_run_class = DebugRun
    return _debug_run_class(loop, report)


import time as _time_module

cdef object _time_monotonic = _time_module.monotonic


# -- the compiled floor (for benchmarks/) ---------------------------------------------------


@cython.final
cdef class _FloorEntry:
    """An entry of :class:`FloorTimer`: a timer task's fields, and the cheapest locked cancel."""

    cdef object _call
    cdef long long _delay_ms
    cdef long long expiration_ms
    cdef _FloorEntry _next
    cdef _FloorEntry _prev
    cdef FloorTimer _timer

    def cancel(self):
        """Take the lock and unlink: no checks, no count, no cancelled mark."""
        cdef Lock lock = self._timer._lock
        lock._take()
        self._next._prev = self._prev
        self._prev._next = self._next
        self._next = None
        self._prev = None
        self._timer = None
        lock._give()
        return True


@cython.final
cdef class FloorTimer:
    """Not a timer: the least C work of a thread-safe intrusive one, for the benchmarks' floor.

    ``schedule`` allocates an entry, takes the lock and links the entry at the
    tail of one list (no wheel, no bucket choice); ``cancel`` takes the lock
    and unlinks it. A compiled timer with O(1) cancel that frees the entry at
    once cannot do less.
    """

    cdef Lock _lock
    cdef _FloorEntry _root
    cdef readonly long long now_ms

    def __init__(self):
        self._lock = Lock()
        self._root = _FloorEntry.__new__(_FloorEntry)
        self._root._next = self._root
        self._root._prev = self._root

    def schedule(self, long long delay_ms, fn, *args):
        """Allocate, lock, link at the tail; return the entry."""
        cdef _FloorEntry entry = _FloorEntry.__new__(_FloorEntry)
        entry._delay_ms = delay_ms
        entry._call = fn
        self._lock._take()
        entry.expiration_ms = delay_ms + self.now_ms
        entry._next = self._root
        entry._prev = self._root._prev
        entry._timer = self
        self._root._prev._next = entry
        self._root._prev = entry
        self._lock._give()
        return entry


@cython.final
cdef class _AsyncFloorHandle:
    """A handle of :class:`AsyncFloorTimer`: a wheel handle's fields, and an unlinking cancel."""

    cdef double _when
    cdef object _callback
    cdef object _args
    cdef long long expiration_ms
    cdef _AsyncFloorHandle _next
    cdef _AsyncFloorHandle _prev

    def cancel(self):
        """Unlink: no checks, no count, no cancelled mark."""
        self._next._prev = self._prev
        self._prev._next = self._next
        self._next = None
        self._prev = None


@cython.final
cdef class AsyncFloorTimer:
    """Not a timer: the least C work of a loop-thread one with an eager cancel (for benchmarks/).

    ``call_later`` allocates a handle, reads the loop's time, rounds the deadline
    up to the millisecond and links the handle at the tail of one list (no
    wheel, no bucket choice, no loop timer); ``cancel`` unlinks it.
    """

    cdef object _time
    cdef _AsyncFloorHandle _root

    def __init__(self, loop):
        self._time = loop.time
        self._root = _AsyncFloorHandle.__new__(_AsyncFloorHandle)
        self._root._next = self._root
        self._root._prev = self._root

    def call_later(self, double delay, callback, *args):
        """Allocate, round the deadline up to the ms, link at the tail; return the handle."""
        cdef _AsyncFloorHandle handle = _AsyncFloorHandle.__new__(_AsyncFloorHandle)
        cdef double when = <double>self._time() + delay
        handle._when = when
        handle._callback = callback
        handle._args = args
        handle.expiration_ms = _ceil_ms(when)
        handle._next = self._root
        handle._prev = self._root._prev
        self._root._prev._next = handle
        self._root._prev = handle
        return handle

    def pending_whens(self):
        """The deadlines still linked, in list order."""
        cdef list whens = []
        cdef _AsyncFloorHandle node = self._root._next
        while node is not self._root:
            whens.append(node._when)
            node = node._next
        return whens


@cython.final
cdef class _DropInFloorHandle:
    """A handle of :class:`DropInFloor`: a drop-in handle's fields, and an unlinking cancel."""

    cdef readonly double _when
    cdef object _callback
    cdef object _args
    cdef object _context
    cdef readonly long long expiration_ms
    cdef _DropInFloorHandle _next
    cdef _DropInFloorHandle _prev

    def cancel(self):
        """Unlink, if linked: no count, no cancelled mark, nothing released."""
        if self._next is not None:
            self._next._prev = self._prev
            self._prev._next = self._next
            self._next = None
            self._prev = None


@cython.final
cdef class DropInFloor:
    """Not a timer: the least C work of a drop-in loop's timers (for benchmarks/).

    ``loop.call_later``/``loop.call_at`` (:func:`floor_loop_call_later`,
    :func:`floor_loop_call_at`) allocate a handle, copy the caller's context
    (asyncio's semantics), round the deadline up to the millisecond and link the
    handle at the tail of one list; ``cancel`` unlinks it. Firing is the least a
    loop-driven timer does per due millisecond: given the pending handles
    already sorted (the benchmark sorts them, untimed), one real timer of the
    loop, pushed back on asyncio's heap for the next deadline, and each
    callback run in its context.
    """

    cdef _DropInFloorHandle _root
    cdef list _chain
    cdef Py_ssize_t _pos
    cdef object _loop
    cdef object _spare

    def __init__(self, loop):
        self._loop = loop
        self._root = _DropInFloorHandle.__new__(_DropInFloorHandle)
        self._root._next = self._root
        self._root._prev = self._root
        self._chain = []
        self._pos = 0

    cdef _DropInFloorHandle _add(self, double when, object callback, tuple args, object context):
        cdef _DropInFloorHandle handle = _DropInFloorHandle.__new__(_DropInFloorHandle)
        handle._when = when
        handle._callback = callback
        handle._args = args
        handle._context = PyContext_CopyCurrent() if context is None else context
        handle.expiration_ms = _ceil_ms(when)
        handle._next = self._root
        handle._prev = self._root._prev
        self._root._prev._next = handle
        self._root._prev = handle
        return handle

    def take_pending(self):
        """Unlink every pending handle and return them, in list order."""
        cdef list pending = []
        cdef _DropInFloorHandle node = self._root._next
        cdef _DropInFloorHandle nxt
        while node is not self._root:
            nxt = node._next
            node._next = None
            node._prev = None
            pending.append(node)
            node = nxt
        self._root._next = self._root
        self._root._prev = self._root
        return pending

    @property
    def firing(self):
        """True while sorted handles remain to fire."""
        return self._pos < PyList_GET_SIZE(self._chain)

    def fire_in_order(self, list handles, base_call_at):
        """Fire ``handles`` (sorted by deadline) one due millisecond per loop wake-up."""
        self._chain = handles
        self._pos = 0
        if handles:
            self._spare = base_call_at(
                self._loop, (<_DropInFloorHandle>handles[0]).expiration_ms / 1000, self._fire
            )

    def _fire(self):
        cdef list chain = self._chain
        cdef Py_ssize_t n = PyList_GET_SIZE(chain)
        cdef _DropInFloorHandle handle = chain[self._pos]
        cdef long long ms = handle.expiration_ms
        while True:
            chain[self._pos] = None  # fired: the floor holds it no more, as a wheel does not
            self._pos += 1
            PyContext_Enter(handle._context)
            try:
                handle._callback(*handle._args)
            finally:
                PyContext_Exit(handle._context)
            if self._pos == n:
                return
            handle = chain[self._pos]
            if handle.expiration_ms != ms:
                break
        # The real timer that just fired is off the heap: push it back for the next.
        spare = self._spare
        spare._when = handle.expiration_ms / 1000
        _heappush(self._loop._scheduled, spare)
        spare._scheduled = True


def floor_loop_call_later(self, delay, callback, *args, context=None):
    """The drop-in floor's ``loop.call_later`` (see :class:`DropInFloor`)."""
    cdef DropInFloor floor = self._drop_in_floor
    return floor._add(<double>self.time() + <double>delay, callback, args, context)


def floor_loop_call_at(self, when, callback, *args, context=None):
    """The drop-in floor's ``loop.call_at`` (see :class:`DropInFloor`)."""
    cdef DropInFloor floor = self._drop_in_floor
    return floor._add(when, callback, args, context)


# == the purgatory's hot halves =============================================================
#
# Twins of ``tickwheel._purgatory``'s ``_DelayedOperationCore``, ``_WatcherList`` and
# ``_PurgatoryCore`` (the pure module explains the algorithm and the ground rules:
# one winner, try_complete under op.lock, lock order op.lock -> shard lock -> timer
# lock, lazy removal). What a Python subclass may override (``try_complete``,
# ``on_complete``, ``on_expiration``, ``force_complete``, ``cancel``, the safe
# tries, ``run``, a timer's ``add``) is still honoured: each is called directly in
# C only while it is the base class's own.

from cpython.object cimport PyObject, PyTypeObject, Py_TYPE, PyObject_Hash
from cpython.dict cimport PyDict_Next

import _thread
from types import GenericAlias as _GenericAlias


cdef extern from "Python.h":
    # Looks a name up along the type's MRO, through CPython's method cache (borrowed).
    PyObject* _PyType_Lookup(PyTypeObject *type, PyObject *name)
    void PyObject_GC_UnTrack(void *op)

    ctypedef struct PyListObject:
        PyObject **ob_item


cdef enum:
    _SHARD_MASK = 511  # SHARDS - 1 in _purgatory: 512 shards, so hash & mask == hash % 512
    _PENDING = 0
    _COMPLETED = 1
    _CANCELLED = 2

# Makes the pending -> completed/cancelled flip atomic and guards the purgatories'
# counters (``_STATE_LOCK`` in _purgatory), taken in C.
cdef Lock _STATE_LOCK_C = Lock()
cdef object _new_rlock = _thread.RLock
cdef frozenset _LOCK_TYPES = frozenset({type(_thread.allocate_lock()), _thread.RLock})


cdef inline bint _is_base(object obj, str name, object base) noexcept:
    """True when ``type(obj)``'s ``name`` is ``base``: not overridden by a subclass."""
    return _PyType_Lookup(Py_TYPE(obj), <PyObject*>name) == <PyObject*>base


cdef inline bint _calls_base(object obj, str name, object base) noexcept:
    """True when ``obj.name()`` would call ``base``: not overridden by a subclass, and ``obj``
    has no ``__dict__`` that could hold an override (an op with ``__slots__``); otherwise
    the caller makes the Python call, as the pure twin does."""
    return Py_TYPE(obj).tp_dictoffset == 0 and _is_base(obj, name, base)


cdef int _cancel_task(TimerTask task) except -1:
    """``TimerTask.cancel`` (the same steps), callable from C; the result is not needed."""
    cdef TimerTaskList lst
    while True:
        lst = task._list
        if lst is None or lst is CANCELLED_C:
            return 0
        _lock_take(lst._fast_lock, lst._lock)
        try:
            if task._list is lst:
                lst._remove(task)
                task._list = CANCELLED_C
                return 0
        finally:
            _lock_give(lst._fast_lock, lst._lock)


cdef class _PurgatoryCore


cdef class _DelayedOperationCore(TimerTask):
    """DelayedOperation's hot half (see ``tickwheel._purgatory``): completion, safe tries, expiry."""

    cdef public object lock
    cdef public int _state
    cdef public _PurgatoryCore _purgatory

    def __init__(self, delay_ms, lock=None):
        self._delay_ms = _delay_of(delay_ms)
        self._call = None
        self.expiration_ms = -1
        if lock is None:
            lock = _new_rlock()
            # The op's own RLock refers to no object but its type, so it can never
            # be part of a cycle: the collector need not track it (CPython untracks
            # such objects itself, as tuples of atoms). A pending op is then one
            # tracked object, not two: about half the collector's work per op.
            PyObject_GC_UnTrack(<PyObject*>lock)
        elif type(lock) not in _LOCK_TYPES and not (
            hasattr(lock, "acquire") and hasattr(lock, "release")
        ):
            raise TypeError(
                f"lock must be a lock with acquire() and release() or None, got {lock!r}"
            )
        self.lock = lock
        self._state = _PENDING
        self._purgatory = None

    cdef inline int _cancel(self) except -1:
        """``self.cancel()``: in C unless a subclass overrides it."""
        if _calls_base(self, "cancel", _BASE_CANCEL):
            return _cancel_task(self)
        self.cancel()
        return 0

    def force_complete(self):
        """Complete the op if nobody has yet: cancel its timer entry and run ``on_complete()``.

        True only for the single caller that won (see ``tickwheel.DelayedOperation``).
        """
        return self._complete(False)

    cdef bint _complete(self, bint expired) except -1:
        """Flip pending -> completed (counting it, as expired too when ``expired``); then
        cancel and run ``on_complete()``. True if this call won."""
        cdef _PurgatoryCore purgatory
        _STATE_LOCK_C._take()
        if self._state != _PENDING:
            _STATE_LOCK_C._give()
            return False
        self._state = _COMPLETED
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._num_finished += 1
            if expired:
                purgatory._num_expired += 1
        _STATE_LOCK_C._give()
        self._cancel()
        self.on_complete()
        return True

    @property
    def is_completed(self):
        """True once the op has completed (by its condition or by expiring). O(1)."""
        return self._state == _COMPLETED

    cpdef object safe_try_complete(self):
        """Call ``try_complete`` with ``lock`` held; return its result."""
        lock = self.lock
        lock.acquire()
        try:
            return self.try_complete()
        finally:
            lock.release()

    def safe_try_complete_or_else(self, action):
        """Under ``lock``: try to complete; else run ``action()`` and try once more."""
        lock = self.lock
        lock.acquire()
        try:
            if self.try_complete():
                return True
            action()
            return self.try_complete()
        finally:
            lock.release()

    cdef object _try_complete_or_watch(self, _PurgatoryCore purgatory, object keys):
        """``safe_try_complete_or_else`` with the purgatory's watch as the action (no closure)."""
        lock = self.lock
        lock.acquire()
        try:
            if self.try_complete():
                return True
            purgatory._watch_c(self, keys)
            return self.try_complete()
        finally:
            lock.release()

    cpdef run(self):
        """The expiry path, run by the timer: if the op completes now, ``on_expiration()``."""
        cdef bint completed
        cdef _PurgatoryCore purgatory
        if _is_base(self, "force_complete", _BASE_FORCE_COMPLETE):
            completed = self._complete(True)
        else:
            completed = self.force_complete()
            purgatory = self._purgatory
            if completed and purgatory is not None:
                _STATE_LOCK_C._take()
                purgatory._num_expired += 1
                _STATE_LOCK_C._give()
        if completed:
            self.on_expiration()

    cdef bint _mark_cancelled_c(self) except -1:
        _STATE_LOCK_C._take()
        if self._state != _PENDING:
            _STATE_LOCK_C._give()
            return False
        self._state = _CANCELLED
        _STATE_LOCK_C._give()
        self._cancel()
        return True

    def _mark_cancelled(self):
        """Flip pending -> cancelled (no completion); True if this call did it."""
        return self._mark_cancelled_c()


cdef object _BASE_CANCEL = TimerTask.__dict__["cancel"]
cdef object _BASE_FORCE_COMPLETE = _DelayedOperationCore.__dict__["force_complete"]
cdef object _BASE_SAFE_TRY_COMPLETE_OR_ELSE = (
    _DelayedOperationCore.__dict__["safe_try_complete_or_else"]
)
cdef object _BASE_TIMER_ADD = SystemTimerCore.__dict__["add"]


@cython.final
cdef class _WatcherList:
    """One shard: the watchers of the keys hashing to it, under one lock (see ``_purgatory``)."""

    cdef readonly Lock lock
    cdef readonly dict watchers
    cdef readonly Py_ssize_t count

    def __init__(self):
        self.lock = Lock()
        self.watchers = {}
        self.count = 0

    cdef int _watch(self, object key, _DelayedOperationCore op) except -1:
        """Add ``op`` to the list of ``key``. O(1)."""
        self.lock._take()
        try:
            ops = self.watchers.get(key)
            if ops is None:
                self.watchers[key] = op
            elif type(ops) is list:
                (<list>ops).append(op)
            else:
                self.watchers[key] = [ops, op]
            self.count += 1
        finally:
            self.lock._give()
        return 0

    cdef object _ops_of(self, object key):
        """The ops of ``key``: None, the lone op itself, or a copy of the list. O(ops)."""
        self.lock._take()
        try:
            ops = self.watchers.get(key)
            if type(ops) is list:
                return (<list>ops)[:]
            return ops
        finally:
            self.lock._give()

    cdef Py_ssize_t _keep_pending(self, object ops) except -1:
        """Compact the list ``ops`` to its pending ops, in place; return how many are left.

        A lone op (not a list) counts 1 if pending, else 0. Caller holds the lock.
        """
        cdef PyObject **items
        cdef PyObject *item
        cdef Py_ssize_t i, n, kept = 0
        if type(ops) is not list:
            return 0 if (<_DelayedOperationCore>ops)._state else 1
        n = PyList_GET_SIZE(ops)
        items = (<PyListObject*>ops).ob_item
        # The pending ops move to the front, in order, by swapping pointers: no
        # reference counting, so a pending op is only read (a purge reads every
        # watched op). The ops no longer pending end at the tail, deleted at once.
        for i in range(n):
            item = items[i]
            if (<_DelayedOperationCore>item)._state == _PENDING:
                if kept != i:
                    items[i] = items[kept]
                    items[kept] = item
                kept += 1
        if kept != n:
            del (<list>ops)[kept:]
        return kept

    cdef int _store_kept(self, object key, object ops, Py_ssize_t n, Py_ssize_t kept) except -1:
        """After :meth:`_keep_pending` left ``kept`` of ``n``: drop the key, or store a lone op."""
        if kept == n:
            return 0
        self.count -= n - kept
        if kept == 0:
            del self.watchers[key]
        elif kept == 1 and type(ops) is list:
            self.watchers[key] = (<list>ops)[0]
        return 0

    cdef int _drop_done(self, object key) except -1:
        """Remove the ops of ``key`` that are no longer pending. O(ops)."""
        cdef Py_ssize_t n
        self.lock._take()
        try:
            ops = self.watchers.get(key)
            if ops is not None:
                n = PyList_GET_SIZE(ops) if type(ops) is list else 1
                self._store_kept(key, ops, n, self._keep_pending(ops))
        finally:
            self.lock._give()
        return 0

    def drop_done(self, key):
        """Remove the ops of ``key`` that are no longer pending. O(ops)."""
        self._drop_done(key)

    def watch(self, key, _DelayedOperationCore op):
        """Add ``op`` to the list of ``key``. O(1)."""
        self._watch(key, op)

    def ops_of(self, key):
        """A copy of the list of ``key`` (empty for an unknown key). O(ops)."""
        ops = self._ops_of(key)
        if ops is None:
            return ()
        return ops if type(ops) is list else (ops,)

    cdef list _cancel(self, object key):
        """Remove the list of ``key``; return its ops. O(ops)."""
        cdef list ops
        self.lock._take()
        try:
            found = self.watchers.pop(key, None)
            if found is None:
                return []
            ops = <list>found if type(found) is list else [found]
            self.count -= PyList_GET_SIZE(ops)
            return ops
        finally:
            self.lock._give()

    def cancel(self, key):
        """Remove the list of ``key``; return its ops. O(ops)."""
        return self._cancel(key)

    cdef Py_ssize_t _purge(self) except -1:
        """Remove the ops no longer pending from every list; return how many. O(entries)."""
        cdef Py_ssize_t pos = 0, before, n, kept
        cdef PyObject *k
        cdef PyObject *v
        cdef list changed = None
        self.lock._take()
        try:
            before = self.count
            # Compact each list in place (the dict does not change); keys left with
            # one op or none are changed after the walk.
            while PyDict_Next(self.watchers, &pos, &k, &v):
                ops = <object>v
                n = PyList_GET_SIZE(ops) if type(ops) is list else 1
                kept = self._keep_pending(ops)
                if kept == n:
                    continue
                if kept > 1:
                    self.count -= n - kept
                    continue
                if changed is None:
                    changed = []
                changed.append((<object>k, ops, n, kept))
            if changed is not None:
                for key, ops, n, kept in changed:
                    self._store_kept(key, ops, n, kept)
            return before - self.count
        finally:
            self.lock._give()

    def purge(self):
        """Remove the ops no longer pending from every list; return how many. O(entries)."""
        return self._purge()

    def watched_keys(self):
        """The keys with a list. O(keys)."""
        self.lock._take()
        try:
            return list(self.watchers)
        finally:
            self.lock._give()


cdef int _check_keys(object keys) except -1:
    """TypeError for a str or bytes (a key, not keys); ValueError for no keys."""
    if (type(keys) is tuple or type(keys) is list) and len(keys):
        return 0
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"keys must be a sequence of keys, not {type(keys).__name__} {keys!r}; "
            "wrap a single key in a list"
        )
    if not keys:
        raise ValueError("keys must not be empty: an op needs at least one watch key")
    return 0


cdef class _PurgatoryCore:
    """DelayedOperationPurgatory's hot half (see ``tickwheel._purgatory``)."""

    cdef readonly object timer
    cdef SystemTimerCore _fast_timer  # the timer while its add is SystemTimerCore's, else None
    cdef object _timer_add
    cdef object _timer_advance
    cdef public long long purge_interval
    cdef public bint timer_enabled
    cdef readonly list _shards
    cdef public long long _estimated_total
    cdef public long long _num_finished
    cdef public long long _num_expired
    cdef public long long _num_cancelled
    cdef public long long _num_purged
    cdef public bint _shutdown

    def __init__(self, timer, long long purge_interval, bint timer_enabled):
        self.timer = timer
        # The add and the advance are bound once, as in the pure twin; the add is
        # made in C while it is SystemTimerCore's own (not one a subclass or the
        # instance overrides).
        self._fast_timer = (
            timer
            if isinstance(timer, SystemTimerCore)
            and _is_base(timer, "add", _BASE_TIMER_ADD)
            and "add" not in getattr(timer, "__dict__", ())
            else None
        )
        self._timer_add = timer.add
        self._timer_advance = timer.advance_clock
        self.purge_interval = purge_interval
        self.timer_enabled = timer_enabled
        self._shards = [_WatcherList() for _ in range(_SHARD_MASK + 1)]
        self._estimated_total = 0
        self._num_finished = 0
        self._num_expired = 0
        self._num_cancelled = 0
        self._num_purged = 0
        self._shutdown = False

    def __class_getitem__(cls, item):
        """``_PurgatoryCore[T]``, as for the pure twin (a Generic)."""
        return _GenericAlias(cls, item)

    # -- watching and completing ---------------------------------------------------

    def try_complete_else_watch(self, _DelayedOperationCore op, keys):
        """Complete ``op`` now if it can; else watch it on every key and add it to the timer.

        See ``tickwheel.DelayedOperationPurgatory.try_complete_else_watch``.
        """
        _check_keys(keys)
        if self._shutdown:
            raise RuntimeError(f"purgatory {self.name!r} is shut down")
        if op._state:
            return False
        op._purgatory = self
        if _calls_base(op, "safe_try_complete_or_else", _BASE_SAFE_TRY_COMPLETE_OR_ELSE):
            if op._try_complete_or_watch(self, keys):
                return True
        elif op.safe_try_complete_or_else(lambda: self._watch_c(op, keys)):
            return True
        if not op._state:
            if self.timer_enabled:
                if self._fast_timer is not None:
                    self._fast_timer._add_c(op)
                else:
                    self._timer_add(op)
            if op._state:
                op._cancel()
        return False

    cdef int _watch_c(self, _DelayedOperationCore op, object keys) except -1:
        """Add ``op`` to the watcher list of each key, stopping once it has completed."""
        cdef bint watched = False
        for key in keys:
            if op._state:
                break
            self._shard(key)._watch(key, op)
            watched = True
        if watched:
            self._estimated_total += 1
        return 0

    def _watch(self, _DelayedOperationCore op, keys):
        """Add ``op`` to the watcher list of each key, stopping once it has completed."""
        self._watch_c(op, keys)

    cdef _WatcherList _shard(self, object key):
        """The shard of ``key``. TypeError if the key is not hashable."""
        cdef Py_hash_t h
        try:
            h = PyObject_Hash(key)
        except TypeError:
            raise TypeError(f"watch key {key!r} is not hashable") from None
        return <_WatcherList>self._shards[h & _SHARD_MASK]

    def check_and_complete(self, key):
        """Try to complete every op watched on ``key``; return how many this call completed.

        See ``tickwheel.DelayedOperationPurgatory.check_and_complete``.
        """
        cdef _WatcherList shard = self._shard(key)
        cdef Py_ssize_t completed = 0, i, n
        cdef bint dirty = False
        cdef list snapshot
        cdef _DelayedOperationCore op
        ops = shard._ops_of(key)
        if ops is None:
            return 0
        if type(ops) is list:
            snapshot = <list>ops
            n = PyList_GET_SIZE(snapshot)
            for i in range(n):
                op = <_DelayedOperationCore>snapshot[i]
                if op._state:
                    dirty = True
                elif op.safe_try_complete():
                    completed += 1
        else:
            op = <_DelayedOperationCore>ops
            if op._state:
                dirty = True
            elif op.safe_try_complete():
                completed += 1
        if dirty or completed:
            shard._drop_done(key)
        return completed

    def cancel_for_key(self, key):
        """Stop watching ``key``: cancel its pending ops (not completed) and return them.

        See ``tickwheel.DelayedOperationPurgatory.cancel_for_key``.
        """
        cdef list cancelled = [
            op
            for op in self._shard(key)._cancel(key)
            if (<_DelayedOperationCore>op)._mark_cancelled_c()
        ]
        if cancelled:
            _STATE_LOCK_C._take()
            self._num_cancelled += PyList_GET_SIZE(cancelled)
            _STATE_LOCK_C._give()
        return cancelled

    # -- expiry and purging ----------------------------------------------------------

    def advance_clock(self, timeout_ms=0):
        """One reaper step: ``timer.advance_clock(timeout_ms)``, then purge if due."""
        fired = self._timer_advance(timeout_ms)
        if self._estimated_total - self.timer.size > self.purge_interval:
            self.purge_completed()
        return fired

    def purge_completed(self):
        """Remove every op that is no longer pending from all watcher lists; return how many."""
        cdef Py_ssize_t purged = 0
        cdef _WatcherList shard
        self._estimated_total = self.timer.size
        for shard in self._shards:
            if shard.count:
                purged += shard._purge()
        if purged:
            _STATE_LOCK_C._take()
            self._num_purged += purged
            _STATE_LOCK_C._give()
        return purged

    # -- metrics ----------------------------------------------------------------

    @property
    def watched(self):
        """Entries across all watcher lists, completed ones included until removed. O(shards)."""
        cdef Py_ssize_t total = 0
        cdef _WatcherList shard
        for shard in self._shards:
            total += shard.count
        return total

    @property
    def num_delayed(self):
        """Ops pending in the timer (the timer's size). O(1)."""
        return self.timer.size

    @property
    def num_completed(self):
        """Ops of this purgatory completed by their condition (not expired). O(1)."""
        return self._num_finished - self._num_expired

    @property
    def num_expired(self):
        """Ops of this purgatory that timed out. O(1)."""
        return self._num_expired

    @property
    def num_cancelled(self):
        """Ops cancelled by :meth:`cancel_for_key`. O(1)."""
        return self._num_cancelled

    @property
    def num_purged(self):
        """Watcher entries removed by purges so far. O(1)."""
        return self._num_purged


# -- the drop-in event loop's call_later and call_at (tickwheel.aio._loop) ------------------


import sys as _sys

# The caller's frame: functions compiled here have none, so it is the top one.
cdef object _getframe = _sys._getframe


cdef inline bint _loop_debug(object loop) except -1:
    """The loop's debug flag: asyncio's ``_debug`` attribute, or a property (uvloop's variant)."""
    return bool(loop._debug)


def loop_call_later(self, delay, callback, *args, context=None):
    """Run ``callback(*args)`` ``delay`` seconds from now, on the wheel. O(1).

    The compiled ``call_later`` of tickwheel's event loops (see
    ``tickwheel.aio._loop._WheelTimers.call_later``).
    """
    if delay is None:
        raise TypeError("delay must not be None")
    cdef AsyncTimerCore timer = self._wheel_timer
    if type(delay) is float:
        when = timer._now_s() + <double>delay
    else:
        when = timer._time() + delay
    if type(when) is not float or _loop_debug(self) or timer._closed or not callable(callback):
        return self._call_at_checked(when, callback, args, context, _getframe())
    if context is None:
        context = PyContext_CopyCurrent()
    return timer._add_c(_new_handle(when, callback, args, context))


def loop_call_at(self, when, callback, *args, context=None):
    """Run ``callback(*args)`` once ``loop.time()`` reaches ``when``, on the wheel. O(1).

    The compiled ``call_at`` of tickwheel's event loops (see
    ``tickwheel.aio._loop._WheelTimers.call_at``).
    """
    cdef AsyncTimerCore timer = self._wheel_timer
    if type(when) is not float or _loop_debug(self) or timer._closed or not callable(callback):
        return self._call_at_checked(when, callback, args, context, _getframe())
    if context is None:
        context = PyContext_CopyCurrent()
    return timer._add_c(_new_handle(when, callback, args, context))
