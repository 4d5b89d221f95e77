"""The batch job on Spark: read → validate → dedup → repartition → sort → mapInArrow → write.

1. **Parse and validate** with Spark SQL functions (:mod:`.events`).
2. **Deduplicate** by event id with a window ordered by (time, sequence, raw
   text): the first row is kept, copies with the same content are counted as
   duplicates, copies with other content go to ``rejected/`` as ``conflict``.
3. **Repartition** the events of each rule by the hash of (rule, key), so all
   events of a key meet in one partition.
4. **Sort within partitions** by (time, sequence, event id, rule).
5. **mapInArrow**: each partition runs one :class:`~.core.PartitionProcessor`,
   one purgatory on one timing wheel on an event-time clock, up to the global
   watermark computed beforehand.
6. **Write** ``outcomes/``, ``unmatched/``, ``rejected/``, ``buffered/`` and
   ``summary.json``.

Nothing here is specific to a local master: the job runs unchanged on a
cluster, as the separate-JVM test shows.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .events import key_column, parse_records, read_records
from .rules import KIND_CANCEL, KIND_COMPLETE, KIND_OPEN, Rules

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BUFFERED_COLUMNS",
    "OUTCOME_COLUMNS",
    "REJECTED_COLUMNS",
    "UNMATCHED_COLUMNS",
    "create_session",
    "resolve_inputs",
    "run_job",
]

OUTCOME_COLUMNS = (
    "rule", "key", "op_id", "opened_at", "deadline", "outcome", "resolved_at", "latency_ms",
    "resolve_event_id",
)  # fmt: skip
UNMATCHED_COLUMNS = ("rule", "key", "event_id", "event_type", "event_time", "reason")
REJECTED_COLUMNS = ("event_id", "reason", "raw")
BUFFERED_COLUMNS = ("rule", "key", "event_id", "event_type", "event_time", "seq")

# The rows mapInArrow yields: one union schema, ``k`` says which output a row is for.
#   k="o" outcome:   id=op_id, t0=opened_at, t1=deadline, s=outcome, t2=resolved_at, ref=resolve id
#   k="u" unmatched: id=event_id, t0=event_time, s=reason, ref=event_type
#   k="b" buffered:  id=event_id, t0=event_time, t1=seq, ref=event_type
#   k="s" stats:     s=JSON of the partition's counters and timings
UNION_DDL = (
    "k string, rule int, key string, id string, t0 long, t1 long, s string, t2 long, ref string"
)
OUTPUTS = ("outcomes", "unmatched", "rejected", "buffered")

Progress = Callable[[str], None]


def create_session(
    master: str = "local[2]",
    app_name: str = "tickwheel-pipeline",
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Start (or get) a SparkSession set up for the pipeline.

    Sets ``PYSPARK_PYTHON`` to this interpreter (else workers fall back to the
    system python), ``SPARK_LOCAL_IP`` to loopback when unset, turns off the UI
    and Spark's console progress bar, and keeps the log at WARN.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import pyspark
    from pyspark.sql import SparkSession

    # local-cluster and standalone workers are started from SPARK_HOME: the
    # pip package is a complete Spark home.
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50000")
        .config("spark.driver.memory", "2g")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def resolve_inputs(path: str, fmt: str) -> list[str]:
    """The input files: a directory (its data files), a glob, or one file.

    Raises FileNotFoundError naming ``path`` when nothing matches.
    """
    suffixes = {"json": (".json", ".jsonl", ".ndjson"), "csv": (".csv",), "parquet": (".parquet",)}
    p = Path(path)
    if p.is_dir():
        files = sorted(
            str(f)
            for f in p.rglob("*")
            if f.is_file() and not f.name.startswith((".", "_")) and f.name.endswith(suffixes[fmt])
        )
    elif p.is_file():
        files = [str(p)]
    else:
        import glob

        files = sorted(f for f in glob.glob(path, recursive=True) if Path(f).is_file())
    if not files:
        raise FileNotFoundError(f"no {fmt} input files at {path!r}")
    return files


def _watch_stages(
    spark: SparkSession, say: Progress, started: float, stop: threading.Event, every_s: float = 5.0
) -> None:
    """Report the running Spark stages' task progress every ``every_s`` seconds until ``stop``."""
    tracker = spark.sparkContext.statusTracker()
    last = ""
    while not stop.wait(every_s):
        try:
            infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
        except Exception:  # the context is stopping
            return
        parts = [
            f"stage {info.stageId}: {info.numCompletedTasks}/{info.numTasks} tasks"
            for info in sorted((i for i in infos if i is not None), key=lambda i: i.stageId)
        ]
        line = ", ".join(parts)
        if line and line != last:
            say(f"[{time.perf_counter() - started:7.1f}s]   running {line}")
            last = line


def _process_partition(
    rules: Rules, watermark: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: one PartitionProcessor per partition."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from .core import PartitionProcessor

        started = time.perf_counter()
        schema = _union_schema(pa)
        loop_s = 0.0  # wall time of the loop
        loop_cpu = 0.0  # CPU time of this thread in the loop: robust to a busy machine
        events = 0
        proc = PartitionProcessor(rules)
        perf = time.perf_counter
        cpu = time.thread_time
        try:
            for batch in batches:
                cols = [c.to_pylist() for c in batch.columns]
                t, c = perf(), cpu()
                proc.process(zip(*cols, strict=True), watermark)
                loop_s += perf() - t
                loop_cpu += cpu() - c
                events += batch.num_rows
                outcomes = proc.take_outcomes()
                if outcomes:
                    yield _outcome_batch(pa, schema, outcomes, pending=False)
            t, c = perf(), cpu()
            proc.finish(watermark)
            loop_s += perf() - t
            loop_cpu += cpu() - c
            outcomes = proc.take_outcomes()
            if outcomes:
                yield _outcome_batch(pa, schema, outcomes, pending=False)
            pending = proc.pending_operations()
            if pending:
                yield _outcome_batch(pa, schema, pending, pending=True)
            unmatched = proc.take_unmatched()
            if unmatched:
                rule, key, event_id, event_type, event_time, reason = zip(*unmatched, strict=True)
                yield _batch(
                    pa, schema, "u", rule, key, event_id, event_time, None, reason, None, event_type
                )
            buffered = proc.buffered_events()
            if buffered:
                rule, key, time_, seq, event_id, _kind, event_type = zip(*buffered, strict=True)
                yield _batch(
                    pa, schema, "b", rule, key, event_id, time_, seq, None, None, event_type
                )
            stats = {
                "events": events,
                "applied": proc.events_applied,
                "buffered": proc.events_buffered,
                "unmatched": {
                    reason: sum(1 for row in unmatched if row[5] == reason)
                    for reason in ("after_expiry", "no_operation")
                },
                "loop_seconds": loop_s,
                "loop_cpu_seconds": loop_cpu,
                "udf_seconds": time.perf_counter() - started,
            }
            yield _batch(pa, schema, "s", [0], [None], [None], [None], [None], [json.dumps(stats)],
                         [None], [None])  # fmt: skip
        finally:
            proc.close()

    return run


def _union_schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("k", pa.string()),
            ("rule", pa.int32()),
            ("key", pa.string()),
            ("id", pa.string()),
            ("t0", pa.int64()),
            ("t1", pa.int64()),
            ("s", pa.string()),
            ("t2", pa.int64()),
            ("ref", pa.string()),
        ]
    )


def _batch(pa: Any, schema: Any, k: str, rule: Any, key: Any, id_: Any, t0: Any, t1: Any,
           s: Any, t2: Any, ref: Any) -> Any:  # fmt: skip
    n = len(rule)
    arrays = []
    for value, field in zip((rule, key, id_, t0, t1, s, t2, ref), list(schema)[1:], strict=True):
        arrays.append(pa.nulls(n, field.type) if value is None else pa.array(value, field.type))
    return pa.RecordBatch.from_arrays([pa.array([k] * n, pa.string()), *arrays], schema=schema)


def _outcome_batch(pa: Any, schema: Any, rows: list[Any], pending: bool) -> Any:
    if pending:
        rule, key, op_id, opened, deadline = zip(*rows, strict=True)
        return _batch(
            pa, schema, "o", rule, key, op_id, opened, deadline, ["pending"] * len(rule), None, None
        )
    rule, key, op_id, opened, deadline, outcome, at, ref = zip(*rows, strict=True)
    return _batch(pa, schema, "o", rule, key, op_id, opened, deadline, outcome, at, ref)


def _rule_name(rules: Rules) -> Any:
    from pyspark.sql import functions as F

    return F.element_at(F.array(*[F.lit(n) for n in rules.names]), F.col("rule") + 1)


def _events_for_rules(events: DataFrame, rules: Rules) -> DataFrame:
    """One row per (event, rule that uses its type): rule, key, time, seq, id, kind, type."""
    from pyspark.sql import functions as F

    frames = []
    key_index = {name: i for i, name in enumerate(rules.key_fields)}
    for index, rule in enumerate(rules.rules):
        kind = (
            F.when(F.col("event_type").isin(list(rule.open)), F.lit(KIND_OPEN))
            .when(F.col("event_type").isin(list(rule.complete)), F.lit(KIND_COMPLETE))
            .otherwise(F.lit(KIND_CANCEL))
        )
        types = [*rule.open, *rule.complete, *rule.cancel]
        frames.append(
            events.filter(F.col("event_type").isin(types)).select(
                F.lit(index).cast("int").alias("rule"),
                F.col(key_column(key_index[rule.key])).alias("key"),
                "time",
                "seq",
                "event_id",
                kind.cast("int").alias("kind"),
                "event_type",
            )
        )
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def _write(frame: DataFrame, path: str, fmt: str) -> None:
    writer = frame.write.mode("overwrite")
    if fmt == "parquet":
        writer.parquet(path)
    elif fmt == "csv":
        writer.option("header", True).csv(path)
    elif fmt == "json":
        writer.json(path)
    else:
        raise ValueError(f"output format must be parquet, csv or json, got {fmt!r}")


def run_job(
    spark: SparkSession,
    rules: Rules,
    input_path: str,
    output_dir: str,
    partitions: int | None = None,
    output_format: str = "parquet",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the batch pipeline; write the outputs and ``summary.json``; return the summary.

    ``partitions`` is the number of key-hash partitions (default: Spark's default
    parallelism). ``progress`` receives one line per phase with counts and the
    elapsed time.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if output_format not in ("parquet", "csv", "json"):
        raise ValueError(f"output format must be parquet, csv or json, got {output_format!r}")
    if partitions is None:
        partitions = spark.sparkContext.defaultParallelism
    if type(partitions) is not int or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    say: Progress = progress if progress is not None else (lambda _msg: None)
    started = time.perf_counter()
    phases: dict[str, float] = {}
    mark = [started]

    def phase(name: str, message: str) -> None:
        now = time.perf_counter()
        phases[name] = round(now - mark[0], 3)
        mark[0] = now
        say(f"[{now - started:7.1f}s] {message}")

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = resolve_inputs(input_path, rules.input.format)
    old_shuffle = str(spark.conf.get("spark.sql.shuffle.partitions"))
    spark.conf.set("spark.sql.shuffle.partitions", str(max(partitions, 2)))
    stop_watch = threading.Event()
    watcher = threading.Thread(
        target=_watch_stages,
        args=(spark, say, started, stop_watch),
        name="tickwheel-progress",
        daemon=True,
    )
    if progress is not None:
        watcher.start()
    say(f"[    0.0s] reading {len(files)} {rules.input.format} file(s) from {input_path}")
    try:
        parsed = parse_records(read_records(spark, files, rules), rules)
        key_cols = [key_column(i) for i in range(len(rules.key_fields))]
        content = F.struct("event_type", "time", "seq", *key_cols)
        # One window over every record, so the input is read and parsed once:
        # valid records (reason null) are ranked per event id; invalid ones fall
        # in windows of their own reason and are all rejected.
        window = Window.partitionBy("reason", "event_id").orderBy("time", "seq", "raw")
        ranked = parsed.select(
            "*",
            F.row_number().over(window).alias("rn"),
            F.first(content).over(window).alias("kept"),
        )
        cls = (
            F.when(F.col("reason").isNotNull(), F.lit("rejected"))
            .when(F.col("rn") == 1, F.lit("event"))
            .when(F.col("kept") == content, F.lit("duplicate"))
            .otherwise(F.lit("conflict"))
        )
        # Raw text is kept only where an output needs it (rejected records).
        classified = ranked.select(
            cls.alias("cls"),
            F.when(cls == "conflict", F.lit("conflict")).otherwise(F.col("reason")).alias("reason"),
            F.when(cls.isin("conflict", "rejected"), F.col("raw")).alias("raw"),
            "event_id",
            "event_type",
            "time",
            "seq",
            *key_cols,
            F.coalesce(F.col("relevant") & F.col("reason").isNull(), F.lit(False)).alias(
                "relevant"
            ),
        ).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts_rows = (
                classified.groupBy("cls", "reason", "relevant")
                .agg(F.count(F.lit(1)).alias("n"), F.max("time").alias("max_time"))
                .collect()
            )
            by_cls: dict[str, int] = {}
            rejected_by_reason: dict[str, int] = {}
            relevant = ignored = 0
            max_time: int | None = None
            for row in counts_rows:
                by_cls[row["cls"]] = by_cls.get(row["cls"], 0) + row["n"]
                if row["reason"] is not None:
                    rejected_by_reason[row["reason"]] = (
                        rejected_by_reason.get(row["reason"], 0) + row["n"]
                    )
                if row["cls"] == "event":
                    if row["relevant"]:
                        relevant += row["n"]
                    else:
                        ignored += row["n"]
                    if row["max_time"] is not None:
                        max_time = max(max_time or row["max_time"], row["max_time"])
            watermark = None if max_time is None else max_time - rules.input.allowed_lateness_ms
            phase(
                "parse_dedup",
                f"parsed and deduplicated: {by_cls.get('event', 0):,} events, "
                f"{by_cls.get('duplicate', 0):,} duplicates, {by_cls.get('conflict', 0):,} "
                f"conflicts; watermark {watermark}",
            )
            rejected = classified.filter(F.col("reason").isNotNull()).select(
                "event_id", "reason", "raw"
            )
            _write(
                rejected.coalesce(max(1, min(partitions, 4))), str(out / "rejected"), output_format
            )
            n_rejected = sum(rejected_by_reason.values())
            phase("rejected", f"wrote rejected/: {n_rejected:,} records")

            events = classified.filter((F.col("cls") == "event") & F.col("relevant"))
            per_rule = _events_for_rules(events, rules)
            union_schema = UNION_DDL
            if watermark is None:
                results = spark.createDataFrame([], union_schema)
            else:
                results = (
                    per_rule.repartition(partitions, "rule", "key")
                    .sortWithinPartitions("time", "seq", "event_id", "rule")
                    .mapInArrow(_process_partition(rules, watermark), union_schema)
                )
            results = results.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                stats_rows = [
                    json.loads(r["s"]) for r in results.filter(F.col("k") == "s").collect()
                ]
                loop_events = sum(s["events"] for s in stats_rows)
                loop_s = sum(s["loop_seconds"] for s in stats_rows)
                loop_cpu = sum(s["loop_cpu_seconds"] for s in stats_rows)
                udf_s = sum(s["udf_seconds"] for s in stats_rows)
                phase(
                    "purgatory",
                    f"ran {len(stats_rows)} partition(s) through the purgatory: {loop_events:,} "
                    f"rule events, loop {loop_events / loop_cpu if loop_cpu else 0:,.0f} "
                    "events/s per core",
                )
                name = _rule_name(rules)
                outcomes = results.filter(F.col("k") == "o").select(
                    name.alias("rule"),
                    "key",
                    F.col("id").alias("op_id"),
                    F.col("t0").alias("opened_at"),
                    F.col("t1").alias("deadline"),
                    F.col("s").alias("outcome"),
                    F.col("t2").alias("resolved_at"),
                    (F.col("t2") - F.col("t0")).alias("latency_ms"),
                    F.col("ref").alias("resolve_event_id"),
                )
                unmatched = results.filter(F.col("k") == "u").select(
                    name.alias("rule"),
                    "key",
                    F.col("id").alias("event_id"),
                    F.col("ref").alias("event_type"),
                    F.col("t0").alias("event_time"),
                    F.col("s").alias("reason"),
                )
                buffered = results.filter(F.col("k") == "b").select(
                    name.alias("rule"),
                    "key",
                    F.col("id").alias("event_id"),
                    F.col("ref").alias("event_type"),
                    F.col("t0").alias("event_time"),
                    F.col("t1").alias("seq"),
                )
                _write(outcomes, str(out / "outcomes"), output_format)
                _write(unmatched, str(out / "unmatched"), output_format)
                _write(buffered, str(out / "buffered"), output_format)
                outcome_stats = (
                    outcomes.groupBy("outcome")
                    .agg(
                        F.count(F.lit(1)).alias("n"),
                        F.percentile(
                            F.col("latency_ms"), F.array(*[F.lit(q) for q in (0.5, 0.9, 0.99)])
                        ).alias("p"),
                    )
                    .collect()
                )
                n_buffered = sum(s["buffered"] for s in stats_rows)
            finally:
                results.unpersist()
        finally:
            classified.unpersist()
    finally:
        stop_watch.set()
        if watcher.is_alive():
            watcher.join(timeout=10)
        spark.conf.set("spark.sql.shuffle.partitions", old_shuffle)
    outcome_counts = {r["outcome"]: r["n"] for r in outcome_stats}
    latency = {
        r["outcome"]: (
            None if r["p"] is None else {
                "p50": r["p"][0], "p90": r["p"][1], "p99": r["p"][2]
            }
        )
        for r in outcome_stats
        if r["outcome"] != "pending"
    }  # fmt: skip
    unmatched_counts: dict[str, int] = {}
    for stats in stats_rows:
        for reason, n in stats["unmatched"].items():
            if n:
                unmatched_counts[reason] = unmatched_counts.get(reason, 0) + n
    phase(
        "write",
        "wrote outcomes/, unmatched/ and buffered/: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(outcome_counts.items()))
        + f"; unmatched {sum(unmatched_counts.values()):,}",
    )
    job_s = time.perf_counter() - started
    records = sum(by_cls.values())
    summary: dict[str, Any] = {
        "input": input_path,
        "input_files": len(files),
        "output": str(out),
        "format": output_format,
        "rules": [{"name": r.name, "key": r.key, "timeout_ms": r.timeout_ms} for r in rules.rules],
        "partitions": partitions,
        "allowed_lateness_ms": rules.input.allowed_lateness_ms,
        "max_event_time": max_time,
        "watermark": watermark,
        "counts": {
            "records": records,
            "rejected": n_rejected,
            "rejected_by_reason": dict(sorted(rejected_by_reason.items())),
            "duplicates": by_cls.get("duplicate", 0),
            "conflicts": by_cls.get("conflict", 0),
            "events": by_cls.get("event", 0),
            "ignored": ignored,
            "rule_events": loop_events,
            "buffered": n_buffered,
            "outcomes": dict(sorted(outcome_counts.items())),
            "unmatched": dict(sorted(unmatched_counts.items())),
        },
        "latency_ms": dict(sorted(latency.items())),
        "seconds": round(job_s, 3),
        "phases_seconds": phases,
        "events_per_s": round(records / job_s, 1) if job_s else None,
        "loop": {
            "events": loop_events,
            "seconds": round(loop_s, 3),
            "cpu_seconds": round(loop_cpu, 3),
            "events_per_s": round(loop_events / loop_cpu, 1) if loop_cpu else None,
            "events_per_wall_s": round(loop_events / loop_s, 1) if loop_s else None,
            "udf_seconds": round(udf_s, 3),
            "note": (
                "per-partition purgatory loop measured inside mapInArrow; events_per_s is "
                "per core (events / CPU seconds of the loop), events_per_wall_s uses wall time"
            ),
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    say(f"[{job_s:7.1f}s] done: {records:,} records, {summary['events_per_s']:,} records/s")
    return summary
