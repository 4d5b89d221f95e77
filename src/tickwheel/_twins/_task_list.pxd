# C declarations of the task list's twin (_task_list.pxi); included by _speedups.pxd.

cdef class TaskCounter:
    cdef public long long value


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
