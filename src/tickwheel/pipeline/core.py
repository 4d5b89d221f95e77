"""The event-time processor of one partition: events in, outcomes out.

Pure Python: no Spark, no Arrow. :class:`PartitionProcessor` runs Kafka's
purgatory (:class:`~tickwheel.DelayedOperationPurgatory`) in deterministic mode
on an event-time clock: one :class:`~tickwheel.SystemTimer` with ``tick_ms=1``
on a :class:`~tickwheel.ManualClock`, an inline executor and no reaper thread.

For each event, in (event time, sequence, event id) order:

1. the clock is set to the event's time and ``advance_clock(0)`` expires every
   operation whose deadline is at or before it (so an event stamped exactly at a
   deadline finds the operation already expired; with ``tick_ms=1`` the wheel
   never fires a task before its expiration, so an event one millisecond before
   the deadline still completes it);
2. an ``open`` event opens an operation with ``try_complete_else_watch``;
   a ``complete`` or ``cancel`` event resolves every pending operation of its
   (rule, key) with ``check_and_complete``; one that finds none is *unmatched*:
   ``after_expiry`` while the key's expiry marker holds (:func:`marker_holds`:
   the retention after the key's last operation expired), else ``no_operation``.

The processor's state between runs (pending operations, the keys whose last
resolved operation expired, the buffered events above the watermark) is
exported as plain :class:`StateRow` tuples and a processor can be built from
them, so an incremental job can carry it from one batch to the next.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, NamedTuple

from .._accel import compiled
from .._clock import ManualClock
from .._purgatory import DelayedOperation, DelayedOperationPurgatory
from .._timer import SystemTimer
from .rules import DEFAULT_RETENTION_MS, Rule, Rules

__all__ = [
    "AFTER_EXPIRY",
    "CANCELLED",
    "COMPLETED",
    "EXPIRED",
    "NO_OPERATION",
    "PENDING",
    "Event",
    "EventTimeClock",
    "OutcomeRow",
    "PartitionProcessor",
    "StateRow",
    "UnmatchedRow",
    "cyclic_gc_paused",
    "marker_holds",
]

COMPLETED = "completed"
EXPIRED = "expired"
CANCELLED = "cancelled"
PENDING = "pending"
AFTER_EXPIRY = "after_expiry"
NO_OPERATION = "no_operation"

_NO_LIMIT = 1 << 80  # above any event time: no watermark

STATE_PENDING = "pending"
STATE_EXPIRED = "expired"
STATE_BUFFERED = "buffered"


def marker_holds(expired_at: int, retention_ms: int | None, time: int) -> bool:
    """Whether a key's expiry marker of ``expired_at`` still holds for an event at ``time``.

    It holds while ``time < expired_at + retention_ms`` (always, with retention
    None: off): a complete or cancel then finds it and is ``after_expiry``; from
    ``expired_at + retention_ms`` on it is gone, as an operation is at its
    deadline, and the event is ``no_operation``. The rule is on event time
    alone, so a batch run and any split into micro-batches agree: once the
    clock (a watermark) reaches ``expired_at + retention_ms``, no event still
    to be applied can find the marker, and the processor drops it from its
    exported state. O(1).
    """
    return retention_ms is None or time < expired_at + retention_ms


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block, then restore its state.

    The Spark jobs run :meth:`PartitionProcessor.process` inside it, in a worker
    process of their own. The loop allocates an object per operation and per
    outcome, all freed by reference counting (a run leaves no cyclic garbage:
    ``tests/pipeline/test_pipeline_core.py`` checks it), yet with the collector
    on, each of its passes walks every pending operation and frees nothing: with
    a million operations pending, the passes take a large part of the loop's
    CPU. Reference counting still frees
    memory while it is paused. The collector's state is process-wide, so use
    this only where no other thread relies on it. O(1).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Event(NamedTuple):
    """One deduplicated event of one rule, as the processor takes it.

    ``kind`` is ``KIND_OPEN``, ``KIND_COMPLETE`` or ``KIND_CANCEL`` of the rule at
    index ``rule``; ``event_type`` is the original type, kept for the outputs.
    """

    rule: int
    key: str
    time: int
    seq: int
    event_id: str
    kind: int
    event_type: str


class OutcomeRow(NamedTuple):
    """One operation's outcome: completed, expired, cancelled or pending."""

    rule: str
    key: str
    op_id: str
    opened_at: int
    deadline: int
    outcome: str
    resolved_at: int | None
    latency_ms: int | None
    resolve_event_id: str | None


class UnmatchedRow(NamedTuple):
    """A complete or cancel event that found no pending operation, and why."""

    rule: str
    key: str
    event_id: str
    event_type: str
    event_time: int
    reason: str


class StateRow(NamedTuple):
    """One row of a processor's carried state.

    * ``kind="pending"``: a pending operation (``event_id`` = op id,
      ``time`` = opened_at, ``deadline``);
    * ``kind="expired"``: the key's last resolved operation expired at ``time``
      (needed for the ``after_expiry`` reason);
    * ``kind="buffered"``: an event above the watermark, not applied yet
      (``event_id``, ``time``, ``seq``, ``event_type``).
    """

    kind: str
    rule: str
    key: str
    event_id: str | None
    time: int
    deadline: int | None
    seq: int | None
    event_type: str | None


class EventTimeClock(ManualClock):
    """A :class:`~tickwheel.ManualClock` for event time, moved by one thread only.

    ``set`` skips the wake-ups of :class:`ManualClock` (no thread ever waits on
    this clock: the timer runs without a reaper). Still refuses to go back. O(1).
    """

    __slots__ = ()

    def set(self, ms: int) -> None:
        """Move the clock to ``ms``; raise ValueError if it is earlier than now. O(1)."""
        if ms < self._now_ms:
            raise ValueError(
                f"event-time clock cannot move backwards: now_ms={self._now_ms}, requested {ms}"
            )
        self._now_ms = ms


class _Operation(DelayedOperation):
    """A delayed operation of one (rule, key): completes on the key's next complete/cancel."""

    __slots__ = ("_proc", "deadline", "key", "op_id", "opened_at", "resolution", "rule", "wkey")

    def __init__(
        self,
        proc: _PartitionCore,
        rule: int,
        key: str,
        wkey: object,
        op_id: str,
        opened_at: int,
        deadline: int,
        delay_ms: int,
        lock: threading.RLock,
    ) -> None:
        super().__init__(delay_ms, lock=lock)
        self._proc = proc
        self.rule = rule
        self.key = key
        self.wkey = wkey
        self.op_id = op_id
        self.opened_at = opened_at
        self.deadline = deadline
        self.resolution: tuple[str, int, str] | None = None

    def try_complete(self) -> bool:
        """Complete when the processor is applying a complete or cancel event of this key."""
        resolving = self._proc._resolving
        if resolving is None:
            return False
        self.resolution = resolving
        return self.force_complete()

    def on_complete(self) -> None:
        """Record a completed or cancelled outcome (an expiry is recorded by on_expiration)."""
        res = self.resolution
        if res is not None:
            outcome, at, event_id = res
            self._proc._outcomes.append(
                (
                    self.rule,
                    self.key,
                    self.op_id,
                    self.opened_at,
                    self.deadline,
                    outcome,
                    at,
                    event_id,
                )
            )
            self._proc._last_expired.pop(self.wkey, None)
        self._proc._live.discard(self)

    def on_expiration(self) -> None:
        """Record an expired outcome with ``resolved_at`` = deadline."""
        deadline = self.deadline
        proc = self._proc
        proc._outcomes.append(
            (self.rule, self.key, self.op_id, self.opened_at, deadline, EXPIRED, deadline, None)
        )
        proc._last_expired[self.wkey] = (self.rule, self.key, deadline)


class _PartitionCore:
    """PartitionProcessor's hot half: the purgatory on the event-time clock, and the loop.

    Its compiled twin is ``tickwheel.pipeline._loop.PartitionCore``, which runs
    the same steps on the compiled ``TimerCore`` with the watcher lists of this
    one rule shape; the rest of :class:`PartitionProcessor` is shared.
    """

    # Set by PartitionProcessor.__init__ (declared here for the type checker).
    _timeouts: tuple[int, ...]
    _retention_ms: int | None
    _single: bool
    _wheel_size: int
    _lock: threading.RLock
    _resolving: tuple[str, int, str] | None
    _outcomes: list[tuple[int, str, str, int, int, str, int | None, str | None]]
    _unmatched: list[tuple[int, str, str, str, int, str]]
    _last_expired: dict[object, tuple[int, str, int]]
    _buffered: list[Event]
    _clock: EventTimeClock | None
    _timer: SystemTimer | None
    _purgatory: DelayedOperationPurgatory[_Operation] | None
    _live: set[_Operation]
    max_event_time: int | None
    events_applied: int
    events_buffered: int

    def _start(self, start_ms: int) -> None:
        if type(start_ms) is not int:
            raise TypeError(f"start_ms must be an int of milliseconds, got {start_ms!r}")
        self._clock = EventTimeClock(start_ms)
        self._timer = SystemTimer(
            name="pipeline",
            tick_ms=1,
            wheel_size=self._wheel_size,
            clock=self._clock,
            executor="inline",
        )
        self._purgatory = DelayedOperationPurgatory(
            "pipeline", timer=self._timer, purge_interval=10_000, reaper_enabled=False
        )

    def _open(self, rule: int, key: str, op_id: str, opened_at: int, deadline: int) -> None:
        assert self._clock is not None and self._purgatory is not None
        wkey = self._wkey(rule, key)
        op = _Operation(
            self,
            rule,
            key,
            wkey,
            op_id,
            opened_at,
            deadline,
            deadline - self._clock._now_ms,
            self._lock,
        )
        self._live.add(op)
        self._purgatory.try_complete_else_watch(op, (wkey,))

    def _wkey(self, rule: int, key: str) -> object:
        """The purgatory's watch key of (rule, key): the key alone when there is one rule."""
        return key if self._single else (rule, key)

    # -- running ----------------------------------------------------------------

    def process(
        self,
        events: Iterable[Event | tuple[int, str, int, int, str, int, str]],
        watermark_ms: int | None = None,
    ) -> None:
        """Apply ``events`` (sorted by time, sequence, id) up to ``watermark_ms``.

        Events with a time above the watermark are buffered, not applied; see
        :meth:`buffered_events`. With ``watermark_ms=None`` every event is applied.
        Raises ValueError for an event older than the clock (out of order, or
        older than a previous watermark). O(events + resolved operations).
        """
        it = iter(events)
        first = next(it, None)
        if first is None:
            return
        if self._clock is None:
            self._start(first[2])
        limit = _NO_LIMIT if watermark_ms is None else watermark_ms
        applied = 0
        for event in itertools.chain((first,), it):
            rule, key, time, _seq, event_id, kind, event_type = event
            if time > limit:
                self._buffer([event, *it])
                break
            self._move_clock(time, event_id)
            if kind == 0:
                self._open(rule, key, event_id, time, time + self._timeouts[rule])
            else:
                self._resolve(rule, key, event_id, event_type, time, kind)
            applied += 1
        self.events_applied += applied
        if applied:
            assert self._clock is not None
            self._raise_max_event_time(self._clock._now_ms)

    def _move_clock(self, time: int, event_id: str) -> None:
        """Set the clock to an event's time, then expire every operation due by then."""
        assert self._clock is not None and self._timer is not None
        assert self._purgatory is not None
        now = self._clock._now_ms
        if time == now:
            return
        if time < now:
            raise ValueError(
                f"event {event_id!r} at {time} is older than the clock ({now}): "
                "events must come in time order and not below a previous watermark"
            )
        self._clock.set(time)
        # Only when a bucket or a staged task is due can the timer run anything.
        if self._timer._due_at(time):
            self._purgatory.advance_clock(0)

    def _resolve(
        self, rule: int, key: str, event_id: str, event_type: str, time: int, kind: int
    ) -> None:
        """A complete (kind 1) or cancel (kind 2) event: resolve the key's pending operations.

        One that finds none is an unmatched row, ``after_expiry`` when the key's
        last operation expired and its marker still holds (:func:`marker_holds`).
        """
        assert self._purgatory is not None
        wkey = self._wkey(rule, key)
        self._resolving = (COMPLETED if kind == 1 else CANCELLED, time, event_id)
        try:
            done = self._purgatory.check_and_complete(wkey)
        finally:
            self._resolving = None
        if not done:
            marker = self._last_expired.get(wkey)
            held = marker is not None and marker_holds(marker[2], self._retention_ms, time)
            reason = AFTER_EXPIRY if held else NO_OPERATION
            self._unmatched.append((rule, key, event_id, event_type, time, reason))

    def _buffer(self, events: list[Event | tuple[int, str, int, int, str, int, str]]) -> None:
        """Keep events above the watermark, not applied, for a later run."""
        rest = [Event(*event) for event in events]
        self._buffered.extend(rest)
        self.events_buffered += len(rest)
        self._raise_max_event_time(max(event.time for event in rest))

    def _raise_max_event_time(self, time: int) -> None:
        if self.max_event_time is None or time > self.max_event_time:
            self.max_event_time = time

    def advance_to(self, time_ms: int) -> None:
        """Move the clock to ``time_ms`` and expire every operation due by then. O(expired)."""
        if self._clock is None:
            self._start(time_ms)
            return
        if time_ms > self._clock._now_ms:
            self._clock.set(time_ms)
            assert self._purgatory is not None
            self._purgatory.advance_clock(0)

    def pending_operations(self) -> list[tuple[int, str, str, int, int]]:
        """``(rule index, key, op_id, opened_at, deadline)`` of each pending op, sorted."""
        return sorted(
            (op.rule, op.key, op.op_id, op.opened_at, op.deadline)
            for op in self._live
            if not op.is_completed
        )

    @property
    def num_pending(self) -> int:
        """Number of pending operations. O(1)."""
        return len(self._live)

    def close(self) -> None:
        """Release the purgatory and its timer; pending operations are left as they are."""
        if self._purgatory is not None:
            self._purgatory.shutdown()


if not TYPE_CHECKING and (_loop := compiled("tickwheel.pipeline._loop")) is not None:
    _PartitionCore = _loop.PartitionCore


class PartitionProcessor(_PartitionCore):
    """Applies one partition's events to a purgatory on an event-time clock.

    ``rules`` is a :class:`~tickwheel.pipeline.rules.Rules` or a sequence of
    :class:`Rule`; events name their rule by index into it. ``state`` rows (from
    :meth:`export_state`) restore pending operations, expiries and buffered
    events; ``start_ms`` is where the clock starts (default: the first event's
    time, or the earliest restored time). ``retention_ms`` is how long a key's
    expiry marker holds (see :func:`marker_holds`; None: for ever); by default
    the ``[input].retention`` of ``rules`` when it is a :class:`Rules`, else
    ``DEFAULT_RETENTION_MS`` (seven days). Each event costs O(1) amortised plus
    the operations it resolves.
    """

    def __init__(
        self,
        rules: Rules | Sequence[Rule],
        allowed_lateness_ms: int = 0,
        state: Iterable[StateRow] | None = None,
        start_ms: int | None = None,
        wheel_size: int = 64,
        retention_ms: int | EllipsisType | None = ...,
    ) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules.rules if isinstance(rules, Rules) else rules)
        if not self.rules:
            raise ValueError("PartitionProcessor needs at least one rule")
        if type(allowed_lateness_ms) is not int or allowed_lateness_ms < 0:
            raise ValueError(
                f"allowed_lateness_ms must be an int >= 0, got {allowed_lateness_ms!r}"
            )
        if retention_ms is ...:
            retention_ms = (
                rules.input.retention_ms if isinstance(rules, Rules) else DEFAULT_RETENTION_MS
            )
        if retention_ms is not None and (type(retention_ms) is not int or retention_ms < 0):
            raise ValueError(f"retention_ms must be an int >= 0 or None, got {retention_ms!r}")
        self.allowed_lateness_ms = allowed_lateness_ms
        self._retention_ms = retention_ms
        self._names = tuple(rule.name for rule in self.rules)
        self._rule_index = {name: i for i, name in enumerate(self._names)}
        self._timeouts = tuple(rule.timeout_ms for rule in self.rules)
        self._single = len(self.rules) == 1
        self._wheel_size = wheel_size
        self._lock = threading.RLock()
        self._resolving: tuple[str, int, str] | None = None
        self._outcomes: list[tuple[int, str, str, int, int, str, int | None, str | None]] = []
        self._unmatched: list[tuple[int, str, str, str, int, str]] = []
        self._last_expired: dict[object, tuple[int, str, int]] = {}
        self._buffered: list[Event] = []
        self._clock: EventTimeClock | None = None
        self._timer: SystemTimer | None = None
        self._purgatory: DelayedOperationPurgatory[_Operation] | None = None
        self._live: set[_Operation] = set()
        self.max_event_time: int | None = None
        self.events_applied = 0
        self.events_buffered = 0
        if start_ms is not None:
            self._start(start_ms)
        if state is not None:
            self._restore(list(state))

    # -- set-up ---------------------------------------------------------------

    def _restore(self, rows: list[StateRow]) -> None:
        if self._clock is None:
            times = [row.time for row in rows]
            if not times:
                return
            self._start(min(times))
        index = self._rule_index
        buffered: list[Event] = []
        for row in rows:
            rule = index.get(row.rule)
            if rule is None:
                raise ValueError(f"state row names rule {row.rule!r}, not among {self._names}")
            if row.kind == STATE_PENDING:
                if row.event_id is None or row.deadline is None:
                    raise ValueError(f"pending state row needs event_id and deadline: {row!r}")
                self._open(rule, row.key, row.event_id, row.time, row.deadline)
            elif row.kind == STATE_EXPIRED:
                wkey = self._wkey(rule, row.key)
                self._last_expired[wkey] = (rule, row.key, row.time)
            elif row.kind == STATE_BUFFERED:
                if row.event_id is None or row.event_type is None:
                    raise ValueError(f"buffered state row needs event_id and event_type: {row!r}")
                kind = self.rules[rule].kind_of(row.event_type)
                if kind is None:
                    raise ValueError(
                        f"buffered event type {row.event_type!r} not in rule {row.rule!r}"
                    )
                buffered.append(
                    Event(rule, row.key, row.time, row.seq or 0, row.event_id, kind, row.event_type)
                )
            else:
                raise ValueError(f"unknown state row kind {row.kind!r}")
        buffered.sort(key=lambda e: (e.time, e.seq, e.event_id, e.rule))
        self._buffered = buffered

    def finish(self, watermark_ms: int | None = None) -> None:
        """End a run: advance the clock to the watermark (default: max event time − lateness)."""
        if watermark_ms is None:
            if self.max_event_time is None:
                return
            watermark_ms = self.max_event_time - self.allowed_lateness_ms
        if self._clock is None or watermark_ms > self._clock._now_ms:
            self.advance_to(watermark_ms)

    # -- results ------------------------------------------------------------------

    @property
    def now_ms(self) -> int | None:
        """The event-time clock, or None before the first event. O(1)."""
        return None if self._clock is None else self._clock._now_ms

    def take_outcomes(self) -> list[tuple[int, str, str, int, int, str, int | None, str | None]]:
        """Return and clear the resolved outcomes as raw tuples.

        ``(rule index, key, op_id, opened_at, deadline, outcome, resolved_at,
        resolve_event_id)``; latency is ``resolved_at - opened_at``. O(1).
        """
        out = self._outcomes
        self._outcomes = []
        return out

    def take_unmatched(self) -> list[tuple[int, str, str, str, int, str]]:
        """Return and clear unmatched events: ``(rule index, key, id, type, time, reason)``."""
        out = self._unmatched
        self._unmatched = []
        return out

    def buffered_events(self) -> list[Event]:
        """A copy of the events above the watermark, not applied, in order. O(n)."""
        return list(self._buffered)

    def take_buffered(self) -> list[Event]:
        """Return and clear the buffered events, to apply them (merged with newer ones). O(1)."""
        out = self._buffered
        self._buffered = []
        return out

    def outcome_rows(self) -> list[OutcomeRow]:
        """Take the resolved outcomes as :class:`OutcomeRow` (named rules, latency). O(n)."""
        names = self._names
        return [
            OutcomeRow(names[r], k, op, o, d, out, at, None if at is None else at - o, ev)
            for r, k, op, o, d, out, at, ev in self.take_outcomes()
        ]

    def pending_rows(self) -> list[OutcomeRow]:
        """An outcome row ``pending`` for every pending operation (not cleared). O(n log n)."""
        names = self._names
        return [
            OutcomeRow(names[r], k, op, o, d, PENDING, None, None, None)
            for r, k, op, o, d in self.pending_operations()
        ]

    def unmatched_rows(self) -> list[UnmatchedRow]:
        """Take the unmatched events as :class:`UnmatchedRow`. O(n)."""
        names = self._names
        return [
            UnmatchedRow(names[r], k, ev, ty, t, why)
            for r, k, ev, ty, t, why in self.take_unmatched()
        ]

    @property
    def retention_ms(self) -> int | None:
        """How long a key's expiry marker holds after its time; None: for ever. O(1)."""
        return self._retention_ms

    def expired_markers(self) -> list[tuple[int, str, int]]:
        """``(rule index, key, expired_at)`` of each key's last expiry that holds, sorted.

        A key keeps its marker until a later operation of it resolves otherwise,
        or until the clock reaches ``expired_at + retention_ms``: no event still
        to come can find it then (:func:`marker_holds`), so it is not exported.
        The marker is what gives a late ``complete`` the reason ``after_expiry``.
        O(n log n).
        """
        now, retention = self.now_ms, self._retention_ms
        return sorted(
            marker
            for marker in self._last_expired.values()
            if now is None or marker_holds(marker[2], retention, now)
        )

    def export_state(self) -> list[StateRow]:
        """The carried state as plain rows: pending ops, expiries that hold, buffered events.

        O(n log n).
        """
        names = self._names
        rows = [
            StateRow(STATE_PENDING, names[r], k, op, o, d, None, None)
            for r, k, op, o, d in self.pending_operations()
        ]
        rows.extend(
            StateRow(STATE_EXPIRED, names[r], k, None, at, None, None, None)
            for r, k, at in self.expired_markers()
        )
        rows.extend(
            StateRow(
                STATE_BUFFERED, names[e.rule], e.key, e.event_id, e.time, None, e.seq, e.event_type
            )
            for e in self._buffered
        )
        return rows

    def __enter__(self) -> PartitionProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
