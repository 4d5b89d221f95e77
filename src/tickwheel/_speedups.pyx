# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled core: twins of the pure-Python hot classes, same names, same behaviour.

Each pure module is the reference and explains its algorithm; its twin, in
``_twins/`` under the same name, does the same steps with typed C fields and C
calls between them. This file is the extension's entry (as uvloop's loop.pyx
includes handles/*.pyx): the C helpers the twins share, then one ``include``
per twin, so that all of them are one C module and call one another in C.

=================================  =====================================================
twin (``_twins/``)                 classes and functions
=================================  =====================================================
``_task_list.pxi``                 ``TaskCounter``, ``TimerTaskEntry``, ``TimerTaskList``,
                                   ``CANCELLED``
``_task.pxi``                      ``TimerTask``
``_delay_queue.pxi``               ``BucketDelayQueue``
``_wheel.pxi``                     ``TimingWheel``
``_timer_core.pxi``                ``Lock`` (the timers' lock), ``TimerCore``
``_timer.pxi``                     SystemTimer's hot half: ``SystemTimerCore``, ``run_task``
``_purgatory.pxi``                 the purgatory's hot halves: ``_DelayedOperationCore``,
                                   ``_WatcherList``, ``_PurgatoryCore``
``aio/_handle.pxi``                the deadline's checks and roundings, ``TimerHandle``,
                                   ``DebugTimerHandle``
``aio/_timer.pxi``                 AsyncTimer's hot half: ``AsyncTimerCore``
``aio/_debug.pxi``                 debug mode as the compiled timer reads it
``aio/_loop.pxi``                  the drop-in loop's ``RealTimerArm``, ``loop_call_later``,
                                   ``loop_call_at``
=================================  =====================================================

``_speedups.pxd`` includes each twin's ``.pxd``: the C fields and methods of the
classes that other compiled modules ``cimport`` (``tickwheel.pipeline._loop``,
the benchmarks' floors). ``_accel`` decides which path runs, and one test suite
runs on both. The inspection code (``_check``, snapshots) is not repeated here:
it calls the pure modules' functions on these objects.

Thread safety is the pure path's: every list of a timer shares the timer's
lock, and whoever changes a list holds it. The timers' lock is
:class:`Lock`, a ``threading.Lock`` twin that C code takes without a Python
call and that ``threading.Condition`` waits on like any lock. A list given
another lock object calls its ``acquire``/``release``.
"""

cimport cython


cdef extern from "pythread.h":
    # Not in Cython's cpython/pythread.pxd; part of CPython's C API since 3.2.
    int PyThread_acquire_lock_timed(void *lock, long long microseconds, int intr_flag) nogil

from cpython.list cimport PyList_GET_SIZE
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PY_LOCK_ACQUIRED,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from libc.limits cimport LLONG_MAX
from libc.math cimport ceil, floor
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import functools
import heapq
import logging
import operator

logger = logging.getLogger("tickwheel")

cdef object _heappush = heapq.heappush
cdef object _when_of = operator.attrgetter("_when")

cdef long long NEVER_C = 9223372036854775807  # (1 << 63) - 1, NEVER in _timer_core
cdef long long MAX_DELAY_MS_C = 4611686018427387904  # 1 << 62, MAX_DELAY_MS in _task


# Checked int64 arithmetic (GCC and Clang builtins): the wheels' spans saturate, and a
# time plus a delay that leaves int64 raises, where the pure path's ints would grow.
cdef extern from *:
    """
    static inline int tw_add_overflows(long long a, long long b, long long *out) {
        return __builtin_add_overflow(a, b, out);
    }
    static inline int tw_mul_overflows(long long a, long long b, long long *out) {
        return __builtin_mul_overflow(a, b, out);
    }
    """
    bint tw_add_overflows(long long a, long long b, long long *out) noexcept nogil
    bint tw_mul_overflows(long long a, long long b, long long *out) noexcept nogil


cdef inline long long _floordiv(long long a, long long b) noexcept:
    """Python's a // b for b > 0."""
    cdef long long q = cython.cdiv(a, b)
    if cython.cmod(a, b) != 0 and a < 0:
        q -= 1
    return q


cdef inline long long _monotonic_ms() noexcept nogil:
    """``time.monotonic_ns() // 1_000_000`` (CPython reads the same clock)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return (<long long>ts.tv_sec) * 1000 + ts.tv_nsec // 1000000


cdef inline double _monotonic_s() noexcept nogil:
    """``time.monotonic()``: the same nanoseconds, divided as CPython divides them."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>((<long long>ts.tv_sec) * 1000000000 + ts.tv_nsec) / 1e9


# -- the twins, each after those it builds on ---------------------------------------------
# Cython reads every declaration of the module before any code, so a twin may also call
# one included after it (TimerTask.cancel takes the Lock of _timer_core.pxi). RealTimerArm
# is declared here: AsyncTimerCore (aio/_timer.pxi) arms it in C, and it is defined with
# the loop it serves (aio/_loop.pxi).

cdef class RealTimerArm

include "_twins/_task_list.pxi"
include "_twins/_task.pxi"
include "_twins/_delay_queue.pxi"
include "_twins/_wheel.pxi"
include "_twins/_timer_core.pxi"
include "_twins/_timer.pxi"
include "_twins/_purgatory.pxi"
include "_twins/aio/_handle.pxi"
include "_twins/aio/_timer.pxi"
include "_twins/aio/_debug.pxi"
include "_twins/aio/_loop.pxi"
