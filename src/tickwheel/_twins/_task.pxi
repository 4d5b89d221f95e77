# The compiled twin of ``tickwheel._task``: TimerTask (its delay checked as
# ``check_delay_ms`` checks it).


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
