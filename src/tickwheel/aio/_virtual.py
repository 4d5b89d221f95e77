"""An asyncio event loop whose clock jumps instead of sleeping (for tests and benchmarks)."""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["VirtualClockEventLoop"]


class _JumpingSelector(selectors.BaseSelector):
    """Wraps a real selector: polls it without blocking, then jumps the loop's clock.

    When the loop would sleep until its next timer, the clock is set to exactly
    that timer's deadline (no float sum, so the timer is always due), and the
    real selector is only polled. With nothing scheduled it blocks for real, so
    I/O and ``call_soon_threadsafe`` still work.
    """

    def __init__(self, loop: VirtualClockEventLoop, real: selectors.BaseSelector) -> None:
        self._loop = loop
        self._real = real

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            return self._real.select(None)
        events = self._real.select(0)
        if not events and timeout > 0:
            self._loop._jump_to_next_timer()
        return events

    def close(self) -> None:
        self._real.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()


class VirtualClockEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop with a virtual clock that auto-jumps to the next timer.

    ``time()`` returns a virtual time, starting at ``start``. The clock moves
    only when the test calls :meth:`advance` / :meth:`set_time`, or when the
    loop has nothing ready and would sleep until its earliest timer: it then
    jumps to exactly that timer's deadline without sleeping. A 30 s workload
    thus runs in CPU time only, identically for every timer service on the
    loop. With no timer pending, it waits for I/O in real time; with one
    pending, I/O that is not ready at once does not hold the jump back, so it
    suits timer workloads, not timing real I/O.

    As on a real loop, asyncio runs a timer once its deadline is below
    ``time() + clock_resolution`` (1 ns), so keep ``start`` below about 10**6 s
    for the jump to make the timer due. It relies on
    ``BaseEventLoop._scheduled`` (CPython's asyncio, 3.11 to 3.13).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_time = float(start)
        super().__init__(_JumpingSelector(self, selectors.DefaultSelector()))

    def time(self) -> float:
        """The virtual time in seconds. O(1)."""
        return self._virtual_time

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0). O(1)."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        self._virtual_time += seconds

    def set_time(self, when: float) -> None:
        """Set the clock to ``when``; it never moves backwards. O(1)."""
        if not when >= self._virtual_time:
            raise ValueError(f"time must not go backwards: {when!r} < {self._virtual_time!r}")
        self._virtual_time = when

    def _jump_to_next_timer(self) -> None:
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        if scheduled:
            when = scheduled[0].when()
            if when > self._virtual_time:
                self._virtual_time = when
