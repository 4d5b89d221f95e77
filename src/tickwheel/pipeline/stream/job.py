"""The stream driver: the one step per micro-batch, with carried state, committed exactly once.

Two entry points build the same Structured Streaming query, whose
``foreachBatch`` is a :class:`BatchRunner`:

* :func:`start_stream`: a streaming DataFrame of records from any replayable
  source (Kafka, a table, Spark's own file sources...), for a Spark user's
  own job; it returns Spark's ``StreamingQuery``;
* :class:`StreamJob`: ``tickwheel pipeline stream``, over a directory of
  arriving files. Its source lists new files in (modification time, name)
  order (:mod:`.file_source`), and each micro-batch reads its files into a
  records frame (:func:`tickwheel.pipeline.spark.files.read_files`); a marker
  file (``*.heartbeat``) holding an event time raises the largest event time
  seen, so the watermark advances and deadlines fire while input stalls.

Spark checkpoints what each micro-batch took (``CK/spark/``); tickwheel's
state is beside it (``CK/tickwheel/``, :mod:`.checkpoint`). Micro-batch ``N``
(:mod:`.micro_batch`):

1. skips itself if ``commits/N.json`` exists (committed before a crash that
   came before Spark's own commit log); refuses to run if a later one exists;
2. writes (once) or re-reads its plan ``plans/N.json``: its processing time
   for the far-future guard (and its files), so a replay decides the same;
3. runs the step on its records with the state of the latest committed batch;
4. commits: outputs staged in the sink and, at the same time, the next state
   written in ``state/N/`` (after deleting what a failed attempt left there);
   then the sink's commit (idempotent per batch id), and finally one new
   file, ``commits/N.json``, after checking that this job still owns the
   checkpoint: the commit point.

No step renames a directory or overwrites a file a reader may see, so the
checkpoint and the Parquet sink may be at any URI Spark writes
(:mod:`..storage`), on a classic session.

A micro-batch that Spark replays after a crash recomputes from the same
records and the same state and gets the same rows; the sink replaces
(Parquet) or skips (SQLite, PostgreSQL) its own earlier copy. See
``docs/pipeline.md``. Fault injection (tests): ``TICKWHEEL_FAULT=POINT:BATCH``
kills the driver with SIGKILL at ``POINT`` of micro-batch ``BATCH``
(:data:`~.checkpoint.FAULT_POINTS`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..rules import Rules, load_rules
from ..spark.files import HEARTBEAT_SUFFIX, read_files, read_heartbeats
from ..spark.records import DEFAULT_MAX_FUTURE_MS, parse_max_future
from ..spark.step import MICRO_BATCH_ROWS_PER_PARTITION, StepOptions
from ..spark.workers import WorkersError, check_workers
from ..storage import Storage, StorageError, absolute, is_uri, join, local_path, storage_for
from .checkpoint import (
    FAULT_POINTS,
    CheckpointInUse,
    CheckpointOwner,
    StateStore,
    StreamError,
    fault,
)
from .evolution import StateAdjustment, check_rules_change
from .micro_batch import GAUGES, TABLES, MicroBatch, MicroBatchInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from ..sinks import BatchSink, SinkFunction
    from .file_source import FileLog
    from .progress import ProgressSpool

__all__ = [
    "FAULT_POINTS",
    "BatchRunner",
    "CheckpointInUse",
    "StreamConfig",
    "StreamError",
    "StreamJob",
    "parse_trigger",
    "read_stream_outputs",
    "start_stream",
]

Say = Callable[[str], None]


def parse_trigger(text: str) -> tuple[str, int | None]:
    """Parse ``once``, ``available-now`` or ``interval=30s`` into (kind, interval ms). O(1)."""
    from ..rules import parse_duration

    if text in ("once", "available-now"):
        return text, None
    if text.startswith("interval="):
        ms = parse_duration(text[len("interval=") :], "--trigger interval")
        if ms <= 0:
            raise StreamError("--trigger interval must be positive")
        return "interval", ms
    raise StreamError(f"--trigger: expected once, available-now or interval=30s, got {text!r}")


def _with_trigger(writer: DataStreamWriter, trigger: str | None) -> DataStreamWriter:
    """``writer`` with ``trigger`` (:func:`parse_trigger`'s text; None: Spark's default)."""
    if trigger is None:
        return writer
    kind, interval_ms = parse_trigger(trigger)
    if kind == "once":
        return writer.trigger(once=True)
    if kind == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{interval_ms} milliseconds")


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp}] stream: {message}", flush=True)


#: At most how often (seconds) a micro-batch ends with a full collection of the
#: driver's Python garbage.
#:
#: A py4j ``JavaObject`` whose methods were called is in a reference cycle (it
#: keeps its ``JavaMember`` objects, and they point back at it), so Python frees
#: it only in a full collection, and until then the JVM keeps what it names: the
#: micro-batch's Datasets, with their plans and query executions. A driver that
#: allocates little runs a full collection seldom, so its JVM heap rose with the
#: micro-batches run (after a full GC of the JVM, 100 → 146 MiB over 300 of them
#: in ``benchmarks/bench_pipeline_soak.py``). A full collection takes about 30 ms
#: here: every 10 s, at most 0.3 % of the driver's time.
FULL_COLLECTION_EVERY_S = 10.0


@dataclass
class BatchRunner:
    """``foreachBatch``'s function: each micro-batch once, in order, with its progress line.

    ``process(frame, batch_id)`` computes and commits the micro-batch from what
    the query hands over, and returns its plan and its counts; ``publish``, if
    given, then receives the batch id and the counts with the watermark (the
    figures of :mod:`.progress`). A micro-batch ends with a full collection of
    Python's garbage when the last one is :data:`FULL_COLLECTION_EVERY_S` old.
    """

    store: StateStore
    sink: BatchSink
    process: Callable[[DataFrame, int], tuple[Mapping[str, Any], dict[str, Any]]]
    quiet: bool = False
    publish: Callable[[int, Mapping[str, Any]], None] | None = None
    batches_run: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    last_collection: float = field(default_factory=time.monotonic)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        """Run micro-batch ``batch_id`` unless it is committed already (a replay)."""
        started = time.perf_counter()
        if self.store.is_committed(batch_id):
            _log(self.quiet, f"batch {batch_id}: already committed; skipped (replay)")
            return
        later = [b for b in self.store.committed() if b > batch_id]
        if later:
            raise StreamError(
                f"checkpoint {self.store.root}: Spark replays batch {batch_id} "
                f"but tickwheel's state is already at batch {later[-1]}; the checkpoint was "
                "tampered with"
            )
        fault("batch_start", batch_id)
        plan, counts = self.process(frame, batch_id)
        self._report(batch_id, plan, counts, time.perf_counter() - started)
        if self.publish is not None:
            try:
                self.publish(batch_id, counts)
            except OSError as exc:  # the figures are for watching: the stream goes on
                print(f"tickwheel pipeline stream: batch {batch_id}: warning: its figures "
                      f"were not published: {exc}", file=sys.stderr, flush=True)  # fmt: skip
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        """A full collection of Python's garbage, if the last one is old enough. O(1),
        or O(the driver's Python objects) when it collects."""
        if time.monotonic() - self.last_collection >= FULL_COLLECTION_EVERY_S:
            gc.collect()
            self.last_collection = time.monotonic()

    def _report(
        self, batch_id: int, plan: Mapping[str, Any], counts: dict[str, Any], seconds: float
    ) -> None:
        warnings: list[str] = counts.pop("warnings")
        for message in warnings:  # on stderr even when quiet
            print(f"tickwheel pipeline stream: batch {batch_id}: warning: {message}",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.warnings.extend(f"batch {batch_id}: {message}" for message in warnings)
        for name, value in counts.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.totals[name] = value if name in GAUGES else self.totals.get(name, 0) + value
        self.batches_run += 1
        files = plan.get("files")
        took = f"{len(files)} file(s), " if files is not None else ""
        _log(
            self.quiet,
            f"batch {batch_id}: {took}"
            + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            + f" in {seconds:.1f}s"
            + "".join(f"; WARNING: {message}" for message in warnings),
        )

    def summary(self, seconds: float) -> dict[str, Any]:
        """The run's summary: batches, the counts' totals (of the gauges, the last
        micro-batch's), warnings and the last watermark. O(batches)."""
        last = self.store.committed()
        summary: dict[str, Any] = {
            "batches_run": self.batches_run,
            "last_batch": last[-1] if last else None,
            "seconds": round(seconds, 3),
            "sink": self.sink.describe(),
            **self.totals,
            "warnings": self.warnings,
        }
        if last:
            summary["watermark"] = self.store.meta(last[-1])["watermark"]
        return summary


def _within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or under it; local paths compared with their
    links resolved, as the files would be reached. O(len)."""
    path, directory = local_path(path), local_path(directory)
    if is_uri(path) or is_uri(directory):
        return (path.rstrip("/") + "/").startswith(directory.rstrip("/") + "/")
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def _source_archive_dir(config: StreamConfig) -> str | None:
    """``--source-archive-dir`` made absolute, once the clean-source options agree. O(1).

    ``archive`` needs the directory and ``off``/``delete`` take none; it must
    not be inside the input, where the archived files would be listed again
    (Spark's file source refuses that too).
    """
    from .file_source import CLEAN_SOURCE_MODES

    mode, archive = config.clean_source, config.source_archive_dir
    if mode not in CLEAN_SOURCE_MODES:
        raise StreamError(f"--clean-source: expected off, archive or delete, got {mode!r}")
    if mode != "archive":
        if archive is not None:
            raise StreamError(
                f"--source-archive-dir is for --clean-source archive (here {mode}): "
                "drop it, or archive"
            )
        return None
    if not archive:
        raise StreamError("--clean-source archive needs --source-archive-dir, the directory "
                          "the committed files move to")  # fmt: skip
    archive = absolute(archive)
    if _within(archive, absolute(config.input)):
        raise StreamError(
            f"--source-archive-dir {archive} is inside --input {config.input}: the archived "
            "files would be taken again"
        )
    return archive


def _max_file_age_ms(text: str | None) -> int | None:
    """``--max-file-age`` (a duration: ``7d``, ``12h``, ``30m``) in ms; None: no limit. O(1)."""
    from ..rules import RulesError, parse_duration

    if text is None:
        return None
    try:
        age = parse_duration(text, "--max-file-age")
    except RulesError as exc:
        raise StreamError(str(exc)) from None
    if age <= 0:
        raise StreamError(f"--max-file-age must be positive, got {text!r}")
    return age


def _new_plan(batch_id: int, **more: Any) -> dict[str, Any]:
    """A new write-ahead plan: the batch id, ``more``, and the processing time now."""
    return {"batch_id": batch_id, **more, "now_ms": int(time.time() * 1000)}


def _spark_checkpoint(checkpoint: str) -> str:
    """Where Spark keeps its own checkpoint (offsets, commits) under ``checkpoint``."""
    return join(checkpoint, "spark")


def _checkpoint_root(
    checkpoint: str, spark: SparkSession | None = None
) -> tuple[str, StateStore, CheckpointOwner]:
    """The checkpoint's tickwheel directory, its state store and its owner (taken).

    A URI checkpoint goes through ``spark``'s Hadoop file systems.
    """
    root = join(absolute(checkpoint), "tickwheel")
    try:
        storage = storage_for(root, spark)
    except StorageError as exc:
        raise StreamError(f"--checkpoint {exc}") from None
    owner = CheckpointOwner(root, storage)
    owner.acquire()
    return root, StateStore(root, storage, owner), owner


def _before_first_batch(
    spark: SparkSession,
    store: StateStore,
    rules: Rules,
    *,
    input_format: str | None,
    drop_incompatible_state: bool,
    quiet: bool,
) -> StateAdjustment | None:
    """What both drivers check before their query starts (a failure inside a micro-batch
    is a long trace): the workers run this tickwheel, the state's format is one this
    release reads, and the rules' changes apply (:mod:`.evolution`). Returns what the
    first batch drops from the state."""
    check_workers(spark)
    store.check_format()
    return check_rules_change(
        store, rules, spark, input_format=input_format,
        drop_incompatible_state=drop_incompatible_state, say=lambda m: _log(quiet, m),
    )  # fmt: skip


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
    raises :class:`CheckpointInUse`). ``trigger`` is ``"once"``,
    ``"available-now"``, ``"interval=30s"`` or None (Spark's default).
    ``read_stream_outputs`` reads the results with the pending operations.

    On a checkpoint that holds state, the rules are first compared with those
    it recorded (:mod:`.evolution`): a change its state cannot follow raises
    :class:`~.evolution.RulesChangeRefused` before the query starts, unless
    ``drop_incompatible_state`` drops what the old rules left; a checkpoint in
    a newer state format than this release reads raises :class:`StreamError`.

    ``progress_metrics`` puts each micro-batch's figures in Spark's
    ``StreamingQueryProgress``, where a ``StreamingQueryListener`` reads them:
    as ``observedMetrics["tickwheel"]`` of a companion query, ``tickwheel
    progress of <query id>``, which stops after this one (:mod:`.progress`
    has the fields). It costs one Spark job per micro-batch, which counts the
    outcomes, and the companion's own micro-batches.
    """
    from ..sinks import as_sink, make_sink

    _check_stream_arguments(records, sink, output, trigger)
    if not isinstance(rules, Rules):
        rules = load_rules(os.fspath(rules))
    spark = records.sparkSession
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
            spark, store, rules, input_format=input_format,
            drop_incompatible_state=drop_incompatible_state, quiet=quiet,
        )  # fmt: skip
        batch_sink = (
            as_sink(sink)
            if not isinstance(sink, str)
            else make_sink(sink, output or "", spark, url=jdbc_url)
        )

        def process(frame: DataFrame, batch_id: int) -> tuple[Mapping[str, Any], dict[str, Any]]:
            plan = store.plan(batch_id, lambda: _new_plan(batch_id, input_format=input_format))
            batch = MicroBatchInput(frame, plan)
            micro_batch = MicroBatch(
                rules, store, batch_sink, options, batch, adjustment,
                outcome_counts=spool is not None,
            )  # fmt: skip
            return batch.plan, micro_batch.run()

        publish = spool.write if spool is not None else None
        runner = BatchRunner(store, batch_sink, process, quiet=quiet, publish=publish)
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
    _release_when_done(spark, query, lock, companion)
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
    partitions: int | None = None  # at most; see rows_per_partition
    # A micro-batch's purgatory takes one partition per this many rows, up to
    # ``partitions`` (spark.step.MICRO_BATCH_ROWS_PER_PARTITION).
    rows_per_partition: int = MICRO_BATCH_ROWS_PER_PARTITION
    max_files_per_trigger: int | None = None
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    master: str | None = None
    remote: str | None = None  # a Spark Connect URL (sc://host:port), instead of master
    driver_memory: str | None = None  # default: spark.session.default_driver_memory()
    jit: str = "auto"  # auto | c1 | c2: see StreamJob.quick_jit
    quiet: bool = False
    # Go on past a rules change the state cannot follow, dropping what it concerns.
    drop_incompatible_state: bool = False
    # Each micro-batch's figures in Spark's progress, through a companion query.
    progress_metrics: bool = False
    # Spark's file source options: what becomes of a file once its batch is
    # committed (off | archive | delete; archive moves it to source_archive_dir),
    # and the age (a duration: "7d") past which a listing ignores a file, relative
    # to the newest file seen (None: no limit, where Spark's default is 7 days).
    clean_source: str = "off"
    source_archive_dir: str | None = None
    max_file_age: str | None = None


class StreamJob:
    """``tickwheel pipeline stream``: a directory of arriving files through the stream.

    The job runs in ``spark`` as the caller set it up; without one, it starts
    its own session, with :data:`~..spark.session.STREAM_SESSION_CONF`.
    """

    def __init__(self, config: StreamConfig, spark: SparkSession | None = None) -> None:
        """Validate the options and take the checkpoint lock (refused if held). O(1)."""
        from ..rules import RulesError

        self.config = config
        try:
            self.rules: Rules = load_rules(config.rules_path)
        except RulesError as exc:
            raise StreamError(str(exc)) from None
        self.input_format = self._input_format()
        parse_trigger(config.trigger)
        if config.jit not in ("auto", "c1", "c2"):
            raise StreamError(f"--jit: expected auto, c1 or c2, got {config.jit!r}")
        # The ordered source lists and logs in a Python process without Hadoop: it
        # takes a local (or mounted) input and checkpoint. Any URI: Spark's own.
        self.ordered_source = not is_uri(config.input) and not is_uri(config.checkpoint)
        if not is_uri(config.input) and not os.path.isdir(config.input):
            raise StreamError(f"--input {config.input}: not a directory")
        self.source_archive_dir = _source_archive_dir(config)
        self.max_file_age_ms = _max_file_age_ms(config.max_file_age)
        self.checkpoint = absolute(config.checkpoint)
        self.root = join(self.checkpoint, "tickwheel")
        self._lock: CheckpointOwner | None = None
        self._store: StateStore | None = None
        if not is_uri(self.checkpoint):  # refused before Spark starts
            self._open_checkpoint(None)
        self._spark = spark
        self._batch_spark: SparkSession | None = None
        self._input_storage: Storage | None = None  # a URI input's, in the batches' session
        self._file_log_path = os.path.join(self.root, "files.log")
        self._file_log: FileLog | None = None  # the source's file log, read in the driver
        self.sink: BatchSink | None = None
        self.options: StepOptions | None = None
        self._adjustment: StateAdjustment | None = None

    def _open_checkpoint(self, spark: SparkSession | None) -> None:
        """Take the checkpoint (refused if a job holds it); a URI one through ``spark``."""
        _root, self._store, self._lock = _checkpoint_root(self.checkpoint, spark)

    @property
    def store(self) -> StateStore:
        """The checkpoint's state store (for a URI checkpoint, once :meth:`run` began)."""
        if self._store is None:
            raise StreamError(f"--checkpoint {self.checkpoint}: not opened yet (run the job)")
        return self._store

    def _input_format(self) -> str:
        from ..rules import RulesError
        from ..spark.maxwell import check_maxwell_rules

        fmt = self.config.input_format or self.rules.input.format
        fmt = "json" if fmt == "jsonl" else fmt
        if fmt not in ("json", "csv", "parquet", "maxwell"):
            raise StreamError(
                f"--input-format: expected jsonl, csv, parquet or maxwell, got {fmt!r}"
            )
        if fmt == "maxwell":
            try:
                check_maxwell_rules(self.rules)
            except RulesError as exc:
                raise StreamError(
                    f"{self.config.rules_path}: --input-format maxwell: {exc}"
                ) from None
        return fmt

    # -- session ------------------------------------------------------------
    def quick_jit(self) -> bool:
        """Whether a JVM this job starts compiles with C1 only. O(new files).

        ``jit`` ``c1`` or ``c2`` decides. ``auto`` takes C1 only for a bounded
        run (``--trigger once`` or ``available-now``) whose new files, those
        the checkpoint's file log has not taken, fit the batch job's crossover
        (:func:`~tickwheel.pipeline.spark.session.quick_jit_for`): such a run
        ends before the optimising compiler pays back. A stream that runs
        until stopped keeps both compilers, as does one on Spark's file source
        (a URI), whose new files are known only once the JVM is up.
        """
        from ..spark.session import quick_jit_for
        from .file_source import FileLog

        if self.config.jit != "auto":
            return self.config.jit == "c1"
        if parse_trigger(self.config.trigger)[0] == "interval" or not self.ordered_source:
            return False  # unbounded, or new files known only once Spark lists them
        log = FileLog(self._file_log_path, repair=False, max_file_age_ns=self._max_file_age_ns())
        new_bytes = 0
        for path, _mtime in log.new_files(self.config.input):
            with contextlib.suppress(FileNotFoundError):  # removed since listed
                new_bytes += os.path.getsize(path)
        return quick_jit_for(self.config.master or "local[2]", new_bytes)

    def _session(self) -> SparkSession:
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        from ..sinks import spark_jdbc_conf
        from ..spark.class_archive import startup_note
        from ..spark.session import STREAM_SESSION_CONF, create_session, set_log_level

        conf = {"spark.sql.session.timeZone": "UTC", **spark_jdbc_conf(), **STREAM_SESSION_CONF}
        if self.config.remote is not None:
            _log(self.config.quiet, f"connecting to Spark Connect at {self.config.remote}")
            self._spark = create_session(
                remote=self.config.remote,
                app_name="tickwheel-stream",
                shuffle_partitions=self.config.partitions or 4,
                conf=conf,
            )
            return self._spark
        master = self.config.master or "local[2]"
        archive, classes = startup_note(master)
        quick = self.quick_jit()
        if SparkSession.getActiveSession() is None:  # else the JVM is up already
            jit = "JIT: C1 only" if quick else "JIT: C1 and C2"
            _log(
                self.config.quiet,
                f"starting Spark ({'; '.join(filter(None, (master, jit, classes)))})",
            )
        spark = create_session(
            master=master,
            app_name="tickwheel-stream",
            shuffle_partitions=self.config.partitions or 4,
            conf=conf,
            class_archive=archive,
            driver_memory=self.config.driver_memory,
            quick_jit=quick,
        )
        set_log_level(spark, "ERROR")
        self._spark = spark
        return spark

    def _batch_session(self, base: SparkSession | None = None) -> SparkSession:
        """The session the micro-batches read their files in: a child of ``base``
        (the micro-batch frame's session; default :meth:`_session`).

        Made once by :func:`~tickwheel.pipeline.spark.session.job_session`, with
        the pipeline's job settings; the caller's session is not changed. Under
        Spark Connect the micro-batches run in a Python process beside the
        server, where the frame's session is the one to build on.
        """
        if self._batch_spark is None:
            from ..spark.session import job_session

            self._batch_spark = job_session(base if base is not None else self._session())
        return self._batch_spark

    def __getstate__(self) -> dict[str, Any]:
        """What Spark Connect ships of the job to the process that runs ``foreachBatch``:
        no session, lock or open log (that process makes its own). O(1)."""
        state = dict(self.__dict__)
        state.update(_spark=None, _batch_spark=None, _file_log=None, _lock=None,
                     _input_storage=None)  # fmt: skip
        return state

    def close(self) -> None:
        """Release the checkpoint lock (the SparkSession is left to its owner)."""
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> StreamJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ------------------------------------------------------------
    def _on_batch(
        self, files_df: DataFrame, batch_id: int
    ) -> tuple[Mapping[str, Any], dict[str, Any]]:
        """Micro-batch ``batch_id`` of the files the source listed (in its order).

        A replay reuses the plan its first attempt wrote, files included.
        """

        def new_plan() -> dict[str, Any]:
            files = self._files(files_df, batch_id)
            return _new_plan(batch_id, files=files, input=absolute(self.config.input),
                             input_format=self.input_format)  # fmt: skip

        self._batch_session(files_df.sparkSession)
        plan = self.store.plan(batch_id, new_plan)
        return plan, self._run_batch(batch_id, plan)

    def _files(self, files_df: DataFrame, batch_id: int) -> list[str]:
        """The files of micro-batch ``batch_id``: from the logs, else from its rows.

        Spark's file source (a URI) gives its rows, taken here in (modification
        time, name) order, as the ordered source logs them.
        """
        from .file_source import FileLog, logged_batch_files

        if not self.ordered_source:
            rows = files_df.select("modificationTime", "path").collect()
            return [path for _mtime, path in sorted((r[0], r[1]) for r in rows)]
        if self._file_log is None:
            self._file_log = FileLog(self._file_log_path, repair=False)
        spark_checkpoint = _spark_checkpoint(self.checkpoint)
        listed = logged_batch_files(spark_checkpoint, self._file_log, batch_id)
        if listed is None:  # not the offsets this source logs: one Spark job reads the rows
            listed = [r["path"] for r in files_df.collect()]
        return listed

    def _run_batch(self, batch_id: int, plan: Mapping[str, Any]) -> dict[str, Any]:
        """Compute and commit micro-batch ``batch_id`` from its plan's files; its counts."""
        assert self.sink is not None and self.options is not None
        batch = self._files_input(plan)
        return MicroBatch(
            self.rules, self.store, self.sink, self.options, batch, self._adjustment,
            outcome_counts=self.config.progress_metrics,
        ).run()  # fmt: skip

    def _files_input(self, plan: Mapping[str, Any]) -> MicroBatchInput:
        """The plan's files as the micro-batch's records, refused files and heartbeats."""
        from ..spark.frames import empty_frame

        spark = self._batch_session()
        files, storage = list(plan["files"]), self._storage_of_input()
        if not is_uri(self.config.input):  # Spark's file source, and older plans: file:/...
            files = [local_path(p) for p in files]
        markers = [p for p in files if p.endswith(HEARTBEAT_SUFFIX) and storage.exists(p)]
        times, refused = read_heartbeats(markers, self.rules, storage)
        records, unread = read_files(
            spark, [p for p in files if p not in markers], self.input_format, storage
        )
        if records is None:
            records = empty_frame(spark, "value string")
        return MicroBatchInput(records, plan, [*refused, *unread], times)

    def _storage_of_input(self) -> Storage:
        """Where the input's files are read: locally, or through the batches' session."""
        if self._input_storage is None:
            from ..storage import LocalStorage

            self._input_storage = (
                LocalStorage()
                if not is_uri(self.config.input)
                else storage_for(self.config.input, self._batch_session())
            )
        return self._input_storage

    def _source(self, spark: SparkSession) -> DataFrame:
        """The query's streaming frame of new files: the ordered source, else Spark's own."""
        from .file_source import BINARY_FILE_SCHEMA, SOURCE_NAME, OrderedFileSource

        options = self._source_options()
        if self.ordered_source:
            # Spark's own file source orders files by modification time only; this
            # one by (modification time, name), logged in the checkpoint.
            spark.dataSource.register(OrderedFileSource)
            reader = spark.readStream.format(SOURCE_NAME).option("log", self._file_log_path)
            return reader.options(**options).load(os.path.abspath(self.config.input))
        try:
            found = storage_for(self.config.input, spark).exists(self.config.input)
        except StorageError as exc:
            raise StreamError(f"--input {exc}") from None
        if not found:
            raise StreamError(f"--input {self.config.input}: not found")
        # binaryFile's rows without their content column: Spark reads no bytes.
        reader = spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA)
        return reader.options(**options).load(self.config.input).select("path", "modificationTime")

    def _source_options(self) -> dict[str, str]:
        """The file source's options, by Spark's names, which both sources take. O(1).

        Without ``--max-file-age``, Spark's own source keeps its default (7 days).
        """
        options: dict[str, str] = {}
        if self.config.max_files_per_trigger:
            options["maxFilesPerTrigger"] = str(self.config.max_files_per_trigger)
        if self.config.clean_source != "off":
            options["cleanSource"] = self.config.clean_source
        if self.source_archive_dir is not None:
            options["sourceArchiveDir"] = self.source_archive_dir
        if self.max_file_age_ms is not None:
            options["maxFileAge"] = f"{self.max_file_age_ms}ms"
        return options

    def _max_file_age_ns(self) -> int | None:
        """``--max-file-age`` in ns, as the file log compares modification times."""
        return None if self.max_file_age_ms is None else self.max_file_age_ms * 1_000_000

    def run(self) -> dict[str, Any]:
        """Run the query to the end of the trigger (once / available-now) or forever."""
        from ..sinks import make_sink
        from ..spark.session import is_classic

        spark = self._session()
        if self._lock is None:
            self._open_checkpoint(spark)
        config = self.config
        try:
            self._adjustment = _before_first_batch(
                spark, self.store, self.rules, input_format=self.input_format,
                drop_incompatible_state=config.drop_incompatible_state, quiet=config.quiet,
            )  # fmt: skip
        except WorkersError as exc:
            raise StreamError(str(exc)) from None
        before = self.store.committed()
        jvm_pid = None
        if is_classic(spark):  # a Connect client has no JVM of its own to wait for
            with contextlib.suppress(Exception):
                jvm = spark.sparkContext._jvm
                assert jvm is not None
                jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        assert self._lock is not None
        self._lock.write_owner(jvm_pid)
        self.sink = make_sink(config.sink, config.output, spark, url=config.jdbc_url)
        _log(config.quiet, f"rules {self.rules.names}, input {config.input} ({self.input_format}),"
             f" sink {self.sink.describe()}, checkpoint {self.checkpoint}")  # fmt: skip
        self.options = StepOptions(
            partitions=config.partitions,
            rows_per_partition=config.rows_per_partition,
            max_future_ms=config.max_future_ms,
            input_format="columns"
            if self.input_format in ("csv", "parquet")
            else self.input_format,
        )
        spool = _progress_spool(config.progress_metrics)
        publish = spool.write if spool is not None else None
        runner = BatchRunner(self.store, self.sink, self._on_batch, config.quiet, publish)
        writer = self._source(spark).writeStream.foreachBatch(runner)
        writer = writer.option("checkpointLocation", _spark_checkpoint(self.checkpoint))
        started = time.perf_counter()
        query = _with_trigger(writer, config.trigger).start()
        companion = None
        try:
            companion = _start_companion(spark, query, spool)
            query.awaitTermination()
        finally:
            if query.isActive:
                query.stop()
            if companion is not None:
                _drain_and_stop(companion)
        summary = runner.summary(time.perf_counter() - started)
        if not is_classic(spark):
            # foreachBatch ran in a process beside the Connect server, which printed
            # each micro-batch's counts; its batch ids are consecutive.
            last = self.store.committed()
            summary["batches_run"] = (last[-1] if last else -1) - (before[-1] if before else -1)
        _log(config.quiet, f"done: {json.dumps(summary, sort_keys=True)}")
        return summary


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

    root = join(absolute(checkpoint), "tickwheel")
    store = StateStore(root, storage_for(root, spark))
    out: dict[str, DataFrame | None] = {t: sink.read_table(spark, t) for t in TABLES}
    committed = store.committed()
    if not committed:
        out["buffered"] = None
        return out
    last = store.path(committed[-1])
    meta: Mapping[str, Any] = store.meta(committed[-1])
    ops = spark.read.parquet(join(last, "ops"))
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
    events = spark.read.parquet(join(last, "events"))
    watermark = meta.get("watermark")
    out["buffered"] = events if watermark is None else events.where(F.col("time") > watermark)
    return out
