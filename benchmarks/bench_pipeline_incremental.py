"""Incremental pipeline: N orders as K increments vs one batch run vs applyInPandasWithState.

Measured in one process, on one SparkSession (``local[2]``):

(a) the batch job (``tickwheel pipeline run``) over all the data;
(b) the incremental job (``tickwheel pipeline stream``), the same data fed as K
    increments, one micro-batch each, state carried across them; its final
    outcomes are checked equal to (a)'s first;
(c) Spark's ``applyInPandasWithState`` with ``EventTimeTimeout`` over the same
    increments (at a smaller N: it runs at about a thousand events/s), next to
    (b) at that N, and next to a *stream skeleton* (a floor, not an answer):
    the least a correct incremental job does per micro-batch, done as cheaply
    as Spark allows: the JSON file source with a schema (no validation), the
    carried state read back, ``dropDuplicates`` by event id over both (the
    issue dedups ids across batches, and copies of one id may carry different
    keys, so this is its own shuffle), one shuffle by key into an identity
    ``mapInArrow``, and two writes (results and next state). No outputs of
    the real job's kinds, no commit protocol. Its time caps the ratio any
    such job can reach against applyInPandasWithState.

Also measures the carried state's size per pending operation: in the driver's
Python heap (tracemalloc over a processor holding only pending operations) and
on disk (the checkpoint's Parquet state).

Run: ``.venv/bin/python benchmarks/bench_pipeline_incremental.py`` (defaults:
1e6 orders as 10 increments; applyInPandasWithState at 1e5). Seconds exclude
the SparkSession start, the data generation and an untimed warm-up of both
streaming jobs on 1,000 orders (``--no-warm-up`` skips it). (a) and (b) run
``--repeat`` times each, alternately, with fresh outputs and checkpoints, and
each incremental run is checked against the batch job; (c)'s incremental run
is repeated too. The table gives each job's best run (the JVM's JIT warm) and
its first. applyInPandasWithState runs once: it takes minutes, so its JIT is
warm for most of its run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _rules(path: Path) -> Path:
    text = (ROOT / "examples" / "orders.toml").read_text(encoding="utf-8")
    path.write_text(text.replace('allowed_lateness = "0"', 'allowed_lateness = "3m"'))
    return path


def _feed(files: list[Path], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(files):
        target = dest / src.name
        shutil.copy(src, target)
        os.utime(target, (1_700_000_000 + i, 1_700_000_000 + i))


def _records(files: list[Path]) -> int:
    n = 0
    for f in files:
        with f.open("rb") as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def _incremental(
    spark: Any,
    rules: Path,
    inp: Path,
    work: Path,
    partitions: int,
    memory: list[dict[str, float]] | None = None,
) -> Any:
    from tickwheel.pipeline.stream.job import StreamConfig, StreamJob, read_stream_outputs

    cfg = StreamConfig(
        rules_path=str(rules),
        input=str(inp),
        output=str(work / "out"),
        checkpoint=str(work / "ck"),
        trigger="available-now",
        max_files_per_trigger=1,
        partitions=partitions,
        quiet=True,
    )
    started = time.perf_counter()
    with StreamJob(cfg, spark=spark) as job:
        if memory is not None:
            _sample_memory_per_batch(job, spark, memory)
        summary = job.run()
        seconds = time.perf_counter() - started
        assert job.sink is not None
        outs = read_stream_outputs(spark, job.sink, str(work / "ck"))
    return seconds, summary, outs


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _python_workers(jvm: int) -> list[int]:
    """The JVM's Python daemon and workers (its child processes, and theirs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [jvm]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                found.append(pid)
                todo.append(pid)
    return found


def _sample_memory_per_batch(job: Any, spark: Any, memory: list[dict[str, float]]) -> None:
    """After each micro-batch, record the JVM's and the Python workers' RSS and peak RSS."""
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    inner = job._run_batch

    def run_batch(batch_id: int, plan: Any) -> Any:
        out = inner(batch_id, plan)
        workers = [pid for pid in _python_workers(jvm) if Path(f"/proc/{pid}").exists()]
        memory.append({
            "jvm_rss": _status_mb(jvm, "VmRSS"), "jvm_peak": _status_mb(jvm, "VmHWM"),
            "driver_peak": _status_mb(os.getpid(), "VmHWM"),
            "worker_rss": max((_status_mb(p, "VmRSS") for p in workers), default=0.0),
            "worker_peak": max((_status_mb(p, "VmHWM") for p in workers), default=0.0),
        })  # fmt: skip
        return out

    job._run_batch = run_batch


def _apply_in_pandas_with_state(spark: Any, inp: Path, work: Path, timeout_ms: int) -> float:
    """The one-open/one-complete rule with applyInPandasWithState, as a stream."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    schema = "event_id string, order_id string, type string, ts string, seq long"
    src = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", "1")
        .option("mode", "DROPMALFORMED")
        .json(str(inp))
    )
    from tickwheel.pipeline.spark.records import ISO_PATTERN

    ms = (
        F.when(F.col("ts").rlike(r"^-?[0-9]+$"), F.col("ts").try_cast("long"))
        .when(F.col("ts").rlike(ISO_PATTERN), F.unix_millis(F.col("ts").try_cast("timestamp")))
        .alias("ms")
    )
    events = (
        src.select("event_id", "order_id", "type", "seq", ms)
        .where(F.col("ms").isNotNull() & F.col("order_id").isNotNull())
        .withColumn("event_time", F.timestamp_millis("ms"))
        .withWatermark("event_time", "3 minutes")
        .dropDuplicatesWithinWatermark(["event_id"])
    )

    def step(key: Any, pdfs: Any, state: Any) -> Any:
        out = []
        if state.hasTimedOut:
            if state.exists:  # a removed state can still carry its old timeout
                (opened,) = state.get
                out.append((key[0], "expired", opened, opened + timeout_ms))
                state.remove()
        else:
            for pdf in pdfs:
                for row in pdf.sort_values(["ms", "seq"]).itertuples(index=False):
                    if row.type == "created":
                        deadline = int(row.ms) + timeout_ms
                        if deadline <= state.getCurrentWatermarkMs():  # due already
                            out.append((key[0], "expired", int(row.ms), deadline))
                            continue
                        state.update((int(row.ms),))
                        state.setTimeoutTimestamp(deadline)
                    elif state.exists:
                        (opened,) = state.get
                        if row.type in ("paid", "cancelled") and row.ms < opened + timeout_ms:
                            outcome = "completed" if row.type == "paid" else "cancelled"
                            out.append((key[0], outcome, opened, int(row.ms)))
                            state.remove()
        yield pd.DataFrame(out, columns=["order_id", "outcome", "opened_at", "resolved_at"])

    query = (
        events.groupBy("order_id")
        .applyInPandasWithState(
            step,
            "order_id string, outcome string, opened_at long, resolved_at long",
            "opened long",
            "append",
            GroupStateTimeout.EventTimeTimeout,
        )
        .writeStream.format("noop")
        .option("checkpointLocation", str(work / "aip-ck"))
        .trigger(availableNow=True)
        .start()
    )
    started = time.perf_counter()
    query.awaitTermination()
    return time.perf_counter() - started


def _identity(batches: Any) -> Any:
    yield from batches


def _stream_skeleton(spark: Any, inp: Path, work: Path, partitions: int) -> float:
    """The floor of (c): a micro-batch per file, state carried, dedup, by key, 2 writes."""
    from pyspark.sql import functions as F

    out = work / "skeleton-out"
    ck = work / "skeleton-ck"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)
    schema = "event_id string, order_id string, type string, ts string, seq string"

    def batch(df: Any, batch_id: int) -> None:
        events = df
        if batch_id > 0:
            carried = spark.read.schema(df.schema).parquet(str(out / f"state-{batch_id - 1}"))
            events = events.unionByName(carried)
        grouped = (
            events.dropDuplicates(["event_id"])
            .repartition(partitions, "order_id")
            .mapInArrow(_identity, events.schema)
            .persist()
        )
        grouped.where(F.col("type") == "paid").write.parquet(str(out / f"results-{batch_id}"))
        df.where(F.col("type") == "created").write.parquet(str(out / f"state-{batch_id}"))
        grouped.unpersist()

    query = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", "1")
        .json(str(inp))
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    started = time.perf_counter()
    query.awaitTermination()
    return time.perf_counter() - started


def _state_bytes_per_pending(n: int = 100_000) -> float:
    """Python heap bytes per pending operation in a processor (tracemalloc)."""
    from tickwheel.pipeline.core import Event, PartitionProcessor
    from tickwheel.pipeline.rules import Rule

    rule = Rule("payment", "order_id", ("created",), ("paid",), ("cancelled",), 1_800_000)
    events = [Event(0, f"o{i:08d}", 1_000 + i, 0, f"e{i:09d}", 0, "created") for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    proc = PartitionProcessor([rule])
    proc.process(events)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(proc.pending_operations()) == n
    proc.close()
    return (after - before) / n


def _parquet_bytes_per_pending(n: int = 100_000) -> float:
    """Bytes per pending operation of the checkpoint's ``ops`` state, as Parquet (snappy).

    The rows are those the stream writes for pending operations (kind, rule,
    key, op id, opened_at, deadline), for ``n`` generated orders' creations.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = 1_704_067_200_000
    table = pa.table(
        {
            "kind": ["pending"] * n,
            "rule": ["payment"] * n,
            "key": [f"o{i:08d}" for i in range(n)],
            "event_id": [f"e{2 * i:09d}" for i in range(n)],
            "time": [t0 + 50 * i for i in range(n)],
            "deadline": [t0 + 50 * i + 1_800_000 for i in range(n)],
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ops.parquet")
        pq.write_table(table, path, compression="snappy")
        return os.path.getsize(path) / n


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet"))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=float, default=1e6, help="0: skip batch vs incremental")
    parser.add_argument("--increments", type=int, default=10)
    parser.add_argument("--aip-orders", type=float, default=1e5)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--skip-aip", action="store_true")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--no-warm-up", action="store_true", help="skip the untimed warm-up")
    parser.add_argument("--repeat", type=int, default=3, help="runs of (a) and (b)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from tickwheel.pipeline.batch import run_job
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.spark.session import create_session

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-inc-"))
    work.mkdir(parents=True, exist_ok=True)
    rules_path = _rules(work / "rules.toml")
    rules = load_rules(rules_path)
    spark = create_session("local[2]", shuffle_partitions=args.partitions)
    from pyspark.sql import functions as F

    print(f"python {sys.version.split()[0]}, spark {spark.version}, local[2], work {work}")
    table: list[tuple[str, int, list[float], int]] = []

    def measured(name: str, recs: int, runs: list[float], orders: int) -> None:
        table.append((name, recs, runs, orders))
        print(
            f"measured: {name}: {orders:,} orders, {recs:,} records, "
            + ", ".join(f"{secs:.1f}" for secs in runs)
            + " s",
            flush=True,
        )

    cols = [
        "rule", "key", "op_id", "opened_at", "deadline", "outcome", "resolved_at",
        "latency_ms", "resolve_event_id",
    ]  # fmt: skip

    def workload(n: int, tag: str) -> tuple[list[Path], int]:
        gen = work / f"gen-{tag}"
        generate_orders(n, gen, seed=1, files=args.increments)
        files = sorted(gen.glob("part-*.jsonl"))
        return files, _records(files)

    if not args.no_warm_up:
        # Warm the JVM (class loading, code generation) for the jobs measured
        # below, untimed, as bench_pipeline.py does for the batch jobs.
        started = time.perf_counter()
        generate_orders(1_000, work / "gen-warm", seed=2, files=2)
        _feed(sorted((work / "gen-warm").glob("part-*.jsonl")), work / "in-warm")
        _incremental(spark, rules_path, work / "in-warm", work / "inc-warm", args.partitions)
        if not args.skip_aip:
            _apply_in_pandas_with_state(
                spark, work / "in-warm", work / "warm", rules.rules[0].timeout_ms
            )
        print(f"warm-up: {time.perf_counter() - started:.1f}s (not counted)", flush=True)

    # (a) batch and (b) incremental at N
    n = int(args.orders)
    state_line = None
    if n > 0:
        files, records = workload(n, "big")
        _feed(files, work / "in-big")
        batch_runs: list[float] = []
        inc_runs: list[float] = []
        best_memory: list[dict[str, float]] = []
        for attempt in range(args.repeat):
            batch_out = work / f"batch-big-{attempt}"
            started = time.perf_counter()
            run_job(spark, rules, str(work / "gen-big"), str(batch_out), partitions=args.partitions)
            batch_runs.append(time.perf_counter() - started)
            shutil.rmtree(work / "inc-big", ignore_errors=True)
            memory: list[dict[str, float]] = []
            inc_s, _summary, outs = _incremental(
                spark, rules_path, work / "in-big", work / "inc-big", args.partitions, memory
            )
            if not inc_runs or inc_s < min(inc_runs):
                best_memory = memory
            inc_runs.append(inc_s)
            batch_outcomes = spark.read.parquet(str(batch_out / "outcomes")).select(*cols)
            inc_outcomes = outs["outcomes"].select(*cols)
            diff = (
                batch_outcomes.exceptAll(inc_outcomes).count()
                + inc_outcomes.exceptAll(batch_outcomes).count()
            )
            if diff:
                print(f"MISMATCH: {diff} outcome rows differ between batch and incremental")
                return 1
            print(
                f"run {attempt + 1}: batch {batch_runs[-1]:.1f}s, incremental {inc_s:.1f}s; "
                "checked: incremental outcomes == batch outcomes "
                f"({batch_outcomes.count():,} rows)",
                flush=True,
            )
            if attempt:
                shutil.rmtree(batch_out, ignore_errors=True)
        measured("batch job, 1 run", records, batch_runs, n)
        measured(f"incremental, {args.increments} increments", records, inc_runs, n)
        batch_s, inc_s = min(batch_runs), min(inc_runs)
        ck_state = work / "inc-big" / "ck" / "tickwheel" / "state"
        last = sorted(ck_state.iterdir(), key=lambda p: int(p.name))[-1]
        pending = spark.read.parquet(str(last / "ops")).where(F.col("kind") == "pending").count()
        ops_bytes = _dir_bytes(last / "ops")
        ops_rows = spark.read.parquet(str(last / "ops")).count()
        state_line = (
            f"state: {pending:,} pending ops at the end; ops state {ops_rows:,} rows, "
            f"{ops_bytes:,} B Parquet ({ops_bytes / max(ops_rows, 1):.1f} B/row)"
        )

    # (c) applyInPandasWithState vs incremental at the smaller N
    aip_n = int(args.aip_orders)
    if not args.skip_aip:
        files_s, records_s = workload(aip_n, "small")
        _feed(files_s, work / "in-small")
        small_runs: list[float] = []
        for _attempt in range(args.repeat):
            shutil.rmtree(work / "inc-small", ignore_errors=True)
            secs, _, _ = _incremental(
                spark, rules_path, work / "in-small", work / "inc-small", args.partitions
            )
            small_runs.append(secs)
        measured(f"incremental, {args.increments} increments", records_s, small_runs, aip_n)
        inc_small_s = min(small_runs)
        skeleton_runs = [
            _stream_skeleton(spark, work / "in-small", work, args.partitions)
            for _attempt in range(args.repeat)
        ]
        measured("stream skeleton (floor, no outputs)", records_s, skeleton_runs, aip_n)
        aip_s = _apply_in_pandas_with_state(
            spark, work / "in-small", work, rules.rules[0].timeout_ms
        )
        measured("applyInPandasWithState", records_s, [aip_s], aip_n)

    per_pending = _state_bytes_per_pending()
    print()
    print(
        f"{'run':44} {'orders':>10} {'records':>10} {'seconds':>9} {'first s':>8} {'events/s':>10}"
    )
    for name, recs, runs, orders in table:
        secs = min(runs)
        print(
            f"{name:44} {orders:>10,} {recs:>10,} {secs:>9.1f} {runs[0]:>8.1f} "
            f"{recs / secs:>10,.0f}"
        )
    print(
        f"seconds: best of {args.repeat} runs (applyInPandasWithState: 1 run); first s: the first"
    )
    print()
    if n > 0:
        print(state_line)
        print("memory after each increment (MB; the best incremental run): "
              "JVM RSS / peak, Python workers' largest RSS / peak, this driver's peak")  # fmt: skip
        for i, m in enumerate(best_memory):
            print(f"  increment {i + 1:>2}: JVM {m['jvm_rss']:,.0f} / {m['jvm_peak']:,.0f}, "
                  f"workers {m['worker_rss']:,.0f} / {m['worker_peak']:,.0f}, "
                  f"driver {m['driver_peak']:,.0f}")  # fmt: skip
    print()
    print(f"{'target':72} {'measured':>10} {'target':>10}  verdict")
    rows = []
    if n > 0:
        rows.append((f"incremental / batch time at {n:,} ({args.increments} increments)",
                     inc_s / batch_s, "<= 1.5x", inc_s / batch_s <= 1.5))  # fmt: skip
    if not args.skip_aip:
        aip_rate = records_s / aip_s
        if n > 0:
            for name, secs in (("batch", batch_s), ("incremental", inc_s)):
                ratio = records / secs / aip_rate
                rows.append((f"{name} events/s at {n:,} vs applyInPandasWithState at {aip_n:,}",
                             ratio, ">= 100x", ratio >= 100))  # fmt: skip
        rows.append((f"incremental vs applyInPandasWithState, both at {aip_n:,}",
                     aip_s / inc_small_s, "(report)", None))  # fmt: skip
        rows.append((f"stream skeleton vs applyInPandasWithState at {aip_n:,} (ceiling)",
                     aip_s / min(skeleton_runs), "(floor)", None))  # fmt: skip
    for name, value, target, ok in rows:
        verdict = "" if ok is None else ("met" if ok else "NOT met")
        print(f"{name:72} {value:>9.2f}x {target:>10}  {verdict}")
    print(f"driver heap: {per_pending:.0f} B per pending operation (tracemalloc, 100k ops)")
    print(
        f"checkpoint: {_parquet_bytes_per_pending():.1f} B per pending operation "
        "(ops state as Parquet, snappy, 100k ops)"
    )
    spark.stop()
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
