"""Spark's file sink log, ``<table>/_spark_metadata/``, written by the Parquet sink.

Spark's own streaming file sink names the files each micro-batch committed
in a log beside the table, and every Spark reader of the directory (classic
or Connect: ``spark.read.parquet(table)``) then reads those files and no
other, whatever else the directory holds (``MetadataLogFileIndex``). The
Parquet sink writes the same log, so a plain reader sees exactly the
committed batches, never the files of a crashed or fenced attempt.

The layout is Spark's (``CompactibleFileStreamLog``, version 1): one file
per batch, ``_spark_metadata/N``, whose first line is ``v1`` and each next
line a JSON ``SinkFileStatus`` (``path`` a URI, ``size``, ``isDir``,
``modificationTime``, ``blockReplication``, ``blockSize``, ``action``); every
:data:`COMPACT_INTERVAL` batches, ``N.compact`` holds every file so far
instead. A reader takes the newest batch and reads back to the last
compaction, so the batch ids must run without a gap from it. Each file is
created once (:meth:`~.storage.Storage.create`): the first writer of a batch
wins, and a second writer with the same files (a roll-forward after a
crash, or a predecessor publishing its own commit) finds it written. As
Spark's sink does, files more than :data:`BATCHES_KEPT` batches older than a
compaction are deleted, so the log stays small.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from ..storage import Storage, join

__all__ = ["BATCHES_KEPT", "COMPACT_INTERVAL", "METADATA_DIR", "FileSinkLog", "SinkFile"]

#: The log's directory in a table's, as Spark's readers look for it.
METADATA_DIR = "_spark_metadata"
#: Spark's default ``spark.sql.streaming.fileSink.log.compactInterval``.
COMPACT_INTERVAL = 10
#: Spark's default ``spark.sql.streaming.minBatchesToRetain``.
BATCHES_KEPT = 100
_VERSION = "v1"


class SinkFile(NamedTuple):
    """One committed file as the log records it (Spark's ``SinkFileStatus``)."""

    uri: str
    size: int
    modification_ms: int
    block_replication: int = 1
    block_size: int = 32 * 1024 * 1024

    def line(self) -> str:
        """The JSON line Spark writes for it, fields in Spark's order. O(1)."""
        return json.dumps(
            {
                "path": self.uri,
                "size": self.size,
                "isDir": False,
                "modificationTime": self.modification_ms,
                "blockReplication": self.block_replication,
                "blockSize": self.block_size,
                "action": "add",
            },
            separators=(",", ":"),
        )


def _is_compaction(batch_id: int) -> bool:
    return (batch_id + 1) % COMPACT_INTERVAL == 0


def _window_start(batch_id: int) -> int:
    """The first batch a reader of ``batch_id`` reads: the last compaction, or 0."""
    return max(0, (batch_id + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1)


class FileSinkLog:
    """The ``_spark_metadata`` log of one table directory; see the module doc."""

    def __init__(self, storage: Storage, table_dir: str) -> None:
        """The log of ``table_dir``; nothing is read until asked. O(1)."""
        self.storage = storage
        self.directory = join(table_dir, METADATA_DIR)

    def _path(self, batch_id: int) -> str:
        suffix = ".compact" if _is_compaction(batch_id) else ""
        return join(self.directory, f"{batch_id}{suffix}")

    def batch_ids(self) -> list[int]:
        """The batches the log holds, in order. One listing."""
        ids = []
        for name in self.storage.list_names(self.directory):
            stem = name.removesuffix(".compact")
            if stem.isdigit():
                ids.append(int(stem))
        return sorted(ids)

    def exists(self) -> bool:
        """Whether the table has a log (then Spark's readers read only what it names)."""
        return self.storage.exists(self.directory)

    def _entries(self, batch_id: int) -> list[str]:
        """One log file's entry lines, its version checked (FileNotFoundError if
        missing). O(entries)."""
        lines = self.storage.read_bytes(self._path(batch_id)).decode("utf-8").split("\n")
        if not lines or lines[0] != _VERSION:
            raise ValueError(f"{self._path(batch_id)}: not a version 1 file sink log")
        return [line for line in lines[1:] if line.strip()]

    def _read(self, batch_id: int) -> list[str]:
        """The URIs one log file adds. O(entries)."""
        entries = (json.loads(line) for line in self._entries(batch_id))
        return [str(e["path"]) for e in entries if e.get("action", "add") == "add"]

    def files(self) -> list[str]:
        """Every committed file's URI, as Spark's readers take them: the newest batch's
        window, from the last compaction. O(files)."""
        ids = self.batch_ids()
        if not ids:
            return []
        uris: list[str] = []
        for batch_id in range(_window_start(ids[-1]), ids[-1] + 1):
            uris.extend(self._read(batch_id))
        return list(dict.fromkeys(uris))

    def add(
        self,
        batch_id: int,
        files: Sequence[SinkFile],
        earlier: Sequence[SinkFile] = (),
        known: Sequence[int] | None = None,
    ) -> bool:
        """Log ``files`` as batch ``batch_id``'s; False when that batch was logged already
        with the same files (ValueError if with others: another stream's output).

        ``earlier`` are files committed before the table had a log (an older
        release's batches): when the log is new they go in its first file, so
        that readers keep reading them. ``known``: the log's batches as the
        caller knows them (:meth:`batch_ids`, or the batch before when it logged
        that one itself); None: listed here. A compaction batch holds every
        file so far. O(files in the compaction window).
        """
        ids = self.batch_ids() if known is None else sorted(known)
        if batch_id in ids:
            self._check_same(batch_id, files)
            return False
        if ids and ids[-1] != batch_id - 1:
            raise ValueError(
                f"{self.directory}: batch {batch_id} follows batch {ids[-1]}; the log must "
                "have every batch (is this output another stream's?)"
            )
        if not ids:
            return self._start(batch_id, files, earlier)
        lines = [f.line() for f in files]
        if _is_compaction(batch_id):
            lines = self._compacted(batch_id) + lines
        if self._create(batch_id, lines):
            return True
        self._check_same(batch_id, files)  # logged meanwhile, by another publication
        return False

    def _compacted(self, batch_id: int) -> list[str]:
        """The entries of the batches a compaction at ``batch_id`` replaces, as lines."""
        lines: list[str] = []
        for earlier in range(max(0, batch_id - COMPACT_INTERVAL), batch_id):
            lines.extend(self._entries(earlier))
        return lines

    def _start(self, batch_id: int, files: Sequence[SinkFile], earlier: Sequence[SinkFile]) -> bool:
        """A new log whose newest batch is ``batch_id``: the files a reader of it reads
        from the window's start, the earlier files in the first (an empty entry for
        the batches between)."""
        start = _window_start(batch_id)
        first = [f.line() for f in earlier]
        if start == batch_id:
            return self._create(batch_id, first + [f.line() for f in files])
        self._create(start, first)
        for between in range(start + 1, batch_id):
            self._create(between, [])
        return self._create(batch_id, [f.line() for f in files])

    def _create(self, batch_id: int, lines: Sequence[str]) -> bool:
        data = "\n".join([_VERSION, *lines]).encode("utf-8")
        try:
            self.storage.create(self._path(batch_id), data)
        except FileExistsError:
            return False
        if _is_compaction(batch_id):
            self._delete_expired(batch_id)
        return True

    def _check_same(self, batch_id: int, files: Sequence[SinkFile]) -> None:
        logged = set(self._read(batch_id))
        if not {f.uri for f in files} <= logged:
            raise ValueError(
                f"{self.directory}: batch {batch_id} is logged with other files than this "
                "commit names (is this output another stream's?)"
            )

    def _delete_expired(self, batch_id: int) -> None:
        """Spark's ``deleteExpiredLog``: keep the compaction at or before the batch
        :data:`BATCHES_KEPT` back, and everything after it. O(log files)."""
        oldest_kept = batch_id + 1 - BATCHES_KEPT
        if oldest_kept < COMPACT_INTERVAL:
            return
        compaction = oldest_kept - oldest_kept % COMPACT_INTERVAL - 1
        for name in self.storage.list_names(self.directory):
            stem = name.removesuffix(".compact")
            if stem.isdigit() and int(stem) < compaction:
                self.storage.delete(join(self.directory, name))
