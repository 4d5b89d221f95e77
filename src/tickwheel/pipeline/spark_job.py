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
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .events import (
    DEFAULT_MAX_FUTURE_MS,
    MISSING_FILE,
    key_column,
    parameter,
    parse_records,
    raw_text_columns,
    read_records,
    run_parameters,
)
from .rules import KIND_CANCEL, KIND_COMPLETE, KIND_OPEN, Rules

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BUFFERED_COLUMNS",
    "JOB_SQL_SETTINGS",
    "OUTCOME_COLUMNS",
    "QUICK_JIT_MAX_INPUT_BYTES",
    "REJECTED_COLUMNS",
    "UNMATCHED_COLUMNS",
    "create_session",
    "job_session",
    "quick_jit_for",
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

Progress = Callable[[str], None]


#: A batch run on a local master over at most this much input is short enough
#: that the JVM's optimising compiler costs more than it saves (see
#: :func:`quick_jit_for`).
QUICK_JIT_MAX_INPUT_BYTES = 96 * 2**20
QUICK_JIT_OPTIONS = "-XX:TieredStopAtLevel=1"


def quick_jit_for(master: str, input_bytes: int) -> bool:
    """Whether a fresh JVM for a batch run should compile with C1 only. O(1).

    HotSpot compiles hot code twice: quickly (C1), then optimised (C2). On a
    run of a few seconds, C2's compilations are most of the JVM's CPU and
    finish too late to pay back: on a fresh JVM (``local[2]``, 2 vCPUs,
    ``benchmarks/profile_pipeline.py --runs 1``, 2026-11-25) the batch job over
    1e5 orders (20 MB) took 14.0 s with both compilers and 10.4 s with C1
    only (JVM CPU 23.6 s against 13.7 s); over 3e5 orders (58 MB) 22.6–25.9 s
    against 19.9–20.0 s. Over 1e6 orders (191 MB) C2 pays: 31.4 s against
    35.7 s. So: C1 only for a local master and at most
    :data:`QUICK_JIT_MAX_INPUT_BYTES` of input. A cluster's executors are
    long-lived JVMs, and are left alone.
    """
    return master.startswith("local") and input_bytes <= QUICK_JIT_MAX_INPUT_BYTES


#: The Python worker daemon of local sessions (see :mod:`._worker_daemon`).
WORKER_DAEMON = "tickwheel.pipeline._worker_daemon"


def create_session(
    master: str = "local[2]",
    app_name: str = "tickwheel-pipeline",
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
    quick_jit: bool = False,
    class_archive: str | os.PathLike[str] | None = None,
) -> SparkSession:
    """Start (or get) a SparkSession set up for the pipeline.

    ``quick_jit`` starts the JVM with C1 only (:data:`QUICK_JIT_OPTIONS`; see
    :func:`quick_jit_for`); ``class_archive`` maps a checked class-data
    archive, with the class path it was recorded with (see
    :mod:`._class_archive`). Both have no effect when a JVM is
    already running, and ``spark.driver.extraJavaOptions`` in ``conf``
    replaces them.

    Sets ``PYSPARK_PYTHON`` to this interpreter (else workers fall back to the
    system python), ``SPARK_LOCAL_IP`` to loopback when unset, turns off the UI
    and Spark's console progress bar, and keeps the log at WARN. On a local
    master the Python workers import PySpark from the installed package, not
    from ``pyspark.zip`` (:data:`WORKER_DAEMON`), which saves a fresh worker
    daemon about a second of compiling.

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
    from ._class_archive import java_options, session_conf

    jvm_options = [QUICK_JIT_OPTIONS] if quick_jit else []
    jvm_options += java_options(class_archive)
    if jvm_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(jvm_options))
    if class_archive is not None:  # the class path the archive was recorded with
        for name, value in session_conf().items():
            builder = builder.config(name, value)
    if master.startswith("local"):  # the workers run this interpreter: see _worker_daemon
        builder = builder.config("spark.python.daemon.module", WORKER_DAEMON)
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


#: The SQL settings each pipeline job runs with, in its own child session.
#:
#: * No compression of in-memory caches. Both jobs cache frames that are
#:   mostly unique strings (raw record text, ids, keys) for the few Spark jobs
#:   of one run or micro-batch. Compressing a cache first hashes every string
#:   value into a dictionary, 10,000 rows at a time, before it gives up on a
#:   column of unique values: a JFR profile of the incremental benchmark (1e6
#:   orders) put 17 % of the JVM's samples there. These caches are
#:   short-lived, so their CPU matters more than their size.
#: * No adaptive query execution. The jobs have no joins and set their own
#:   partition counts, so AQE has nothing to re-plan, but it still splits each
#:   query into stages planned one after another. Measured on a fresh JVM
#:   (``benchmarks/profile_pipeline.py --runs 1``, 1e5 orders, 2026-11-25): the
#:   batch job's first run took 10.0 s without it against 11.2–11.6 s with
#:   it, two stages fewer; warm at 1e6 both took 14.3–14.8 s.
JOB_SQL_SETTINGS = {
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    "spark.sql.adaptive.enabled": "false",
}


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


# Record classes after dedup (column ``c`` of the classified records).
C_EVENT = 0  # kept event of a type some rule uses: its rules' events
C_IGNORED = 1  # kept event of a type no rule uses: counted, its time raises the watermark
C_DUPLICATE = 2  # a copy with the kept record's content: counted only
C_CONFLICT = 3  # a copy with other content: rejected, reason "conflict"
C_REJECTED = 4  # invalid record: rejected with its reason


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

    One window over every record (:func:`._dedup.rank_copies`), so the input is
    read and parsed once: valid records (reason null) are ranked per event id
    by (time, sequence, raw text); invalid ones fall in windows of their own
    reason and are all rejected. Raw text is kept only where an output needs
    it (rejected records). Lazy.
    """
    from pyspark.sql import functions as F

    from ._dedup import rank_copies

    key_cols = [key_column(i) for i in range(len(rules.key_fields))]
    ranked = rank_copies(
        parsed,
        by=["reason", "event_id"],
        order=["time", "seq", "raw"],
        content=["event_type", "time", "seq", *key_cols],
    )
    cls = (
        F.when(F.col("reason").isNotNull(), F.lit(C_REJECTED))
        .when(
            F.col("_rn") == 1,
            F.when(F.col("relevant"), F.lit(C_EVENT)).otherwise(F.lit(C_IGNORED)),
        )
        .when(F.col("_same"), F.lit(C_DUPLICATE))
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


def _rule_events(classified: DataFrame, rules: Rules) -> DataFrame:
    """The kept events as the processor takes them: one row per (event, rule using its type).

    Columns :data:`~._batch_partition.EVENT_COLUMNS`: rule (index), key,
    time, seq, event_id, kind, event_type. Lazy.
    """
    from pyspark.sql import functions as F

    key_index = {name: i for i, name in enumerate(rules.key_fields)}
    events = classified.where(F.col("c") == C_EVENT)

    def kind_of(rule_index: int) -> Any:
        rule = rules.rules[rule_index]
        return (
            F.when(F.col("event_type").isin(list(rule.open)), F.lit(KIND_OPEN))
            .when(F.col("event_type").isin(list(rule.complete)), F.lit(KIND_COMPLETE))
            .otherwise(F.lit(KIND_CANCEL))
        )

    if len(rules.rules) == 1:
        rule_col, kind_col = F.lit(0), kind_of(0)
        key_col = F.col(key_column(key_index[rules.rules[0].key]))
        frame = events
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
        frame = events.select(
            "*", F.explode(F.filter(F.array(*entries), lambda e: e.isNotNull())).alias("_e")
        )
        rule_col, key_col, kind_col = F.col("_e.r"), F.col("_e.k"), F.col("_e.i")
    return frame.select(
        rule_col.cast("int").alias("rule"),
        key_col.alias("key"),
        "time",
        "seq",
        "event_id",
        kind_col.cast("int").alias("kind"),
        "event_type",
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


def _outputs(classified: DataFrame, rows: DataFrame, rules: Rules) -> dict[str, DataFrame]:
    """The four output tables. Lazy.

    ``rows`` (the partitions' final rows) give ``outcomes``, ``unmatched`` and
    ``buffered``; ``rejected`` comes from the classified records, with no
    Python step.
    """
    from pyspark.sql import functions as F

    from ._batch_partition import K_BUFFERED, K_OUTCOME, K_UNMATCHED

    name = _rule_name(rules)
    k, t0, t2 = F.col("k"), F.col("t0"), F.col("t2")
    outcomes = rows.where(k == K_OUTCOME).select(
        name.alias("rule"),
        "key",
        F.col("id").alias("op_id"),
        t0.alias("opened_at"),
        F.col("t1").alias("deadline"),
        F.col("s").alias("outcome"),
        t2.alias("resolved_at"),
        (t2 - t0).alias("latency_ms"),
        F.col("ref").alias("resolve_event_id"),
    )
    unmatched = rows.where(k == K_UNMATCHED).select(
        name.alias("rule"),
        "key",
        F.col("id").alias("event_id"),
        F.col("ref").alias("event_type"),
        t0.alias("event_time"),
        F.col("s").alias("reason"),
    )
    buffered = rows.where(k == K_BUFFERED).select(
        name.alias("rule"),
        "key",
        F.col("id").alias("event_id"),
        F.col("ref").alias("event_type"),
        t0.alias("event_time"),
        F.col("t1").alias("seq"),
    )
    rejected = classified.where(F.col("c") >= C_CONFLICT).select(
        "event_id", "reason", "raw", "raw_bytes"
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
class _RecordCounts:
    """What the classified records hold: rows per class, rejects per reason, the max time."""

    kept: int  # kept events some rule uses
    ignored: int
    duplicates: int
    rejected: dict[str, int]
    max_time: int | None  # the largest kept event time: the watermark's base

    @classmethod
    def collect(cls, classified: DataFrame) -> _RecordCounts:
        """One aggregate over the classified records (the first action on them)."""
        from pyspark.sql import functions as F

        kept = F.col("c").isin(C_EVENT, C_IGNORED)
        rows = (
            classified.groupBy("c", F.when(F.col("c") >= C_CONFLICT, F.col("reason")).alias("r"))
            .agg(F.count(F.lit(1)).alias("n"), F.max(F.when(kept, F.col("time"))).alias("top"))
            .collect()
        )
        by_class = Counter[int]()
        rejected: dict[str, int] = {}
        tops = []
        for row in rows:
            by_class[row["c"]] += row["n"]
            if row["c"] >= C_CONFLICT:
                rejected[row["r"]] = rejected.get(row["r"], 0) + row["n"]
            if row["top"] is not None:
                tops.append(row["top"])
        return cls(
            kept=by_class[C_EVENT],
            ignored=by_class[C_IGNORED],
            duplicates=by_class[C_DUPLICATE],
            rejected=dict(sorted(rejected.items())),
            max_time=max(tops) if tops else None,
        )


@dataclass(frozen=True)
class _LoopStats:
    """The partitions' own counters (their ``K_STATS`` rows), summed."""

    partitions: int
    events: int  # rule events
    applied: int  # of which at or below the watermark, run through the loop
    buffered: int  # of which above it
    outcomes: dict[str, int]
    unmatched: dict[str, int]
    latency: dict[str, Any]  # outcome -> exact p50, p90, p99 of latency_ms
    loop_s: float
    loop_cpu: float
    udf_s: float

    @classmethod
    def collect(cls, rows: DataFrame) -> _LoopStats:
        """The counters rows of the partitions (the first action on ``rows``).

        The latency percentiles are exact: each partition sends its latencies
        sorted, and they are merged here (a few MB at 1e6 operations), which
        costs less than Spark's ``percentile`` aggregate over the rows.
        """
        import heapq

        from pyspark.sql import functions as F

        from ._batch_partition import K_STATS, exact_percentile, read_latencies

        stats, latencies = [], defaultdict(list)
        for row in rows.where(F.col("k") == K_STATS).select("s", "b").collect():
            one = json.loads(row["s"])
            stats.append(one)
            for outcome, values in read_latencies(one, bytes(row["b"])).items():
                latencies[outcome].append(values)
        outcomes: Counter[str] = Counter()
        unmatched: Counter[str] = Counter()
        for s in stats:
            outcomes.update(s["outcomes"])
            unmatched.update(s["unmatched"])
        latency = {}
        for outcome, parts in sorted(latencies.items()):
            ordered = list(heapq.merge(*parts))
            p50, p90, p99 = (exact_percentile(ordered, q) for q in (0.5, 0.9, 0.99))
            latency[outcome] = {"p50": p50, "p90": p90, "p99": p99}
        return cls(
            partitions=len(stats),
            events=sum(s["events"] for s in stats),
            applied=sum(s["applied"] for s in stats),
            buffered=sum(s["buffered"] for s in stats),
            outcomes=dict(sorted(outcomes.items())),
            unmatched=dict(sorted(unmatched.items())),
            latency=latency,
            loop_s=sum(s["loop_seconds"] for s in stats),
            loop_cpu=sum(s["loop_cpu_seconds"] for s in stats),
            udf_s=sum(s["udf_seconds"] for s in stats),
        )

    def rate(self) -> float:
        """Events per CPU second of the loop (per core)."""
        return self.applied / self.loop_cpu if self.loop_cpu else 0.0

    def summary(self) -> dict[str, Any]:
        """The summary's ``loop`` entry."""
        return {
            "events": self.events,
            "applied": self.applied,
            "seconds": round(self.loop_s, 3),
            "cpu_seconds": round(self.loop_cpu, 3),
            "events_per_s": round(self.rate(), 1) if self.loop_cpu else None,
            "events_per_wall_s": round(self.applied / self.loop_s, 1) if self.loop_s else None,
            "udf_seconds": round(self.udf_s, 3),
            "note": (
                "per-partition purgatory loop measured inside mapInArrow: events counts the "
                "run's rule events, applied those at or below the watermark, which the loop "
                "ran; events_per_s is per core (applied / CPU seconds of the loop), "
                "events_per_wall_s uses wall time"
            ),
        }


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


def _described(spark: SparkSession, text: str, action: Callable[[], Any]) -> Any:
    """Run ``action`` with ``text`` as its Spark jobs' description (as the UI shows it).

    The description is a property of the calling thread, so concurrent
    actions, each in its own thread, keep their own.
    """
    spark.sparkContext.setJobDescription(f"tickwheel batch: {text}")
    try:
        return action()
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]


def _classified_records(
    spark: SparkSession, rules: Rules, files: list[str], future_limit: int | None
) -> DataFrame:
    """Steps 1–2: read, validate and deduplicate every record. Persisted: the caller unpersists."""
    from pyspark import StorageLevel

    # A file listed, then removed before it was read: one rejected row.
    present = [f for f in files if os.path.exists(f)]
    records = read_records(spark, present, rules)
    if future_limit is None:
        parsed = parse_records(records, rules)
    else:  # the limit moves with the clock: a parameter, so the code stays the same
        limit = run_parameters(spark, limit=future_limit)
        parsed = parse_records(records.crossJoin(limit), rules, parameter("limit"))
    if len(present) < len(files):
        gone = [f for f in files if f not in set(present)]
        parsed = parsed.unionByName(_missing_file_rows(spark, parsed, gone))
    return _classify(parsed, rules).persist(StorageLevel.MEMORY_AND_DISK)


def _purgatory_rows(
    classified: DataFrame, rules: Rules, partitions: int, watermark: int | None
) -> DataFrame:
    """Steps 3–5: the kept events by (rule, key), sorted, through mapInArrow.

    Persisted: the caller unpersists.
    """
    from pyspark import StorageLevel

    from ._batch_partition import ROWS_DDL, partition_function

    return (
        _rule_events(classified, rules)
        .repartition(partitions, "rule", "key")
        .sortWithinPartitions("time", "seq", "event_id", "rule")
        .mapInArrow(partition_function(rules, watermark), ROWS_DDL)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )


def _write_outputs(
    spark: SparkSession, tables: Mapping[str, DataFrame], out: Path, output_format: str
) -> None:
    """Write the four outputs concurrently.

    Each reads persisted rows only: submitted together, their fixed costs
    (planning, code generation, the committer) overlap.
    """
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    with ThreadPoolExecutor(max_workers=len(tables)) as pool:
        writes = [
            pool.submit(
                _described, spark, f"write {name}/",
                partial(_write, frame, str(out / name), output_format),
            )
            for name, frame in tables.items()
        ]  # fmt: skip
        for future in writes:
            future.result()


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

    Cost: one Spark job reads, parses and deduplicates (one shuffle by event
    id), keeping the classified records in memory; a second repartitions the
    kept events by key (a second shuffle) and runs the purgatory, keeping its
    rows; the outputs and the summary are then small jobs over those, run
    concurrently.
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
        classified = _classified_records(spark, rules, files, future_limit)
        try:
            records = _described(
                spark, "read, validate, deduplicate", lambda: _RecordCounts.collect(classified)
            )
            watermark = None if records.max_time is None else records.max_time - lateness
            phases.end(
                "read_dedup",
                f"parsed and deduplicated ({records.duplicates:,} duplicates, "
                f"{records.ignored:,} ignored, {sum(records.rejected.values()):,} rejected); "
                f"watermark {watermark}",
            )
            rows = _purgatory_rows(classified, rules, partitions, watermark)
            try:
                loop = _described(spark, "purgatory", lambda: _LoopStats.collect(rows))
                phases.end(
                    "purgatory",
                    f"ran {loop.partitions} partition(s) through the purgatory: "
                    f"{loop.events:,} rule events, loop {loop.rate():,.0f} events/s per core",
                )
                _write_outputs(spark, _outputs(classified, rows, rules), out, output_format)
            finally:
                rows.unpersist()
        finally:
            classified.unpersist()
    n_rejected = sum(records.rejected.values())
    conflicts = records.rejected.get("conflict", 0)
    far_future = records.rejected.get("far_future", 0)
    phases.end(
        "write",
        f"wrote rejected/ ({n_rejected:,} records, {conflicts:,} conflicts), outcomes/ ("
        + ", ".join(f"{k} {v:,}" for k, v in loop.outcomes.items())
        + f"), unmatched/ ({sum(loop.unmatched.values()):,}) and buffered/ "
        f"({loop.buffered:,})",
    )
    if far_future:
        phases.line(
            f"rejected {far_future:,} far_future record(s): event time after "
            f"{_iso_ms(future_limit)} (--max-future; 'off' to accept)"
        )
    summary = _summary(
        input_path, files, out, output_format, rules, partitions, max_future_ms, future_limit,
        watermark, records, loop, phases,
    )  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    phases.line(f"done: {summary['counts']['records']:,} records, "
                f"{summary['events_per_s']:,} records/s")  # fmt: skip
    return summary


def _summary(
    input_path: str,
    files: list[str],
    out: Path,
    output_format: str,
    rules: Rules,
    partitions: int,
    max_future_ms: int | None,
    future_limit: int | None,
    watermark: int | None,
    records: _RecordCounts,
    loop: _LoopStats,
    phases: _Phases,
) -> dict[str, Any]:
    """The run's ``summary.json``."""
    n_rejected = sum(records.rejected.values())
    events = records.kept + records.ignored
    total = events + records.duplicates + n_rejected
    job_s = phases.elapsed()
    return {
        "input": input_path,
        "input_files": len(files),
        "output": str(out),
        "format": output_format,
        "rules": [{"name": r.name, "key": r.key, "timeout_ms": r.timeout_ms} for r in rules.rules],
        "partitions": partitions,
        "allowed_lateness_ms": rules.input.allowed_lateness_ms,
        "retention_ms": rules.input.retention_ms,  # None: off
        "max_future_ms": max_future_ms,
        "far_future_after_ms": future_limit,
        "max_event_time": records.max_time,
        "watermark": watermark,
        "counts": {
            "records": total,
            "rejected": n_rejected,
            "rejected_by_reason": records.rejected,
            "duplicates": records.duplicates,
            "conflicts": records.rejected.get("conflict", 0),
            "events": events,
            "ignored": records.ignored,
            "rule_events": loop.events,
            "buffered": loop.buffered,
            "outcomes": loop.outcomes,
            "unmatched": loop.unmatched,
        },
        "latency_ms": loop.latency,
        "seconds": round(job_s, 3),
        "phases_seconds": phases.seconds,
        "events_per_s": round(total / job_s, 1) if job_s else None,
        "loop": loop.summary(),
    }
