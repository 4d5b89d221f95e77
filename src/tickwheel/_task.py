"""TimerTask: something to run after a delay (Kafka's ``TimerTask``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._accel import speedups
from ._task_list import CANCELLED, TimerTaskEntry

__all__ = ["MAX_DELAY_MS", "TimerTask", "check_delay_ms"]


#: The largest delay, in either direction: times are int64 milliseconds on both paths.
MAX_DELAY_MS = 1 << 62


def check_delay_ms(value: object, name: str = "delay_ms") -> int:
    """Return ``value`` as an int; TypeError naming ``name`` if it is not one (or a bool).

    ValueError if it is beyond ±``MAX_DELAY_MS`` (about 146 million years).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int number of milliseconds, got {value!r}")
    if not -MAX_DELAY_MS <= value <= MAX_DELAY_MS:
        raise ValueError(f"{name} must be within ±2**62 ms, got {value!r}")
    return int(value)


class TimerTask(TimerTaskEntry):
    """A task that a timer runs once its delay has passed.

    ``TimerTask(delay_ms, fn, *args)`` runs ``fn(*args)``; a subclass may override
    :meth:`run` instead and pass no ``fn``. The delay counts from the moment the
    task is added to a timer. ``delay_ms`` may be changed before the task is
    added again.

    Adding a task that is already scheduled moves it: it leaves its bucket and
    the timer's size is unchanged (Kafka's ``setTimerTaskEntry``).
    """

    # fn and its args share one slot (the callable, or a (fn, args) pair) to keep
    # a pending timer at 80 bytes.
    __slots__ = ("_call", "_delay_ms")

    _call: Callable[[], Any] | tuple[Callable[..., Any], tuple[Any, ...]] | None

    def __init__(self, delay_ms: int, fn: Callable[..., Any] | None = None, *args: Any) -> None:
        # _next and _prev stay unset until the task is linked into a bucket;
        # nothing reads them before (every reader first checks _list).
        if type(delay_ms) is not int or not -MAX_DELAY_MS <= delay_ms <= MAX_DELAY_MS:
            delay_ms = check_delay_ms(delay_ms)  # raises, or converts an int subclass
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be callable or None, got {fn!r}")
        self._delay_ms = delay_ms
        self._call = (fn, args) if args and fn is not None else fn
        self.expiration_ms = -1
        self._list = None

    @property
    def delay_ms(self) -> int:
        """The delay in milliseconds, counted from the moment the task is added. O(1)."""
        return self._delay_ms

    @delay_ms.setter
    def delay_ms(self, value: int) -> None:
        self._delay_ms = check_delay_ms(value)

    def run(self) -> None:
        """Run the task: call ``fn(*args)``. Subclasses may override. O(1) plus ``fn``."""
        call = self._call
        if isinstance(call, tuple):
            fn, args = call
            fn(*args)
        elif call is not None:
            call()

    def cancel(self) -> bool:
        """Remove the task from its timer. O(1).

        Returns True when the task was pending and now will not run; it then stays
        cancelled, and adding it again is a no-op. Returns False when the task was
        not pending: never added, already handed to the executor, or already
        cancelled. (As in Kafka, cancelling a task that is not scheduled does
        nothing, so do not race ``cancel()`` against the first ``add()``.)
        """
        while True:
            lst = self._list
            if lst is None or lst is CANCELLED:
                return False
            # Every list of a timer shares the timer's lock. Once it is held, the
            # task may have been moved by a concurrent flush: then look again.
            with lst._lock:
                if self._list is lst:
                    lst.remove(self)
                    self._list = CANCELLED
                    return True

    @property
    def is_cancelled(self) -> bool:
        """True once :meth:`cancel` has removed this task from a timer. O(1)."""
        return self._list is CANCELLED

    @property
    def is_pending(self) -> bool:
        """True while the task sits in a timer's bucket. O(1)."""
        lst = self._list
        return lst is not None and lst is not CANCELLED

    def __repr__(self) -> str:
        return task_repr(self)


def task_repr(task: TimerTask) -> str:
    """``repr`` of a task, on both paths (the compiled twin calls this function)."""
    call = task._call
    fn = call[0] if isinstance(call, tuple) else call
    name = getattr(fn, "__qualname__", None) or repr(fn)
    state = "cancelled" if task.is_cancelled else ("pending" if task.is_pending else "idle")
    return (
        f"<{type(task).__name__} delay_ms={task._delay_ms} "
        f"expiration_ms={task.expiration_ms} {state} fn={name}>"
    )


if not TYPE_CHECKING and speedups is not None:
    from ._speedups import TimerTask
