"""Tests for DelayedOperation and DelayedOperationPurgatory (Kafka's purgatory)."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thread_support import WAIT_S, wait_until
from tickwheel import (
    DelayedOperation,
    DelayedOperationPurgatory,
    ManualClock,
    SystemClock,
    SystemTimer,
    TimerTask,
)


class MockOp(DelayedOperation):
    """Kafka's MockDelayedOperation: completable on demand; records what ran."""

    __slots__ = ("completable", "events", "tries")

    def __init__(self, delay_ms: int, lock: Any = None) -> None:
        super().__init__(delay_ms, lock)
        self.completable = False
        self.events: list[str] = []
        self.tries = 0

    def try_complete(self) -> bool:
        self.tries += 1
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.events.append("complete")

    def on_expiration(self) -> None:
        self.events.append("expire")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000)


@pytest.fixture
def timer(clock: ManualClock) -> Iterator[SystemTimer]:
    with SystemTimer(name="p", clock=clock, executor="inline") as t:
        yield t
    t._check()


@pytest.fixture
def purgatory(timer: SystemTimer) -> Iterator[DelayedOperationPurgatory[MockOp]]:
    p: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "test", timer=timer, reaper_enabled=False
    )
    yield p
    p.shutdown()


# -- DelayedOperation ----------------------------------------------------------------


def test_op_is_a_slotted_timer_task() -> None:
    op = MockOp(100)
    assert isinstance(op, TimerTask)
    assert not hasattr(op, "__dict__")
    assert "__dict__" not in DelayedOperation.__dict__
    # The op is its own timer entry: one small object (plus its lock).
    assert sys.getsizeof(DelayedOperation.__new__(MockOp)) <= sys.getsizeof(TimerTask(1)) + 48
    assert isinstance(op.lock, type(threading.RLock()))
    assert not op.is_completed and "pending" in repr(op)


def test_op_initialises_like_a_timer_task() -> None:
    # An op is a TimerTask: before it is added, it looks like a fresh task.
    def state(task: TimerTask) -> tuple[object, ...]:
        return (task.delay_ms, task.expiration_ms, task.list, task.is_pending, task.is_cancelled)

    assert state(MockOp(123)) == state(TimerTask(123)) == (123, -1, None, False, False)


def test_op_must_override_try_complete_and_on_complete() -> None:
    class Half(DelayedOperation):
        def on_complete(self) -> None:
            pass

    with pytest.raises(TypeError, match="try_complete"):
        Half(10)  # type: ignore[abstract]


def test_op_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="delay_ms"):
        MockOp(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lock"):
        MockOp(10, lock=object())


def test_force_complete_has_a_single_winner() -> None:
    op = MockOp(100)
    assert op.force_complete() is True
    assert op.force_complete() is False
    assert op.is_completed and op.events == ["complete"] and "completed" in repr(op)


def test_force_complete_single_winner_across_threads() -> None:
    for _ in range(20):
        op = MockOp(100)
        wins: list[bool] = []
        barrier = threading.Barrier(8)

        def race(op: MockOp = op, wins: list[bool] = wins, barrier: Any = barrier) -> None:
            barrier.wait(WAIT_S)
            wins.append(op.force_complete())

        threads = [threading.Thread(target=race) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in threads)
        assert sorted(wins) == [False] * 7 + [True]
        assert op.events == ["complete"]


def test_cancel_never_added_returns_false_and_does_nothing() -> None:
    op = MockOp(100)
    assert op.cancel() is False
    assert not op.is_completed and not op.is_cancelled and op.events == []


def test_safe_try_complete_or_else_runs_action_between_tries() -> None:
    op = MockOp(100)
    seen: list[int] = []
    assert op.safe_try_complete_or_else(lambda: seen.append(op.tries)) is False
    assert seen == [1] and op.tries == 2
    op.completable = True
    assert op.safe_try_complete() is True
    assert op.safe_try_complete() is False  # already completed: force_complete loses


def test_run_is_the_expiry_path() -> None:
    op = MockOp(100)
    op.run()
    assert op.is_completed and op.events == ["complete", "expire"]
    op.run()  # a second run loses force_complete: nothing more
    assert op.events == ["complete", "expire"]
    done = MockOp(100)
    done.force_complete()
    done.run()
    assert done.events == ["complete"]


# -- satisfaction ------------------------------------------------------------------


def test_request_satisfaction(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    r1 = MockOp(100_000)
    r2 = MockOp(100_000)
    assert purgatory.check_and_complete("test1") == 0  # unknown key
    assert purgatory.try_complete_else_watch(r1, ["test1"]) is False
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.try_complete_else_watch(r2, ["test2"]) is False
    assert purgatory.check_and_complete("test2") == 0
    r1.completable = True
    assert purgatory.check_and_complete("test1") == 1
    assert purgatory.check_and_complete("test1") == 0
    r2.completable = True
    assert purgatory.check_and_complete("test2") == 1
    assert purgatory.check_and_complete("test2") == 0
    assert r1.events == ["complete"] and r2.events == ["complete"]
    assert purgatory.watched == 0 and purgatory.num_delayed == 0
    assert purgatory.watched_keys() == []  # empty watcher lists are removed
    assert purgatory.num_completed == 2 and purgatory.num_expired == 0


def test_completable_at_once_is_not_watched(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    op = MockOp(100_000)
    op.completable = True
    assert purgatory.try_complete_else_watch(op, ["k"]) is True
    assert op.tries == 1 and op.events == ["complete"]
    assert purgatory.watched == 0 and purgatory.num_delayed == 0
    assert purgatory.num_completed == 1
    # A completed op is not watched again.
    assert purgatory.try_complete_else_watch(op, ["k"]) is False
    assert purgatory.watched == 0


def test_keys_are_matched_by_value(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    op = MockOp(100_000)
    purgatory.try_complete_else_watch(op, [("orders", 7), 42, frozenset({"a"})])
    op.completable = True
    key = ("orders", int("7"))
    assert purgatory.check_and_complete(key) == 1
    assert purgatory.watched == 2  # still in the lists of 42 and frozenset({"a"})
    assert purgatory.check_and_complete(42.0) == 0  # 42.0 == 42: same list, op done
    assert purgatory.watched == 1


def test_watching_stops_once_the_op_completed(
    purgatory: DelayedOperationPurgatory[MockOp],
) -> None:
    op = MockOp(100_000)

    class CompletesOnHash:
        def __hash__(self) -> int:
            op.force_complete()  # another party completes the op while it is being watched
            return 1

    purgatory.try_complete_else_watch(op, [CompletesOnHash(), "b", "c"])
    assert op.is_completed
    assert purgatory.watched == 1  # "b" and "c" were never watched
    assert purgatory.num_delayed == 0  # and it never went into the timer


def test_condition_met_while_watching_is_caught_by_the_second_try(
    purgatory: DelayedOperationPurgatory[MockOp],
) -> None:
    op = MockOp(100_000)

    class BecomesReady:
        # The op's condition comes true while it is being watched, and the event's
        # check_and_complete ran before the op was in the list: only the second
        # try_complete can catch it.
        def __hash__(self) -> int:
            op.completable = True
            return 2

    assert purgatory.try_complete_else_watch(op, [BecomesReady()]) is True
    assert op.tries == 2 and op.events == ["complete"]
    assert purgatory.num_delayed == 0


def test_completed_while_adding_to_timer_is_cancelled_again(clock: ManualClock) -> None:
    class RacyTimer(SystemTimer):
        def add(self, task: TimerTask) -> None:
            assert isinstance(task, MockOp)
            task.force_complete()  # completes (its cancel finds nothing) just before the add
            super().add(task)

    timer = RacyTimer("racy", clock=clock, executor="inline")
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "racy", timer=timer, reaper_enabled=False
    )
    op = MockOp(100_000)
    assert purgatory.try_complete_else_watch(op, ["k"]) is False
    assert op.is_completed and op.is_cancelled
    assert purgatory.num_delayed == 0
    purgatory.shutdown()


def test_overridden_safe_try_complete_or_else_is_used(
    purgatory: DelayedOperationPurgatory[Any],
) -> None:
    calls: list[str] = []

    class Custom(MockOp):
        __slots__ = ()

        def safe_try_complete_or_else(self, action: Callable[[], object]) -> bool:
            calls.append("custom")
            return super().safe_try_complete_or_else(action)

    op = Custom(100_000)
    assert purgatory.try_complete_else_watch(op, ["a", "b"]) is False
    assert calls == ["custom"] and op.tries == 2
    assert purgatory.watched == 2 and purgatory.num_delayed == 1
    op.completable = True
    assert purgatory.check_and_complete("b") == 1


def test_watch_and_complete_race_never_loses_a_completion() -> None:
    # Kafka's double check: whatever the interleaving of watching and of the event
    # that makes the op completable, the op ends completed.
    timer = SystemTimer("race", clock=ManualClock(0), executor="inline")
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "race", timer=timer, reaper_enabled=False
    )
    ops = [MockOp(100_000) for _ in range(300)]
    start = threading.Barrier(2)

    def watcher() -> None:
        start.wait(WAIT_S)
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [i % 7, "all"])

    def completer() -> None:
        start.wait(WAIT_S)
        for i, op in enumerate(ops):
            op.completable = True
            purgatory.check_and_complete(i % 7)

    threads = [threading.Thread(target=watcher), threading.Thread(target=completer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads)
    assert all(op.is_completed for op in ops)
    assert all(op.events == ["complete"] for op in ops)
    assert purgatory.num_delayed == 0
    assert purgatory.num_completed == len(ops)
    purgatory.shutdown()


# -- expiry ------------------------------------------------------------------------


def test_request_expiry_deterministic(
    purgatory: DelayedOperationPurgatory[MockOp], clock: ManualClock
) -> None:
    r1 = MockOp(20)
    r2 = MockOp(200_000)
    added_ms = clock.now_ms()
    assert purgatory.try_complete_else_watch(r1, ["test1"]) is False
    assert purgatory.try_complete_else_watch(r2, ["test1", "test2"]) is False
    clock.advance(19)
    purgatory.advance_clock(0)
    assert not r1.is_completed
    clock.advance(1)
    purgatory.advance_clock(0)
    assert r1.events == ["complete", "expire"]
    assert clock.now_ms() - added_ms == 20
    assert not r2.is_completed and r2.events == []
    assert purgatory.num_delayed == 1
    assert purgatory.num_expired == 1 and purgatory.num_completed == 0
    # The expired op stays watched until a traversal removes it, uncounted.
    assert purgatory.watched == 3
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.watched == 2


def test_deterministic_mode_expires_in_time_order_in_the_calling_thread(
    purgatory: DelayedOperationPurgatory[MockOp], clock: ManualClock
) -> None:
    rng = random.Random(7)
    order: list[tuple[int, str]] = []

    class Ordered(MockOp):
        __slots__ = ()

        def on_expiration(self) -> None:
            order.append((self.expiration_ms, threading.current_thread().name))

    ops = [Ordered(rng.randrange(1, 50_000)) for _ in range(2_000)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [i % 37])
    for op in ops[::3]:
        op.completable = True
    for key in range(37):
        purgatory.check_and_complete(key)
    clock.advance(25_000)
    purgatory.advance_clock(0)
    due_first = len(order)
    assert all(exp <= clock.now_ms() for exp, _ in order)
    clock.advance(25_000)
    purgatory.advance_clock(0)
    expirations = [exp for exp, _ in order]
    assert expirations == sorted(expirations)
    assert {name for _, name in order} == {threading.current_thread().name}
    pending = [op for i, op in enumerate(ops) if i % 3]
    assert len(order) == len(pending) and 0 < due_first < len(order)
    assert purgatory.num_delayed == 0
    assert purgatory.num_expired == len(pending)
    assert purgatory.num_completed == len(ops[::3])


def test_request_expiry_on_the_system_clock() -> None:
    clock = SystemClock()
    fired_ms: list[int] = []
    expired = threading.Event()

    class Recording(MockOp):
        __slots__ = ()

        def on_expiration(self) -> None:
            fired_ms.append(clock.now_ms())
            expired.set()

    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "expiry", timer=SystemTimer("expiry", clock=clock)
    )
    try:
        assert purgatory._reaper is not None
        assert purgatory._reaper.name == "ExpirationReaper-expiry"
        r1 = Recording(20)
        r2 = Recording(200_000)
        added_ms = clock.now_ms()
        purgatory.try_complete_else_watch(r1, ["test1"])
        purgatory.try_complete_else_watch(r2, ["test2"])
        assert expired.wait(WAIT_S)
        # A correctness bound, not a speed one: never earlier than its delay.
        assert fired_ms[0] - added_ms >= 20
        assert r1.is_completed and r1.events == ["complete"]
        assert not r2.is_completed
        assert purgatory.num_delayed == 1
        assert wait_until(lambda: purgatory.num_expired == 1)
    finally:
        purgatory.shutdown()


def test_counters_are_consistent_inside_callbacks(
    purgatory: DelayedOperationPurgatory[MockOp], clock: ManualClock
) -> None:
    seen: list[tuple[int, int]] = []

    class Peek(MockOp):
        __slots__ = ()

        def on_complete(self) -> None:
            seen.append((purgatory.num_completed, purgatory.num_expired))

    expiring = Peek(10)
    completing = Peek(10)
    purgatory.try_complete_else_watch(expiring, ["a"])
    purgatory.try_complete_else_watch(completing, ["b"])
    completing.completable = True
    purgatory.check_and_complete("b")
    clock.advance(10)
    purgatory.advance_clock(0)
    assert seen == [(1, 0), (1, 1)]  # an expiring op is never counted as completed


def test_overridden_force_complete_is_used_by_the_expiry_path(
    purgatory: DelayedOperationPurgatory[MockOp], clock: ManualClock
) -> None:
    calls: list[str] = []

    class Custom(MockOp):
        __slots__ = ()

        def force_complete(self) -> bool:
            calls.append("force")
            return super().force_complete()

    op = Custom(10)
    purgatory.try_complete_else_watch(op, ["a"])
    clock.advance(10)
    purgatory.advance_clock(0)
    assert calls == ["force"] and op.events == ["complete", "expire"]
    assert purgatory.num_expired == 1 and purgatory.num_completed == 0
    op.run()
    assert calls == ["force", "force"] and op.events == ["complete", "expire"]


def test_zero_delay_expires_at_once(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    op = MockOp(0)
    assert purgatory.try_complete_else_watch(op, ["k"]) is False
    assert op.events == ["complete", "expire"]  # inline executor: ran in the add
    assert purgatory.num_delayed == 0 and purgatory.num_expired == 1


# -- purge and watch counts --------------------------------------------------------------


def test_request_purge(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    r1 = MockOp(100_000)
    r2 = MockOp(100_000)
    r3 = MockOp(100_000)
    purgatory.try_complete_else_watch(r1, ["test1"])
    purgatory.try_complete_else_watch(r2, ["test1", "test2"])
    purgatory.try_complete_else_watch(r3, ["test1", "test2", "test3"])
    assert purgatory.num_delayed == 3
    assert purgatory.watched == 6
    # Completing directly lowers num_delayed at once ...
    r2.completable = True
    r2.safe_try_complete()
    assert purgatory.num_delayed == 2
    r3.completable = True
    r3.safe_try_complete()
    assert purgatory.num_delayed == 1
    assert purgatory.watched == 6
    # ... and traversals lower watched later.
    assert purgatory.check_and_complete("test1") == 0
    assert purgatory.watched == 4
    assert purgatory.check_and_complete("test2") == 0
    assert purgatory.watched == 2
    assert purgatory.check_and_complete("test3") == 0
    assert purgatory.watched == 1
    assert sorted(map(str, purgatory.watched_keys())) == ["test1"]


def test_purge_completed_removes_every_done_entry(
    purgatory: DelayedOperationPurgatory[MockOp],
) -> None:
    ops = [MockOp(100_000) for _ in range(10)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [i, "shared"])
    for op in ops[:7]:
        op.force_complete()
    assert purgatory.watched == 20
    assert purgatory.purge_completed() == 14
    assert purgatory.watched == 6 and purgatory.num_purged == 14
    assert purgatory.num_delayed == 3
    assert purgatory.purge_completed() == 0


def test_advance_clock_purges_after_purge_interval(timer: SystemTimer, clock: ManualClock) -> None:
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "purge", timer=timer, purge_interval=5, reaper_enabled=False
    )
    ops = [MockOp(100_000) for _ in range(10)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [i])
    for op in ops[:5]:
        op.force_complete()
    purgatory.advance_clock(0)  # estimated 10 - delayed 5 = 5: not above the interval
    assert purgatory.watched == 10
    ops[5].force_complete()
    purgatory.advance_clock(0)  # 10 - 4 = 6 > 5: purge
    assert purgatory.watched == 4 and purgatory.num_purged == 6
    assert purgatory.watched_keys() == [6, 7, 8, 9]
    purgatory.shutdown()


def test_reaper_purges_on_a_manual_clock(clock: ManualClock) -> None:
    timer = SystemTimer("reap", clock=clock, executor="inline")
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "reap", timer=timer, purge_interval=0
    )
    try:
        op = MockOp(50)
        purgatory.try_complete_else_watch(op, ["a", "b"])
        assert purgatory.watched == 2
        clock.advance(50)  # wakes the reaper, which expires the op and then purges
        assert wait_until(lambda: op.is_completed and purgatory.watched == 0)
        assert op.events == ["complete", "expire"]
        assert purgatory.num_expired == 1
    finally:
        purgatory.shutdown()
    assert purgatory._reaper is not None and not purgatory._reaper.is_alive()


# -- cancel_for_key ------------------------------------------------------------------


def test_cancel_for_key(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    r1 = MockOp(100_000)
    r2 = MockOp(100_000)
    r3 = MockOp(100_000)
    purgatory.try_complete_else_watch(r1, ["key"])
    purgatory.try_complete_else_watch(r2, ["key"])
    purgatory.try_complete_else_watch(r3, ["key2"])
    cancelled = purgatory.cancel_for_key("key")
    assert len(cancelled) == 2
    assert set(map(id, cancelled)) == {id(r1), id(r2)}
    assert purgatory.num_delayed == 1
    assert purgatory.watched == 1
    assert not r1.is_completed and not r2.is_completed
    assert r1.events == [] and r2.events == [] and "cancelled" in repr(r1)
    assert purgatory.num_cancelled == 2
    assert purgatory.cancel_for_key("key") == []
    assert purgatory.cancel_for_key("unknown") == []
    # A cancelled op can no longer complete.
    r1.completable = True
    assert r1.force_complete() is False and r1.events == []


def test_cancel_for_key_skips_ops_already_completed(
    purgatory: DelayedOperationPurgatory[MockOp],
) -> None:
    done = MockOp(100_000)
    live = MockOp(100_000)
    purgatory.try_complete_else_watch(done, ["k", "other"])
    purgatory.try_complete_else_watch(live, ["k"])
    done.force_complete()
    assert purgatory.cancel_for_key("k") == [live]
    assert purgatory.watched == 1  # done is still listed under "other"
    assert purgatory.check_and_complete("other") == 0
    assert purgatory.watched == 0


# -- concurrency and lock discipline -------------------------------------------------


class OwnedLock:
    """An RLock that records every try_complete made without it held."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.violations = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined, no-any-return]


class CountingOp(DelayedOperation):
    """Completes on its ``needed``-th attempt; checks the lock on every attempt."""

    __slots__ = ("attempts", "completions", "needed", "owned")

    def __init__(self, needed: int, lock: OwnedLock) -> None:
        super().__init__(200_000, lock)
        self.owned = lock
        self.needed = needed
        self.attempts = 0
        self.completions = 0

    def try_complete(self) -> bool:
        if not self.owned.is_owned():
            self.owned.violations += 1
        self.attempts += 1  # safe: always under self.lock
        if self.attempts >= self.needed:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1


def test_concurrent_check_and_complete_completes_every_op_once() -> None:
    purgatory: DelayedOperationPurgatory[CountingOp] = DelayedOperationPurgatory(
        "hammer", timer=SystemTimer("hammer", clock=SystemClock()), purge_interval=0
    )
    locks = [OwnedLock() for _ in range(100)]
    ops = [CountingOp(20, locks[i]) for i in range(100)]
    keys: list[Hashable] = [f"key-{i % 10}" for i in range(100)]
    for op, key in zip(ops, keys, strict=True):
        assert purgatory.try_complete_else_watch(op, [key, "all"]) is False
    stop = threading.Event()
    completed_by: list[int] = []
    errors: list[BaseException] = []

    def hammer(worker: int) -> None:
        n = 0
        try:
            while not stop.is_set() and not all(op.is_completed for op in ops):
                for i in range(10):
                    n += purgatory.check_and_complete(f"key-{(i + worker) % 10}")
                n += purgatory.check_and_complete("all")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        completed_by.append(n)

    threads = [threading.Thread(target=hammer, args=(w,)) for w in range(20)]
    for t in threads:
        t.start()
    ok = wait_until(lambda: all(op.is_completed for op in ops))
    stop.set()
    for t in threads:
        t.join(WAIT_S)
    try:
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert ok
        assert [op.completions for op in ops] == [1] * 100
        assert sum(completed_by) == 100  # each completion counted by exactly one caller
        assert all(op.attempts >= 20 for op in ops)
        assert sum(lock.violations for lock in locks) == 0
        assert purgatory.num_delayed == 0
        assert purgatory.num_completed == 100
    finally:
        purgatory.shutdown()


def test_try_complete_always_runs_under_op_lock(
    purgatory: DelayedOperationPurgatory[Any],
) -> None:
    lock = OwnedLock()
    shared = [CountingOp(3, lock) for _ in range(5)]
    for op in shared:
        purgatory.try_complete_else_watch(op, ["a", "b"])
    for _ in range(3):
        purgatory.check_and_complete("a")
    assert all(op.is_completed for op in shared)
    assert all(op.completions == 1 for op in shared)
    assert lock.violations == 0
    assert not lock.is_owned()  # every acquire was released

    class Bad(CountingOp):
        __slots__ = ()

    bad = Bad(2, lock)
    bad.try_complete()  # called directly, without the lock: the check notices
    assert lock.violations == 1


def test_shared_lock_across_ops(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    lock = threading.RLock()
    ops = [MockOp(100_000, lock=lock) for _ in range(50)]
    for op in ops:
        assert op.lock is lock
        purgatory.try_complete_else_watch(op, ["k"])
    for op in ops[::2]:
        op.completable = True
    assert purgatory.check_and_complete("k") == 25
    assert purgatory.watched == 25 and purgatory.num_delayed == 25


# -- construction, bad input, lifecycle ----------------------------------------------------


def test_bad_arguments(purgatory: DelayedOperationPurgatory[MockOp]) -> None:
    op = MockOp(100)
    with pytest.raises(ValueError, match="keys must not be empty"):
        purgatory.try_complete_else_watch(op, [])
    with pytest.raises(TypeError, match="not str"):
        purgatory.try_complete_else_watch(op, "topic-0")
    with pytest.raises(TypeError, match="not hashable"):
        purgatory.try_complete_else_watch(op, [["unhashable"]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="purge_interval"):
        DelayedOperationPurgatory("x", purge_interval=-1, reaper_enabled=False)
    with pytest.raises(TypeError, match="timer"):
        DelayedOperationPurgatory("x", timer="timer", reaper_enabled=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        DelayedOperationPurgatory(7, reaper_enabled=False)  # type: ignore[arg-type]


def test_timer_disabled_ops_never_expire(clock: ManualClock, timer: SystemTimer) -> None:
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "notimer", timer=timer, reaper_enabled=False, timer_enabled=False
    )
    op = MockOp(10)
    purgatory.try_complete_else_watch(op, ["k"])
    assert purgatory.num_delayed == 0 and purgatory.watched == 1
    clock.advance(1000)
    purgatory.advance_clock(0)
    assert not op.is_completed
    op.completable = True
    assert purgatory.check_and_complete("k") == 1
    purgatory.shutdown()


def test_default_timer_is_created_owned_and_closed() -> None:
    before = set(threading.enumerate())
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory("own")
    assert purgatory.timer.name == "own" and isinstance(purgatory.timer.clock, SystemClock)
    fired = threading.Event()
    names: list[str] = []

    class Named(MockOp):
        __slots__ = ()

        def on_expiration(self) -> None:
            names.append(threading.current_thread().name)
            fired.set()

    purgatory.try_complete_else_watch(Named(5), ["k"])
    assert fired.wait(WAIT_S)
    assert names == ["executor-own"]
    assert "DelayedOperationPurgatory(name='own'" in repr(purgatory)
    purgatory.shutdown()
    purgatory.shutdown()  # idempotent
    assert purgatory.timer.closed
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError, match="shut down"):
        purgatory.try_complete_else_watch(MockOp(5), ["k"])


def test_shutdown_closes_a_passed_timer_and_stops_the_reaper() -> None:
    timer = SystemTimer("passed", clock=SystemClock())
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory("passed", timer=timer)
    with purgatory:
        reaper = purgatory._reaper
        assert reaper is not None and reaper.is_alive()
        purgatory.try_complete_else_watch(MockOp(600_000), ["k"])
    assert not reaper.is_alive()
    assert timer.closed


def test_exception_in_on_complete_is_logged_by_the_timer(
    purgatory: DelayedOperationPurgatory[MockOp],
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Boom(MockOp):
        __slots__ = ()

        def on_complete(self) -> None:
            raise RuntimeError("boom")

    bad = Boom(10)
    good = MockOp(10)
    purgatory.try_complete_else_watch(bad, ["k"])
    purgatory.try_complete_else_watch(good, ["k"])
    clock.advance(10)
    purgatory.advance_clock(0)
    assert good.events == ["complete", "expire"]
    assert bad.is_completed
    assert any("boom" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


# -- model check of the deterministic mode ---------------------------------------------------

_KEYS = ["a", "b", "c", ("t", 0), 5]

_ACTIONS = st.lists(
    st.one_of(
        st.tuples(
            st.just("open"),
            st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3),
            st.integers(-5, 300),
            st.booleans(),
        ),
        st.tuples(st.just("signal"), st.sampled_from(_KEYS)),
        st.tuples(st.just("cancel"), st.sampled_from(_KEYS)),
        st.tuples(st.just("advance"), st.integers(0, 120)),
        st.tuples(st.just("purge")),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(actions=_ACTIONS, tick_ms=st.sampled_from([1, 3, 10]))
def test_deterministic_mode_matches_a_model(actions: list[tuple[Any, ...]], tick_ms: int) -> None:
    """Random opens, signals, cancels and clock moves against a plain model.

    A signal on a key makes every op watching it completable and checks the key;
    an op expires at the first advance_clock with the clock at or past the start
    of the tick holding its expiration (never before its delay when tick_ms=1).
    """
    clock = ManualClock(0)
    timer = SystemTimer("model", tick_ms=tick_ms, clock=clock, executor="inline")
    purgatory: DelayedOperationPurgatory[MockOp] = DelayedOperationPurgatory(
        "model", timer=timer, purge_interval=3, reaper_enabled=False
    )
    shared = threading.RLock()
    # op -> [keys, expiration_ms, state]; state: pending, completed, expired, cancelled
    model: dict[int, list[Any]] = {}
    ops: dict[int, MockOp] = {}
    for action in actions:
        kind = action[0]
        if kind == "open":
            _, keys, delay, ready = action
            op = MockOp(delay, lock=shared)
            op.completable = ready
            ops[id(op)] = op
            wheel_now = timer.snapshot().levels[0].current_time_ms
            completed = purgatory.try_complete_else_watch(op, keys)
            assert completed is ready
            if ready:
                model[id(op)] = [keys, None, "completed"]
            elif delay + clock.now_ms() < wheel_now + tick_ms:
                model[id(op)] = [keys, None, "expired"]  # due at once: ran inline
            else:
                model[id(op)] = [keys, delay + clock.now_ms(), "pending"]
        elif kind == "signal":
            key = action[1]
            expected = [i for i, m in model.items() if m[2] == "pending" and key in m[0]]
            for i, m in model.items():  # the event concerns every op of the key, done or not
                if key in m[0]:
                    ops[i].completable = True
            assert purgatory.check_and_complete(key) == len(expected)
            for i in expected:
                model[i][2] = "completed"
        elif kind == "cancel":
            key = action[1]
            to_cancel = {i for i, m in model.items() if m[2] == "pending" and key in m[0]}
            cancelled = purgatory.cancel_for_key(key)
            assert {id(op) for op in cancelled} == to_cancel
            for i in to_cancel:
                model[i][2] = "cancelled"
        elif kind == "advance":
            clock.advance(action[1])
            purgatory.advance_clock(0)
            now = clock.now_ms()
            for m in model.values():
                if m[2] == "pending" and m[1] // tick_ms * tick_ms <= now:
                    m[2] = "expired"
        else:
            purgatory.purge_completed()
            live = sum(len(m[0]) for m in model.values() if m[2] == "pending")
            assert purgatory.watched == live
        # After every step: the timer, the counters and each op agree with the model.
        states = [m[2] for m in model.values()]
        assert purgatory.num_delayed == states.count("pending")
        assert purgatory.num_completed == states.count("completed")
        assert purgatory.num_expired == states.count("expired")
        assert purgatory.num_cancelled == states.count("cancelled")
        live = sum(len(m[0]) for m in model.values() if m[2] == "pending")
        assert purgatory.watched >= live
        for i, m in model.items():
            want = {
                "pending": [],
                "cancelled": [],
                "completed": ["complete"],
                "expired": ["complete", "expire"],
            }[m[2]]
            assert ops[i].events == want
            assert ops[i].is_completed is (m[2] in ("completed", "expired"))
    timer._check()
    purgatory.shutdown()
