# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled floors: not timers, the least C work of one, for the benchmarks only.

``FloorTimer`` (bench_timer.py's ``floor-c``), ``AsyncFloorTimer`` (bench_aio.py's
``floor-c``) and ``DropInFloor`` with ``floor_loop_call_later``/``floor_loop_call_at``
(``bench_aio.py --drop-in``) do the least a compiled timer of their kind must do,
with tickwheel's own C lock and millisecond rounding (cimported from
``tickwheel._speedups``), so that they bound what the compiled core can reach. Their
pure twins are in the benchmark scripts.

Built by ``make bench`` (``benchmarks/setup_floors.py``) against the installed
compiled core; not part of the tickwheel package.
"""

cimport cython
from cpython.list cimport PyList_GET_SIZE
from tickwheel._speedups cimport Lock, _ceil_ms

import heapq

cdef object _heappush = heapq.heappush


cdef extern from "Python.h":
    int PyContext_Enter(object) except -1
    int PyContext_Exit(object) except -1
    object PyContext_CopyCurrent()  # contextvars.copy_context(), in C


@cython.final
cdef class _FloorEntry:
    """An entry of :class:`FloorTimer`: a timer task's fields, and the cheapest locked cancel."""

    cdef object _call
    cdef long long _delay_ms
    cdef long long expiration_ms
    cdef _FloorEntry _next
    cdef _FloorEntry _prev
    cdef FloorTimer _timer

    def cancel(self):
        """Take the lock and unlink: no checks, no count, no cancelled mark."""
        cdef Lock lock = self._timer._lock
        lock._take()
        self._next._prev = self._prev
        self._prev._next = self._next
        self._next = None
        self._prev = None
        self._timer = None
        lock._give()
        return True


@cython.final
cdef class FloorTimer:
    """Not a timer: the least C work of a thread-safe intrusive one, for the benchmarks' floor.

    ``schedule`` allocates an entry, takes the lock and links the entry at the
    tail of one list (no wheel, no bucket choice); ``cancel`` takes the lock
    and unlinks it. A compiled timer with O(1) cancel that frees the entry at
    once cannot do less.
    """

    cdef Lock _lock
    cdef _FloorEntry _root
    cdef readonly long long now_ms

    def __init__(self):
        self._lock = Lock()
        self._root = _FloorEntry.__new__(_FloorEntry)
        self._root._next = self._root
        self._root._prev = self._root

    def schedule(self, long long delay_ms, fn, *args):
        """Allocate, lock, link at the tail; return the entry."""
        cdef _FloorEntry entry = _FloorEntry.__new__(_FloorEntry)
        entry._delay_ms = delay_ms
        entry._call = fn
        self._lock._take()
        entry.expiration_ms = delay_ms + self.now_ms
        entry._next = self._root
        entry._prev = self._root._prev
        entry._timer = self
        self._root._prev._next = entry
        self._root._prev = entry
        self._lock._give()
        return entry


@cython.final
cdef class _AsyncFloorHandle:
    """A handle of :class:`AsyncFloorTimer`: a wheel handle's fields, and an unlinking cancel."""

    cdef double _when
    cdef object _callback
    cdef object _args
    cdef long long expiration_ms
    cdef _AsyncFloorHandle _next
    cdef _AsyncFloorHandle _prev

    def cancel(self):
        """Unlink: no checks, no count, no cancelled mark."""
        self._next._prev = self._prev
        self._prev._next = self._next
        self._next = None
        self._prev = None


@cython.final
cdef class AsyncFloorTimer:
    """Not a timer: the least C work of a loop-thread one with an eager cancel (for benchmarks/).

    ``call_later`` allocates a handle, reads the loop's time, rounds the deadline
    up to the millisecond and links the handle at the tail of one list (no
    wheel, no bucket choice, no loop timer); ``cancel`` unlinks it.
    """

    cdef object _time
    cdef _AsyncFloorHandle _root

    def __init__(self, loop):
        self._time = loop.time
        self._root = _AsyncFloorHandle.__new__(_AsyncFloorHandle)
        self._root._next = self._root
        self._root._prev = self._root

    def call_later(self, double delay, callback, *args):
        """Allocate, round the deadline up to the ms, link at the tail; return the handle."""
        cdef _AsyncFloorHandle handle = _AsyncFloorHandle.__new__(_AsyncFloorHandle)
        cdef double when = <double>self._time() + delay
        handle._when = when
        handle._callback = callback
        handle._args = args
        handle.expiration_ms = _ceil_ms(when)
        handle._next = self._root
        handle._prev = self._root._prev
        self._root._prev._next = handle
        self._root._prev = handle
        return handle

    def pending_whens(self):
        """The deadlines still linked, in list order."""
        cdef list whens = []
        cdef _AsyncFloorHandle node = self._root._next
        while node is not self._root:
            whens.append(node._when)
            node = node._next
        return whens


@cython.final
cdef class _DropInFloorHandle:
    """A handle of :class:`DropInFloor`: a drop-in handle's fields, and an unlinking cancel."""

    cdef readonly double _when
    cdef object _callback
    cdef object _args
    cdef object _context
    cdef readonly long long expiration_ms
    cdef _DropInFloorHandle _next
    cdef _DropInFloorHandle _prev

    def cancel(self):
        """Unlink, if linked: no count, no cancelled mark, nothing released."""
        if self._next is not None:
            self._next._prev = self._prev
            self._prev._next = self._next
            self._next = None
            self._prev = None


@cython.final
cdef class DropInFloor:
    """Not a timer: the least C work of a drop-in loop's timers (for benchmarks/).

    ``loop.call_later``/``loop.call_at`` (:func:`floor_loop_call_later`,
    :func:`floor_loop_call_at`) allocate a handle, copy the caller's context
    (asyncio's semantics), round the deadline up to the millisecond and link the
    handle at the tail of one list; ``cancel`` unlinks it. Firing is the least a
    loop-driven timer does per due millisecond: given the pending handles
    already sorted (the benchmark sorts them, untimed), one real timer of the
    loop, pushed back on asyncio's heap for the next deadline, and each
    callback run in its context.
    """

    cdef _DropInFloorHandle _root
    cdef list _chain
    cdef Py_ssize_t _pos
    cdef object _loop
    cdef object _spare

    def __init__(self, loop):
        self._loop = loop
        self._root = _DropInFloorHandle.__new__(_DropInFloorHandle)
        self._root._next = self._root
        self._root._prev = self._root
        self._chain = []
        self._pos = 0

    cdef _DropInFloorHandle _add(self, double when, object callback, tuple args, object context):
        cdef _DropInFloorHandle handle = _DropInFloorHandle.__new__(_DropInFloorHandle)
        handle._when = when
        handle._callback = callback
        handle._args = args
        handle._context = PyContext_CopyCurrent() if context is None else context
        handle.expiration_ms = _ceil_ms(when)
        handle._next = self._root
        handle._prev = self._root._prev
        self._root._prev._next = handle
        self._root._prev = handle
        return handle

    def take_pending(self):
        """Unlink every pending handle and return them, in list order."""
        cdef list pending = []
        cdef _DropInFloorHandle node = self._root._next
        cdef _DropInFloorHandle nxt
        while node is not self._root:
            nxt = node._next
            node._next = None
            node._prev = None
            pending.append(node)
            node = nxt
        self._root._next = self._root
        self._root._prev = self._root
        return pending

    @property
    def firing(self):
        """True while sorted handles remain to fire."""
        return self._pos < PyList_GET_SIZE(self._chain)

    def fire_in_order(self, list handles, base_call_at):
        """Fire ``handles`` (sorted by deadline) one due millisecond per loop wake-up."""
        self._chain = handles
        self._pos = 0
        if handles:
            self._spare = base_call_at(
                self._loop, (<_DropInFloorHandle>handles[0]).expiration_ms / 1000, self._fire
            )

    def _fire(self):
        cdef list chain = self._chain
        cdef Py_ssize_t n = PyList_GET_SIZE(chain)
        cdef _DropInFloorHandle handle = chain[self._pos]
        cdef long long ms = handle.expiration_ms
        while True:
            chain[self._pos] = None  # fired: the floor holds it no more, as a wheel does not
            self._pos += 1
            PyContext_Enter(handle._context)
            try:
                handle._callback(*handle._args)
            finally:
                PyContext_Exit(handle._context)
            if self._pos == n:
                return
            handle = chain[self._pos]
            if handle.expiration_ms != ms:
                break
        # The real timer that just fired is off the heap: push it back for the next.
        spare = self._spare
        spare._when = handle.expiration_ms / 1000
        _heappush(self._loop._scheduled, spare)
        spare._scheduled = True


def floor_loop_call_later(self, delay, callback, *args, context=None):
    """The drop-in floor's ``loop.call_later`` (see :class:`DropInFloor`)."""
    cdef DropInFloor floor = self._drop_in_floor
    return floor._add(<double>self.time() + <double>delay, callback, args, context)


def floor_loop_call_at(self, when, callback, *args, context=None):
    """The drop-in floor's ``loop.call_at`` (see :class:`DropInFloor`)."""
    cdef DropInFloor floor = self._drop_in_floor
    return floor._add(when, callback, args, context)
