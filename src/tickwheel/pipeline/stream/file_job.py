"""``tickwheel pipeline stream``: a directory of arriving files through the stream.

:class:`StreamJob` lists new files in (modification time, name) order
(:mod:`.file_source`), and each micro-batch reads its files into a records
frame (:func:`tickwheel.pipeline.spark.files.read_files`); a marker file
(``*.heartbeat``) holding an event time raises the largest event time seen, so
the watermark advances and deadlines fire while input stalls. Its query is
built as :func:`~.start.start_stream`'s is (:mod:`.runner`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..rules import Rules, load_rules
from ..spark.files import HEARTBEAT_SUFFIX, read_files, read_heartbeats
from ..spark.records import DEFAULT_MAX_FUTURE_MS
from ..spark.step import MICRO_BATCH_ROWS_PER_PARTITION, StepOptions
from ..spark.workers import WorkersError
from ..storage import Storage, StorageError, absolute, is_uri, join, local_path, storage_for
from .checkpoint import CheckpointFenced, CheckpointOwner, StateStore, StreamError
from .evolution import StateAdjustment
from .micro_batch import MicroBatch, MicroBatchInput
from .resident import end_resident_state
from .runner import (
    BatchRunner,
    _before_first_batch,
    _checkpoint_root,
    _new_plan,
    _spark_checkpoint,
    _with_trigger,
    parse_trigger,
)
from .start import _drain_and_stop, _progress_spool, _start_companion

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..sinks import BatchSink
    from .file_log import FileLog

__all__ = [
    "StreamConfig",
    "StreamJob",
]

logger = logging.getLogger(__name__)


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
    # No progress lines on the command line (its handler shows warnings only);
    # a library caller configures the tickwheel.pipeline loggers instead.
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
        from .file_log import FileLog

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
            logger.info("connecting to Spark Connect at %s", self.config.remote)
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
            logger.info(
                "%s",
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
        from .file_log import FileLog, logged_batch_files

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
                drop_incompatible_state=config.drop_incompatible_state,
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
        logger.info("%s", f"rules {self.rules.names}, input {config.input} ({self.input_format}),"
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
        except Exception as exc:  # a fenced job says so in one message, not a trace
            fenced = CheckpointFenced.found_in(exc)
            if fenced is None:
                raise
            raise fenced from None
        finally:
            if query.isActive:
                query.stop()
            if companion is not None:
                _drain_and_stop(companion)
        summary = runner.summary(time.perf_counter() - started)
        end_resident_state(self.store)
        if not is_classic(spark):
            # foreachBatch ran in a process beside the Connect server, which printed
            # each micro-batch's counts; its batch ids are consecutive.
            last = self.store.committed()
            summary["batches_run"] = (last[-1] if last else -1) - (before[-1] if before else -1)
        logger.info("done: %s", json.dumps(summary, sort_keys=True))
        return summary
