"""The pipeline's per-partition loop alone: PartitionProcessor.process, no Spark.

Workload: ``--orders`` orders over a day, each opened by a ``created`` event;
70 % are ``paid`` and 10 % ``cancelled`` within 0-40 min of creation (some
after the 30-minute timeout, so they find it expired), 20 % never resolve.
The events are sorted by (time, sequence, id), as the Spark job sorts each
partition, laid out as one Python list per column (as the job's
``to_pylist()`` of each Arrow column: fresh objects, in that order), and fed
as ``zip(*columns)`` to one ``PartitionProcessor`` with the rule of
``examples/orders.toml``, as the batch job does; then ``finish()`` expires
what is left.

It runs on the installed package (the compiled core when it is built) and on
the pure-Python reference loaded beside it (``load_pure``, from the tests' support code),
interleaved, ``--repeat`` times each; the best run is shown. Times are CPU
time of this thread with the cyclic GC paused, as the Spark job runs the loop
(``cyclic_gc_paused``). ``events/s`` counts input events; the issue's target
is 1.5M events/s on one core.

    python benchmarks/bench_pipeline_loop.py --orders 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from typing import Any

from _support import load_pure

import tickwheel
import tickwheel.pipeline.core
import tickwheel.pipeline.rules

PURE = load_pure("tickwheel.pipeline.core", "tickwheel.pipeline.rules")
TARGET_EVENTS_PER_S = 1_500_000
DAY_MS = 86_400_000
TIMEOUT_MS = 30 * 60_000


def make_events(orders: int, seed: int) -> list[tuple[int, str, int, int, str, int, str]]:
    """The sorted events of ``orders`` orders (see the module doc)."""
    rng = random.Random(seed)
    events = []
    for i in range(orders):
        key = f"o{i}"
        created = rng.randrange(DAY_MS)
        events.append((0, key, created, 0, f"{key}-c", 0, "created"))
        fate = rng.random()
        if fate < 0.8:
            at = created + rng.randrange(40 * 60_000)
            kind, kind_name = (1, "paid") if fate < 0.7 else (2, "cancelled")
            events.append((0, key, at, 1, f"{key}-r", kind, kind_name))
    events.sort(key=lambda e: (e[2], e[3], e[4]))
    return events


def columns(events: list[tuple[int, str, int, int, str, int, str]]) -> list[list[Any]]:
    """The events as one list per column, with fresh objects in event order (as to_pylist)."""
    fresh = [
        tuple(v.encode().decode() if isinstance(v, str) else int(str(v)) for v in e) for e in events
    ]
    return [list(column) for column in zip(*fresh, strict=True)]


def run_loop(pkg: Any, events: list[tuple[int, str, int, int, str, int, str]]) -> float:
    """CPU seconds of one process() + finish() over ``events`` on ``pkg``'s core."""
    cols = columns(events)
    core = pkg.pipeline.core
    rules = pkg.pipeline.rules.parse_rules(
        {
            "input": {"key": "order_id"},
            "rules": {
                "payment": {
                    "open": ["created"],
                    "complete": ["paid"],
                    "cancel": ["cancelled"],
                    "timeout": "30m",
                }
            },
        }
    )
    with core.cyclic_gc_paused():
        proc = core.PartitionProcessor(rules)
        started = time.thread_time()
        proc.process(zip(*cols, strict=True))
        proc.finish()
        seconds = time.thread_time() - started
        outcomes = len(proc.take_outcomes())
        proc.close()
    orders = sum(1 for e in events if e[5] == 0)
    assert outcomes == orders, (outcomes, orders)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.orders < 1 or args.repeat < 1:
        parser.error("--orders and --repeat must be >= 1")
    sides = {"tickwheel": tickwheel, "tickwheel-pure": PURE}
    events = make_events(args.orders, args.seed)
    print(
        f"python {platform.python_version()}, tickwheel "
        f"{'compiled core' if tickwheel.COMPILED else 'pure Python (core not built)'}; "
        f"{args.orders:,} orders, {len(events):,} events, best of {args.repeat}"
    )
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(args.repeat):
        for name, pkg in sides.items():
            best[name] = min(best[name], run_loop(pkg, events))
    print(f"{'side':<16} {'CPU s':>7} {'events/s':>11} {'vs target':>10}")
    for name, seconds in best.items():
        rate = len(events) / seconds
        print(f"{name:<16} {seconds:7.2f} {rate:11,.0f} {rate / TARGET_EVENTS_PER_S:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
