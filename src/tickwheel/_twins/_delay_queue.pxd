# C declarations of the delay queue's twin (_delay_queue.pxi); included by _speedups.pxd.

cdef class BucketDelayQueue:
    cdef readonly list _heap
    cdef long long _seq

    cdef bint _offer(self, TimerTaskList bucket) except -1
    cdef long long _head(self) noexcept
    cdef tuple _pop(self)
    cdef TimerTaskList _poll(self, long long now_ms)
