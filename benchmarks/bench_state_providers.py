"""The stream's two state providers from the command line, side by side: steady micro-batches
of 1,000 records after N pending, with the operations in the driver and partitioned on
the executors, and the driver process's memory in the steady state.

For each N of ``--pending``, the files of ``bench_stream_steady.py`` (a load leaving
N orders pending, then ``--batches`` files of ``--records`` records, a quarter of
them payments of pending orders), read one file per micro-batch by ``tickwheel
pipeline stream`` twice, one process each:

* ``driver``: the default bound, which every N here fits: the operations indexed in
  the driver (``stream/state/ops_index.py``);
* ``partitioned``: ``--driver-state-bytes 1``: every state past the bound from the
  first, its operations in a RocksDB store per key partition on the executors
  (``stream/state/partitioned.py``).

Each micro-batch's seconds come from the stream's progress lines, as in
``bench_stream_steady.py``; *steady* is the median of micro-batches 2..k. The
driver's memory is the resident set of the stream's Python process (where the
driver provider keeps its index), sampled every half second
(``bench_stream_steady.run_measured``); *steady* is its largest sample from the
end of micro-batch 1 to the end of the last. Both runs' operations pending at
the end are checked equal to the generated count.

    .venv/bin/python benchmarks/bench_state_providers.py --pending 1e4 1e5 1e6
    .venv/bin/python benchmarks/bench_state_providers.py --pending 1e7 --providers partitioned
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _cli_comparison import PYFLINK_PYTHON, _cli_commands
from _stream_inputs import sci
from _stream_state import python_workers, status_mb
from bench_stream_steady import (
    BATCH_LINE,
    run_measured,
    steady_rules,
    stream_pending,
    write_workload,
)

PROVIDERS = {"driver": [], "partitioned": ["--driver-state-bytes", "1"]}
#: A progress line's clock: ``[12:00:01] stream: batch 3: ...``.
LINE_CLOCK = re.compile(r"^\[(\d\d):(\d\d):(\d\d)\] stream: batch (\d+): ")


@dataclass
class DriverMemory:
    """The stream's Python driver's resident set (MB), sampled with the wall clock."""

    samples: list[tuple[float, float]] = field(default_factory=list)

    def sample(self) -> None:
        for pid in python_workers(os.getpid()):
            with contextlib.suppress(OSError):  # gone since it was listed
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"pipeline" in command and b"stream" in command and b"python" in command[0]:
                    self.samples.append((time.time(), status_mb(pid, "VmRSS")))

    def largest(self, start: float, end: float) -> float | None:
        inside = [mb for at, mb in self.samples if start <= at <= end]
        return max(inside) if inside else None


@dataclass
class Run:
    provider: str
    seconds: list[float]
    ends: dict[int, float]  # micro-batch -> its progress line's wall clock
    pending: int | None
    memory: DriverMemory
    code: int | None

    def steady(self, batches: int) -> float | None:
        found = self.seconds[2 : batches + 1]
        return statistics.median(found) if len(found) == batches - 1 else None

    def steady_memory(self, batches: int) -> float | None:
        if 1 not in self.ends or batches not in self.ends:
            return None
        return self.memory.largest(self.ends[1], self.ends[batches] + 1)


def _clock(stdout: str) -> dict[int, float]:
    """Each micro-batch's progress line as a wall-clock time (today, local)."""
    today = dt.date.today()
    ends = {}
    for line in stdout.splitlines():
        match = LINE_CLOCK.search(line)
        if match:
            h, m, s, batch = (int(g) for g in match.groups())
            ends[batch] = dt.datetime.combine(today, dt.time(h, m, s)).timestamp()
    return ends


def run_stream(work: Path, rules: Path, inp: Path, files: int, provider: str,
               timeout_s: float) -> Run:  # fmt: skip
    command = _cli_commands(work, rules, inp, files, [], PYFLINK_PYTHON)["stream"]
    command += PROVIDERS[provider]
    run, memory = run_measured(command, timeout_s, DriverMemory())
    if run.code:
        print(f"{provider}: exit {run.code}:\n{run.stderr[-3000:]}", file=sys.stderr)
    seconds = [float(m.group(2)) for m in map(BATCH_LINE.search, run.stdout.splitlines()) if m]
    pending = stream_pending(work / "cli-stream-ck") if run.code == 0 else None
    return Run(provider, seconds, _clock(run.stdout), pending, memory, run.code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=float, nargs="+", default=[1e4, 1e5, 1e6])
    parser.add_argument("--batches", type=int, default=6, help="steady files after the load")
    parser.add_argument("--records", type=int, default=1_000, help="records per steady file")
    parser.add_argument("--timeout", type=float, default=3600.0, help="each run, at most (s)")
    parser.add_argument("--providers", nargs="+", choices=list(PROVIDERS), default=list(PROVIDERS))
    args = parser.parse_args(argv)
    if args.batches < 2 or args.records < 4:
        parser.error("--batches >= 2 and --records >= 4")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="tw-bench-providers-"))
    rules = steady_rules(work / "rules.toml")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; micro-batches of "
          f"{args.records:,} records; steady: medians of micro-batches 2..{args.batches}; "
          "driver memory: the stream's Python process, MB", flush=True)  # fmt: skip
    rows: list[tuple[int, dict[str, Run]]] = []
    try:
        for n in sorted({int(p) for p in args.pending}):
            here = work / f"n-{sci(n)}"
            workload = write_workload(here / "in", n, args.batches, args.records)
            runs = {}
            for provider in args.providers:
                run = runs[provider] = run_stream(
                    here / provider, rules, workload.input, workload.files, provider, args.timeout
                )
                if run.pending != workload.pending:
                    raise SystemExit(f"{provider} at {sci(n)}: {run.pending} pending, "
                                     f"not {workload.pending}")  # fmt: skip
                print(f"{sci(n)} pending: {provider}: micro-batches "
                      + " ".join(f"{s:.1f}" for s in run.seconds)
                      + f" s; driver steady {run.steady_memory(args.batches) or float('nan'):.0f} "
                      "MB", flush=True)  # fmt: skip
            rows.append((n, runs))
            shutil.rmtree(here, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(rows, args.batches)
    return 0


def _report(rows: list[tuple[int, dict[str, Run]]], batches: int) -> None:
    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print(f"\n{'pending':>8} {'driver s':>9} {'part. s':>8} {'part./driver':>13} "
          f"{'driver MB':>10} {'part. MB':>9}")  # fmt: skip
    first = (
        rows[0][1]["partitioned"].steady(batches) if rows and "partitioned" in rows[0][1] else None
    )
    for n, runs in rows:
        d, p = runs.get("driver"), runs.get("partitioned")
        ds = d.steady(batches) if d else None
        ps = p.steady(batches) if p else None
        ratio = ps / ds if ps and ds else None
        print(f"{sci(n):>8} {cell(ds, '.2f'):>9} {cell(ps, '.2f'):>8} {cell(ratio, '.2f'):>12}x "
              f"{cell(d.steady_memory(batches) if d else None, '.0f'):>10} "
              f"{cell(p.steady_memory(batches) if p else None, '.0f'):>9}")  # fmt: skip
    for n, runs in rows[1:]:
        ps = runs["partitioned"].steady(batches) if "partitioned" in runs else None
        if ps and first:
            print(f"partitioned at {sci(n)} against {sci(rows[0][0])}: {ps / first:.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
