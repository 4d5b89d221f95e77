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

The log is ``CK/tickwheel/files.log``, one JSON object per line, fsynced on
each append. A torn last line (a crash mid-append) is dropped when it is read.
The driver learns a micro-batch's files from this log and the offsets Spark
logged for the batch (:func:`logged_batch_files`), without reading its rows.

It is a PySpark Python data source (``tickwheel_files``, Spark 4.2 or newer for
``maxFilesPerTrigger``), so Spark's streaming engine still runs the triggers,
the offset and commit logs, and ``foreachBatch``. Its rows are ``path`` and
``length`` (None when the file is gone by the time it is read).
"""

from __future__ import annotations

import json
import os
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

__all__ = [
    "BINARY_FILE_SCHEMA",
    "FileLog",
    "OrderedFileSource",
    "list_new_files",
    "logged_batch_files",
]

SOURCE_NAME = "tickwheel_files"

#: The schema of Spark's ``binaryFile`` source, which a streaming reader must be
#: given; the stream takes it for an input at a URI, where this source cannot list.
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"


def list_new_files(directory: str, seen: set[str]) -> list[str]:
    """Absolute paths of the files in ``directory`` not in ``seen``, by (mtime, name).

    O(n log n) in the directory's entries.
    """
    found: list[tuple[int, str, str]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith((".", "_")) or not entry.is_file():
                continue
            path = os.path.abspath(entry.path)
            if path in seen:
                continue
            try:
                mtime = entry.stat().st_mtime_ns
            except FileNotFoundError:  # removed while listed
                continue
            found.append((mtime, entry.name, path))
    found.sort()
    return [path for _mtime, _name, path in found]


class FileLog:
    """The append-only, ordered list of the files the source has taken."""

    def __init__(self, path: str, *, repair: bool = True) -> None:
        """Load the log at ``path`` (created on the first append). O(entries).

        ``repair`` (the source's own log, before it appends): a torn last line,
        left by a crash mid-append, is cut off. A reader beside a running source
        passes False: a partial last line may be an append in progress, which
        a later :meth:`refresh` reads once it is whole.
        """
        self.path = path
        self.paths: list[str] = []
        self._seen: set[str] = set()
        self._read = 0  # bytes of whole lines read so far
        self.refresh(repair=repair)

    def __len__(self) -> int:
        return len(self.paths)

    def refresh(self, *, repair: bool = False) -> int:
        """Read the whole lines appended since the last read; return how many. O(new)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._read)
                data = fh.read()
        except FileNotFoundError:
            return 0
        complete = data[: data.rfind(b"\n") + 1]
        if repair and len(complete) != len(data):  # a torn append: drop it
            with open(self.path, "r+b") as fh:
                fh.truncate(self._read + len(complete))
        lines = complete.splitlines()
        for line in lines:
            path = json.loads(line)["path"]
            self.paths.append(path)
            self._seen.add(path)
        self._read += len(complete)
        return len(lines)

    def take_new(self, directory: str) -> int:
        """Append the directory's new files, in order, durably; return how many. O(listing)."""
        new = list_new_files(directory, self._seen)
        if new:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            appended = b"".join(json.dumps({"path": path}).encode() + b"\n" for path in new)
            with open(self.path, "ab") as fh:
                fh.write(appended)
                fh.flush()
                os.fsync(fh.fileno())
            self.paths.extend(new)
            self._seen.update(new)
            self._read += len(appended)
        return len(new)


def logged_batch_files(spark_checkpoint: str, log: FileLog, batch_id: int) -> list[str] | None:
    """The files micro-batch ``batch_id`` takes, from the offsets Spark logged for it.

    Before a batch runs, Spark's streaming engine writes its end offset to
    ``<spark_checkpoint>/offsets/<batch_id>`` (a version line, a metadata
    line, then one offset per source); its start is the previous batch's
    end. This source's offsets are positions in ``log`` (read beside the
    running source: ``repair=False``), so the batch's files are a slice of
    it, known in the driver without running the batch's rows through a Spark
    job and a Python worker. None when the offsets are not one
    ``{"taken": n}`` per batch, or ``log`` is shorter than they say: then
    read the rows. O(1) plus the log's new entries.
    """
    start, end = (
        _logged_offset(spark_checkpoint, batch_id - 1),
        _logged_offset(spark_checkpoint, batch_id),
    )
    if start is None or end is None or start > end:
        return None
    if end > len(log):
        log.refresh()
    return log.paths[start:end] if end <= len(log) else None


def _logged_offset(spark_checkpoint: str, batch_id: int) -> int | None:
    """``taken`` of the offset Spark logged for ``batch_id`` (0 before the first)."""
    if batch_id < 0:
        return 0
    try:
        with open(os.path.join(spark_checkpoint, "offsets", str(batch_id)), "rb") as fh:
            lines = fh.read().decode("utf-8").splitlines()
        offset = json.loads(lines[2]) if len(lines) == 3 and lines[0] == "v1" else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    taken = offset.get("taken") if isinstance(offset, dict) else None
    return taken if type(taken) is int and taken >= 0 else None


@dataclass(frozen=True)
class FilesPartition(InputPartition):
    """The files of one micro-batch, in order."""

    paths: tuple[str, ...]


class OrderedFileReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets over :class:`FileLog`; see the module doc."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.directory = options["path"]
        self.log = FileLog(options["log"])
        self.max_files = int(options.get("maxFilesPerTrigger") or 0)
        self._end: int | None = None  # the available-now snapshot's end

    def initialOffset(self) -> dict[str, int]:
        return {"taken": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.log.take_new(self.directory)
        self._end = len(self.log)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        taken = int(start["taken"])
        end = self._end
        if end is None:
            if not isinstance(limit, ReadMaxFiles) or len(self.log) - taken < limit.max_files:
                self.log.take_new(self.directory)
            end = len(self.log)
        if isinstance(limit, ReadMaxFiles):
            end = min(end, taken + limit.max_files)
        return {"taken": max(end, taken)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        paths = tuple(self.log.paths[int(start["taken"]) : int(end["taken"])])
        return [FilesPartition(paths)] if paths else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, FilesPartition)
        for path in partition.paths:
            try:
                length: int | None = os.path.getsize(path)
            except FileNotFoundError:
                length = None
            yield (path, length)


class OrderedFileSource(DataSource):
    """``spark.readStream.format("tickwheel_files")``: options ``path``, ``log``,
    ``maxFilesPerTrigger``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return "path string, length long"

    def streamReader(self, schema: Any) -> OrderedFileReader:
        return OrderedFileReader(self.options)
