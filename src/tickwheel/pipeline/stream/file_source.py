"""The stream's file source: new files in (modification time, name) order.

Spark's own file source orders new files by modification time alone. Files
copied into the input together often share one, and then a
``maxFilesPerTrigger`` micro-batch may take the sixth file before the second:
the events of the files it skipped arrive behind the watermark, as late. This
source promises the order:

* each listing takes the input directory's new files (regular files; names
  starting with ``.`` or ``_`` are ignored, as Spark ignores them) and appends
  them to a **file log** in (modification time, name) order;
* an offset is a position in that log (``{"taken": n}``), so a micro-batch is a
  slice of it, and Spark's offset log pins which files each batch took: a
  replay after a crash takes the same files;
* a file that appears later with an older modification time (``cp -p``, say)
  comes after the files already logged: the log never reorders what it took.

It takes Spark's file source options ``cleanSource`` (``archive`` to
``sourceArchiveDir``, or ``delete``, once Spark has committed a file's batch)
and ``maxFileAge`` (ignore files older than the newest one seen minus the
age), with Spark's semantics (:class:`OrderedFileReader`, :class:`FileLog`),
but no age limit by default where Spark has 7 days: a source that silently
skips week-old files surprises whoever replays history into the input.

The log is ``CK/tickwheel/files.log`` (:class:`~.file_log.FileLog`, in
:mod:`.file_log`, which imports no pyspark), compacted as Spark commits
batches; the driver learns a micro-batch's files from it and the offsets
Spark logged for the batch (:func:`~.file_log.logged_batch_files`).

It is a PySpark Python data source (``tickwheel_files``, Spark 4.2 or newer for
``maxFilesPerTrigger``), so Spark's streaming engine still runs the triggers,
the offset and commit logs, and ``foreachBatch``. Its rows are ``path`` and
``length`` (None when the file is gone by the time it is read).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from .file_log import (
    FileLog,
    TakenFile,
    list_new_files,
    logged_batch_files,
)

__all__ = [
    "BINARY_FILE_SCHEMA",
    "CLEAN_SOURCE_MODES",
    "FileLog",
    "OrderedFileSource",
    "SourceCleaner",
    "TakenFile",
    "list_new_files",
    "logged_batch_files",
]

SOURCE_NAME = "tickwheel_files"

#: The schema of Spark's ``binaryFile`` source, which a streaming reader must be
#: given; the stream takes it for an input at a URI, where this source cannot list.
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"

#: ``cleanSource``'s values, as Spark's file source takes them.
CLEAN_SOURCE_MODES = ("off", "archive", "delete")


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceCleaner:
    """``cleanSource``: what becomes of a file once Spark has committed its batch.

    ``archive`` moves it to ``archive_dir`` followed by its absolute path
    (Spark's rule: ``/in/a.json`` goes to ``ARCHIVE/in/a.json``); ``delete``
    removes it. As Spark's, a failure is a warning, not an error: the file
    stays, and the log keeps remembering it.
    """

    mode: str  # archive | delete
    archive_dir: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceCleaner | None:
        """The cleaner ``cleanSource`` and ``sourceArchiveDir`` ask for (None: off). O(1)."""
        mode = (options.get("cleanSource") or "off").lower()
        if mode not in CLEAN_SOURCE_MODES:
            raise ValueError(f"cleanSource: expected off, archive or delete, got {mode!r}")
        if mode != "archive":
            return None if mode == "off" else cls(mode)
        archive_dir = options.get("sourceArchiveDir")
        if not archive_dir:
            raise ValueError("cleanSource archive needs sourceArchiveDir")
        return cls(mode, os.path.abspath(archive_dir))

    def destination(self, path: str) -> str:
        """Where ``archive`` moves the file at the absolute ``path``. O(len)."""
        assert self.archive_dir is not None
        return self.archive_dir.rstrip(os.sep) + path

    def clean(self, taken: TakenFile) -> bool:
        """Archive or delete ``taken``; whether its path no longer holds it. O(1) file
        operations (an archive to another file system copies the file)."""
        try:
            mtime = os.stat(taken.path).st_mtime_ns
        except FileNotFoundError:
            return True  # gone already (cleaned before a crash, or by someone else)
        if taken.mtime_ns is not None and mtime != taken.mtime_ns:
            # Another file under the name, or the file changed since it was taken:
            # not what the committed batch read, so it is not this source's to clean.
            logger.warning("cleanSource: %s changed since it was taken; left in place", taken.path)
            return False
        try:
            if self.mode == "delete":
                os.remove(taken.path)
            else:
                self._move(taken.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            logger.warning("cleanSource %s: %s left in place: %s", self.mode, taken.path, exc)
            return False
        return True

    def _move(self, path: str) -> None:
        target = self.destination(path)
        if os.path.lexists(target):  # an earlier file of that name: never overwritten
            raise FileExistsError(errno.EEXIST, "already in the archive", target)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.rename(path, target)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.move(path, target)  # another file system: copied, then removed


@dataclass(frozen=True)
class FilesPartition(InputPartition):
    """The files of one micro-batch, in order."""

    paths: tuple[str, ...]


class OrderedFileReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets over :class:`FileLog`; see the module doc."""

    def __init__(self, options: Mapping[str, str]) -> None:
        from ..rules import parse_duration

        self.directory = options["path"]
        age = options.get("maxFileAge")
        self.log = FileLog(
            options["log"],
            max_file_age_ns=parse_duration(age, "maxFileAge") * 1_000_000 if age else None,
        )
        self.max_files = int(options.get("maxFilesPerTrigger") or 0)
        self.cleaner = SourceCleaner.from_options(options)
        self._end: int | None = None  # the available-now snapshot's end

    def initialOffset(self) -> dict[str, int]:
        return {"taken": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.log.take_new(self.directory)
        self._end = self.log.end

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        taken = int(start["taken"])
        end = self._end
        if end is None:
            if not isinstance(limit, ReadMaxFiles) or self.log.end - taken < limit.max_files:
                self.log.take_new(self.directory)
            end = self.log.end
        if isinstance(limit, ReadMaxFiles):
            end = min(end, taken + limit.max_files)
        return {"taken": max(end, taken)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        first, after = int(start["taken"]), int(end["taken"])
        files = self.log.files(first, after)
        if files is None:  # the log drops only positions Spark committed
            raise ValueError(
                f"{self.log.path}: positions {first} to {after} are not in the file log "
                f"(it holds {self.log.base} to {self.log.end})"
            )
        return [FilesPartition(tuple(taken.path for taken in files))] if files else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, FilesPartition)
        for path in partition.paths:
            try:
                length: int | None = os.path.getsize(path)
            except FileNotFoundError:
                length = None
            yield (path, length)

    def commit(self, end: dict[str, int]) -> None:
        """Spark committed every batch up to ``end``: clean their files and let the
        log forget what it need not remember. O(files committed).

        Spark calls this when it logs the offsets of the batch after ``end``'s,
        which it plans only once that batch is in its commit log, itself
        written after tickwheel's own commit of the batch. A batch Spark may
        replay after a crash (in its offset log, not its commit log) therefore
        never gets here, and its files stay where the replay reads them: keep
        cleaning here, nowhere earlier. The files of a run's last batch are
        cleaned when a later batch is planned, as Spark's own file source does.
        After a restart, the batches since the log's last compaction are
        cleaned again: their files are gone, and so forgotten.
        """
        taken = int(end["taken"])
        committed = self.log.files(self.log.base, max(taken, self.log.base)) or []
        cleaner = self.cleaner
        cleaned = [t.path for t in committed if cleaner.clean(t)] if cleaner is not None else []
        self.log.commit(taken, cleaned)


class OrderedFileSource(DataSource):
    """``spark.readStream.format("tickwheel_files")``: options ``path``, ``log``,
    ``maxFilesPerTrigger``, ``cleanSource`` (``off``, ``archive``, ``delete``),
    ``sourceArchiveDir`` and ``maxFileAge`` (a duration: ``7d``, ``12h``)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return "path string, length long"

    def streamReader(self, schema: Any) -> OrderedFileReader:
        return OrderedFileReader(self.options)
