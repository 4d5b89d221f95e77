"""A Spark user's streaming job over the Kafka-like topic: ``python kafka_like_job.py ...``.

What a data engineer writes (``spark.readStream.format(...)`` →
:func:`tickwheel.pipeline.start_stream`), run as its own process so that the
kill tests can SIGKILL its driver (``TICKWHEEL_FAULT``) and start it again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package


def main() -> int:
    from support import kafka_like
    from tickwheel.pipeline import start_stream
    from tickwheel.pipeline.spark.class_archive import find
    from tickwheel.pipeline.spark.session import create_session, set_log_level

    parser = argparse.ArgumentParser()
    for name in ("--topic", "--rules", "--output", "--checkpoint"):
        parser.add_argument(name, required=True)
    parser.add_argument("--max-records-per-trigger", type=int, default=0)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--remote", help="a Spark Connect URL, as SparkSession.builder.remote")
    args = parser.parse_args()
    # The class archive, when `make test` recorded one: each run starts a JVM of its own.
    spark = create_session("local[2]", app_name="kafka-like-job", remote=args.remote,
                           class_archive=find())  # fmt: skip
    set_log_level(spark, "ERROR")
    kafka_like.register(spark)
    records = (
        spark.readStream.format(kafka_like.NAME)
        .option("path", args.topic)
        .option("maxRecordsPerTrigger", str(args.max_records_per_trigger))
        .load()
    )
    query = start_stream(
        records, args.rules, output=args.output, checkpoint=args.checkpoint,
        trigger="available-now", partitions=args.partitions,
    )  # fmt: skip
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
