"""The compiled core and the pure-Python reference, driven by the same random steps, agree.

Both run in this process: ``tickwheel`` is the package as installed (compiled
when the extension was built) and ``load_pure()`` gives an independent copy on
the pure path, as CPython tests ``heapq`` against ``_heapq``. Every step's
return value, every size, every snapshot, and the order and time of every
firing must be identical. Without the extension there is nothing to compare,
and the tests say so (``make test`` checks that the extension was built).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tickwheel
import tickwheel.aio
import tickwheel.pipeline.core
import tickwheel.pipeline.rules
from support.paths import load_pure

pytestmark = pytest.mark.skipif(
    not tickwheel.COMPILED, reason="the compiled core is not built: only one path to test"
)

PURE = load_pure()

_delays = st.integers(min_value=-5, max_value=70_000)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), _delays),
        st.tuples(st.just("add"), _delays),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("move"), st.integers(0, 200), _delays),
        st.tuples(st.just("advance"), st.integers(0, 25_000)),
        st.tuples(st.just("snapshot")),
    ),
    max_size=120,
)


class _Driver:
    """One path's SystemTimer on a ManualClock, logging what it fires and returns."""

    def __init__(self, pkg: ModuleType, tick: int, size: int, start: int) -> None:
        self.pkg = pkg
        self.clock = pkg.ManualClock(start)
        self.timer = pkg.SystemTimer(
            tick_ms=tick, wheel_size=size, clock=self.clock, executor="inline"
        )
        self.tasks: list[Any] = []
        self.log: list[tuple[Any, ...]] = []

    def _fire(self, task_id: int) -> None:
        self.log.append(("fired", task_id, self.clock.now_ms()))

    def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "schedule":
            task = self.timer.schedule(step[1], self._fire, len(self.tasks))
            self.tasks.append(task)
        elif kind == "add":
            task = self.pkg.TimerTask(step[1], self._fire, len(self.tasks))
            self.tasks.append(task)
            self.timer.add(task)
        elif kind == "cancel" and self.tasks:
            self.log.append(("cancel", self.tasks[step[1] % len(self.tasks)].cancel()))
        elif kind == "move" and self.tasks:
            task = self.tasks[step[1] % len(self.tasks)]
            task.delay_ms = step[2]
            self.timer.add(task)
        elif kind == "advance":
            self.clock.advance(step[1])
            self.log.append(("advance", self.timer.advance_clock(0)))
        elif kind == "snapshot":
            self.log.append(("snapshot", dataclasses.astuple(self.timer.snapshot())))
        self.log.append(("size", self.timer.size))
        self.log.append(("states", tuple((t.is_pending, t.is_cancelled) for t in self.tasks)))
        self.timer._check()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tick=st.sampled_from([1, 2, 3, 7, 10]),
    size=st.sampled_from([2, 3, 4, 8, 20]),
    start=st.integers(0, 10**6),
    steps=_steps,
)
def test_system_timers_agree(
    tick: int, size: int, start: int, steps: list[tuple[Any, ...]]
) -> None:
    compiled = _Driver(tickwheel, tick, size, start)
    pure = _Driver(PURE, tick, size, start)
    assert type(compiled.timer).__mro__[1].__module__ == "tickwheel._speedups"
    assert type(pure.timer).__mro__[1].__module__ == "tickwheel._timer"
    for step in steps:
        compiled.step(step)
        pure.step(step)
        assert compiled.log == pure.log, step
    # Drain whatever is left: the same tasks fire at the same times.
    for driver in (compiled, pure):
        driver.clock.advance(10**7)
        driver.timer.advance_clock(0)
    assert compiled.log == pure.log
    assert compiled.timer.size == pure.timer.size == 0


_aio_steps = st.lists(
    st.one_of(
        st.tuples(st.just("call_later"), st.floats(0, 40, allow_nan=False)),
        st.tuples(st.just("call_at"), st.floats(-1, 40, allow_nan=False)),
        # Beyond the wheel's range (kept aside, or due at once) and far within it.
        st.tuples(st.just("call_later"), st.sampled_from([math.inf, 1e300, 2.0**61, 1e12])),
        st.tuples(st.just("call_at"), st.sampled_from([math.inf, -math.inf, -1e300, 1e300])),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("sleep"), st.floats(0, 5, allow_nan=False)),
    ),
    max_size=80,
)


def _run_aio(pkg: ModuleType, tick: int, steps: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Run ``steps`` on one path's AsyncTimer over a virtual-time loop; return what happened."""
    loop = pkg.aio.VirtualClockEventLoop(start=1000.0)
    log: list[tuple[Any, ...]] = []

    def fire(handle_id: int) -> None:
        log.append(("fired", handle_id, loop.time()))

    async def main() -> None:
        timer = pkg.aio.AsyncTimer(tick_ms=tick)
        handles: list[Any] = []
        for step in steps:
            kind = step[0]
            if kind == "call_later":
                handle = timer.call_later(step[1], fire, len(handles))
            elif kind == "call_at":
                handle = timer.call_at(loop.time() + step[1], fire, len(handles))
            elif kind == "cancel":
                if handles:
                    handles[step[1] % len(handles)].cancel()
                continue
            else:
                await asyncio.sleep(step[1])
                log.append(("slept", loop.time(), timer.size))
                continue
            handles.append(handle)
            log.append(("scheduled", handle.when(), handle.expiration_ms, timer.size))
            timer._check()
        await asyncio.sleep(100)
        log.append(("end", timer.size, [h.cancelled() for h in handles]))
        timer.close()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tick=st.sampled_from([1, 2, 5]), steps=_aio_steps)
def test_async_timers_agree(tick: int, steps: list[tuple[Any, ...]]) -> None:
    assert tickwheel.aio.AsyncTimer.__mro__[1].__module__ == "tickwheel._speedups"
    assert PURE.aio.AsyncTimer.__mro__[1].__module__ == "tickwheel.aio._timer"
    assert _run_aio(tickwheel, tick, steps) == _run_aio(PURE, tick, steps)


def test_the_pure_copy_is_independent() -> None:
    assert PURE.COMPILED is False
    assert PURE.TimerTask is not tickwheel.TimerTask
    assert PURE.TimerTask.__module__ == "tickwheel._task"
    import sys

    assert sys.modules["tickwheel"] is tickwheel


def test_the_compiled_timer_takes_its_lock_in_c() -> None:
    # A timer built with another lock type still works, through acquire/release
    # calls, but at twice the cost of an add: the compiled core must get its own.
    from tickwheel import _speedups  # type: ignore[attr-defined]

    with tickwheel.SystemTimer(executor="inline") as timer:
        assert type(timer._lock) is _speedups.Lock
        assert timer._staged._lock is timer._lock
        assert all(b._lock is timer._lock for b in timer._wheel.buckets)


def test_the_compiled_lock_behaves_like_threading_lock() -> None:
    import threading

    from tickwheel import _speedups  # type: ignore[attr-defined]

    lock = _speedups.Lock()
    assert lock.acquire() and lock.locked()
    assert not lock.acquire(False)
    assert not lock.acquire(timeout=0.01)
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, 1)
    lock.release()
    with pytest.raises(RuntimeError, match="unlocked"):
        lock.release()
    # threading.Condition waits on it: the waiter holds the lock from ``ready``
    # until wait() releases it, so the notify below cannot come too early.
    cond = threading.Condition(lock)
    ready = threading.Event()
    woke: list[bool] = []

    def waiter() -> None:
        with cond:
            ready.set()
            woke.append(cond.wait(5.0))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert ready.wait(5.0)
    with cond:
        cond.notify_all()
    thread.join(5.0)
    assert woke == [True]


# -- the pipeline's per-partition loop ------------------------------------------------

PURE_PIPELINE = load_pure("tickwheel.pipeline.core", "tickwheel.pipeline.rules")

_pipeline_events = st.lists(
    st.tuples(
        st.integers(0, 1),  # rule
        st.sampled_from(["a", "b", "c", "d"]),  # key
        # time step from the previous event: often a timeout, so that events
        # land on deadlines and on the ends of the markers' retention
        st.one_of(st.integers(0, 400), st.sampled_from([1, 37, 100])),
        st.integers(0, 2),  # kind: open, complete, cancel
    ),
    max_size=60,
)


def _run_partition(
    pkg: ModuleType,
    steps: list[tuple[int, str, int, int]],
    cut: int,
    lateness: int,
    start: int,
    retention: int | None,
) -> list[Any]:
    """Two runs of one partition, the state carried between them; every output of each."""
    core = pkg.pipeline.core
    rules = [
        pkg.pipeline.rules.Rule("pay", "order", ("created",), ("paid",), ("cancelled",), 100),
        pkg.pipeline.rules.Rule("ship", "order", ("packed",), ("shipped",), ("lost",), 37),
    ]
    types = (("created", "paid", "cancelled"), ("packed", "shipped", "lost"))
    events, time = [], start
    for i, (rule, key, step, kind) in enumerate(steps):
        time += step
        events.append(core.Event(rule, key, time, i % 3, f"e{i}", kind, types[rule][kind]))
    events.sort(key=lambda e: (e.time, e.seq, e.event_id, e.rule))
    out: list[Any] = []
    state = None
    for part in (events[:cut], events[cut:]):
        proc = core.PartitionProcessor(rules, lateness, state=state, retention_ms=retention)
        watermark = part[-1].time - lateness if part else None
        proc.process(part, watermark)
        proc.finish(watermark)
        out.append(
            (
                proc.take_outcomes(),
                proc.take_unmatched(),
                proc.pending_operations(),
                proc.num_pending,
                proc.expired_markers(),
                [tuple(e) for e in proc.buffered_events()],
                proc.now_ms,
                proc.max_event_time,
                proc.events_applied,
                proc.events_buffered,
            )
        )
        state = [tuple(row) for row in proc.export_state()]
        out.append(state)
        state = [core.StateRow(*row) for row in state]
        proc.close()
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=_pipeline_events,
    cut=st.integers(0, 60),
    lateness=st.sampled_from([0, 50, 300]),
    start=st.integers(0, 10**6),
    retention=st.sampled_from([None, 0, 1, 37, 100, 500]),
)
def test_partition_loops_agree(
    steps: list[tuple[int, str, int, int]],
    cut: int,
    lateness: int,
    start: int,
    retention: int | None,
) -> None:
    import tickwheel.pipeline.core

    compiled_core = tickwheel.pipeline.core.PartitionProcessor.__mro__[1]
    assert compiled_core.__module__ == "tickwheel.pipeline._loop"
    assert PURE_PIPELINE.pipeline.core.PartitionProcessor.__mro__[1].__module__ == (
        "tickwheel.pipeline.core"
    )
    assert _run_partition(tickwheel, steps, cut, lateness, start, retention) == _run_partition(
        PURE_PIPELINE, steps, cut, lateness, start, retention
    )


@pytest.mark.parametrize("wheel_size", [2, 20, 512, 4096])
@pytest.mark.parametrize("tick", [1, 1000])
def test_far_delays_fire_alike_on_both_paths(wheel_size: int, tick: int) -> None:
    # A level's span beyond int64 (1 ms x 512**7 = 2**63, or 63 levels of 2) saturates
    # in the compiled wheel, where the pure one grows past int64: both must place and
    # fire the longest delays alike, at clock times across the whole range.
    delays = [1 << 62, (1 << 62) - 1, 1 << 61, 10**18, 1 << 55, 12_345, -(1 << 62)]
    for start in (0, 10**15, (1 << 62) - 1 - (1 << 61)):
        seen = []
        for pkg in (tickwheel, PURE):
            clock = pkg.ManualClock(start)
            timer = pkg.SystemTimer(
                tick_ms=tick, wheel_size=wheel_size, clock=clock, executor="inline"
            )
            fired: list[int] = []
            for delay in delays:
                timer.schedule(delay, fired.append, delay)
            log = [(start, sorted(fired), timer.size, timer._check())]
            times = {start + d + off for d in delays for off in (-tick, -1, 0)}
            for t in sorted(t for t in times if start < t < 1 << 62):
                clock.set(t)
                timer.advance_clock(0)
                log.append((t, sorted(fired), timer.size, timer._check()))
            timer.close()
            seen.append(log)
        assert seen[0] == seen[1]
        # Every delay whose tick the clock reached fired (a wheel fires up to a tick early).
        last = seen[0][-1][0]
        reachable = [d for d in delays if (start + d) // tick * tick <= last]
        assert seen[0][-1][1] == sorted(reachable)
