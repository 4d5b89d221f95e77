"""EventLoop: asyncio's selector event loop with every timer on one timing wheel.

``loop.call_later`` and ``loop.call_at`` are what ``asyncio.sleep``,
``asyncio.timeout``, ``asyncio.wait_for`` and most libraries' timeouts call.
This loop sends them to one :class:`~tickwheel.aio.AsyncTimer`, which keeps
them in a hierarchical timing wheel and holds one real timer of the loop,
armed through the base class's ``call_at`` (the loop's own heap then holds
one timer, not one per timeout). Everything else (``call_soon``, I/O,
signals, subprocesses, executors, debug mode) is asyncio's, untouched.

Semantics, as asyncio's: a callback runs in a copy of the caller's context
(or the ``context`` given); a ``when`` in the past runs on the next
iteration; ``delay`` may be negative. One difference: a deadline is rounded
**up** to the wheel's tick (1 ms by default), so a callback never runs before
its deadline and at most one tick plus the loop's own latency after it.

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
import selectors
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._accel import speedups

if TYPE_CHECKING:
    from .aio import AsyncTimer, TimerHandle

#: tickwheel.aio's AsyncTimer and its check of a loop time, bound by aio.py, which
#: imports this module at its end (the import cannot go the other way: aio
#: re-exports this module's names).
_timer_class: type[AsyncTimer] | None = None


def _check_when(when: object) -> float:
    raise AssertionError("unreachable: a loop's _start_wheel loads tickwheel.aio, which rebinds it")


__all__ = ["EventLoop", "EventLoopPolicy", "install", "new_event_loop", "new_uvloop_event_loop"]


class _WheelTimers:
    """``call_later`` and ``call_at`` on one AsyncTimer: what both loop classes add to their base.

    A mixin placed before the loop class in the bases. The subclass creates
    the wheel with :meth:`_start_wheel` and says how its base arms a real timer.
    """

    _wheel_timer: AsyncTimer

    def _start_wheel(
        self, tick_ms: int, wheel_size: int, arm: Callable[..., asyncio.TimerHandle]
    ) -> None:
        if _timer_class is None:
            from . import aio  # noqa: F401  (it binds _timer_class and _check_when; see aio.py)
        assert _timer_class is not None
        self._wheel_timer = _timer_class(
            tick_ms,
            wheel_size,
            loop=self,  # type: ignore[arg-type]
            loop_call_at=arm,
        )

    # The handles are tickwheel's, not asyncio.TimerHandle (see EventLoop's doc):
    # hence the ignored incompatibility with the loop base classes.
    def call_later(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` ``delay`` seconds from now, on the wheel. O(1).

        As ``asyncio.BaseEventLoop.call_later``; the deadline is rounded up to
        the tick.
        """
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self.time() + delay, callback, *args, context=context)  # type: ignore[attr-defined]

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """Run ``callback(*args)`` once ``loop.time()`` reaches ``when``, on the wheel. O(1).

        As ``asyncio.BaseEventLoop.call_at``: the callback runs in ``context``,
        or in a copy of the caller's context.
        """
        if when is None:
            raise TypeError("when cannot be None")
        when = _check_when(when)
        timer = self._wheel_timer
        # close() closes the wheel first: a closed wheel is a closed loop.
        if timer._closed:
            raise RuntimeError("Event loop is closed")
        if self.get_debug():  # type: ignore[attr-defined]
            self._debug_checks(callback)
        elif not callable(callback):
            raise TypeError(f"a callable object was expected by call_at(), got {callback!r}")
        if context is None:
            context = contextvars.copy_context()
        # The checks are done: the timer's own call_at would repeat them.
        return timer._schedule(when, callback, args, context)

    def _debug_checks(self, callback: object) -> None:
        """Debug mode's checks of a timer call: the loop's thread, and the callback."""
        if asyncio.iscoroutine(callback) or asyncio.iscoroutinefunction(callback):
            raise TypeError("coroutines cannot be used with call_at()")
        if not callable(callback):
            raise TypeError(f"a callable object was expected by call_at(), got {callback!r}")

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


if not TYPE_CHECKING and speedups is not None:
    # The compiled twins: one C call per timer instead of a few Python frames.
    _WheelTimers.call_later = speedups.loop_call_later
    _WheelTimers.call_at = speedups.loop_call_at


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

        The wheel re-arms it once per due deadline, from inside the callback of
        the timer that just fired, which asyncio has already taken off its
        heap. That handle is then pushed back with the new deadline instead of
        building a new one (``TimerHandle.__init__`` costs as much as the rest
        of the re-arm). A handle that was cancelled, or is still queued, is
        never reused. Its compiled twin is ``tickwheel._speedups.RealTimerArm``.
        """
        spare = self._spare_timer
        if (
            spare is not None
            and not spare._scheduled  # type: ignore[attr-defined]
            and not spare._cancelled
            and spare._callback == callback  # type: ignore[attr-defined]
            and spare._context is context  # type: ignore[attr-defined]
            and not self._debug  # type: ignore[attr-defined]
        ):
            self._check_closed()  # type: ignore[attr-defined]
            spare._when = when  # type: ignore[attr-defined]
            heapq.heappush(self._scheduled, spare)  # type: ignore[attr-defined]
            spare._scheduled = True  # type: ignore[attr-defined]
            return spare
        handle = super(_WheelTimers, self).call_at(when, callback, context=context)
        self._spare_timer = handle
        return handle

    def _debug_checks(self, callback: object) -> None:
        self._check_thread()  # type: ignore[attr-defined]
        self._check_callback(callback, "call_at")  # type: ignore[attr-defined]


def new_event_loop() -> EventLoop:
    """A new :class:`EventLoop`: pass it as ``loop_factory``, as with uvloop."""
    return EventLoop()


class EventLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """asyncio's default policy, whose new loops are :class:`EventLoop`."""

    def _loop_factory(self) -> EventLoop:
        return EventLoop()


def install() -> None:
    """Make :class:`EventLoopPolicy` asyncio's policy: every new loop is an :class:`EventLoop`."""
    asyncio.set_event_loop_policy(EventLoopPolicy())


def new_uvloop_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop whose ``call_later`` and ``call_at`` use a timing wheel (needs uvloop).

    The same drop-in as :class:`EventLoop` on ``uvloop.Loop``. uvloop's own
    ``call_at`` calls ``self.call_later``, so the wheel arms its real timer
    through ``uvloop.Loop.call_later`` itself, which libuv keeps in
    milliseconds. Raises ImportError, saying what to install, without uvloop.
    """
    global _UVLOOP_CLASS
    if _UVLOOP_CLASS is None:
        try:
            import uvloop
        except ImportError:
            raise ImportError(
                "tickwheel.aio.new_uvloop_event_loop needs uvloop: pip install uvloop"
            ) from None

        class UVEventLoop(_WheelTimers, uvloop.Loop):  # type: ignore[misc]
            """uvloop's loop whose ``call_later`` and ``call_at`` use a timing wheel."""

            def __init__(self, *, tick_ms: int = 1, wheel_size: int = 20) -> None:
                super().__init__()
                later = uvloop.Loop.call_later

                def arm(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
                    return later(self, when - self.time(), callback, *args, **kwargs)

                self._start_wheel(tick_ms, wheel_size, arm)

        _UVLOOP_CLASS = UVEventLoop
    loop: asyncio.AbstractEventLoop = _UVLOOP_CLASS()
    return loop


_UVLOOP_CLASS: Any = None
