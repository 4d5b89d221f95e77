"""Tests for DelayedFuturePurgatory (Kafka's DelayedFuturePurgatory)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError
from typing import Any

import pytest

from tickwheel import DelayedFuturePurgatory, ManualClock, SystemClock, SystemTimer

WAIT_S = 10.0  # bound for every wait on another thread; never a timing assertion


def _executor_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"DelayedExecutor-{name}")]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(0)


@pytest.fixture
def purgatory(clock: ManualClock) -> Iterator[DelayedFuturePurgatory]:
    timer = SystemTimer("df", clock=clock, executor="inline")
    with DelayedFuturePurgatory("df", timer=timer, reaper_enabled=False) as p:
        yield p


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def test_done_futures_complete_at_once_on_the_caller_thread(
    purgatory: DelayedFuturePurgatory,
) -> None:
    threads: list[str] = []
    futures = [_done(1), _done(2)]
    op = purgatory.try_complete_else_watch(
        1000, futures, lambda: threads.append(threading.current_thread().name)
    )
    assert op.is_completed
    assert threads == [threading.current_thread().name]
    assert not purgatory.executor_started
    assert _executor_threads("df") == []
    assert purgatory.num_delayed == 0 and purgatory.watched == 0
    assert [f.result() for f in op.futures] == [1, 2]


def test_no_futures_completes_at_once(purgatory: DelayedFuturePurgatory) -> None:
    calls: list[int] = []
    op = purgatory.try_complete_else_watch(1000, [], lambda: calls.append(1))
    assert op.is_completed and calls == [1]
    assert not purgatory.executor_started


def test_futures_completed_later_complete_through_the_executor(
    purgatory: DelayedFuturePurgatory,
) -> None:
    f1: Future[int] = Future()
    f2: Future[int] = Future()
    threads: list[str] = []
    called = threading.Event()

    def callback() -> None:
        threads.append(threading.current_thread().name)
        called.set()

    op = purgatory.try_complete_else_watch(60_000, [_done(0), f1, f2], callback)
    assert not op.is_completed and purgatory.num_delayed == 1
    assert not purgatory.executor_started
    f1.set_result(1)
    assert not purgatory.executor_started  # f2 still pending: nothing to do yet
    completer = threading.Thread(target=f2.set_result, args=(2,), name="completer")
    completer.start()
    completer.join(WAIT_S)
    assert called.wait(WAIT_S)
    assert op.is_completed and threads[0].startswith("DelayedExecutor-df")
    assert len(threads) == 1
    assert purgatory.executor_started
    assert purgatory.num_delayed == 0  # completing cancelled the timer entry
    assert [f.result() for f in op.futures] == [0, 1, 2]


def test_expired_op_fails_pending_futures_with_timeout_error(
    purgatory: DelayedFuturePurgatory, clock: ManualClock
) -> None:
    done = _done("ok")
    pending: Future[str] = Future()
    seen: list[bool] = []
    op = purgatory.try_complete_else_watch(50, [done, pending], lambda: seen.append(pending.done()))
    clock.advance(49)
    purgatory.purgatory.advance_clock(0)
    assert not op.is_completed and seen == []
    clock.advance(1)
    purgatory.purgatory.advance_clock(0)
    assert op.is_completed
    assert seen == [True]  # the futures are settled before the callback runs
    with pytest.raises(TimeoutError, match="50 ms"):
        pending.result(timeout=0)
    assert done.result(timeout=0) == "ok"
    assert purgatory.purgatory.num_expired == 1
    # A late result cannot run the callback again.
    assert not purgatory.executor_started
    assert seen == [True]


def test_callback_runs_once_when_completion_and_expiry_race(clock: ManualClock) -> None:
    for _ in range(30):
        timer = SystemTimer("race", clock=clock, executor="inline")
        calls: list[int] = []
        with DelayedFuturePurgatory("race", timer=timer, reaper_enabled=False) as p:
            future: Future[int] = Future()
            op = p.try_complete_else_watch(10, [future], functools.partial(calls.append, 1))
            clock.advance(10)
            expirer = threading.Thread(target=p.purgatory.advance_clock, args=(0,))
            expirer.start()
            with contextlib.suppress(InvalidStateError):
                future.set_result(1)
            expirer.join(WAIT_S)
            assert not expirer.is_alive()
            p.shutdown()  # waits for the executor, if it got the completion
            assert op.is_completed
            assert calls == [1]


def test_reaper_expires_on_the_system_clock() -> None:
    called = threading.Event()
    with DelayedFuturePurgatory("sys", timer=SystemTimer("sys", clock=SystemClock())) as p:
        pending: Future[int] = Future()
        p.try_complete_else_watch(5, [pending], called.set)
        assert called.wait(WAIT_S)
        assert isinstance(pending.exception(timeout=0), TimeoutError)
    assert p.is_shutdown


def test_bad_arguments(purgatory: DelayedFuturePurgatory) -> None:
    with pytest.raises(TypeError, match="Future"):
        purgatory.try_complete_else_watch(10, [42], print)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="callback"):
        purgatory.try_complete_else_watch(10, [], 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay_ms"):
        purgatory.try_complete_else_watch(1.5, [], print)  # type: ignore[arg-type]


def test_shutdown_stops_the_executor_thread(clock: ManualClock) -> None:
    before = set(threading.enumerate())
    timer = SystemTimer("stop", clock=clock, executor="inline")
    p = DelayedFuturePurgatory("stop", timer=timer, reaper_enabled=False)
    done = threading.Event()
    future: Future[int] = Future()
    p.try_complete_else_watch(60_000, [future], done.set)
    future.set_result(1)
    assert done.wait(WAIT_S)
    assert p.executor_started
    p.shutdown()
    p.shutdown()  # idempotent
    assert p.is_shutdown and timer.closed
    assert set(threading.enumerate()) <= before
