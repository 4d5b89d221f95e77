"""Users' idioms for delays give on tickwheel's loops what they give on asyncio's own loop.

Every idiom runs on asyncio's stock loop and on both of tickwheel's loops
(``new_event_loop`` and ``new_uvloop_event_loop``), on the path the suite runs
(compiled, or pure with ``TICKWHEEL_NO_EXTENSIONS=1``: the suite runs twice).
Each returns what a user would observe (results, exceptions, deadlines,
which callbacks ran), and the observations must be equal to the stock loop's.
The idioms are those of anyio's ``sleep_forever`` (``asyncio.sleep(math.inf)``),
of "no deadline" timeouts, of huge finite delays, of NaN and of non-numbers.
"""

from __future__ import annotations

import asyncio
import math
import selectors
import sys
from collections.abc import Callable, Coroutine
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

import tickwheel.aio as aio

pytestmark = pytest.mark.timeout(120)

Observation = list[Any]
Idiom = Callable[[], Coroutine[Any, Any, Observation]]

#: Real seconds an idiom lets pass to show that something did not fire.
A_WHILE = 0.02

IDIOMS: dict[str, Idiom] = {}


def idiom(fn: Idiom) -> Idiom:
    IDIOMS[fn.__name__] = fn
    return fn


def _error(exc: BaseException) -> tuple[str, str]:
    return (type(exc).__name__, str(exc))


async def _outcome(aw: Coroutine[Any, Any, Any]) -> Any:
    """What awaiting ``aw`` gives: its result, or the exception it raised."""
    try:
        return ("result", await aw)
    except (Exception, asyncio.CancelledError) as exc:
        return ("raised", *_error(exc))


async def _cancelled_after_a_while(aw: Coroutine[Any, Any, Any]) -> Observation:
    """Start ``aw``; after a while, is it still pending? Then cancel it: what does it give?"""
    task = asyncio.ensure_future(aw)
    await asyncio.sleep(A_WHILE)
    pending = not task.done()
    task.cancel()
    return [pending, await _outcome(task)]


@idiom
async def sleep_forever() -> Observation:
    # anyio's sleep_forever(), and its process pool's shutdown task.
    return await _cancelled_after_a_while(asyncio.sleep(math.inf))


@idiom
async def sleep_a_huge_finite_delay() -> Observation:
    return await _cancelled_after_a_while(asyncio.sleep(1e300))


@idiom
async def wait_for_with_an_infinite_timeout() -> Observation:
    done = await _outcome(asyncio.wait_for(asyncio.sleep(0.001, "done"), math.inf))
    forever = await _cancelled_after_a_while(asyncio.wait_for(asyncio.sleep(math.inf), math.inf))
    return [done, forever]


@idiom
async def timeout_inf_and_none() -> Observation:
    seen: Observation = []
    for delay in (math.inf, None, 1e300):
        async with asyncio.timeout(delay) as cm:
            await asyncio.sleep(0.001)
        seen.append([delay, cm.when() == (None if delay is None else math.inf), cm.expired()])
    async with asyncio.timeout_at(math.inf) as cm:
        await asyncio.sleep(0.001)
    seen.append(["at inf", cm.when(), cm.expired()])
    return seen


@idiom
async def reschedule_an_infinite_timeout() -> Observation:
    loop = asyncio.get_running_loop()

    async def shortened() -> None:
        async with asyncio.timeout(math.inf) as cm:
            cm.reschedule(loop.time() + 0.005)
            await asyncio.sleep(math.inf)

    async def lengthened() -> str:
        async with asyncio.timeout(0.005) as cm:
            cm.reschedule(math.inf)
            await asyncio.sleep(A_WHILE)
        return "not expired"

    async def dropped() -> str:
        async with asyncio.timeout(0.005) as cm:
            cm.reschedule(None)
            await asyncio.sleep(A_WHILE)
        return "not expired"

    return [await _outcome(shortened()), await _outcome(lengthened()), await _outcome(dropped())]


@idiom
async def call_later_and_call_at_far_away() -> Observation:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    now = loop.time()
    handles = {
        "later inf": loop.call_later(math.inf, fired.append, "later inf"),
        "at inf": loop.call_at(math.inf, fired.append, "at inf"),
        "later 1e12": loop.call_later(1e12, fired.append, "later 1e12"),
        "later 2**61": loop.call_later(2.0**61, fired.append, "later 2**61"),
        "at 1e300": loop.call_at(1e300, fired.append, "at 1e300"),
        "at max": loop.call_at(sys.float_info.max, fired.append, "at max"),
    }
    whens = {
        name: (h.when() - now if name.startswith("later") and h.when() < 1e15 else h.when())
        for name, h in handles.items()
    }
    await asyncio.sleep(A_WHILE)
    for handle in handles.values():
        handle.cancel()
    return [
        sorted(fired),
        # Whole seconds: ``now`` is read before each call_later reads the clock again,
        # which a loaded machine can make a millisecond later.
        {name: round(w, 0) for name, w in whens.items()},
        [h.cancelled() for h in handles.values()],
    ]


@idiom
async def past_deadlines_run_on_the_next_iterations() -> Observation:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    loop.call_at(-math.inf, fired.append, "at -inf")
    loop.call_later(-math.inf, fired.append, "later -inf")
    loop.call_later(-1, fired.append, "later -1")
    loop.call_at(-1e300, fired.append, "at -1e300")
    loop.call_later(0, fired.append, "later 0")
    before = list(fired)
    await asyncio.sleep(A_WHILE)
    return [before, sorted(fired)]


@idiom
async def nan_deadlines() -> Observation:
    # asyncio's heap runs a NaN deadline once it reaches the top: at once when it
    # was pushed before any other pending timer (as here), else whenever those
    # before it have fired. tickwheel's loops run it on the next iteration.
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    loop.call_later(math.nan, fired.append, "later nan")
    await asyncio.sleep(A_WHILE)
    loop.call_at(math.nan, fired.append, "at nan")
    await asyncio.sleep(A_WHILE)
    # asyncio.sleep refuses NaN from 3.13; before, it sleeps until the NaN timer runs.
    task = asyncio.ensure_future(asyncio.sleep(math.nan, "woke"))
    await asyncio.sleep(0)  # its NaN timer is pushed first (see above)
    await asyncio.sleep(A_WHILE)
    slept = [task.done(), await _outcome(task) if task.done() else task.cancel()]

    async def in_timeout() -> str:
        async with asyncio.timeout(math.nan):
            await asyncio.sleep(10)
        return "not expired"

    timed = await _outcome(in_timeout())
    waited = await _outcome(asyncio.wait_for(asyncio.sleep(10), math.nan))
    return [fired, slept, timed, waited]


@idiom
async def other_numbers() -> Observation:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    loop.call_later(Fraction(1, 1000), fired.append, "Fraction")
    loop.call_later(False, fired.append, "False")  # a bool is an int
    loop.call_at(int(loop.time()) - 1, fired.append, "int when")
    loop.call_at(Decimal(int(loop.time()) - 1), fired.append, "Decimal when")
    try:
        loop.call_later(Decimal(0), print)
    except TypeError as exc:  # float + Decimal
        fired.append(_error(exc)[0])
    await asyncio.sleep(A_WHILE)
    return [sorted(fired), await _outcome(asyncio.sleep(Fraction(1, 1000), "slept"))]


@idiom
async def non_numbers_raise_what_asyncio_raises() -> Observation:
    loop = asyncio.get_running_loop()
    seen: Observation = []
    for delay in ("1", b"1", [1], None):
        try:
            loop.call_later(delay, print)  # type: ignore[arg-type]
            seen.append("accepted")
        except TypeError as exc:
            seen.append(_error(exc))
    seen.append(await _outcome(asyncio.sleep("1")))  # type: ignore[arg-type]

    async def in_timeout() -> None:
        async with asyncio.timeout("1"):  # type: ignore[arg-type]
            pass

    seen.append(await _outcome(in_timeout()))
    coro = asyncio.sleep(0)
    seen.append(await _outcome(asyncio.wait_for(coro, "1")))  # type: ignore[arg-type]
    coro.close()  # if wait_for refused it before awaiting it
    try:
        loop.call_at(None, print)  # type: ignore[arg-type]
    except TypeError as exc:
        seen.append(_error(exc))
    return seen


def _call_at_a_non_number(factory: Callable[[], asyncio.AbstractEventLoop]) -> Observation:
    """``call_at("1")``: asyncio's heap raises TypeError when it compares it with a pending timer.

    (With nothing else pending it takes it, and its next iteration raises;
    tickwheel's loops raise at once.) The loop is not run afterwards:
    asyncio's would fail.
    """
    seen: Observation = []
    loop = factory()
    try:
        loop.call_later(10, print)
        for when in ("1", b"1", [1], 1j, object()):
            try:
                loop.call_at(when, print)  # type: ignore[arg-type]
                seen.append("accepted")
            except TypeError:
                seen.append("TypeError")
        try:
            loop.call_later(1j, print)  # type: ignore[arg-type]
            seen.append("accepted")
        except TypeError:
            seen.append("TypeError")
    finally:
        loop.close()
    return seen


def _stock() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop()


class _NanWaitsZeroSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """A selector that waits 0 s for a NaN timeout, as asyncio's loop asked it to until 3.12.

    Up to 3.12, ``_run_once`` clamps the wait with ``min(max(0, when - now), ...)``,
    which turns a NaN deadline at the heap's top into 0. From 3.13 it compares
    instead, so NaN reaches ``select`` and the stock loop dies with ``ValueError``.
    """

    def select(self, timeout: float | None = None) -> Any:
        return super().select(0 if timeout is not None and math.isnan(timeout) else timeout)


def _stock_with_nan_as_zero() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(_NanWaitsZeroSelector())


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "EventLoop": aio.new_event_loop,
    "uvloop variant": aio.new_uvloop_event_loop,
}


def _run(factory: Callable[[], asyncio.AbstractEventLoop], fn: Idiom) -> Observation:
    # No guard timeout: a timer pushed first would change what asyncio's heap does
    # with NaN (pytest-timeout bounds the test).
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(fn())


@pytest.mark.parametrize("loop_name", list(LOOPS))
@pytest.mark.parametrize("name", list(IDIOMS))
def test_an_idiom_gives_what_it_gives_on_asyncios_loop(name: str, loop_name: str) -> None:
    stock = _stock
    if name == "nan_deadlines" and sys.version_info >= (3, 13):
        # asyncio's own loop dies here from 3.13; tickwheel's keep 3.12's behaviour.
        with pytest.raises(ValueError, match="NaN"):
            _run(_stock, IDIOMS[name])
        stock = _stock_with_nan_as_zero
    expected = _run(stock, IDIOMS[name])
    assert _run(LOOPS[loop_name], IDIOMS[name]) == expected


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_call_at_a_non_number_raises_type_error_as_asyncio(loop_name: str) -> None:
    expected = _call_at_a_non_number(_stock)
    assert expected == ["TypeError"] * 6
    assert _call_at_a_non_number(LOOPS[loop_name]) == expected


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_far_timers_are_counted_kept_aside_and_freed(loop_name: str) -> None:
    # What the idioms cannot see: where the wheel keeps them, and that close() frees them.
    loop = LOOPS[loop_name]()
    try:
        timer: aio.AsyncTimer = loop.wheel_timer  # type: ignore[attr-defined]
        forever = loop.call_later(math.inf, print)
        loop.call_at(1e300, print)
        loop.call_later(1e12, print)  # within the wheel's range: in the wheel
        assert timer.size == 3
        assert timer._parked._counter.value == 2
        timer._check()
        forever.cancel()
        assert timer.size == 2
    finally:
        loop.close()
    assert timer.size == 0
