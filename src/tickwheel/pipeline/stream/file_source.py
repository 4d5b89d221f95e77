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

__all__ = ["FileLog", "OrderedFileSource", "list_new_files"]

SOURCE_NAME = "tickwheel_files"


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

    def __init__(self, path: str) -> None:
        """Load the log at ``path`` (created on the first append). O(entries)."""
        self.path = path
        self.paths: list[str] = []
        self._seen: set[str] = set()
        if os.path.exists(path):
            with open(path, "rb") as fh:
                data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]
            if len(complete) != len(data):  # a torn append: drop it
                with open(path, "r+b") as fh:
                    fh.truncate(len(complete))
            for line in complete.splitlines():
                entry = json.loads(line)
                self.paths.append(entry["path"])
                self._seen.add(entry["path"])

    def __len__(self) -> int:
        return len(self.paths)

    def take_new(self, directory: str) -> int:
        """Append the directory's new files, in order, durably; return how many. O(listing)."""
        new = list_new_files(directory, self._seen)
        if new:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "ab") as fh:
                for path in new:
                    fh.write(json.dumps({"path": path}).encode() + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
            self.paths.extend(new)
            self._seen.update(new)
        return len(new)


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
