"""One drop-in workload of ``bench_aio.py --drop-in``, run once, for instruction counts.

CPU times on a shared machine are noisy; instruction counts are not. Run this
under callgrind twice, with a workload and with ``none`` (the same set-up,
no timers), and divide the difference by N::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python benchmarks/instructions_aio.py tickwheel later 100000

Sides as in ``bench_aio.py --drop-in`` (``stock``, ``tickwheel``,
``tickwheel-pure``; ``TICKWHEEL_NO_EXTENSIONS=1`` makes ``tickwheel`` pure);
workloads ``later`` (``loop.call_later``/``cancel``), ``timeout``
(``asyncio.timeout``), ``sleep`` (``asyncio.sleep`` tasks) and ``none``.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from bench_aio import (
    Workload,
    _call_later_cancel,
    _drop_in_loop,
    _sleeps,
    _timeouts,
    make_workload,
)


async def _nothing(w: Workload) -> None:
    pass


WORKLOADS: dict[str, Callable[[Workload], Coroutine[Any, Any, None]]] = {
    "later": _call_later_cancel,
    "timeout": _timeouts,
    "sleep": _sleeps,
    "none": _nothing,
}


def main(argv: list[str] | None = None) -> int:
    """Run the workload once on a fresh loop of the side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=["stock", "tickwheel", "tickwheel-pure"])
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("n", type=int)
    parser.add_argument("--seed", type=int, default=20260422)
    args = parser.parse_args(argv)
    w = make_workload(args.n, args.seed)
    loop = _drop_in_loop(args.side)
    try:
        gc.collect()
        loop.run_until_complete(WORKLOADS[args.workload](w))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
