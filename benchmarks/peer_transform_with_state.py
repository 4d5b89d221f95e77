"""A Spark user's program for the orders rule: ``transformWithStateInPandas``, one process.

What a data engineer would write on Spark 4 for "an order not paid within the
timeout": the JSON files as a stream, a watermark of the rules' allowed
lateness, copies of an event id dropped within it, and a StatefulProcessor per
order key with an event-time timer at its deadline (``_stream_peers.py``:
the same processor the in-process benchmark checks against tickwheel). The
session is set up as Spark's documentation advises: RocksDB state store with
changelog checkpointing, shuffle partitions matching the cores. Outcomes go to
Parquet under ``--output``.

    python benchmarks/peer_transform_with_state.py --input DIR --output OUT \\
        --checkpoint CK --triggers 10 [--rules RULES] [--api transformWithState]

``--api floor`` runs the floor instead: the same files through the same source
into a ``foreachBatch`` that writes each micro-batch as one Parquet file
(``_stream_peers.floor_query``), the least such a program costs on Spark.

``--triggers K`` reads the input's files in K micro-batches (``maxFilesPerTrigger``
= files / K), in modification-time order. The rules' ``allowed_lateness`` is the
watermark's delay: with ``examples/orders.toml``'s ``0``, Spark drops every event
that arrives after a later-stamped one, so give it the lateness the data needs
(``bench_pipeline_incremental.py --cli`` passes 3 minutes).

``--progress FILE`` appends each micro-batch's progress to FILE as a JSON line
as Spark reports it (``_stream_peers.ProgressLog``: its id, whether it read
input, Spark's ``triggerExecution`` in ms, each stateful operator's rows), so a
run stopped at a timeout leaves those it finished (``bench_stream_steady.py``
reads them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import _stream_peers as peers
from _pipeline_names import load_rules

ROOT = Path(__file__).resolve().parents[1]


def _session(master: str, partitions: int) -> Any:
    """A plain SparkSession, as a user's program starts one, with :data:`peers.PEER_CONF`."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName("peer-transform-with-state")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config("spark.driver.memory", "2g")  # as tickwheel's sessions
    )
    for name, value in peers.PEER_CONF.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    """Run the peer over ``--input`` to the end; print its time and its outcomes' counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="directory of JSON Lines files")
    parser.add_argument("--output", required=True, type=Path, help="outcomes (Parquet)")
    parser.add_argument("--checkpoint", required=True, type=Path, help="the query's checkpoint")
    parser.add_argument("--triggers", type=int, default=10, help="micro-batches for the files")
    parser.add_argument("--rules", type=Path, default=ROOT / "examples" / "orders.toml")
    parser.add_argument(
        "--api", choices=(*peers.PEERS, "floor"), default="transformWithStateInPandas"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2, help="shuffle partitions (cores)")
    parser.add_argument("--progress", type=Path, help="each micro-batch's progress: JSON lines")
    args = parser.parse_args(argv)
    if args.triggers < 1 or args.partitions < 1:
        parser.error("--triggers and --partitions must be >= 1")
    if not args.input.is_dir():
        parser.error(f"--input {args.input}: not a directory")
    missing = peers.missing_dependency([args.api])
    if missing:
        parser.error(missing)
    rules = load_rules(args.rules)
    started = time.perf_counter()
    spark = _session(args.master, args.partitions)
    peers.ship_to_workers()
    per_trigger = peers.files_per_trigger(args.input, args.triggers)
    log = peers.ProgressLog(spark, args.progress)
    if args.api == "floor":
        secs = peers.floor_query(spark, args.input, args.output, args.checkpoint, per_trigger)
        outcomes = ""  # the floor writes its input's rows, not outcomes
    else:
        rule, lateness_ms = rules.rules[0], rules.input.allowed_lateness_ms
        secs = peers.run_peer(spark, args.api, args.input, args.output, args.checkpoint,
                              rule, lateness_ms, per_trigger)  # fmt: skip
        counts = spark.read.parquet(str(args.output)).groupBy("outcome").count().collect()
        outcomes = "; outcomes " + ", ".join(f"{row[0]} {row[1]:,}" for row in sorted(counts))
    batches = [batch["ms"] / 1e3 for batch in log.wait()]
    print(f"{args.api}: {len(batches)} micro-batches in {secs:.1f}s (each "
          + " ".join(f"{s:.1f}" for s in batches)
          + f"), {time.perf_counter() - started:.1f}s with the session{outcomes}")  # fmt: skip
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
