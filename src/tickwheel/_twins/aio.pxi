# The compiled twin of AsyncTimer's hot half in ``tickwheel.aio``: the seconds checks and
# roundings, TimerHandle and AsyncTimerCore (``_AsyncTimerCore`` there).
#
# The text below is the monolithic _speedups.pyx's, moved without a change.


# -- AsyncTimer's hot half ------------------------------------------------------------------


cdef double _MAX_SECONDS = <double>MAX_DELAY_MS_C / 1000


cdef inline long long _ceil_ms(double when) noexcept:
    """The smallest integer m with m / 1000 >= when (as ``aio._ceil_ms``)."""
    cdef long long m = <long long>ceil(when * 1000.0)
    if <double>m / 1000.0 < when:
        m += 1
    elif <double>(m - 1) / 1000.0 >= when:
        m -= 1
    return m


cdef inline long long _floor_ms(double now) noexcept:
    """The largest integer m with m / 1000 <= now (as ``aio._floor_ms``)."""
    cdef long long m = <long long>floor(now * 1000.0)
    if <double>m / 1000.0 > now:
        m -= 1
    elif <double>(m + 1) / 1000.0 <= now:
        m += 1
    return m


cdef object _check_delay_s = None
cdef object _check_when_s = None


cdef double _seconds(object value, bint is_delay) except? -1.0:
    """A delay (>= 0) or a loop time as a checked double, as ``aio._check_delay``/``_check_when``."""
    global _check_delay_s, _check_when_s
    cdef double v
    if type(value) is float:
        v = value
        if is_delay:
            if 0.0 <= v < _MAX_SECONDS:
                return v
        elif -_MAX_SECONDS < v < _MAX_SECONDS:
            return v
    if _check_delay_s is None:
        from tickwheel.aio import _check_delay, _check_when

        _check_delay_s = _check_delay
        _check_when_s = _check_when
    return (_check_delay_s if is_delay else _check_when_s)(value)


cdef extern from "Python.h":
    int PyContext_Enter(object) except -1
    int PyContext_Exit(object) except -1
    object PyContext_CopyCurrent()  # contextvars.copy_context(), in C


cdef class TimerHandle(TimerTaskEntry):
    """A callback scheduled on an AsyncTimer, like :class:`asyncio.TimerHandle` (see ``aio``)."""

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
        from tickwheel.aio import handle_repr

        return handle_repr(self)


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


cdef class AsyncTimerCore(TimerCore):
    """AsyncTimer's hot half (see ``tickwheel.aio``): scheduling, the loop timer, running."""

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
    # self._run_due, bound once: the loop timer's callback at every re-arm.
    cdef object _run_due_bound

    cdef inline double _now_s(self) except? -1.0:
        if self._time is _time_monotonic:
            return _monotonic_s()
        return self._time()

    def call_later(self, delay, callback, *args, context=None):
        """Run ``callback(*args)`` ``delay`` seconds from now; return its handle. O(1)."""
        cdef double d = _seconds(delay, True)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        return self._schedule_c(self._now_s() + d, callback, args, context)

    def call_at(self, when, callback, *args, context=None):
        """Run ``callback(*args)`` once the loop's time reaches ``when``; return its handle. O(1)."""
        cdef double w = _seconds(when, False)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        return self._schedule_c(w, callback, args, context)

    cdef TimerHandle _schedule_c(self, double when, object callback, tuple args, object context):
        cdef TimerHandle handle
        cdef long long m, tick
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")
        handle = TimerHandle.__new__(TimerHandle)
        handle._when = when
        handle._callback = callback
        handle._args = args
        handle._context = context
        m = _ceil_ms(when)
        tick = self._wheel.tick_ms
        if tick != 1:
            m = -_floordiv(-m, tick) * tick
        handle.expiration_ms = m
        if not self._add_entry_c(handle):
            self._ready.append(handle)
            if not self._ready_scheduled:
                self._ready_scheduled = True
                self._loop.call_soon(self._on_ready, context=self._context)
        elif m < self._armed_ms:
            self._arm_c(m)
        return handle

    def _schedule(self, double when, callback, tuple args, context=None):
        """``call_at`` without the argument checks: ``when`` is a finite float."""
        return self._schedule_c(when, callback, args, context)

    cdef int _arm_c(self, long long expiration_ms) except -1:
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
        self._batch = handles  # so that close() from a callback cancels the rest
        while i < n:
            handle = handles[i]
            i += 1
            if handle._list is CANCELLED_C:
                continue
            try:
                _run_handle(handle)
            except (SystemExit, KeyboardInterrupt):
                self._run_next_iteration(handles[i:])
                raise
            except BaseException as exc:
                self._report_callback_error(handle, exc)
        self._batch = None
        return 0

    def _run_handles(self, list handles):
        """Run each handle not cancelled meanwhile; report what a callback raises."""
        self._run_handles_c(handles)


import time as _time_module

cdef object _time_monotonic = _time_module.monotonic
