"""The compiled core's timer and purgatory workloads, K times, for instruction counts.

On a shared machine seconds are noisy; instructions counted by
``valgrind --tool=callgrind`` are not (the same total twice, whatever else
runs). This runs ``bench_timer.py``'s lifecycle and burst on the installed
``tickwheel`` (``timer``), or ``bench_purgatory.py``'s deterministic mode
(``purgatory``), ``K`` times. One workload's count is the difference of two
runs, ``(total(K=3) - total(K=1)) / 2``: the start-up and the imports cancel
out. Compare two builds (a layout change, a compiler flag) with the same
command on each::

    for k in 1 3; do
        PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=cg-timer-$k.out \\
            .venv/bin/python benchmarks/callgrind_workloads.py timer $k
    done
    grep -h totals: cg-timer-1.out cg-timer-3.out
"""

from __future__ import annotations

import argparse

import bench_purgatory
import bench_timer

import tickwheel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("timer", "purgatory"))
    parser.add_argument("k", type=int, help="how many times to run it")
    parser.add_argument("--n", type=int, default=20_000, help="timers or operations per run")
    args = parser.parse_args(argv)
    if not tickwheel.COMPILED:
        parser.error("the compiled core is not in use: there is nothing to count")
    if args.workload == "timer":
        workload = bench_timer.Workload.make(args.n, 1)
        for _ in range(args.k):
            bench_timer.run_tickwheel(workload)
            bench_timer.burst_tickwheel(args.n)
    else:
        impl = bench_purgatory.implementation(tickwheel)
        for _ in range(args.k):
            bench_purgatory.run_deterministic(impl, args.n, 1)


if __name__ == "__main__":
    main()
