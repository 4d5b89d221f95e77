"""TimerHandle: a callback kept on an AsyncTimer, and the arithmetic of its deadline.

A deadline is a time of the loop's clock (``loop.time()``, float seconds);
the wheel keeps integer milliseconds. :func:`ceil_ms` rounds a deadline up
to the millisecond, exactly in float arithmetic, so that a callback never
runs before its deadline; :func:`floor_ms` rounds the loop's time down.

What a deadline may be
----------------------
asyncio's loops take any real number as a deadline, and so do tickwheel's:
``inf`` never comes due, a huge finite deadline is simply far away, and a
deadline in the past (``-inf`` included) runs on the next iteration. So does
``NaN``, which asyncio's loop runs once it reaches the top of its heap (at
once when nothing else is pending). :func:`loop_time` takes what asyncio
takes. :class:`~tickwheel.aio.AsyncTimer`'s own methods are stricter
(:func:`check_delay`, :func:`check_when`): a NaN deadline and a negative
delay are errors there.
"""

from __future__ import annotations

import contextvars
import math
from asyncio import format_helpers
from collections.abc import Callable
from traceback import StackSummary
from typing import TYPE_CHECKING, Any

from .._accel import speedups
from .._task_list import CANCELLED, TimerTaskEntry

__all__ = [
    "DebugTimerHandle",
    "TimerHandle",
    "ceil_ms",
    "check_delay",
    "check_when",
    "floor_ms",
    "handle_repr",
    "loop_time",
]

_ceil = math.ceil
_floor = math.floor


def check_delay(delay: object, name: str = "delay") -> float:
    """``delay`` as a float; TypeError if not a number, ValueError if negative or NaN.

    The check of :class:`~tickwheel.aio.AsyncTimer`'s own methods: ``inf``
    (never) is accepted, as by asyncio.
    """
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {delay!r}")
    value = float(delay)
    if not value >= 0.0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {delay!r}")
    return value


def check_when(when: object, name: str = "when") -> float:
    """``when`` as a float; TypeError if not a number, ValueError if NaN.

    The check of :class:`~tickwheel.aio.AsyncTimer`'s own methods: ``inf``
    (never) and a time in the past are accepted, as by asyncio.
    """
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        raise TypeError(f"{name} must be a loop time in seconds, got {when!r}")
    value = float(when)
    if value != value:
        raise ValueError(f"{name} must be a loop time, not NaN")
    return value


def loop_time(when: object) -> float:
    """``when`` as a float, for the event loops' ``call_at``: any number asyncio takes.

    That is anything ``float()`` takes as a number (``int``, ``Fraction``,
    ``Decimal``, NumPy's floats; not a string). Anything else raises TypeError,
    where asyncio's loop raises it when it first compares the deadline.
    """
    kind = type(when)
    if kind is float:
        return when  # type: ignore[return-value]
    if isinstance(when, (str, bytes, bytearray)) or not (
        hasattr(kind, "__float__") or hasattr(kind, "__index__")
    ):
        raise TypeError(f"call_at() needs a loop time in seconds, got {when!r}")
    return float(when)  # type: ignore[arg-type]


def ceil_ms(when: float) -> int:
    """The smallest integer ``m`` with ``m / 1000 >= when`` (exact in float arithmetic)."""
    m = _ceil(when * 1000.0)
    if m / 1000 < when:
        m += 1
    elif (m - 1) / 1000 >= when:
        m -= 1
    return m


def floor_ms(now: float) -> int:
    """The largest integer ``m`` with ``m / 1000 <= now`` (exact in float arithmetic)."""
    m = _floor(now * 1000.0)
    if m / 1000 > now:
        m -= 1
    elif (m + 1) / 1000 <= now:
        m += 1
    return m


class TimerHandle(TimerTaskEntry):
    """A callback scheduled on an :class:`~tickwheel.aio.AsyncTimer`, like ``asyncio.TimerHandle``.

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
    #: The stack that created the handle, in debug mode (:class:`DebugTimerHandle`).
    _source_traceback: StackSummary | None = None

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        context: contextvars.Context | None = None,
    ) -> None:
        # _next and _prev stay unset until the handle is linked into a list, as
        # in TimerTask: every reader checks _list first.
        self.expiration_ms = -1
        self._list = None
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


class DebugTimerHandle(TimerHandle):
    """A :class:`TimerHandle` made in debug mode: it keeps the stack that created it.

    ``_source_traceback`` is what asyncio's handles record with
    ``loop.get_debug()``; the exception handler prints it. A subclass, so that
    outside debug mode a handle is no bigger.
    """

    __slots__ = ("_source_traceback",)


# Written once, as functions: the compiled twin's methods call them.


def handle_repr(handle: TimerHandle) -> str:
    """``repr`` of a handle, as asyncio's: state, deadline, callback and where it was made."""
    info = ["TimerHandle"]
    if handle._list is CANCELLED:
        info.append("cancelled")
    info.append(f"when={handle._when}")
    if handle._callback is not None:
        info.append(format_helpers._format_callback_source(handle._callback, handle._args or ()))
    source = handle._source_traceback
    if source:
        frame = source[-1]
        info.append(f"created at {frame[0]}:{frame[1]}")
    return f"<{' '.join(info)}>"


if not TYPE_CHECKING and speedups is not None:
    from .._speedups import DebugTimerHandle, TimerHandle
