"""tickwheel's delayed operations from a plain PySpark program: a batch and a stream.

    python examples/spark_library.py [WORK_DIR]
    SPARK_REMOTE=sc://HOST:PORT python examples/spark_library.py   # on Spark Connect

1. An in-memory DataFrame of order events (a ``value`` column of JSON, as
   Spark's text and Kafka sources give) through ``delayed_operations``: which
   orders were not paid within 30 minutes.
2. A directory that files keep arriving in, read with Spark's own
   ``readStream.text``, through ``start_stream``: the same step per
   micro-batch, committed exactly once to Parquet.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from tickwheel.pipeline import delayed_operations, parse_rules, read_stream_outputs, start_stream
from tickwheel.pipeline.sinks import ParquetSink

RULES = parse_rules(
    {
        "input": {"key": "order_id", "type": "type", "time": "ts", "id": "event_id"},
        "rules": {"payment": {"open": ["created"], "complete": ["paid"], "timeout": "30m"}},
    }
)
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
MINUTE = 60_000


def event(event_id: str, order: str, kind: str, minute: int) -> str:
    return json.dumps({"event_id": event_id, "order_id": order, "type": kind,
                       "ts": T0 + minute * MINUTE})  # fmt: skip


BATCH = [
    event("e1", "o1", "created", 0),
    event("e2", "o1", "paid", 10),  # paid in time
    event("e3", "o2", "created", 5),  # never paid: expires at minute 35
    event("e4", "o3", "paid", 50),  # a payment without an order
    event("e5", "o4", "created", 90),  # moves the watermark past o2's deadline
    "not json",  # rejected, with its raw text
]


def batch(spark: SparkSession) -> None:
    records = spark.createDataFrame([(line,) for line in BATCH], "value string")
    with delayed_operations(records, RULES, partitions=2) as ops:
        print("batch outcomes:")
        ops.outcomes.select("key", "outcome", "latency_ms").orderBy("key").show()
        print(
            "batch unmatched:", [tuple(r) for r in ops.unmatched.select("key", "reason").collect()]
        )
        print("batch rejected:", [tuple(r) for r in ops.rejected.select("reason", "raw").collect()])
        print("batch counts:", ops.summary()["counts"]["outcomes"])


def stream(spark: SparkSession, work: Path) -> None:
    inbox = work / "inbox"
    inbox.mkdir(parents=True)
    for i, chunk in enumerate((BATCH[:3], BATCH[3:5])):  # two files: two micro-batches
        path = inbox / f"part-{i}.jsonl"
        path.write_text("\n".join(chunk) + "\n", encoding="utf-8")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    records = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inbox))
    query = start_stream(records, RULES, output=str(work / "out"),
                         checkpoint=str(work / "ck"), trigger="available-now")  # fmt: skip
    if not query.awaitTermination(300):
        query.stop()
        raise SystemExit("the stream did not finish within 300 s")
    outputs = read_stream_outputs(spark, checkpoint=str(work / "ck"))  # its commits name the sink
    sink = ParquetSink(str(work / "out"))
    outcomes = outputs["outcomes"]
    assert outcomes is not None
    print("stream batches committed:", sink.committed_batches())
    print("stream outcomes:", sorted(tuple(r) for r in outcomes.select("key", "outcome").collect()))


def main() -> int:
    # tickwheel's step runs Python in Spark's workers, so they need tickwheel, as any
    # PySpark library with Python functions does: here, this interpreter (Spark's
    # default is the ``python3`` on the PATH); on a cluster, the executors' environment.
    # With SPARK_REMOTE set (sc://host:port, or local[2] for a server of its own),
    # PySpark's builder makes a Spark Connect session: the same calls run on it.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("tickwheel-example")
    if "SPARK_REMOTE" not in os.environ:
        builder = builder.master("local[2]")
    spark = builder.getOrCreate()
    print("session:", type(spark).__module__)
    try:
        batch(spark)
        with tempfile.TemporaryDirectory() as tmp:
            stream(spark, Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
