# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled twin of the per-partition loop (``core._PartitionCore``).

The pure reference runs Kafka's purgatory in deterministic mode: a
``SystemTimer`` on the event-time clock, an inline executor, the watcher lists,
and an operation object per ``open`` event whose ``try_complete`` /
``on_complete`` / ``on_expiration`` record the outcomes. Here the same steps
run in C on the compiled ``TimerCore`` (``tickwheel._speedups``): the watchers
of a key are its pending operations in opening order (the operation itself
while it is the only one, as the purgatory stores a lone op), a complete or
cancel event resolves all of them in that order, and the timer's due
operations expire in the order the timer gives. The pending operations are
exactly those watched, so no separate set of them is kept. Lazy removal, locks and the
executor have no observable effect in this single-threaded loop, so they are
left out; every output row, its order, and the carried state are those of
the reference (``tests/test_paths_agree.py`` and the pipeline tests check it
on both paths).
"""

cimport cython
from tickwheel._speedups cimport TimerCore, TimerTaskEntry

cdef long long NO_LIMIT = 9223372036854775807  # no watermark: above any event time

# Outcome and reason names, as in core.py.
cdef str COMPLETED = "completed"
cdef str EXPIRED = "expired"
cdef str CANCELLED = "cancelled"
cdef str AFTER_EXPIRY = "after_expiry"
cdef str NO_OPERATION = "no_operation"

cdef object _Event = None
cdef object _EventTimeClock = None


cdef _load_core_types():
    global _Event, _EventTimeClock
    from tickwheel.pipeline.core import Event, EventTimeClock

    _Event = Event
    _EventTimeClock = EventTimeClock


@cython.final
cdef class _Op(TimerTaskEntry):
    """A pending operation of one (rule, key): the timer entry and what its outcome row needs."""

    cdef readonly int rule
    cdef readonly object key
    cdef readonly object wkey
    cdef readonly object op_id
    # Kept as the int objects of the outcome rows (boxed once, at the open).
    cdef readonly object opened_at
    cdef readonly object deadline


cdef class PartitionCore:
    """PartitionProcessor's hot half, compiled (see ``core._PartitionCore`` and the module doc)."""

    # Set by PartitionProcessor.__init__.
    cdef public tuple _timeouts
    cdef public object _retention_ms  # None (off) or an int of ms
    cdef public bint _single
    cdef public int _wheel_size
    cdef public object _lock
    cdef public object _resolving
    cdef public list _outcomes
    cdef public list _unmatched
    cdef public dict _last_expired
    cdef public list _buffered
    cdef public object _clock
    cdef public object _timer
    cdef public object _purgatory
    cdef public set _live  # the reference's; unused here (the watchers are the pending ops)
    cdef public object max_event_time
    cdef public long long events_applied
    cdef public long long events_buffered
    # The compiled engine: the timer core and the watcher lists.
    cdef TimerCore _core
    cdef dict _watchers

    def _start(self, start_ms):
        """Start the event-time clock and the timer at ``start_ms``."""
        if type(start_ms) is not int:
            raise TypeError(f"start_ms must be an int of milliseconds, got {start_ms!r}")
        if _EventTimeClock is None:
            _load_core_types()
        self._clock = _EventTimeClock(start_ms)
        self._core = TimerCore(1, self._wheel_size, start_ms)
        self._watchers = {}

    cdef inline object _wkey_c(self, int rule, object key):
        return key if self._single else (rule, key)

    def _wkey(self, int rule, key):
        """The watch key of (rule, key): the key alone when there is one rule."""
        return self._wkey_c(rule, key)

    def _open(self, int rule, key, op_id, opened_at, deadline):
        """Open an operation of (rule, key), due at ``deadline``."""
        self._open_c(rule, key, op_id, int(opened_at), int(deadline))

    cdef int _open_c(
        self, int rule, object key, object op_id, object opened_at, object deadline
    ) except -1:
        cdef _Op op = _Op.__new__(_Op)
        op.rule = rule
        op.key = key
        op.wkey = self._wkey_c(rule, key)
        op.op_id = op_id
        op.opened_at = opened_at
        op.deadline = deadline
        op.expiration_ms = deadline
        ops = self._watchers.setdefault(op.wkey, op)  # one lookup for the common lone op
        if ops is not op:
            if type(ops) is list:
                (<list>ops).append(op)
            else:
                self._watchers[op.wkey] = [ops, op]
        if not self._core._add_entry_c(op):
            self._expire(op)  # due already: the reference's inline executor runs it now
        return 0

    cdef int _expire(self, _Op op) except -1:
        ops = self._watchers.get(op.wkey)
        if ops is op:
            del self._watchers[op.wkey]
        elif ops is not None:
            (<list>ops).remove(op)
            if not ops:
                del self._watchers[op.wkey]
        self._outcomes.append(
            (op.rule, op.key, op.op_id, op.opened_at, op.deadline, EXPIRED, op.deadline, None)
        )
        self._last_expired[op.wkey] = (op.rule, op.key, op.deadline)
        return 0

    cdef int _expire_due(self, long long now) except -1:
        cdef list due = []
        self._core._advance_c(now, due)
        for op in due:
            self._expire(<_Op>op)
        return 0

    cdef int _resolve_c(
        self, int rule, object key, object event_id, object event_type, object time, int kind
    ) except -1:
        cdef _Op op
        wkey = self._wkey_c(rule, key)
        ops = self._watchers.pop(wkey, None)
        if ops is None:
            marker = self._last_expired.get(wkey)
            # core.marker_holds, inline: the retention after the key's last expiry
            held = marker is not None and (
                self._retention_ms is None or time < (<tuple>marker)[2] + self._retention_ms
            )
            self._unmatched.append(
                (rule, key, event_id, event_type, time, AFTER_EXPIRY if held else NO_OPERATION)
            )
            return 0
        outcome = COMPLETED if kind == 1 else CANCELLED
        if type(ops) is list:
            for item in <list>ops:
                self._complete(<_Op>item, outcome, time, event_id)
        else:
            self._complete(<_Op>ops, outcome, time, event_id)
        self._last_expired.pop(wkey, None)
        return 0

    cdef inline int _complete(self, _Op op, str outcome, object time, object event_id) except -1:
        op._list._remove(op)  # out of the timer (its bucket or the staging list)
        self._outcomes.append(
            (op.rule, op.key, op.op_id, op.opened_at, op.deadline, outcome, time, event_id)
        )
        return 0

    def process(self, events, watermark_ms=None):
        """Apply ``events`` (sorted by time, sequence, id) up to ``watermark_ms``.

        See :meth:`tickwheel.pipeline.core.PartitionProcessor.process`.
        O(events + resolved operations).
        """
        cdef long long limit, now, time
        cdef long long applied = 0
        cdef int rule, kind
        cdef tuple row
        it = iter(events)
        event = next(it, None)
        if event is None:
            return
        if self._clock is None:
            self._start(event[2])
        limit = NO_LIMIT if watermark_ms is None else watermark_ms
        clock = self._clock
        now = clock._now_ms
        timeouts = self._timeouts
        while event is not None:
            rule, key, time_obj, _seq, event_id, kind, event_type = event
            time = time_obj
            if time > limit:
                rest = [event]
                rest.extend(it)
                self._buffer(rest)
                break
            if time != now:
                if time < now:
                    raise ValueError(
                        f"event {event_id!r} at {time} is older than the clock ({now}): "
                        "events must come in time order and not below a previous watermark"
                    )
                now = time
                clock._now_ms = now
                # Only when a bucket or a staged operation is due can any expire.
                if self._core._next_expiration_c() <= now:
                    self._expire_due(now)
            if kind == 0:
                self._open_c(rule, key, event_id, time_obj, time + <long long>timeouts[rule])
            else:
                self._resolve_c(rule, key, event_id, event_type, time_obj, kind)
            applied += 1
            # Drop the row first: zip() then reuses its tuple for the next one.
            event = None
            event = next(it, None)
        self.events_applied += applied
        if applied:
            self._raise_max_event_time(now)

    def _buffer(self, list events):
        """Keep events above the watermark, not applied, for a later run."""
        if _Event is None:
            _load_core_types()
        rest = [_Event(*event) for event in events]
        self._buffered.extend(rest)
        self.events_buffered += len(rest)
        self._raise_max_event_time(max(event.time for event in rest))

    def _raise_max_event_time(self, time):
        if self.max_event_time is None or time > self.max_event_time:
            self.max_event_time = time

    def advance_to(self, long long time_ms):
        """Move the clock to ``time_ms`` and expire every operation due by then. O(expired)."""
        if self._clock is None:
            self._start(time_ms)
            return
        if time_ms > self._clock._now_ms:
            self._clock.set(time_ms)
            self._expire_due(time_ms)

    def pending_operations(self):
        """``(rule index, key, op_id, opened_at, deadline)`` of each pending op, sorted."""
        rows = []
        for ops in (self._watchers or {}).values():
            for op in (ops if type(ops) is list else (ops,)):
                rows.append(
                    ((<_Op>op).rule, (<_Op>op).key, (<_Op>op).op_id, (<_Op>op).opened_at,
                     (<_Op>op).deadline)
                )
        return sorted(rows)

    @property
    def num_pending(self):
        """Number of pending operations: the timer's size. O(1)."""
        return 0 if self._core is None else self._core._counter.value

    def close(self):
        """Nothing to release (no thread, no executor); pending operations are left as they are."""
