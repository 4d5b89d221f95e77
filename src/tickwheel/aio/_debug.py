"""asyncio's debug mode for the callbacks a wheel runs.

With ``loop.get_debug()``, asyncio's loop does three things for each handle
it runs, and tickwheel's loops do them for each callback on the wheel:

* the handle records the stack that created it (``_source_traceback``; here
  :class:`~tickwheel.aio._handle.DebugTimerHandle`), and a callback's error
  reaches the exception handler with ``source_traceback`` and ``handle``;
* the loop times the handle and warns ``Executing <handle> took N seconds``
  past ``loop.slow_callback_duration``;
* ``loop._current_handle`` is the handle running (asyncio's selector loops),
  which the default exception handler reports when an error has no handle.

The wheel runs a batch of due callbacks inside one handle of the loop, its
driver, which asyncio (and uvloop) time as a whole. So :class:`DebugRun` times
each callback, warns naming it with its own duration, and at the end of the
batch credits the callbacks' time against the loop's check of the driver:
``slow_callback_duration`` on tickwheel's loops is a
:class:`SlowCallbackThreshold`, a float that adds the credit once, in the
comparison the loop makes right after the driver returns. The driver is then
reported only if its own work was slow. Outside debug mode none of this runs.
"""

from __future__ import annotations

import asyncio
import time
from asyncio import base_events, format_helpers
from asyncio.log import logger
from collections.abc import Callable
from traceback import StackSummary
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._handle import TimerHandle

__all__ = ["DebugRun", "SlowCallbackThreshold", "creation_stack"]


def creation_stack(frame: FrameType | None) -> StackSummary:
    """The stack up to ``frame``, as asyncio's handles record it in debug mode."""
    return format_helpers.extract_stack(frame)


class SlowCallbackThreshold(float):
    """``slow_callback_duration`` of tickwheel's loops: a float that can discount one check.

    asyncio compares ``duration >= threshold`` and uvloop ``duration >
    threshold``; for a subclass of float Python asks the threshold first, so
    after :meth:`discount`, the next such comparison (the loop's check of the
    wheel's driver) is made against the threshold plus the discount, once.
    Every other use sees a plain float.
    """

    __slots__ = ("_discount",)

    def __new__(cls, seconds: float) -> SlowCallbackThreshold:
        self = super().__new__(cls, seconds)
        self._discount = 0.0
        return self

    def discount(self, seconds: float) -> None:
        """Exclude ``seconds`` (callbacks already reported on their own) from the next check."""
        self._discount = seconds

    def _threshold(self) -> float:
        discount = self._discount
        self._discount = 0.0
        return float(self) + discount

    # The reflections of asyncio's ``>=`` and uvloop's ``>``.
    def __le__(self, duration: object) -> bool:
        return self._threshold() <= duration  # type: ignore[operator]

    def __lt__(self, duration: object) -> bool:
        return self._threshold() < duration  # type: ignore[operator]


class DebugRun:
    """Runs a batch of due handles as asyncio's debug mode runs each handle (see the module doc).

    Called with each handle in turn, it reports what the callback raises to
    ``report`` (with its ``source_traceback``), times it with the loop's own
    clock and warns when it was slow; :meth:`finish` then discounts the batch's
    time from the loop's check of the driver.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        report: Callable[[TimerHandle, BaseException], None],
    ) -> None:
        self._loop = loop
        self._report = report
        # asyncio's selector loops time their handles with loop.time(), uvloop
        # with the monotonic clock (its time() stands still during an iteration).
        self._selector = isinstance(loop, asyncio.BaseEventLoop)
        self._clock: Callable[[], float] = loop.time if self._selector else time.monotonic
        self._spent = 0.0

    def __call__(self, handle: TimerHandle) -> None:
        loop: Any = self._loop
        if self._selector:
            driver = loop._current_handle
            loop._current_handle = handle
        t0 = self._clock()
        try:
            try:
                handle._run()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._report(handle, exc)
            took = self._clock() - t0
            if took >= loop.slow_callback_duration:
                logger.warning(
                    "Executing %s took %.3f seconds",
                    base_events._format_handle(handle),  # type: ignore[attr-defined]
                    took,
                )
        finally:
            self._spent += self._clock() - t0
            if self._selector:
                loop._current_handle = driver

    def finish(self) -> None:
        """Discount the callbacks' time from the loop's check of the driver (tickwheel's loops)."""
        threshold = getattr(self._loop, "slow_callback_duration", None)
        # Only while the loop still checks (a callback may have left debug mode).
        if isinstance(threshold, SlowCallbackThreshold) and self._loop.get_debug():
            threshold.discount(self._spent)
