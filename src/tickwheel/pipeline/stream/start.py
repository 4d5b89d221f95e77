"""The stream driver's library entry: :func:`start_stream` on a streaming DataFrame from any
replayable source, and :func:`read_stream_outputs`.

The query is assembled as the command line's is (:func:`~.query.start_query`); how each
micro-batch commits exactly once is told in ``docs/pipeline-design.md``, "Commit protocol
(exactly once)".
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

from ..rules import Rules, load_rules
from ..sinks.base import BATCH_ID
from ..spark.placement import MICRO_BATCH_ROWS_PER_PARTITION
from ..spark.records import DEFAULT_MAX_FUTURE_MS, input_form, parse_max_future
from ..spark.step import StepOptions
from ..storage import storage_for
from .changelog import committed_frames
from .checkpoint import StateStore, new_plan, take_checkpoint, tickwheel_root
from .micro_batch import TABLES, MicroBatchInput
from .query import before_first_batch, parse_trigger, start_query
from .resident import HeldState
from .runner import StreamStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from ..sinks import BatchSink, SinkFunction

__all__ = [
    "read_stream_outputs",
    "start_stream",
]


def start_stream(
    records: DataFrame,
    rules: Rules | str | os.PathLike[str],
    *,
    output: str | None = None,
    checkpoint: str,
    sink: str | BatchSink | SinkFunction = "parquet",
    trigger: str | None = None,
    partitions: int | None = None,
    max_future: int | str | None = DEFAULT_MAX_FUTURE_MS,
    input_format: str | None = None,
    jdbc_url: str | None = None,
    quiet: bool | None = None,
    drop_incompatible_state: bool = False,
    progress_metrics: bool = False,
    driver_state_bytes: int | str | None = None,
) -> StreamingQuery:
    """Start the delayed operations of a streaming ``records`` frame; return its query.

    Each micro-batch runs the same step as
    :func:`~tickwheel.pipeline.delayed_operations`, with the state the previous
    one committed, and commits its ``outcomes``, ``unmatched``, ``rejected``
    and ``late`` rows to ``sink`` exactly once by batch id.
    :func:`read_stream_outputs` reads the results with the pending operations.

    Parameters
    ----------
    records
        A streaming DataFrame from any replayable source, in a form of
        :mod:`tickwheel.pipeline.spark.records`: a ``value`` column of JSON text
        or bytes (as Kafka's source gives), or the ``[input]`` fields as columns.
    rules
        A :class:`~tickwheel.pipeline.Rules`, or a rules file's path.
    output
        The Parquet or SQLite sink's directory (not needed for PostgreSQL or a
        function).
    checkpoint
        Spark's checkpoint goes to ``CHECKPOINT/spark``, tickwheel's state to
        ``CHECKPOINT/tickwheel``. It is held until the query ends: a second
        query on it raises :class:`~.checkpoint.CheckpointInUse`.
    sink
        ``"parquet"`` (default), ``"sqlite"``, ``"postgresql"`` (with
        ``jdbc_url``), a :class:`~tickwheel.pipeline.sinks.BatchSink`, or a
        function ``fn(tables, batch_id)`` as Spark's ``foreachBatch`` calls one:
        ``tables`` maps the four names to the micro-batch's DataFrames (the same
        rows when a crash makes Spark replay the batch id), and idempotence by
        batch id is the function's (:class:`~tickwheel.pipeline.sinks.FunctionSink`).
    trigger
        ``"once"``, ``"available-now"``, ``"interval=30s"``, or None (Spark's default).
    partitions
        The purgatory's partitions at most (default: Spark's default parallelism).
    max_future
        The far-future guard: a record stamped later than processing time plus
        this is rejected as ``far_future`` (ms, a duration like ``"1d"``, or
        None/``"off"``).
    input_format
        ``"json"``, ``"columns"`` or ``"maxwell"``; None: guessed from the frame.
    jdbc_url
        The PostgreSQL sink's URL.
    quiet
        Deprecated: it never changed anything (a ``DeprecationWarning`` says so).
        The stream reports through :mod:`logging`, under the ``tickwheel.pipeline``
        loggers: each micro-batch's counts and an applied rules change at INFO;
        dropped state, a micro-batch's warnings and far-future records at WARNING.
    drop_incompatible_state
        On a checkpoint that holds state, the rules are first compared with those
        it recorded (:mod:`.evolution`): a change its state cannot follow raises
        :class:`~.evolution.RulesChangeRefused` before the query starts, unless
        this drops what the old rules left.
    progress_metrics
        Each micro-batch's figures in Spark's ``StreamingQueryProgress``, as
        ``observedMetrics["tickwheel"]`` of a companion query ``tickwheel
        progress of <query id>``, which stops after this one (:mod:`.progress`
        has the fields). It costs one Spark job per micro-batch, and the
        companion's own micro-batches.
    driver_state_bytes
        The most of the driver's memory the state may take there, measured: bytes,
        or a size such as ``"3g"`` (default: ``TICKWHEEL_DRIVER_STATE_BYTES``,
        else an eighth of the machine's memory). Past it, the next micro-batch
        moves the state's operations to a store per key partition on the
        executors; under Spark Connect, which cannot hold them there, the stream
        stops with an error naming the bound (``docs/scaling.md``, "State in the
        driver").

    Returns
    -------
    StreamingQuery
        Spark's query. A checkpoint in a newer state format than this release
        reads raises :class:`~.checkpoint.StreamError` before it starts.
    """
    from ..sinks import as_sink, make_sink

    if quiet is not None:
        warnings.warn(
            "start_stream(quiet=...) changes nothing and will be removed: configure the "
            "tickwheel.pipeline loggers instead",
            DeprecationWarning,
            stacklevel=2,
        )
    _check_stream_arguments(records, sink, output, trigger)
    held = HeldState(state_bytes=driver_state_bytes)  # a bad bound is refused here
    if not isinstance(rules, Rules):
        rules = load_rules(os.fspath(rules))
    spark = records.sparkSession
    # The form the step will read (a value column: json, else columns), recorded and
    # compared with the checkpoint's whether the caller named it or not.
    form = input_format if input_format is not None else input_form(records, rules)
    options = StepOptions(
        partitions=partitions,
        max_future_ms=parse_max_future(max_future),
        input_format=input_format,
        rows_per_partition=MICRO_BATCH_ROWS_PER_PARTITION,
    )
    store = take_checkpoint(checkpoint, spark)
    try:
        adjustment = before_first_batch(
            spark, store, rules, input_format=form,
            drop_incompatible_state=drop_incompatible_state,
        )  # fmt: skip
        batch_sink = (
            as_sink(sink)
            if not isinstance(sink, str)
            else make_sink(sink, output or "", spark, url=jdbc_url)
        )

        def inputs(frame: DataFrame, batch_id: int) -> MicroBatchInput:
            return MicroBatchInput(
                frame, store.plan(batch_id, lambda: new_plan(batch_id, input_format=form))
            )

        step = StreamStep(rules, options, form, adjustment, outcome_counts=progress_metrics)
        running = start_query(
            records, step, batch_sink, store, trigger,
            inputs=inputs, held=held, progress_metrics=progress_metrics,
        )  # fmt: skip
    except BaseException:
        assert store.owner is not None
        store.owner.release()
        raise
    running.release_when_done()
    return running.query


def _check_stream_arguments(
    records: DataFrame, sink: object, output: str | None, trigger: str | None
) -> None:
    """What :func:`start_stream` refuses before it locks the checkpoint. O(1)."""
    if not records.isStreaming:
        raise ValueError("start_stream takes a streaming DataFrame; for a batch one use "
                         "delayed_operations")  # fmt: skip
    if trigger is not None:
        parse_trigger(trigger)
    if isinstance(sink, str) and output is None and sink not in ("postgresql", "postgres"):
        raise ValueError(f"start_stream: the {sink} sink needs output=, a directory")


def read_stream_outputs(
    spark: SparkSession,
    sink: BatchSink | str | None = None,
    checkpoint: str | None = None,
) -> dict[str, DataFrame | None]:
    """A stream's outputs so far: what its last published batch and that batch's own
    state make, as one batch run over the same records would write.

    ``checkpoint`` is the stream's checkpoint. ``sink`` is the stream's sink:
    a :class:`~tickwheel.pipeline.sinks.BatchSink`, a Parquet sink's output
    directory, or None for the sink the checkpoint's commits record (a
    checkpoint of an older release records none: then give it). ``outcomes``
    holds the final outcomes of every batch up to the newest one both
    committed in the checkpoint and published in the sink, and one
    ``pending`` row for each operation still pending in that batch's state;
    ``unmatched``, ``rejected`` and ``late`` are the union of those batches;
    ``buffered`` lists the events above that batch's watermark, not applied
    yet. So a batch's outcomes never appear beside an older state's pending
    rows (a crash between a commit and its publication leaves the batch
    unread until a restart publishes it). ``batch_id`` is kept on the batch
    tables. O(output size).
    """
    from pyspark.sql import functions as F

    if checkpoint is None:
        raise ValueError("read_stream_outputs needs checkpoint=, the stream's checkpoint")
    root = tickwheel_root(checkpoint)
    store = StateStore(root, storage_for(root, spark))
    committed = store.committed()
    batch_sink = _sink_of(spark, store, committed, sink)
    published = [b for b in committed if batch_sink is None or _published(batch_sink, b)]
    out: dict[str, DataFrame | None] = dict.fromkeys((*TABLES, "buffered"))
    if not published:
        return out
    last = published[-1]
    for table in TABLES:
        frame = batch_sink.read_table(spark, table) if batch_sink is not None else None
        out[table] = None if frame is None else frame.where(F.col(BATCH_ID) <= last)
    commit = store.read_commit(last)
    state = committed_frames(store, spark, last, commit)
    pending = (
        state["ops"]
        .where(F.col("kind") == "pending")
        .select(
            "rule",
            "key",
            F.col("event_id").alias("op_id"),
            F.col("time").alias("opened_at"),
            "deadline",
            F.lit("pending").alias("outcome"),
            F.lit(None).cast("long").alias("resolved_at"),
            F.lit(None).cast("long").alias("latency_ms"),
            F.lit(None).cast("string").alias("resolve_event_id"),
            F.lit(None).cast("long").alias(BATCH_ID),
        )
    )
    final = out["outcomes"]
    out["outcomes"] = pending if final is None else final.unionByName(pending)
    events = state["events"]
    watermark = commit.watermark
    out["buffered"] = events if watermark is None else events.where(F.col("time") > watermark)
    return out


def _published(sink: BatchSink, batch_id: int) -> bool:
    """Whether ``sink`` shows ``batch_id`` (a function's sink shows every batch). O(1)."""
    from ..sinks import FunctionSink

    return isinstance(sink, FunctionSink) or sink.is_committed(batch_id)


def _sink_of(
    spark: SparkSession, store: StateStore, committed: list[int], sink: BatchSink | str | None
) -> BatchSink | None:
    """``sink`` as a sink: a Parquet directory opened, None taken from the checkpoint's
    newest commit (None again for a function's sink, whose rows are its own)."""
    from ..sinks import ParquetSink, SinkError, reopen_sink

    if isinstance(sink, str):
        return ParquetSink(sink, spark)
    if sink is not None:
        return sink
    recorded = store.read_commit(committed[-1]).sink if committed else None
    if not recorded:
        raise SinkError(
            f"checkpoint {store.root}: its commits do not say where the outputs are (no "
            "batch, or written by an older release); pass the sink or the output directory"
        )
    return reopen_sink(recorded, spark)
