# The compiled twin of SystemTimer's hot half in ``tickwheel._timer``: run_task and
# SystemTimerCore (``_SystemTimerCore`` there).


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
        cdef long long now, expiration
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
            now = self._now_c()
            if tw_add_overflows(task._delay_ms, now, &expiration):
                raise OverflowError(
                    f"the clock's time {now} ms plus the delay {task._delay_ms} ms "
                    "is beyond a 64-bit time"
                )
            task.expiration_ms = expiration
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
