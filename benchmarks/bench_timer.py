"""Timer core benchmark: tickwheel's SystemTimer against asyncio, heapq and sched.

Workload (issue 2), for each N:

* **lifecycle**: schedule N timers with integer delays uniform in [1, 30000] ms,
  cancel a random 90 % in random order, then expire the remaining 10 % by moving
  a manual clock to the end (one ``advance_clock``, which drains every due
  bucket in order);
* **burst**: schedule N timers all due at the same time, then fire them all.

Every implementation runs in this process on a controlled clock and runs its
callbacks inline (a no-op function):

* ``tickwheel``: ``SystemTimer(clock=ManualClock(), executor="inline")`` through
  the thread-safe public API (``schedule``, ``TimerTask.cancel``,
  ``advance_clock``): every call takes the timer's lock. This is the compiled
  core when it is built (``tickwheel.COMPILED``);
* ``tickwheel-pure``: the same on the pure-Python reference, loaded beside it
  in this process (``load_pure``, from the tests' support code);
* ``asyncio``: a ``SelectorEventLoop`` whose ``time()`` is a fake clock;
  ``loop.call_later`` and ``TimerHandle.cancel``. The cancel phase includes
  one loop iteration at the unchanged time, which is where asyncio removes
  cancelled handles from its heap (it rebuilds the heap when more than half of
  the handles are cancelled); the fire phase is one loop iteration with the
  clock moved to the end.
* ``heapq``: a hand-rolled ``heapq`` timer with lazy deletion (cancel marks the
  entry; firing pops and skips marked entries). No lock: it is not thread-safe.
* ``sched``: the standard library's ``sched.scheduler`` with a fake clock.
  Its ``cancel`` is O(n) (``list.remove`` + ``heapify``), so above
  ``--sched-max`` timers only a sample of cancels (100 at 1e5, 10 at 1e6) is timed and its
  lifecycle is not reported; it runs once, not ``--repeat`` times.
* ``floor``: not a timer but the interpreter's floor for one, run through the
  same loops: ``schedule`` allocates a slotted entry, takes a lock and links
  the entry at the tail of a single list (no wheel, no bucket choice);
  ``cancel`` is a method call that takes the lock and unlinks the entry (no
  checks, no count, no cancelled mark). A thread-safe timer whose cancel is
  O(1) and frees the entry at once cannot do less, so these figures bound
  what tickwheel can reach on this interpreter and machine.
* ``floor-c``: the same least work in C (``_floors.FloorTimer``,
  when the core is compiled and the floors built): the floor under the compiled core.

Timings use ``time.perf_counter_ns`` (or the thread's CPU time with
``--clock cpu``) with the garbage collector on (the default); each figure is
the best of ``--repeat`` runs (``--repeat - 2``, at least 1, above N = 1e5). Memory is measured in
separate runs with ``tracemalloc`` (timing and tracing are never mixed): bytes
per pending timer after the schedules, and bytes per timer still held after the
cancels (the benchmark drops its own references to the cancelled timers first,
so what remains is what the timer keeps).

Usage::

    python benchmarks/bench_timer.py                 # N = 1e4, 1e5, 1e6
    python benchmarks/bench_timer.py --sizes 10000,100000 --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import itertools
import os
import platform
import random
import sched
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _support import compiled_floors, load_pure

import tickwheel
from tickwheel import SystemTimer

# The pure-Python reference, loaded beside the installed package (compiled when built).
PURE = load_pure()
# The compiled floors (floor-c rows), when built: see benchmarks/setup_floors.py.
FLOORS = compiled_floors()

MAX_DELAY_MS = 30_000
BURST_DELAY_MS = 5


def noop() -> None:
    """The timer callback: does nothing, so only the timer is measured."""


# -- peers ----------------------------------------------------------------------


class FakeTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is a settable fake clock (seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.fake_now = 0.0

    def time(self) -> float:
        return self.fake_now

    def run_one_iteration(self) -> None:
        """Run the loop once: clean up cancelled handles, fire what is due."""
        self.call_soon(self.stop)
        self.run_forever()


class HeapTimer:
    """A plain ``heapq`` timer with lazy deletion; entries are ``[when, seq, fn]``."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()

    def schedule(self, when: int, fn: Callable[[], None]) -> list[Any]:
        entry = [when, next(self._seq), fn]
        heapq.heappush(self._heap, entry)
        return entry

    @staticmethod
    def cancel(entry: list[Any]) -> None:
        entry[2] = None

    def run_due(self, now: int) -> int:
        heap = self._heap
        pop = heapq.heappop
        fired = 0
        while heap and heap[0][0] <= now:
            fn = pop(heap)[2]
            if fn is not None:
                fn()
                fired += 1
        return fired


_FLOOR_LOCK = threading.Lock()


class FloorEntry:
    """An entry of :class:`FloorTimer`: a timer task's slots, and the cheapest locked cancel."""

    __slots__ = ("_call", "_delay_ms", "_list", "_next", "_prev", "expiration_ms")

    def cancel(self) -> bool:
        lock = _FLOOR_LOCK
        lock.acquire()
        try:
            nxt = self._next
            prev = self._prev
            nxt._prev = prev
            prev._next = nxt
            self._next = self._prev = self._list = None
        finally:
            lock.release()
        return True


_new_floor_entry = FloorEntry.__new__


class FloorTimer:
    """The least work of a thread-safe intrusive timer: allocate, lock, link at a list's tail."""

    def __init__(self) -> None:
        self._lock = _FLOOR_LOCK
        self._now = 0
        root = FloorEntry()
        root._next = root._prev = root
        self._root = root

    def schedule(self, delay_ms: int, fn: Callable[..., Any], *args: Any) -> FloorEntry:
        entry = _new_floor_entry(FloorEntry)
        entry._delay_ms = delay_ms
        entry._call = fn
        lock = self._lock
        lock.acquire()
        try:
            entry.expiration_ms = delay_ms + self._now
            root = self._root
            tail = root._prev
            entry._next = root
            entry._prev = tail
            entry._list = root
            tail._next = entry
            root._prev = entry
        finally:
            lock.release()
        return entry


class FakeClock:
    """A settable clock for ``sched``."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


# -- measurement ----------------------------------------------------------------


@dataclass
class Result:
    """Nanoseconds per operation for one implementation at one N."""

    schedule: float = float("nan")
    cancel: float = float("nan")
    fire: float = float("nan")
    lifecycle_ms: float = float("nan")
    burst_schedule: float = float("nan")
    burst_fire: float = float("nan")
    bytes_pending: float = float("nan")
    bytes_after_cancel: float = float("nan")
    notes: list[str] = field(default_factory=list)


@dataclass
class Workload:
    """The random draw shared by every implementation at one N."""

    n: int
    delays: list[int]
    cancel_order: list[int]  # indices of the 90 % to cancel, in random order

    @classmethod
    def make(cls, n: int, seed: int) -> Workload:
        rng = random.Random(seed)
        delays = [rng.randint(1, MAX_DELAY_MS) for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        return cls(n, delays, order[: n * 9 // 10])


_clock_ns = time.perf_counter_ns


def _ns() -> int:
    return _clock_ns()


def _schedule_then_cancel(
    schedule: Callable[[int, Callable[[], None]], Any], w: Workload
) -> tuple[float, float, int]:
    """The timed schedule and cancel phases, the same loops for tickwheel and the floor."""
    fn = noop
    t0 = _ns()
    tasks = [schedule(d, fn) for d in w.delays]
    t1 = _ns()
    victims = [tasks[i] for i in w.cancel_order]
    t2 = _ns()
    for task in victims:
        task.cancel()
    t3 = _ns()
    return t1 - t0, t3 - t2, len(victims)


def _time_burst_schedules(
    schedule: Callable[[Any, Callable[[], None]], Any], delay: Any, n: int
) -> int:
    """A burst's timed schedule phase: one loop for every peer with ``schedule(delay, fn)``."""
    fn = noop
    t0 = _ns()
    for _ in range(n):
        schedule(delay, fn)
    return _ns() - t0


def run_tickwheel(w: Workload, pkg: Any = tickwheel) -> tuple[float, float, float, int]:
    clock = pkg.ManualClock(0)
    timer = pkg.SystemTimer(name="bench", clock=clock, executor="inline")
    schedule_ns, cancel_ns, cancels = _schedule_then_cancel(timer.schedule, w)
    t3 = _ns()
    clock.set(MAX_DELAY_MS)
    timer.advance_clock(0)
    t4 = _ns()
    assert timer.size == 0
    timer.close()
    return schedule_ns, cancel_ns, t4 - t3, cancels


def burst_tickwheel(n: int, pkg: Any = tickwheel) -> tuple[float, float]:
    clock = pkg.ManualClock(0)
    timer = pkg.SystemTimer(name="burst", clock=clock, executor="inline")
    schedule_ns = _time_burst_schedules(timer.schedule, BURST_DELAY_MS, n)
    t1 = _ns()
    clock.set(BURST_DELAY_MS)
    timer.advance_clock(0)
    t2 = _ns()
    assert timer.size == 0
    timer.close()
    return schedule_ns, t2 - t1


def run_asyncio(w: Workload) -> tuple[float, float, float, int]:
    loop = FakeTimeLoop()
    try:
        delays_s = [d / 1000 for d in w.delays]
        call_later = loop.call_later
        fn = noop
        t0 = _ns()
        handles = [call_later(d, fn) for d in delays_s]
        t1 = _ns()
        victims = [handles[i] for i in w.cancel_order]
        t2 = _ns()
        for handle in victims:
            handle.cancel()
        loop.run_one_iteration()  # asyncio's clean-up of cancelled handles
        t3 = _ns()
        loop.fake_now = MAX_DELAY_MS / 1000
        loop.run_one_iteration()
        t4 = _ns()
        assert not loop._scheduled  # type: ignore[attr-defined]
    finally:
        loop.close()
    return t1 - t0, t3 - t2, t4 - t3, len(victims)


def burst_asyncio(n: int) -> tuple[float, float]:
    loop = FakeTimeLoop()
    try:
        delay = BURST_DELAY_MS / 1000
        schedule_ns = _time_burst_schedules(loop.call_later, delay, n)
        t1 = _ns()
        loop.fake_now = delay
        loop.run_one_iteration()
        t2 = _ns()
        assert not loop._scheduled  # type: ignore[attr-defined]
    finally:
        loop.close()
    return schedule_ns, t2 - t1


def run_heapq(w: Workload) -> tuple[float, float, float, int]:
    timer = HeapTimer()
    schedule = timer.schedule
    cancel = timer.cancel
    fn = noop
    now = 0
    t0 = _ns()
    entries = [schedule(now + d, fn) for d in w.delays]
    t1 = _ns()
    victims = [entries[i] for i in w.cancel_order]
    t2 = _ns()
    for entry in victims:
        cancel(entry)
    t3 = _ns()
    fired = timer.run_due(MAX_DELAY_MS)
    t4 = _ns()
    assert fired == w.n - len(victims)
    return t1 - t0, t3 - t2, t4 - t3, len(victims)


def burst_heapq(n: int) -> tuple[float, float]:
    timer = HeapTimer()
    schedule_ns = _time_burst_schedules(timer.schedule, BURST_DELAY_MS, n)
    t1 = _ns()
    timer.run_due(BURST_DELAY_MS)
    t2 = _ns()
    return schedule_ns, t2 - t1


def run_floor(w: Workload) -> tuple[float, float, float, int]:
    schedule_ns, cancel_ns, cancels = _schedule_then_cancel(FloorTimer().schedule, w)
    return schedule_ns, cancel_ns, float("nan"), cancels


def burst_floor(n: int) -> tuple[float, float]:
    return _time_burst_schedules(FloorTimer().schedule, BURST_DELAY_MS, n), float("nan")


def _c_floor() -> Any:
    assert FLOORS is not None
    return FLOORS.FloorTimer()


def run_floor_c(w: Workload) -> tuple[float, float, float, int]:
    schedule_ns, cancel_ns, cancels = _schedule_then_cancel(_c_floor().schedule, w)
    return schedule_ns, cancel_ns, float("nan"), cancels


def burst_floor_c(n: int) -> tuple[float, float]:
    return _time_burst_schedules(_c_floor().schedule, BURST_DELAY_MS, n), float("nan")


def run_sched(w: Workload, sample: int | None) -> tuple[float, float, float, int]:
    clock = FakeClock()
    s = sched.scheduler(clock, lambda _d: None)
    enter = s.enter
    fn = noop
    t0 = _ns()
    events = [enter(d, 0, fn) for d in w.delays]
    t1 = _ns()
    order = w.cancel_order if sample is None else w.cancel_order[:sample]
    victims = [events[i] for i in order]
    t2 = _ns()
    for event in victims:
        s.cancel(event)
    t3 = _ns()
    if sample is not None:
        return t1 - t0, t3 - t2, float("nan"), len(victims)
    clock.now = MAX_DELAY_MS
    s.run(blocking=False)
    t4 = _ns()
    assert s.empty()
    return t1 - t0, t3 - t2, t4 - t3, len(victims)


def burst_sched(n: int) -> tuple[float, float]:
    clock = FakeClock()
    s = sched.scheduler(clock, lambda _d: None)
    enter = s.enter
    fn = noop
    t0 = _ns()
    for _ in range(n):
        enter(BURST_DELAY_MS, 0, fn)
    t1 = _ns()
    clock.now = BURST_DELAY_MS
    s.run(blocking=False)
    t2 = _ns()
    return t1 - t0, t2 - t1


# -- memory -----------------------------------------------------------------------


def memory(name: str, w: Workload) -> tuple[float, float]:
    """Bytes per pending timer, and per scheduled timer still held after the cancels."""
    n = w.n
    holder: list[Any] = [None] * n  # allocated before the baseline: not counted
    keep: list[Any] = []
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        if name in ("tickwheel", "tickwheel-pure"):
            pkg = tickwheel if name == "tickwheel" else PURE
            clock = pkg.ManualClock(0)
            timer = pkg.SystemTimer(name="mem", clock=clock, executor="inline")
            keep.append(timer)
            base = tracemalloc.get_traced_memory()[0]
            schedule = timer.schedule
            for i, d in enumerate(w.delays):
                holder[i] = schedule(d, noop)
            cancel: Callable[[Any], Any] = lambda t: t.cancel()  # noqa: E731
        elif name == "asyncio":
            loop = FakeTimeLoop()
            keep.append(loop)
            delays_s = [d / 1000 for d in w.delays]
            base = tracemalloc.get_traced_memory()[0]
            for i, d in enumerate(delays_s):
                holder[i] = loop.call_later(d, noop)
            cancel = lambda h: h.cancel()  # noqa: E731
        elif name == "heapq":
            heap_timer = HeapTimer()
            keep.append(heap_timer)
            base = tracemalloc.get_traced_memory()[0]
            for i, d in enumerate(w.delays):
                holder[i] = heap_timer.schedule(d, noop)
            cancel = HeapTimer.cancel
        elif name == "sched":
            s = sched.scheduler(FakeClock(), lambda _d: None)
            keep.append(s)
            base = tracemalloc.get_traced_memory()[0]
            for i, d in enumerate(w.delays):
                holder[i] = s.enter(d, 0, noop)
            cancel = s.cancel
        else:  # pragma: no cover
            raise ValueError(name)
        pending = tracemalloc.get_traced_memory()[0] - base
        if name == "sched" and n > 10_000:
            after = float("nan")  # O(n) cancels: too slow to run 90 % of them
        else:
            for i in w.cancel_order:
                cancel(holder[i])
                holder[i] = None  # drop our reference: what stays is the timer's
            after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
        for obj in keep:
            if isinstance(obj, (asyncio.AbstractEventLoop, SystemTimer, PURE.SystemTimer)):
                obj.close()
    return pending / n, after / n


# -- driver -------------------------------------------------------------------------


SCHED_SAMPLE = 100
ALL_PEERS = ("tickwheel", "tickwheel-pure", "asyncio", "heapq", "sched", "floor", "floor-c")


def _min(a: float, b: float) -> float:
    """``min`` that keeps NaN (a figure that was not measured) instead of inf."""
    if b != b:
        return b
    return min(a, b)


def measure(
    n: int, repeat: int, sched_max: int, with_memory: bool, peers: list[str]
) -> dict[str, Result]:
    w = Workload.make(n, seed=n)
    results: dict[str, Result] = {}
    runners: dict[str, tuple[Callable[[], tuple[float, float, float, int]], Callable[[], Any]]]
    # Each sched cancel scans the whole queue: fewer samples at larger N.
    sample = None if n <= sched_max else max(10, min(SCHED_SAMPLE, 10_000_000 // n))
    runners = {
        "tickwheel": (lambda: run_tickwheel(w), lambda: burst_tickwheel(n)),
        "tickwheel-pure": (lambda: run_tickwheel(w, PURE), lambda: burst_tickwheel(n, PURE)),
        "asyncio": (lambda: run_asyncio(w), lambda: burst_asyncio(n)),
        "heapq": (lambda: run_heapq(w), lambda: burst_heapq(n)),
        "sched": (lambda: run_sched(w, sample), lambda: burst_sched(n)),
        "floor": (lambda: run_floor(w), lambda: burst_floor(n)),
        "floor-c": (lambda: run_floor_c(w), lambda: burst_floor_c(n)),
    }
    for name, (life, burst) in runners.items():
        if name not in peers:
            continue
        best = [float("inf")] * 3
        best_burst = [float("inf")] * 2
        cancels = 0
        # sched's O(n) cancels make one run take seconds: once is enough.
        for _ in range(1 if name == "sched" else repeat):
            gc.collect()
            s_ns, c_ns, f_ns, cancels = life()
            best = [_min(a, b) for a, b in zip(best, (s_ns, c_ns, f_ns), strict=True)]
            gc.collect()
            bs, bf = burst()
            best_burst = [_min(a, b) for a, b in zip(best_burst, (bs, bf), strict=True)]
        fired = n - len(w.cancel_order)
        r = Result(
            schedule=best[0] / n,
            cancel=best[1] / cancels,
            fire=best[2] / fired,
            lifecycle_ms=sum(best) / 1e6,
            burst_schedule=best_burst[0] / n,
            burst_fire=best_burst[1] / n,
        )
        if name == "sched" and sample is not None:
            r.notes.append(f"cancel timed on a sample of {sample} (O(n) each); no lifecycle")
            r.lifecycle_ms = float("nan")
        if name == "floor":
            r.notes.append(
                "not a timer: the least a thread-safe intrusive timer does (see the module doc)"
            )
        if name == "floor-c":
            r.notes.append("not a timer: the same least work in C (see the module doc)")
        results[name] = r
    if with_memory:
        for name, r in results.items():
            if name.startswith("floor"):
                continue
            gc.collect()
            r.bytes_pending, r.bytes_after_cancel = memory(name, w)
    return results


def _fmt(value: float, digits: int = 0) -> str:
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def render(n: int, results: dict[str, Result]) -> str:
    base = results["asyncio"].lifecycle_ms if "asyncio" in results else float("nan")
    rows = [
        f"N = {n:,}",
        "| timer | schedule ns | cancel ns | fire ns | lifecycle ms | vs asyncio "
        "| burst schedule ns | burst fire ns | B/pending | B/timer after cancels |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        ratio = r.lifecycle_ms / base if base == base and base else float("nan")
        rows.append(
            f"| {name} | {_fmt(r.schedule)} | {_fmt(r.cancel)} | {_fmt(r.fire)} "
            f"| {_fmt(r.lifecycle_ms, 1)} | {_fmt(ratio, 2)}{'x' if ratio == ratio else ''} "
            f"| {_fmt(r.burst_schedule)} "
            f"| {_fmt(r.burst_fire)} | {_fmt(r.bytes_pending)} | {_fmt(r.bytes_after_cancel)} |"
        )
    for name, r in results.items():
        for note in r.notes:
            rows.append(f"  {name}: {note}")
    return "\n".join(rows)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu unknown"


def machine() -> str:
    """One line of machine facts: Python, CPU model and count, GC state."""
    return (
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.machine()}, {_cpu_model()} x {os.cpu_count()}, gc "
        f"{'on' if gc.isenabled() else 'off'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="10000,100000,1000000",
        help="comma-separated N values (default 1e4, 1e5, 1e6)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure, best kept")
    parser.add_argument(
        "--sched-max",
        type=int,
        default=10_000,
        help="largest N at which sched cancels all 90%% (its cancel is O(n))",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="disable the cyclic GC in the runs, to show its share (the targets have it on)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter_ns (default); cpu: time.thread_time_ns, steadier "
        "when other processes compete for the CPU",
    )
    parser.add_argument(
        "--peers",
        default=",".join(ALL_PEERS),
        help="comma-separated implementations to run (default all of them)",
    )
    args = parser.parse_args(argv)
    try:
        sizes = [int(float(s)) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or any(n < 10 for n in sizes):
        parser.error("--sizes needs values >= 10")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(ALL_PEERS)
    if unknown or not peers:
        parser.error(f"--peers: unknown implementation(s) {sorted(unknown)}")
    if FLOORS is None and "floor-c" in peers:
        peers.remove("floor-c")
    global _clock_ns
    _clock_ns = time.perf_counter_ns if args.clock == "wall" else time.thread_time_ns
    if args.no_gc:
        gc.disable()
    print(machine() + f", clock {args.clock}")
    print(
        "tickwheel: "
        + ("compiled core" if tickwheel.COMPILED else "pure Python (the core is not built)")
        + "; tickwheel-pure: the pure-Python reference"
    )
    print(
        "workload: delays uniform in [1, 30000] ms; cancel a random 90% in random order; "
        "expire the rest; burst = N timers due at once. ns per operation, best of "
        f"{args.repeat}."
    )
    for n in sizes:
        started = time.perf_counter()
        repeat = args.repeat if n <= 100_000 else max(1, args.repeat - 2)
        results = measure(n, repeat, args.sched_max, not args.no_memory, peers)
        print()
        print(render(n, results))
        print(f"  ({time.perf_counter() - started:.1f} s)")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
