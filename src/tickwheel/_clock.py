"""Clocks: where every timer in tickwheel reads the time.

Ground rules
------------
* Time is integer milliseconds on a clock that never goes backwards.
* Nothing in tickwheel reads time behind your back: every timer, purgatory and
  pipeline component takes a clock, so tests and event-time jobs can drive it.
* :class:`SystemClock` is Kafka's ``Time.SYSTEM.hiResClockMs``: a monotonic,
  high-resolution clock, never wall time, so an NTP step cannot fire or stall
  timers.
* :class:`ManualClock` moves only when told to. Timers on a manual clock never
  wait on wall time; a thread blocked on one (a reaper) is woken when the clock
  moves.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What a timer needs from a clock: the current time in integer milliseconds."""

    def now_ms(self) -> int:
        """Return the current time in milliseconds; never smaller than a previous reading."""
        ...


class SystemClock:
    """A monotonic high-resolution clock in milliseconds (Kafka's ``hiResClockMs``).

    The origin is arbitrary (usually boot time); only differences are meaningful.
    """

    __slots__ = ()

    #: Timers wait on wall time for this clock.
    manual = False

    def now_ms(self) -> int:
        """Return ``time.monotonic_ns() // 1_000_000``. O(1).

        ``SystemTimer`` computes this same expression inline for an exact
        ``SystemClock`` (saving a Python call per add); keep the two in step.
        """
        return time.monotonic_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that moves only when told to: for tests and for event time.

    It is the public test double for tickwheel timers (as ``trio.testing.MockClock``
    is for trio), so you can test your own timer code deterministically::

        clock = ManualClock(start_ms=0)
        timer = SystemTimer(clock=clock, executor="inline")
        timer.schedule(50, print, "fired")
        clock.advance(50)
        timer.advance_clock(0)   # prints "fired"

    The clock is thread-safe. Moving it wakes any thread that is blocked waiting
    for it to move (see :meth:`wait_for_change`), such as a reaper thread.
    """

    __slots__ = ("__weakref__", "_changed", "_listeners", "_now_ms")

    #: Timers never wait on wall time for this clock.
    manual = True

    def __init__(self, start_ms: int = 0) -> None:
        _check_ms("start_ms", start_ms)
        _check_time("start_ms", start_ms)
        self._now_ms = start_ms
        # One condition both guards the time and lets threads sleep until it moves.
        self._changed = threading.Condition(threading.Lock())
        self._listeners: list[weakref.WeakMethod[Callable[[], None]]] = []

    def now_ms(self) -> int:
        """Return the current manual time in milliseconds. O(1).

        ``_now_ms`` is part of the package's internal contract: ``SystemTimer``
        reads it directly for an exact ``ManualClock`` (no call per add), and
        the event-time pipeline writes it. A subclass that overrides this
        method is always called instead.
        """
        return self._now_ms

    def set(self, ms: int) -> None:
        """Move the clock to ``ms``.

        Raises :class:`ValueError` if ``ms`` is earlier than the current time or
        outside [0, 2**62) (:data:`MAX_TIME_MS`), and :class:`TypeError` if it is
        not an int. O(listeners).
        """
        _check_ms("ms", ms)
        _check_time("ms", ms)
        with self._changed:
            if ms < self._now_ms:
                raise ValueError(
                    f"ManualClock cannot move backwards: now_ms={self._now_ms}, requested {ms}"
                )
            self._now_ms = ms
            self._changed.notify_all()
            listeners = list(self._listeners)
        # Listeners take their own locks; call them without holding ours.
        for ref in listeners:
            callback = ref()
            if callback is None:
                with self._changed:
                    if ref in self._listeners:
                        self._listeners.remove(ref)
            else:
                callback()

    def advance(self, ms: int) -> int:
        """Move the clock forward by ``ms`` (>= 0) and return the new time.

        Raises :class:`ValueError` for a negative step, or one that would take the
        time to 2**62 or beyond (:data:`MAX_TIME_MS`). O(listeners).
        """
        _check_ms("ms", ms)
        if ms < 0:
            raise ValueError(f"ManualClock cannot move backwards: advance({ms})")
        with self._changed:
            now = self._now_ms
        target = now + ms
        _check_time(f"now_ms + ms ({now} + {ms})", target)
        self.set(target)
        return target

    def wait_for_change(self, since_ms: int, timeout_s: float) -> bool:
        """Block until the time differs from ``since_ms``, or ``timeout_s`` wall seconds pass.

        Returns True if the clock moved. Used by threads that must not spin on a
        clock that only a test moves.
        """
        with self._changed:
            return self._changed.wait_for(lambda: self._now_ms != since_ms, timeout_s)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call the bound method ``callback`` (held weakly) after every move of the clock."""
        with self._changed:
            self._listeners.append(weakref.WeakMethod(callback))

    def __repr__(self) -> str:
        return f"ManualClock(now_ms={self._now_ms})"


#: A manual clock's times lie in [0, MAX_TIME_MS) (about 146 million years): not
#: negative, as Kafka's clock never is (a bucket's -1 means "no expiration"), and small
#: enough that a time plus any delay a timer takes (±``MAX_DELAY_MS``, the same bound)
#: is an int64, as the compiled core keeps it.
MAX_TIME_MS = 1 << 62


def _check_ms(name: str, value: object) -> None:
    """Reject anything but a plain int (bool included) with a message naming ``name``."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be an int number of milliseconds, got {value!r}")


def _check_time(name: str, value: int) -> None:
    if not 0 <= value < MAX_TIME_MS:
        raise ValueError(f"{name} must lie in [0, 2**62) ms, got {value}")


def is_manual(clock: Clock) -> bool:
    """True when timers on ``clock`` must not wait on wall time."""
    return bool(getattr(clock, "manual", False))
