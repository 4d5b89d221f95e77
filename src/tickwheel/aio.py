"""tickwheel.aio: the hierarchical timing wheel as an asyncio timer service.

An :class:`AsyncTimer` keeps its timers in a Kafka timing wheel and holds
exactly **one** timer of the event loop (``loop.call_at``), armed for the
earliest bucket or staged deadline and re-armed only when that changes.
Scheduling and cancelling are O(1) (placing a staged timer in its bucket is
O(levels)), where ``loop.call_later`` pushes onto a heap
in O(log n) and leaves a cancelled handle in it until the heap is rebuilt.

Timers use the loop's clock (``loop.time()``, float seconds), in integer
milliseconds inside the wheel. Deadlines are rounded **up** to the tick, as
Tokio and Linux do (Kafka's bucket may fire up to a tick early): a callback
never runs before its deadline (``loop.time() >= handle.when()``), and at most
one tick plus the loop's latency after it.

Finding a timer
---------------
Every operation exists as a method of :class:`AsyncTimer` and as a module
function (:func:`sleep`, :func:`timeout`, :func:`timeout_at`, :func:`wait_for`,
:func:`call_later`, :func:`call_at`) that uses the running loop's default timer,
:func:`get_timer`. An ``AsyncTimer`` belongs to one loop and must only be used
from that loop's thread (it takes no lock).

See ``docs/aio.md`` for the semantics in full.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import math
import operator
import time as _time_mod
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

from ._accel import speedups
from ._aio_virtual import VirtualClockEventLoop
from ._task_list import CANCELLED, TimerTaskEntry
from ._timer_core import NEVER, TimerCore

__all__ = [
    "AsyncTimer",
    "EventLoop",
    "EventLoopPolicy",
    "Timeout",
    "TimerHandle",
    "VirtualClockEventLoop",
    "call_at",
    "call_later",
    "get_timer",
    "install",
    "new_event_loop",
    "new_uvloop_event_loop",
    "sleep",
    "timeout",
    "timeout_at",
    "wait_for",
]

_T = TypeVar("_T")

_INF: Final = math.inf
# The largest |loop time| or delay in seconds: the wheel keeps int64 milliseconds.
_MAX_SECONDS: Final = float(1 << 62) / 1000
_ceil = math.ceil
_floor = math.floor
_monotonic = _time_mod.monotonic


def _check_delay(delay: object, name: str = "delay") -> float:
    """Return ``delay`` as a float; TypeError if not a number, ValueError if negative/NaN/inf."""
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {delay!r}")
    value = float(delay)
    if not 0.0 <= value < _MAX_SECONDS:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {delay!r}")
    return value


def _check_when(when: object, name: str = "when") -> float:
    """Return ``when`` as a float; TypeError if not a number, ValueError if NaN or infinite."""
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        raise TypeError(f"{name} must be a loop time in seconds, got {when!r}")
    value = float(when)
    if not -_MAX_SECONDS < value < _MAX_SECONDS:
        raise ValueError(f"{name} must be a finite loop time, got {when!r}")
    return value


def _ceil_ms(when: float) -> int:
    """The smallest integer ``m`` with ``m / 1000 >= when`` (exact in float arithmetic)."""
    m = _ceil(when * 1000.0)
    if m / 1000 < when:
        m += 1
    elif (m - 1) / 1000 >= when:
        m -= 1
    return m


def _floor_ms(now: float) -> int:
    """The largest integer ``m`` with ``m / 1000 <= now`` (exact in float arithmetic)."""
    m = _floor(now * 1000.0)
    if m / 1000 > now:
        m -= 1
    elif (m + 1) / 1000 <= now:
        m += 1
    return m


class TimerHandle(TimerTaskEntry):
    """A callback scheduled on an :class:`AsyncTimer`, like :class:`asyncio.TimerHandle`.

    The handle *is* the wheel entry (it extends ``TimerTaskEntry``), so a pending
    timer is one object. ``expiration_ms`` is the deadline rounded up to the
    timer's tick, the key of its bucket.
    """

    # The context a callback runs in, when it has its own (asyncio gives every
    # callback a copy of its caller's): entered around the call, as Context.run.
    __slots__ = ("_args", "_callback", "_context", "_when")

    _callback: Callable[..., object] | None
    _args: tuple[Any, ...] | None
    _context: contextvars.Context | None
    _when: float

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None = None,
    ) -> None:
        super().__init__()
        self._when = when
        self._callback = callback
        self._args = args
        self._context = context

    def when(self) -> float:
        """The deadline, in the loop's time (seconds). O(1)."""
        return self._when

    def cancel(self) -> None:
        """Cancel the callback; it will not run. O(1), idempotent.

        A pending handle leaves its bucket at once and drops its callback and
        arguments, so their memory is freed now, not when the deadline passes.
        As in asyncio, cancelling a handle that already ran only marks it.
        """
        lst = self._list
        if lst is CANCELLED:
            return
        if lst is not None:
            lst.remove(self)
        self._list = CANCELLED
        self._callback = None
        self._args = None
        self._context = None

    def cancelled(self) -> bool:  # type: ignore[override]
        """True once :meth:`cancel` was called. O(1).

        A method, as on ``asyncio.Handle`` (the base entry has a property).
        """
        return self._list is CANCELLED

    def _run(self) -> None:
        """Call the callback, in its context if it has one (the timer catches what it raises)."""
        assert self._callback is not None and self._args is not None
        if self._context is None:
            self._callback(*self._args)
        else:
            self._context.run(self._callback, *self._args)

    def __repr__(self) -> str:
        return handle_repr(self)


# Written once, as functions: the compiled twin's methods call them.


def handle_repr(handle: TimerHandle) -> str:
    """``repr`` of a handle, on both paths."""
    if handle._list is CANCELLED:
        state = "cancelled"
    else:
        state = "pending" if handle._list is not None else "idle"
    cb = handle._callback
    name = getattr(cb, "__qualname__", None) or repr(cb)
    return f"<TimerHandle when={handle._when!r} {state} {name}>"


if not TYPE_CHECKING and speedups is not None:
    TimerHandle = speedups.TimerHandle


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

    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now; return its handle.

        ``delay`` must be a finite number >= 0. The callback runs in ``context``
        if given, else in the timer's own context (see the class doc). O(1);
        placing the staged handle later is O(levels), at most 7 with the
        defaults for delays up to a day.
        """
        delay = _check_delay(delay)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        return self._schedule(self._time() + delay, callback, args, context)

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` once the loop's time reaches ``when``; return its handle.

        A ``when`` in the past runs on the next loop iteration. The callback runs
        in ``context`` if given, else in the timer's own context. O(1) (placing it
        later: O(levels)).
        """
        when = _check_when(when)
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        return self._schedule(when, callback, args, context)

    def _schedule(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """``call_at`` without the argument checks: ``when`` is a finite float.

        The deadline is rounded up to a whole tick; a handle due for the wheel
        already runs on the next loop iteration. Otherwise it is staged, and
        the loop timer re-armed if it is now the earliest.
        """
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")
        handle = TimerHandle(when, callback, args, context)
        tick = self._wheel.tick_ms
        handle.expiration_ms = -(-_ceil_ms(when) // tick) * tick
        if not self._add_entry(handle):
            self._ready.append(handle)
            if not self._ready_scheduled:
                self._ready_scheduled = True
                self._loop.call_soon(self._on_ready, context=self._context)
        elif handle.expiration_ms < self._armed_ms:
            self._arm(handle.expiration_ms)
        return handle

    # -- the loop timer -------------------------------------------------------

    def _arm(self, expiration_ms: int) -> None:
        """Point the one loop timer at ``expiration_ms``. O(log of the loop's heap)."""
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
        due: list[TimerTaskEntry] = list(self._ready)
        self._ready.clear()
        self._advance(_floor_ms(self._time()), due)
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
            self._run_handles(sorted(due, key=_when_of))  # type: ignore[arg-type]

    def _run_handles(self, handles: list[TimerHandle]) -> None:
        """Run each handle not cancelled meanwhile; report what a callback raises."""
        self._batch = handles  # so that close() from a callback cancels the rest
        for i, handle in enumerate(handles):
            if handle._list is CANCELLED:
                continue
            try:
                handle._run()
            except (SystemExit, KeyboardInterrupt):
                self._run_next_iteration(handles[i + 1 :])
                raise
            except BaseException as exc:
                self._report_callback_error(handle, exc)
        self._batch = None

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
        super().__init__(tick_ms, wheel_size, _floor_ms(loop.time()))
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

    def _run_next_iteration(self, handles: list[TimerHandle]) -> None:
        """Put ``handles`` first on the next loop iteration (after SystemExit/KeyboardInterrupt)."""
        if handles:
            self._ready[:0] = handles
            if not self._ready_scheduled:
                self._ready_scheduled = True
                self._loop.call_soon(self._on_ready, context=self._context)

    def _report_callback_error(self, handle: TimerHandle, exc: BaseException) -> None:
        """Hand what a callback raised to the loop's exception handler, as asyncio's Handle does."""
        self._loop.call_exception_handler(
            {
                "message": f"Exception in callback {handle._callback!r}",
                "exception": exc,
                "handle": handle,
            }
        )

    # -- coroutines and context managers --------------------------------------

    async def sleep(self, delay: float, result: _T = None) -> _T:  # type: ignore[assignment]
        """Sleep ``delay`` seconds on this timer, then return ``result``, like ``asyncio.sleep``.

        ``delay`` 0 just yields once. Cancelling the sleeping task frees the timer
        at once. O(1) to schedule.
        """
        if delay.__class__ is not float or not 0.0 <= delay < _MAX_SECONDS:
            delay = _check_delay(delay)
        if self._closed:
            raise RuntimeError("AsyncTimer is closed")
        if delay == 0.0:
            await asyncio.sleep(0)
            return result
        future: asyncio.Future[_T] = self._loop.create_future()
        handle = self._schedule(
            self._time() + delay, _set_result_unless_cancelled, (future, result)
        )
        try:
            return await future
        finally:
            handle.cancel()

    def timeout(self, delay: float | None) -> Timeout:
        """An ``asyncio.timeout(delay)`` on this timer: raises TimeoutError after ``delay`` s.

        ``None`` means no deadline. O(1).
        """
        if delay is None:
            return Timeout(None, self)
        return Timeout(self._time() + _check_delay(delay), self)

    def timeout_at(self, when: float | None) -> Timeout:
        """An ``asyncio.timeout_at(when)`` on this timer (``when`` in loop time). O(1)."""
        return Timeout(None if when is None else _check_when(when), self)

    async def wait_for(self, aw: Awaitable[_T], delay: float | None) -> _T:
        """Wait for ``aw`` for at most ``delay`` seconds, like ``asyncio.wait_for`` (3.12+).

        On timeout the awaitable is cancelled and TimeoutError raised. ``delay``
        None waits forever; 0 cancels at once unless ``aw`` is already done.
        """
        if delay is not None:
            delay = _check_delay(delay)
            if delay == 0.0:
                fut = asyncio.ensure_future(aw, loop=self._loop)
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
        return self._counter.value + ready

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
        for handle in [*ready, *(batch or ()), *self._clear()]:
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


_when_of = operator.attrgetter("_when")


def _set_result_unless_cancelled(future: asyncio.Future[Any], result: Any) -> None:
    if not future.cancelled():
        future.set_result(result)


# -- Timeout: asyncio.timeout on the wheel ---------------------------------------


class _State(enum.Enum):
    CREATED = "created"
    ENTERED = "active"
    EXPIRING = "expiring"
    EXPIRED = "expired"
    EXITED = "finished"


@final
class Timeout:
    """An async context manager that cancels the enclosing task at a deadline.

    The semantics are ``asyncio.Timeout``'s (3.11+): on expiry the task is
    cancelled; the outermost affected ``Timeout`` turns the ``CancelledError``
    into ``TimeoutError`` and uncancels the task, so other cancellations pass
    through. Only the deadline is kept on an :class:`AsyncTimer` instead of
    the loop's heap. Create it with :func:`timeout` / :func:`timeout_at` or the
    timer's methods.
    """

    __slots__ = ("_cancelling", "_handle", "_state", "_task", "_timer", "_when")

    def __init__(self, when: float | None, timer: AsyncTimer) -> None:
        self._state = _State.CREATED
        self._handle: TimerHandle | asyncio.Handle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._when = when
        self._timer = timer

    def when(self) -> float | None:
        """The current deadline (loop time), or None. O(1)."""
        return self._when

    def reschedule(self, when: float | None) -> None:
        """Move the deadline to ``when`` (loop time; None removes it). O(1).

        Raises RuntimeError unless the context is active, as asyncio does. A
        deadline already past expires on the next loop iteration.
        """
        if self._state is not _State.ENTERED:
            if self._state is _State.CREATED:
                raise RuntimeError("Timeout has not been entered")
            raise RuntimeError(f"Cannot change state of {self._state.value} Timeout")
        if when is not None:
            when = _check_when(when)
        self._when = when
        handle = self._handle
        if handle is not None:
            handle.cancel()
        if when is None:
            self._handle = None
        else:
            timer = self._timer
            if when <= timer._time():
                self._handle = timer._loop.call_soon(self._on_timeout)
            else:
                self._handle = timer._schedule(when, self._on_timeout, ())

    def expired(self) -> bool:
        """True once the deadline passed while the context was active. O(1)."""
        return self._state is _State.EXPIRING or self._state is _State.EXPIRED

    def __repr__(self) -> str:
        info = ""
        if self._state is _State.ENTERED:
            when = round(self._when, 3) if self._when is not None else None
            info = f" when={when}"
        return f"<Timeout [{self._state.value}]{info}>"

    async def __aenter__(self) -> Timeout:
        if self._state is not _State.CREATED:
            raise RuntimeError("Timeout has already been entered")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._state = _State.ENTERED
        self._task = task
        self._cancelling = task.cancelling()
        self.reschedule(self._when)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        assert self._state in (_State.ENTERED, _State.EXPIRING)
        handle = self._handle
        if handle is not None:
            handle.cancel()
            self._handle = None
        if self._state is _State.EXPIRING:
            self._state = _State.EXPIRED
            assert self._task is not None
            if (
                self._task.uncancel() <= self._cancelling
                and exc_type is not None
                and issubclass(exc_type, asyncio.CancelledError)
            ):
                # No newer cancel request: this cancellation is ours.
                raise TimeoutError from exc_val
        elif self._state is _State.ENTERED:
            self._state = _State.EXITED
        return None

    def _on_timeout(self) -> None:
        assert self._state is _State.ENTERED
        assert self._task is not None
        self._task.cancel()
        self._state = _State.EXPIRING
        self._handle = None


# -- module functions on the running loop's default timer ----------------------

_default_timers: dict[asyncio.AbstractEventLoop, AsyncTimer] = {}


def get_timer(loop: asyncio.AbstractEventLoop | None = None) -> AsyncTimer:
    """The default :class:`AsyncTimer` of ``loop`` (default: the running loop).

    Created on first use with the default geometry and kept until it is closed
    or its loop is closed (closed loops are forgotten when the next default
    timer is created). O(1).
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    timer = _default_timers.get(loop)
    if timer is None or timer._closed:
        for old in [old for old in _default_timers if old.is_closed()]:
            _default_timers.pop(old).close()
        timer = AsyncTimer(loop=loop)
        _default_timers[loop] = timer
    return timer


def call_later(delay: float, callback: Callable[..., object], *args: Any) -> TimerHandle:
    """``get_timer().call_later(delay, callback, *args)``. O(1)."""
    return get_timer().call_later(delay, callback, *args)


def call_at(when: float, callback: Callable[..., object], *args: Any) -> TimerHandle:
    """``get_timer().call_at(when, callback, *args)``. O(1)."""
    return get_timer().call_at(when, callback, *args)


async def sleep(delay: float, result: _T = None) -> _T:  # type: ignore[assignment]
    """Like ``asyncio.sleep``, on the running loop's default timer. O(1) to schedule."""
    return await get_timer().sleep(delay, result)


def timeout(delay: float | None) -> Timeout:
    """Like ``asyncio.timeout(delay)``, on the running loop's default timer. O(1)."""
    return get_timer().timeout(delay)


def timeout_at(when: float | None) -> Timeout:
    """Like ``asyncio.timeout_at(when)``, on the running loop's default timer. O(1)."""
    return get_timer().timeout_at(when)


async def wait_for(aw: Awaitable[_T], delay: float | None) -> _T:
    """Like ``asyncio.wait_for(aw, delay)``, on the running loop's default timer."""
    return await get_timer().wait_for(aw, delay)


# The drop-in event loop builds on AsyncTimer above, this module's own.
from . import _aio_loop  # noqa: E402

_aio_loop._timer_class = AsyncTimer
_aio_loop._check_when = _check_when
from ._aio_loop import (  # noqa: E402
    EventLoop,
    EventLoopPolicy,
    install,
    new_event_loop,
    new_uvloop_event_loop,
)
