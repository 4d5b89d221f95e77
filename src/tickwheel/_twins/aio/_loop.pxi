# The compiled twin of the drop-in event loop's timer calls in ``tickwheel.aio._loop``:
# ``RealTimerArm`` (``EventLoop._arm_real_timer``) and ``loop_call_later``/``loop_call_at``
# (``_WheelTimers.call_later``/``call_at``). RealTimerArm is declared ahead in
# _speedups.pyx, since AsyncTimerCore (aio/_timer.pxi) arms it in C.


@cython.final
cdef class RealTimerArm:
    """The compiled ``EventLoop._arm_real_timer``: arms the wheel's one real timer of an asyncio loop.

    ``arm(when, callback, context=ctx)`` does what the pure method does (see
    ``tickwheel.aio._loop``): the asyncio handle it armed last, once fired
    (neither cancelled nor queued), is pushed back on the loop's heap for the
    new deadline, else ``base_call_at`` (asyncio's own ``call_at``) makes a
    new one. It keeps that handle in a C field, and the compiled timer calls
    it in C: a re-arm reads only the handle's flags and the loop's heap, debug
    and closed state. O(log of the loop's heap).
    """

    cdef object _loop
    cdef object _base_call_at
    cdef object _handle

    def __init__(self, loop, base_call_at):
        self._loop = loop
        self._base_call_at = base_call_at

    def __call__(self, double when, callback, *, context):
        return self._arm(when, callback, context)

    cdef object _arm(self, double when, object callback, object context):
        loop = self._loop
        handle = self._handle
        if handle is not None and not (handle._scheduled or handle._cancelled or loop._debug):
            if loop._closed:
                raise RuntimeError("Event loop is closed")  # asyncio's _check_closed
            handle._when = when
            _heappush(loop._scheduled, handle)
            handle._scheduled = True
            return handle
        handle = self._base_call_at(when, callback, context=context)
        self._handle = handle
        return handle


# -- the drop-in event loop's call_later and call_at (tickwheel.aio._loop) ------------------


import sys as _sys

# The caller's frame: functions compiled here have none, so it is the top one.
cdef object _getframe = _sys._getframe


cdef inline bint _loop_debug(object loop) except -1:
    """The loop's debug flag: asyncio's ``_debug`` attribute, or a property (uvloop's variant)."""
    return bool(loop._debug)


def loop_call_later(self, delay, callback, *args, context=None):
    """Run ``callback(*args)`` ``delay`` seconds from now, on the wheel. O(1).

    The compiled ``call_later`` of tickwheel's event loops (see
    ``tickwheel.aio._loop._WheelTimers.call_later``).
    """
    if delay is None:
        raise TypeError("delay must not be None")
    cdef AsyncTimerCore timer = self._wheel_timer
    if type(delay) is float:
        when = timer._now_s() + <double>delay
    else:
        when = timer._time() + delay
    if type(when) is not float or _loop_debug(self) or timer._closed or not callable(callback):
        return self._call_at_checked(when, callback, args, context, _getframe())
    if context is None:
        context = PyContext_CopyCurrent()
    return timer._add_c(_new_handle(when, callback, args, context))


def loop_call_at(self, when, callback, *args, context=None):
    """Run ``callback(*args)`` once ``loop.time()`` reaches ``when``, on the wheel. O(1).

    The compiled ``call_at`` of tickwheel's event loops (see
    ``tickwheel.aio._loop._WheelTimers.call_at``).
    """
    cdef AsyncTimerCore timer = self._wheel_timer
    if type(when) is not float or _loop_debug(self) or timer._closed or not callable(callback):
        return self._call_at_checked(when, callback, args, context, _getframe())
    if context is None:
        context = PyContext_CopyCurrent()
    return timer._add_c(_new_handle(when, callback, args, context))
