# C declarations of the wheel's twin (_wheel.pxi); included by _speedups.pxd.

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
