"""The batch job as a user runs it, at growing sizes: ``bench_pipeline.py --scale``.

For each size N, ``tickwheel pipeline generate --orders N --files 16`` writes
the orders, then ``tickwheel pipeline run`` runs over them with its defaults
(partitions from the input's size, the driver's heap from the machine's
memory), one process each, timed from start to exit. Its log is searched for
the JVM's heap errors. The target (issue 28): the largest size completes
with no heap error, in at most 12x the time of the size 10x smaller; the
other steps of growth are reported.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _cli_comparison import _tickwheel_command
from _stream_inputs import sci

ROOT = Path(__file__).resolve().parents[1]
HEAP_ERRORS = re.compile(r"OutOfMemoryError|Java heap space|GC overhead limit exceeded")


@dataclass(frozen=True)
class _ScaleRun:
    orders: int
    records: int
    input_bytes: int
    partitions: int
    seconds: float
    heap_errors: int


def _run_one(n: int, work: Path) -> _ScaleRun:
    """Generate ``n`` orders, run the job on them; seconds, partitions, heap errors."""
    tw = _tickwheel_command()
    data, out = work / f"scale-{n}", work / f"scale-{n}-out"
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([*tw, "pipeline", "generate", "--orders", str(n), "--files", "16",
                    "--seed", "1", "--out", str(data)],
                   check=True, capture_output=True)  # fmt: skip
    command = [*tw, "pipeline", "run", "--rules", str(ROOT / "examples" / "orders.toml"),
               "--input", str(data), "--output", str(out)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    log = done.stdout + done.stderr
    if done.returncode != 0:
        print(log[-3000:], file=sys.stderr)
        raise SystemExit(f"pipeline run on {n:,} orders failed (exit {done.returncode})")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    run = _ScaleRun(
        orders=n,
        records=summary["counts"]["records"],
        input_bytes=sum(p.stat().st_size for p in data.iterdir() if p.is_file()),
        partitions=summary["partitions"],
        seconds=seconds,
        heap_errors=len(HEAP_ERRORS.findall(log)),
    )
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return run


def scale_run(sizes: list[int], work: Path) -> int:
    """Run and print the scale table; 0 when every run completed."""
    from tickwheel.pipeline.spark.session import default_driver_memory

    print(f"pipeline run with its defaults (driver heap {default_driver_memory()}), "
          "one process each, 16 files:")  # fmt: skip
    runs = []
    for n in sorted(sizes):
        r = _run_one(n, work)
        runs.append(r)
        print(f"  {sci(n):>6} orders: {r.records:,} records, {r.input_bytes / 1e6:,.0f} MB, "
              f"{r.partitions} partitions, {r.seconds:.1f} s, "
              f"heap errors in the log: {r.heap_errors}", flush=True)  # fmt: skip
    print(f"\n{'target':60} {'measured':>9} {'target':>9}  verdict")
    for small, big in itertools.pairwise(runs):
        ratio = big.seconds / small.seconds
        name = f"batch job on {sci(big.orders)} orders, defaults: time vs {sci(small.orders)}"
        if big is runs[-1] and big.orders == 10 * small.orders:  # the target
            verdict = "met" if ratio <= 12 and big.heap_errors == 0 else "NOT met"
            print(f"{name:60} {ratio:>8.2f}x {'<= 12x':>9}  {verdict}")
        else:
            print(f"{name:60} {ratio:>8.2f}x {'(report)':>9}")
    return 0
