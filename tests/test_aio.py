"""AsyncTimer: scheduling, ordering, never-early, cancellation, the one loop timer, close."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import math
import random
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tickwheel.aio as aio
import tickwheel.aio._handle as aio_handle
from aio_support import new_loop, our_loop_handles, pending_loop_handles, run
from tickwheel.aio import AsyncTimer, TimerHandle, VirtualClockEventLoop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def loop() -> Iterator[VirtualClockEventLoop]:
    lp = new_loop()
    yield lp
    lp.close()


def test_all_is_pinned_and_documented() -> None:
    assert set(aio.__all__) == {
        "AsyncTimer",
        "EventLoop",
        "EventLoopPolicy",
        "Timeout",
        "TimerHandle",
        "VirtualClockEventLoop",
        "call_at",
        "call_later",
        "get_timer",
        "install",
        "new_event_loop",
        "new_uvloop_event_loop",
        "sleep",
        "timeout",
        "timeout_at",
        "wait_for",
    }
    assert aio.__doc__
    for name in aio.__all__:
        obj = getattr(aio, name)
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj) and obj.__module__.startswith("tickwheel"):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if callable(member) or isinstance(member, property):
                    assert inspect.getdoc(member), f"{name}.{attr} has no docstring"


# -- construction and bad input -------------------------------------------------


@pytest.mark.parametrize(("tick", "size"), [(0, 20), (-1, 20), (1.0, 20), (1, 1), (1, 0)])
def test_bad_geometry(loop: VirtualClockEventLoop, tick: Any, size: Any) -> None:
    with pytest.raises(ValueError, match=r"tick_ms|wheel_size"):
        AsyncTimer(tick, size, loop=loop)


def test_needs_a_loop() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        AsyncTimer()
    with pytest.raises(TypeError, match="loop must be"):
        AsyncTimer(loop=object())  # type: ignore[arg-type]


def test_defaults_to_the_running_loop(loop: VirtualClockEventLoop) -> None:
    async def main() -> AsyncTimer:
        return AsyncTimer()

    timer = run(loop, main())
    assert timer.loop is loop
    assert (timer.tick_ms, timer.wheel_size) == (1, 20)


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, -math.inf])
def test_bad_delay_is_a_value_error(loop: VirtualClockEventLoop, delay: float) -> None:
    timer = AsyncTimer(loop=loop)
    with pytest.raises(ValueError, match="delay"):
        timer.call_later(delay, print)
    with pytest.raises(ValueError, match="delay"):
        run(loop, timer.sleep(delay))
    with pytest.raises(ValueError, match="delay"):
        timer.timeout(delay)
    assert timer.size == 0


@pytest.mark.parametrize("delay", ["1", None, True, [1]])
def test_delay_of_wrong_type_is_a_type_error(loop: VirtualClockEventLoop, delay: Any) -> None:
    timer = AsyncTimer(loop=loop)
    with pytest.raises(TypeError, match="delay"):
        timer.call_later(delay, print)


def test_bad_when_is_a_value_error(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    with pytest.raises(ValueError, match="when"):
        timer.call_at(math.nan, print)
    with pytest.raises(TypeError, match="when"):
        timer.call_at("5", print)  # type: ignore[arg-type]
    assert timer.size == 0


@pytest.mark.parametrize("far", [math.inf, 1e300, 2.0**61, 1e12])
def test_infinite_and_huge_deadlines_never_fire_and_cancel_at_once(
    loop: VirtualClockEventLoop, far: float
) -> None:
    # As on asyncio's heap: inf never comes due, a huge deadline is far away.
    # Those beyond the wheel's range are kept aside; 1e12 s is within it.
    timer = AsyncTimer(loop=loop)
    fired: list[str] = []
    later = timer.call_later(far, fired.append, "later")
    at = timer.call_at(far, fired.append, "at")
    timer.call_later(0.5, fired.append, "near")
    assert (later.when(), at.when()) == (loop.time() + far, far)
    assert timer.size == 3
    timer._check()

    async def main() -> None:
        slept = asyncio.ensure_future(timer.sleep(far))
        async with timer.timeout(far) as cm:
            assert cm.when() == loop.time() + far
            await asyncio.sleep(2.0)
        assert timer.size == 3
        slept.cancel()
        await asyncio.gather(slept, return_exceptions=True)

    run(loop, main())
    assert fired == ["near"] and timer.size == 2
    timer._check()
    later.cancel()
    assert timer.size == 1 and later.cancelled()
    timer.close()
    assert at.cancelled() and timer.size == 0


def test_past_deadlines_beyond_the_range_run_on_the_next_iteration(
    loop: VirtualClockEventLoop,
) -> None:
    timer = AsyncTimer(loop=loop)
    fired: list[float] = []
    for when in (-math.inf, -1e300, loop.time() - 5.0):
        timer.call_at(when, fired.append, when)
    assert fired == [] and timer.size == 3
    run(loop, asyncio.sleep(0))
    assert fired == [-math.inf, -1e300, loop.time() - 5.0]
    assert timer.size == 0


def test_non_callable_is_a_type_error(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    with pytest.raises(TypeError, match="callable"):
        timer.call_later(1.0, "print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        timer.call_at(loop.time(), None)  # type: ignore[arg-type]
    assert timer.size == 0


def _layout(timer: AsyncTimer) -> tuple[Any, ...]:
    """Everything about where a timer's handles sit: levels, buckets, queue, arming."""
    levels = [
        (
            wheel.current_time_ms,
            [(b.expiration_ms, [e.expiration_ms for e in b]) for b in wheel.buckets],
        )
        for wheel in timer._wheel.levels()
    ]
    queue = [(exp, b.level, b.index) for exp, b in timer._queue.entries()]
    staged = [e.expiration_ms for e in timer._staged]
    return levels, queue, staged, timer._armed_ms, timer.size, len(timer._ready)


@pytest.mark.parametrize(("tick", "size"), [(1, 20), (7, 4)])
def test_call_later_places_handles_exactly_like_call_at(
    loop: VirtualClockEventLoop, tick: int, size: int
) -> None:
    # call_later inlines call_at's insertion (_schedule): both must build the same wheel.
    a = AsyncTimer(tick, size, loop=loop)
    b = AsyncTimer(tick, size, loop=loop)
    now = loop.time()
    delays = [0.0, 0.0004, 0.001, 0.0015, 0.007, 0.02, 0.5, 3.0, 3.0, 77.7, 1000.0]
    by_later = [a.call_later(d, print) for d in delays]
    by_at = [b.call_at(now + d, print) for d in delays]
    assert [h.when() for h in by_later] == [h.when() for h in by_at]
    assert [h.expiration_ms for h in by_later] == [h.expiration_ms for h in by_at]
    assert _layout(a) == _layout(b)
    a._check()
    b._check()
    a.close()
    b.close()


def test_int_delays_and_whens_are_accepted(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[int] = []
    timer.call_later(2, out.append, 2)
    timer.call_at(1001, out.append, 1)

    async def main() -> None:
        await asyncio.sleep(3)

    run(loop, main())
    assert out == [1, 2]


# -- ordering and the never-early guarantee -------------------------------------


def _fire_times(
    loop: VirtualClockEventLoop, timer: AsyncTimer, delays: list[float]
) -> tuple[list[TimerHandle], list[tuple[int, float]]]:
    fired: list[tuple[int, float]] = []
    handles = [
        timer.call_later(d, lambda i=i: fired.append((i, loop.time())))
        for i, d in enumerate(delays)
    ]
    return handles, fired


@pytest.mark.parametrize(("tick", "size"), [(1, 20), (1, 2), (7, 4), (1000, 8)])
def test_callbacks_run_in_deadline_order_never_early(
    loop: VirtualClockEventLoop, tick: int, size: int
) -> None:
    rng = random.Random(tick * 31 + size)
    timer = AsyncTimer(tick, size, loop=loop)
    delays = [rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(0, 40)]) for _ in range(1500)]
    handles, fired = _fire_times(loop, timer, delays)
    timer._check()

    async def main() -> None:
        while timer.size:
            await asyncio.sleep(1.0)

    run(loop, main())
    whens = [h.when() for h in handles]
    assert [i for i, _ in fired] == sorted(range(len(delays)), key=lambda i: (whens[i], i))
    for i, at in fired:
        assert at >= whens[i], "ran before its deadline"
        assert at - whens[i] < tick / 1000 + 1e-9, "ran more than a tick late"
    assert timer.size == 0
    timer._check()
    assert not timer.loop_timer_armed


@pytest.mark.parametrize("start", [0.0, 0.1, 1000.0005, 123456.789, 999999.999])
def test_ms_boundaries_never_early(start: float) -> None:
    """Deadlines exactly on, just below and just above millisecond boundaries."""
    loop = new_loop(start)
    try:
        timer = AsyncTimer(loop=loop)
        fired: list[tuple[float, float]] = []
        whens: list[float] = []
        base = math.floor(start * 1000) / 1000
        for k in range(1, 60):
            for when in (
                base + k / 1000,
                math.nextafter(base + k / 1000, math.inf),
                math.nextafter(base + k / 1000, -math.inf),
                start + k * 0.001,
                start + k * 0.0007,
            ):
                whens.append(when)
                timer.call_at(when, lambda w=when: fired.append((w, loop.time())))

        async def main() -> None:
            await asyncio.sleep(1.0)

        run(loop, main())
        assert len(fired) == len(whens)
        assert [w for w, _ in fired] == sorted(whens)
        for when, at in fired:
            assert at >= when
            assert at - when <= 0.001 + 1e-9
    finally:
        loop.close()


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_rounding_helpers_are_exact(x: float) -> None:
    m = aio_handle.ceil_ms(x)
    assert m / 1000 >= x > (m - 1) / 1000
    f = aio_handle.floor_ms(x)
    assert f / 1000 <= x < (f + 1) / 1000


def test_equal_deadlines_run_fifo(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[int] = []
    when = loop.time() + 5.0
    for i in range(50):
        timer.call_at(when, out.append, i)

    async def main() -> None:
        await asyncio.sleep(6)

    run(loop, main())
    assert out == list(range(50))


def test_past_deadline_runs_next_iteration_not_synchronously(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[str] = []

    async def main() -> None:
        timer.call_at(loop.time() - 10, out.append, "past")
        timer.call_later(0, out.append, "zero")
        assert out == []
        await asyncio.sleep(0.01)

    run(loop, main())
    assert out == ["past", "zero"]


def test_never_early_on_a_real_loop() -> None:
    """With the real monotonic clock (asyncio may fire its own timers a hair early)."""
    loop = asyncio.new_event_loop()
    try:
        fired: list[tuple[float, float]] = []

        async def main() -> None:
            timer = AsyncTimer(loop=loop)
            rng = random.Random(5)
            handles: list[TimerHandle] = []

            def cb(i: int) -> None:
                fired.append((handles[i].when(), loop.time()))

            for i in range(200):
                handles.append(timer.call_later(rng.uniform(0, 0.03), cb, i))
            while timer.size:
                await asyncio.sleep(0.005)

        loop.run_until_complete(asyncio.wait_for(main(), 10))
        assert len(fired) == 200
        for when, at in fired:
            assert at >= when
    finally:
        loop.close()


def test_callbacks_can_schedule_and_cancel(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[str] = []
    victim: list[TimerHandle] = []

    def first() -> None:
        out.append("first")
        victim[0].cancel()  # due in the same batch: must not run
        timer.call_later(0.5, out.append, "child")

    when = loop.time() + 1.0
    timer.call_at(when, first)
    victim.append(timer.call_at(when, out.append, "victim"))
    timer.call_at(when, out.append, "third")

    async def main() -> None:
        await asyncio.sleep(2)

    run(loop, main())
    assert out == ["first", "third", "child"]
    assert victim[0].cancelled()


# -- cancellation ---------------------------------------------------------------


class _Payload:
    pass


def test_cancel_frees_the_entry_at_once(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    payload = _Payload()
    ref = weakref.ref(payload)
    handle = timer.call_later(10.0, lambda p: None, payload)
    other = timer.call_later(10.0, print)
    del payload
    assert timer.size == 2
    assert not handle.cancelled()
    handle.cancel()
    assert handle.cancelled()
    assert timer.size == 1
    gc.collect()
    assert ref() is None, "the cancelled handle still holds its arguments"
    handle.cancel()  # idempotent
    assert timer.size == 1
    timer._check()
    other.cancel()
    assert timer.size == 0
    assert handle.when() == pytest.approx(loop.time() + 10.0)


def test_cancel_after_run_only_marks(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[int] = []
    handle = timer.call_later(0.1, out.append, 1)

    async def main() -> None:
        await asyncio.sleep(1)

    run(loop, main())
    assert out == [1]
    assert not handle.cancelled()
    handle.cancel()
    assert handle.cancelled()
    assert timer.size == 0


def test_cancel_a_ready_handle(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[int] = []

    async def main() -> None:
        handle = timer.call_at(loop.time() - 1, out.append, 1)
        assert timer.size == 1
        handle.cancel()
        assert timer.size == 0
        assert len(timer) == 0
        await asyncio.sleep(0.1)

    run(loop, main())
    assert out == []
    assert timer.size == 0


def test_all_cancelled_releases_the_loop_timer(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    handles = [timer.call_later(1.0 + i / 10, print) for i in range(100)]
    assert len(our_loop_handles(loop, timer)) == 1
    for h in handles:
        h.cancel()
    assert timer.size == 0

    async def main() -> None:
        await asyncio.sleep(2)

    run(loop, main())
    assert our_loop_handles(loop, timer) == []
    assert not timer.loop_timer_armed
    timer._check()


# -- the one loop timer ---------------------------------------------------------


class _CountingLoop(VirtualClockEventLoop):
    def __init__(self) -> None:
        super().__init__(start=1000.0)
        self.call_at_count = 0

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        self.call_at_count += 1
        return super().call_at(when, callback, *args, context=context)


def test_exactly_one_loop_timer_rearmed_only_when_the_head_changes() -> None:
    loop = _CountingLoop()
    try:
        timer = AsyncTimer(loop=loop)
        timer.call_later(10.0, print)
        assert loop.call_at_count == 1
        for i in range(200):
            timer.call_later(10.0 + i * 0.05, print)  # all later than the head
        assert loop.call_at_count == 1
        assert len(our_loop_handles(loop, timer)) == 1
        timer.call_later(5.0, print)  # a new, earlier head bucket
        assert loop.call_at_count == 2
        timer.call_later(5.0, print)  # same bucket: no change
        assert loop.call_at_count == 2
        assert len(our_loop_handles(loop, timer)) == 1
        assert len(pending_loop_handles(loop)) == 1
        timer._check()
        timer.close()
        assert our_loop_handles(loop, timer) == []
    finally:
        loop.close()


def test_one_loop_timer_for_many_timers_while_running(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    rng = random.Random(3)
    seen: list[int] = []

    def probe() -> None:
        seen.append(len(our_loop_handles(loop, timer)))
        timer._check()

    for _ in range(300):
        timer.call_later(rng.uniform(0, 20), probe)

    async def main() -> None:
        while timer.size:
            await asyncio.sleep(0.5)

    run(loop, main())
    assert len(seen) == 300
    assert set(seen) <= {0, 1}


# -- exceptions ------------------------------------------------------------------


def test_exception_goes_to_the_loop_handler(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    contexts: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))
    out: list[int] = []

    def boom() -> None:
        raise ZeroDivisionError("boom")

    when = loop.time() + 1
    timer.call_at(when, out.append, 1)
    bad = timer.call_at(when, boom)
    timer.call_at(when, out.append, 2)

    async def main() -> None:
        await asyncio.sleep(2)

    run(loop, main())
    assert out == [1, 2]
    assert len(contexts) == 1
    assert isinstance(contexts[0]["exception"], ZeroDivisionError)
    assert contexts[0]["handle"] is bad
    assert "Exception in callback" in contexts[0]["message"]


def test_system_exit_propagates_and_the_rest_still_runs(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[int] = []

    def leave() -> None:
        raise SystemExit(3)

    when = loop.time() + 1
    timer.call_at(when, out.append, 1)
    timer.call_at(when, leave)
    timer.call_at(when, out.append, 2)
    loop.call_at(when + 5, loop.stop)
    with pytest.raises(SystemExit):
        loop.run_forever()
    assert out == [1]
    assert timer.size == 1
    loop.run_forever()  # until the stop at when + 5
    assert out == [1, 2]
    assert timer.size == 0


# -- contextvars -----------------------------------------------------------------

_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")


def test_context_argument_and_default_context(loop: VirtualClockEventLoop) -> None:
    seen: list[str] = []

    async def main() -> None:
        _var.set("at-timer-creation")
        timer = AsyncTimer()
        _var.set("later")
        ctx = contextvars.copy_context()
        timer.call_later(0.1, lambda: seen.append(_var.get()), context=ctx)
        timer.call_later(0.2, lambda: seen.append(_var.get()))
        await asyncio.sleep(1)

    run(loop, main())
    assert seen == ["later", "at-timer-creation"]


# -- close -------------------------------------------------------------------------


def test_close_cancels_everything_and_is_idempotent(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    handles = [timer.call_later(d, print) for d in (0.0, 0.5, 3.0, 100.0, 5000.0)]
    assert timer.size == 5
    timer.close()
    assert timer.closed
    assert timer.size == 0
    assert all(h.cancelled() for h in handles)
    assert our_loop_handles(loop, timer) == []
    timer.close()
    with pytest.raises(RuntimeError, match="closed"):
        timer.call_later(1.0, print)
    with pytest.raises(RuntimeError, match="closed"):
        timer.call_at(loop.time(), print)
    with pytest.raises(RuntimeError, match="closed"):
        run(loop, timer.sleep(1.0))
    with pytest.raises(RuntimeError, match="closed"):
        run(loop, timer.sleep(0))
    assert "closed" in repr(timer)


def test_async_context_manager_closes(loop: VirtualClockEventLoop) -> None:
    async def main() -> AsyncTimer:
        async with AsyncTimer() as timer:
            timer.call_later(10, print)
            assert timer.size == 1
        return timer

    timer = run(loop, main())
    assert timer.closed
    assert timer.size == 0


# -- hypothesis: the same order as asyncio's own call_later ------------------------

_op = st.tuples(
    st.one_of(
        st.integers(min_value=0, max_value=3000).map(lambda ms: ms / 1000),
        st.floats(min_value=0, max_value=3, allow_nan=False),
    ),
    st.booleans(),  # cancel it before it runs
    st.booleans(),  # when it runs, schedule a follow-up with the same delay
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_op, max_size=40), st.sampled_from([1, 3]))
def test_same_order_as_asyncio_call_later(ops: list[tuple[float, bool, bool]], tick: int) -> None:
    loop = new_loop(500.25)
    try:
        timer = AsyncTimer(tick, 4, loop=loop)
        log: dict[str, list[tuple[float, str]]] = {"wheel": [], "asyncio": []}

        def make(side: str, schedule: Any) -> None:
            def fire(label: str, delay: float, again: bool) -> None:
                log[side].append((loop.time(), label))
                if again:
                    schedule(delay, fire, label + "+", delay, False)

            handles = [schedule(d, fire, str(i), d, again) for i, (d, _, again) in enumerate(ops)]
            for h, (_, cancel, _) in zip(handles, ops, strict=True):
                if cancel:
                    h.cancel()

        make("wheel", timer.call_later)
        make("asyncio", loop.call_later)

        async def main() -> None:
            await asyncio.sleep(10)

        run(loop, main())
        wheel = [label for _, label in log["wheel"]]
        ref = [label for _, label in log["asyncio"]]
        assert sorted(wheel) == sorted(ref)
        # asyncio runs equal deadlines in heap order, so compare deadlines: the
        # wheel runs the original timers in asyncio's deadline order, never
        # before asyncio (which runs them at their deadline here), and at most
        # a tick later (two for follow-ups, whose start was up to a tick late).
        times = {label: t for t, label in log["asyncio"]}
        originals = [times[label] for label in wheel if not label.endswith("+")]
        assert originals == sorted(originals)
        for t, label in log["wheel"]:
            assert t >= times[label] - 1e-9
            late = tick / 1000 * (2 if label.endswith("+") else 1)
            assert t - times[label] <= late + 1e-9
        assert timer.size == 0
    finally:
        loop.close()


def test_exception_in_a_context_callback_names_the_callback(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    contexts: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda lp, ctx: contexts.append(ctx))

    def explode(x: int) -> None:
        raise KeyError(x)

    handle = timer.call_later(0.5, explode, 7, context=contextvars.copy_context())
    # asyncio's repr: the deadline, then the callback with its arguments and source.
    theirs = asyncio.TimerHandle(handle.when(), explode, (7,), loop)
    assert repr(handle) == repr(theirs)
    # The arguments show from 3.13 only in debug mode (asyncio's format_helpers).
    shown = "explode() at" if sys.version_info >= (3, 13) else "explode(7) at"
    assert shown in repr(handle)

    async def main() -> None:
        await asyncio.sleep(1)

    run(loop, main())
    assert len(contexts) == 1
    assert "explode" in contexts[0]["message"]
    assert isinstance(contexts[0]["exception"], KeyError)
    handle.cancel()
    theirs.cancel()
    assert repr(handle) == repr(theirs) == f"<TimerHandle cancelled when={handle.when()}>"
    assert "size=0" in repr(timer)


# -- the virtual clock loop --------------------------------------------------------


def test_virtual_clock_loop_jumps_and_moves_only_forward() -> None:
    loop = VirtualClockEventLoop(start=5.0)
    try:
        assert loop.time() == 5.0
        loop.advance(1.5)
        assert loop.time() == 6.5
        loop.set_time(10.0)
        assert loop.time() == 10.0
        with pytest.raises(ValueError, match="backwards"):
            loop.set_time(9.0)
        with pytest.raises(ValueError, match="seconds"):
            loop.advance(-1)
        with pytest.raises(ValueError, match="seconds"):
            loop.advance(math.nan)
        seen: list[float] = []
        loop.call_at(3600.25, lambda: seen.append(loop.time()))

        async def main() -> None:
            await asyncio.sleep(7200)

        run(loop, main())
        assert seen == [3600.25]  # exactly at the deadline, without sleeping
        assert loop.time() == 10.0 + 7200
    finally:
        loop.close()


def test_virtual_clock_loop_still_does_io() -> None:
    loop = VirtualClockEventLoop()
    try:

        async def main() -> bytes:
            async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                w.write(await r.readline())
                await w.drain()
                w.close()

            server = await asyncio.start_server(echo, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"ping\n")
            line = await reader.readline()
            writer.close()
            server.close()
            await server.wait_closed()
            return line

        # No timer is pending, so the loop waits for I/O in real time (a pending
        # timer would make the clock jump instead); pytest-timeout bounds it.
        assert loop.run_until_complete(main()) == b"ping\n"
    finally:
        loop.close()


def test_works_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop", reason="uvloop is an optional peer (dev extra)")
    loop = uvloop.new_event_loop()
    try:
        fired: list[tuple[float, float]] = []

        async def main() -> int:
            timer = AsyncTimer()
            rng = random.Random(9)
            handles: list[TimerHandle] = []

            def cb(i: int) -> None:
                fired.append((handles[i].when(), loop.time()))

            for i in range(100):
                handles.append(timer.call_later(rng.uniform(0, 0.05), cb, i))
            for h in handles[::4]:
                h.cancel()
            try:
                async with timer.timeout(0.01):
                    await asyncio.sleep(10)
            except TimeoutError:
                pass
            while timer.size:
                await timer.sleep(0.01)
            return len(our_loop_handles_any(timer))

        assert loop.run_until_complete(asyncio.wait_for(main(), 10)) == 0
        assert len(fired) == 75
        assert [w for w, _ in fired] == sorted(w for w, _ in fired)
        assert all(at >= when for when, at in fired)
    finally:
        loop.close()


def our_loop_handles_any(timer: AsyncTimer) -> list[object]:
    """uvloop hides its heap: the timer's own view of its loop timer."""
    return [timer] if timer.loop_timer_armed else []


def test_close_from_a_callback_stops_the_rest_of_the_batch(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    out: list[str] = []

    def closer() -> None:
        out.append("closer")
        timer.close()

    when = loop.time() + 1
    timer.call_at(when, out.append, "before")
    timer.call_at(when, closer)
    after = timer.call_at(when, out.append, "after")
    timer.call_later(5, out.append, "later")

    async def main() -> None:
        await asyncio.sleep(10)

    run(loop, main())
    assert out == ["before", "closer"]
    assert after.cancelled()
    assert timer.size == 0
    assert our_loop_handles(loop, timer) == []
