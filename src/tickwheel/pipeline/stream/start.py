"""The stream driver's library entry (:func:`start_stream`) and the commit protocol it shares
with the command line's file job (:mod:`.file_job`).

Two entry points build the same Structured Streaming query, whose
``foreachBatch`` is a :class:`~.runner.BatchRunner`:

* :func:`start_stream`: a streaming DataFrame of records from any replayable
  source (Kafka, a table, Spark's own file sources...), for a Spark user's
  own job; it returns Spark's ``StreamingQuery``;
* :class:`~.file_job.StreamJob`: ``tickwheel pipeline stream``, over a directory of
  arriving files. Its source lists new files in (modification time, name)
  order (:mod:`.file_source`), and each micro-batch reads its files into a
  records frame (:func:`tickwheel.pipeline.spark.files.read_files`); a marker
  file (``*.heartbeat``) holding an event time raises the largest event time
  seen, so the watermark advances and deadlines fire while input stalls.

Spark checkpoints what each micro-batch took (``CK/spark/``); tickwheel's
state is beside it (``CK/tickwheel/``, :mod:`.checkpoint`). Micro-batch ``N``
(:mod:`.runner`, :mod:`.micro_batch`):

1. if it is committed already (a crash came before Spark's own commit log),
   publishes its outputs if they still wait, and skips itself; refuses to run
   if a later one is committed;
2. writes (once) or re-reads its plan ``plans/N.json``: its processing time
   for the far-future guard (and its files), so a replay decides the same;
3. runs the step on its records with the state of the latest committed batch;
4. stages its outputs in the sink and its next state in ``state/N/<attempt>/``,
   under names of the attempt's own; then commits: one new file in the
   batch's commit slot, fenced (a newer owner's fence stops a job that froze),
   that names the attempt; then the sink publishes what the commit named.

No step renames a directory or overwrites a file a reader may see, so the
checkpoint and the Parquet sink may be at any URI Spark writes
(:mod:`..storage`), on a classic session.

A micro-batch that Spark replays after a crash recomputes from the same
records and the same state and gets the same rows, under new names; what no
commit names is never read. See ``docs/pipeline-design.md``, "Commit
protocol". Fault injection (tests): ``TICKWHEEL_FAULT=POINT:BATCH`` kills the
driver with SIGKILL at ``POINT`` of micro-batch ``BATCH``
(:data:`~.checkpoint.FAULT_POINTS`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..rules import Rules, load_rules
from ..sinks.base import BATCH_ID
from ..spark.records import DEFAULT_MAX_FUTURE_MS, input_form, parse_max_future
from ..spark.step import MICRO_BATCH_ROWS_PER_PARTITION, StepOptions
from ..storage import absolute, join, storage_for
from .checkpoint import CheckpointOwner, StateStore
from .micro_batch import TABLES, MicroBatch, MicroBatchInput
from .resident import committed_frames, end_resident_state
from .runner import (
    BatchRunner,
    _before_first_batch,
    _checkpoint_root,
    _new_plan,
    _spark_checkpoint,
    _with_trigger,
    parse_trigger,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from ..sinks import BatchSink, SinkFunction
    from .progress import ProgressSpool

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
    quiet: bool = True,
    drop_incompatible_state: bool = False,
    progress_metrics: bool = False,
) -> StreamingQuery:
    """Start the delayed operations of a streaming ``records`` frame; return its query.

    ``records`` comes from any replayable Structured Streaming source, in a
    form of :mod:`tickwheel.pipeline.spark.records` (a ``value`` column of JSON
    text or bytes, as Kafka's source gives; or the ``[input]`` fields as
    columns). Each micro-batch runs the same step as
    :func:`~tickwheel.pipeline.delayed_operations`, with the state the previous
    one committed, and commits its ``outcomes``, ``unmatched``, ``rejected``
    and ``late`` rows to ``sink`` exactly once by batch id (``"parquet"`` in
    ``output``, ``"sqlite"``, ``"postgresql"`` with ``jdbc_url``, or a
    :class:`~tickwheel.pipeline.sinks.BatchSink`). ``sink`` may also be a
    function of your own, ``fn(tables, batch_id)``, as Spark's
    ``foreachBatch`` calls one: ``tables`` maps those four names to the
    micro-batch's DataFrames, the same rows when a crash makes Spark replay
    the batch id, and idempotence by batch id is the function's
    (:class:`~tickwheel.pipeline.sinks.FunctionSink`; ``output`` is then not
    needed). Spark's checkpoint goes to
    ``CHECKPOINT/spark`` and tickwheel's state to ``CHECKPOINT/tickwheel``;
    the checkpoint is locked until the query ends (a second query on it
    raises :class:`~.checkpoint.CheckpointInUse`). ``trigger`` is ``"once"``,
    ``"available-now"``, ``"interval=30s"`` or None (Spark's default).
    ``read_stream_outputs`` reads the results with the pending operations.

    On a checkpoint that holds state, the rules are first compared with those
    it recorded (:mod:`.evolution`): a change its state cannot follow raises
    :class:`~.evolution.RulesChangeRefused` before the query starts, unless
    ``drop_incompatible_state`` drops what the old rules left; a checkpoint in
    a newer state format than this release reads raises :class:`~.checkpoint.StreamError`.

    ``progress_metrics`` puts each micro-batch's figures in Spark's
    ``StreamingQueryProgress``, where a ``StreamingQueryListener`` reads them:
    as ``observedMetrics["tickwheel"]`` of a companion query, ``tickwheel
    progress of <query id>``, which stops after this one (:mod:`.progress`
    has the fields). It costs one Spark job per micro-batch, which counts the
    outcomes, and the companion's own micro-batches.

    The stream reports through :mod:`logging`, under the ``tickwheel.pipeline``
    loggers: each micro-batch's counts and an applied rules change at INFO;
    dropped state, a micro-batch's warnings and far-future records at WARNING.
    Configure logging to see them. ``quiet`` is kept for compatibility and
    changes nothing.
    """
    from ..sinks import as_sink, make_sink

    _check_stream_arguments(records, sink, output, trigger)
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
    spool = _progress_spool(progress_metrics)
    _, store, lock = _checkpoint_root(checkpoint, spark)
    try:
        adjustment = _before_first_batch(
            spark, store, rules, input_format=form,
            drop_incompatible_state=drop_incompatible_state,
        )  # fmt: skip
        batch_sink = (
            as_sink(sink)
            if not isinstance(sink, str)
            else make_sink(sink, output or "", spark, url=jdbc_url)
        )

        def process(frame: DataFrame, batch_id: int) -> tuple[Mapping[str, Any], dict[str, Any]]:
            plan = store.plan(batch_id, lambda: _new_plan(batch_id, input_format=form))
            batch = MicroBatchInput(frame, plan)
            micro_batch = MicroBatch(
                rules, store, batch_sink, options, batch, adjustment,
                outcome_counts=spool is not None,
            )  # fmt: skip
            return batch.plan, micro_batch.run()

        publish = spool.write if spool is not None else None
        runner = BatchRunner(store, batch_sink, process, publish=publish)
        writer = records.writeStream.foreachBatch(runner).option(
            "checkpointLocation", _spark_checkpoint(absolute(checkpoint))
        )
        query = _with_trigger(writer, trigger).start()
    except BaseException:
        lock.release()
        raise
    try:
        companion = _start_companion(spark, query, spool)
    except BaseException:
        query.stop()
        lock.release()
        raise
    lock.in_use = lambda: bool(query.isActive)
    _release_when_done(spark, query, lock, companion, store)
    return query


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


def _progress_spool(progress_metrics: bool) -> ProgressSpool | None:
    """A new spool for ``progress_metrics`` (:mod:`.progress`), else None. O(1)."""
    if not progress_metrics:
        return None
    from .progress import ProgressSpool

    return ProgressSpool(uuid.uuid4().hex)


def _start_companion(
    spark: SparkSession, query: StreamingQuery, spool: ProgressSpool | None
) -> StreamingQuery | None:
    """The companion query that reports what ``query``'s micro-batches leave in
    ``spool`` (:mod:`.progress`); None without a spool."""
    if spool is None:
        return None
    from .progress import start_progress_query

    return start_progress_query(spark, str(query.id), spool)


def _drain_and_stop(companion: StreamingQuery) -> None:
    """Let ``companion`` read what its spool holds, then stop it. Bounded by its own
    micro-batches: a failed companion raises at once."""
    with contextlib.suppress(Exception):  # a failed companion is stopped all the same
        companion.processAllAvailable()
    companion.stop()


def _release_when_done(
    spark: SparkSession,
    query: StreamingQuery,
    lock: CheckpointOwner,
    companion: StreamingQuery | None = None,
    store: StateStore | None = None,
) -> None:
    """Release ``lock`` when ``query`` terminates, however it ends; then let the
    ``companion`` query (:mod:`.progress`) read what is left and stop it. A classic
    session tells a listener; under Spark Connect a daemon thread polls
    ``query.isActive`` instead (:func:`~.checkpoint.when_inactive` says why)."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from ..spark.session import is_classic
    from .checkpoint import when_inactive

    if not is_classic(spark):

        def after_connect_query(session_gone: bool) -> None:
            lock.release()
            if companion is not None and not session_gone:
                with contextlib.suppress(Exception):  # the session may stop meanwhile
                    _drain_and_stop(companion)

        when_inactive(lambda: bool(query.isActive), after_connect_query)
        return
    ended = threading.Lock()

    def after_query() -> None:
        if not ended.acquire(blocking=False):  # the listener and the check below may both call
            return
        if store is not None:  # the state this driver holds, written whole first
            end_resident_state(store, driver_only=True)
        lock.release()
        if companion is not None:
            # Spark Connect calls listeners holding a lock that the companion's
            # calls need: wait for it from another thread.
            threading.Thread(target=_drain_and_stop, args=(companion,), daemon=True).start()

    class Release(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if str(event.id) == str(query.id):
                after_query()
                # Spark Connect's client calls listeners holding the lock that
                # removeListener takes: remove it from another thread.
                threading.Thread(
                    target=spark.streams.removeListener, args=(self,), daemon=True
                ).start()

    spark.streams.addListener(Release())
    if not query.isActive:  # ended before the listener was in place
        after_query()


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
    root = join(absolute(checkpoint), "tickwheel")
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
    meta = store.meta(last)
    state = committed_frames(store, spark, last, meta)
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
    watermark = meta.get("watermark")
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
    recorded = store.meta(committed[-1]).get("sink") if committed else None
    if not recorded:
        raise SinkError(
            f"checkpoint {store.root}: its commits do not say where the outputs are (no "
            "batch, or written by an older release); pass the sink or the output directory"
        )
    return reopen_sink(recorded, spark)
