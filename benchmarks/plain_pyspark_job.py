"""A plain PySpark job over the demo's orders: the yardstick of a cold ``pipeline run``.

What a user would write without tickwheel, as one program with its own JVM:
read the JSON Lines, drop duplicate event ids, aggregate per order (when it
was created, when paid, when cancelled, how many events), write Parquet.
No Python runs on the workers; the session has Spark's defaults but the
master (``local[2]``, as the CLI's) and the log level.

    python benchmarks/plain_pyspark_job.py --input ORDERS_DIR --output OUT_DIR

``bench_pipeline_cold.py`` times it against ``tickwheel pipeline run`` over
the same files, each a fresh process, alternating.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="a directory of JSON Lines files")
    parser.add_argument("--output", required=True, help="the Parquet output directory")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.master(args.master).appName("plain-pyspark-job").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    up = time.perf_counter()
    events = spark.read.json(args.input).dropDuplicates(["event_id"])
    per_order = events.groupBy("order_id").agg(
        F.min(F.when(F.col("type") == "created", F.col("ts"))).alias("created_at"),
        F.min(F.when(F.col("type") == "paid", F.col("ts"))).alias("paid_at"),
        F.min(F.when(F.col("type") == "cancelled", F.col("ts"))).alias("cancelled_at"),
        F.count(F.lit(1)).alias("events"),
    )
    per_order.write.mode("overwrite").parquet(args.output)
    done = time.perf_counter()
    spark.stop()
    print(f"plain job: Spark up in {up - started:.1f} s, job {done - up:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
