"""Timeout: ``asyncio.timeout`` with its deadline on an AsyncTimer.

The semantics are ``asyncio.Timeout``'s (3.11+), state for state; only the
deadline is a :class:`~tickwheel.aio.TimerHandle` on the wheel instead of a
handle on the loop's heap. :meth:`AsyncTimer.timeout
<tickwheel.aio.AsyncTimer.timeout>` and the module's :func:`~tickwheel.aio.timeout`
make one.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, final

from ._handle import TimerHandle, check_when

__all__ = ["Timeout"]


class _Timer(Protocol):
    """What a Timeout needs of its AsyncTimer (which imports this module)."""

    _loop: asyncio.AbstractEventLoop
    _time: Callable[[], float]
    _closed: bool

    def _add(self, handle: TimerHandle) -> TimerHandle: ...


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

    def __init__(self, when: float | None, timer: _Timer) -> None:
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
            when = check_when(when)
            if self._timer._closed:
                raise RuntimeError("AsyncTimer is closed")
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
                self._handle = timer._add(TimerHandle(when, self._on_timeout, ()))

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
