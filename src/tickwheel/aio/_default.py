"""The running loop's default AsyncTimer, and the module functions that use it.

``tickwheel.aio.sleep``, ``timeout``, ``timeout_at``, ``wait_for``,
``call_later`` and ``call_at`` are :class:`~tickwheel.aio.AsyncTimer`'s
methods on :func:`get_timer`, the one timer each loop gets on first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ._handle import TimerHandle
from ._timeouts import Timeout
from ._timer import AsyncTimer

__all__ = ["call_at", "call_later", "get_timer", "sleep", "timeout", "timeout_at", "wait_for"]

_T = TypeVar("_T")

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
