"""Benchmark of the pipeline on Spark (issue 5): tickwheel's job against Spark's own answers.

For each size N (orders from ``tickwheel pipeline generate``, about 1.8 records
per order), on ``local[2]``, in one process and one SparkSession:

* **tickwheel**: the batch job (``run_job``), checked equal to the plain-Python
  reference on every output;
* **dataframe**: the pure DataFrame formulation of the one-open/one-complete
  rule (parse, dropDuplicates by id, groupBy key, compare the paid time with the
  deadline), checked equal to the reference on the keys where its assumptions
  hold (one ``created``, at most one ``paid``, no ``cancelled``);
* **applyInPandasWithState** (``--with-state``, small N only: it needs minutes):
  a Structured Streaming job over the same files with ``EventTimeTimeout``,
  checked the same way on the completed operations;
* **skeleton** (a floor, not an answer): the least Spark work any job of this
  shape does: read the JSON with a schema (no raw text, no validation),
  ``dropDuplicates`` by id, repartition by key, sort within partitions, and a
  ``noop`` sink (no Python, no outputs). Its wall time and the JVM's CPU time
  are measured; the ``floor`` line adds the CPU the per-partition loop needs
  (at the rate tickwheel's loop reached, or ``--loop-target`` events/s per
  core) and divides by the cores: no job that also runs the loop can be faster
  than that, so it caps the ratio tickwheel's job can reach against each peer;
* **raw skeleton** (the floor of these semantics): the same, but each record
  keeps its raw text (lines read as text, parsed with ``from_json``), copies
  are ranked by (time, sequence, raw) in a window, the kept events go to
  Python by key (``mapInArrow``), and one row per open event, in the columns
  of tickwheel's outcomes, is written as Parquet. The semantics need each of
  these (see :func:`raw_skeleton`); the skeleton above needs none.

The last table gives the issue's targets, measured.

Times exclude the SparkSession start and a warm-up run of both jobs on 2,000
orders. tickwheel's job and the DataFrame formulation then run ``--repeat``
times each, alternately, every run checked; the table gives the best run
(``seconds``, the JVM's JIT warm, as in a long-lived session) and the first
(``first s``, closer to a fresh ``tickwheel pipeline run``). The ratios use the
best runs. applyInPandasWithState runs once: it takes minutes, so its JIT is
warm for most of its run. ``events/s`` is input records per second.
"Loop" is the purgatory loop inside mapInArrow, per core. Peak memory is the
JVM's and this driver's peak RSS so far (VmHWM), so it only grows down the table.

    python benchmarks/bench_pipeline.py --orders 100000 1000000 --with-state 100000 --repeat 3
    python benchmarks/bench_pipeline.py --incremental ...   # the incremental benchmark
    python benchmarks/bench_pipeline.py --scale 100000 1000000 10000000   # the CLI's defaults
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _support  # noqa: F401 - puts tests/ on the path: the reference of the semantics

from tickwheel.pipeline.spark.outputs import OUTCOME_COLUMNS

ROOT = Path(__file__).resolve().parents[1]

RULES = ROOT / "examples" / "orders.toml"
TIMEOUT_MS = 1_800_000


def _vm_hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _simple_keys(reference: Any) -> set[str]:
    """Keys where the one-open/one-complete formulation's assumptions hold.

    In the reference: exactly one operation, completed or expired, and no
    unmatched event (so no payment before the order, no second payment, no
    cancel).
    """
    ops: dict[str, list[str]] = defaultdict(list)
    for row in reference.outcomes:
        ops[row[1]].append(row[5])
    unmatched = {row[1] for row in reference.unmatched}
    buffered = {row[1] for row in reference.buffered}
    return {
        key for key, outcomes in ops.items()
        if len(outcomes) == 1 and outcomes[0] in ("completed", "expired")
        and key not in unmatched and key not in buffered
    }  # fmt: skip


def dataframe_formulation(spark: Any, data: Path, out: Path) -> None:
    """The pure DataFrame answer to the one-open/one-complete rule."""
    from pyspark.sql import functions as F

    from tickwheel.pipeline.spark.records import INT_PATTERN, ISO_PATTERN

    raw = spark.read.schema(
        "event_id string, order_id string, type string, ts string, seq string"
    ).json(str(data))
    ts = F.col("ts")
    time_ms = F.when(ts.rlike(INT_PATTERN), ts.try_cast("long")).when(
        ts.rlike(ISO_PATTERN), F.unix_millis(ts.try_cast("timestamp"))
    )
    events = (
        raw.filter(F.col("seq").isNull() | F.col("seq").rlike(INT_PATTERN))  # as tickwheel does
        .select("event_id", "order_id", "type", time_ms.alias("t"))
        .filter(
            F.col("event_id").isNotNull() & F.col("order_id").isNotNull() & F.col("t").isNotNull()
        )
        .dropDuplicates(["event_id"])
    )
    per_key = events.groupBy("order_id").agg(
        F.min(F.when(F.col("type") == "created", F.col("t"))).alias("opened_at"),
        F.min(F.when(F.col("type") == "paid", F.col("t"))).alias("paid_at"),
    )
    deadline = F.col("opened_at") + F.lit(TIMEOUT_MS)
    result = per_key.filter(F.col("opened_at").isNotNull()).select(
        F.col("order_id").alias("key"),
        "opened_at",
        deadline.alias("deadline"),
        F.when(
            F.col("paid_at").isNotNull() & (F.col("paid_at") >= F.col("opened_at"))
            & (F.col("paid_at") < deadline),
            F.lit("completed"),
        ).otherwise(F.lit("expired")).alias("outcome"),
        F.when(
            F.col("paid_at").isNotNull() & (F.col("paid_at") >= F.col("opened_at"))
            & (F.col("paid_at") < deadline),
            F.col("paid_at"),
        ).otherwise(deadline).alias("resolved_at"),
    )  # fmt: skip
    result.write.mode("overwrite").parquet(str(out))


def apply_in_pandas_with_state(spark: Any, data: Path, out: Path, checkpoint: Path) -> None:
    """Spark's stateful answer: applyInPandasWithState with EventTimeTimeout, as a stream."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from tickwheel.pipeline.spark.records import INT_PATTERN, ISO_PATTERN

    # The file source takes files in modification-time order: make it the files'
    # arrival order, so the watermark moves forward with the data.
    base = time.time() - 3600
    for index, path in enumerate(sorted(data.glob("part-*.jsonl"))):
        os.utime(path, (base + index, base + index))
    stream = (
        spark.readStream.schema(
            "event_id string, order_id string, type string, ts string, seq string"
        )
        .option("maxFilesPerTrigger", 1)
        .json(str(data))
    )
    ts = F.col("ts")
    time_ms = F.when(ts.rlike(INT_PATTERN), ts.try_cast("long")).when(
        ts.rlike(ISO_PATTERN), F.unix_millis(ts.try_cast("timestamp"))
    )
    events = (
        stream.filter(F.col("seq").isNull() | F.col("seq").rlike(INT_PATTERN))
        .select("event_id", "order_id", "type", time_ms.alias("t"))
        .filter(
            F.col("event_id").isNotNull() & F.col("order_id").isNotNull() & F.col("t").isNotNull()
        )
        .withColumn("event_time", F.timestamp_millis(F.col("t")))
        .withWatermark("event_time", "3 minutes")  # arrival is shuffled within 2 min
    )

    def step(key: Any, frames: Any, state: Any) -> Any:
        # State: (opened_at, paid_at), either may be null: a payment may arrive
        # (in an earlier micro-batch) before its order's creation.
        rows = []
        opened, paid = state.get if state.exists else (None, None)
        if state.hasTimedOut:
            state.remove()
            if opened is not None:
                rows.append((key[0], opened, opened + TIMEOUT_MS, "expired", opened + TIMEOUT_MS))
        else:
            for frame in frames:
                for t, kind in zip(frame["t"], frame["type"], strict=True):
                    if kind == "created" and (opened is None or t < opened):
                        opened = int(t)
                    elif kind == "paid" and (paid is None or t < paid):
                        paid = int(t)
            watermark = state.getCurrentWatermarkMs()
            if opened is not None and paid is not None and opened <= paid < opened + TIMEOUT_MS:
                rows.append((key[0], opened, opened + TIMEOUT_MS, "completed", paid))
                state.remove()
            elif opened is not None and opened + TIMEOUT_MS <= watermark:
                # already past its deadline (the timeout runs after the data)
                rows.append((key[0], opened, opened + TIMEOUT_MS, "expired", opened + TIMEOUT_MS))
                state.remove()
            elif opened is None and paid is not None and paid + TIMEOUT_MS <= watermark:
                state.remove()
            elif opened is None and paid is None:  # only cancels: nothing to track
                if state.exists:
                    state.remove()
            else:
                state.update((opened, paid))
                anchor = opened if opened is not None else paid
                assert anchor is not None
                state.setTimeoutTimestamp(anchor + TIMEOUT_MS)
        yield pd.DataFrame(rows, columns=["key", "opened_at", "deadline", "outcome", "resolved_at"])

    query = (
        events.groupBy("order_id")
        .applyInPandasWithState(
            step,
            "key string, opened_at long, deadline long, outcome string, resolved_at long",
            "opened long, paid long",
            "append",
            GroupStateTimeout.EventTimeTimeout,
        )
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _check_simple(
    name: str, out: Path, reference: Any, simple: set[str], only_completed: bool
) -> str:
    import pyarrow.parquet as pq

    table = pq.read_table(out).to_pydict()
    got = {
        (k, o, d, outcome, r)
        for k, o, d, outcome, r in zip(
            table["key"], table["opened_at"], table["deadline"], table["outcome"],
            table["resolved_at"], strict=True,
        )
        if k in simple and (outcome == "completed" or not only_completed)
    }  # fmt: skip
    expected = {
        (r[1], r[3], r[4], r[5], r[6])
        for r in reference.outcomes
        if r[1] in simple
        and r[5] in (("completed",) if only_completed else ("completed", "expired"))
    }
    if got != expected:
        message = (
            f"DIFFERS from the reference on {len(got ^ expected):,} of "
            f"{len(expected):,} simple-key outcomes"
        )
        print(f"{name}: {message}")
        return message
    return f"equal to the reference on {len(expected):,} simple-key outcomes"


def skeleton(spark: Any, data: Path, partitions: int, out: Path) -> None:
    """The floor job: read with a schema, dropDuplicates by id, repartition, sort, noop sink.

    Writes nothing (``out`` is unused).
    """
    from pyspark.sql import functions as F

    events = (
        spark.read.schema("event_id string, order_id string, type string, ts string, seq string")
        .json(str(data))
        .where(F.col("event_id").isNotNull())
        .dropDuplicates(["event_id"])
    )
    by_key = events.repartition(partitions, "order_id")
    sorted_by_key = by_key.sortWithinPartitions("ts", "seq", "event_id")
    sorted_by_key.write.format("noop").mode("overwrite").save()


#: The Spark types of tickwheel's outcome columns (``OUTCOME_COLUMNS``), in order.
_OUTCOME_TYPES = ("string", "string", "string", "long", "long", "string", "long", "long", "string")
#: The outcomes' schema, as the raw skeleton writes them.
OUTCOME_DDL = ", ".join(
    f"{name} {kind}" for name, kind in zip(OUTCOME_COLUMNS, _OUTCOME_TYPES, strict=True)
)


def _open_rows(batches: Any) -> Any:
    """One outcome-shaped row per ``created`` event, computed in Arrow: no loop."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for batch in batches:
        opened = batch.filter(pc.equal(batch["type"], "created"))
        n, deadline = opened.num_rows, pc.add(opened["t"], TIMEOUT_MS)
        yield pa.record_batch(
            [pa.array(["payment"] * n, pa.string()), opened["order_id"], opened["event_id"],
             opened["t"], deadline, pa.array(["expired"] * n, pa.string()), deadline,
             pa.array([TIMEOUT_MS] * n, pa.int64()), pa.nulls(n, pa.string())],
            names=list(OUTCOME_COLUMNS),
        )  # fmt: skip


def raw_skeleton(spark: Any, data: Path, partitions: int, out: Path) -> None:
    """The floor of a job with tickwheel's semantics: the least Spark work it must do.

    The skeleton above reads with a schema and deduplicates by id alone. The
    semantics need more: every record keeps its raw text (rejected rows carry
    it, and copies of an id are ordered by it), so lines are read as text and
    parsed with ``from_json``; copies are ranked by (time, sequence, raw) in a
    window; the kept events go by key to Python (``mapInArrow``), which gives
    one row per operation in the outcomes' columns, written to ``out`` as
    Parquet. No validation, no loop, no other table.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    schema = "event_id string, order_id string, type string, ts string, seq string, _bad string"
    text = spark.read.text(str(data))
    parsed = text.select(
        F.col("value").alias("raw"),
        F.from_json("value", schema, {"columnNameOfCorruptRecord": "_bad"}).alias("r"),
    ).select("raw", "r.event_id", "r.order_id", "r.type",
             F.col("r.ts").try_cast("long").alias("t"),
             F.col("r.seq").try_cast("long").alias("q"))  # fmt: skip
    window = Window.partitionBy("event_id").orderBy("t", "q", "raw")
    kept = parsed.select("*", F.row_number().over(window).alias("rn")).where("rn = 1")
    (
        kept.select("order_id", "t", "q", "event_id", "type")
        .repartition(partitions, "order_id")
        .sortWithinPartitions("t", "q", "event_id")
        .mapInArrow(_open_rows, OUTCOME_DDL)
        .write.mode("overwrite")
        .parquet(str(out))
    )


#: The floors each size runs: (name, job, what its row's check column says).
FLOORS = (
    ("skeleton", skeleton, "no outputs: the least Spark work of such a job"),
    ("raw skeleton", raw_skeleton, "outcome rows written: the least Spark work of these semantics"),
)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--with-state", type=int, nargs="*", default=[],
                        help="sizes at which to run applyInPandasWithState too")  # fmt: skip
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--work-dir", default=None, help="where data and outputs go")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of tickwheel's job and the DataFrame formulation")  # fmt: skip
    parser.add_argument("--incremental", action="store_true",
                        help="run benchmarks/bench_pipeline_incremental.py instead")  # fmt: skip
    parser.add_argument("--scale", type=int, nargs="+", default=None, metavar="N",
                        help="instead: `tickwheel pipeline run` with its defaults, one "
                             "process per size (see benchmarks/_cli_scale.py)")  # fmt: skip
    parser.add_argument("--loop-target", type=float, default=None,
                        help="loop events/s per core for the floor line (default: the "
                             "rate tickwheel's own loop reached in its best run)")  # fmt: skip
    args, rest = parser.parse_known_args(argv)
    if args.incremental:
        script = Path(__file__).with_name("bench_pipeline_incremental.py")
        if not script.exists():
            print(f"no incremental benchmark yet ({script})", file=sys.stderr)
            return 2
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_pipeline_incremental", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # as an import does (its dataclasses look it up)
        spec.loader.exec_module(module)
        result: int = module.main(rest)
        return result
    if rest:
        parser.error(f"unknown arguments {rest}")
    if args.scale is not None:
        if min(args.scale) < 1:
            parser.error(f"--scale sizes must be >= 1, got {args.scale}")
        from _cli_scale import scale_run

        scale_work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-scale-"))
        scale_work.mkdir(parents=True, exist_ok=True)
        return scale_run(args.scale, scale_work)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")

    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.batch import run_job
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.spark.session import create_session

    rules = load_rules(RULES)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")  # fmt: skip
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    print(f"java: {(java.stderr or java.stdout).splitlines()[0] if java.returncode == 0 else '?'}")
    started = time.perf_counter()
    spark = create_session("local[2]", shuffle_partitions=args.partitions)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    print(f"SparkSession {spark.version} up in {time.perf_counter() - started:.1f}s (not counted)")
    rows: list[dict[str, Any]] = []
    floors: list[str] = []
    targets: list[tuple[str, float, str]] = []
    rates: dict[int, float] = {}  # tickwheel's records/s per size
    aip_rates: dict[int, float] = {}  # applyInPandasWithState's
    cores = 2  # local[2]
    try:
        # Warm the JVM (class loading, code generation) for both jobs, untimed.
        warm = work / "warm-up"
        generate_orders(2_000, warm / "data", seed=1, files=2)
        t = time.perf_counter()
        run_job(
            spark, rules, str(warm / "data"), str(warm / "tickwheel"), partitions=args.partitions
        )
        dataframe_formulation(spark, warm / "data", warm / "dataframe")
        print(f"warm-up: {time.perf_counter() - t:.1f}s (not counted)")
        for n in args.orders:
            data = work / f"orders-{n}"
            stats = generate_orders(n, data, seed=args.seed, files=8)
            records = stats.records
            print(f"\n== {n:,} orders: {records:,} records in {data}")
            t = time.perf_counter()
            reference = run_reference(iter_input_lines(data), rules)
            simple = _simple_keys(reference)
            print(f"reference: {time.perf_counter() - t:.1f}s")

            import pyarrow.parquet as pq

            from support.reference import _sort_key

            ours_s: list[float] = []
            theirs_s: list[float] = []
            # (wall s, JVM CPU s) per run of each floor
            floor_runs: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in FLOORS}
            best_summary: dict[str, Any] = {}
            check = ""
            for attempt in range(args.repeat):
                out = work / f"out-tickwheel-{n}"
                t = time.perf_counter()
                summary = run_job(spark, rules, str(data), str(out), partitions=args.partitions)
                seconds = time.perf_counter() - t
                table = pq.read_table(out / "outcomes").to_pydict()
                got = sorted(zip(*[table[c] for c in OUTCOME_COLUMNS], strict=True), key=_sort_key)
                if got != reference.outcomes:
                    raise SystemExit("tickwheel: outcomes differ from the reference")
                if not ours_s or seconds < min(ours_s):
                    best_summary = summary
                ours_s.append(seconds)
                print(f"tickwheel run {attempt + 1}: {seconds:.1f}s, "
                      f"loop {summary['loop']['events_per_s']:,.0f} ev/s")  # fmt: skip

                out = work / f"out-dataframe-{n}"
                t = time.perf_counter()
                dataframe_formulation(spark, data, out)
                seconds = time.perf_counter() - t
                check = _check_simple("dataframe", out, reference, simple, only_completed=False)
                theirs_s.append(seconds)
                print(f"dataframe run {attempt + 1}: {seconds:.1f}s")

                for name, job, _check in FLOORS:
                    t = time.perf_counter()
                    cpu = _cpu_seconds(jvm_pid)
                    job(spark, data, args.partitions, work / f"out-floor-{n}")
                    seconds, cpu = time.perf_counter() - t, _cpu_seconds(jvm_pid) - cpu
                    floor_runs[name].append((seconds, cpu))
                    print(f"{name} run {attempt + 1}: {seconds:.1f}s, JVM CPU {cpu:.1f}s")
            rows.append({
                "orders": n, "who": "tickwheel", "seconds": min(ours_s), "first": ours_s[0],
                "records": records, "loop": best_summary["loop"]["events_per_s"],
                "check": "outcomes/ equal to the reference, row for row",
                "jvm_mb": _vm_hwm_mb(jvm_pid), "driver_mb": _vm_hwm_mb(os.getpid()),
            })  # fmt: skip
            rows.append({
                "orders": n, "who": "dataframe", "seconds": min(theirs_s), "first": theirs_s[0],
                "records": records, "loop": None, "check": check,
                "jvm_mb": _vm_hwm_mb(jvm_pid), "driver_mb": _vm_hwm_mb(os.getpid()),
            })  # fmt: skip
            for name, _job, floor_check in FLOORS:
                runs = floor_runs[name]
                rows.append({
                    "orders": n, "who": f"{name} (floor)", "seconds": min(runs)[0],
                    "first": runs[0][0], "records": records, "loop": None, "check": floor_check,
                    "jvm_mb": _vm_hwm_mb(jvm_pid), "driver_mb": _vm_hwm_mb(os.getpid()),
                })  # fmt: skip
            rule_events = best_summary["loop"]["applied"]
            rate = args.loop_target or best_summary["loop"]["events_per_s"]
            loop_cpu = rule_events / rate
            # The fastest run of each floor, with its own CPU time; the last (the raw
            # skeleton, the floor of these semantics) also bounds applyInPandasWithState.
            for name, *_ in FLOORS:
                wall, cpu = min(floor_runs[name])
                floor_s = max(wall, (cpu + loop_cpu) / cores)
                floors.append(
                    f"floor at {n:,} orders: {name} {wall:.1f} s wall, {cpu:.1f} s JVM CPU; "
                    f"+ the loop at {rate:,.0f} events/s for {rule_events:,} rule events = "
                    f"{loop_cpu:.1f} CPU s; on {cores} cores >= {floor_s:.1f} s, so at best "
                    f"{min(theirs_s) / floor_s:.2f}x the DataFrame formulation "
                    f"(tickwheel's job: {min(theirs_s) / min(ours_s):.2f}x)"
                )
            targets.append((f"batch at {n:,} orders vs the DataFrame formulation",
                            min(theirs_s) / min(ours_s), ">= 0.6x"))  # fmt: skip
            rates[n] = records / min(ours_s)

            if n in args.with_state:
                out = work / f"out-state-{n}"
                ck = work / f"ck-state-{n}"
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(ck, ignore_errors=True)
                t = time.perf_counter()
                apply_in_pandas_with_state(spark, data, out, ck)
                seconds = time.perf_counter() - t
                check = _check_simple("applyInPandasWithState", out, reference, simple, True)
                rows.append({
                    "orders": n, "who": "applyInPandasWithState", "seconds": seconds,
                    "first": seconds, "records": records, "loop": None, "check": check,
                    "jvm_mb": _vm_hwm_mb(jvm_pid), "driver_mb": _vm_hwm_mb(os.getpid()),
                })  # fmt: skip
                print(f"applyInPandasWithState: {seconds:.1f}s")
                floors.append(
                    f"floor at {n:,} orders: at best {seconds / floor_s:.1f}x "
                    f"applyInPandasWithState (tickwheel's job: {seconds / min(ours_s):.1f}x)"
                )
                aip_rates[n] = records / seconds
    finally:
        spark.stop()

    print()
    header = (f"{'orders':>10} {'job':<24} {'seconds':>9} {'first s':>8} {'events/s':>11} "
              f"{'vs tickwheel':>13} "
              f"{'loop ev/s':>10} {'JVM MB':>8} {'driver MB':>10}  check")  # fmt: skip
    print(header)
    print("-" * len(header))
    for row in rows:
        ours = next(r for r in rows if r["orders"] == row["orders"] and r["who"] == "tickwheel")
        ratio = row["seconds"] / ours["seconds"]
        loop = f"{row['loop']:>10,.0f}" if row["loop"] else f"{'':>10}"
        print(
            f"{row['orders']:>10,} {row['who']:<24} {row['seconds']:>9.1f} {row['first']:>8.1f} "
            f"{row['records'] / row['seconds']:>11,.0f} {ratio:>12.2f}x {loop} "
            f"{row['jvm_mb']:>8,.0f} {row['driver_mb']:>10,.0f}  {row['check']}"
        )
    print(
        f"\nseconds: best of {args.repeat} runs (applyInPandasWithState: 1 run); "
        "first s: the first run"
    )
    print("'vs tickwheel' = that job's seconds / tickwheel's seconds (> 1: tickwheel is faster)")
    for line in floors:
        print(line)
    for aip_n, aip_rate in sorted(aip_rates.items()):
        for n, rate in sorted(rates.items()):
            targets.append((f"events/s at {n:,} orders vs applyInPandasWithState at {aip_n:,}",
                            rate / aip_rate, ">= 100x" if n >= aip_n else "(report)"))  # fmt: skip
    print(f"\n{'target':72} {'measured':>9} {'target':>9}  verdict")
    for name, value, target in targets:
        bound = float(target[3:-1]) if target.startswith(">= ") else None
        verdict = "" if bound is None else ("met" if value >= bound else "NOT met")
        print(f"{name:72} {value:>8.2f}x {target:>9}  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
