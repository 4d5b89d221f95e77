"""tickwheel.aio.EventLoop: asyncio's loop with its timers on the wheel, as a drop-in."""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys

import pytest

import tickwheel
import tickwheel.aio as aio

pytestmark = pytest.mark.timeout(60)

REQUEST = contextvars.ContextVar("request", default="none")


def _real_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    """The loop's own (heap) timers that are still live."""
    return [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]


def test_one_line_puts_asyncios_own_timers_on_the_wheel() -> None:
    seen: dict[str, object] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, aio.EventLoop)
        sleepers = [asyncio.ensure_future(asyncio.sleep(5 + i / 100)) for i in range(50)]
        await asyncio.sleep(0)
        seen["wheel"] = loop.wheel_timer.size
        seen["heap"] = len(_real_timers(loop))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(10)
        assert await asyncio.wait_for(asyncio.sleep(0.001, "done"), 5) == "done"
        for task in sleepers:
            task.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
        seen["after"] = loop.wheel_timer.size

    with asyncio.Runner(loop_factory=aio.new_event_loop) as runner:
        runner.run(main())
    assert seen == {"wheel": 50, "heap": 1, "after": 0}


def test_install_and_the_policy_make_event_loops() -> None:
    try:
        aio.install()
        assert isinstance(asyncio.get_event_loop_policy(), aio.EventLoopPolicy)
        loop = asyncio.new_event_loop()
        try:
            assert type(loop) is aio.EventLoop
        finally:
            loop.close()
        assert asyncio.run(_running_loop_type()) is aio.EventLoop
    finally:
        asyncio.set_event_loop_policy(None)


async def _running_loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_callbacks_run_in_a_copy_of_the_callers_context_or_the_one_given() -> None:
    loop = aio.new_event_loop()
    got: list[str] = []
    try:
        REQUEST.set("caller")
        loop.call_later(0.001, lambda: got.append(REQUEST.get()))
        REQUEST.set("changed later")  # the copy was taken at the call
        given = contextvars.copy_context()
        given.run(REQUEST.set, "given")
        loop.call_at(loop.time() + 0.002, lambda: got.append(REQUEST.get()), context=given)
        loop.call_later(0.003, loop.stop)
        loop.run_forever()
    finally:
        loop.close()
        REQUEST.set("none")
    assert got == ["caller", "given"]


def test_never_early_and_past_deadlines_run_on_the_next_iteration() -> None:
    loop = aio.new_event_loop()
    ran: list[tuple[str, bool]] = []
    try:
        for i in range(20):
            handle = loop.call_later(0.0005 * i, lambda h=None: None)
            when = handle.when()
            handle.cancel()
            loop.call_at(when, lambda w=when, n=i: ran.append((f"t{n}", loop.time() >= w)))
        loop.call_later(-1, lambda: ran.append(("negative delay", True)))
        loop.call_at(loop.time() - 5, lambda: ran.append(("past when", True)))
        loop.call_later(0.05, loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert len(ran) == 22 and all(on_time for _, on_time in ran)
    assert {"negative delay", "past when"} <= {name for name, _ in ran}


def test_bad_arguments_are_refused_as_asyncio_refuses_them() -> None:
    loop = aio.new_event_loop()
    try:
        with pytest.raises(TypeError, match="delay must not be None"):
            loop.call_later(None, print)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="when cannot be None"):
            loop.call_at(None, print)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="callable"):
            loop.call_later(1, "not callable")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            loop.call_later("1", print)  # type: ignore[arg-type]
        loop.set_debug(True)

        async def coro() -> None:
            pass

        with pytest.raises(TypeError, match="coroutines cannot be used"):
            loop.call_later(1, coro)
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                loop.call_later(1, print)
            except RuntimeError as exc:
                errors.append(exc)

        async def from_another_thread() -> None:
            await asyncio.wait_for(loop.run_in_executor(None, other_thread), 10)

        # While the loop runs, debug mode refuses calls from other threads.
        loop.run_until_complete(from_another_thread())
        assert errors and "thread" in str(errors[0])
    finally:
        loop.close()


def test_cancel_frees_the_timer_and_close_cancels_the_rest() -> None:
    loop = aio.new_event_loop()
    handles = [loop.call_later(10 + i, print) for i in range(100)]
    assert loop.wheel_timer.size == 100
    for handle in handles[:60]:
        handle.cancel()
    assert loop.wheel_timer.size == 40
    assert handles[0].cancelled() and not handles[99].cancelled()
    loop.close()
    assert all(handle.cancelled() for handle in handles)
    assert loop.wheel_timer.closed
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_later(1, print)


def test_the_wheels_loop_timer_is_an_asyncio_timer_not_one_of_its_own() -> None:
    # The wheel arms its real timer through asyncio's call_at: were it the
    # overridden one, arming would recurse into the wheel.
    loop = aio.new_event_loop()
    try:
        loop.call_later(3, print)
        loop.run_until_complete(asyncio.sleep(0))
        (real,) = _real_timers(loop)
        assert type(real) is asyncio.TimerHandle
        assert loop.wheel_timer.loop_timer_armed
    finally:
        loop.close()


def test_a_raising_callback_goes_to_the_exception_handler() -> None:
    loop = aio.new_event_loop()
    seen: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    try:

        def boom() -> None:
            raise ValueError("boom")

        loop.call_later(0.001, boom)
        loop.call_later(0.002, loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert len(seen) == 1 and isinstance(seen[0]["exception"], ValueError)
    assert "boom" in str(seen[0]["message"])


@pytest.mark.skipif(sys.version_info < (3, 12), reason="asyncio.run(loop_factory=) is 3.12+")
def test_asyncio_run_with_loop_factory() -> None:
    assert asyncio.run(_running_loop_type(), loop_factory=aio.new_event_loop) is aio.EventLoop  # type: ignore[call-arg]


def test_the_uvloop_variant_puts_its_timers_on_the_wheel() -> None:
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")
    seen: dict[str, object] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, uvloop.Loop)
        t0 = loop.time()
        sleepers = [asyncio.ensure_future(asyncio.sleep(5)) for _ in range(20)]
        await asyncio.sleep(0.02)
        # uvloop's time() is whole milliseconds / 1000, and (X + 20) / 1000 - X / 1000
        # rounds below 0.02 for most X: compare as asyncio.sleep computed its deadline
        # (a later time() + 0.02, so never below t0 + 0.02 if the wheel is never early).
        seen["slept"] = loop.time() >= t0 + 0.02
        seen["wheel"] = loop.wheel_timer.size  # type: ignore[attr-defined]
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(10)
        for task in sleepers:
            task.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
        seen["after"] = loop.wheel_timer.size  # type: ignore[attr-defined]

    with asyncio.Runner(loop_factory=aio.new_uvloop_event_loop) as runner:
        runner.run(main())
    assert seen == {"slept": True, "wheel": 20, "after": 0}


def test_the_uvloop_variant_never_fires_early() -> None:
    # libuv keeps its timers in whole milliseconds and rounds the delay it is given:
    # the wheel's own rounding up must still keep every callback at or after its when().
    pytest.importorskip("uvloop", reason="uvloop is not installed")
    on_time: list[bool] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def check(when: float) -> None:
            on_time.append(loop.time() >= when)
            if len(on_time) == 200 and not done.done():
                done.set_result(None)

        for i in range(200):
            when = loop.time() + 0.00037 * i
            loop.call_at(when, check, when)
        await done

    with asyncio.Runner(loop_factory=aio.new_uvloop_event_loop) as runner:
        runner.run(main())
    assert len(on_time) == 200 and all(on_time)


_SAY_ONCE = """
import sys, warnings
if sys.argv[1] == "no compiler":
    sys.modules["tickwheel._speedups"] = None  # as when the extension was not built
import tickwheel, tickwheel.aio as aio
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    aio.new_event_loop().close()
    aio.install()
    aio.new_event_loop().close()
print(tickwheel.COMPILED, len(caught))
for w in caught:
    print(w.category.__name__, w.filename == "<string>", w.message)
"""


@pytest.mark.parametrize("why", ["TICKWHEEL_NO_EXTENSIONS", "no compiler"])
def test_the_pure_path_says_once_that_the_drop_in_saves_nothing(why: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TICKWHEEL_NO_EXTENSIONS"}
    if why == "TICKWHEEL_NO_EXTENSIONS":
        env["TICKWHEEL_NO_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _SAY_ONCE, why],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "False 1"
    category, at_the_call, message = out[1].split(" ", 2)
    assert (category, at_the_call) == ("RuntimeWarning", "True")
    assert "compiled core is not in use" in message and "docs/aio.md" in message
    expected = "TICKWHEEL_NO_EXTENSIONS is set" if why != "no compiler" else "no C compiler"
    assert expected in message


@pytest.mark.skipif(not tickwheel.COMPILED, reason="the compiled core is not built")
def test_the_compiled_path_says_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TICKWHEEL_NO_EXTENSIONS"}
    out = subprocess.run(
        [sys.executable, "-c", _SAY_ONCE, "compiled"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert out == ["True 0"]
