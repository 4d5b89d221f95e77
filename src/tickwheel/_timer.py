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
* Adds are *staged* (as Netty's ``HashedWheelTimer`` queues new timeouts and
  moves them to their buckets on the next tick): ``add`` links a task that is
  not due at the tail of one staging list, and the next ``advance_clock`` (or
  ``snapshot``) places the staged tasks in the wheel with
  :meth:`TimingWheel.add_all <tickwheel.TimingWheel.add_all>`, before the wheel
  moves. The wheel does not move in between, so each task lands in the very
  bucket Kafka's ``add`` would have chosen, in the same order; ``size`` and
  ``cancel`` treat a staged task as pending. A task cancelled before the next
  advance, the common fate of a timeout, is never placed at all.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from heapq import heappop, heappush
from time import monotonic_ns as _monotonic_ns
from typing import Any, Literal, Protocol

from ._clock import Clock, ManualClock, SystemClock, is_manual
from ._delay_queue import BucketDelayQueue
from ._snapshot import BucketSnapshot, LevelSnapshot, WheelSnapshot
from ._task import TimerTask, check_delay_ms
from ._task_list import CANCELLED, TaskCounter, TimerTaskEntry, TimerTaskList
from ._wheel import TimingWheel

__all__ = ["Executor", "SystemTimer", "SystemTimerReaper"]

logger = logging.getLogger("tickwheel")

# Creates a TimerTask without calling __init__: ``schedule`` sets its slots itself.
_new_task = TimerTask.__new__

# The "no time" for the earliest staged expiration and a sleeper's wake-up time.
_NEVER = 1 << 80


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


class SystemTimer:
    """Kafka's ``SystemTimer``: a hierarchical timing wheel driven by a delay queue of buckets.

    ``add`` and ``cancel`` cost O(1): ``add`` stages the task, and placing it
    in its bucket later costs O(levels), with levels logarithmic in the longest
    delay (see the module doc). ``advance_clock`` jumps
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
        # The insertion hot paths read the time without a Python call when they
        # can: a ManualClock's stored ms directly (the event-time pipeline writes
        # that same attribute), a SystemClock's monotonic_ns() inline. Exact
        # types only, so a subclass overriding now_ms() is still called.
        self._manual_clock: ManualClock | None = clock if type(clock) is ManualClock else None
        self._system_clock = type(self.clock) is SystemClock
        # The one lock of this timer (see the module doc); the condition lets
        # advance_clock sleep until a bucket is due or an add queues an earlier one.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._counter = TaskCounter()
        self._queue = BucketDelayQueue()
        self._wheel = TimingWheel(
            tick_ms,
            wheel_size,
            self._now() if start_ms is None else start_ms,
            self._counter,
            self._queue,
            self._lock,
        )
        # Added tasks not yet placed in the wheel (see the module doc). The list
        # shares the timer's lock and counter, so cancel() treats it as a bucket.
        self._staged = TimerTaskList(self._counter, self._lock, level=-1)
        self._staged_root = self._staged._root
        # The earliest expiration ever staged since the last placement (cancels
        # do not raise it): when a staged task can be due at the earliest.
        self._staged_min_ms = _NEVER
        self._waiting = 0
        # The earliest time (ms) a thread sleeping in this timer looks again; an
        # add staging a task due before it wakes the sleepers.
        self._wake_at_ms = _NEVER
        self._interrupts = 0
        self._closed = False
        self._own_executor: _ThreadExecutor | None = None
        self._inline = False
        self._executor: Executor | None = None
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

    # -- adding -----------------------------------------------------------

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` to run ``task.delay_ms`` after the clock's current time.

        A task already due (expiration < the wheel's current time + tick, which
        includes ``delay_ms <= 0``) goes to the executor at once; any other is
        staged, and the next :meth:`advance_clock` places it in its bucket (see
        the module doc). A cancelled task is dropped. A task already pending in
        this timer is moved. O(1).

        Raises RuntimeError after :meth:`close`, and ValueError for a task pending
        in another timer.
        """
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise RuntimeError(f"timer {self.name!r} is closed")
            lst = task._list
            if lst is not None:
                if lst is CANCELLED:
                    return
                if lst._lock is not lock:
                    raise ValueError(f"{task!r} is pending in another timer; cancel it first")
            clock = self._manual_clock
            if clock is not None:
                expiration = task._delay_ms + clock._now_ms
            elif self._system_clock:
                expiration = task._delay_ms + _monotonic_ns() // 1_000_000
            else:
                expiration = task._delay_ms + self._now()
            task.expiration_ms = expiration
            if expiration >= self._wheel._tick_end_ms:
                # Not due: stage it (TimerTaskList.add on the staging list, inlined).
                if lst is None:
                    self._counter.value += 1
                else:  # a move: unlink from the old list; the size is unchanged
                    nxt = task._next
                    prev = task._prev
                    nxt._prev = prev  # type: ignore[union-attr]
                    prev._next = nxt  # type: ignore[union-attr]
                root = self._staged_root
                tail = root._prev
                task._next = root
                task._prev = tail
                task._list = self._staged
                tail._next = task  # type: ignore[union-attr]
                root._prev = task
                if expiration < self._staged_min_ms:
                    self._staged_min_ms = expiration
                    if self._waiting:
                        self._wake_for(expiration)
                return
            if lst is not None:
                lst.remove(task)
        finally:
            lock.release()
        self._dispatch([task])

    def schedule(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> TimerTask:
        """Create a :class:`TimerTask` for ``fn(*args)`` after ``delay_ms``, add it, return it.

        The same as ``task = TimerTask(delay_ms, fn, *args); self.add(task)``.
        O(1).
        """
        if delay_ms.__class__ is not int:
            delay_ms = check_delay_ms(delay_ms)
        if fn is not None and not callable(fn):
            raise TypeError(f"fn must be callable or None, got {fn!r}")
        # TimerTask.__init__ and add(), inlined on purpose: this is the hottest
        # path of the library, and a Python call costs ~50 ns on CPython 3.11.
        # The task is brand new, so it cannot be cancelled, pending or in
        # another timer, and add()'s checks for those are skipped. Keep the
        # insertion below in step with add()
        # (test_schedule_places_tasks_exactly_like_add compares the two).
        task = _new_task(TimerTask)
        task._delay_ms = delay_ms
        task._call = (fn, args) if args and fn is not None else fn
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise RuntimeError(f"timer {self.name!r} is closed")
            clock = self._manual_clock
            if clock is not None:
                expiration = delay_ms + clock._now_ms
            elif self._system_clock:
                expiration = delay_ms + _monotonic_ns() // 1_000_000
            else:
                expiration = delay_ms + self._now()
            task.expiration_ms = expiration
            if expiration >= self._wheel._tick_end_ms:
                self._counter.value += 1
                root = self._staged_root
                tail = root._prev
                task._next = root
                task._prev = tail
                task._list = self._staged
                tail._next = task  # type: ignore[union-attr]
                root._prev = task
                if expiration < self._staged_min_ms:
                    self._staged_min_ms = expiration
                    if self._waiting:
                        self._wake_for(expiration)
                return task
            task._list = None
        finally:
            lock.release()
        self._dispatch([task])
        return task

    # -- the clock ----------------------------------------------------------

    def advance_clock(self, timeout_ms: int = 0) -> bool:
        """Run every due bucket, waiting up to ``timeout_ms`` for the first one.

        As in Kafka: wait (on wall time, and only for a clock that is not manual)
        until the first bucket is due; then, for each due bucket, advance the
        wheels to its expiration, flush it and re-insert each task, which
        cascades it to a finer level or runs it. Returns True if a bucket was
        due, False otherwise. First the tasks staged since the last call are
        placed in the wheel (see the module doc). O(due buckets + tasks moved +
        tasks staged).
        """
        queue_ = self._queue
        staged_root = self._staged_root
        if (timeout_ms <= 0 or self._manual) and staged_root._next is staged_root:
            # Nothing due: answer without the lock (an event-time loop calls this
            # once per event). A racing add can only make a bucket due that a
            # call an instant earlier would have missed too.
            clock = self._manual_clock
            try:
                if queue_._heap[0][0] > (clock._now_ms if clock is not None else self._now()):
                    return False
            except IndexError:  # empty, or emptied by another thread meanwhile
                return False
        to_run: list[TimerTaskEntry] = []
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                return False
            clock = self._manual_clock
            now = clock._now_ms if clock is not None else self._now()
            if staged_root._next is not staged_root:
                to_run = self._place_staged(now)
            bucket = queue_.poll(now)
            if bucket is None and not to_run:
                if timeout_ms <= 0 or self._manual:
                    return False
                bucket, now = self._wait_for_bucket(now, timeout_ms)
                if bucket is None:
                    return False
            if bucket is not None:
                self._drain(bucket, now, to_run)
            # Only due tasks went to to_run: they are the ones that left the wheel.
            self._counter.value -= len(to_run)
        finally:
            lock.release()
        if to_run:
            self._dispatch(to_run)  # type: ignore[arg-type]
        return True

    def _drain(self, bucket: TimerTaskList, now: int, to_run: list[TimerTaskEntry]) -> None:
        """Flush ``bucket`` and every other bucket due at ``now`` (lock held); collect due tasks.

        Each flushed bucket advances the wheels to its expiration and re-inserts
        its tasks: each cascades to a finer level, or is due and goes to
        ``to_run``.

        The loop is ``while True`` with a break at its end, not ``while bucket
        is not None``. CPython 3.11 specialises a function's bytecode once it
        has warmed up, counting calls and *unconditional* backward jumps only;
        a conditional loop (``POP_JUMP_BACKWARD_IF_*``) never counts. This is
        called once per advance, so in the conditional form one long drain ran
        unspecialised, at about half speed (2.6 vs 1.6 µs per fired task on
        the timer benchmark). CPython 3.12 compiles every loop with
        ``JUMP_BACKWARD``, so the form costs nothing there.
        """
        wheel = self._wheel
        append = to_run.append
        # The delay queue's offer and poll, inlined (BucketDelayQueue is a heap
        # of (expiration, seq, bucket)).
        queue_ = self._queue
        heap = queue_._heap
        seq = queue_._seq
        while True:
            expiration = bucket._expiration_ms
            # TimingWheel.advance_clock (and _set_current), inlined.
            level: TimingWheel | None = wheel
            while level is not None and expiration >= level._tick_end_ms:
                expiration -= expiration % level.tick_ms
                level.current_time_ms = expiration
                level._tick_end_ms = expiration + level.tick_ms
                level._end_ms = expiration + level.interval_ms
                level = level.overflow_wheel
            # TimerTaskList.flush and TimingWheel.add, inlined: walk the
            # bucket once and move each entry straight to its new place.
            root = bucket._root
            node = root._next
            root._next = root._prev = root
            bucket._expiration_ms = -1
            if bucket.level == 0:
                # The finest level was just advanced to this bucket's start,
                # so every one of its tasks is due.
                while node is not root:
                    nxt = node._next  # type: ignore[union-attr]
                    node._next = node._prev = node._list = None  # type: ignore[union-attr]
                    append(node)  # type: ignore[arg-type]
                    node = nxt
            else:
                # Each entry cascades to a finer level (never this one: the
                # wheels now start at this bucket's expiration) or is due.
                first_tick = wheel._tick_end_ms
                while node is not root:
                    nxt = node._next  # type: ignore[union-attr]
                    expiration = node.expiration_ms  # type: ignore[union-attr]
                    if expiration < first_tick:
                        node._next = node._prev = node._list = None  # type: ignore[union-attr]
                        append(node)  # type: ignore[arg-type]
                    else:
                        lower = wheel
                        while expiration >= lower._end_ms:
                            lower = lower.overflow_wheel  # type: ignore[assignment]
                        tick = lower.tick_ms
                        virtual_id = expiration // tick
                        target = lower.buckets[virtual_id % lower.wheel_size]
                        troot = target._root
                        tail = troot._prev
                        node._next = troot  # type: ignore[union-attr]
                        node._prev = tail  # type: ignore[union-attr]
                        node._list = target  # type: ignore[union-attr]
                        tail._next = node  # type: ignore[union-attr]
                        troot._prev = node
                        expiration = virtual_id * tick
                        if target._expiration_ms != expiration:
                            target._expiration_ms = expiration
                            heappush(heap, (expiration, next(seq), target))
                    node = nxt
            if heap and heap[0][0] <= now:
                bucket = heappop(heap)[2]
            else:
                break

    def _wait_for_bucket(self, now: int, timeout_ms: int) -> tuple[Any, int]:
        """Sleep (lock held by caller) until a bucket is due, the timeout ends, or an interrupt."""
        queue_ = self._queue
        deadline = now + timeout_ms
        interrupts = self._interrupts
        self._waiting += 1
        try:
            while True:
                head = queue_.head_expiration_ms()
                wake_at = deadline if head is None or head > deadline else head
                if wake_at < self._wake_at_ms:
                    self._wake_at_ms = wake_at
                self._cond.wait((wake_at - now) / 1000.0)
                now = self._now()
                self._place_all_staged()
                bucket = queue_.poll(now)
                if (
                    bucket is not None
                    or now >= deadline
                    or self._closed
                    or self._interrupts != interrupts
                ):
                    return bucket, now
        finally:
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        """A sleeper leaves (lock held): forget its wake-up time, and let the others re-plan.

        ``_wake_at_ms`` is the earliest wake-up of all sleepers; the one leaving
        may have set it, so the rest wake up and set theirs again.
        """
        self._waiting -= 1
        self._wake_at_ms = _NEVER
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

    def _place_staged(self, now: int) -> list[TimerTaskEntry]:
        """Place the staged tasks in the wheel (lock held); return those to run at once.

        Usually that is :meth:`TimingWheel.add_all` and an empty list. One case is
        cut short, a burst: every staged task has the same expiration, which is
        due by ``now`` and within the finest level, and no bucket is due yet.
        Kafka would put them all in one finest bucket, then flush it at once,
        in order, as the only due bucket. So they go straight from the staging
        list to the run list, and the wheels advance to that bucket as the flush
        would have. O(tasks staged).
        """
        staged = self._staged
        root = self._staged_root
        wheel = self._wheel
        heap = self._queue._heap
        first = root._next
        assert first is not None
        expiration = first.expiration_ms
        bucket_ms = expiration - expiration % wheel.tick_ms
        if expiration < wheel._end_ms and bucket_ms <= now and (not heap or heap[0][0] > now):
            due: list[TimerTaskEntry] = []
            append = due.append
            node: TimerTaskEntry = first
            # The root's expiration is -1, never a staged one: it ends the loop,
            # tested at the end so that the loop warms up (see _drain).
            while True:
                nxt = node._next
                node._next = node._prev = node._list = None
                append(node)
                node = nxt  # type: ignore[assignment]
                if node.expiration_ms != expiration:
                    break
            if node is root:
                root._next = root._prev = root
                self._staged_min_ms = _NEVER
                wheel.advance_clock(bucket_ms)
                return due
            # Not a burst: put the tasks taken back in front, in order.
            prev = root
            for entry in due:
                entry._prev = prev
                entry._list = staged
                prev._next = entry
                prev = entry
            prev._next = node
            node._prev = prev
        self._place_all_staged()
        return []

    def _place_all_staged(self) -> None:
        """Move every staged task into its bucket (lock held). O(tasks staged × levels)."""
        self._staged_min_ms = _NEVER
        self._wheel.add_all(self._staged)

    def _wait_for_work(self, timeout_s: float) -> None:
        """For a reaper on a manual clock: sleep until the clock moves, an add, or ``timeout_s``."""
        with self._lock:
            if self._closed:
                return
            now = self._now()
            head = self._queue.head_expiration_ms()
            if head is not None and head <= now:
                return
            staged_min = self._staged_min_ms
            if staged_min - staged_min % self._wheel.tick_ms <= now:
                return
            self._waiting += 1
            # Any clock move wakes this sleeper (the clock's listener), so it looks
            # again at the next millisecond.
            if now + 1 < self._wake_at_ms:
                self._wake_at_ms = now + 1
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

    def _dispatch(self, tasks: list[TimerTask]) -> None:
        """Hand due tasks to the executor. Called without the lock held."""
        if self._inline:
            plain = TimerTask
            # One try around the whole batch (not one per task): after an
            # exception is logged, the loop resumes with the next task of ``it``.
            it = iter(tasks)
            while True:
                try:
                    for task in it:
                        if task.__class__ is plain:
                            # TimerTask.run, inlined for the common case.
                            call = task._call
                            if call.__class__ is tuple:
                                call[0](*call[1])  # type: ignore[index, unused-ignore]
                            elif call is not None:
                                call()  # type: ignore[operator, unused-ignore]
                        else:
                            task.run()
                    return
                except Exception:
                    logger.exception("timer task %r raised", task)
        elif self._own_executor is not None:
            self._own_executor.submit_many(tasks)
        else:
            submit = self._executor.submit  # type: ignore[union-attr]
            for task in tasks:
                submit(functools.partial(run_task, task))

    # -- inspection -----------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of tasks held in buckets; drops at once on cancel. O(1)."""
        return self._counter.value

    @property
    def tick_ms(self) -> int:
        """The finest level's tick. O(1)."""
        return self._wheel.tick_ms

    @property
    def wheel_size(self) -> int:
        """Buckets per level. O(1)."""
        return self._wheel.wheel_size

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
        """An immutable picture of all levels, buckets and the queue. O(levels × buckets + n)."""
        with self._lock:
            self._place_all_staged()
            levels = self._wheel.levels()
            level_snaps = tuple(
                LevelSnapshot(
                    tick_ms=wheel.tick_ms,
                    wheel_size=wheel.wheel_size,
                    interval_ms=wheel.interval_ms,
                    current_time_ms=wheel.current_time_ms,
                    buckets=tuple(
                        BucketSnapshot(
                            index=bucket.index,
                            expiration_ms=bucket.expiration_ms,
                            task_expirations=tuple(e.expiration_ms for e in bucket),
                        )
                        for bucket in wheel.buckets
                    ),
                )
                for wheel in levels
            )
            queued = tuple(
                (exp, bucket.level, bucket.index) for exp, bucket in self._queue.entries()
            )
            return WheelSnapshot(levels=level_snaps, queue=queued, size=self._counter.value)

    def _check(self) -> None:
        """Assert every invariant: links, counters, bucket expirations, queue contents."""
        with self._lock:
            held = self._wheel._check() + self._check_staged()
            assert held == self._counter.value, f"size {self._counter.value} != {held} held"
            self._queue._check()
            queued = {id(bucket) for _, bucket in self._queue.entries()}
            for wheel in self._wheel.levels():
                for bucket in wheel.buckets:
                    if bucket.expiration_ms != -1:
                        assert id(bucket) in queued, (
                            f"{bucket!r} has an expiration but is not queued"
                        )
                    else:
                        assert id(bucket) not in queued, f"{bucket!r} is queued without expiration"

    def _check_staged(self) -> int:
        """Assert the staging list's invariants; return its length."""
        staged = self._staged
        assert staged.expiration_ms == -1, "the staging list has an expiration"
        count = staged._check_links()
        tick_end = self._wheel._tick_end_ms
        for entry in staged:
            assert entry.expiration_ms >= tick_end, "a due task is staged"
            assert entry.expiration_ms >= self._staged_min_ms, "staged below the staged minimum"
        return count

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
