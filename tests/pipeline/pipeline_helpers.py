"""Shared helpers of the pipeline tests: test data, reading outputs back, Spark's counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.reference import _sort_key
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.spark.outputs import (
    BUFFERED_COLUMNS,
    OUTCOME_COLUMNS,
    REJECTED_COLUMNS,
    UNMATCHED_COLUMNS,
)

COLUMNS = {
    "outcomes": OUTCOME_COLUMNS,
    "unmatched": UNMATCHED_COLUMNS,
    "rejected": REJECTED_COLUMNS,
    "buffered": BUFFERED_COLUMNS,
}

RULES_TOML = """
[input]
key = "order_id"
type = "type"
time = "ts"
id = "event_id"
sequence = "seq"
allowed_lateness = "10m"

[rules.payment]
open = ["created"]
complete = ["paid"]
cancel = ["cancelled"]
timeout = "30m"
"""

# Hand-written records with every edge case, on top of the generated ones.
EDGE_LINES = [
    # malformed lines and bad fields
    '{"event_id":"bad1","order_id":"z1","type":"paid","ts":1704067200000',
    "[1, 2, 3]",
    "just text",
    '{"order_id":"z1","type":"paid","ts":1704067200000}',
    '{"event_id":"bad2","order_id":"z1","ts":1704067200000}',
    '{"event_id":"bad3","order_id":"z1","type":"paid"}',
    '{"event_id":"bad4","type":"created","ts":1704067200000}',
    '{"event_id":"bad5","order_id":"","type":"paid","ts":1704067200000}',
    '{"event_id":"bad6","order_id":"z1","type":"paid","ts":"2024-01-01T10:00:00"}',
    '{"event_id":"bad7","order_id":"z1","type":"paid","ts":"2024-13-01T10:00:00Z"}',
    '{"event_id":"bad8","order_id":"z1","type":"paid","ts":-5}',
    '{"event_id":"bad9","order_id":"z1","type":"paid","ts":1704067200000,"seq":"x"}',
    '{"event_id":"bad10","order_id":"z1","type":"paid","ts":1.5}',
    "",
    "   ",
    # an event of a type no rule uses: counted, ignored (no key needed)
    '{"event_id":"ign1","type":"viewed","ts":1704067201000}',
    # ISO-8601 times with offsets, and trailing text after the object
    '{"event_id":"iso1","order_id":"z2","type":"created","ts":"2024-01-01T01:00:00.5+01:00"}',
    '{"event_id":"iso2","order_id":"z2","type":"paid","ts":"2024-01-01T00:29:59.999Z"} trailing',
    # a conflict: same id, other content; the smallest (time, seq, raw) is kept
    '{"event_id":"cf1","order_id":"z3","type":"created","ts":1704067300000,"seq":0}',
    '{"event_id":"cf1","order_id":"z3","type":"created","ts":1704067300000,"seq":3}',
    '{"event_id":"cf1","order_id":"z3","type":"cancelled","ts":1704067300000,"seq":0}',
    '{"event_id":"cf1","order_id":"z3","type":"created","ts":1704067300000,"seq":0}',
    # same millisecond, sequence decides; then a tie on everything but the id
    '{"event_id":"t2","order_id":"z4","type":"paid","ts":1704067400000,"seq":0}',
    '{"event_id":"t1","order_id":"z4","type":"created","ts":1704067400000,"seq":0}',
]


def make_input(root: Path, orders: int = 1500, seed: int = 7, files: int = 4) -> Path:
    """Generated orders plus the edge-case file, in ``root``."""
    generate_orders(orders, root, seed=seed, files=files, mean_gap_ms=3_000)
    (root / "part-edge.jsonl").write_text("\n".join(EDGE_LINES) + "\n", encoding="utf-8")
    return root


def merge_into_one_file(src: Path, dst: Path) -> Path:
    """The same records as ``src`` in one file (order of lines reversed, for good measure)."""
    dst.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for path in sorted(src.glob("*.jsonl")):
        lines.extend(path.read_text(encoding="utf-8").splitlines())
    (dst / "all.jsonl").write_text("\n".join(reversed(lines)) + "\n", encoding="utf-8")
    return dst


def read_outputs(out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every Parquet output of a run as sorted lists of tuples."""
    import pyarrow.parquet as pq

    result = {}
    for name, cols in COLUMNS.items():
        table = pq.read_table(out / name).to_pydict()
        result[name] = sorted(zip(*[table[c] for c in cols], strict=True), key=_sort_key)
    return result


def spark_compilations(spark: Any) -> int:
    """How many classes Spark has compiled from generated code in this JVM so far."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())
