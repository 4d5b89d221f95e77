"""Incremental, exactly-once pipeline: Structured Streaming + carried state + atomic commits.

``tickwheel pipeline stream --rules R --input DIR --output OUT --checkpoint CK``

A Spark Structured Streaming source that lists new files in (modification
time, name) order (:mod:`._file_source`; Spark checkpoints which files each
micro-batch took, in ``CK/spark/``) feeds ``foreachBatch``. Each micro-batch
``N``:

1. reads its new files with the batch pipeline's reader (bad lines and bad
   files become ``rejected`` rows, with events stamped too far in the future:
   ``--max-future``), drops events older than the previous watermark into
   ``late``, and warns when most of them are late or the watermark jumps;
2. deduplicates by event id against the carried *events* state (every kept event
   at or above the previous watermark: the events still buffered, and the ids a
   duplicate could still arrive for within the lateness);
3. advances the watermark (max event time − allowed lateness) and runs the
   events at or below it through the per-partition purgatory of
   :mod:`tickwheel.pipeline.core`, seeded with the carried *operations* state
   (pending operations + each key's last expiry); state rows of keys with no
   new event and no operation due are carried to the next state as they are;
4. commits: outputs staged in the sink and, at the same time, the next state
   staged in ``CK/tickwheel/staging/N``; then the sink's commit (idempotent per
   batch id), and finally the rename ``staging/N → state/N``: the commit point.

A micro-batch that Spark replays after a crash (``state/N`` missing) recomputes
from the same files and the same ``state/N-1`` and gets the same rows; the
sink replaces (Parquet) or skips (SQLite, PostgreSQL) its own earlier copy. A
batch whose ``state/N`` exists is skipped. See ``docs/pipeline.md``.

Heartbeat: a *marker file* ``*.heartbeat`` in the input directory holding an
event time (epoch ms or ISO-8601) raises the max event time seen, so the
watermark advances and deadlines fire while real input stalls.

Fault injection (tests): ``TICKWHEEL_FAULT=POINT:BATCH`` makes the driver kill
itself with SIGKILL at ``POINT`` of micro-batch ``BATCH`` (see
:data:`FAULT_POINTS`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._checkpoint import (
    FAULT_ENV,
    FAULT_POINTS,
    CheckpointInUse,
    CheckpointLock,
    StateStore,
    StreamError,
    fault,
    read_json,
)
from ._micro_batch import PROC_OUT_COLUMNS, MicroBatch
from ._stream_read import BatchReader
from .core import STATE_EXPIRED, STATE_PENDING, PartitionProcessor, StateRow
from .events import DEFAULT_MAX_FUTURE_MS
from .rules import Rules

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from .sinks import BatchSink

__all__ = [
    "FAULT_ENV",
    "FAULT_POINTS",
    "CheckpointInUse",
    "StreamConfig",
    "StreamError",
    "StreamJob",
    "parse_trigger",
    "read_stream_outputs",
]

_TABLES = ("outcomes", "unmatched", "rejected", "late")


def parse_trigger(text: str) -> tuple[str, int | None]:
    """Parse ``once``, ``available-now`` or ``interval=30s`` into (kind, interval ms). O(1)."""
    from .rules import parse_duration

    if text in ("once", "available-now"):
        return text, None
    if text.startswith("interval="):
        ms = parse_duration(text[len("interval=") :], "--trigger interval")
        if ms <= 0:
            raise StreamError("--trigger interval must be positive")
        return "interval", ms
    raise StreamError(f"--trigger: expected once, available-now or interval=30s, got {text!r}")


@dataclass(frozen=True)
class StreamConfig:
    """Options of one ``tickwheel pipeline stream`` job."""

    rules_path: str
    input: str
    output: str
    checkpoint: str
    trigger: str = "available-now"
    sink: str = "parquet"
    jdbc_url: str | None = None
    input_format: str | None = None  # default: the rules' [input].format
    partitions: int | None = None
    max_files_per_trigger: int | None = None
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    master: str | None = None
    quiet: bool = False


# ----------------------------------------------------------------------------- processing


def _process_partitions(
    rules: Rules, start_ms: int | None, watermark_ms: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: one purgatory per partition, seeded with its state.

    Only the state this increment can change goes through Python: the rows of
    keys with new events, and of keys with an operation due by the watermark.
    The rest (most expiry markers, and far-off pending operations) is carried
    to the next state as Arrow columns, untouched (see :func:`_untouched_state`).

    Rows that do go through Python go in and out column by column (``zip`` over
    Arrow columns as Python lists), not row by row, with the cyclic collector
    paused throughout. ``tests/pipeline/test_stream_udf.py`` pins the column
    mapping and the routing against one processor run over all the events.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .core import cyclic_gc_paused

        # Paused from the first row in to the last row out: the conversions
        # allocate a tuple per row, and the restored state is most of the heap.
        with cyclic_gc_paused():
            out = _process_increment(rules, start_ms, watermark_ms, batches)
        yield from out

    return run


def _untouched_state(rules: Rules, events: Any, state: Any, watermark_ms: int) -> Any:
    """Mask of the ``state`` rows this increment cannot change. O(rows).

    A key's expiry marker changes only when an event of that key is applied or
    one of its operations expires; a pending operation changes only through an
    event of its key or its own deadline. So a state row is untouched when its
    (rule, key) has no event in ``events`` and no operation due by
    ``watermark_ms``, and it is an expiry marker or a pending operation whose
    deadline is after the watermark. Keys are matched per rule, so no
    (rule, key) encoding can collide. A row with a null where a value is needed
    is not untouched: the processor rejects it with a clear error. Nor is a
    marker whose retention ends by the watermark: the processor drops it.
    """
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    kind = state["state_kind"]
    pending = pc.equal(kind, STATE_PENDING)
    due = pc.and_kleene(pending, pc.less_equal(state["deadline"], watermark_ms))
    marker = pc.equal(kind, STATE_EXPIRED)
    if rules.input.retention_ms is not None:  # core.marker_holds at the watermark
        marker = pc.and_kleene(
            marker, pc.greater(state["time"], watermark_ms - rules.input.retention_ms)
        )
    carriable = pc.or_kleene(
        marker,
        pc.and_kleene(pending, pc.greater(state["deadline"], watermark_ms)),
    )
    touched = None
    for rule in rules.rules:
        in_rule = pc.equal(state["rule"], rule.name)
        keys = pa.chunked_array(
            [
                *events.filter(pc.equal(events["rule"], rule.name))["key"].chunks,
                *state.filter(pc.and_kleene(in_rule, due))["key"].chunks,
            ],
            type=pa.string(),
        )
        hit = pc.and_kleene(in_rule, pc.is_in(state["key"], value_set=pc.unique(keys)))
        touched = hit if touched is None else pc.or_kleene(touched, hit)
    assert touched is not None  # Rules has at least one rule
    return pc.fill_null(pc.and_kleene(carriable, pc.invert(touched)), False)


#: The event columns the processor reads (rule and type give its rule index and kind).
EVENT_INPUT_COLUMNS = ("rule", "key", "time", "seq", "event_id", "event_type")


def _process_increment(
    rules: Rules, start_ms: int | None, watermark_ms: int, batches: Iterator[pa.RecordBatch]
) -> list[pa.RecordBatch]:
    """One partition's rows in; its outputs and next state out (no rows in: none out).

    The steps: split the rows into events and state; carry the state this
    increment cannot change straight to the output (:func:`_carried_batches`);
    run the rest and the events, sorted, through one
    :class:`~.core.PartitionProcessor` from ``start_ms`` to ``watermark_ms``;
    turn its rows into batches (:func:`_processed_batches`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    batch_list = list(batches)
    if not batch_list:
        return []
    table = pa.Table.from_batches(batch_list)
    is_state = pc.is_valid(table["state_kind"])
    event_rows = table.filter(pc.invert(is_state))
    state_rows = table.filter(is_state)
    out_schema = _proc_out_arrow_schema(pa)
    out: list[pa.RecordBatch] = []
    if state_rows.num_rows:
        unknown = set(pc.unique(state_rows["rule"]).to_pylist()) - set(rules.names)
        if unknown:
            raise ValueError(
                f"state rows name rules {sorted(unknown)}, not among {list(rules.names)}"
            )
        untouched = _untouched_state(rules, event_rows, state_rows, watermark_ms)
        out.extend(_carried_batches(pa, out_schema, state_rows.filter(untouched)))
        state_rows = state_rows.filter(pc.invert(untouched))
    state = _state_input(state_rows)
    events = _event_input(pa, rules, event_rows)
    if not state and not events:
        return out
    proc = PartitionProcessor(
        rules, rules.input.allowed_lateness_ms, state=state, start_ms=start_ms
    )
    try:
        proc.process(events, watermark_ms=watermark_ms)
        proc.finish(watermark_ms)
        if proc.buffered_events():  # cannot happen: only events <= watermark come in
            raise AssertionError(f"unexpected buffered events: {proc.buffered_events()[:3]}")
        out.extend(
            _processed_batches(
                pa,
                out_schema,
                rules.names,
                proc.take_outcomes(),
                proc.take_unmatched(),
                proc.pending_operations(),
                proc.expired_markers(),
            )
        )
        return out
    finally:
        proc.close()


def _carried_batches(pa: Any, schema: Any, carried: Any) -> list[Any]:
    """The untouched state rows as output batches of ``schema``, column for column. O(rows)."""
    if not carried.num_rows:
        return []
    columns = {
        "kind": carried["state_kind"],
        "rule": carried["rule"],
        "key": carried["key"],
        "id": carried["event_id"],
        "time": carried["time"],
        "deadline": carried["deadline"],
    }
    return list(_padded_table(pa, schema, carried.num_rows, columns).to_batches())


def _padded_table(pa: Any, schema: Any, n: int, columns: Mapping[str, Any]) -> Any:
    """A table of ``schema`` from ``columns`` (arrays of ``n`` rows), null where absent."""
    return pa.table([columns.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)


def _state_input(state_rows: Any) -> list[StateRow]:
    """The state rows as the processor's :class:`~.core.StateRow` tuples. O(rows)."""
    from itertools import repeat

    if not state_rows.num_rows:
        return []
    c = state_rows.to_pydict()
    return list(
        map(
            StateRow,
            c["state_kind"],
            c["rule"],
            c["key"],
            c["event_id"],
            c["time"],
            c["deadline"],
            repeat(None),
            repeat(None),
        )
    )


def _event_input(
    pa: Any, rules: Rules, event_rows: Any
) -> list[tuple[int, str, int, int, str, int, str]]:
    """The events as the processor's input tuples, in its order. O(n log n).

    Sorted by (time, sequence, event id, rule index) in Arrow; each tuple is
    (rule index, key, time, sequence, event id, kind, event type).
    """
    import pyarrow.compute as pc

    if not event_rows.num_rows:
        return []
    names = pa.array(rules.names, pa.string())
    event_rows = event_rows.append_column(
        "_rule", pc.index_in(event_rows["rule"], value_set=names)
    ).sort_by([(name, "ascending") for name in ("time", "seq", "event_id", "_rule")])
    c = {name: event_rows[name].to_pylist() for name in EVENT_INPUT_COLUMNS}
    # (rule name, event type) -> (rule index, kind): one lookup per event
    kind_of = {
        (rule.name, etype): (i, rule.kind_of(etype))
        for i, rule in enumerate(rules.rules)
        for etype in (*rule.open, *rule.complete, *rule.cancel)
    }
    try:
        rule_kind = list(map(kind_of.__getitem__, zip(c["rule"], c["event_type"], strict=True)))
    except KeyError as exc:  # the fan-out selects only the rules' types
        raise AssertionError(f"event of no rule's type: {exc}") from None
    index, kind = zip(*rule_kind, strict=True)
    return list(
        zip(
            index,
            c["key"],
            c["time"],
            c["seq"],
            c["event_id"],
            kind,
            c["event_type"],
            strict=True,
        )
    )


def _processed_batches(
    pa: Any,
    schema: Any,
    names: Sequence[str],
    outcomes: Sequence[tuple[Any, ...]],
    unmatched: Sequence[tuple[Any, ...]],
    pending: Sequence[tuple[Any, ...]],
    expired: Sequence[tuple[Any, ...]],
) -> list[Any]:
    """Record batches of ``schema``: one each for outcome, unmatched, pending and expired rows.

    The tuples are :class:`~.core.PartitionProcessor`'s raw rows
    (``take_outcomes``, ``take_unmatched``, ``pending_operations``,
    ``expired_markers``). Each column is built in one go from a transposed
    tuple; rule names are taken by index and latencies subtracted in Arrow;
    a kind's absent columns are null arrays. Kinds without rows give no batch.
    """
    import pyarrow.compute as pc

    rule_names = pa.array(names, pa.string())
    batches = []

    def add(kind: str, rows: Sequence[tuple[Any, ...]], fields: Sequence[str]) -> None:
        if not rows:
            return
        n = len(rows)
        given = dict(zip(fields, zip(*rows, strict=True), strict=True))
        arrays = {"kind": pa.array([kind] * n, pa.string())}
        arrays["rule"] = rule_names.take(pa.array(given.pop("rule"), pa.int32()))
        for name, values in given.items():
            arrays[name] = pa.array(values, schema.field(name).type)
        if kind == "outcome":
            arrays["latency_ms"] = pc.subtract(arrays["resolved_at"], arrays["time"])
        batches.extend(_padded_table(pa, schema, n, arrays).to_batches())

    add(
        "outcome",
        outcomes,
        ("rule", "key", "id", "time", "deadline", "outcome", "resolved_at", "resolve_event_id"),
    )
    add("unmatched", unmatched, ("rule", "key", "id", "event_type", "time", "reason"))
    add("pending", pending, ("rule", "key", "id", "time", "deadline"))
    add("expired", expired, ("rule", "key", "time"))
    return batches


def _proc_out_arrow_schema(pa: Any) -> Any:
    """``PROC_OUT_SCHEMA`` (of :mod:`._micro_batch`) as an Arrow schema."""
    arrow_type = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, arrow_type[kind]) for name, kind in PROC_OUT_COLUMNS])


# ----------------------------------------------------------------------------- the job


def _log(config: StreamConfig, message: str) -> None:
    if not config.quiet:
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp}] stream: {message}", flush=True)


class StreamJob:
    """One ``tickwheel pipeline stream`` run: lock, SparkSession, query, per-batch commits."""

    def __init__(self, config: StreamConfig, spark: SparkSession | None = None) -> None:
        """Validate the options and take the checkpoint lock (refused if held). O(1)."""
        from .maxwell import split_maxwell_tables
        from .rules import RulesError, parse_rules

        self.config = config
        try:
            import tomllib

            with open(config.rules_path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise StreamError(f"{config.rules_path}: no such rules file") from None
        except ValueError as exc:
            raise StreamError(f"{config.rules_path}: not valid TOML: {exc}") from None
        clean, self.maxwell_specs = split_maxwell_tables(doc)
        try:
            self.rules: Rules = parse_rules(clean)
        except RulesError as exc:
            raise StreamError(f"{config.rules_path}: {exc}") from None
        self.input_format = config.input_format or self.rules.input.format
        if self.input_format == "jsonl":
            self.input_format = "json"
        if self.input_format not in ("json", "csv", "parquet", "maxwell"):
            raise StreamError(
                "--input-format: expected jsonl, csv, parquet or maxwell, "
                f"got {self.input_format!r}"
            )
        if self.input_format == "maxwell" and not self.maxwell_specs:
            raise StreamError(
                f"{config.rules_path}: --input-format maxwell needs a [rules.NAME.maxwell] table"
            )
        if self.input_format == "maxwell" and self.rules.input.sequence is None:
            raise StreamError(
                f"{config.rules_path}: --input-format maxwell orders events by binlog position; "
                'set [input].sequence (for example sequence = "seq")'
            )
        self.reader = BatchReader(self.rules, self.input_format, self.maxwell_specs)
        self.trigger, self.interval_ms = parse_trigger(config.trigger)
        if not os.path.isdir(config.input):
            raise StreamError(f"--input {config.input}: not a directory")
        self.checkpoint = os.path.abspath(config.checkpoint)
        self.root = os.path.join(self.checkpoint, "tickwheel")
        os.makedirs(self.root, exist_ok=True)
        self._lock = CheckpointLock(self.root)
        self._lock.acquire()
        self.store = StateStore(self.root)
        self._spark = spark
        self._batch_spark: SparkSession | None = None
        self.sink: BatchSink | None = None
        self.batches_run = 0
        self.totals: dict[str, int] = {}
        self.warnings: list[str] = []
        self._marks: list[tuple[str, float]] = []

    # -- session ------------------------------------------------------------
    def _session(self) -> SparkSession:
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        from ._class_archive import startup_note
        from .sinks import spark_jdbc_conf
        from .spark_job import create_session

        conf = {"spark.sql.session.timeZone": "UTC", **spark_jdbc_conf()}
        master = self.config.master or "local[2]"
        archive, classes = startup_note(master)
        if classes and SparkSession.getActiveSession() is None:  # else the JVM is up already
            _log(self.config, f"starting Spark ({master}; {classes})")
        spark = create_session(
            master=master,
            app_name="tickwheel-stream",
            shuffle_partitions=self.config.partitions or 4,
            conf=conf,
            class_archive=archive,
        )
        spark.sparkContext.setLogLevel("ERROR")
        self._spark = spark
        return spark

    def _batch_session(self) -> SparkSession:
        """The session the micro-batches run in: a child of :meth:`_session`.

        Made once by :func:`~tickwheel.pipeline.spark_job.job_session`, with the
        pipeline's :data:`~tickwheel.pipeline.spark_job.JOB_SQL_SETTINGS`; the
        caller's session is not changed.
        """
        if self._batch_spark is None:
            from .spark_job import job_session

            self._batch_spark = job_session(self._session())
        return self._batch_spark

    def close(self) -> None:
        """Release the checkpoint lock (the SparkSession is left to its owner)."""
        self._lock.release()

    def __enter__(self) -> StreamJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the query to the end of the trigger (once / available-now) or forever."""
        from .sinks import make_sink

        spark = self._session()
        jvm_pid = None
        with contextlib.suppress(Exception):
            jvm = spark.sparkContext._jvm
            assert jvm is not None
            jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        self._lock.write_owner(jvm_pid)
        self.sink = make_sink(self.config.sink, self.config.output, spark, url=self.config.jdbc_url)
        _log(
            self.config,
            f"rules {self.rules.names}, input {self.config.input} "
            f"({self.input_format}), sink {self.sink.describe()}, checkpoint {self.checkpoint}",
        )
        from ._file_source import SOURCE_NAME, OrderedFileSource

        # Spark's own file source orders files by modification time only; this
        # one by (modification time, name), logged in the checkpoint.
        spark.dataSource.register(OrderedFileSource)
        reader = spark.readStream.format(SOURCE_NAME).option(
            "log", os.path.join(self.root, "files.log")
        )
        if self.config.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", str(self.config.max_files_per_trigger))
        source = reader.load(os.path.abspath(self.config.input))
        writer = source.writeStream.foreachBatch(self._on_batch).option(
            "checkpointLocation", os.path.join(self.checkpoint, "spark")
        )
        if self.trigger == "once":
            writer = writer.trigger(once=True)
        elif self.trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.interval_ms} milliseconds")
        started = time.perf_counter()
        query = writer.start()
        try:
            query.awaitTermination()
        finally:
            if query.isActive:
                query.stop()
        elapsed = time.perf_counter() - started
        last = self.store.committed()
        summary = {
            "batches_run": self.batches_run,
            "last_batch": last[-1] if last else None,
            "seconds": round(elapsed, 3),
            "sink": self.sink.describe(),
            **self.totals,
            "warnings": self.warnings,
        }
        if last:
            summary["watermark"] = read_json(os.path.join(self.store.path(last[-1]), "meta.json"))[
                "watermark"
            ]
        _log(self.config, f"done: {json.dumps(summary, sort_keys=True)}")
        return summary

    def _mark(self, phase: str) -> None:
        """Note the end of a phase of the current batch, for its progress line."""
        self._marks.append((phase, time.perf_counter()))

    def _run_batch(self, batch_id: int, plan: Mapping[str, Any]) -> dict[str, Any]:
        """Compute and commit micro-batch ``batch_id`` (see :mod:`._micro_batch`)."""
        return MicroBatch(self, batch_id, plan, _process_partitions).run()

    def _phases(self) -> str:
        marks = self._marks
        return " ".join(f"{name}={t - marks[i][1]:.1f}s" for i, (name, t) in enumerate(marks[1:]))

    def _on_batch(self, files_df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        if os.path.isdir(self.store.path(batch_id)):
            _log(self.config, f"batch {batch_id}: already committed; skipped (replay)")
            return
        later = [b for b in self.store.committed() if b > batch_id]
        if later:
            raise StreamError(
                f"checkpoint {self.checkpoint}: Spark replays batch {batch_id} but tickwheel's "
                f"state is already at batch {later[-1]}; the checkpoint was tampered with"
            )
        fault("batch_start", batch_id)
        self._marks = [("start", time.perf_counter())]
        listed = [r["path"] for r in files_df.collect()]  # in the source's order
        self._mark("list")
        plan = self.store.plan(
            batch_id,
            lambda: {"batch_id": batch_id, "files": listed, "now_ms": int(time.time() * 1000)},
        )
        counts = self._run_batch(batch_id, plan)
        warnings: list[str] = counts.pop("warnings")
        for message in warnings:  # on stderr even with --quiet
            print(f"tickwheel pipeline stream: batch {batch_id}: warning: {message}",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.warnings.extend(f"batch {batch_id}: {message}" for message in warnings)
        for name, value in counts.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.totals[name] = self.totals.get(name, 0) + value
        self.batches_run += 1
        _log(
            self.config,
            f"batch {batch_id}: {len(plan['files'])} file(s), "
            + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            + f" in {time.perf_counter() - started:.1f}s ({self._phases()})"
            + "".join(f"; WARNING: {message}" for message in warnings),
        )


def read_stream_outputs(
    spark: SparkSession, sink: BatchSink, checkpoint: str
) -> dict[str, DataFrame | None]:
    """The job's outputs so far: every committed batch's rows plus the current state.

    ``outcomes`` holds the final outcomes of all committed batches and one
    ``pending`` row for each operation still pending in the latest committed
    state (what a single batch run over the same data writes); ``unmatched``,
    ``rejected`` and ``late`` are the union of the batches; ``buffered`` lists
    the events above the watermark, not applied yet. ``batch_id`` is kept on
    the batch tables. O(output size).
    """
    from pyspark.sql import functions as F

    store = StateStore(os.path.join(os.path.abspath(checkpoint), "tickwheel"))
    out: dict[str, DataFrame | None] = {t: sink.read_table(spark, t) for t in _TABLES}
    committed = store.committed()
    if not committed:
        out["buffered"] = None
        return out
    last = store.path(committed[-1])
    meta = read_json(os.path.join(last, "meta.json"))
    ops = spark.read.parquet(os.path.join(last, "ops"))
    pending = ops.where(F.col("kind") == "pending").select(
        "rule",
        "key",
        F.col("event_id").alias("op_id"),
        F.col("time").alias("opened_at"),
        "deadline",
        F.lit("pending").alias("outcome"),
        F.lit(None).cast("long").alias("resolved_at"),
        F.lit(None).cast("long").alias("latency_ms"),
        F.lit(None).cast("string").alias("resolve_event_id"),
        F.lit(None).cast("long").alias("batch_id"),
    )
    final = out["outcomes"]
    out["outcomes"] = pending if final is None else final.unionByName(pending)
    events = spark.read.parquet(os.path.join(last, "events"))
    watermark = meta.get("watermark")
    out["buffered"] = events if watermark is None else events.where(F.col("time") > watermark)
    return out


# ----------------------------------------------------------------------------- CLI


def add_stream_arguments(parser: Any) -> None:
    """Add the options of ``tickwheel pipeline stream`` to an argparse parser. O(1)."""
    parser.add_argument("--rules", required=True, help="rules TOML file")
    parser.add_argument("--input", required=True, help="directory the stream watches for files")
    parser.add_argument("--output", required=True, help="output directory (and SQLite home)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (one job)")
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="once | available-now (default) | interval=30s (runs until stopped)",
    )
    parser.add_argument(
        "--sink", default="parquet", choices=("parquet", "sqlite", "postgresql"), help="sink"
    )
    parser.add_argument("--jdbc-url", help="JDBC URL for --sink sqlite/postgresql")
    parser.add_argument(
        "--input-format",
        choices=("jsonl", "json", "csv", "parquet", "maxwell"),
        help="input format (default: the rules' [input].format)",
    )
    parser.add_argument("--partitions", type=int, help="partitions of the purgatory stage")
    parser.add_argument(
        "--max-files-per-trigger", type=int, help="at most this many new files per micro-batch"
    )
    parser.add_argument(
        "--max-future",
        default="1d",
        help="reject events stamped more than this after processing time as far_future "
        "('1d' default, '2h', ms, or 'off')",
    )
    parser.add_argument("--master", help="Spark master URL (default local[2])")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run_stream_command(args: Any) -> int:
    """Run ``tickwheel pipeline stream`` from parsed arguments; return the exit code."""
    from .events import parse_max_future
    from .rules import RulesError
    from .sinks import SinkError

    try:
        max_future = parse_max_future(args.max_future)
        if args.partitions is not None and args.partitions < 1:
            raise StreamError("--partitions must be >= 1")
        config = StreamConfig(
            rules_path=args.rules,
            input=args.input,
            output=args.output,
            checkpoint=args.checkpoint,
            trigger=args.trigger,
            sink=args.sink,
            jdbc_url=args.jdbc_url,
            input_format=args.input_format,
            partitions=args.partitions,
            max_files_per_trigger=args.max_files_per_trigger,
            max_future_ms=max_future,
            master=args.master,
            quiet=args.quiet,
        )
        with StreamJob(config) as job:
            job.run()
    except (StreamError, RulesError, SinkError) as exc:
        print(f"tickwheel pipeline stream: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tickwheel.pipeline.stream``: the same as ``tickwheel pipeline stream``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tickwheel pipeline stream",
        description="Incremental, exactly-once pipeline over a directory of arriving files.",
    )
    add_stream_arguments(parser)
    return run_stream_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
