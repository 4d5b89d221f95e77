# The compiled twin of the drop-in event loop's timer calls in ``tickwheel._aio_loop``:
# RealTimerArm (``EventLoop._arm_real_timer``) and loop_call_later/loop_call_at
# (``_WheelTimers.call_later``/``call_at``). RealTimerArm is declared ahead in
# _speedups.pyx, since AsyncTimerCore (aio.pxi) arms it in C.
#
# The text below is the monolithic _speedups.pyx's, moved without a change.


@cython.final
cdef class RealTimerArm:
    """The compiled ``EventLoop._arm_real_timer``: arms the wheel's one real timer of an asyncio loop.

    ``arm(when, callback, context=ctx)`` does what the pure method does (see
    ``tickwheel._aio_loop``): the asyncio handle it armed last, once fired
    (neither cancelled nor queued), is pushed back on the loop's heap for the
    new deadline, else ``base_call_at`` (asyncio's own ``call_at``) makes a
    new one. It keeps that handle and what it was armed with in C fields, and
    the compiled timer calls it in C: a re-arm reads only the handle's flags
    and the loop's heap, debug and closed state. O(log of the loop's heap).
    """

    cdef object _loop
    cdef object _base_call_at
    cdef object _handle
    cdef object _callback
    cdef object _context

    def __init__(self, loop, base_call_at):
        self._loop = loop
        self._base_call_at = base_call_at

    def __call__(self, double when, callback, *, context):
        return self._arm(when, callback, context)

    cdef object _arm(self, double when, object callback, object context):
        loop = self._loop
        handle = self._handle
        if (
            handle is not None
            and callback is self._callback
            and context is self._context
            and not handle._scheduled
            and not handle._cancelled
            and not loop._debug
        ):
            if loop._closed:
                raise RuntimeError("Event loop is closed")  # asyncio's _check_closed
            handle._when = when
            _heappush(loop._scheduled, handle)
            handle._scheduled = True
            return handle
        handle = self._base_call_at(when, callback, context=context)
        self._handle = handle
        self._callback = callback
        self._context = context
        return handle


# -- the drop-in event loop's call_later and call_at (tickwheel._aio_loop) ------------------


cdef object _loop_schedule(object loop, object when, object callback, tuple args, object context):
    """``_WheelTimers.call_at`` after its ``when`` is known (see tickwheel._aio_loop)."""
    cdef AsyncTimerCore timer = loop._wheel_timer
    cdef double w = _seconds(when, False)
    if timer._closed:
        raise RuntimeError("Event loop is closed")
    debug = getattr(loop, "_debug", None)
    if debug is None:
        debug = loop.get_debug()  # a loop whose debug flag is not a Python attribute (uvloop)
    if debug:
        loop._debug_checks(callback)
    elif not callable(callback):
        raise TypeError(f"a callable object was expected by call_at(), got {callback!r}")
    if context is None:
        context = PyContext_CopyCurrent()
    return timer._schedule_c(w, callback, args, context)


def loop_call_later(self, delay, callback, *args, context=None):
    """Run ``callback(*args)`` ``delay`` seconds from now, on the wheel. O(1).

    The compiled ``call_later`` of tickwheel's event loops (see
    ``tickwheel._aio_loop._WheelTimers.call_later``).
    """
    if delay is None:
        raise TypeError("delay must not be None")
    cdef AsyncTimerCore timer = self._wheel_timer
    if type(delay) is float:
        return _loop_schedule(self, timer._now_s() + <double>delay, callback, args, context)
    return _loop_schedule(self, self.time() + delay, callback, args, context)


def loop_call_at(self, when, callback, *args, context=None):
    """Run ``callback(*args)`` once ``loop.time()`` reaches ``when``, on the wheel. O(1).

    The compiled ``call_at`` of tickwheel's event loops (see
    ``tickwheel._aio_loop._WheelTimers.call_at``).
    """
    if when is None:
        raise TypeError("when cannot be None")
    return _loop_schedule(self, when, callback, args, context)
