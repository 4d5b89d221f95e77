"""Where a state that outgrows the driver lives: the partitioned provider as built, and the
design it was chosen over, measured side by side on the same touches (issue 63; the
figures are in ``docs/benchmarks.md``, "A state beyond the driver", and the choice in
``docs/pipeline-design.md``, "Carried state").

The workload: N pending operations (one key each, a 30-day deadline), then
micro-batches of ``--records`` records, half of them payments of random pending keys
(each removes its key's operation) and half new keys (each adds one). Nothing falls due.
Each way is timed per micro-batch, the median of the micro-batches after the first:

- ``embedded``: design (a), as built: the stream's partitioned provider
  (:class:`~tickwheel.pipeline.stream.state.partitioned.PartitionedOps`). The N
  operations are made by Spark and loaded into one RocksDB store per key
  partition (as many as Spark's default parallelism) on the executors; each
  micro-batch takes the touched rows (one Spark job over the anchor, whose tasks
  apply the last commit's changes first), puts back the kept and new ones and
  commits them, as a micro-batch of the stream does.
- ``floor``: the same job with nothing to apply or take (a watermark nothing is
  due at, no keys): what any design that visits the partitions on the executors
  once a micro-batch pays.
- ``state store``: design (b). Spark's own state store: a ``transformWithStateInPandas``
  query grouped by key-hash bucket (``--buckets``), a ``MapState`` of the bucket's
  operations read and written per touched key, the RocksDB provider with changelog
  checkpointing and as many shuffle partitions as the cluster has cores, as Spark's
  documentation advises. Timed by Spark's own ``triggerExecution``.
- ``driver index``: the driver provider on the same touches, in this process: the
  touched operations taken out of an :class:`~tickwheel.pipeline.stream.state.ops_index.OpsIndex`
  of N rows and the kept and new ones added back.

``--cluster`` runs on a throw-away standalone cluster of two workers, one core each
(``tests/support/standalone_cluster.py``; needs root for its namespaces), else on
``local[2]``. Each size checks its outcome counts (every payment found once). Run:
``.venv/bin/python benchmarks/bench_partitioned_state.py --cluster --pending 1e4 1e6``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

DAY_MS = 86_400_000
T0 = 1_700_000_000_000
DEADLINE = T0 + 30 * DAY_MS


@dataclass
class Batch:
    """One micro-batch's touches: keys paid, keys added, and its watermark."""

    pays: list[str]
    news: list[str]
    watermark: int


def workload(pending: int, batches: int, records: int, seed: int = 1) -> list[Batch]:
    """The micro-batches after a load of ``pending`` keys ``o0`` ... (payments of distinct
    random pending keys, and new keys)."""
    rng = random.Random(seed)
    half = records // 2
    paid = rng.sample(range(pending), min(pending, half * batches))
    out = []
    for b in range(batches):
        pays = [f"o{i}" for i in paid[b * half : (b + 1) * half]]
        news = [f"n{b}_{j}" for j in range(records - len(pays))]
        out.append(Batch(pays, news, T0 + (b + 1) * 60_000))
    return out


# -- (a) the partitioned provider: an embedded store per partition, on the executors -----


def _ops_rows(keys: list[str], deadlines: Any) -> Any:
    """Pending operations of the rule ``payment``, one per key (Arrow)."""
    import numpy as np
    import pyarrow as pa

    from tickwheel.pipeline.stream.state.ops_index import ops_schema

    n = len(keys)
    return pa.table(
        [pa.array(["pending"] * n), pa.array(["payment"] * n), pa.array(keys),
         pa.array(keys), pa.array(np.full(n, T0, np.int64)), pa.array(deadlines, pa.int64())],
        schema=ops_schema(),
    )  # fmt: skip


def _load_frame(spark: Any, pending: int) -> Any:
    """The N pending operations as a frame Spark makes on the executors (none of it in
    the driver): keys ``o0`` ..., deadlines 30 days on."""
    from pyspark.sql import functions as F

    ids = spark.range(pending)
    key = F.concat(F.lit("o"), F.col("id").cast("string"))
    return ids.select(
        F.lit("pending").alias("kind"), F.lit("payment").alias("rule"), key.alias("key"),
        key.alias("event_id"), F.lit(T0).cast("bigint").alias("time"),
        (F.lit(DEADLINE) + F.col("id")).cast("bigint").alias("deadline"),
    )  # fmt: skip


def _restore_nothing(tag: str) -> Any:
    raise SystemExit(f"the provider missed its stores at {tag}: no checkpoint in this benchmark")


def run_provider(spark: Any, pending: int, batches: list[Batch]) -> dict[str, Any]:
    """Design (a) as built (:class:`~tickwheel.pipeline.stream.state.partitioned.PartitionedOps`):
    per micro-batch, the touched rows taken (one job), the kept and new ones put back,
    committed; and the floor of one job over the same anchor."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tickwheel.pipeline.stream.state.partitioned import PartitionedOps

    started = time.perf_counter()
    provider = PartitionedOps.load(
        spark, _load_frame(spark, pending), "0:load", ["payment"], None, _restore_nothing,
        "bench",
    )  # fmt: skip
    load_s = time.perf_counter() - started
    if provider.rows != pending:
        raise SystemExit(f"provider: loaded {provider.rows} rows, not {pending}")
    steady, floors, local = [], [], []
    for batch_id, batch in enumerate(batches, start=1):
        started = time.perf_counter()
        touched = pa.array(batch.pays + batch.news, pa.string())
        taken = provider.take_touched({"payment": touched}, batch.watermark)
        if taken.num_rows != len(batch.pays):
            raise SystemExit(f"provider: batch {batch_id} took {taken.num_rows} rows")
        kept = taken.filter(pc.invert(pc.is_in(taken["key"], pa.array(batch.pays))))
        made = pa.concat_tables([kept, _ops_rows(batch.news, [DEADLINE] * len(batch.news))])
        provider.put_back(made, taken, f"{batch_id}:a")
        provider.committed()
        steady.append(time.perf_counter() - started)
        local.append(provider.local_share)
        started = time.perf_counter()
        provider.take_touched({}, T0)  # the same job, with nothing to apply or take
        floors.append(time.perf_counter() - started)
    expected = pending + sum(len(b.news) - len(b.pays) for b in batches)
    if provider.rows != expected:
        raise SystemExit(f"provider: {provider.rows} rows at the end, not {expected}")
    partitions = provider.partitions
    provider.release()
    return {"load": load_s, "steady": steady, "floor": floors, "partitions": partitions,
            "local": min(x for x in local if x is not None)}  # fmt: skip


# -- the driver provider, on the same touches -------------------------------------------


def run_driver_index(pending: int, batches: list[Batch]) -> list[float]:
    """Seconds a micro-batch the driver's index takes: touched rows out, kept and new in."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from tickwheel.pipeline.stream.state.ops_index import OpsIndex

    keys = [f"o{i}" for i in range(pending)]
    index = OpsIndex(["payment"], None, _ops_rows(keys, DEADLINE + np.arange(pending)))
    del keys
    times = []
    for batch in batches:
        started = time.perf_counter()
        touched = pa.array(batch.pays + batch.news, pa.string())
        taken = index.take_touched({"payment": touched}, batch.watermark)
        if taken.num_rows != len(batch.pays):
            raise SystemExit(f"driver index: took {taken.num_rows} rows")
        kept = taken.filter(pc.invert(pc.is_in(taken["key"], pa.array(batch.pays))))
        index.add(pa.concat_tables([kept, _ops_rows(batch.news, [DEADLINE] * len(batch.news))]))
        times.append(time.perf_counter() - started)
    return times


# -- (b) Spark's own state store --------------------------------------------------------


def run_state_store(
    spark: Any, pending: int, batches: list[Batch], buckets: int, work: Path, timeout: float
) -> dict[str, Any]:
    """Design (b): the load and the micro-batches as files of a stream, through
    ``transformWithStateInPandas`` grouped by bucket; Spark's triggerExecution each."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class PendingByBucket(StatefulProcessor):  # type: ignore[misc]
        """A bucket's pending operations as a MapState by key; a payment removes one."""

        def init(self, handle: StatefulProcessorHandle) -> None:
            self.ops = handle.getMapState(
                "ops", StructType([StructField("key", StringType())]),
                StructType([StructField("deadline", LongType())]),
            )  # fmt: skip

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            completed = 0
            for frame in rows:
                for k, kind, deadline in zip(frame["key"], frame["kind"], frame["deadline"],
                                             strict=True):  # fmt: skip
                    if kind != "pay":
                        self.ops.updateValue((k,), (int(deadline),))
                    elif self.ops.containsKey((k,)):
                        self.ops.removeKey((k,))
                        completed += 1
            yield pd.DataFrame({"bucket": [int(key[0])], "completed": [completed]})

        def close(self) -> None:
            pass

    source = work / "in"
    source.mkdir(parents=True)

    def write(number: int, records: Iterator[dict[str, Any]]) -> None:
        path = source / f"part-{number:05d}.json"
        with path.open("w", encoding="utf-8") as out:
            out.writelines(json.dumps(record) + "\n" for record in records)
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))

    write(0, ({"key": f"o{i}", "kind": "new", "deadline": DEADLINE + i} for i in range(pending)))
    for number, batch in enumerate(batches, start=1):
        pays = ({"key": k, "kind": "pay", "deadline": None} for k in batch.pays)
        news = ({"key": k, "kind": "new", "deadline": DEADLINE} for k in batch.news)
        write(number, (*pays, *news))
    schema = "key string, kind string, deadline long"
    frame = (
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(source))
        .withColumn("bucket", F.pmod(F.xxhash64("key"), F.lit(buckets)))
    )  # fmt: skip
    stream = frame.groupBy("bucket").transformWithStateInPandas(
        statefulProcessor=PendingByBucket(), outputStructType="bucket long, completed long",
        outputMode="Append", timeMode="None",
    )  # fmt: skip
    completed: list[int] = []

    def sink(outputs: Any, _batch_id: int) -> None:
        completed.append(sum(row["completed"] for row in outputs.collect()))

    query = (
        stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(work / "ck"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    finished = query.awaitTermination(timeout)
    if not finished:
        query.stop()
    seconds = [p.durationMs["triggerExecution"] / 1000 for p in query.recentProgress
               if p.numInputRows]  # fmt: skip
    if finished and completed[1:] != [len(b.pays) for b in batches]:
        raise SystemExit(f"state store: completed {completed}")
    return {"finished": finished, "load": seconds[0] if seconds else None,
            "steady": seconds[1:]}  # fmt: skip


# -- the run ------------------------------------------------------------------------------


def _session(stack: contextlib.ExitStack, cluster: bool) -> tuple[Any, Path]:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName("bench-partitioned-state")
    if cluster:
        from support.standalone_cluster import StandaloneCluster, shared_directory

        base = stack.enter_context(shared_directory())
        env = {"PYSPARK_PYTHON": sys.executable}
        running = stack.enter_context(StandaloneCluster(base, env=env))
        for key, value in running.driver_conf().items():
            builder = builder.config(key, value)
        builder = builder.master(running.master_url)
    else:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        base = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        builder = builder.master("local[2]")
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")  # the cluster's cores
        .config("spark.sql.streaming.stateStore.providerClass",
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .getOrCreate()
    )  # fmt: skip
    stack.callback(spark.stop)
    return spark, base


def _median(values: list[float]) -> float | None:
    """The median of the micro-batches after the first (the first warms up)."""
    steady = values[1:] or values
    return statistics.median(steady) if steady else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=float, nargs="+", default=[1e4, 1e6])
    parser.add_argument("--buckets", type=int, default=64, help="design (b)'s key buckets")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--records", type=int, default=1_000)
    parser.add_argument("--cluster", action="store_true", help="a standalone cluster of two")
    parser.add_argument("--designs", nargs="+", default=["embedded", "state-store"],
                        choices=["embedded", "state-store"])  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="design (b)'s query at one size, at most (s)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.buckets < 1 or args.batches < 2 or args.records < 2:
        parser.error("--buckets >= 1, --batches >= 2, --records >= 2")
    where = "a standalone cluster of 2 workers, 1 core each" if args.cluster else "local[2]"
    print(f"micro-batches of {args.records:,} records (half payments of pending keys) on "
          f"{where}; medians of micro-batches 2 to {args.batches}, seconds")  # fmt: skip
    with contextlib.ExitStack() as stack:
        spark, base = _session(stack, args.cluster)
        rows = []
        for pending in [int(n) for n in args.pending]:
            batches = workload(pending, args.batches, args.records)
            row: dict[str, Any] = {"pending": pending}
            row["driver index"] = _median(run_driver_index(pending, batches))
            if "embedded" in args.designs:
                embedded = run_provider(spark, pending, batches)
                row["embedded"] = _median(embedded["steady"])
                row["floor"] = _median(embedded["floor"])
                row["embedded load"] = embedded["load"]
                row["held"] = f"{embedded['local']:.0%} of {embedded['partitions']}"
            if "state-store" in args.designs:
                work = base / f"state-store-{pending}"
                store = run_state_store(spark, pending, batches, args.buckets, work, args.timeout)
                row["state store"] = _median(store["steady"]) if store["finished"] else None
                row["state store load"] = store["load"]
            rows.append(row)
            print(_line(row), flush=True)
        _ratios(rows)


def _line(row: dict[str, Any]) -> str:
    def s(value: Any) -> str:
        return "not finished" if value is None else f"{value:.3f}"

    parts = [f"pending {row['pending']:,}", f"driver index {s(row['driver index'])}"]
    if "embedded" in row:
        parts += [f"embedded {s(row['embedded'])} (load {row['embedded load']:.1f}, "
                  f"partitions found local, least {row['held']})",
                  f"floor {s(row['floor'])}"]  # fmt: skip
    if "state store" in row:
        load = row["state store load"]
        parts.append(f"state store {s(row['state store'])} (load "
                     f"{'n/a' if load is None else f'{load:.1f}'})")  # fmt: skip
    return "; ".join(parts)


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Each design at each size against its first size, and against the floor."""
    first = rows[0]
    for name in ("embedded", "state store"):
        for row in rows[1:]:
            if row.get(name) and first.get(name):
                print(f"{name}: {row['pending']:,} against {first['pending']:,} pending: "
                      f"{row[name] / first[name]:.2f}x")  # fmt: skip
        for row in rows:
            if row.get(name) and row.get("floor"):
                print(f"{name} against the floor at {row['pending']:,}: "
                      f"{row[name] / row['floor']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
