# The compiled twin of ``tickwheel.aio._handle``: the seconds checks and roundings of a
# deadline, ``TimerHandle`` (and debug mode's ``DebugTimerHandle``), making and running one.

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
