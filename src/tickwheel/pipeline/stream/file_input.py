"""The input directory of ``tickwheel pipeline stream``: the query's source of new files, and
each micro-batch's records read from the files its plan names.

New files are listed in (modification time, name) order (:mod:`.file_source`),
and each micro-batch reads its files into a records frame
(:func:`tickwheel.pipeline.spark.files.read_files`); a marker file
(``*.heartbeat``) holding an event time raises the largest event time seen, so
the watermark advances and deadlines fire while input stalls.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from ..spark.files import HEARTBEAT_SUFFIX, read_files, read_heartbeats
from ..storage import Storage, StorageError, absolute, is_uri, local_path, storage_for
from .checkpoint import StateStore, StreamError, new_plan, spark_checkpoint, tickwheel_root
from .micro_batch import MicroBatchInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from .file_log import FileLog

__all__ = ["InputFiles"]


class InputFiles:
    """A directory of arriving files as a stream's source and its micro-batches' records.

    Local input and checkpoint take the ordered source (:mod:`.file_source`),
    which lists and logs in a Python process without Hadoop; any URI takes
    Spark's own file source. The options are Spark's file source's:
    ``max_files_per_trigger``, ``clean_source`` (off | archive | delete, with
    ``source_archive_dir`` for archive) and ``max_file_age`` (a duration: ``7d``;
    None: no limit, where Spark's own source keeps its default of 7 days).
    Bad options raise :class:`~.checkpoint.StreamError` naming them.
    """

    def __init__(
        self,
        input: str,
        checkpoint: str,
        rules: Rules,
        input_format: str,
        *,
        max_files_per_trigger: int | None = None,
        clean_source: str = "off",
        source_archive_dir: str | None = None,
        max_file_age: str | None = None,
    ) -> None:
        """Check the options (no Spark). O(1)."""
        self.input, self.checkpoint = input, absolute(checkpoint)
        self.rules, self.input_format = rules, input_format
        self.ordered_source = not is_uri(input) and not is_uri(checkpoint)
        if not is_uri(input) and not os.path.isdir(input):
            raise StreamError(f"--input {input}: not a directory")
        self.max_files_per_trigger, self.clean_source = max_files_per_trigger, clean_source
        self.source_archive_dir = _source_archive_dir(input, clean_source, source_archive_dir)
        self.max_file_age_ms = _max_file_age_ms(max_file_age)
        self.file_log_path = os.path.join(tickwheel_root(self.checkpoint), "files.log")
        self._file_log: FileLog | None = None  # the source's file log, read in the driver
        self._storage: Storage | None = None  # where the files are read

    def __getstate__(self) -> dict[str, Any]:
        """A copy in another process (Spark Connect's ``foreachBatch``) opens its own log and
        storage. O(1)."""
        return {**self.__dict__, "_file_log": None, "_storage": None}

    # -- the source ---------------------------------------------------------------------
    def source(self, spark: SparkSession) -> DataFrame:
        """The query's streaming frame of new files: the ordered source, else Spark's own."""
        from .file_source import BINARY_FILE_SCHEMA, SOURCE_NAME, OrderedFileSource

        options = self.source_options()
        if self.ordered_source:
            # Spark's own file source orders files by modification time only; this
            # one by (modification time, name), logged in the checkpoint.
            spark.dataSource.register(OrderedFileSource)
            reader = spark.readStream.format(SOURCE_NAME).option("log", self.file_log_path)
            return reader.options(**options).load(os.path.abspath(self.input))
        try:
            found = storage_for(self.input, spark).exists(self.input)
        except StorageError as exc:
            raise StreamError(f"--input {exc}") from None
        if not found:
            raise StreamError(f"--input {self.input}: not found")
        # binaryFile's rows without their content column: Spark reads no bytes.
        reader = spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA)
        return reader.options(**options).load(self.input).select("path", "modificationTime")

    def source_options(self) -> dict[str, str]:
        """The file source's options, by Spark's names, which both sources take. O(1)."""
        options: dict[str, str] = {}
        if self.max_files_per_trigger:
            options["maxFilesPerTrigger"] = str(self.max_files_per_trigger)
        if self.clean_source != "off":
            options["cleanSource"] = self.clean_source
        if self.source_archive_dir is not None:
            options["sourceArchiveDir"] = self.source_archive_dir
        if self.max_file_age_ms is not None:
            options["maxFileAge"] = f"{self.max_file_age_ms}ms"
        return options

    def new_bytes(self) -> int | None:
        """The bytes of the files the checkpoint's file log has not taken yet; None when
        only Spark's own source (a URI) knows them, once the JVM is up. O(new files)."""
        from .file_log import FileLog

        if not self.ordered_source:
            return None
        age_ns = None if self.max_file_age_ms is None else self.max_file_age_ms * 1_000_000
        log = FileLog(self.file_log_path, repair=False, max_file_age_ns=age_ns)
        new_bytes = 0
        for path, _mtime in log.new_files(self.input):
            with contextlib.suppress(FileNotFoundError):  # removed since listed
                new_bytes += os.path.getsize(path)
        return new_bytes

    # -- each micro-batch -----------------------------------------------------------------
    def batch_input(
        self, files_df: DataFrame, batch_id: int, store: StateStore, spark: SparkSession
    ) -> MicroBatchInput:
        """Micro-batch ``batch_id`` of the files the source listed (in its order): its
        plan, and the plan's files read in ``spark`` as its records. A replay reuses
        the plan its first attempt wrote, files included."""

        def make_plan() -> dict[str, Any]:
            files = self._files(files_df, batch_id, store)
            return new_plan(batch_id, files=files, input=absolute(self.input),
                            input_format=self.input_format)  # fmt: skip

        return self._records(store.plan(batch_id, make_plan), spark)

    def _files(self, files_df: DataFrame, batch_id: int, store: StateStore) -> list[str]:
        """The files of micro-batch ``batch_id``: from the logs, else from its rows.

        Spark's file source (a URI) gives its rows, taken here in (modification
        time, name) order, as the ordered source logs them; its own log, read
        through the checkpoint's storage, names the same files in that order.
        """
        from .file_log import FileLog, logged_batch_files, spark_source_batch_files

        if not self.ordered_source:
            logged = spark_source_batch_files(
                spark_checkpoint(self.checkpoint), batch_id, store.storage
            )
            if logged is not None:
                return logged
            rows = files_df.select("modificationTime", "path").collect()
            return [path for _mtime, path in sorted((r[0], r[1]) for r in rows)]
        if self._file_log is None:
            self._file_log = FileLog(self.file_log_path, repair=False)
        listed = logged_batch_files(spark_checkpoint(self.checkpoint), self._file_log, batch_id)
        if listed is None:  # not the offsets this source logs: one Spark job reads the rows
            listed = [r["path"] for r in files_df.collect()]
        return listed

    def _records(self, plan: Mapping[str, Any], spark: SparkSession) -> MicroBatchInput:
        """The plan's files as the micro-batch's records, refused files and heartbeats."""
        from ..spark.frames import empty_frame

        files, storage = list(plan["files"]), self._storage_in(spark)
        if not is_uri(self.input):  # Spark's file source, and older plans: file:/...
            files = [local_path(p) for p in files]
        markers = [p for p in files if p.endswith(HEARTBEAT_SUFFIX) and storage.exists(p)]
        times, refused = read_heartbeats(markers, self.rules, storage)
        records, unread = read_files(
            spark, [p for p in files if p not in markers], self.input_format, storage
        )
        if records is None:
            records = empty_frame(spark, "value string")
        return MicroBatchInput(records, plan, [*refused, *unread], times)

    def _storage_in(self, spark: SparkSession) -> Storage:
        """Where the input's files are read: locally, or through ``spark``."""
        if self._storage is None:
            from ..storage import LocalStorage

            self._storage = (
                LocalStorage() if not is_uri(self.input) else storage_for(self.input, spark)
            )
        return self._storage


def _within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or under it; local paths compared with their
    links resolved, as the files would be reached. O(len)."""
    path, directory = local_path(path), local_path(directory)
    if is_uri(path) or is_uri(directory):
        return (path.rstrip("/") + "/").startswith(directory.rstrip("/") + "/")
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def _source_archive_dir(input: str, mode: str, archive: str | None) -> str | None:
    """``--source-archive-dir`` made absolute, once the clean-source options agree. O(1).

    ``archive`` needs the directory and ``off``/``delete`` take none; it must
    not be inside the input, where the archived files would be listed again
    (Spark's file source refuses that too).
    """
    from .file_source import CLEAN_SOURCE_MODES

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
    if _within(archive, absolute(input)):
        raise StreamError(
            f"--source-archive-dir {archive} is inside --input {input}: the archived "
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
