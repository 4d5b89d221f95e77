"""Debug mode on tickwheel's loops gives what it gives on asyncio's own loop.

With ``loop.set_debug(True)`` asyncio records each timer handle's creation
stack, hands it with the handle to the exception handler when the callback
raises, warns "Executing <handle> took N seconds" for each slow callback, and
refuses a timer call from another thread. Each test runs the same scenario on
asyncio's stock loop and on both of tickwheel's loops, on the path the suite
runs (compiled, or pure: the suite runs twice), and compares.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import tickwheel.aio as aio

pytestmark = pytest.mark.timeout(120)

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

LOOPS: dict[str, LoopFactory] = {
    "EventLoop": aio.new_event_loop,
    "uvloop variant": aio.new_uvloop_event_loop,
}


def _stock() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop()


def _here(stack: Any) -> list[tuple[str, int]]:
    """The frames of a creation stack in this file's helpers: what the user wrote.

    (Not the test's own frame, which calls the helper from a different line per loop.)
    """
    return [
        (frame.name, frame.lineno)
        for frame in stack
        if frame.filename == __file__ and not frame.name.startswith("test_")
    ]


def _schedule_from_here(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> Any:
    return loop.call_later(0.001, callback)


def _run_briefly(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0.05))


def _creation(factory: LoopFactory, debug: bool) -> list[Any]:
    loop = factory()
    try:
        loop.set_debug(debug)
        later = _schedule_from_here(loop, print)
        at = loop.call_at(loop.time() + 1, print)
        stacks = [h._source_traceback for h in (later, at)]
        return [None if s is None else _here(s) for s in stacks]
    finally:
        loop.close()


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_handle_records_its_creation_stack_in_debug_mode(loop_name: str, debug: bool) -> None:
    expected = _creation(_stock, debug)
    assert (expected[0] is not None) is debug
    assert _creation(LOOPS[loop_name], debug) == expected


def _raising(factory: LoopFactory) -> list[Any]:
    loop = factory()
    contexts: list[dict[str, Any]] = []
    try:
        loop.set_debug(True)
        loop.set_exception_handler(lambda _loop, context: contexts.append(context))

        def boom() -> None:
            raise ZeroDivisionError("boom")

        handle = _schedule_from_here(loop, boom)
        _run_briefly(loop)
    finally:
        loop.close()
    (context,) = contexts
    return [
        sorted(context),
        context["message"],
        type(context["exception"]).__name__,
        context["handle"] is handle,
        _here(context["source_traceback"]),
    ]


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_raising_callback_reports_its_handle_and_creation_stack(loop_name: str) -> None:
    expected = _raising(_stock)
    assert expected[0] == ["exception", "handle", "message", "source_traceback"]
    assert _raising(LOOPS[loop_name]) == expected


def _slow_batch(factory: LoopFactory, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """Three callbacks due together: two slower than the threshold, one not.

    Returns the warnings as asyncio words them (deadlines and durations taken
    out), and for each slow callback its reported duration and its own, as it
    measured itself.
    """
    loop = factory()
    own: dict[str, float] = {}

    def sleeper(name: str, seconds: float) -> Callable[[], None]:
        def callback() -> None:
            t0 = time.monotonic()
            time.sleep(seconds)
            own[name] = time.monotonic() - t0

        callback.__qualname__ = name
        return callback

    try:
        loop.set_debug(True)
        loop.slow_callback_duration = 0.05
        when = loop.time() + 0.01
        for name, seconds in (("first", 0.06), ("quick", 0.0), ("second", 0.06)):
            loop.call_at(when, sleeper(name, seconds))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            _run_briefly(loop)
    finally:
        loop.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    took = {}
    for message in messages:
        match = re.search(r"<TimerHandle when=\S+ (\w+)\(\) at .* took ([0-9.]+) seconds", message)
        if match:
            took[match.group(1)] = float(match.group(2))
    return {
        "warnings": sorted(re.sub(r"when=\S+|took [0-9.]+", "", m) for m in messages),
        "took": took,
        "own": own,
    }


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_slow_callbacks_are_reported_one_by_one_with_their_own_duration(
    loop_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    expected = _slow_batch(_stock, caplog)
    got = _slow_batch(LOOPS[loop_name], caplog)
    # The same warnings, naming the user's callbacks and where they were made:
    # none for the wheel's driver, which ran all three.
    assert got["warnings"] == expected["warnings"]
    assert sorted(got["took"]) == ["first", "second"]
    for name, took in got["took"].items():
        # Its own time (rounded to the ms in the message), not the batch's.
        assert took >= round(got["own"][name], 3) - 0.0005
        assert took < got["own"]["first"] + got["own"]["second"]


def _from_another_thread(factory: LoopFactory) -> list[Any]:
    loop = factory()
    outcome: list[Any] = []
    try:
        loop.set_debug(True)

        def call_from_a_thread() -> None:
            for call in (loop.call_later, loop.call_at):
                try:
                    call(1e6, print)
                    outcome.append("accepted")
                except RuntimeError as exc:
                    outcome.append(str(exc))

        async def main() -> None:
            thread = threading.Thread(target=call_from_a_thread)
            thread.start()
            await loop.run_in_executor(None, thread.join, 30)

        loop.run_until_complete(main())
        timer = getattr(loop, "wheel_timer", None)
        if timer is not None:
            # Refused before anything changed: nothing held, no real timer armed.
            timer._check()
            outcome.append((timer.size, timer.loop_timer_armed))
    finally:
        loop.close()
    return outcome


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_call_from_another_thread_is_refused_before_anything_changes(loop_name: str) -> None:
    expected = _from_another_thread(_stock)
    assert len(expected) == 2 and all("thread" in message for message in expected)
    assert _from_another_thread(LOOPS[loop_name]) == [*expected, (0, False)]


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_the_current_handle_is_the_callbacks_own(loop_name: str) -> None:
    # asyncio's selector loop names the running handle in _current_handle (the
    # default exception handler reports its creation stack); uvloop keeps it in C.
    loop = LOOPS[loop_name]()
    seen: list[Any] = []
    try:
        loop.set_debug(True)
        handle = loop.call_later(0.001, lambda: seen.append(getattr(loop, "_current_handle", None)))
        _run_briefly(loop)
    finally:
        loop.close()
    assert seen == [handle if isinstance(loop, asyncio.BaseEventLoop) else None]


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_slow_callback_duration_reads_and_writes_as_a_float(loop_name: str) -> None:
    loop = LOOPS[loop_name]()
    try:
        assert loop.slow_callback_duration == 0.1  # type: ignore[attr-defined]
        loop.slow_callback_duration = 0.25  # type: ignore[attr-defined]
        assert loop.slow_callback_duration == 0.25  # type: ignore[attr-defined]
        assert isinstance(loop.slow_callback_duration, float)  # type: ignore[attr-defined]
    finally:
        loop.close()
