"""The micro-batch after a peak: a stream's steady micro-batches before and after one of
``--peak`` records, in one process, from the command line.

``bench_stream_steady.py``'s workload (a load leaving N orders pending, then files of
``--records`` records, a quarter of them payments of pending orders), with one more file
of ``--peak`` new orders after the first ``--batches`` steady files, 1 ms apart from the
last one's time on (the later files' times moved on by as much, so none is late), or with
``--one-ms`` all at that time (so that they all stay in the next micro-batch's dedup
window); then ``--batches`` steady files again. One
``tickwheel pipeline stream --max-files-per-trigger 1`` runs them all, so the micro-batch
after the peak is not the process's first after a load: its warm-up is over.

Reported, from the stream's progress lines (seconds): the steady micro-batch before
the peak (the median of micro-batches 2 to ``--batches``), the peak, the first after it,
and the steady one after it (the median of the rest); the first after the peak against
each steady median. The pending count at the end is checked against the generated one.

    .venv/bin/python benchmarks/bench_stream_peak.py --pending 1e6 --peak 1e6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from _cli_comparison import _tickwheel_command
from bench_stream_steady import (
    BASE_MS,
    CHUNK,
    steady_rules,
    stream_batches,
    stream_pending,
    write_workload,
)

PEAK_LINE = '{{"event_id":"k{0:010d}","order_id":"k{0:010d}","type":"created","ts":{1},"seq":0}}\n'


def write_peak(
    inp: Path, after_file: int, records: int, first_ms: int, one_ms: bool = False
) -> None:
    """``records`` new orders 1 ms apart from ``first_ms`` (or all at ``first_ms - 1``, the
    last steady file's time, with ``one_ms``), in a file that sorts right after file
    ``after_file``; the events of every later file moved on by as much; every file's
    modification time then set again in name order."""
    path = inp / f"part-{after_file:05d}p.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, records, CHUNK):
            stop = min(records, start + CHUNK)
            out.write("".join(
                PEAK_LINE.format(i, first_ms - 1 if one_ms else first_ms + i)
                for i in range(start, stop)
            ))  # fmt: skip
    files = sorted(inp.glob("part-*.jsonl"))
    shift = 0 if one_ms else records
    for later in files[files.index(path) + 1 :] if shift else ():
        events = [json.loads(line) for line in later.read_text(encoding="utf-8").splitlines()]
        for event in events:
            event["ts"] += shift
        lines = (json.dumps(event, separators=(",", ":")) + "\n" for event in events)
        later.write_text("".join(lines), encoding="utf-8")
    for i, file in enumerate(files):
        os.utime(file, (1_700_000_000 + i, 1_700_000_000 + i))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=float, default=1e6, help="orders the load leaves")
    parser.add_argument("--peak", type=float, default=1e6, help="records of the peak file")
    parser.add_argument("--batches", type=int, default=5, help="steady files before and after")
    parser.add_argument("--records", type=int, default=1_000, help="records per steady file")
    parser.add_argument("--timeout", type=float, default=3600.0, help="the stream, at most (s)")
    parser.add_argument(
        "--one-ms",
        action="store_true",
        help="the peak's records all at the last steady file's time: with no lateness, all "
        "of them stay in the next micro-batch's dedup window",
    )
    args = parser.parse_args(argv)
    pending, peak = int(args.pending), int(args.peak)
    if pending < 1 or peak < 1 or args.batches < 3 or args.records < 4:
        parser.error("--pending and --peak >= 1, --batches >= 3, --records >= 4")
    with tempfile.TemporaryDirectory(prefix="bench-peak-") as tmp:
        work = Path(tmp)
        rules = steady_rules(work / "rules.toml")
        workload = write_workload(work / "in", pending, 2 * args.batches, args.records)
        after_before_ms = BASE_MS + pending + args.batches * args.records
        write_peak(workload.input, args.batches, peak, after_before_ms, args.one_ms)
        command = [*_tickwheel_command(), "pipeline", "stream", "--rules", str(rules),
                   "--input", str(workload.input), "--output", str(work / "out"),
                   "--checkpoint", str(work / "ck"), "--max-files-per-trigger", "1"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"the stream failed:\n{done.stderr[-3000:]}")
        seconds = [b.seconds for b in stream_batches(done.stdout + done.stderr, {})]
        expected = 2 * args.batches + 2  # the load, the steady files, the peak
        if len(seconds) != expected:
            raise SystemExit(f"{len(seconds)} micro-batches, not {expected}")
        found, generated = stream_pending(work / "ck"), workload.pending + peak
        if found != generated:
            raise SystemExit(f"{found:,} pending at the end, not {generated:,}")
    k = args.batches
    before = statistics.median(seconds[2 : k + 1])
    peak_s, after = seconds[k + 1], seconds[k + 2]
    steady_after = statistics.median(seconds[k + 3 :])
    print(f"{pending:,} pending, a peak of {peak:,} records, steady files of {args.records:,}; "
          f"micro-batches (s): {' '.join(f'{s:.1f}' for s in seconds)}")  # fmt: skip
    print(f"steady before the peak {before:.2f} s; the peak {peak_s:.1f} s; the first after "
          f"it {after:.2f} s; steady after it {steady_after:.2f} s")  # fmt: skip
    print(f"the first after the peak against the steady one after it: {after / steady_after:.2f}x; "
          f"against the one before it: {after / before:.2f}x (target <= 2x)")  # fmt: skip
    print(f"checked: {found:,} pending at the end, as generated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
