"""AsyncTimer: the hierarchical timing wheel as an asyncio timer service.

An :class:`AsyncTimer` keeps its timers in a Kafka timing wheel and holds
exactly **one** timer of the event loop (``loop.call_at``), armed for the
earliest bucket or staged deadline and re-armed only when that changes.
Scheduling and cancelling are O(1) (placing a staged timer in its bucket is
O(levels)), where ``loop.call_later`` pushes onto a heap in O(log n) and
leaves a cancelled handle in it until the heap is rebuilt.

Timers use the loop's clock (``loop.time()``, float seconds), in integer
milliseconds inside the wheel. Deadlines are rounded **up** to the tick, as
Tokio and Linux do (Kafka's bucket may fire up to a tick early): a callback
never runs before its deadline (``loop.time() >= handle.when()``), and at most
one tick plus the loop's latency after it.

The wheel's range
-----------------
The wheel keeps int64 milliseconds, and its coarsest level must fit them:
a timer keeps deadlines within ``2**61 // wheel_size`` ms of zero (3.6
million years at the defaults). A deadline beyond that, ``inf`` included, is
*kept aside* in a list of its own, never armed: the loop's clock cannot reach
it, so, as on asyncio's heap, it never fires, and it is cancelled in O(1).
A deadline below the range, ``-inf`` included, is past: it runs on the next
iteration.
"""

from __future__ import annotations

import asyncio
import contextvars
import operator
import time as _time_mod
from asyncio import format_helpers
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from .._accel import speedups
from .._task_list import CANCELLED, TaskCounter, TimerTaskList
from .._timer_core import NEVER, TimerCore
from ._debug import DebugRun
from ._handle import TimerHandle, ceil_ms, check_delay, check_when, floor_ms
from ._timeouts import Timeout

__all__ = ["AsyncTimer"]

_T = TypeVar("_T")

#: The bound of the coarsest level's int64 arithmetic: deadlines are kept within
#: ``_RANGE_MS // wheel_size`` ms of zero (see the module doc).
_RANGE_MS = 1 << 61

_monotonic = _time_mod.monotonic
_when_of = operator.attrgetter("_when")


class _AsyncTimerCore(TimerCore):
    """AsyncTimer's hot half: scheduling, the one loop timer, and running due callbacks.

    Its compiled twin is ``tickwheel._speedups.AsyncTimerCore``; the rest of
    :class:`AsyncTimer` is shared. The wheel itself is :class:`TimerCore`'s, as
    in :class:`~tickwheel.SystemTimer`.
    """

    # Set by AsyncTimer.__init__ (declared here for the type checker).
    _loop: asyncio.AbstractEventLoop
    _time: Callable[[], float]
    _call_at_loop: Callable[..., asyncio.TimerHandle]
    _context: contextvars.Context
    _armed_ms: int
    _loop_handle: asyncio.TimerHandle | None
    _ready: list[TimerHandle]
    _ready_scheduled: bool
    _batch: list[TimerHandle] | None
    _closed: bool
    _horizon_s: float
    _parked: TimerTaskList

    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now; return its handle.

        ``delay`` must be a number >= 0; ``inf`` never fires. The callback runs
        in ``context`` if given, else in the timer's own context (see the class
        doc). O(1); placing the staged handle later is O(levels), at most 7
        with the defaults for delays up to a day.
        """
        if delay.__class__ is not float or not delay >= 0.0:
            delay = check_delay(delay)
        self._check_call(callback)
        return self._add(TimerHandle(self._time() + delay, callback, args, context))

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` once the loop's time reaches ``when``; return its handle.

        A ``when`` in the past runs on the next loop iteration; ``inf`` never.
        The callback runs in ``context`` if given, else in the timer's own
        context. O(1) (placing it later: O(levels)).
        """
        when = check_when(when)
        self._check_call(callback)
        return self._add(TimerHandle(when, callback, args, context))

    def _check_call(self, callback: object) -> None:
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")

    def _add(self, handle: TimerHandle) -> TimerHandle:
        """Keep ``handle`` until its deadline; return it. The caller checked that the timer is open.

        Kafka's ``SystemTimer.add``. A deadline within the wheel's range is
        rounded up to a whole tick: a handle due for the wheel already runs on
        the next loop iteration; any other is staged, and the loop timer
        re-armed if it is now the earliest. A deadline beyond the range
        (``inf``) is kept aside; one below it (``-inf``), or NaN, is due. O(1).
        """
        when = handle._when
        horizon = self._horizon_s
        if -horizon < when < horizon:
            expiration_ms = ceil_ms(when)
            tick = self._wheel.tick_ms
            if tick != 1:
                expiration_ms = -(-expiration_ms // tick) * tick
            handle.expiration_ms = expiration_ms
            if self._add_entry(handle):
                if expiration_ms < self._armed_ms:
                    self._arm(expiration_ms)
                return handle
        elif when >= horizon:
            self._parked.add(handle)
            return handle
        self._run_soon(handle)
        return handle

    def _run_soon(self, handle: TimerHandle) -> None:
        """Run ``handle``, already due, on the next loop iteration, never synchronously."""
        self._ready.append(handle)
        if not self._ready_scheduled:
            self._ready_scheduled = True
            self._loop.call_soon(self._on_ready, context=self._context)

    # -- the loop timer -------------------------------------------------------

    def _arm(self, expiration_ms: int) -> None:
        """Point the one loop timer at ``expiration_ms``. O(log of the loop's heap)."""
        if self._loop_handle is not None:
            self._disarm()
        self._armed_ms = expiration_ms
        self._loop_handle = self._call_at_loop(
            expiration_ms / 1000, self._run_due, context=self._context
        )

    def _disarm(self) -> None:
        """Release the loop timer, if held."""
        if self._loop_handle is not None:
            self._loop_handle.cancel()
            self._loop_handle = None
        self._armed_ms = NEVER

    def _on_ready(self) -> None:
        """Run handles that were already due when scheduled."""
        self._ready_scheduled = False
        self._run_due(False)

    def _run_due(self, fired: bool = True) -> None:
        """Flush every due bucket (cascading coarse ones), re-arm, then run callbacks in order.

        The loop timer calls it (``fired``), as does ``_on_ready``. Callbacks run
        in deadline order; one that raises goes to the loop's exception handler
        and the rest still run. O(due buckets + entries moved or run).
        """
        if fired:
            self._loop_handle = None
            self._armed_ms = NEVER
        if self._closed:
            return
        due: list[Any] = self._ready
        self._ready = []
        self._advance(floor_ms(self._time()), due)
        # Re-arm for the new head before running callbacks, which may add timers.
        if self._counter.value == 0:
            # Only empty buckets are left (all cancelled): forget them.
            self._clear()
            self._disarm()
        else:
            head = self._next_expiration_ms()
            if head != self._armed_ms:
                self._arm(head)
        if due:
            if len(due) > 1:
                due.sort(key=_when_of)
            self._run_handles(due)

    def _run_handles(self, handles: list[TimerHandle]) -> None:
        """Run each handle not cancelled meanwhile; report what a callback raises.

        In debug mode each one is run as asyncio runs a handle (see ``_debug``).
        """
        self._batch = handles  # so that close() from a callback cancels the rest
        run: Callable[[TimerHandle], None] = TimerHandle._run
        debug = None
        if self._loop.get_debug():
            run = debug = DebugRun(self._loop, self._report_callback_error)
        for i, handle in enumerate(handles):
            if handle._list is CANCELLED:
                continue
            try:
                run(handle)
            except (SystemExit, KeyboardInterrupt):
                self._run_next_iteration(handles[i + 1 :])
                raise
            except BaseException as exc:
                self._report_callback_error(handle, exc)
        self._batch = None
        if debug is not None:
            debug.finish()

    # The cold paths the hot half calls, defined by AsyncTimer.

    def _run_next_iteration(self, handles: list[TimerHandle]) -> None:
        raise NotImplementedError

    def _report_callback_error(self, handle: TimerHandle, exc: BaseException) -> None:
        raise NotImplementedError


if not TYPE_CHECKING and speedups is not None:
    _AsyncTimerCore = speedups.AsyncTimerCore


class AsyncTimer(_AsyncTimerCore):
    """A hierarchical timing wheel driven by an asyncio event loop.

    ``tick_ms`` is the finest resolution in milliseconds, ``wheel_size`` the
    number of buckets per level; levels are added on demand (Kafka's overflow
    wheels), so with the defaults four levels cover 160 s and each further one
    multiplies the span by 20. ``loop`` defaults to the running loop.
    ``loop_call_at`` (default ``loop.call_at``) arms the one loop timer; an event
    loop that routes its own ``call_at`` to this timer passes its base class's.

    Only one loop timer is used, whatever the number of pending timers. The
    object is loop-thread only: call it from the loop's thread (use
    ``loop.call_soon_threadsafe`` from others). It is an async context manager
    that closes it on exit.

    Callbacks given no ``context=`` run in the timer's own context, a copy of
    the one current when the timer was created; asyncio instead copies the
    caller's context per call, which here would double the cost of a
    ``call_later``. Pass ``context=contextvars.copy_context()`` for that.

    New timers are staged, as in :class:`~tickwheel.SystemTimer`: ``call_later``
    links the handle at the tail of a staging list and, if its deadline is the
    earliest, re-arms the loop timer for it; the next run of the loop timer
    places the staged handles in the wheel before the wheel moves, so each
    lands in the bucket an immediate insertion would have chosen. A timer
    cancelled before then (most timeouts) never touches the wheel.
    """

    def __init__(
        self,
        tick_ms: int = 1,
        wheel_size: int = 20,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        loop_call_at: Callable[..., asyncio.TimerHandle] | None = None,
    ) -> None:
        if type(tick_ms) is not int or tick_ms < 1:
            raise ValueError(f"tick_ms must be an int >= 1, got {tick_ms!r}")
        if type(wheel_size) is not int or wheel_size < 2:
            raise ValueError(f"wheel_size must be an int >= 2, got {wheel_size!r}")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "AsyncTimer() needs a running event loop, or pass loop="
                ) from None
        elif not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"loop must be an asyncio event loop, got {loop!r}")
        super().__init__(tick_ms, wheel_size, floor_ms(loop.time()))
        self._loop = loop
        # BaseEventLoop.time() is time.monotonic() behind a Python call: skip the call.
        time_fn = getattr(type(loop), "time", None)
        self._time = _monotonic if time_fn is asyncio.BaseEventLoop.time else loop.time
        # The loop's own timer, armed through ``loop_call_at``: an event loop whose
        # call_at is this timer's passes its base class's call_at, not to recurse.
        self._call_at_loop = loop.call_at if loop_call_at is None else loop_call_at
        self._context = contextvars.copy_context()
        self._armed_ms = NEVER  # expiration the loop timer is armed for
        self._loop_handle = None
        self._ready = []  # due at add time; run on the next iteration
        self._ready_scheduled = False
        self._batch = None  # the callbacks now running
        self._closed = False
        self._horizon_s = _RANGE_MS // wheel_size / 1000
        # Deadlines beyond the wheel's range (inf): kept, counted, never armed.
        self._parked = TimerTaskList(TaskCounter(), self._lock, level=-1)

    def _run_next_iteration(self, handles: list[TimerHandle]) -> None:
        """Put ``handles`` first on the next loop iteration (after SystemExit/KeyboardInterrupt)."""
        if handles:
            self._ready[:0] = handles
            if not self._ready_scheduled:
                self._ready_scheduled = True
                self._loop.call_soon(self._on_ready, context=self._context)

    def _report_callback_error(self, handle: TimerHandle, exc: BaseException) -> None:
        """Hand what a callback raised to the loop's exception handler, as asyncio's Handle does."""
        context: dict[str, Any] = {
            "message": f"Exception in callback {_callback_source(handle)}",
            "exception": exc,
            "handle": handle,
        }
        if handle._source_traceback:
            context["source_traceback"] = handle._source_traceback
        self._loop.call_exception_handler(context)

    # -- coroutines and context managers --------------------------------------

    async def sleep(self, delay: float, result: _T = None) -> _T:  # type: ignore[assignment]
        """Sleep ``delay`` seconds on this timer, then return ``result``, like ``asyncio.sleep``.

        ``delay`` 0 just yields once; ``inf`` sleeps until cancelled. Cancelling
        the sleeping task frees the timer at once. O(1) to schedule.
        """
        if delay.__class__ is not float or not delay >= 0.0:
            delay = check_delay(delay)
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")
        if delay == 0.0:
            await asyncio.sleep(0)
            return result
        future: asyncio.Future[_T] = self._loop.create_future()
        handle = self._add(
            TimerHandle(self._time() + delay, _set_result_unless_cancelled, (future, result))
        )
        try:
            return await future
        finally:
            handle.cancel()

    def timeout(self, delay: float | None) -> Timeout:
        """An ``asyncio.timeout(delay)`` on this timer: raises TimeoutError after ``delay`` s.

        ``None`` (or ``inf``) means no deadline. O(1).
        """
        if delay is None:
            return Timeout(None, self)
        return Timeout(self._time() + check_delay(delay), self)

    def timeout_at(self, when: float | None) -> Timeout:
        """An ``asyncio.timeout_at(when)`` on this timer (``when`` in loop time). O(1)."""
        return Timeout(None if when is None else check_when(when), self)

    async def wait_for(self, aw: Awaitable[_T], delay: float | None) -> _T:
        """Wait for ``aw`` for at most ``delay`` seconds, like ``asyncio.wait_for`` (3.12+).

        On timeout the awaitable is cancelled and TimeoutError raised. ``delay``
        None (or ``inf``) waits forever; 0 cancels at once unless ``aw`` is done.
        """
        if delay is not None:
            delay = check_delay(delay)
            if delay == 0.0:
                return await _wait_for_now(aw, self._loop)
        async with self.timeout(delay):
            return await aw

    # -- lifecycle and inspection ----------------------------------------------

    def time(self) -> float:
        """The loop's time, in seconds. O(1)."""
        return self._time()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop driving this timer."""
        return self._loop

    @property
    def size(self) -> int:
        """Number of timers neither run nor cancelled. O(1) plus the due ones about to run."""
        ready = sum(1 for h in self._ready if h._list is not CANCELLED)
        return self._counter.value + self._parked._counter.value + ready

    def __len__(self) -> int:
        """Same as :attr:`size`."""
        return self.size

    @property
    def closed(self) -> bool:
        """True after :meth:`close`. O(1)."""
        return self._closed

    @property
    def loop_timer_armed(self) -> bool:
        """True while the timer holds its one loop timer. O(1)."""
        return self._loop_handle is not None

    def close(self) -> None:
        """Cancel every pending timer and release the loop timer. Idempotent. O(n + buckets)."""
        if self._closed:
            return
        self._closed = True
        self._disarm()
        ready, self._ready = self._ready, []
        batch, self._batch = self._batch, None
        # Those of the batch that already ran are only marked, as in asyncio.
        pending = [*ready, *(batch or ()), *self._clear(), *self._parked.flush()]
        for handle in pending:
            handle.cancel()

    async def __aenter__(self) -> AsyncTimer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"size={self.size}"
        return f"<AsyncTimer tick_ms={self.tick_ms} wheel_size={self.wheel_size} {state}>"

    def _check(self) -> None:
        """Assert the wheel's and the queue's invariants (for tests). O(n + buckets)."""
        super()._check()
        earliest = self._next_expiration_ms()
        if earliest != NEVER and not self._closed:
            # A cancel never re-arms: the loop timer may be armed early, never late.
            assert self._armed_ms <= earliest, f"armed for {self._armed_ms}, due at {earliest}"
            assert self._loop_handle is not None
        if self._loop_handle is None:
            assert earliest == NEVER or self._closed, "pending timers but no loop timer"
        assert self._parked._check_links() == self._parked._counter.value
        for handle in self._parked:
            assert handle._when >= self._horizon_s, "a deadline within range is kept aside"  # type: ignore[attr-defined]


def _callback_source(handle: TimerHandle) -> str:
    """The callback as asyncio's messages name it: ``name(args) at file:line``."""
    return format_helpers._format_callback_source(handle._callback, handle._args or ())


def _set_result_unless_cancelled(future: asyncio.Future[Any], result: Any) -> None:
    if not future.cancelled():
        future.set_result(result)


async def _wait_for_now(aw: Awaitable[_T], loop: asyncio.AbstractEventLoop) -> _T:
    """``wait_for(aw, 0)``: the result if ``aw`` is already done, else cancel it; TimeoutError."""
    fut = asyncio.ensure_future(aw, loop=loop)
    if fut.done():
        return fut.result()
    fut.cancel()
    try:
        await asyncio.wait((fut,))
    except asyncio.CancelledError:
        fut.cancel()
        raise
    try:
        return fut.result()
    except asyncio.CancelledError as exc:
        raise TimeoutError from exc
