# The compiled twin of ``tickwheel.aio._timer``'s hot half (``_AsyncTimerCore`` there):
# ``AsyncTimerCore``, scheduling on the wheel, the one loop timer, running the due handles.

cdef class AsyncTimerCore(TimerCore):
    """AsyncTimer's hot half (see ``tickwheel.aio._timer``): scheduling, the loop timer, running."""

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
    cdef public double _horizon_s
    cdef public TimerTaskList _parked
    # self._run_due, bound once: the loop timer's callback at every re-arm.
    cdef object _run_due_bound

    cdef inline double _now_s(self) except? -1.0:
        if self._time is _time_monotonic:
            return _monotonic_s()
        return self._time()

    def call_later(self, delay, callback, *args, context=None):
        """Run ``callback(*args)`` ``delay`` seconds from now; return its handle. O(1)."""
        cdef double d = _seconds(delay, True)
        self._check_call(callback)
        return self._add_c(_new_handle(self._now_s() + d, callback, args, context))

    def call_at(self, when, callback, *args, context=None):
        """Run ``callback(*args)`` once the loop's time reaches ``when``; return its handle. O(1)."""
        cdef double w = _seconds(when, False)
        self._check_call(callback)
        return self._add_c(_new_handle(w, callback, args, context))

    def _check_call(self, callback):
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")

    cdef TimerHandle _add_c(self, TimerHandle handle):
        cdef long long m, tick
        cdef double when = handle._when
        if -self._horizon_s < when < self._horizon_s:
            m = _ceil_ms(when)
            tick = self._wheel.tick_ms
            if tick != 1:
                m = -_floordiv(-m, tick) * tick
            handle.expiration_ms = m
            if self._add_entry_c(handle):
                if m < self._armed_ms:
                    self._arm_c(m)
                return handle
        elif when >= self._horizon_s:
            self._parked._add(handle)
            return handle
        self._run_soon_c(handle)
        return handle

    def _add(self, TimerHandle handle):
        """Keep ``handle`` until its deadline; return it. The caller checked that the timer is open."""
        return self._add_c(handle)

    cdef int _run_soon_c(self, TimerHandle handle) except -1:
        self._ready.append(handle)
        if not self._ready_scheduled:
            self._ready_scheduled = True
            self._loop.call_soon(self._on_ready, context=self._context)
        return 0

    def _run_soon(self, TimerHandle handle):
        """Run ``handle``, already due, on the next loop iteration, never synchronously."""
        self._run_soon_c(handle)

    cdef int _arm_c(self, long long expiration_ms) except -1:
        if self._loop_handle is not None:
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
        cdef object debug = None
        self._batch = handles  # so that close() from a callback cancels the rest
        if _in_debug_mode(self._loop):
            debug = _debug_run(self._loop, self._report_callback_error)
        while i < n:
            handle = handles[i]
            i += 1
            if handle._list is CANCELLED_C:
                continue
            try:
                if debug is None:
                    _run_handle(handle)
                else:
                    debug(handle)
            except (SystemExit, KeyboardInterrupt):
                self._run_next_iteration(handles[i:])
                raise
            except BaseException as exc:
                self._report_callback_error(handle, exc)
        self._batch = None
        if debug is not None:
            debug.finish()
        return 0

    def _run_handles(self, list handles):
        """Run each handle not cancelled meanwhile; report what a callback raises."""
        self._run_handles_c(handles)
