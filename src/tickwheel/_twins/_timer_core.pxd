# C declarations of the timer core's twin (_timer_core.pxi); included by _speedups.pxd.

from cpython.pythread cimport PyThread_type_lock


cdef class Lock:
    cdef PyThread_type_lock _handle
    cdef bint _held

    cdef int _take(self) except -1
    cdef void _give(self) noexcept


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
