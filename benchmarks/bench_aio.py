"""Benchmark: tickwheel.aio.AsyncTimer against the event loop's own timers.

Workload (issue 4), per N: on a running loop, schedule N timers with delays
uniform in [1, 30] s; cancel 90 % of them; re-arm half of the rest once (an
idle-timeout reset: cancel, then schedule anew); run the loop until the
remainder fire. The same workload, with the same random numbers, runs on:

* ``asyncio``   -- ``loop.call_later`` of CPython's selector loop;
* ``tickwheel`` -- ``AsyncTimer().call_later`` on that same kind of loop (the
  compiled core when it is built, ``tickwheel.COMPILED``);
* ``tickwheel-pure`` -- the same on the pure-Python reference, loaded beside
  it in this process (``load_pure``, from the tests' support code);
* ``uvloop``    -- ``loop.call_later`` of uvloop (optional, if installed);
* ``floor``     -- not a timer but the interpreter's floor for a loop-thread
  wheel whose cancel frees the entry at once (issue 4): ``call_later``
  allocates a slotted handle, rounds its deadline up to the millisecond and
  links it at the tail of a single list (no wheel, no level or bucket choice,
  no loop timer); ``cancel`` unlinks it. Its fire phase is the least any
  timer driven by one loop timer does per due deadline: the survivors'
  deadlines are sorted (untimed), then each fire is one ``loop.call_at`` for
  the next deadline and the loop iteration that runs it. Its lifecycle ratio
  is what a timer with no wheel at all would reach. The ``bound`` line adds
  tickwheel's own fire phase to the floor's other phases.
* ``floor-c``   -- the same least work in C
  (``_floors.AsyncFloorTimer``, when the core is compiled and the floors built), with
  the same fire phase: the floor under the compiled ``AsyncTimer``.

The asyncio and tickwheel runs use :class:`tickwheel.aio.VirtualClockEventLoop`:
when the loop would sleep until its next timer, its clock jumps there, so 30 s
of timers run in CPU time only, identically for both. uvloop's clock cannot be
moved, so its runs wait the 30 s in real time (``--uvloop`` to include them).

Times are CPU time of this process (``time.process_time_ns``), robust to other
load on a shared machine, with the cyclic GC on (``--no-gc`` turns it off:
at N = 1e6 much of a schedule's cost is the GC traversing a million pending
handles); each side runs ``--repeat`` times, interleaved, and
the run with the smallest total is shown. Memory is measured in a separate run
with tracemalloc: bytes per pending timer (handle plus everything it owns), and
how much of the cancelled timers' memory is released at once by ``cancel()``
and after one loop iteration.

    python benchmarks/bench_aio.py                     # N = 1e5 and 1e6
    python benchmarks/bench_aio.py --sizes 100000 --repeat 5 --uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import gc
import heapq
import math
import operator
import platform
import random
import selectors
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _support import compiled_floors, load_pure

import tickwheel
from tickwheel.aio import AsyncTimer, VirtualClockEventLoop
from tickwheel.aio._virtual import _JumpingSelector

# The pure-Python reference, loaded beside the installed package (compiled when built).
PURE = load_pure()
# The compiled floors (floor-c rows), when built: see benchmarks/setup_floors.py.
FLOORS = compiled_floors()


try:
    import uvloop
except ImportError:  # optional peer
    uvloop = None


@dataclass
class Workload:
    """The random numbers of one size, shared by every side."""

    n: int
    delays: list[float]
    cancel: list[int]
    rearm: list[int]
    rearm_delays: list[float]
    survivors: int


def make_workload(n: int, seed: int) -> Workload:
    """Delays U[1, 30] s; a random 90 % to cancel; half of the rest to re-arm."""
    rng = random.Random(seed)
    delays = [rng.uniform(1.0, 30.0) for _ in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    n_cancel = n * 9 // 10
    rest = order[n_cancel:]
    rearm = rest[: len(rest) // 2]
    return Workload(
        n=n,
        delays=delays,
        cancel=order[:n_cancel],
        rearm=rearm,
        rearm_delays=[rng.uniform(1.0, 30.0) for _ in rearm],
        survivors=len(rest),
    )


class _FloorHandle:
    """A handle of :class:`FloorTimer`: the slots of a wheel handle, and an unlinking cancel."""

    __slots__ = ("_args", "_callback", "_list", "_next", "_prev", "_when", "expiration_ms")

    def cancel(self) -> None:
        nxt = self._next
        prev = self._prev
        nxt._prev = prev
        prev._next = nxt
        self._next = self._prev = self._list = None


_new_floor_handle = _FloorHandle.__new__


class FloorTimer:
    """The least a loop-thread timer with an eager cancel does (see the module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._time = loop.time
        root = _FloorHandle()
        root._next = root._prev = root
        self._root = root

    def pending_whens(self) -> list[float]:
        """The deadlines still linked, in list order."""
        whens = []
        node = self._root._next
        while node is not self._root:
            whens.append(node._when)
            node = node._next
        return whens

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _FloorHandle:
        when = self._time() + delay
        handle = _new_floor_handle(_FloorHandle)
        handle._when = when
        handle._callback = callback
        handle._args = args
        handle.expiration_ms = math.ceil(when * 1000.0)
        root = self._root
        tail = root._prev
        handle._next = root
        handle._prev = tail
        handle._list = root
        tail._next = handle
        root._prev = handle
        return handle


@dataclass
class Result:
    """CPU nanoseconds of each phase of one run."""

    schedule: int
    cancel: int
    rearm: int
    fire: int

    @property
    def total(self) -> int:
        return self.schedule + self.cancel + self.rearm + self.fire


def _new_loop(side: str) -> asyncio.AbstractEventLoop:
    if side == "uvloop":
        assert uvloop is not None
        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    return VirtualClockEventLoop(start=10_000.0)


def _scheduler(side: str, loop: asyncio.AbstractEventLoop) -> tuple[Callable[..., Any], Any]:
    if side in ("tickwheel", "tickwheel-pure"):
        timer = (AsyncTimer if side == "tickwheel" else PURE.aio.AsyncTimer)(loop=loop)
        return timer.call_later, timer
    if side == "floor":
        floor = FloorTimer(loop)
        return floor.call_later, floor
    if side == "floor-c":
        floor_c = FLOORS.AsyncFloorTimer(loop)
        return floor_c.call_later, floor_c
    return loop.call_later, None


def run_once(side: str, w: Workload) -> Result:
    """One timed run of the workload on a fresh loop."""
    loop = _new_loop(side)
    try:

        async def main() -> Result:
            call_later, timer = _scheduler(side, loop)
            fired = 0
            target = w.survivors
            done = loop.create_future()

            def callback() -> None:
                nonlocal fired
                fired += 1
                if fired == target:
                    done.set_result(None)

            delays, cancel, rearm = w.delays, w.cancel, w.rearm
            clock = time.process_time_ns
            gc.collect()
            t0 = clock()
            handles = [call_later(d, callback) for d in delays]
            t1 = clock()
            for i in cancel:
                handles[i].cancel()
            t2 = clock()
            for i, d in zip(rearm, w.rearm_delays, strict=True):
                handles[i].cancel()
                handles[i] = call_later(d, callback)
            t3 = fire_start = clock()
            if side.startswith("floor"):
                # One loop timer at a time, each run re-arming it for the next deadline.
                whens = iter(sorted(timer.pending_whens()))  # not timed: no wheel's work

                def fire_next() -> None:
                    callback()
                    when = next(whens, None)
                    if when is not None:
                        loop.call_at(when, fire_next)

                fire_start = clock()
                loop.call_at(next(whens), fire_next)
            await done
            t4 = clock()
            assert fired == target
            if isinstance(timer, (AsyncTimer, PURE.aio.AsyncTimer)):
                assert timer.size == 0
                timer.close()
            return Result(t1 - t0, t2 - t1, t3 - t2, t4 - fire_start)

        return loop.run_until_complete(main())
    finally:
        loop.close()


@dataclass
class Memory:
    """tracemalloc figures of one side."""

    per_timer: float  # bytes per pending timer
    released_at_cancel: float  # fraction of the cancelled timers' bytes freed by cancel()
    released_next_iteration: float  # ... after one more loop iteration


def measure_memory(side: str, w: Workload) -> Memory:
    """Bytes per pending timer, and memory released by cancelling 90 % of them."""
    loop = _new_loop(side)
    try:

        async def main() -> Memory:
            call_later, timer = _scheduler(side, loop)
            handles: list[Any] = [None] * w.n
            cancel = w.cancel

            def callback() -> None:
                pass

            gc.collect()
            tracemalloc.start()
            m0 = tracemalloc.get_traced_memory()[0]
            for i, d in enumerate(w.delays):
                handles[i] = call_later(d, callback)
            m1 = tracemalloc.get_traced_memory()[0]
            for i in cancel:
                handles[i].cancel()
                handles[i] = None
            gc.collect()
            m2 = tracemalloc.get_traced_memory()[0]
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            gc.collect()
            m3 = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            per_timer = (m1 - m0) / w.n
            cancelled_bytes = per_timer * len(cancel)
            for h in handles:
                if h is not None:
                    h.cancel()
            if timer is not None:
                timer.close()
            return Memory(per_timer, (m1 - m2) / cancelled_bytes, (m1 - m3) / cancelled_bytes)

        return loop.run_until_complete(main())
    finally:
        loop.close()


# -- the drop-in loop: asyncio's own APIs on EventLoop --------------------------------


def _virtual_wheel_loop(pkg: Any) -> asyncio.AbstractEventLoop:
    """``pkg``'s EventLoop on the jumping virtual clock of :class:`VirtualClockEventLoop`."""

    class VirtualWheelLoop(pkg.aio.EventLoop):  # type: ignore[misc, name-defined]
        time = VirtualClockEventLoop.time
        _jump_to_next_timer = VirtualClockEventLoop._jump_to_next_timer

        def __init__(self) -> None:
            self._virtual_time = 10_000.0
            super().__init__(_JumpingSelector(self, selectors.DefaultSelector()))

    return VirtualWheelLoop()


class _DropInFloorHandle:
    """A handle of the pure drop-in floor: a drop-in handle's slots, and an unlinking cancel."""

    __slots__ = ("_args", "_callback", "_context", "_next", "_prev", "_when", "expiration_ms")

    def cancel(self) -> None:
        nxt = self._next
        if nxt is not None:
            prev = self._prev
            nxt._prev = prev
            prev._next = nxt
            self._next = self._prev = None


_new_drop_in_floor_handle = _DropInFloorHandle.__new__


class DropInFloor:
    """The pure twin of ``_floors.DropInFloor``: not a timer, the least work.

    The loop's ``call_later``/``call_at`` (one Python frame each) allocate a slotted
    handle, copy the caller's context, round the deadline up to the ms and link
    the handle at one list's tail; ``cancel`` unlinks it. Firing: the pending
    handles sorted (untimed), one real timer of the loop pushed back on
    asyncio's heap per due millisecond, each callback run in its context.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        root = _DropInFloorHandle()
        root._next = root._prev = root
        self._root = root
        self._chain: list[Any] = []
        self._pos = 0
        self._spare: Any = None

    def take_pending(self) -> list[_DropInFloorHandle]:
        pending = []
        root = self._root
        node = root._next
        while node is not root:
            nxt = node._next
            node._next = node._prev = None
            pending.append(node)
            node = nxt
        root._next = root._prev = root
        return pending

    @property
    def firing(self) -> bool:
        return self._pos < len(self._chain)

    def fire_in_order(self, handles: list[_DropInFloorHandle], base_call_at: Any) -> None:
        self._chain = handles
        self._pos = 0
        if handles:
            self._spare = base_call_at(self._loop, handles[0].expiration_ms / 1000, self._fire)

    def _fire(self) -> None:
        chain = self._chain
        handle = chain[self._pos]
        ms = handle.expiration_ms
        while True:
            chain[self._pos] = None  # fired: the floor holds it no more, as a wheel does not
            self._pos += 1
            handle._context.run(handle._callback, *handle._args)
            if self._pos == len(chain):
                return
            handle = chain[self._pos]
            if handle.expiration_ms != ms:
                break
        spare = self._spare
        spare._when = handle.expiration_ms / 1000
        heapq.heappush(self._loop._scheduled, spare)  # type: ignore[attr-defined]
        spare._scheduled = True


def _floor_call_at(
    self: Any, when: float, callback: Callable[..., Any], *args: Any, context: Any = None
) -> _DropInFloorHandle:
    handle = _new_drop_in_floor_handle(_DropInFloorHandle)
    handle._when = when
    handle._callback = callback
    handle._args = args
    handle._context = contextvars.copy_context() if context is None else context
    handle.expiration_ms = math.ceil(when * 1000.0)
    root = self._drop_in_floor._root
    tail = root._prev
    handle._next = root
    handle._prev = tail
    tail._next = handle
    root._prev = handle
    return handle


def _floor_call_later(
    self: Any, delay: float, callback: Callable[..., Any], *args: Any, context: Any = None
) -> _DropInFloorHandle:
    # _floor_call_at's body, not a call to it: the floor pays one frame per call.
    when = self.time() + delay
    handle = _new_drop_in_floor_handle(_DropInFloorHandle)
    handle._when = when
    handle._callback = callback
    handle._args = args
    handle._context = contextvars.copy_context() if context is None else context
    handle.expiration_ms = math.ceil(when * 1000.0)
    root = self._drop_in_floor._root
    tail = root._prev
    handle._next = root
    handle._prev = tail
    tail._next = handle
    root._prev = handle
    return handle


class _FloorSelector(_JumpingSelector):
    """When the loop would wait with no timer of its own, the floor starts firing."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None and self._loop._start_floor():  # type: ignore[attr-defined]
            return []
        return super().select(timeout)


class DropInFloorLoop(VirtualClockEventLoop):
    """The virtual-clock loop with the drop-in floor as its ``call_later``/``call_at``.

    ``untimed_ns`` is the CPU time spent sorting the pending handles, which the
    floor takes as free and the benchmark subtracts.
    """

    def __init__(self, compiled: bool) -> None:
        self._virtual_time = 10_000.0
        asyncio.SelectorEventLoop.__init__(self, _FloorSelector(self, selectors.DefaultSelector()))
        floor_type = FLOORS.DropInFloor if compiled else DropInFloor
        self._drop_in_floor = floor_type(self)
        self.untimed_ns = 0

    def _start_floor(self) -> bool:
        floor = self._drop_in_floor
        if floor.firing:
            return False
        t0 = time.process_time_ns()
        pending = floor.take_pending()
        pending.sort(key=_when_of)
        self.untimed_ns += time.process_time_ns() - t0
        floor.fire_in_order(pending, asyncio.BaseEventLoop.call_at)
        return bool(pending)


class _PureFloorLoop(DropInFloorLoop):
    call_later = _floor_call_later  # type: ignore[assignment]
    call_at = _floor_call_at  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__(compiled=False)


def _compiled_floor_loop() -> DropInFloorLoop:
    class CompiledFloorLoop(DropInFloorLoop):
        call_later = FLOORS.floor_loop_call_later
        call_at = FLOORS.floor_loop_call_at

    return CompiledFloorLoop(compiled=True)


_when_of = operator.attrgetter("_when")


def _drop_in_loop(side: str) -> asyncio.AbstractEventLoop:
    if side == "stock":
        return VirtualClockEventLoop(start=10_000.0)
    if side == "floor":
        return _PureFloorLoop()
    if side == "floor-c":
        return _compiled_floor_loop()
    return _virtual_wheel_loop(tickwheel if side == "tickwheel" else PURE)


async def _call_later_cancel(w: Workload) -> None:
    """loop.call_later for every delay, cancel 90 %, let the rest fire."""
    loop = asyncio.get_running_loop()
    fired = 0
    done = loop.create_future()

    def callback() -> None:
        nonlocal fired
        fired += 1
        if fired == w.n - len(w.cancel):
            done.set_result(None)

    handles = [loop.call_later(d, callback) for d in w.delays]
    for i in w.cancel:
        handles[i].cancel()
    await done


async def _timeouts(w: Workload) -> None:
    """Enter and exit ``asyncio.timeout(delay)`` around a step that never times out."""
    for d in w.delays:
        async with asyncio.timeout(d):
            pass


async def _sleeps(w: Workload) -> None:
    """One task per survivor sleeping its delay (asyncio.sleep), all gathered."""
    await asyncio.gather(*(asyncio.sleep(d) for d in w.delays[: w.n // 10]))


DROP_IN = {
    "loop.call_later/cancel": _call_later_cancel,
    "asyncio.timeout enter/exit": _timeouts,
    "asyncio.sleep tasks": _sleeps,
}


def drop_in(n: int, seed: int, repeat: int, floors: bool, debug: bool = False) -> None:
    """Time asyncio's own timer APIs on the stock loop and on the wheel's loop (both paths).

    With ``floors``, also on :class:`DropInFloorLoop`, pure (``floor``) and
    compiled (``floor-c``): the least a drop-in loop's timers can cost on each path.
    With ``debug``, every loop runs in asyncio's debug mode (its slow-callback
    warnings silenced: the timeout workload is one long task step).
    """
    w = make_workload(n, seed)
    sides = ["stock", "tickwheel", "tickwheel-pure"]
    if floors:
        sides += ["floor", "floor-c"] if FLOORS is not None else ["floor"]
    print()
    mode = ", debug mode" if debug else ""
    print(f"drop-in loop, N = {n:,}{mode}: CPU ms (best of {repeat}), ratio to the stock loop")
    print(f"{'path':<28} " + " ".join(f"{side:>16}" for side in sides))
    for name, workload in DROP_IN.items():
        best = dict.fromkeys(sides, math.inf)
        for _ in range(repeat):
            for side in sides:
                loop = _drop_in_loop(side)
                if debug:
                    loop.set_debug(True)
                    loop.slow_callback_duration = 3600.0
                try:
                    gc.collect()
                    t0 = time.process_time_ns()
                    loop.run_until_complete(workload(w))
                    elapsed = time.process_time_ns() - t0 - getattr(loop, "untimed_ns", 0)
                    best[side] = min(best[side], elapsed)
                finally:
                    loop.close()
        base = best["stock"]
        cells = [f"{best['stock'] / 1e6:>16.1f}"] + [
            f"{best[side] / 1e6:>9.1f} {best[side] / base:5.2f}x" for side in sides[1:]
        ]
        print(f"{name:<28} " + " ".join(cells))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20260422)
    parser.add_argument("--memory-n", type=int, default=100_000, help="timers in the memory run")
    parser.add_argument(
        "--uvloop", action="store_true", help="include uvloop (waits 30 s of real time per size)"
    )
    parser.add_argument(
        "--no-gc", action="store_true", help="disable the cyclic GC in the timed runs"
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the floor side and its bound line"
    )
    parser.add_argument(
        "--drop-in",
        action="store_true",
        help="also time asyncio's own APIs on the stock loop and on tickwheel.aio.EventLoop",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="with --drop-in: run those loops in asyncio's debug mode",
    )
    args = parser.parse_args(argv)
    if args.no_gc:
        gc.disable()
    sides = ["asyncio", "tickwheel", "tickwheel-pure"]
    if not args.no_floor:
        sides.append("floor")
        if FLOORS is not None:
            sides.append("floor-c")
    if args.uvloop:
        if uvloop is None:
            print("uvloop is not installed: skipped")
        else:
            sides.append("uvloop")

    print(f"python {platform.python_version()} ({platform.python_implementation()}), ", end="")
    print(f"{platform.machine()}, uvloop {getattr(uvloop, '__version__', 'not installed')}")
    print(f"command: {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"cyclic GC: {'disabled' if args.no_gc else 'enabled (default thresholds)'}")
    print(
        "tickwheel: "
        + ("compiled core" if tickwheel.COMPILED else "pure Python (the core is not built)")
        + "; tickwheel-pure: the pure-Python reference"
    )
    for n in args.sizes:
        w = make_workload(n, args.seed)
        best: dict[str, Result] = {}
        for _ in range(args.repeat):
            for side in sides:
                if side == "uvloop" and side in best:
                    continue  # one real-time run is enough
                r = run_once(side, w)
                if side not in best or r.total < best[side].total:
                    best[side] = r
        base = best["asyncio"].total
        print()
        print(
            f"N = {n:,}: delays U[1, 30] s, cancel {len(w.cancel):,}, "
            f"re-arm {len(w.rearm):,}, fire {w.survivors:,}  (CPU ns per operation)"
        )
        print(
            f"{'side':<14} {'schedule':>9} {'cancel':>7} {'re-arm':>7} {'fire':>7} "
            f"{'lifecycle ms':>13} {'vs asyncio':>11}"
        )
        for side in sides:
            r = best[side]
            fire = f"{r.fire / w.survivors:.0f}"
            total = f"{r.total / 1e6:.1f}"
            ratio = f"{r.total / base:.2f}x"
            print(
                f"{side:<14} {r.schedule / n:>9.0f} {r.cancel / len(w.cancel):>7.0f} "
                f"{r.rearm / max(1, len(w.rearm)):>7.0f} {fire:>7} {total:>13} {ratio:>11}"
            )
        for floor_side, label in (("floor", "bound"), ("floor-c", "bound-c")):
            if floor_side in best:
                floor = best[floor_side]
                bound = floor.schedule + floor.cancel + floor.rearm + best["tickwheel"].fire
                print(
                    f"{label}: the {floor_side}'s schedule, cancel and re-arm with tickwheel's "
                    f"fire: {bound / 1e6:.1f} ms = {bound / base:.2f}x asyncio"
                )
    if args.drop_in:
        for n in args.sizes:
            drop_in(n, args.seed, args.repeat, floors=not args.no_floor, debug=args.debug)
    w = make_workload(args.memory_n, args.seed)
    print()
    print(f"memory, N = {args.memory_n:,} (tracemalloc; cancelling 90 %)")
    print(f"{'side':<14} {'bytes/pending':>14} {'freed at cancel':>16} {'after 1 iteration':>18}")
    for side in sides:
        if side.startswith("floor"):
            continue
        m = measure_memory(side, w)
        print(
            f"{side:<14} {m.per_timer:>14.0f} {m.released_at_cancel:>15.0%} "
            f"{m.released_next_iteration:>17.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
