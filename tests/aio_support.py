"""Helpers shared by the tickwheel.aio tests."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from tickwheel.aio import AsyncTimer, VirtualClockEventLoop

T = TypeVar("T")

#: Virtual seconds after which a test coroutine is abandoned (a hang in virtual time).
VIRTUAL_GUARD_S = 100_000.0


def run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop``, bounded in the loop's time (pytest-timeout bounds real time)."""

    async def guarded() -> T:
        async with asyncio.timeout(VIRTUAL_GUARD_S):
            return await coro

    return loop.run_until_complete(guarded())


def pending_loop_handles(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    """The loop's scheduled, not cancelled timer handles (CPython's asyncio)."""
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return [h for h in scheduled if not h.cancelled()]


def our_loop_handles(loop: asyncio.AbstractEventLoop, timer: AsyncTimer) -> list[Any]:
    """The pending loop timer handles that belong to ``timer``."""
    return [
        h
        for h in pending_loop_handles(loop)
        if getattr(h._callback, "__self__", None) is timer  # type: ignore[attr-defined]
    ]


def new_loop(start: float = 1000.0) -> VirtualClockEventLoop:
    """A virtual-clock loop starting at ``start`` seconds."""
    return VirtualClockEventLoop(start=start)
