"""Unit tests for SystemTimer and SystemTimerReaper."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from thread_support import WAIT_S, wait_until
from tickwheel import ManualClock, SystemClock, SystemTimer, SystemTimerReaper, TimerTask


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1005)


@pytest.fixture
def timer(clock: ManualClock) -> Iterator[SystemTimer]:
    with SystemTimer(name="t", tick_ms=10, wheel_size=8, clock=clock, executor="inline") as t:
        yield t
    t._check()


# -- construction and bad input ------------------------------------------------


def test_defaults_and_start(clock: ManualClock) -> None:
    timer = SystemTimer(clock=clock, executor="inline")
    assert (timer.name, timer.tick_ms, timer.wheel_size, timer.size) == ("timer", 1, 20, 0)
    assert timer._wheel.current_time_ms == 1005
    timer = SystemTimer(tick_ms=10, start_ms=1234, clock=clock, executor="inline")
    assert timer._wheel.current_time_ms == 1230
    assert "SystemTimer(" in repr(timer)


@pytest.mark.parametrize(
    ("kwargs", "error", "word"),
    [
        ({"tick_ms": 0}, ValueError, "tick_ms"),
        ({"tick_ms": -5}, ValueError, "tick_ms"),
        ({"tick_ms": 1.5}, TypeError, "tick_ms"),
        ({"tick_ms": True}, TypeError, "tick_ms"),
        ({"wheel_size": 1}, ValueError, "wheel_size"),
        ({"wheel_size": 2.0}, TypeError, "wheel_size"),
        ({"start_ms": 1.0}, TypeError, "start_ms"),
        ({"executor": "threads"}, TypeError, "executor"),
        ({"executor": object()}, TypeError, "executor"),
    ],
)
def test_bad_timer_arguments(kwargs: dict[str, Any], error: type[Exception], word: str) -> None:
    with pytest.raises(error, match=word):
        SystemTimer(clock=ManualClock(), **kwargs)


@pytest.mark.parametrize("bad", [True, False, 1.0, 2.5, "10", None])
def test_delay_must_be_int(bad: object, timer: SystemTimer) -> None:
    with pytest.raises(TypeError, match="delay_ms"):
        TimerTask(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay_ms"):
        timer.schedule(bad, print)  # type: ignore[arg-type]
    task = TimerTask(5)
    with pytest.raises(TypeError, match="delay_ms"):
        task.delay_ms = bad  # type: ignore[assignment]
    assert task.delay_ms == 5
    assert timer.size == 0


def test_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match="fn"):
        TimerTask(5, 42)  # type: ignore[arg-type]


# -- TimerTask ---------------------------------------------------------------------


def test_task_run_calls_fn_with_args() -> None:
    calls: list[tuple[Any, ...]] = []
    TimerTask(1, lambda *a: calls.append(a), 1, "x").run()
    TimerTask(1, lambda: calls.append(())).run()
    TimerTask(1).run()  # no fn: nothing to do
    assert calls == [(1, "x"), ()]


def test_task_subclass_overrides_run(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[int] = []

    class Mine(TimerTask):
        __slots__ = ()

        def run(self) -> None:
            ran.append(self.delay_ms)

    timer.add(Mine(20))
    clock.advance(20)
    assert timer.advance_clock(0) is True
    assert ran == [20]


def test_task_states_and_repr(timer: SystemTimer) -> None:
    task = TimerTask(50, print)
    assert not task.is_pending and not task.is_cancelled
    assert "idle" in repr(task) and "print" in repr(task)
    assert task.cancel() is False  # never added
    timer.add(task)
    assert task.is_pending and "pending" in repr(task)
    assert task.cancel() is True
    assert task.is_cancelled and not task.is_pending and "cancelled" in repr(task)
    assert task.cancel() is False


# -- add / schedule ------------------------------------------------------------------


def test_add_sets_expiration_and_size(timer: SystemTimer, clock: ManualClock) -> None:
    task = timer.schedule(100, print)
    assert isinstance(task, TimerTask)
    assert task.expiration_ms == 1105
    assert timer.size == 1
    assert task.is_pending


class _CallCountingClock(ManualClock):
    """A ManualClock subclass: the timer must call its now_ms(), not read the stored time."""

    __slots__ = ("calls",)

    def __init__(self, start_ms: int) -> None:
        super().__init__(start_ms)
        self.calls = 0

    def now_ms(self) -> int:
        self.calls += 1
        return super().now_ms()


@pytest.mark.parametrize("kind", ["manual", "subclass"])
def test_schedule_places_tasks_exactly_like_add(kind: str) -> None:
    # schedule() inlines add() for a new task: the two must build the same wheel.
    delays = [-5, 0, 1, 9, 10, 11, 79, 80, 81, 640, 5_000, 100_000, 3, 3, 700]

    def build(use_schedule: bool) -> tuple[SystemTimer, list[TimerTask], Any]:
        clock = ManualClock(1005) if kind == "manual" else _CallCountingClock(1005)
        timer = SystemTimer(tick_ms=10, wheel_size=8, clock=clock, executor="inline")
        tasks = []
        for step, d in enumerate(delays):
            clock.advance(step % 3)
            if use_schedule:
                tasks.append(timer.schedule(d, _noop))
            else:
                task = TimerTask(d, _noop)
                timer.add(task)
                tasks.append(task)
        return timer, tasks, clock

    by_schedule, scheduled, clock_a = build(True)
    by_add, added, clock_b = build(False)
    assert by_schedule.snapshot() == by_add.snapshot()
    assert [t.expiration_ms for t in scheduled] == [t.expiration_ms for t in added]
    assert [t.is_pending for t in scheduled] == [t.is_pending for t in added]
    if kind == "subclass":
        assert clock_a.calls >= len(delays)
        assert clock_b.calls >= len(delays)
    by_schedule._check()
    by_add._check()


def test_schedule_and_add_read_the_system_clock() -> None:
    with SystemTimer(clock=SystemClock(), executor="inline") as timer:
        before = SystemClock().now_ms()
        task = timer.schedule(60_000, _noop)
        other = TimerTask(60_000, _noop)
        timer.add(other)
        after = SystemClock().now_ms()
        for t in (task, other):
            assert before + 60_000 <= t.expiration_ms <= after + 60_000
        assert timer.size == 2
        timer._check()


def _noop() -> None:
    pass


def test_expired_task_runs_at_once(timer: SystemTimer) -> None:
    ran: list[int] = []
    # current time is 1000 (1005 rounded to tick 10): due means expiration < 1010.
    timer.schedule(4, ran.append, 4)  # 1009
    timer.schedule(0, ran.append, 0)
    timer.schedule(-50, ran.append, -50)
    assert ran == [4, 0, -50]
    assert timer.size == 0
    timer.schedule(5, ran.append, 5)  # 1010: the next tick, pending
    assert ran == [4, 0, -50]
    assert timer.size == 1


def test_cancelled_task_is_dropped(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[int] = []
    task = TimerTask(0, ran.append, 1)
    timer.add(task)
    assert ran == [1]
    task = TimerTask(30, ran.append, 2)
    timer.add(task)
    assert task.cancel() is True
    timer.add(task)  # stays cancelled
    timer.add(task)
    assert timer.size == 0
    clock.advance(1000)
    timer.advance_clock(0)
    assert ran == [1]


def test_readd_moves_and_keeps_size(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[str] = []
    task = timer.schedule(30, ran.append, "a")
    timer.schedule(40, ran.append, "b")
    assert timer.size == 2
    timer.snapshot()  # places the staged tasks in their buckets
    old_bucket = task.list
    assert old_bucket is not None and old_bucket.expiration_ms == 1030
    task.delay_ms = 70
    timer.add(task)
    assert timer.size == 2
    assert task.expiration_ms == 1075
    assert task not in list(old_bucket)
    timer._check()
    clock.set(1045)
    timer.advance_clock(0)
    assert ran == ["b"]
    clock.set(1075)
    timer.advance_clock(0)
    assert ran == ["b", "a"]
    # Moving a pending task to "due now" runs it at once and drops the size.
    task = timer.schedule(100, ran.append, "c")
    task.delay_ms = 0
    timer.add(task)
    assert ran == ["b", "a", "c"]
    assert timer.size == 0
    timer._check()


def test_fired_task_can_be_added_again(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[int] = []
    task = timer.schedule(10, ran.append, 1)
    clock.advance(10)
    timer.advance_clock(0)
    assert task.cancel() is False  # it already ran
    timer.add(task)
    clock.advance(10)
    timer.advance_clock(0)
    assert ran == [1, 1]


def test_task_pending_in_another_timer_is_refused(timer: SystemTimer, clock: ManualClock) -> None:
    other = SystemTimer(clock=clock, executor="inline")
    task = other.schedule(100, print)
    with pytest.raises(ValueError, match="another timer"):
        timer.add(task)
    assert other.size == 1 and timer.size == 0


def test_size_drops_at_once_on_cancel(timer: SystemTimer) -> None:
    tasks = [timer.schedule(d, print) for d in range(10, 500, 7)]
    assert timer.size == len(tasks)
    for done, task in enumerate(tasks, start=1):
        assert task.cancel() is True
        assert timer.size == len(tasks) - done
    timer._check()


# -- advance_clock ---------------------------------------------------------------------


def test_advance_clock_return_values(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[int] = []
    assert timer.advance_clock(0) is False  # empty
    timer.schedule(50, ran.append, 50)
    assert timer.advance_clock(0) is False  # not due yet
    clock.set(1054)  # bucket [1050, 1060) is due at 1050
    assert timer.advance_clock(0) is True
    assert ran == [50]
    assert timer.advance_clock(0) is False
    # A bucket whose only task was cancelled is still due once: True, nothing runs.
    task = timer.schedule(20, ran.append, 20)
    assert timer.advance_clock(0) is False  # places the staged task: its bucket is queued
    task.cancel()
    clock.advance(20)
    assert timer.advance_clock(0) is True
    assert timer.advance_clock(0) is False
    assert ran == [50]
    # A task cancelled while still staged never reached a bucket: nothing was due.
    task = timer.schedule(20, ran.append, 20)
    task.cancel()
    clock.advance(20)
    assert timer.advance_clock(0) is False
    assert ran == [50]
    timer._check()


def test_fires_at_start_of_tick_and_drains_all_due(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[int] = []
    for delay in (15, 25, 35, 900, 5000):
        timer.schedule(delay, ran.append, delay)
    clock.set(1019)  # 1020 is due at 1020, not at 1019
    assert timer.advance_clock(0) is False
    clock.set(1020)
    assert timer.advance_clock(0) is True
    assert ran == [15]
    clock.set(1040)  # two buckets due: both drained in one call
    assert timer.advance_clock(0) is True
    assert ran == [15, 25, 35]
    clock.set(1900)  # cascades through the overflow levels
    assert timer.advance_clock(0) is True
    assert ran == [15, 25, 35, 900]
    clock.set(6005)
    assert timer.advance_clock(0) is True
    assert ran == [15, 25, 35, 900, 5000]
    assert timer.size == 0


def test_manual_clock_never_waits(clock: ManualClock) -> None:
    timer = SystemTimer(clock=clock, executor="inline")
    timer.schedule(100, print)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(timer.advance_clock(600_000)))
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert result == [False]


def test_add_of_earlier_bucket_wakes_waiting_advance_clock() -> None:
    ran = threading.Event()
    timer = SystemTimer(name="wake", clock=SystemClock(), executor="inline")
    timer.schedule(600_000, print)  # a far bucket: the waiter would sleep on it
    result: list[bool] = []
    thread = threading.Thread(
        target=lambda: result.append(timer.advance_clock(600_000)), name="test-advance"
    )
    thread.start()
    try:
        assert wait_until(lambda: timer._waiting == 1)
        timer.schedule(5, ran.set)
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the add did not wake advance_clock"
        assert result == [True]
        # If the add landed on a coarser level (the wheel had not moved for more
        # than one interval), that first due bucket only cascaded it down.
        for _ in range(100):
            if ran.is_set():
                break
            timer.advance_clock(100)
        assert ran.is_set()
        assert timer.size == 1
    finally:
        timer.close()
        thread.join(WAIT_S)


def test_staged_add_wakes_a_sleeper_only_if_due_before_it_looks_again() -> None:
    # A staged task is placed by the next advance; an add wakes a sleeping
    # advance_clock only when the task could be due before it wakes anyway.
    timer = SystemTimer(name="wake-filter", clock=SystemClock(), executor="inline")
    wakes: list[int] = []
    notify_all = timer._cond.notify_all

    def counting_notify_all() -> None:
        wakes.append(1)
        notify_all()

    timer._cond.notify_all = counting_notify_all  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: timer.advance_clock(60_000), name="test-advance")
    thread.start()
    try:
        assert wait_until(lambda: timer._waiting == 1)
        timer.schedule(600_000, print)  # due long after the sleeper's 60 s: no wake-up
        assert wakes == []
        ran = threading.Event()
        timer.schedule(5, ran.set)  # due before: wakes it
        assert wakes
        thread.join(WAIT_S)
        assert not thread.is_alive()
        for _ in range(100):
            if ran.is_set():
                break
            timer.advance_clock(100)
        assert ran.is_set()
    finally:
        timer.close()
        thread.join(WAIT_S)


def test_task_can_add_and_cancel_on_its_own_timer(timer: SystemTimer, clock: ManualClock) -> None:
    ran: list[str] = []
    victim = timer.schedule(500, ran.append, "victim")

    def first() -> None:
        ran.append("first")
        victim.cancel()
        timer.schedule(0, ran.append, "nested-now")
        timer.schedule(10, ran.append, "nested-later")

    timer.schedule(10, first)
    clock.advance(10)
    timer.advance_clock(0)
    assert ran == ["first", "nested-now"]
    clock.advance(10)
    timer.advance_clock(0)
    clock.advance(1000)
    timer.advance_clock(0)
    assert ran == ["first", "nested-now", "nested-later"]


# -- close -----------------------------------------------------------------------------


def test_close_is_idempotent_and_add_after_close_raises(clock: ManualClock) -> None:
    timer = SystemTimer(name="c", clock=clock, executor="inline")
    ran: list[int] = []
    timer.schedule(10, ran.append, 1)
    timer.close()
    assert timer.closed
    timer.close()
    with pytest.raises(RuntimeError, match="closed"):
        timer.schedule(10, ran.append, 2)
    with pytest.raises(RuntimeError, match="closed"):
        timer.add(TimerTask(0, ran.append, 3))
    clock.advance(100)
    assert timer.advance_clock(0) is False
    assert ran == []


def test_context_manager_closes(clock: ManualClock) -> None:
    with SystemTimer(clock=clock, executor="inline") as timer:
        assert not timer.closed
    assert timer.closed


# -- executors ----------------------------------------------------------------------


def test_default_executor_thread_is_named_and_joined(clock: ManualClock) -> None:
    before = set(threading.enumerate())
    timer = SystemTimer(name="orders", clock=clock)
    assert timer.executor_thread is None  # started on first use
    names: list[str] = []
    done = threading.Event()

    def record() -> None:
        names.append(threading.current_thread().name)
        done.set()

    timer.schedule(0, record)
    assert done.wait(WAIT_S)
    assert names == ["executor-orders"]
    thread = timer.executor_thread
    assert thread is not None and thread.name == "executor-orders"
    timer.close()
    assert not thread.is_alive()
    assert set(threading.enumerate()) <= before


def test_default_executor_runs_tasks_in_order_then_close(clock: ManualClock) -> None:
    ran: list[int] = []
    all_done = threading.Event()
    with SystemTimer(name="order", clock=clock) as timer:
        for i in range(50):
            timer.schedule(10, ran.append, i)
        timer.schedule(20, all_done.set)
        clock.advance(20)
        timer.advance_clock(0)
        assert all_done.wait(WAIT_S)
    assert ran == list(range(50))


def test_inline_runs_in_calling_thread(timer: SystemTimer, clock: ManualClock) -> None:
    names: list[str] = []
    timer.schedule(10, lambda: names.append(threading.current_thread().name))
    clock.advance(10)
    timer.advance_clock(0)
    assert names == [threading.current_thread().name]


class _RecordingExecutor:
    def __init__(self) -> None:
        self.submitted: list[Callable[[], Any]] = []

    def submit(self, fn: Callable[[], Any]) -> None:
        self.submitted.append(fn)


def test_custom_submit_executor(clock: ManualClock) -> None:
    executor = _RecordingExecutor()
    ran: list[int] = []
    timer = SystemTimer(clock=clock, executor=executor)
    timer.schedule(0, ran.append, 0)
    timer.schedule(10, ran.append, 10)
    assert len(executor.submitted) == 1 and ran == []
    clock.advance(10)
    timer.advance_clock(0)
    assert len(executor.submitted) == 2 and ran == []
    for fn in executor.submitted:
        fn()
    assert ran == [0, 10]
    timer.close()


def _boom() -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize("kind", ["inline", "thread", "custom"])
def test_exception_is_logged_and_later_tasks_run(
    kind: str, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tickwheel")
    ran: list[int] = []
    done = threading.Event()
    custom = _RecordingExecutor()
    executor: Any = {"inline": "inline", "thread": None, "custom": custom}[kind]
    with SystemTimer(name=f"x-{kind}", clock=clock, executor=executor) as timer:
        bad = timer.schedule(10, _boom)
        timer.schedule(10, ran.append, 1)
        timer.schedule(20, done.set)
        clock.advance(20)
        timer.advance_clock(0)
        for fn in custom.submitted:
            fn()
        assert done.wait(WAIT_S)
    assert ran == [1]
    records = [r for r in caplog.records if r.name == "tickwheel"]
    assert len(records) == 1
    assert records[0].exc_info is not None
    assert "boom" in str(records[0].exc_info[1])
    assert repr(bad) in records[0].getMessage()


def test_several_failing_tasks_in_one_batch_are_each_logged(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The inline executor runs a batch in one try block that resumes after a
    # failure: every failure is logged once and every other task still runs, in order.
    caplog.set_level(logging.ERROR, logger="tickwheel")
    ran: list[int] = []
    with SystemTimer(name="batch", clock=clock, executor="inline") as timer:
        for i in range(6):
            timer.schedule(10, _boom if i % 2 == 0 else ran.append, *(() if i % 2 == 0 else (i,)))
        clock.advance(10)
        assert timer.advance_clock(0) is True
    assert ran == [1, 3, 5]
    assert len([r for r in caplog.records if r.name == "tickwheel"]) == 3


# -- reaper ------------------------------------------------------------------------------


def test_reaper_runs_tasks_on_system_clock_and_closes() -> None:
    before = set(threading.enumerate())
    timer = SystemTimer(name="sys", clock=SystemClock())
    fired = threading.Event()
    names: list[str] = []

    def record() -> None:
        names.append(threading.current_thread().name)
        fired.set()

    with SystemTimerReaper(timer) as reaper:
        assert reaper.thread.name == "reaper-sys"
        reaper.schedule(5, record)
        assert fired.wait(WAIT_S)
        task = TimerTask(600_000, print)
        reaper.add(task)
        assert reaper.size == 1
    assert timer.closed
    assert not reaper.thread.is_alive()
    assert names == ["executor-sys"]
    assert set(threading.enumerate()) <= before


def test_reaper_on_manual_clock_follows_the_clock(clock: ManualClock) -> None:
    ran = threading.Event()
    timer = SystemTimer(name="man", clock=clock, executor="inline")
    with SystemTimerReaper(timer, name="custom") as reaper:
        assert reaper.thread.name == "reaper-custom"
        reaper.schedule(30, ran.set)
        assert not ran.wait(0.05)  # the clock has not moved
        clock.advance(30)
        assert ran.wait(WAIT_S)
    assert not reaper.thread.is_alive()


class _SlowReaper(SystemTimerReaper):
    WAIT_MS = 3_600_000  # an hour: close() must wake it, not wait it out


@pytest.mark.parametrize("manual", [False, True])
def test_reaper_close_wakes_it_at_once(manual: bool) -> None:
    before = set(threading.enumerate())
    clock = ManualClock() if manual else SystemClock()
    timer = SystemTimer(name="slow", clock=clock)
    reaper = _SlowReaper(timer)
    timer.schedule(0, lambda: None)  # starts the executor thread
    assert wait_until(lambda: timer._waiting == 1)  # the reaper is asleep
    closer = threading.Thread(target=reaper.close, name="test-closer")
    closer.start()
    closer.join(WAIT_S)
    assert not closer.is_alive(), "close() did not wake the reaper"
    assert not reaper.thread.is_alive()
    assert timer.closed
    reaper.close()  # idempotent
    assert set(threading.enumerate()) <= before


def test_tasks_due_as_the_timer_closes_still_run(clock: ManualClock) -> None:
    # advance_clock hands due tasks over after releasing the lock; if close() runs
    # in between, those tasks (whose cancel() already returns False) must still run.
    ran: list[str] = []
    timer = SystemTimer(name="late", clock=clock)
    done = threading.Event()
    timer.schedule(0, done.set)  # starts the executor thread
    assert done.wait(WAIT_S)
    timer.close()
    late = TimerTask(0, lambda: ran.append(threading.current_thread().name))
    timer._dispatch([late])
    assert ran == [threading.current_thread().name]
