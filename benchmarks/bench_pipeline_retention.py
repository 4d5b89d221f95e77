"""The stream's carried ``ops`` state per increment, with a short retention and with none.

The same generated orders (constant rate: one order a second on average, a
2-minute timeout, 3 minutes of allowed lateness) are fed as K increments, one
micro-batch each, to ``tickwheel pipeline stream`` twice in one SparkSession
(``local[2]``): once with ``[input].retention`` set (default ``5m``) and once
with ``retention = "off"``. After each committed micro-batch it counts the
rows of the state's ``ops/`` (pending operations and expiry markers) and
prints one line per increment: watermark, ops rows with the retention, ops
rows without it, and the bound of docs/scaling.md (the operations opened
within timeout + retention before the watermark). Each run's outputs are
checked equal to the reference's (``tests/support/reference.py``) under
its rules. Counts, not timings: they do not depend on the machine's load.

Run: ``.venv/bin/python benchmarks/bench_pipeline_retention.py`` (defaults:
5,000 orders as 30 increments, retention 5m; the generator's 31st file, its
long-delayed tail, is left out).
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import _support  # noqa: F401 - puts tests/ on the path: the reference of the semantics
from _stream_inputs import feed

ROOT = Path(__file__).resolve().parents[1]

TIMEOUT = "2m"


def _rules(path: Path, retention: str) -> Path:
    text = (ROOT / "examples" / "orders.toml").read_text(encoding="utf-8")
    text = text.replace(
        'allowed_lateness = "0"', f'allowed_lateness = "3m"\nretention = "{retention}"'
    ).replace('timeout = "30m"', f'timeout = "{TIMEOUT}"')
    path.write_text(text, encoding="utf-8")
    return path


def _run(spark: Any, rules: Path, inp: Path, work: Path, partitions: int) -> Any:
    """One stream over ``inp``: (watermark, ops rows) per committed batch, and the outputs."""
    from support.state_rows import record_ops_rows
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
    from tickwheel.pipeline.stream.start import read_stream_outputs

    cfg = StreamConfig(
        rules_path=str(rules),
        input=str(inp),
        output=str(work / "out"),
        checkpoint=str(work / "ck"),
        trigger="available-now",
        max_files_per_trigger=1,
        partitions=partitions,
    )
    seen: list[tuple[int, int]] = []
    with FileStreamJob(cfg, spark=spark) as job:
        record_ops_rows(job, seen)
        job.run()
        assert job.sink is not None
        outs = read_stream_outputs(spark, job.sink, str(work / "ck"))
    return seen, outs


def _check(outs: Any, ref: Any) -> None:
    """The stream's outcomes and unmatched rows equal the reference's."""
    for table, cols, expected in (
        (
            "outcomes",
            ["op_id", "outcome", "resolved_at"],
            [(r[2], r[5], r[6]) for r in ref.outcomes],
        ),
        ("unmatched", ["event_id", "reason"], [(r[2], r[5]) for r in ref.unmatched]),
    ):
        got = sorted(tuple(row[c] for c in cols) for row in outs[table].collect())
        if got != sorted(expected, key=lambda r: tuple((v is not None, v) for v in r)):
            raise SystemExit(f"{table}: the stream's rows differ from the reference's")


def main(argv: list[str] | None = None) -> int:
    """Run both streams and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--increments", type=int, default=30)
    parser.add_argument("--retention", default="5m")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules, parse_duration
    from tickwheel.pipeline.spark.session import STREAM_SESSION_CONF, create_session

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-retention-"))
    gen = work / "gen"
    timeout_ms = parse_duration(TIMEOUT)
    # One file more than fed: the generator's last file holds the long-delayed
    # payments of its last orders, a jump of the watermark, not a constant rate.
    generate_orders(
        args.orders,
        gen,
        seed=28,
        files=args.increments + 1,
        timeout_ms=timeout_ms,
        mean_gap_ms=1000,
    )
    files = sorted(gen.glob("part-*.jsonl"))[: args.increments]
    lines = [line for file in files for line in iter_input_lines(file)]
    spark = create_session("local[2]", shuffle_partitions=args.partitions, conf=STREAM_SESSION_CONF)
    print(f"python {sys.version.split()[0]}, spark {spark.version}, local[2], work {work}")
    runs: dict[str, list[tuple[int, int]]] = {}
    retention_ms = None
    for retention in (args.retention, "off"):
        rules_path = _rules(work / f"rules-{retention}.toml", retention)
        rules = load_rules(rules_path)
        ref = run_reference(lines, rules)
        if retention == args.retention:
            retention_ms = rules.input.retention_ms
            opens = sorted(row[3] for row in ref.outcomes)
        feed(files, work / f"in-{retention}")
        seen, outs = _run(
            spark, rules_path, work / f"in-{retention}", work / retention, args.partitions
        )
        _check(outs, ref)
        runs[retention] = seen
    spark.stop()
    window = timeout_ms + (retention_ms or 0)
    print(f"\nops state rows per increment ({args.orders:,} orders, timeout {TIMEOUT}):")
    print(f"| increment | watermark | retention {args.retention} | retention off | bound |")
    print("|---:|---:|---:|---:|---:|")
    for i, ((watermark, rows), (_, rows_off)) in enumerate(
        zip(runs[args.retention], runs["off"], strict=True)
    ):
        bound = bisect.bisect_right(opens, watermark) - bisect.bisect_right(
            opens, watermark - window
        )
        print(f"| {i} | {watermark} | {rows} | {rows_off} | {bound} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
