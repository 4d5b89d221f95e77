# Declarations of the compiled core's classes that other compiled modules use
# (``cimport tickwheel._speedups``): their C fields and C methods. The
# implementations, and the classes no other module needs, are in _speedups.pyx.

from cpython.pythread cimport PyThread_type_lock


cdef class Lock:
    cdef PyThread_type_lock _handle
    cdef bint _held

    cdef int _take(self) except -1
    cdef void _give(self) noexcept


cdef class TaskCounter:
    cdef public long long value


cdef class TimerTaskList


cdef class TimerTaskEntry:
    cdef public long long expiration_ms
    cdef public TimerTaskList _list
    cdef public TimerTaskEntry _next
    cdef public TimerTaskEntry _prev


cdef class TimerTaskList:
    cdef readonly TimerTaskEntry _root
    cdef long long _expiration_ms
    cdef readonly TaskCounter _counter
    cdef readonly object _lock
    cdef Lock _fast_lock  # _lock when it is a Lock, else None
    cdef public int level
    cdef public int index

    cpdef bint set_expiration(self, long long expiration_ms)
    cdef void _link(self, TimerTaskEntry entry) noexcept
    cdef bint _remove(self, TimerTaskEntry entry) noexcept
    cdef void _add(self, TimerTaskEntry entry) noexcept
    cdef list _flush(self)


cdef class BucketDelayQueue:
    cdef readonly list _heap
    cdef long long _seq

    cdef bint _offer(self, TimerTaskList bucket) except -1
    cdef long long _head(self) noexcept
    cdef tuple _pop(self)
    cdef TimerTaskList _poll(self, long long now_ms)


cdef class TimingWheel:
    cdef readonly long long tick_ms
    cdef readonly long long wheel_size
    cdef readonly long long interval_ms
    cdef readonly long long current_time_ms
    cdef readonly long long _tick_end_ms
    cdef readonly long long _end_ms
    cdef readonly int level
    cdef readonly TaskCounter _counter
    cdef readonly BucketDelayQueue _queue
    cdef readonly object _lock
    cdef readonly list buckets
    cdef readonly TimingWheel overflow_wheel

    cdef void _set_current(self, long long current_ms) noexcept
    cdef TimingWheel _add_overflow_wheel(self)
    cdef bint _add(self, TimerTaskEntry entry) except -1
    cdef void _advance_clock(self, long long time_ms) noexcept


cdef class TimerCore:
    cdef readonly object _lock
    cdef Lock _fast_lock
    cdef readonly TaskCounter _counter
    cdef readonly BucketDelayQueue _queue
    cdef readonly TimingWheel _wheel
    cdef readonly TimerTaskList _staged
    cdef readonly long long _staged_min_ms

    cdef bint _add_entry_c(self, TimerTaskEntry entry) noexcept
    cdef int _place_staged_c(self) except -1
    cdef bint _advance_c(self, long long now_ms, list due) except -1
    cdef long long _next_expiration_c(self) noexcept
