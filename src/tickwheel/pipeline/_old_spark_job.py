"""The batch job on Spark: read → validate → dedup → repartition → sort → mapInArrow → write.

1. **Parse and validate** with Spark SQL functions (:mod:`.events`).
2. **Deduplicate** by event id with a window ordered by (time, sequence, raw
   text): the first row is kept, copies with the same content are counted as
   duplicates, copies with other content go to ``rejected/`` as ``conflict``.
3. **Repartition** the events of each rule by the hash of (rule, key), so all
   events of a key meet in one partition; the other records (rejected,
   duplicates, ignored) ride along, keyed by their event id.
4. **Sort within partitions** by (time, sequence, event id, rule).
5. **mapInArrow**: each partition runs one :class:`~.core.PartitionProcessor`,
   one purgatory on one timing wheel on an event-time clock, over all its
   events; the rows are persisted.
6. **Finalise** the rows with the global watermark (the largest kept event
   time of all partitions, minus the allowed lateness; see :func:`_finalise`)
   and **write** ``outcomes/``, ``unmatched/``, ``rejected/``, ``buffered/``
   and ``summary.json``.

Steps 1–5 are one Spark job; step 6 is five small jobs over the persisted rows.
Nothing here is specific to a local master: the job runs unchanged on a
cluster, as the separate-JVM test shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .events import (
    DEFAULT_MAX_FUTURE_MS,
    MISSING_FILE,
    key_column,
    parse_records,
    raw_text_columns,
    read_records,
)
from .rules import KIND_CANCEL, KIND_COMPLETE, KIND_OPEN, Rules

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BUFFERED_COLUMNS",
    "JOB_SQL_SETTINGS",
    "OUTCOME_COLUMNS",
    "REJECTED_COLUMNS",
    "UNMATCHED_COLUMNS",
    "create_session",
    "job_session",
    "resolve_inputs",
    "run_job",
]

OUTCOME_COLUMNS = (
    "rule", "key", "op_id", "opened_at", "deadline", "outcome", "resolved_at", "latency_ms",
    "resolve_event_id",
)  # fmt: skip
UNMATCHED_COLUMNS = ("rule", "key", "event_id", "event_type", "event_time", "reason")
REJECTED_COLUMNS = ("event_id", "reason", "raw", "raw_bytes")
BUFFERED_COLUMNS = ("rule", "key", "event_id", "event_type", "event_time", "seq")

# The rows mapInArrow yields: one union schema, ``k`` says which output a row is for.
#   k="o" outcome:   id=op_id, t0=opened_at, t1=deadline, s=outcome, t2=resolved_at, ref=resolve id
#   k="u" unmatched: id=event_id, t0=event_time, s=reason, ref=event_type
#   k="b" buffered:  id=event_id, t0=event_time, t1=seq, ref=event_type
#   k="r" rejected:  id=event_id, s=reason, ref=raw (valid UTF-8), raw_bytes=its exact bytes
#   k="s" stats:     s=JSON of the partition's counters and timings
UNION_DDL = (
    "k string, rule int, key string, id string, t0 long, t1 long, s string, t2 long, ref string,"
    " raw_bytes binary"
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

    It also turns off PySpark's DataFrame call-site capture
    (``spark.python.sql.dataFrameDebugging.enabled``). With it on, every
    DataFrame or Column call made from Python walks the Python stack, tries to
    import IPython, and makes three extra py4j round trips. The pipeline builds
    its plans from about 200 such calls per micro-batch. Under cProfile, eight
    micro-batches of 2e4 orders took 37.8 s of driver time with the capture on,
    5.6 s of it in the capture's wrapper, and 31.2 s with it off. The call
    sites would only point into tickwheel's own code.
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
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
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


#: The SQL settings each pipeline job runs with, in its own child session.
#:
#: Both jobs cache frames that are mostly unique strings (raw record text, ids,
#: keys) for the few Spark jobs of one run or micro-batch. Compressing an
#: in-memory cache first hashes every string value into a dictionary, 10,000
#: rows at a time, before it gives up on a column of unique values: a JFR
#: profile of the incremental benchmark (1e6 orders) put 17 % of the JVM's
#: samples there. These caches are short-lived, so their CPU matters more than
#: their size.
JOB_SQL_SETTINGS = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}


def job_session(spark: SparkSession, settings: Mapping[str, str] | None = None) -> SparkSession:
    """A child of ``spark`` for one job: ``spark``'s SQL settings plus ``settings``.

    The child shares the SparkContext and the cache, and copies every SQL
    setting of ``spark`` that can be changed at run time; ``settings`` (default
    :data:`JOB_SQL_SETTINGS`) are applied on top. The caller's session is never
    changed, so a job's settings cannot leak into it or race with its other
    threads. O(settings).
    """
    child = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if key.startswith("spark.sql.") and spark.conf.isModifiable(key):
            child.conf.set(key, value)
    for key, value in (JOB_SQL_SETTINGS if settings is None else settings).items():
        child.conf.set(key, value)
    return child


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


def _iso_ms(ms: int | None) -> str:
    """Epoch milliseconds as ISO-8601 UTC, for messages. O(1)."""
    import datetime as dt

    if ms is None:
        return "never"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


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


# Record classes after dedup (column ``c`` of the frame that enters mapInArrow).
C_EVENT = 0  # kept event of a type some rule uses: one row per such rule
C_IGNORED = 1  # kept event of a type no rule uses: counted, its time raises the watermark
C_DUPLICATE = 2  # a copy with the kept record's content: counted only
C_CONFLICT = 3  # a copy with other content: rejected, reason "conflict"
C_REJECTED = 4  # invalid record: rejected with its reason

_PROC_COLUMNS = ("rule", "key", "time", "seq", "event_id", "kind", "event_type")


def _process_partition(
    rules: Rules, lateness_ms: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: one :class:`_PartitionRun` per partition.

    The global watermark is not known yet when this runs (it is the largest
    kept event time of all partitions), so every event is applied and the
    driver finalises the rows afterwards with the watermark ``W`` (see
    :func:`_finalise`). That is exact because a partition applies its events in
    time order: everything at or below ``W`` happens exactly as in a run that
    stops at ``W``. To let the driver find the events above ``W`` (the
    ``buffered`` output), the events above this partition's own lower bound of
    ``W`` (its largest event time minus the lateness) are also yielded, as
    ``k="b"`` rows. Non-event rows (``c`` > 0) are counted here; rejected and
    conflicting records pass through as ``k="r"`` rows without a Python loop.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _PartitionRun(rules, lateness_ms)
        try:
            for batch in batches:
                events = yield from partition.pass_through(batch)
                if events.num_rows:
                    yield from partition.apply(events)
            yield from partition.finish()
        finally:
            partition.proc.close()

    return run


class _PartitionRun:
    """One partition of the batch job: its processor, counters and timings."""

    def __init__(self, rules: Rules, lateness_ms: int) -> None:
        import pyarrow as pa

        from .core import PartitionProcessor

        self.started = time.perf_counter()
        self.pa, self.schema = pa, _union_schema(pa)
        self.lateness_ms = lateness_ms
        self.proc = PartitionProcessor(rules)
        self.loop_s = 0.0  # wall time of the loop
        self.loop_cpu = 0.0  # CPU time of this thread in the loop: robust to a busy machine
        self.events = self.kept = self.duplicates = self.ignored = 0
        self.max_time: int | None = None  # the largest kept event time seen here
        self.tail: list[Any] = []  # event batches that may hold events above the watermark

    def _saw(self, top: int) -> None:
        self.max_time = top if self.max_time is None else max(self.max_time, top)

    def pass_through(self, batch: Any) -> Generator[Any, None, Any]:
        """Count the batch's non-event rows and yield its rejected ones; return its events."""
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        cls = batch.column("c")
        if pc.all(pc.equal(cls, C_EVENT)).as_py():
            return batch
        other = batch.filter(pc.not_equal(cls, C_EVENT))
        codes = other.column("c")
        self.duplicates += pc.sum(pc.equal(codes, C_DUPLICATE)).as_py() or 0
        is_ignored = pc.equal(codes, C_IGNORED)
        n_ignored = pc.sum(is_ignored).as_py() or 0
        if n_ignored:
            self.ignored += n_ignored
            self._saw(pc.max(pc.filter(other.column("time"), is_ignored)).as_py())
        rej = other.filter(pc.greater_equal(codes, C_CONFLICT))
        if rej.num_rows:
            yield _batch(self.pa, self.schema, "r", self.pa.nulls(rej.num_rows, self.pa.int32()),
                         None, rej.column("event_id"), None, None, rej.column("reason"), None,
                         rej.column("raw"), raw_bytes=rej.column("raw_bytes"))  # fmt: skip
        return batch.filter(pc.equal(cls, C_EVENT))

    def apply(self, ev: Any) -> Iterator[Any]:
        """Run one batch of (sorted) events through the processor; yield its outcomes."""
        import pyarrow.compute as pc

        from .core import cyclic_gc_paused

        self.kept += pc.sum(pc.equal(ev.column("p"), 0)).as_py() or 0
        # The collector stays off from the columns' conversion to the
        # outcomes' batch, so it runs between batches, not within them:
        # see cyclic_gc_paused for why, and for what it costs otherwise.
        with cyclic_gc_paused():
            cols = [ev.column(name).to_pylist() for name in _PROC_COLUMNS]
            t, c = time.perf_counter(), time.thread_time()
            self.proc.process(zip(*cols, strict=True))
            self.loop_s += time.perf_counter() - t
            self.loop_cpu += time.thread_time() - c
            outcomes = self.proc.take_outcomes()
            out = (
                _outcome_batch(self.pa, self.schema, outcomes, pending=False) if outcomes else None
            )
        self.events += ev.num_rows
        top = cols[2][-1]  # events come sorted by time
        self._saw(top)
        self.tail.append(ev)
        while self.tail and self.tail[0].column("time")[-1].as_py() <= top - self.lateness_ms:
            self.tail.pop(0)
        if out is not None:
            yield out

    def finish(self) -> Iterator[Any]:
        """Yield the pending operations, the unmatched events, the events that may be
        buffered, and the partition's statistics row."""
        import pyarrow.compute as pc

        pa, schema = self.pa, self.schema
        pending = self.proc.pending_operations()
        if pending:
            yield _outcome_batch(pa, schema, pending, pending=True)
        unmatched = self.proc.take_unmatched()
        if unmatched:
            rule, key, event_id, event_type, event_time, reason = zip(*unmatched, strict=True)
            yield _batch(
                pa, schema, "u", rule, key, event_id, event_time, None, reason, None, event_type
            )
        if self.tail and self.max_time is not None:
            floor = self.max_time - self.lateness_ms
            for ev in self.tail:
                above = ev.filter(pc.greater(ev.column("time"), floor))
                if above.num_rows:
                    yield _batch(pa, schema, "b", above.column("rule"), above.column("key"),
                                 above.column("event_id"), above.column("time"),
                                 above.column("seq"), None, None,
                                 above.column("event_type"))  # fmt: skip
        stats = {
            "events": self.events,
            "kept": self.kept,
            "duplicates": self.duplicates,
            "ignored": self.ignored,
            "max_time": self.max_time,
            "loop_seconds": self.loop_s,
            "loop_cpu_seconds": self.loop_cpu,
            "udf_seconds": time.perf_counter() - self.started,
        }
        yield _batch(pa, schema, "s", [0], [None], [None], [None], [None], [json.dumps(stats)],
                     [None], [None])  # fmt: skip


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
            ("raw_bytes", pa.binary()),
        ]
    )


def _batch(pa: Any, schema: Any, k: str, rule: Any, key: Any, id_: Any, t0: Any, t1: Any,
           s: Any, t2: Any, ref: Any, raw_bytes: Any = None) -> Any:  # fmt: skip
    n = len(rule)
    arrays = []
    values = (rule, key, id_, t0, t1, s, t2, ref, raw_bytes)
    for value, column in zip(values, list(schema)[1:], strict=True):
        if value is None:
            arrays.append(pa.nulls(n, column.type))
        elif isinstance(value, pa.Array):  # an input column passed through: no Python loop
            arrays.append(value if value.type == column.type else value.cast(column.type))
        else:
            arrays.append(pa.array(value, column.type))
    return pa.RecordBatch.from_arrays([pa.array([k] * n, pa.string()), *arrays], schema=schema)


def _outcome_batch(pa: Any, schema: Any, rows: list[Any], pending: bool) -> Any:
    if pending:
        rule, key, op_id, opened, deadline = zip(*rows, strict=True)
        return _batch(
            pa, schema, "o", rule, key, op_id, opened, deadline, ["pending"] * len(rule), None, None
        )
    rule, key, op_id, opened, deadline, outcome, at, ref = zip(*rows, strict=True)
    return _batch(pa, schema, "o", rule, key, op_id, opened, deadline, outcome, at, ref)


def _missing_file_rows(spark: SparkSession, parsed: DataFrame, paths: list[str]) -> DataFrame:
    """Rows shaped like ``parsed`` rejecting each of ``paths`` (raw = the file's name)."""
    from pyspark.sql import functions as F

    given = spark.createDataFrame(
        [(os.path.basename(p), MISSING_FILE) for p in paths], "raw string, reason string"
    )
    return given.select(
        *[
            F.col(f.name)
            if f.name in ("raw", "reason")
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in parsed.schema.fields
        ]
    )


def _rule_name(rules: Rules) -> Any:
    from pyspark.sql import functions as F

    return F.element_at(F.array(*[F.lit(n) for n in rules.names]), F.col("rule") + 1)


def _classify(parsed: DataFrame, rules: Rules) -> DataFrame:
    """Deduplicate by event id and give each record its class ``c`` (``C_*``).

    One window over every record, so the input is read and parsed once: valid
    records (reason null) are ranked per event id by (time, sequence, raw text);
    invalid ones fall in windows of their own reason and are all rejected. Raw
    text is kept only where an output needs it (rejected records).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key_cols = [key_column(i) for i in range(len(rules.key_fields))]
    content = F.struct("event_type", "time", "seq", *key_cols)
    window = Window.partitionBy("reason", "event_id").orderBy("time", "seq", "raw")
    ranked = parsed.select(
        "*",
        F.row_number().over(window).alias("rn"),
        F.first(content).over(window).alias("kept"),
    )
    cls = (
        F.when(F.col("reason").isNotNull(), F.lit(C_REJECTED))
        .when(
            F.col("rn") == 1,
            F.when(F.col("relevant"), F.lit(C_EVENT)).otherwise(F.lit(C_IGNORED)),
        )
        .when(F.col("kept") == content, F.lit(C_DUPLICATE))
        .otherwise(F.lit(C_CONFLICT))
    )
    text, exact = raw_text_columns(F.col("raw"))
    return ranked.select(
        cls.cast("int").alias("c"),
        F.when(cls == C_CONFLICT, F.lit("conflict")).otherwise(F.col("reason")).alias("reason"),
        F.when(cls >= C_CONFLICT, text).alias("raw"),
        F.when(cls >= C_CONFLICT, exact).alias("raw_bytes"),
        "event_id",
        "event_type",
        "time",
        "seq",
        *key_cols,
    )


def _rows_for_processor(classified: DataFrame, rules: Rules) -> DataFrame:
    """One row per (kept event, rule that uses its type), one per other record.

    Columns: rule, key, time, seq, event_id, kind, event_type (what the
    processor takes) and c, p (0 on the first row of an event: counts events
    once), reason, raw. A record that is not a rule event gets
    ``rule = -1`` and its event id as key, so those rows spread over the
    partitions too.
    """
    from pyspark.sql import functions as F

    key_index = {name: i for i, name in enumerate(rules.key_fields)}

    def kind_of(rule_index: int) -> Any:
        rule = rules.rules[rule_index]
        return (
            F.when(F.col("event_type").isin(list(rule.open)), F.lit(KIND_OPEN))
            .when(F.col("event_type").isin(list(rule.complete)), F.lit(KIND_COMPLETE))
            .otherwise(F.lit(KIND_CANCEL))
        )

    is_event = F.col("c") == C_EVENT
    if len(rules.rules) == 1:
        rule_col = F.when(is_event, F.lit(0)).otherwise(F.lit(-1))
        key_col = F.when(is_event, F.col(key_column(key_index[rules.rules[0].key]))).otherwise(
            F.col("event_id")
        )
        kind_col = F.when(is_event, kind_of(0)).otherwise(F.lit(-1))
        frame = classified.select(
            "*",
            rule_col.alias("_r"),
            key_col.alias("_k"),
            kind_col.alias("_i"),
            F.lit(0).alias("_p"),
        )
    else:
        # One entry per rule that uses the type; explode is a single pass, unlike
        # a union of one filtered copy per rule.
        entries = [
            F.when(
                F.col("event_type").isin([*rule.open, *rule.complete, *rule.cancel]),
                F.struct(
                    F.lit(index).alias("r"),
                    F.col(key_column(key_index[rule.key])).alias("k"),
                    kind_of(index).alias("i"),
                ),
            )
            for index, rule in enumerate(rules.rules)
        ]
        other = F.array(
            F.struct(F.lit(-1).alias("r"), F.col("event_id").alias("k"), F.lit(-1).alias("i"))
        )
        chosen = F.when(is_event, F.filter(F.array(*entries), lambda e: e.isNotNull())).otherwise(
            other
        )
        frame = classified.select("*", F.posexplode(chosen).alias("_p", "_e")).select(
            "*", F.col("_e.r").alias("_r"), F.col("_e.k").alias("_k"), F.col("_e.i").alias("_i")
        )
    return frame.select(
        F.col("_r").cast("int").alias("rule"),
        F.col("_k").alias("key"),
        "time",
        "seq",
        "event_id",
        F.col("_i").cast("int").alias("kind"),
        "event_type",
        "c",
        F.col("_p").cast("int").alias("p"),
        "reason",
        "raw",
        "raw_bytes",
    )


def _write(frame: DataFrame, path: str, fmt: str) -> None:
    """Write one output; CSV cannot hold binary, so its binary columns become base64."""
    writer = frame.write.mode("overwrite")
    if fmt == "parquet":
        writer.parquet(path)
    elif fmt == "csv":
        writer = text_columns(frame).write.mode("overwrite")
        writer.option("header", True).csv(path)
    elif fmt == "json":
        writer.json(path)
    else:
        raise ValueError(f"output format must be parquet, csv or json, got {fmt!r}")


def text_columns(frame: DataFrame) -> DataFrame:
    """``frame`` with each binary column as base64 text (Spark's JSON writer's encoding). O(1)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    return frame.select(
        *[
            F.base64(F.col(f.name)).alias(f.name)
            if isinstance(f.dataType, T.BinaryType)
            else F.col(f.name)
            for f in frame.schema.fields
        ]
    )


def _finalise(results: DataFrame, rules: Rules, watermark: int | None) -> dict[str, DataFrame]:
    """The outputs from mapInArrow's rows, given the global watermark ``W``.

    The partitions applied every event (the watermark was not known yet); a run
    that stops at ``W`` differs only above it, so:

    * an operation opened above ``W`` does not exist yet (its event is buffered);
    * one resolved above ``W`` (by an event, or its deadline) is still ``pending``;
    * one still pending whose deadline is at or before ``W`` has expired then;
    * an unmatched event above ``W`` is buffered, not unmatched;
    * the ``b`` rows above ``W`` are the buffered events.
    """
    from pyspark.sql import functions as F

    w = F.lit(watermark).cast("long")
    name = _rule_name(rules)
    k, s, t0, t1, t2 = F.col("k"), F.col("s"), F.col("t0"), F.col("t1"), F.col("t2")
    expires = (s == "pending") & (t1 <= w)
    reopened = (s != "pending") & (t2 > w)
    resolved_at = F.when(expires, t1).when(reopened, F.lit(None).cast("long")).otherwise(t2)
    outcomes = results.filter((k == "o") & (t0 <= w)).select(
        name.alias("rule"),
        "key",
        F.col("id").alias("op_id"),
        t0.alias("opened_at"),
        t1.alias("deadline"),
        F.when(expires, F.lit("expired"))
        .when(reopened, F.lit("pending"))
        .otherwise(s)
        .alias("outcome"),
        resolved_at.alias("resolved_at"),
        (resolved_at - t0).alias("latency_ms"),
        F.when(reopened, F.lit(None).cast("string"))
        .otherwise(F.col("ref"))
        .alias("resolve_event_id"),
    )
    unmatched = results.filter((k == "u") & (t0 <= w)).select(
        name.alias("rule"),
        "key",
        F.col("id").alias("event_id"),
        F.col("ref").alias("event_type"),
        t0.alias("event_time"),
        s.alias("reason"),
    )
    buffered = results.filter((k == "b") & (t0 > w)).select(
        name.alias("rule"),
        "key",
        F.col("id").alias("event_id"),
        F.col("ref").alias("event_type"),
        t0.alias("event_time"),
        t1.alias("seq"),
    )
    rejected = results.filter(k == "r").select(
        F.col("id").alias("event_id"), s.alias("reason"), F.col("ref").alias("raw"), "raw_bytes"
    )
    return {
        "outcomes": outcomes,
        "unmatched": unmatched,
        "rejected": rejected,
        "buffered": buffered,
    }


@dataclass
class _Phases:
    """The job's progress lines and the seconds of each phase."""

    say: Progress
    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=dict)
    _last: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def line(self, message: str) -> None:
        self.say(f"[{self.elapsed():7.1f}s] {message}")

    def end(self, name: str, message: str) -> None:
        now = self.elapsed()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now
        self.line(message)


@dataclass(frozen=True)
class _LoopStats:
    """The partitions' own counters (their ``k="s"`` rows), summed."""

    partitions: int
    max_time: int | None
    events: int
    kept: int
    duplicates: int
    ignored: int
    loop_s: float
    loop_cpu: float
    udf_s: float

    @classmethod
    def collect(cls, results: DataFrame) -> _LoopStats:
        from pyspark.sql import functions as F

        rows = [json.loads(r["s"]) for r in results.filter(F.col("k") == "s").collect()]
        tops = [s["max_time"] for s in rows if s["max_time"] is not None]
        return cls(
            partitions=len(rows),
            max_time=max(tops) if tops else None,
            **{
                name: sum(s[key] for s in rows)
                for name, key in (
                    ("events", "events"),
                    ("kept", "kept"),
                    ("duplicates", "duplicates"),
                    ("ignored", "ignored"),
                    ("loop_s", "loop_seconds"),
                    ("loop_cpu", "loop_cpu_seconds"),
                    ("udf_s", "udf_seconds"),
                )
            },
        )

    def rate(self) -> float:
        """Events per CPU second of the loop (per core)."""
        return self.events / self.loop_cpu if self.loop_cpu else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "seconds": round(self.loop_s, 3),
            "cpu_seconds": round(self.loop_cpu, 3),
            "events_per_s": round(self.rate(), 1) if self.loop_cpu else None,
            "events_per_wall_s": round(self.events / self.loop_s, 1) if self.loop_s else None,
            "udf_seconds": round(self.udf_s, 3),
            "note": (
                "per-partition purgatory loop measured inside mapInArrow; events_per_s is "
                "per core (events / CPU seconds of the loop), events_per_wall_s uses wall time"
            ),
        }


@dataclass
class _OutputCounts:
    """Rows per output and reason, and exact latency percentiles per outcome."""

    outcomes: dict[str, int] = field(default_factory=dict)
    unmatched: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    buffered: int = 0

    @classmethod
    def of(cls, rows: list[Any]) -> _OutputCounts:
        """From the rows of :func:`_count_outputs`' aggregate."""
        counts = cls()
        for row in rows:
            group, n = row["g"], row["n"]
            if group.startswith("o:"):
                outcome = group[2:]
                counts.outcomes[outcome] = n
                if outcome != "pending":
                    p = row["p"]
                    counts.latency[outcome] = (
                        None if p is None else {"p50": p[0], "p90": p[1], "p99": p[2]}
                    )
            elif group.startswith("u:"):
                counts.unmatched[group[2:]] = n
            elif group == "b":
                counts.buffered = n
            elif group == "r":
                counts.rejected[row["r"]] = n
        return counts


def _check_options(
    spark: SparkSession, partitions: int | None, output_format: str, max_future_ms: int | None
) -> int:
    """Validate run_job's options; return the partition count."""
    if output_format not in ("parquet", "csv", "json"):
        raise ValueError(f"output format must be parquet, csv or json, got {output_format!r}")
    if partitions is None:
        partitions = spark.sparkContext.defaultParallelism
    if type(partitions) is not int or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    if max_future_ms is not None and (type(max_future_ms) is not int or max_future_ms < 0):
        raise ValueError(f"max_future_ms must be an int >= 0 or None, got {max_future_ms!r}")
    return partitions


@contextlib.contextmanager
def _stage_progress(spark: SparkSession, phases: _Phases, on: bool) -> Iterator[None]:
    """While the body runs, report the Spark stages' progress (when ``on``)."""
    stop = threading.Event()
    watcher = threading.Thread(
        target=_watch_stages,
        args=(spark, phases.say, phases.started, stop),
        name="tickwheel-progress",
        daemon=True,
    )
    if on:
        watcher.start()
    try:
        yield
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=10)


def _purgatory_rows(
    spark: SparkSession, rules: Rules, files: list[str], partitions: int, future_limit: int | None
) -> DataFrame:
    """Steps 1–5, one Spark job: read, validate, dedup, repartition, sort, mapInArrow.

    The rows are persisted: the caller unpersists them.
    """
    from pyspark import StorageLevel

    # A file listed, then removed before it was read: one rejected row.
    present = [f for f in files if os.path.exists(f)]
    parsed = parse_records(read_records(spark, present, rules), rules, future_limit)
    if len(present) < len(files):
        gone = [f for f in files if f not in set(present)]
        parsed = parsed.unionByName(_missing_file_rows(spark, parsed, gone))
    rows = _rows_for_processor(_classify(parsed, rules), rules)
    return (
        rows.repartition(partitions, "rule", "key")
        .sortWithinPartitions("time", "seq", "event_id", "rule")
        .mapInArrow(_process_partition(rules, rules.input.allowed_lateness_ms), UNION_DDL)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )


def _count_outputs(tables: Mapping[str, DataFrame]) -> DataFrame:
    """One aggregate over the outputs: rows per output and reason, latency percentiles."""
    from pyspark.sql import functions as F

    def part(name: str, k: str, outcome: bool, reason: bool, latency: bool) -> DataFrame:
        return tables[name].select(
            F.lit(k).alias("k"),
            F.col("outcome") if outcome else F.lit(None).cast("string").alias("outcome"),
            F.col("reason") if reason else F.lit(None).cast("string").alias("reason"),
            F.col("latency_ms") if latency else F.lit(None).cast("long").alias("latency_ms"),
        )

    counted = (
        part("outcomes", "o", True, False, True)
        .unionByName(part("unmatched", "u", False, True, False))
        .unionByName(part("buffered", "b", False, False, False))
        .unionByName(part("rejected", "r", False, True, False))
    )
    group = (
        F.when(F.col("k") == "o", F.concat(F.lit("o:"), F.col("outcome")))
        .when(F.col("k") == "u", F.concat(F.lit("u:"), F.col("reason")))
        .otherwise(F.col("k"))
    )
    return counted.groupBy(
        group.alias("g"), F.when(F.col("k") == "r", F.col("reason")).alias("r")
    ).agg(
        F.count(F.lit(1)).alias("n"),
        F.percentile(F.col("latency_ms"), F.array(*[F.lit(q) for q in (0.5, 0.9, 0.99)])).alias(
            "p"
        ),
    )


def _write_outputs(tables: Mapping[str, DataFrame], out: Path, output_format: str) -> list[Any]:
    """Write the four outputs and collect :func:`_count_outputs`; return its rows.

    The writes and the aggregate only read the persisted rows: submitted
    together, their fixed costs overlap.
    """
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(tables) + 1) as pool:
        writes = [
            pool.submit(_write, frame, str(out / name), output_format)
            for name, frame in tables.items()
        ]
        rows = pool.submit(_count_outputs(tables).collect).result()
        for future in writes:
            future.result()
    return rows


def run_job(
    spark: SparkSession,
    rules: Rules,
    input_path: str,
    output_dir: str,
    partitions: int | None = None,
    output_format: str = "parquet",
    progress: Progress | None = None,
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """Run the batch pipeline; write the outputs and ``summary.json``; return the summary.

    ``partitions`` is the number of key-hash partitions (default: Spark's default
    parallelism). ``progress`` receives one line per phase with counts and the
    elapsed time. ``max_future_ms`` is the far-future guard: a record stamped
    later than ``now_ms`` (default: the clock at the start) plus it is rejected
    as ``far_future`` instead of moving the watermark; None turns it off.

    Cost: one Spark job reads, parses, deduplicates (one shuffle by event id),
    repartitions by key (a second shuffle) and runs the purgatory, keeping its
    rows in memory; the outputs and the summary are then small jobs over those
    rows, run concurrently.
    """
    partitions = _check_options(spark, partitions, output_format, max_future_ms)
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    future_limit = None if max_future_ms is None else now_ms + max_future_ms
    phases = _Phases(progress if progress is not None else (lambda _msg: None))
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = resolve_inputs(input_path, rules.input.format)
    lateness = rules.input.allowed_lateness_ms
    spark = job_session(
        spark, {**JOB_SQL_SETTINGS, "spark.sql.shuffle.partitions": str(max(partitions, 2))}
    )
    phases.line(f"reading {len(files)} {rules.input.format} file(s) from {input_path}")
    with _stage_progress(spark, phases, on=progress is not None):
        results = _purgatory_rows(spark, rules, files, partitions, future_limit)
        try:
            loop = _LoopStats.collect(results)
            watermark = None if loop.max_time is None else loop.max_time - lateness
            phases.end(
                "read_dedup_purgatory",
                f"parsed and deduplicated ({loop.duplicates:,} duplicates, {loop.ignored:,} "
                f"ignored); ran {loop.partitions} partition(s) through the purgatory: "
                f"{loop.events:,} rule events, loop {loop.rate():,.0f} events/s per core; "
                f"watermark {watermark}",
            )
            tables = _finalise(results, rules, watermark)
            counts = _OutputCounts.of(_write_outputs(tables, out, output_format))
        finally:
            results.unpersist()
    n_rejected = sum(counts.rejected.values())
    conflicts = counts.rejected.get("conflict", 0)
    far_future = counts.rejected.get("far_future", 0)
    events = loop.kept + loop.ignored
    records = events + loop.duplicates + n_rejected
    phases.end(
        "write",
        f"wrote rejected/ ({n_rejected:,} records, {conflicts:,} conflicts), outcomes/ ("
        + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.outcomes.items()))
        + f"), unmatched/ ({sum(counts.unmatched.values()):,}) and buffered/ "
        f"({counts.buffered:,})",
    )
    if far_future:
        phases.line(
            f"rejected {far_future:,} far_future record(s): event time after "
            f"{_iso_ms(future_limit)} (--max-future; 'off' to accept)"
        )
    job_s = phases.elapsed()
    summary: dict[str, Any] = {
        "input": input_path,
        "input_files": len(files),
        "output": str(out),
        "format": output_format,
        "rules": [{"name": r.name, "key": r.key, "timeout_ms": r.timeout_ms} for r in rules.rules],
        "partitions": partitions,
        "allowed_lateness_ms": lateness,
        "max_future_ms": max_future_ms,
        "far_future_after_ms": future_limit,
        "max_event_time": loop.max_time,
        "watermark": watermark,
        "counts": {
            "records": records,
            "rejected": n_rejected,
            "rejected_by_reason": dict(sorted(counts.rejected.items())),
            "duplicates": loop.duplicates,
            "conflicts": conflicts,
            "events": events,
            "ignored": loop.ignored,
            "rule_events": loop.events,
            "buffered": counts.buffered,
            "outcomes": dict(sorted(counts.outcomes.items())),
            "unmatched": dict(sorted(counts.unmatched.items())),
        },
        "latency_ms": dict(sorted(counts.latency.items())),
        "seconds": round(job_s, 3),
        "phases_seconds": phases.seconds,
        "events_per_s": round(records / job_s, 1) if job_s else None,
        "loop": loop.summary(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    phases.line(f"done: {records:,} records, {summary['events_per_s']:,} records/s")
    return summary
