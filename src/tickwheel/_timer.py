"""SystemTimer and SystemTimerReaper: the thread-safe timer on top of the wheel.

Ground rules
------------
* One lock per timer guards the wheels, their buckets, the delay queue and the
  task count. Kafka takes a read lock to add and a write lock to tick, with a
  monitor per bucket and per entry; under CPython one plain lock is both
  cheaper and simpler, and adds are never blocked for long because a tick only
  re-links entries.
* Tasks never run under the lock. ``advance_clock`` collects the due tasks,
  releases the lock, then hands them to the executor, so a task may add or
  cancel tasks on its own timer.
* The clock is injected. ``advance_clock(timeout_ms)`` waits on wall time only
  for a clock that is not manual; on a :class:`~tickwheel.ManualClock` it never
  waits.
* The wheel, its delay queue and the staging of adds are
  :class:`~tickwheel._timer_core.TimerCore`'s, shared with the asyncio timer:
  ``add`` stages a task that is not due, and the next ``advance_clock`` (or
  ``snapshot``) places it in the very bucket Kafka's ``add`` would have
  chosen. ``size`` and ``cancel`` treat a staged task as pending; a task
  cancelled before the next advance, the common fate of a timeout, is never
  placed at all.
* The hot half (``add``, ``schedule``, ``advance_clock``, the hand-off to the
  executor) is :class:`_SystemTimerCore`, whose compiled twin
  ``tickwheel._speedups.SystemTimerCore`` replaces it when built; the rest of
  :class:`SystemTimer` is shared by both paths.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ._accel import speedups
from ._clock import Clock, ManualClock, SystemClock, is_manual
from ._snapshot import WheelSnapshot
from ._task import TimerTask
from ._task_list import CANCELLED, TimerTaskEntry
from ._timer_core import NEVER, Lock, TimerCore

__all__ = ["Executor", "SystemTimer", "SystemTimerReaper"]

logger = logging.getLogger("tickwheel")


class Executor(Protocol):
    """Anything with ``submit(fn)``, such as ``concurrent.futures.ThreadPoolExecutor``."""

    def submit(self, fn: Callable[[], Any], /) -> Any: ...


def run_task(task: TimerTask) -> None:
    """Run ``task``, logging (not raising) an exception, so the caller keeps going."""
    try:
        task.run()
    except Exception:
        logger.exception("timer task %r raised", task)


class _ThreadExecutor:
    """One worker thread named ``executor-<name>`` (Kafka's taskExecutor), started on first use."""

    _STOP = object()

    def __init__(self, name: str) -> None:
        self.name = f"executor-{name}"
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # Guards starting and stopping the thread, not the queue (SimpleQueue is thread-safe).
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._shutdown = False

    def submit_many(self, tasks: list[TimerTask]) -> None:
        """Queue ``tasks`` for the worker thread, starting it on first use. O(len(tasks)).

        After :meth:`shutdown` the tasks run in the calling thread instead: they
        were due and their ``cancel()`` already returns False, so they must run.
        """
        with self._lock:
            if not self._shutdown:
                if self._thread is None:
                    thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                    thread.start()
                    self._thread = thread
                put = self._queue.put
                for task in tasks:
                    put(task)
                return
        for task in tasks:
            run_task(task)

    def _work(self) -> None:
        get = self._queue.get
        stop = self._STOP
        while True:
            task = get()
            if task is stop:
                return
            run_task(task)

    def shutdown(self) -> None:
        """Run what was already submitted, then stop and join the thread. Idempotent."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            thread = self._thread
            if thread is not None:
                # Under the lock: every task submitted before is queued before the stop.
                self._queue.put(self._STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread


class _SystemTimerCore(TimerCore):
    """SystemTimer's hot half: add, schedule, advance_clock and the hand-off to the executor.

    Its compiled twin is ``tickwheel._speedups.SystemTimerCore``; the rest of
    :class:`SystemTimer` (set-up, waiting, inspection, closing) is shared.
    """

    # Set by SystemTimer.__init__ (declared here for the type checker).
    name: str
    _closed: bool
    _manual: bool
    _now: Callable[[], int]
    _waiting: int
    _inline: bool
    _own_executor: _ThreadExecutor | None
    _executor: Executor | None

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to run ``task.delay_ms`` after the clock's current time.

        A task already due (expiration < the wheel's current time + tick, which
        includes ``delay_ms <= 0``) goes to the executor at once; any other is
        staged, and the next :meth:`advance_clock` places it in its bucket (see
        :class:`SystemTimer`). A cancelled task is dropped. A task already
        pending in this timer is moved. O(1).

        Raises RuntimeError after :meth:`close`, and ValueError for a task pending
        in another timer.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError(f"timer {self.name!r} is closed")
            lst = task._list
            if lst is CANCELLED:
                return
            if lst is not None and lst._lock is not self._lock:
                raise ValueError(f"{task!r} is pending in another timer; cancel it first")
            task.expiration_ms = task._delay_ms + self._now()
            if self._add_entry(task):
                if self._waiting:
                    self._wake_for(task.expiration_ms)
                return
        self._dispatch([task])

    def schedule(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> TimerTask:
        """Create a :class:`TimerTask` for ``fn(*args)`` after ``delay_ms``, add it, return it.

        The same as ``task = TimerTask(delay_ms, fn, *args); self.add(task)``.
        O(1).
        """
        task = TimerTask(delay_ms, fn, *args)
        self.add(task)
        return task

    def advance_clock(self, timeout_ms: int = 0) -> bool:
        """Run every due bucket, waiting up to ``timeout_ms`` for the first one.

        As in Kafka: wait (on wall time, and only for a clock that is not manual)
        until the first bucket is due; then, for each due bucket, advance the
        wheels to its expiration, flush it and re-insert each task, which
        cascades it to a finer level or runs it. Returns True if a bucket was
        due, False otherwise. The tasks staged since the last call are placed in
        the wheel first. O(due buckets + tasks moved + tasks staged).
        """
        due: list[TimerTaskEntry] = []
        with self._lock:
            if self._closed:
                return False
            now = self._now()
            fired = self._advance(now, due)
            if not fired and timeout_ms > 0 and not self._manual:
                fired = self._wait_for_bucket(now, timeout_ms, due)
        if due:
            self._dispatch(due)  # type: ignore[arg-type]
        return fired

    def _dispatch(self, tasks: list[TimerTask]) -> None:
        """Hand due tasks to the executor. Called without the lock held."""
        if self._inline:
            for task in tasks:
                run_task(task)
        elif self._own_executor is not None:
            self._own_executor.submit_many(tasks)
        else:
            assert self._executor is not None
            for task in tasks:
                self._executor.submit(functools.partial(run_task, task))

    # The slow paths the hot half calls, defined by SystemTimer.

    def _wait_for_bucket(self, now: int, timeout_ms: int, due: list[TimerTaskEntry]) -> bool:
        raise NotImplementedError

    def _wake_for(self, expiration_ms: int) -> None:
        raise NotImplementedError


if not TYPE_CHECKING and speedups is not None:
    _SystemTimerCore = speedups.SystemTimerCore


class SystemTimer(_SystemTimerCore):
    """Kafka's ``SystemTimer``: a hierarchical timing wheel driven by a delay queue of buckets.

    ``add`` and ``cancel`` cost O(1): ``add`` stages the task, and placing it
    in its bucket later costs O(levels), with levels logarithmic in the longest
    delay (see :class:`~tickwheel.TimingWheel`). ``advance_clock`` jumps
    straight to the next non-empty bucket, so an idle timer costs nothing and
    there are no empty ticks.

    ``executor`` runs the due tasks:

    * ``None`` (default): one worker thread named ``executor-<name>``, as in
      Kafka, started on first use and joined by :meth:`close`;
    * ``"inline"``: in the thread that calls ``add`` or ``advance_clock``, after
      the timer's lock is released (deterministic tests and event time);
    * any object with ``submit(fn)``.

    A task whose ``run`` raises is logged on the ``tickwheel`` logger; later
    tasks still run.
    """

    def __init__(
        self,
        name: str = "timer",
        tick_ms: int = 1,
        wheel_size: int = 20,
        start_ms: int | None = None,
        clock: Clock | None = None,
        executor: Executor | Literal["inline"] | None = None,
    ) -> None:
        _check_int("tick_ms", tick_ms, minimum=1)
        _check_int("wheel_size", wheel_size, minimum=2)
        if start_ms is not None:
            _check_int("start_ms", start_ms)
        self.name = name
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._now = self.clock.now_ms
        self._manual = is_manual(self.clock)
        # The compiled core reads these two clocks' time without a Python call:
        # a ManualClock's stored ms (the event-time pipeline writes that same
        # attribute), a SystemClock's monotonic time. Exact types only, so a
        # subclass overriding now_ms() is still called.
        self._manual_clock: ManualClock | None = clock if type(clock) is ManualClock else None
        self._system_clock = type(self.clock) is SystemClock
        # The one lock of this timer (see the module doc); the condition lets
        # advance_clock sleep until a bucket is due or an add stages an earlier task.
        lock = Lock()
        super().__init__(tick_ms, wheel_size, self._now() if start_ms is None else start_ms, lock)
        self._cond = threading.Condition(lock)
        self._waiting = 0
        # The earliest time (ms) a thread sleeping in this timer looks again; an
        # add staging a task due before it wakes the sleepers.
        self._wake_at_ms = NEVER
        self._interrupts = 0
        self._closed = False
        self._own_executor = None
        self._inline = False
        self._executor = None
        if executor is None:
            self._own_executor = _ThreadExecutor(name)
        elif executor == "inline":
            self._inline = True
        elif callable(getattr(executor, "submit", None)):
            self._executor = executor
        else:
            raise TypeError(f"executor must be None, 'inline' or have submit(fn), got {executor!r}")
        if self._manual:
            add_listener = getattr(self.clock, "add_listener", None)
            if add_listener is not None:
                add_listener(self._wake)

    # -- waiting ----------------------------------------------------------------

    def _wait_for_bucket(self, now: int, timeout_ms: int, due: list[TimerTaskEntry]) -> bool:
        """Sleep (lock held) until a bucket is due, the timeout ends, or an interrupt.

        Appends the due tasks to ``due``; returns True if a bucket was due.
        """
        deadline = now + timeout_ms
        interrupts = self._interrupts
        self._waiting += 1
        try:
            while True:
                wake_at = min(deadline, self._next_expiration_ms())
                self._wake_at_ms = min(self._wake_at_ms, wake_at)
                self._cond.wait((wake_at - now) / 1000.0)
                now = self._now()
                if self._advance(now, due):
                    return True
                if now >= deadline or self._closed or self._interrupts != interrupts:
                    return False
        finally:
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        """A sleeper leaves (lock held): forget its wake-up time, and let the others re-plan.

        ``_wake_at_ms`` is the earliest wake-up of all sleepers; the one leaving
        may have set it, so the rest wake up and set theirs again.
        """
        self._waiting -= 1
        self._wake_at_ms = NEVER
        if self._waiting:
            self._cond.notify_all()

    def _wake_for(self, expiration_ms: int) -> None:
        """A task expiring at ``expiration_ms`` was staged (lock held): wake sleepers it concerns.

        Kafka wakes its reaper when an add queues an earlier bucket. A staged task
        is placed only by the next advance, so wake the sleepers if the task can
        be due before the earliest of them looks again.
        """
        if expiration_ms - expiration_ms % self._wheel.tick_ms < self._wake_at_ms:
            self._cond.notify_all()

    def _wait_for_work(self, timeout_s: float) -> None:
        """For a reaper on a manual clock: sleep until the clock moves, an add, or ``timeout_s``."""
        with self._lock:
            if self._closed:
                return
            now = self._now()
            if self._next_expiration_ms() <= now:
                return
            self._waiting += 1
            # Any clock move wakes this sleeper (the clock's listener), so it looks
            # again at the next millisecond.
            self._wake_at_ms = min(self._wake_at_ms, now + 1)
            try:
                self._cond.wait(timeout_s)
            finally:
                self._stop_waiting()

    def _wake(self) -> None:
        """Wake every thread sleeping in this timer so it looks again (clock moved)."""
        with self._cond:
            self._cond.notify_all()

    def _interrupt(self) -> None:
        """Make every sleeping ``advance_clock`` return now (used to stop a reaper)."""
        with self._cond:
            self._interrupts += 1
            self._cond.notify_all()

    # -- inspection -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True after :meth:`close`. O(1)."""
        return self._closed

    @property
    def executor_thread(self) -> threading.Thread | None:
        """The worker thread this timer created, if it has started one."""
        own = self._own_executor
        return own.thread if own is not None else None

    def snapshot(self) -> WheelSnapshot:
        """An immutable picture of all levels, buckets and the queue. O(levels × buckets + n).

        Places the staged tasks first, as the next advance would.
        """
        with self._lock:
            return self._snapshot()

    def _check(self) -> None:
        """Assert every invariant: links, counters, bucket expirations, queue contents."""
        with self._lock:
            super()._check()

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Stop the timer; pending tasks never run. Idempotent.

        Wakes any thread in ``advance_clock``, then stops and joins the executor
        thread this timer created (tasks already handed to it still run).
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._own_executor is not None:
            self._own_executor.shutdown()

    def __enter__(self) -> SystemTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SystemTimer(name={self.name!r}, tick_ms={self.tick_ms}, "
            f"wheel_size={self.wheel_size}, size={self.size}, clock={self.clock!r})"
        )


class SystemTimerReaper:
    """A thread that keeps a :class:`SystemTimer` moving (Kafka's expiration reaper).

    The thread, named ``reaper-<name>``, loops ``timer.advance_clock(200)``. On a
    manual clock, where ``advance_clock`` never waits, it sleeps until the clock
    moves or an add queues a bucket instead of spinning.
    """

    WAIT_MS = 200

    def __init__(self, timer: SystemTimer, name: str | None = None) -> None:
        self.timer = timer
        self.name = f"reaper-{name if name is not None else timer.name}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        timer = self.timer
        stop = self._stop
        manual = timer._manual
        while not stop.is_set():
            try:
                fired = timer.advance_clock(self.WAIT_MS)
                if not fired and manual and not stop.is_set():
                    timer._wait_for_work(self.WAIT_MS / 1000.0)
            except Exception:
                logger.exception("reaper %s: advance_clock failed", self.name)

    def add(self, task: TimerTask) -> None:
        """Add ``task`` to the timer. O(1)."""
        self.timer.add(task)

    def schedule(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> TimerTask:
        """Schedule ``fn(*args)`` after ``delay_ms`` on the timer."""
        return self.timer.schedule(delay_ms, fn, *args)

    @property
    def size(self) -> int:
        """The timer's size. O(1)."""
        return self.timer.size

    @property
    def thread(self) -> threading.Thread:
        """The reaper thread."""
        return self._thread

    def close(self) -> None:
        """Wake the reaper at once, join it, then close the timer. Idempotent.

        Kafka wakes its reaper by adding a no-op task; here the timer's sleeping
        ``advance_clock`` is interrupted directly.
        """
        self._stop.set()
        thread = self._thread
        if thread is not threading.current_thread():
            # The reaper may be just about to sleep: interrupt until it has left.
            while thread.is_alive():
                self.timer._interrupt()
                thread.join(0.01)
        self.timer.close()

    def __enter__(self) -> SystemTimerReaper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_int(name: str, value: object, minimum: int | None = None) -> None:
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
