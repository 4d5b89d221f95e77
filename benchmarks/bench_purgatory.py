"""Purgatory benchmark, modelled on Kafka's ``TestPurgatoryPerformance``.

Part 1, **Kafka's workload** (threads, system clock). A generator thread issues
``--requests`` delayed operations at ``--rate`` requests/s. Each watches 3 of
``--keys`` (100) keys and has a ``--timeout-ms`` (200 ms) timeout. Its
completion latency is drawn from a log-normal distribution fixed by its median
``--pct50`` and 75th percentile ``--pct75`` (as Kafka's test); a *completion
thread* calls ``force_complete()`` when that latency has passed, and a request
whose latency is not below the timeout is left to expire through the
purgatory's ``ExpirationReaper`` thread. As in Kafka's test, completed requests
stay in the watcher lists until the reaper purges them. The generator and the
completion thread wake every ``--pace-ms`` (1 ms, Kafka's clock resolution) and
handle everything due by then (see ``run_kafka_workload``).

Reported: the achieved request rate, the process CPU time per request
(``time.process_time``: all threads, the generator and the completion thread
included) and the completion-latency distribution (created → ``on_complete``).
Kafka on the JVM saturates at about 300k requests/s at 3.5–4 µs CPU per
request; the target for tickwheel's compiled core is <= 3.0 µs CPU per request
at saturation (issue 18), and <= 12 µs for the pure-Python path.

Measured in the same run, interleaved, on the same workload:

* ``tickwheel``: the package as installed (the compiled core when it is built,
  ``tickwheel.COMPILED``);
* ``tickwheel-pure``: the pure-Python reference, loaded beside it in this
  process (``load_pure``, from the tests' support code);
* ``heapq-lazy``: the installed purgatory with its hierarchical timing wheel
  replaced by a ``heapq`` timer with lazy cancellation (asyncio's design: a
  cancelled handle stays in the heap until it comes due), driven by the same
  reaper loop.

Part 2, **deterministic mode** (the pipeline's configuration: a ``ManualClock``
timer with ``executor="inline"``, ``reaper_enabled=False``, one lock shared by
the ops). Single-threaded µs per op for ``try_complete_else_watch`` (op creation
included), ``check_and_complete`` (completing it) and expiry
(``advance_clock``), with the garbage collector on and off, on both paths.

Usage::

    python benchmarks/bench_purgatory.py             # 100k requests at 20k/s, then at max rate
    python benchmarks/bench_purgatory.py --requests 200000 --rates 40000 --repeat 5
"""

from __future__ import annotations

import argparse
import collections
import gc
import heapq
import itertools
import math
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from _support import load_pure

import tickwheel

# The pure-Python reference, loaded beside the installed package (compiled when built).
PURE = load_pure()


@dataclass(frozen=True)
class Impl:
    """One path's classes: its purgatory, and the benchmark's ops and heapq timer on it."""

    pkg: ModuleType
    FakeOperation: Any
    PipelineOp: Any
    HeapTimer: Any


def implementation(pkg: ModuleType) -> Impl:
    """The benchmark's classes built on ``pkg`` (``tickwheel`` or the pure copy)."""
    op_init = pkg.DelayedOperation.__init__
    now_ns = time.perf_counter_ns

    # -- the operation -------------------------------------------------------------------

    class FakeOperation(pkg.DelayedOperation):  # type: ignore[name-defined, misc]
        """Kafka's FakeOperation: completes when its completion thread says so.

        ``completes_at_ms`` is Kafka's ``completesAt``: creation time plus latency,
        on a millisecond clock (``perf_counter_ns() // 1_000_000``).
        """

        __slots__ = ("completes_at_ms", "created_ns", "done_ns")

        def __init__(self, timeout_ms: int, latency_ms: int, lock: Any = None) -> None:
            # DelayedOperation.__init__ called directly: super() costs a lookup per request.
            op_init(self, timeout_ms, lock)
            created = now_ns()
            self.created_ns = created
            self.completes_at_ms = created // 1_000_000 + latency_ms
            self.done_ns = 0

        def try_complete(self) -> bool:
            return False  # only the completion thread completes it (force_complete)

        def on_complete(self) -> None:
            self.done_ns = now_ns()

    class PipelineOp(pkg.DelayedOperation):  # type: ignore[name-defined, misc]
        """An op completed by a later event, as the pipeline's: ``ready`` set, then checked."""

        __slots__ = ("ready",)

        def __init__(self, delay_ms: int, lock: Any) -> None:
            super().__init__(delay_ms, lock)
            self.ready = False

        def try_complete(self) -> bool:
            return bool(self.force_complete()) if self.ready else False

        def on_complete(self) -> None:
            pass

    return Impl(pkg, FakeOperation, PipelineOp, _heap_timer_class(pkg.SystemTimer))


# -- the peer timer: heapq with lazy cancellation ----------------------------------------


def _heap_timer_class(system_timer: Any) -> Any:
    class HeapTimer(system_timer):  # type: ignore[misc, valid-type]
        """A ``heapq`` timer with asyncio's lazy cancellation, behind SystemTimer's interface.

        ``add`` pushes ``(expiration, seq, task)``; a cancelled or completed task stays
        in the heap until it is due, when its ``run()`` finds it completed and does
        nothing. ``advance_clock`` pops what is due and hands it to the same
        executor thread SystemTimer uses. ``size`` counts the heap, cancelled
        entries included (there is no O(1) way to know).
        """

        def __init__(self, name: str) -> None:
            super().__init__(name, clock=tickwheel.SystemClock())
            self._heap: list[tuple[int, int, Any]] = []
            self._seq = itertools.count()

        def add(self, task: Any) -> None:
            lock = self._lock
            lock.acquire()
            try:
                if self._closed:
                    raise RuntimeError(f"timer {self.name!r} is closed")
                item = (task._delay_ms + self._now(), next(self._seq), task)
                heap = self._heap
                heapq.heappush(heap, item)
                if heap[0] is item and self._waiting:
                    self._cond.notify_all()
            finally:
                lock.release()

        def advance_clock(self, timeout_ms: int = 0) -> bool:
            due: list[Any] = []
            heap = self._heap
            with self._lock:
                if self._closed:
                    return False
                now = self._now()
                if not heap or heap[0][0] > now:
                    if timeout_ms <= 0:
                        return False
                    deadline = now + timeout_ms
                    interrupts = self._interrupts
                    self._waiting += 1
                    try:
                        while not heap or heap[0][0] > now:
                            wake = deadline if not heap else min(deadline, heap[0][0])
                            self._cond.wait((wake - now) / 1000.0)
                            now = self._now()
                            if now >= deadline or self._closed or self._interrupts != interrupts:
                                break
                    finally:
                        self._waiting -= 1
                while heap and heap[0][0] <= now:
                    due.append(heapq.heappop(heap)[2])
            if due:
                self._dispatch(due)
                return True
            return False

        @property
        def size(self) -> int:
            return len(self._heap)

    return HeapTimer


# -- part 1: Kafka's workload ---------------------------------------------------------------


def lognormal_latencies(n: int, pct50: float, pct75: float, rng: random.Random) -> list[int]:
    """Kafka's LatencySamples: log-normal with the given median and 75th percentile."""
    mu = math.log(pct50)
    sigma = (math.log(pct75) - mu) / 0.6744897501960817
    return [max(0, int(rng.lognormvariate(mu, sigma))) for _ in range(n)]


def run_kafka_workload(
    impl: Impl, timer: Any, args: argparse.Namespace, rate: float
) -> dict[str, Any]:
    """Run the workload on ``impl``'s purgatory with ``timer`` at ``rate`` requests/s (0: max).

    How the harness paces (its own CPU counts, as in Kafka's test, so it wakes
    as little as the workload allows):

    * the generator (this thread) wakes every ``--pace-ms`` and issues, back to
      back, every request due by then at the target rate (Kafka's generator
      sleeps whole milliseconds whenever it is ahead, so it too issues the
      requests of one millisecond back to back);
    * the completion thread keeps the requests to complete in a calendar (a
      list per due millisecond, and a heap of those milliseconds: Kafka's
      ``DelayQueue`` ordered by ``completesAt``). It sleeps until the earliest
      due millisecond, but at least ``--pace-ms`` and, while requests are still
      being generated, at most ``--pace-ms`` (a new request may be due sooner);
      on waking it force-completes every request due by then, so a completion
      is late by at most about ``--pace-ms``.
    """
    rng = random.Random(args.seed)
    n = args.requests
    latencies = lognormal_latencies(n, args.pct50, args.pct75, rng)
    key_sets = [tuple(rng.sample(range(args.keys), 3)) for _ in range(4096)]
    purgatory = impl.pkg.DelayedOperationPurgatory(
        "bench", timer=timer, purge_interval=args.purge_interval
    )
    # The generator appends a batch, the completion thread pops it: deque
    # operations are atomic, and nobody is woken per request.
    handoff: collections.deque[list[Any]] = collections.deque()
    ops: list[Any] = []
    timeout_ms = args.timeout_ms
    pace_s = args.pace_ms / 1000
    generating = threading.Event()
    generating.set()

    def completion_thread() -> None:
        calendar: dict[int, list[Any]] = {}  # due ms -> requests
        due_heap: list[int] = []  # the keys of calendar
        popleft = handoff.popleft
        sleep = time.sleep
        now_ns = time.perf_counter_ns
        while generating.is_set() or calendar or handoff:
            while handoff:
                for op in popleft():
                    due = op.completes_at_ms
                    bucket = calendar.get(due)
                    if bucket is None:
                        calendar[due] = [op]
                        heapq.heappush(due_heap, due)
                    else:
                        bucket.append(op)
            now_ms = now_ns() // 1_000_000
            while due_heap and due_heap[0] <= now_ms:
                for op in calendar.pop(heapq.heappop(due_heap)):
                    op.force_complete()
            if due_heap and not generating.is_set():
                sleep(max(pace_s, min(0.1, (due_heap[0] - now_ms) / 1000)))
            else:
                sleep(pace_s)

    completer = threading.Thread(target=completion_thread, name="completion", daemon=True)
    gc.collect()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    completer.start()
    put = handoff.append
    watch = purgatory.try_complete_else_watch
    make_op = impl.FakeOperation
    keep = ops.append
    sleep = time.sleep
    clock = time.perf_counter
    issued = 0
    while issued < n:
        # Issue every request due by now at the target rate (as fast as possible: 1000).
        target = min(n, int((clock() - wall0) * rate) + 1 if rate > 0 else issued + 1000)
        batch: list[Any] = []
        while issued < target:
            latency = latencies[issued]
            op = make_op(timeout_ms, latency)
            keep(op)
            watch(op, key_sets[issued & 4095])
            if latency < timeout_ms:
                batch.append(op)
            issued += 1
        if batch:
            put(batch)
        sleep(pace_s if rate > 0 else 0)
    gen_wall = time.perf_counter() - wall0
    generating.clear()
    deadline = time.monotonic() + timeout_ms / 1000 + 30
    while purgatory.num_completed + purgatory.num_expired < n and time.monotonic() < deadline:
        time.sleep(0.005)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    completer.join(30)
    finished = purgatory.num_completed + purgatory.num_expired
    expired = purgatory.num_expired
    purgatory.shutdown()
    done_ms = sorted((op.done_ns - op.created_ns) / 1e6 for op in ops if op.done_ns)
    return {
        "finished": finished,
        "expired": expired,
        "rate": n / gen_wall,
        "wall_s": wall,
        "cpu_us": cpu / n * 1e6,
        "lat": done_ms,
    }


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


# -- part 2: deterministic mode -----------------------------------------------------------


def run_deterministic(impl: Impl, n: int, repeat: int, gc_on: bool = True) -> dict[str, float]:
    """Best-of-``repeat`` µs per op for watch, complete and expire in deterministic mode."""
    pkg = impl.pkg
    op_class = impl.PipelineOp
    best = {"watch": math.inf, "complete": math.inf, "expire": math.inf}
    for _ in range(repeat):
        if not gc_on:
            gc.disable()
        clock = pkg.ManualClock(0)
        timer = pkg.SystemTimer("det", clock=clock, executor="inline")
        purgatory = pkg.DelayedOperationPurgatory("det", timer=timer, reaper_enabled=False)
        lock = threading.RLock()
        watch = purgatory.try_complete_else_watch
        check = purgatory.check_and_complete
        keys = [("order", i) for i in range(n)]
        gc.collect()
        t0 = time.process_time()
        ops = []
        for i in range(n):
            op = op_class(30_000 + (i & 1023), lock)
            ops.append(op)
            watch(op, (keys[i],))
        t1 = time.process_time()
        for i in range(0, n, 2):
            ops[i].ready = True
            check(keys[i])
        t2 = time.process_time()
        clock.advance(40_000)
        purgatory.advance_clock(0)
        purgatory.purge_completed()
        t3 = time.process_time()
        assert purgatory.num_completed == n // 2 + n % 2
        assert purgatory.num_expired == n // 2 and purgatory.watched == 0
        purgatory.shutdown()
        gc.enable()
        half = n / 2
        best["watch"] = min(best["watch"], (t1 - t0) / n * 1e6)
        best["complete"] = min(best["complete"], (t2 - t1) / half * 1e6)
        best["expire"] = min(best["expire"], (t3 - t2) / half * 1e6)
    return best


# -- main -----------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import os

    return f"{cpu}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument(
        "--rates",
        default="20000,max",
        help="comma-separated target requests/s; 'max' issues as fast as possible",
    )
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--timeout-ms", type=int, default=200)
    parser.add_argument("--pct50", type=float, default=50.0, help="median latency, ms")
    parser.add_argument("--pct75", type=float, default=100.0, help="75th percentile, ms")
    parser.add_argument("--purge-interval", type=int, default=1000)
    parser.add_argument(
        "--pace-ms",
        type=float,
        default=1.0,
        help="how often the generator and the completion thread wake, ms",
    )
    parser.add_argument("--det-ops", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)

    print(f"machine: {machine()}")
    print(
        "tickwheel: "
        + ("compiled core" if tickwheel.COMPILED else "pure Python (the core is not built)")
        + "; tickwheel-pure: the pure-Python reference"
    )
    installed = implementation(tickwheel)
    pure = implementation(PURE)
    peers: list[tuple[str, Impl, Callable[[], Any]]] = [
        ("tickwheel", installed, lambda: tickwheel.SystemTimer("bench")),
        ("tickwheel-pure", pure, lambda: PURE.SystemTimer("bench")),
        ("heapq-lazy", installed, lambda: installed.HeapTimer("bench-heap")),
    ]
    for rate_text in args.rates.split(","):
        rate = 0.0 if rate_text.strip() == "max" else float(rate_text)
        print()
        print(
            f"workload: {args.requests} requests at "
            f"{'max' if rate == 0 else f'{rate:.0f}'}/s, 3 of {args.keys} keys, "
            f"timeout {args.timeout_ms} ms, latency pct50={args.pct50} pct75={args.pct75} ms, "
            f"purge_interval={args.purge_interval}, best of {args.repeat}"
        )
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in peers}
        for _ in range(args.repeat):
            for name, impl, make in peers:  # interleaved, so all see the same machine load
                results[name].append(run_kafka_workload(impl, make(), args, rate))
        best = {name: min(runs, key=lambda r: r["cpu_us"]) for name, runs in results.items()}
        base = best["tickwheel"]["cpu_us"]
        print(
            f"{'peer':<14} {'rate/s':>9} {'CPU µs/req':>10} {'ratio':>6} {'expired':>8} "
            f"{'mean ms':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}  runs (CPU µs/req)"
        )
        for name, _, _ in peers:
            r = best[name]
            lat = r["lat"]
            runs = ", ".join(f"{x['cpu_us']:.1f}" for x in results[name])
            mean = statistics.fmean(lat) if lat else math.nan
            print(
                f"{name:<14} {r['rate']:>9.0f} {r['cpu_us']:>10.2f} {r['cpu_us'] / base:>6.2f} "
                f"{r['expired'] / args.requests:>7.1%} {mean:>7.1f} {pct(lat, 50):>7.1f} "
                f"{pct(lat, 99):>7.1f} {lat[-1] if lat else math.nan:>7.1f}  {runs}"
            )
            assert r["finished"] == args.requests, f"{name}: only {r['finished']} finished"
        if rate == 0:
            for name, bound in (("tickwheel", 3.0), ("tickwheel-pure", 12.0)):
                cpu = best[name]["cpu_us"]
                verdict = "meets" if cpu <= bound else "misses"
                print(
                    f"target at saturation, {name}: <= {bound} µs CPU per request: "
                    f"{cpu:.2f} µs ({verdict} it)"
                )

    print()
    print(f"deterministic mode, {args.det_ops} ops (best of {args.repeat}, CPU µs per op):")
    paths = [("tickwheel", installed), ("tickwheel-pure", pure)]
    figures = {
        (name, gc_on): run_deterministic(impl, args.det_ops, args.repeat, gc_on)
        for gc_on in (True, False)
        for name, impl in paths
    }
    print(f"{'':<40} {'tickwheel':>15} {'tickwheel-pure':>15}")
    print(f"{'step':<40} {'gc on':>7} {'gc off':>7} {'gc on':>7} {'gc off':>7}")
    for fig in figures.values():
        fig["life"] = fig["watch"] + (fig["complete"] + fig["expire"]) / 2
    for label, key in [
        ("create + try_complete_else_watch", "watch"),
        ("check_and_complete (completes it)", "complete"),
        ("expire: advance_clock + purge", "expire"),
        ("lifecycle (watch + mean of the two ends)", "life"),
    ]:
        cells = " ".join(
            f"{figures[name, gc_on][key]:>7.2f}" for name, _ in paths for gc_on in (True, False)
        )
        print(f"{label:<40} {cells}")


if __name__ == "__main__":
    main()
