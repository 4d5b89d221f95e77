"""``tickwheel pipeline stream``: a directory of arriving files through the stream.

:class:`FileStreamJob` starts (or joins) its session, takes the checkpoint, and
runs the query of its input directory (:mod:`.file_input`), assembled as
:func:`~.start.start_stream`'s is (:func:`~.query.start_query`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..rules import Rules, load_rules
from ..spark.placement import MICRO_BATCH_ROWS_PER_PARTITION
from ..spark.records import DEFAULT_MAX_FUTURE_MS
from ..spark.step import StepOptions
from ..spark.workers import WorkersError
from ..storage import absolute, is_uri
from .checkpoint import StateStore, StreamError, take_checkpoint
from .file_input import InputFiles
from .micro_batch import MicroBatchInput
from .query import before_first_batch, parse_trigger, start_query
from .resident import HeldState, parse_bytes
from .runner import StreamStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..sinks import BatchSink

__all__ = [
    "FileStreamJob",
    "StreamConfig",
]

logger = logging.getLogger(__name__)


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
    # ``partitions`` (spark.placement.MICRO_BATCH_ROWS_PER_PARTITION).
    rows_per_partition: int = MICRO_BATCH_ROWS_PER_PARTITION
    max_files_per_trigger: int | None = None
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    master: str | None = None
    remote: str | None = None  # a Spark Connect URL (sc://host:port), instead of master
    driver_memory: str | None = None  # default: spark.session.default_driver_memory()
    jit: str = "auto"  # auto | c1 | c2: see FileStreamJob.quick_jit
    # The driver's bound on the state it holds (bytes, or "3g"); past it, the executors
    # hold it. None: TICKWHEEL_DRIVER_STATE_BYTES, else a share of the machine's memory.
    driver_state_bytes: int | str | None = None
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


class FileStreamJob:
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
        self.files = InputFiles(
            config.input, config.checkpoint, self.rules, self.input_format,
            max_files_per_trigger=config.max_files_per_trigger,
            clean_source=config.clean_source, source_archive_dir=config.source_archive_dir,
            max_file_age=config.max_file_age,
        )  # fmt: skip
        #: The state between micro-batches, held by the process that runs them.
        bound = config.driver_state_bytes
        try:
            bound = None if bound is None else parse_bytes(bound, "--driver-state-bytes")
            self.held = HeldState(state_bytes=bound)
        except ValueError as exc:  # the option's, or the environment's
            raise StreamError(str(exc)) from None
        self.checkpoint = absolute(config.checkpoint)
        self._store: StateStore | None = None
        if not is_uri(self.checkpoint):  # refused before Spark starts
            self._store = take_checkpoint(self.checkpoint)
        self._spark = spark
        self._batch_spark: SparkSession | None = None
        #: The sink, once :meth:`run` made it.
        self.sink: BatchSink | None = None

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

        if self.config.jit != "auto":
            return self.config.jit == "c1"
        if parse_trigger(self.config.trigger)[0] == "interval":
            return False  # unbounded
        new_bytes = self.files.new_bytes()
        if new_bytes is None:  # new files known only once Spark lists them
            return False
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
        no session (that process makes its own; the store's owner carries its token,
        not its lock). O(1)."""
        return {**self.__dict__, "_spark": None, "_batch_spark": None}

    def close(self) -> None:
        """Release the checkpoint (the SparkSession is left to its owner)."""
        if self._store is not None and self._store.owner is not None:
            self._store.owner.release()

    def __enter__(self) -> FileStreamJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ------------------------------------------------------------
    def _batch_input(self, files_df: DataFrame, batch_id: int) -> MicroBatchInput:
        """Micro-batch ``batch_id``'s plan and records (:meth:`.InputFiles.batch_input`), read
        in the batches' session."""
        spark = self._batch_session(files_df.sparkSession)
        return self.files.batch_input(files_df, batch_id, self.store, spark)

    def run(self) -> dict[str, Any]:
        """Run the query to the end of the trigger (once / available-now) or forever."""
        from ..sinks import make_sink
        from ..spark.session import is_classic

        spark = self._session()
        if self._store is None:  # a URI checkpoint, taken through the session
            self._store = take_checkpoint(self.checkpoint, spark)
        config = self.config
        try:
            adjustment = before_first_batch(
                spark, self.store, self.rules, input_format=self.input_format,
                drop_incompatible_state=config.drop_incompatible_state,
            )  # fmt: skip
        except WorkersError as exc:
            raise StreamError(str(exc)) from None
        before = self.store.committed()
        self.sink = sink = make_sink(config.sink, config.output, spark, url=config.jdbc_url)
        logger.info("%s", f"rules {self.rules.names}, input {config.input} ({self.input_format}),"
             f" sink {sink.describe()}, checkpoint {self.checkpoint}")  # fmt: skip
        step = StreamStep(
            self.rules, self._step_options(), self.input_format, adjustment,
            outcome_counts=config.progress_metrics,
        )  # fmt: skip
        started = time.perf_counter()
        running = start_query(
            self.files.source(spark), step, sink, self.store, config.trigger,
            inputs=self._batch_input, held=self.held, progress_metrics=config.progress_metrics,
            record_driver_jvm=True,
        )  # fmt: skip
        running.wait()
        summary = running.runner.summary(time.perf_counter() - started)
        if not is_classic(spark):
            # foreachBatch ran in a process beside the Connect server, which printed
            # each micro-batch's counts; its batch ids are consecutive.
            last = self.store.committed()  # listed anew by the runner's summary
            summary["batches_run"] = (last[-1] if last else -1) - (before[-1] if before else -1)
        logger.info("done: %s", json.dumps(summary, sort_keys=True))
        return summary

    def _step_options(self) -> StepOptions:
        """The step's options from the command's: CSV and Parquet files are read as
        columns. O(1)."""
        config, form = self.config, self.input_format
        return StepOptions(
            partitions=config.partitions,
            rows_per_partition=config.rows_per_partition,
            max_future_ms=config.max_future_ms,
            input_format="columns" if form in ("csv", "parquet") else form,
        )
