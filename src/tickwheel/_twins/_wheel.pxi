# The compiled twin of ``tickwheel._wheel``: TimingWheel (the pure module's class doc
# explains the algorithm). The C fields are declared in _wheel.pxd.


# -- the timing wheel ----------------------------------------------------------------


@cython.final
cdef class TimingWheel:
    """One level of Kafka's hierarchical timing wheel (see ``tickwheel._wheel`` for the algorithm)."""


    def __init__(
        self,
        tick_ms,
        wheel_size,
        long long start_ms,
        TaskCounter task_counter,
        BucketDelayQueue queue,
        lock=None,
        int level=0,
    ):
        if type(tick_ms) is not int or tick_ms < 1:
            raise ValueError(f"tick_ms must be an int >= 1, got {tick_ms!r}")
        if type(wheel_size) is not int or wheel_size < 2:
            raise ValueError(f"wheel_size must be an int >= 2, got {wheel_size!r}")
        cdef long long interval
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        # A span beyond int64 saturates: such a level covers every int64 expiration, as
        # the pure level (whose end lies beyond int64) does.
        if tw_mul_overflows(self.tick_ms, self.wheel_size, &interval):
            interval = LLONG_MAX
        self.interval_ms = interval
        self._set_current(_floordiv(start_ms, self.tick_ms) * self.tick_ms)
        self.level = level
        self._counter = task_counter
        self._queue = queue
        self._lock = lock if lock is not None else Lock()
        self.buckets = [
            TimerTaskList(task_counter, self._lock, level, index) for index in range(wheel_size)
        ]
        self.overflow_wheel = None

    cdef void _set_current(self, long long current_ms) noexcept:
        cdef long long end
        self.current_time_ms = current_ms
        if tw_add_overflows(current_ms, self.tick_ms, &end):
            end = LLONG_MAX
        self._tick_end_ms = end
        if tw_add_overflows(current_ms, self.interval_ms, &end):
            end = LLONG_MAX
        self._end_ms = end

    cdef TimingWheel _add_overflow_wheel(self):
        if self.overflow_wheel is None:
            self.overflow_wheel = TimingWheel(
                self.interval_ms,
                self.wheel_size,
                self.current_time_ms,
                self._counter,
                self._queue,
                self._lock,
                self.level + 1,
            )
        return self.overflow_wheel

    cdef bint _add(self, TimerTaskEntry entry) except -1:
        """Kafka's ``add``, with the recursion to the overflow wheels as a loop."""
        cdef long long expiration = entry.expiration_ms
        cdef long long virtual_id
        cdef TimingWheel wheel = self
        cdef TimerTaskList bucket
        if entry._list is CANCELLED_C or expiration < self._tick_end_ms:
            return False
        # A level whose end saturated covers every expiration: no level above it.
        while expiration >= wheel._end_ms and wheel._end_ms != LLONG_MAX:
            if wheel.overflow_wheel is None:
                wheel._add_overflow_wheel()
            wheel = wheel.overflow_wheel
        virtual_id = _floordiv(expiration, wheel.tick_ms)
        bucket = wheel.buckets[virtual_id % wheel.wheel_size]
        bucket._add(entry)
        # A bucket is (re)queued only when it starts a new range.
        if bucket.set_expiration(virtual_id * wheel.tick_ms):
            wheel._queue._offer(bucket)
        return True

    def add(self, TimerTaskEntry entry):
        """Put ``entry`` in its bucket; False when it is cancelled or already due. O(levels)."""
        return self._add(entry)

    cdef void _advance_clock(self, long long time_ms) noexcept:
        cdef TimingWheel wheel = self
        while wheel is not None and time_ms >= wheel._tick_end_ms:
            time_ms = _floordiv(time_ms, wheel.tick_ms) * wheel.tick_ms
            wheel._set_current(time_ms)
            wheel = wheel.overflow_wheel

    def advance_clock(self, long long time_ms):
        """Move this level and those above to ``time_ms``, rounded down to each tick. O(levels)."""
        self._advance_clock(time_ms)

    def levels(self):
        """This wheel and its overflow wheels, finest first. O(levels)."""
        out = []
        wheel = self
        while wheel is not None:
            out.append(wheel)
            wheel = wheel.overflow_wheel
        return out

    def _check(self):
        """Assert every level's invariants; return the number of entries held."""
        from tickwheel._wheel import check_wheel

        return check_wheel(self)
