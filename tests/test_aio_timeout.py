"""sleep, timeout, timeout_at and wait_for behave exactly like asyncio's; nothing leaks."""

from __future__ import annotations

import asyncio
import gc
import random
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

import tickwheel.aio as aio
import tickwheel.aio._default as aio_default
from aio_support import new_loop, our_loop_handles, pending_loop_handles, run
from tickwheel.aio import AsyncTimer, VirtualClockEventLoop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def loop() -> Iterator[VirtualClockEventLoop]:
    lp = new_loop()
    yield lp
    lp.close()


class Impl:
    """One implementation of the asyncio timeout API, by name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.timer: AsyncTimer | None = None

    def start(self) -> None:
        if self.name == "wheel":
            self.timer = AsyncTimer()

    def timeout(self, delay: float | None) -> Any:
        return asyncio.timeout(delay) if self.timer is None else self.timer.timeout(delay)

    def timeout_at(self, when: float | None) -> Any:
        return asyncio.timeout_at(when) if self.timer is None else self.timer.timeout_at(when)

    async def wait_for(self, aw: Any, delay: float | None) -> Any:
        if self.timer is None:
            return await asyncio.wait_for(aw, delay)
        return await self.timer.wait_for(aw, delay)


Scenario = Callable[[Impl, asyncio.AbstractEventLoop], Coroutine[Any, Any, list[Any]]]


def compare(scenario: Scenario) -> list[Any]:
    """Run ``scenario`` with asyncio's and the wheel's timeouts; return the (equal) observations."""
    results = {}
    for name in ("asyncio", "wheel"):
        loop = new_loop(2000.0)
        try:
            impl = Impl(name)

            async def main(impl: Impl = impl, loop: asyncio.AbstractEventLoop = loop) -> list[Any]:
                impl.start()
                return await scenario(impl, loop)

            results[name] = run(loop, main())
        finally:
            loop.close()
    assert results["wheel"] == results["asyncio"]
    return results["wheel"]


def _exc(e: BaseException | None) -> str | None:
    return None if e is None else type(e).__name__


# -- timeout ---------------------------------------------------------------------


async def _interrupt_long_await(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []
    task = asyncio.current_task()
    assert task is not None
    start = loop.time()
    cm = impl.timeout(2.5)
    obs.append(("when", cm.when() - start))
    try:
        async with cm:
            await asyncio.sleep(3600)
    except TimeoutError as e:
        obs.append(("raised", type(e).__name__, _exc(e.__cause__), _exc(e.__context__)))
    obs.append(("elapsed>=2.5", loop.time() - start >= 2.5))
    obs.append(("elapsed<2.6", loop.time() - start < 2.6))
    obs.append(("expired", cm.expired()))
    obs.append(("cancelling", task.cancelling()))
    obs.append(("repr", repr(cm)))
    with pytest.raises(RuntimeError) as info:
        cm.reschedule(loop.time() + 1)
    obs.append(("reschedule-after", str(info.value)))
    return obs


def test_timeout_interrupts_a_long_await_like_asyncio() -> None:
    obs = compare(_interrupt_long_await)
    assert ("raised", "TimeoutError", "CancelledError", "CancelledError") in obs
    assert ("expired", True) in obs
    assert ("cancelling", 0) in obs
    assert ("elapsed>=2.5", True) in obs


async def _no_expiry(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []
    async with impl.timeout(5) as cm:
        await asyncio.sleep(1)
        obs.append(repr(cm).split(" when=")[0])
    obs.append(("expired", cm.expired(), repr(cm)))
    async with impl.timeout(None) as cm2:
        await asyncio.sleep(10)
    obs.append(("none", cm2.when(), cm2.expired()))
    return obs


def test_timeout_that_does_not_expire() -> None:
    obs = compare(_no_expiry)
    assert ("expired", False, "<Timeout [finished]>") in obs


async def _reschedule(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []
    start = loop.time()
    cm = impl.timeout_at(start + 1)
    with pytest.raises(RuntimeError) as info:
        cm.reschedule(start + 2)
    obs.append(str(info.value))
    try:
        async with cm:
            cm.reschedule(start + 4)
            await asyncio.sleep(2)
            obs.append(("alive at 2", cm.expired()))
            cm.reschedule(None)
            await asyncio.sleep(3)
            obs.append(("alive at 5", cm.expired(), cm.when()))
            cm.reschedule(loop.time() - 1)  # in the past: expires on the next iteration
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            obs.append("not reached")
    except TimeoutError:
        obs.append(("timed out at", round(loop.time() - start, 6), cm.expired()))
    return obs


def test_reschedule_like_asyncio() -> None:
    obs = compare(_reschedule)
    assert obs[0] == "Timeout has not been entered"
    assert obs[-1] == ("timed out at", 5.0, True)


async def _outer_cancel_wins(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []

    async def victim() -> None:
        async with impl.timeout(10):
            await asyncio.sleep(3600)

    task = asyncio.ensure_future(victim())
    await asyncio.sleep(1)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        obs.append(("cancelled", task.cancelling()))

    # The timeout expires and, in the same iteration, someone else cancels too.
    async def both() -> None:
        cm = impl.timeout(1)
        try:
            async with cm:
                await asyncio.sleep(3600)
        finally:
            obs.append(("both expired", cm.expired()))

    task2 = asyncio.ensure_future(both())
    loop.call_at(loop.time() + 1, task2.cancel)
    try:
        await task2
        obs.append("no error")
    except BaseException as e:
        obs.append(("both", type(e).__name__))
    return obs


def test_outer_cancellation_is_not_turned_into_timeout() -> None:
    obs = compare(_outer_cancel_wins)
    assert obs[0] == ("cancelled", 1)


async def _nested(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []
    start = loop.time()
    # The inner deadline first.
    async with impl.timeout(10) as outer:
        try:
            async with impl.timeout(1) as inner:
                await asyncio.sleep(3600)
        except TimeoutError:
            obs.append(("inner", round(loop.time() - start, 6)))
        await asyncio.sleep(1)
    obs.append((outer.expired(), inner.expired()))
    # The outer deadline first.
    start = loop.time()
    try:
        async with impl.timeout(1) as outer2:
            try:
                async with impl.timeout(10) as inner2:
                    await asyncio.sleep(3600)
            except TimeoutError:
                obs.append("inner caught it: wrong")
    except TimeoutError:
        obs.append(("outer", round(loop.time() - start, 6)))
    obs.append((outer2.expired(), inner2.expired()))
    task = asyncio.current_task()
    assert task is not None
    obs.append(task.cancelling())
    return obs


def test_nested_timeouts_like_asyncio() -> None:
    obs = compare(_nested)
    assert obs == [("inner", 1.0), (False, True), ("outer", 1.0), (True, False), 0]


async def _misuse(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []
    cm = impl.timeout(5)
    async with cm:
        try:
            async with cm:
                pass
        except RuntimeError as e:
            obs.append(str(e))
    try:
        async with cm:
            pass
    except RuntimeError as e:
        obs.append(str(e))
    # An exception other than cancellation passes through unchanged.
    try:
        async with impl.timeout(5) as cm2:
            raise KeyError("k")
    except KeyError:
        obs.append(("key error", cm2.expired()))
    return obs


def test_misuse_like_asyncio() -> None:
    obs = compare(_misuse)
    assert obs[0] == "Timeout has already been entered"


def test_timeout_outside_a_task(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    errors: list[str] = []

    def not_in_a_task() -> None:
        coro = timer.timeout(1).__aenter__()
        try:
            coro.send(None)
        except RuntimeError as e:
            errors.append(str(e))
        finally:
            coro.close()
        loop.stop()

    loop.call_soon(not_in_a_task)
    loop.run_forever()
    assert errors == ["Timeout should be used inside a task"]


def test_timeout_when_validation(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)
    with pytest.raises(ValueError, match="when"):
        timer.timeout_at(float("nan"))
    with pytest.raises(TypeError, match="when"):
        timer.timeout_at("soon")  # type: ignore[arg-type]


def test_timeout_uses_the_wheel_not_the_loop_heap(loop: VirtualClockEventLoop) -> None:
    async def main() -> None:
        timer = AsyncTimer()
        async with timer.timeout(30):
            assert timer.size == 1
            assert len(our_loop_handles(loop, timer)) == 1
            await asyncio.sleep(1)
        assert timer.size == 0

    run(loop, main())


# -- wait_for --------------------------------------------------------------------


async def _wait_for(impl: Impl, loop: asyncio.AbstractEventLoop) -> list[Any]:
    obs: list[Any] = []

    async def slow(d: float, value: str) -> str:
        await asyncio.sleep(d)
        return value

    obs.append(await impl.wait_for(slow(1, "fast enough"), 2))
    inner = asyncio.ensure_future(slow(5, "too slow"))
    try:
        await impl.wait_for(inner, 2)
    except TimeoutError as e:
        obs.append(("timeout", _exc(e.__cause__), inner.cancelled()))
    obs.append(await impl.wait_for(slow(3, "no limit"), None))
    done: asyncio.Future[str] = loop.create_future()
    done.set_result("already done")
    obs.append(await impl.wait_for(done, 0))
    pending = asyncio.ensure_future(slow(1, "never"))
    try:
        await impl.wait_for(pending, 0)
    except TimeoutError:
        obs.append(("zero", pending.cancelled()))

    async def fails() -> None:
        await asyncio.sleep(0.5)
        raise KeyError("inner")

    try:
        await impl.wait_for(fails(), 2)
    except KeyError:
        obs.append("inner error passes")
    task = asyncio.current_task()
    assert task is not None
    obs.append(task.cancelling())
    return obs


def test_wait_for_like_asyncio() -> None:
    obs = compare(_wait_for)
    assert obs == [
        "fast enough",
        ("timeout", "CancelledError", True),
        "no limit",
        "already done",
        ("zero", True),
        "inner error passes",
        0,
    ]


def test_wait_for_bad_delay(loop: VirtualClockEventLoop) -> None:
    timer = AsyncTimer(loop=loop)

    async def main() -> None:
        coro = asyncio.sleep(1)
        try:
            with pytest.raises(ValueError, match="delay"):
                await timer.wait_for(coro, -1)
        finally:
            coro.close()

    run(loop, main())


# -- sleep -----------------------------------------------------------------------


def test_sleep(loop: VirtualClockEventLoop) -> None:
    async def main() -> None:
        timer = AsyncTimer()
        start = loop.time()
        assert await timer.sleep(1.5, "result") == "result"
        assert 1.5 <= loop.time() - start <= 1.501
        assert await timer.sleep(0) is None
        assert timer.size == 0

    run(loop, main())


def test_sleep_zero_yields(loop: VirtualClockEventLoop) -> None:
    out: list[str] = []

    async def main() -> None:
        timer = AsyncTimer()
        loop.call_soon(out.append, "other")
        await timer.sleep(0)
        out.append("after sleep")

    run(loop, main())
    assert out == ["other", "after sleep"]


# -- module functions and the default timer ------------------------------------


def test_module_functions_use_one_default_timer_per_loop(loop: VirtualClockEventLoop) -> None:
    out: list[str] = []

    async def main() -> AsyncTimer:
        timer = aio.get_timer()
        assert aio.get_timer() is timer
        assert aio.get_timer(loop) is timer
        aio.call_later(0.5, out.append, "later")
        aio.call_at(loop.time() + 0.25, out.append, "at")
        assert timer.size == 2
        await aio.sleep(1)
        try:
            async with aio.timeout(1):
                await asyncio.sleep(5)
        except TimeoutError:
            out.append("timeout")
        try:
            async with aio.timeout_at(loop.time() + 1):
                await asyncio.sleep(5)
        except TimeoutError:
            out.append("timeout_at")
        assert await aio.wait_for(asyncio.sleep(1, "ok"), 5) == "ok"
        return timer

    timer = run(loop, main())
    assert out == ["at", "later", "timeout", "timeout_at"]
    other = new_loop()
    try:

        async def other_main() -> AsyncTimer:
            return aio.get_timer()

        assert run(other, other_main()) is not timer
    finally:
        other.close()
    timer.close()

    async def again() -> AsyncTimer:
        return aio.get_timer()

    assert run(loop, again()) is not timer  # a closed default timer is replaced


def test_default_timers_of_closed_loops_are_dropped() -> None:
    for _ in range(3):
        lp = new_loop()

        async def main() -> None:
            aio.get_timer()

        run(lp, main())
        lp.close()
    lp = new_loop()
    try:
        run(lp, main())
        assert all(not old.is_closed() for old in aio_default._default_timers)
    finally:
        lp.close()


def test_module_functions_need_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        aio.timeout(1)
    with pytest.raises(RuntimeError):
        aio.call_later(1, print)


# -- leaks -------------------------------------------------------------------------


class _Token:
    pass


def test_no_leak_when_tasks_are_cancelled_while_sleeping_or_in_timeout(
    loop: VirtualClockEventLoop,
) -> None:
    n = 3000
    refs: list[weakref.ref[_Token]] = []

    async def sleeper(timer: AsyncTimer, d: float) -> None:
        token = _Token()
        refs.append(weakref.ref(token))
        await timer.sleep(d, token)

    async def in_timeout(timer: AsyncTimer, d: float) -> None:
        token = _Token()
        refs.append(weakref.ref(token))
        async with timer.timeout(d):
            await loop.create_future()  # never done
        del token

    async def main() -> AsyncTimer:
        timer = AsyncTimer()
        rng = random.Random(11)
        tasks = [
            asyncio.ensure_future((sleeper if i % 2 else in_timeout)(timer, rng.uniform(10, 3600)))
            for i in range(n)
        ]
        await asyncio.sleep(1)
        assert timer.size == n
        assert len(our_loop_handles(loop, timer)) == 1
        for t in tasks:
            t.cancel()
        done, pending = await asyncio.wait(tasks, timeout=60)
        assert not pending
        assert all(t.cancelled() for t in done)
        assert timer.size == 0
        timer._check()
        await asyncio.sleep(3600)  # let the stale head fire: it finds nothing
        return timer

    timer = run(loop, main())
    assert timer.size == 0
    assert not timer.loop_timer_armed
    assert our_loop_handles(loop, timer) == []
    assert pending_loop_handles(loop) == []
    gc.collect()
    assert len(refs) == n
    assert all(r() is None for r in refs)
    timer._check()
