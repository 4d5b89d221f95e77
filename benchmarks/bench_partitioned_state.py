"""Where a state that outgrows the driver could live: two prototypes of a partitioned
provider, measured side by side on the same touches (issue 63's choice; the figures are
in ``docs/benchmarks.md``, "A state beyond the driver", and the choice in
``docs/pipeline-design.md``, "Carried state").

The workload: N pending operations (one key each, a 30-day deadline), then
micro-batches of ``--records`` records, half of them payments of random pending keys
(each removes its key's operation) and half new keys (each adds one). Nothing falls due.
Each way is timed per micro-batch, the median of the micro-batches after the first:

- ``embedded``: design (a). The operations live in one RocksDB store (``rocksdict``)
  per key partition, ``--partitions`` P of them by
  :func:`~tickwheel.pipeline.stream.ops_index.key_hashes`, on the executor that
  loaded it: a key space by key and one by deadline (big-endian, so a scan from the
  start finds what is due). A micro-batch routes its touches in the driver and runs one
  Spark job of P tasks. Each task opens its partition's store, checks the version it
  holds against the one the driver says was committed (the lineage check: a miss
  would restore from the checkpoint; here it is counted), applies the touches in one
  write batch, scans what is due, and returns its changes. Tasks stay on the executor
  of their store because the job zips a cached anchor RDD of P one-element
  partitions, whose blocks Spark prefers to read where they are.
- ``floor``: the same job with tasks that do nothing: what any design that visits the
  partitions on the executors once a micro-batch pays.
- ``state store``: design (b). Spark's own state store: a ``transformWithStateInPandas``
  query grouped by key-hash bucket (``--buckets``), a ``MapState`` of the bucket's
  operations read and written per touched key, the RocksDB provider with changelog
  checkpointing and as many shuffle partitions as the cluster has cores, as Spark's
  documentation advises. Timed by Spark's own ``triggerExecution``.
- ``driver index``: the driver provider on the same touches, in this process: the
  touched operations taken out of an :class:`~tickwheel.pipeline.stream.ops_index.OpsIndex`
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
import socket
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
#: Keys a load task generates and writes at a time (bounds its memory).
LOAD_CHUNK = 200_000


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


def partitions_of(keys: list[str], partitions: int) -> Any:
    """Each key's partition: its 64-bit hash (the driver index's) modulo the partitions."""
    import numpy as np
    import pyarrow as pa

    from tickwheel.pipeline.stream.ops_index import key_hashes

    hashes = key_hashes(np.zeros(len(keys), np.int64), pa.array(keys, pa.string()))
    return (hashes % np.uint64(partitions)).astype(np.int64)


# -- (a) an embedded store per partition, on the executors -----------------------------


def _open_store(partition: int) -> Any:
    """This executor's store of ``partition`` (made when missing), in its own files root."""
    from pyspark import SparkFiles
    from rocksdict import Options, Rdict

    root = Path(SparkFiles.getRootDirectory()) / "tickwheel-state"
    root.mkdir(parents=True, exist_ok=True)
    return Rdict(str(root / f"p{partition}"), Options(raw_mode=True))


def _put(batch: Any, key: bytes, deadline: bytes) -> None:
    batch.put(b"k" + key, deadline)
    batch.put(b"d" + deadline + key, b"")


def _load_task(rows: Iterator[Any]) -> Iterator[tuple[int, str, int]]:
    """Write partition p's share of the N pending keys into its store, as version 0."""
    import numpy as np
    from rocksdict import WriteBatch

    for partition, (pending, partitions) in rows:
        store, count = _open_store(partition), 0
        for start in range(0, pending, LOAD_CHUNK):
            ids = range(start, min(start + LOAD_CHUNK, pending))
            keys = [f"o{i}" for i in ids]
            writes = WriteBatch(raw_mode=True)
            for i in np.flatnonzero(partitions_of(keys, partitions) == partition).tolist():
                _put(writes, keys[i].encode(), (DEADLINE + start + i).to_bytes(8, "big"))
                count += 1
            store.write(writes)
        store[b"meta:version"] = (0).to_bytes(8, "big")
        store.close()
        yield partition, socket.gethostname(), count


def _batch_task(rows: Iterator[Any]) -> Iterator[tuple[int, str, bool, int, int]]:
    """Apply one micro-batch's touches of partition p to its store: (p, host, whether it
    held the committed version, operations removed, operations due)."""
    from rocksdict import WriteBatch

    for partition, (committed, batch_id, pays, news, watermark) in rows:
        store = _open_store(partition)
        version = store.get(b"meta:version")
        held = version is not None and int.from_bytes(version, "big") == committed
        writes, removed = WriteBatch(raw_mode=True), 0
        found = store.get([b"k" + key.encode() for key in pays]) if pays else []
        for key, deadline in zip(pays, found, strict=True):
            if deadline is not None:
                writes.delete(b"k" + key.encode())
                writes.delete(b"d" + deadline + key.encode())
                removed += 1
        for key in news:
            _put(writes, key.encode(), DEADLINE.to_bytes(8, "big"))
        due, scan = 0, store.iter()
        scan.seek(b"d")
        limit = b"d" + watermark.to_bytes(8, "big")
        while scan.valid() and scan.key() < limit:
            due += 1
            scan.next()
        del scan
        writes.put(b"meta:version", batch_id.to_bytes(8, "big"))
        store.write(writes)
        store.close()
        yield partition, socket.gethostname(), held, removed, due


def _nothing(rows: Iterator[Any]) -> Iterator[int]:
    for partition, _payload in rows:
        yield partition


def run_embedded(spark: Any, pending: int, batches: list[Batch], partitions: int) -> dict[str, Any]:
    """Design (a) and the floor of its one job per micro-batch."""
    import numpy as np

    sc = spark.sparkContext
    anchor = sc.parallelize(range(partitions), partitions).cache()

    def job(payloads: list[Any], task: Any) -> list[Any]:
        pairs = anchor.zip(sc.parallelize(payloads, partitions))
        return list(pairs.mapPartitions(task).collect())

    started = time.perf_counter()
    loaded = job([(pending, partitions)] * partitions, _load_task)
    load_s = time.perf_counter() - started
    if sum(count for *_p, count in loaded) != pending:
        raise SystemExit(f"embedded: the load wrote {loaded}, not {pending} keys")
    homes = {partition: host for partition, host, _count in loaded}
    steady, floors, held, moved = [], [], 0, 0
    for batch_id, batch in enumerate(batches, start=1):
        pay_parts = partitions_of(batch.pays, partitions)
        new_parts = partitions_of(batch.news, partitions)
        payloads = [
            (batch_id - 1, batch_id,
             [batch.pays[i] for i in np.flatnonzero(pay_parts == p)],
             [batch.news[i] for i in np.flatnonzero(new_parts == p)], batch.watermark)
            for p in range(partitions)
        ]  # fmt: skip
        started = time.perf_counter()
        out = job(payloads, _batch_task)
        steady.append(time.perf_counter() - started)
        if sum(removed for *_x, removed, _due in out) != len(batch.pays):
            raise SystemExit(f"embedded: batch {batch_id} removed {out}")
        held += sum(1 for _p, _h, was_held, *_r in out if was_held)
        moved += sum(1 for p, host, *_r in out if host != homes[p])
        started = time.perf_counter()
        job(payloads, _nothing)
        floors.append(time.perf_counter() - started)
    anchor.unpersist()
    return {"load": load_s, "steady": steady, "floor": floors,
            "held": held, "tasks": partitions * len(batches), "moved": moved}  # fmt: skip


# -- the driver provider, on the same touches -------------------------------------------


def run_driver_index(pending: int, batches: list[Batch]) -> list[float]:
    """Seconds a micro-batch the driver's index takes: touched rows out, kept and new in."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from tickwheel.pipeline.stream.ops_index import OpsIndex, ops_schema

    def rows(keys: list[str], deadlines: Any) -> Any:
        n = len(keys)
        return pa.table(
            [pa.array(["pending"] * n), pa.array(["payment"] * n), pa.array(keys),
             pa.array(keys), pa.array(np.full(n, T0, np.int64)), pa.array(deadlines, pa.int64())],
            schema=ops_schema(),
        )  # fmt: skip

    keys = [f"o{i}" for i in range(pending)]
    index = OpsIndex(["payment"], None, rows(keys, DEADLINE + np.arange(pending)))
    del keys
    times = []
    for batch in batches:
        started = time.perf_counter()
        touched = pa.array(batch.pays + batch.news, pa.string())
        taken = index.take_touched({"payment": touched}, batch.watermark)
        if taken.num_rows != len(batch.pays):
            raise SystemExit(f"driver index: took {taken.num_rows} rows")
        kept = taken.filter(pc.invert(pc.is_in(taken["key"], pa.array(batch.pays))))
        index.add(pa.concat_tables([kept, rows(batch.news, [DEADLINE] * len(batch.news))]))
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
    parser.add_argument("--partitions", type=int, default=2, help="design (a)'s partitions")
    parser.add_argument("--buckets", type=int, default=64, help="design (b)'s key buckets")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--records", type=int, default=1_000)
    parser.add_argument("--cluster", action="store_true", help="a standalone cluster of two")
    parser.add_argument("--designs", nargs="+", default=["embedded", "state-store"],
                        choices=["embedded", "state-store"])  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="design (b)'s query at one size, at most (s)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.partitions < 1 or args.buckets < 1 or args.batches < 2 or args.records < 2:
        parser.error("--partitions and --buckets >= 1, --batches >= 2, --records >= 2")
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
                embedded = run_embedded(spark, pending, batches, args.partitions)
                row["embedded"] = _median(embedded["steady"])
                row["floor"] = _median(embedded["floor"])
                row["embedded load"] = embedded["load"]
                row["held"] = f"{embedded['held']}/{embedded['tasks']}"
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
                  f"committed version held {row['held']})", f"floor {s(row['floor'])}"]  # fmt: skip
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
