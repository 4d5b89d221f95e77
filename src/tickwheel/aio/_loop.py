"""EventLoop: asyncio's selector event loop with every timer on one timing wheel.

``loop.call_later`` and ``loop.call_at`` are what ``asyncio.sleep``,
``asyncio.timeout``, ``asyncio.wait_for`` and most libraries' timeouts call.
This loop sends them to one :class:`~tickwheel.aio.AsyncTimer`, which keeps
them in a hierarchical timing wheel and holds one real timer of the loop,
armed through the base class's ``call_at`` (the loop's own heap then holds
one timer, not one per timeout). Everything else (``call_soon``, I/O,
signals, subprocesses, executors) is asyncio's, untouched.

Semantics, as asyncio's: a callback runs in a copy of the caller's context
(or the ``context`` given); any number is a deadline (``inf`` never comes
due, a ``when`` in the past, a negative delay or NaN runs on the next
iteration; see ``_handle``); debug mode checks the thread and the callback,
records each handle's creation stack and reports slow callbacks one by one
(see ``_debug``). One difference: a deadline is rounded **up** to the wheel's
tick (1 ms by default), so a callback never runs before its deadline and at
most one tick plus the loop's own latency after it.

One line puts a program's timers on the wheel::

    asyncio.run(main(), loop_factory=tickwheel.aio.new_event_loop)      # 3.12+
    with asyncio.Runner(loop_factory=tickwheel.aio.new_event_loop) as r:  # 3.11
        r.run(main())
    tickwheel.aio.install()  # or: every new loop of the policy is one
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import os
import selectors
import sys
import warnings
from asyncio import events
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._accel import speedups
from ._debug import SlowCallbackThreshold, creation_stack
from ._handle import DebugTimerHandle, TimerHandle, loop_time
from ._timer import AsyncTimer

__all__ = ["EventLoop", "EventLoopPolicy", "install", "new_event_loop", "new_uvloop_event_loop"]

_copy_context = contextvars.copy_context


class _WheelTimers:
    """``call_later`` and ``call_at`` on one AsyncTimer: what both loop classes add to their base.

    A mixin placed before the loop class in the bases. The subclass creates
    the wheel with :meth:`_start_wheel`, says how its base arms a real timer,
    and provides ``_debug`` (the loop's debug flag) and ``_debug_checks``.
    """

    _wheel_timer: AsyncTimer
    _debug: bool

    def _start_wheel(
        self, tick_ms: int, wheel_size: int, arm: Callable[..., asyncio.TimerHandle]
    ) -> None:
        self._wheel_timer = AsyncTimer(
            tick_ms,
            wheel_size,
            loop=self,  # type: ignore[arg-type]
            loop_call_at=arm,
        )

    # The handles are tickwheel's, not asyncio.TimerHandle (see EventLoop's doc):
    # hence the ignored incompatibility with the loop base classes. Both methods
    # go straight to the timer's _add when the call needs no check beyond the
    # one line; _call_at_checked does the rest, in asyncio's order.
    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now, on the wheel. O(1).

        As ``asyncio.BaseEventLoop.call_later``: any number of seconds; ``inf``
        never fires, a negative delay runs on the next iteration. The deadline
        is rounded up to the tick.
        """
        if delay is None:
            raise TypeError("delay must not be None")
        timer = self._wheel_timer
        when = timer._time() + delay
        if when.__class__ is not float or self._debug or timer._closed or not callable(callback):
            return self._call_at_checked(when, callback, args, context, sys._getframe(1))
        if context is None:
            context = _copy_context()
        return timer._add(TimerHandle(when, callback, args, context))

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` once ``loop.time()`` reaches ``when``, on the wheel. O(1).

        As ``asyncio.BaseEventLoop.call_at``: ``when`` is any number (``inf``
        never fires); the callback runs in ``context``, or in a copy of the
        caller's context.
        """
        timer = self._wheel_timer
        if when.__class__ is not float or self._debug or timer._closed or not callable(callback):
            return self._call_at_checked(when, callback, args, context, sys._getframe(1))
        if context is None:
            context = _copy_context()
        return timer._add(TimerHandle(when, callback, args, context))

    def _call_at_checked(
        self,
        when: object,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None,
        caller: FrameType,
    ) -> TimerHandle:
        """``call_at`` with every check, in asyncio's order, and debug mode's handle.

        ``caller`` is the frame that called ``call_later`` or ``call_at``: where
        a debug handle's creation stack ends, as asyncio's does.
        """
        if when is None:
            raise TypeError("when cannot be None")
        timer = self._wheel_timer
        # close() closes the wheel first: a closed wheel is a closed loop.
        if timer._closed:
            raise RuntimeError("Event loop is closed")
        if context is None:
            context = _copy_context()
        if not self._debug:
            if not callable(callback):
                raise TypeError(f"a callable object was expected by call_at(), got {callback!r}")
            return timer._add(TimerHandle(loop_time(when), callback, args, context))
        self._debug_checks(callback)
        handle = DebugTimerHandle(loop_time(when), callback, args, context)
        handle._source_traceback = creation_stack(caller)
        return timer._add(handle)

    def _debug_checks(self, callback: object) -> None:
        """Debug mode's checks of a timer call, before anything changes: the thread, the callback.

        asyncio's own, for a loop whose base does not expose them (uvloop).
        """
        running = events._get_running_loop()
        if self.is_running() and running is not self:  # type: ignore[attr-defined, comparison-overlap]
            raise RuntimeError(
                "Non-thread-safe operation invoked on an event loop other than the current one"
            )
        if asyncio.iscoroutine(callback) or asyncio.iscoroutinefunction(callback):
            raise TypeError("coroutines cannot be used with call_at()")
        if not callable(callback):
            raise TypeError(f"a callable object was expected by call_at(), got {callback!r}")

    if not TYPE_CHECKING and speedups is not None:
        # The compiled twins: one C call per timer instead of a few Python frames.
        call_later = speedups.loop_call_later
        call_at = speedups.loop_call_at

    @property
    def slow_callback_duration(self) -> float:
        """Seconds after which debug mode reports a callback as slow (asyncio's attribute).

        The wheel reports each of its callbacks on its own (see ``_debug``).
        """
        return self._slow_callback_duration

    @slow_callback_duration.setter
    def slow_callback_duration(self, seconds: float) -> None:
        self._slow_callback_duration = SlowCallbackThreshold(seconds)

    @property
    def wheel_timer(self) -> AsyncTimer:
        """The :class:`~tickwheel.aio.AsyncTimer` holding this loop's timers. O(1)."""
        return self._wheel_timer

    def close(self) -> None:
        """Cancel the wheel's pending timers, then close the loop as its base does."""
        if self.is_running():  # type: ignore[attr-defined]
            raise RuntimeError("Cannot close a running event loop")
        self._wheel_timer.close()
        super().close()  # type: ignore[misc]


class EventLoop(_WheelTimers, asyncio.SelectorEventLoop):  # type: ignore[misc]
    """asyncio's selector event loop whose ``call_later`` and ``call_at`` use a timing wheel.

    ``tick_ms`` and ``wheel_size`` are the wheel's (see
    :class:`~tickwheel.aio.AsyncTimer`). Scheduling and cancelling a timer cost
    O(1) instead of the heap's O(log n), and a cancelled timer's memory is
    freed at once instead of at a later loop iteration. The returned handles
    are :class:`tickwheel.aio.TimerHandle`: ``cancel()``, ``cancelled()``,
    ``when()`` as asyncio's (they are not ``asyncio.TimerHandle`` instances and
    never enter ``loop._scheduled``).
    """

    def __init__(
        self,
        selector: selectors.BaseSelector | None = None,
        *,
        tick_ms: int = 1,
        wheel_size: int = 20,
    ) -> None:
        super().__init__(selector)
        self._spare_timer: asyncio.TimerHandle | None = None
        arm: Callable[..., asyncio.TimerHandle] = self._arm_real_timer
        if speedups is not None:
            # Its compiled twin, which the compiled timer calls in C.
            arm = speedups.RealTimerArm(self, super(_WheelTimers, self).call_at)
        self._start_wheel(tick_ms, wheel_size, arm)

    def _arm_real_timer(
        self, when: float, callback: Callable[[], object], *, context: contextvars.Context
    ) -> asyncio.TimerHandle:
        """Arm the wheel's one real timer: asyncio's own ``call_at``, never the overridden one.

        Only the wheel calls it, always with its ``_run_due`` and its context.
        It re-arms once per due deadline, from inside the callback of the timer
        that just fired, which asyncio has already taken off its heap. That
        handle is then pushed back with the new deadline instead of building a
        new one (``TimerHandle.__init__`` costs as much as the rest of the
        re-arm). A handle that was cancelled, or is still queued, is never
        reused, nor one made in debug mode (it keeps its creation stack). Its
        compiled twin is ``tickwheel._speedups.RealTimerArm``.
        """
        spare: Any = self._spare_timer
        if spare is not None and not (spare._scheduled or spare._cancelled or self._debug):
            if self._closed:  # type: ignore[attr-defined]
                raise RuntimeError("Event loop is closed")  # asyncio's _check_closed
            spare._when = when
            heapq.heappush(self._scheduled, spare)  # type: ignore[attr-defined]
            spare._scheduled = True
            return spare  # type: ignore[no-any-return]
        handle = super(_WheelTimers, self).call_at(when, callback, context=context)
        self._spare_timer = handle
        return handle

    def _debug_checks(self, callback: object) -> None:
        self._check_thread()  # type: ignore[attr-defined]
        self._check_callback(callback, "call_at")  # type: ignore[attr-defined]


def new_event_loop() -> EventLoop:
    """A new :class:`EventLoop`: pass it as ``loop_factory``, as with uvloop.

    Without the compiled core it says once that the drop-in then saves nothing
    (see :func:`_note_the_pure_path`).
    """
    _note_the_pure_path()
    return EventLoop()


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """asyncio's default policy, whose new loops are :class:`EventLoop`."""

    def _loop_factory(self) -> EventLoop:
        return EventLoop()


def install() -> None:
    """Make :class:`EventLoopPolicy` asyncio's policy: every new loop is an :class:`EventLoop`.

    Without the compiled core it says once that the drop-in then saves nothing.
    """
    _note_the_pure_path()
    asyncio.set_event_loop_policy(EventLoopPolicy())


_pure_path_noted = False


def _note_the_pure_path() -> None:
    """Warn once when the loops run on the pure-Python path: their timers then cost no less.

    On that path ``call_later``/``cancel`` cost about what asyncio's own loop
    costs, and a timer that fires (``asyncio.sleep``) more: the drop-in's gain
    is the compiled core's (figures in docs/aio.md, "Without the compiled core").
    """
    global _pure_path_noted
    if speedups is not None or _pure_path_noted:
        return
    _pure_path_noted = True
    if os.environ.get("TICKWHEEL_NO_EXTENSIONS"):
        why = "TICKWHEEL_NO_EXTENSIONS is set"
    else:
        why = "it was not built: there was no C compiler when tickwheel was installed"
    warnings.warn(
        f"tickwheel.aio: the compiled core is not in use ({why}). On the pure-Python "
        "path the drop-in loop's timers cost about as much as asyncio's own loop's, and "
        "more for timers that fire; see docs/aio.md",
        RuntimeWarning,
        stacklevel=3,
    )


def new_uvloop_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop whose ``call_later`` and ``call_at`` use a timing wheel (needs uvloop).

    The same drop-in as :class:`EventLoop` on ``uvloop.Loop``. uvloop's own
    ``call_at`` calls ``self.call_later``, so the wheel arms its real timer
    through ``uvloop.Loop.call_later`` itself, which libuv keeps in
    milliseconds. Raises ImportError, saying what to install, without uvloop.
    """
    global _UVLOOP_CLASS
    _note_the_pure_path()
    if _UVLOOP_CLASS is None:
        _UVLOOP_CLASS = _uvloop_class()
    loop: asyncio.AbstractEventLoop = _UVLOOP_CLASS()
    return loop


def _uvloop_class() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        raise ImportError(
            "tickwheel.aio.new_uvloop_event_loop needs uvloop: pip install uvloop"
        ) from None
    # uvloop keeps its debug flag and slow-callback threshold in C fields: the
    # threshold is read there, so it is written there, through uvloop's descriptor.
    uv_slow = next(
        vars(base)["slow_callback_duration"]
        for base in uvloop.Loop.__mro__
        if "slow_callback_duration" in vars(base)
    )

    class UVEventLoop(_WheelTimers, uvloop.Loop):  # type: ignore[misc]
        """uvloop's loop whose ``call_later`` and ``call_at`` use a timing wheel."""

        def __init__(self, *, tick_ms: int = 1, wheel_size: int = 20) -> None:
            super().__init__()
            self.slow_callback_duration = uv_slow.__get__(self)
            later = uvloop.Loop.call_later

            def arm(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
                return later(self, when - self.time(), callback, *args, **kwargs)

            self._start_wheel(tick_ms, wheel_size, arm)

        @property
        def _debug(self) -> bool:  # type: ignore[override]
            return self.get_debug()

        @property
        def slow_callback_duration(self) -> float:
            """Seconds after which debug mode reports a callback as slow (asyncio's attribute)."""
            return uv_slow.__get__(self)  # type: ignore[no-any-return]

        @slow_callback_duration.setter
        def slow_callback_duration(self, seconds: float) -> None:
            uv_slow.__set__(self, SlowCallbackThreshold(seconds))

    return UVEventLoop


_UVLOOP_CLASS: Any = None
