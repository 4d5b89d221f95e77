"""The file log of the stream's file source: the files it took, in (modification time,
name) order, at absolute positions.

The log is ``CK/tickwheel/files.log``, one JSON object per line, fsynced on
each append; a torn last line (a crash mid-append) is dropped when it is read.
Positions are absolute, and the log is compacted as Spark commits batches, so
its size and the source's memory follow the files that must be remembered,
not every file ever taken (:class:`FileLog` has the layout). The driver learns
a micro-batch's files from this log and the offsets Spark logged for the
batch (:func:`logged_batch_files`), without reading its rows; where Spark's own
file source runs instead (a URI), from that source's log
(:func:`spark_source_batch_files`).

This module imports no pyspark: the checkpoint's status
(:mod:`.status`) reads the log where Spark is not installed, and the source
(:mod:`.file_source`) builds on it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from ..storage import LocalStorage, Storage, fsync_directory, join

__all__ = [
    "COMPACT_EVERY",
    "LOG_FORMAT",
    "FileLog",
    "TakenFile",
    "list_new_files",
    "logged_batch_files",
    "spark_source_batch_files",
    "spark_source_logged_paths",
]

#: The file log's layout version, written in the header of a compacted log.
LOG_FORMAT = 2

#: Commits between compactions of the file log (Spark's compactible logs' default
#: interval): each compaction rewrites what the log remembers, so it is spread out.
COMPACT_EVERY = 10


class TakenFile(NamedTuple):
    """A file the source has taken: its absolute path and modification time in ns
    (None in the entries of a log written before the time was logged)."""

    path: str
    mtime_ns: int | None


def list_new_files(directory: str, takes: Callable[[str, int], bool]) -> list[TakenFile]:
    """The files in ``directory`` that ``takes(path, mtime_ns)`` accepts, by
    (modification time, name): :meth:`FileLog.take_rule` as the source lists.

    Hidden files (``.``, ``_``) and directories are never taken. The listing
    reads the whole directory, as Spark's does: O(n log n) in its entries.
    """
    found: list[tuple[int, str, str]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith((".", "_")) or not entry.is_file():
                continue
            path = os.path.abspath(entry.path)
            try:
                mtime = entry.stat().st_mtime_ns
            except FileNotFoundError:  # removed while listed
                continue
            if takes(path, mtime):
                found.append((mtime, entry.name, path))
    found.sort()
    return [TakenFile(path, mtime) for mtime, _name, path in found]


def _entry_line(taken: TakenFile) -> bytes:
    """``taken`` as a line of the file log (an unknown time is left out)."""
    entry: dict[str, Any] = {"path": taken.path}
    if taken.mtime_ns is not None:
        entry["mtime"] = taken.mtime_ns
    return json.dumps(entry).encode() + b"\n"


class FileLog:
    """The ordered record of the files the source took, compacted as batches commit.

    Positions are absolute: the n-th file ever taken is at position n, whatever
    was compacted away, so the offsets in Spark's offset log stay valid. The
    log holds:

    * the **entries** from position ``base`` on, in order: the files of the
      batches Spark has not committed (and, until the next compaction, the
      committed ones after the last compaction's base);
    * what it **remembers** (``path in log``): every path a listing must not
      take again. That is each entry, and each file taken before ``base`` that
      is not forgotten. A file is forgotten once ``cleanSource`` has moved or
      deleted it after its batch committed (or found it gone), and, with
      ``maxFileAge``, once it is older than :meth:`ignore_before_ns`, below
      which no file is taken anyway;
    * for ``maxFileAge``: the newest modification time logged, and the age
      limit a compaction applied, which never goes down (the files it forgot
      must not come back).

    The file: one JSON object per line. A log never compacted is its entries,
    ``{"path": P, "mtime": NS}`` (the release before wrote ``{"path": P}``),
    from position 0. A compaction writes a header first::

        {"files_log": 2, "generation": G, "base": B, "seen": S, "newest_ns": M,
         "ignore_before_ns": T, "max_file_age_ns": A}

    then ``S`` entries remembered from before ``B``, then the entries from
    ``B`` on; appends go on after them. It writes the new log beside the old
    one (``files.log.new``), fsyncs it and renames it over the old one, so a
    crash leaves one whole log or the other. A reader beside the source
    notices the new ``generation`` in the first line and reads the new log.

    The source compacts every :data:`COMPACT_EVERY` commits that forgot a
    file, and when its ``maxFileAge`` differs from the one the header records
    (so that a status report applies the same limit). Its memory and the
    file's size are then bounded by the batches not yet committed, the files
    not cleaned, and, without ``cleanSource``, those within ``maxFileAge``;
    with neither option the log remembers every file, as Spark's does.
    """

    def __init__(
        self, path: str, *, repair: bool = True, max_file_age_ns: int | None = None
    ) -> None:
        """Load the log at ``path`` (created on the first append). O(its lines).

        ``repair`` (the source's own log, before it appends): a torn last line,
        left by a crash mid-append, is cut off, and a compacted log a crash left
        unswitched (``files.log.new``) is removed. A reader beside a running
        source passes False: a partial last line may be an append in progress,
        which a later :meth:`refresh` reads once it is whole.
        ``max_file_age_ns`` is ``maxFileAge`` (None: no age limit).
        """
        self.path = path
        self.max_file_age_ns = max_file_age_ns
        self._clear()
        if repair:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._next_path)
        self.refresh(repair=repair)

    @classmethod
    def from_bytes(cls, data: bytes) -> FileLog:
        """The log whose file holds ``data``, read elsewhere (a status report), with the
        age limit its header records. O(lines)."""
        log = cls.__new__(cls)
        log.path = ""
        log._clear()
        log._read_lines(data[: data.rfind(b"\n") + 1])
        log.max_file_age_ns = log.recorded_max_file_age_ns
        return log

    def _clear(self) -> None:
        """Forget everything read: the state of a log not read yet."""
        self.base = 0
        self._entries: list[TakenFile] = []
        self._seen: dict[str, int | None] = {}  # path -> mtime ns: not to be taken again
        self.newest_ns: int | None = None
        self._floor_ns: int | None = None  # the age limit the last compaction applied
        self.recorded_max_file_age_ns: int | None = None
        self._generation = 0
        self._head = b""  # the file's first line: it tells a compacted file from its parent
        self._read = 0  # bytes of whole lines read so far
        self._remembered_left = 0  # header's remembered entries still to read
        self._commits = 0  # since the last compaction
        self._forgotten = 0  # paths forgotten since the file was last written whole

    @property
    def _next_path(self) -> str:
        return self.path + ".new"

    @property
    def end(self) -> int:
        """The position after the last file taken: how many the source has ever taken."""
        return self.base + len(self._entries)

    @property
    def remembered(self) -> int:
        """How many paths the log remembers (the size of its seen set). O(1)."""
        return len(self._seen)

    def __contains__(self, path: object) -> bool:
        """Whether ``path`` is remembered: a listing does not take it again. O(1)."""
        return path in self._seen

    # -- reading ------------------------------------------------------------------
    def refresh(self, *, repair: bool = False) -> int:
        """Read the whole lines appended since the last read; return how many files
        they add. O(new lines), or O(log) when the source compacted it meanwhile."""
        try:
            with open(self.path, "rb") as fh:
                if self._head and fh.readline() != self._head:  # a compacted log
                    self._clear()
                fh.seek(self._read)
                data = fh.read()
        except FileNotFoundError:
            return 0
        complete = data[: data.rfind(b"\n") + 1]
        if repair and len(complete) != len(data):  # a torn append: drop it
            with open(self.path, "r+b") as fh:
                fh.truncate(self._read + len(complete))
        before = len(self._entries)
        self._read_lines(complete)
        return len(self._entries) - before

    def _read_lines(self, complete: bytes) -> None:
        """Take in ``complete``, whole lines that follow those read. O(lines)."""
        for line in complete.splitlines(keepends=True):
            if not self._head:
                self._head = line
            record = json.loads(line)
            if "files_log" in record:
                self._read_header(record)
                continue
            taken = TakenFile(record["path"], record.get("mtime"))
            self._remember(taken)
            if self._remembered_left:
                self._remembered_left -= 1
            else:
                self._entries.append(taken)
        self._read += len(complete)

    def _read_header(self, header: Mapping[str, Any]) -> None:
        """A compacted log's first line: where its entries start, and what it recorded."""
        if header["files_log"] > LOG_FORMAT:
            raise ValueError(
                f"{self.path}: a file log of format {header['files_log']}; this release "
                f"reads format {LOG_FORMAT} and older"
            )
        self._generation = header["generation"]
        self.base = header["base"]
        self._remembered_left = header["seen"]
        self.newest_ns = header["newest_ns"]
        self._floor_ns = header["ignore_before_ns"]
        self.recorded_max_file_age_ns = header["max_file_age_ns"]

    def _remember(self, taken: TakenFile) -> None:
        """Note ``taken`` as not to be taken again, and its time as the newest if it is."""
        self._seen[taken.path] = taken.mtime_ns
        if taken.mtime_ns is not None:
            self.newest_ns = max(taken.mtime_ns, self.newest_ns or taken.mtime_ns)

    def files(self, start: int, end: int) -> list[TakenFile] | None:
        """The files at positions [start, end): None when the log does not hold them
        (compacted away, or not read yet). O(end - start)."""
        if start < self.base or end > self.end or start > end:
            return None
        return self._entries[start - self.base : end - self.base]

    # -- taking -------------------------------------------------------------------
    def ignore_before_ns(self) -> int | None:
        """Files modified before this time are not taken (None: any age). O(1).

        ``maxFileAge`` as Spark has it: the newest modification time logged
        minus the age. Never below the limit a compaction applied, even if the
        age grew or was dropped since: the files it forgot are older than that,
        and taking them now would take them twice.
        """
        limits = [self._floor_ns]
        if self.max_file_age_ns is not None and self.newest_ns is not None:
            limits.append(self.newest_ns - self.max_file_age_ns)
        return max((t for t in limits if t is not None), default=None)

    def take_rule(self) -> Callable[[str, int], bool]:
        """The source's take rule as it stands, for one listing: ``takes(path,
        mtime_ns)`` whether it takes the file at ``path`` (absolute and normal) last
        modified at ``mtime_ns``, one it does not remember and not modified before
        :meth:`ignore_before_ns` (``maxFileAge``). O(1), and O(1) a file: the limit
        is worked out once, not for each file listed."""
        seen, limit = self._seen, self.ignore_before_ns()

        def takes(path: str, mtime_ns: int) -> bool:
            return path not in seen and (limit is None or mtime_ns >= limit)

        return takes

    def new_files(self, directory: str) -> list[TakenFile]:
        """The files of ``directory`` that :meth:`take_new` would take, in order.

        O(directory), as Spark's listing: with ``cleanSource`` the directory
        holds only the files not yet cleaned, else every file ever put there.
        """
        return list_new_files(directory, self.take_rule())

    def take_new(self, directory: str) -> int:
        """Append the directory's new files, in order, durably; return how many.

        O(directory) for the listing, plus O(remembered) to forget the files
        ``maxFileAge`` leaves behind when it is set.
        """
        if self.max_file_age_ns != self.recorded_max_file_age_ns:
            self.compact()  # the header records the age in force, for readers
        new = self.new_files(directory)
        if new:
            self._append(b"".join(_entry_line(taken) for taken in new))
            self._entries.extend(new)
            for taken in new:
                self._remember(taken)
            self._forget_aged()
        return len(new)

    def _append(self, data: bytes) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        with open(self.path, "ab") as fh:
            created = fh.tell() == 0
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if created:  # a new name in the directory: durable too
            fsync_directory(directory)
            self._head = data[: data.index(b"\n") + 1]
        self._read += len(data)

    def _forget_aged(self) -> None:
        """Forget the files below the age limit: no listing takes them again. O(remembered)."""
        limit = self.ignore_before_ns()
        if limit is None:
            return
        aged = [path for path, mtime in self._seen.items() if mtime is not None and mtime < limit]
        for path in aged:
            del self._seen[path]
        self._forgotten += len(aged)

    # -- committing ---------------------------------------------------------------
    def commit(self, end: int, cleaned: Iterable[str] = ()) -> None:
        """Spark committed every batch up to position ``end``; forget ``cleaned``.

        ``cleaned`` are files of those batches that ``cleanSource`` moved or
        deleted (or found gone): no longer in the input, they need not be
        remembered. The entries before ``end`` leave memory; the file drops
        them at the next compaction, due after :data:`COMPACT_EVERY` commits
        that forgot a file. O(files committed), and O(remembered + entries)
        for a compaction.
        """
        for path in cleaned:
            if path in self._seen:
                del self._seen[path]
                self._forgotten += 1
        committed = min(max(end, self.base), self.end)
        del self._entries[: committed - self.base]
        self.base = committed
        self._commits += 1
        if self._commits >= COMPACT_EVERY and self._forgotten:
            self.compact()

    def compact(self) -> None:
        """Rewrite the file as the header, what it remembers from before ``base``, and
        the entries from ``base``; crash-safe (see the class doc). O(remembered + entries)."""
        entry_paths = {taken.path for taken in self._entries}
        remembered = [
            TakenFile(path, mtime) for path, mtime in self._seen.items() if path not in entry_paths
        ]
        floor = self.ignore_before_ns()
        header = {
            "files_log": LOG_FORMAT,
            "generation": self._generation + 1,
            "base": self.base,
            "seen": len(remembered),
            "newest_ns": self.newest_ns,
            "ignore_before_ns": floor,
            "max_file_age_ns": self.max_file_age_ns,
        }
        head = json.dumps(header).encode() + b"\n"
        data = b"".join([head, *map(_entry_line, remembered), *map(_entry_line, self._entries)])
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        with open(self._next_path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(self._next_path, self.path)
        fsync_directory(directory)
        self._generation += 1
        self._head, self._read = head, len(data)
        self._floor_ns, self.recorded_max_file_age_ns = floor, self.max_file_age_ns
        self._commits = self._forgotten = 0


def logged_batch_files(spark_checkpoint: str, log: FileLog, batch_id: int) -> list[str] | None:
    """The files micro-batch ``batch_id`` takes, from the offsets Spark logged for it.

    Before a batch runs, Spark's streaming engine writes its end offset to
    ``<spark_checkpoint>/offsets/<batch_id>`` (a version line, a metadata
    line, then one offset per source); its start is the previous batch's
    end. This source's offsets are positions in ``log`` (read beside the
    running source: ``repair=False``), so the batch's files are a slice of
    it, known in the driver without running the batch's rows through a Spark
    job and a Python worker. The source compacts away only positions before
    the last batch Spark committed, so a running batch's slice stays in the
    log. None when the offsets are not one ``{"taken": n}`` per batch, or
    ``log`` does not hold the slice they say: then read the rows. O(1) plus
    the log's new entries.
    """
    logged = _logged_range(LocalStorage(), spark_checkpoint, batch_id, "taken", 0)
    if logged is None:
        return None
    start, end = logged
    if end > log.end:
        log.refresh()
    files = log.files(start, end)
    return None if files is None else [taken.path for taken in files]


def _logged_range(
    storage: Storage, spark_checkpoint: str, batch_id: int, key: str, before_first: int
) -> tuple[int, int] | None:
    """(start, end) of the one source's offsets for ``batch_id``: ``key`` of the offset
    Spark logged for the batch before (``before_first`` for the first batch), and
    for the batch itself. None unless both are logged in this form, in order."""
    start = _logged_offset(storage, spark_checkpoint, batch_id - 1, key, before_first)
    end = _logged_offset(storage, spark_checkpoint, batch_id, key, before_first)
    return None if start is None or end is None or end < start else (start, end)


def _logged_offset(
    storage: Storage, spark_checkpoint: str, batch_id: int, key: str, before_first: int
) -> int | None:
    """``key`` of the one source's offset Spark logged for ``batch_id`` (``before_first``
    before the first batch), read through ``storage``."""
    if batch_id < 0:
        return before_first
    try:
        data = storage.read_bytes(join(spark_checkpoint, "offsets", str(batch_id)))
        lines = data.decode("utf-8").splitlines()
        offset = json.loads(lines[2]) if len(lines) == 3 and lines[0] == "v1" else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    value = offset.get(key) if isinstance(offset, dict) else None
    return value if type(value) is int and value >= before_first else None


# -- Spark's own file source's log (where its source runs: an input or checkpoint at a URI)


def spark_source_batch_files(
    spark_checkpoint: str, batch_id: int, storage: Storage
) -> list[str] | None:
    """The files Spark's own file source gave micro-batch ``batch_id``, as the rows'
    ``path`` column names them, in (modification time, path) order, from its logs.

    Spark logs the batch's end offset in ``offsets/<batch_id>``
    (``{"logOffset": n}``; the start is the previous batch's end), and the
    source's batch ``n`` in ``sources/0/<n>``, or in ``<n>.compact``, which holds
    every batch up to ``n``: a JSON line per file, its URI and modification time.
    Both are read through ``storage``, the checkpoint's, so the driver knows the
    files without a Spark job over the batch's rows. None when a log is missing
    or not in this form: then read the rows. O(the batch's files), or a
    compacted log's when the batch's own is gone.
    """
    logged = _logged_range(storage, spark_checkpoint, batch_id, "logOffset", -1)
    if logged is None:
        return None
    start, end = logged
    source_log = join(spark_checkpoint, "sources", "0")
    files: list[tuple[int, str]] = []
    for log_batch in range(start + 1, end + 1):
        entries = _source_log_batch(storage, source_log, log_batch)
        if entries is None:
            return None
        try:
            files += [
                (int(e["timestamp"]), _hadoop_path_text(str(e["path"])))
                for e in entries
                if e["batchId"] == log_batch
            ]
        except (KeyError, TypeError, ValueError):
            return None
    return [path for _mtime, path in sorted(files)]


def spark_source_logged_paths(storage: Storage, source_log: str) -> list[str] | None:
    """Every file Spark's file source logged in ``source_log`` (``CK/spark/sources/0``),
    as its log names them: the newest ``N.compact`` (every entry up to batch N)
    and the batch files after it. None when the log is not a file source's
    (Kafka's offsets, say). O(files logged)."""
    batches: dict[int, str] = {}
    for name in storage.list_names(source_log):
        stem = name[: -len(".compact")] if name.endswith(".compact") else name
        if stem.isdigit() and not name.startswith("."):
            batches[int(stem)] = name
    compacts = [b for b, n in batches.items() if n.endswith(".compact")]
    start = max(compacts, default=min(batches, default=0))
    paths: list[str] = []
    for batch in sorted(b for b in batches if b >= start):
        entries = _source_log_entries(storage.read_bytes(join(source_log, batches[batch])))
        if entries is None:
            return None
        paths += [str(e["path"]) for e in entries]
    return paths


def _source_log_batch(
    storage: Storage, source_log: str, log_batch: int
) -> list[dict[str, Any]] | None:
    """The entries of the file ``log_batch`` is in: its own, else ``<log_batch>.compact``."""
    for name in (str(log_batch), f"{log_batch}.compact"):
        try:
            return _source_log_entries(storage.read_bytes(join(source_log, name)))
        except FileNotFoundError:
            continue
    return None


def _source_log_entries(data: bytes) -> list[dict[str, Any]] | None:
    """A source log file's entries: a version line, then a JSON object per file with
    its ``path``. None in any other form."""
    try:
        lines = data.decode("utf-8").splitlines()
        entries = [json.loads(line) for line in lines[1:] if line.strip()]
    except (UnicodeDecodeError, ValueError):
        return None
    if not lines or not lines[0].startswith("v"):
        return None
    if not all(isinstance(e, dict) and "path" in e for e in entries):
        return None
    return entries


def _hadoop_path_text(uri: str) -> str:
    """A URI as Hadoop's ``Path.toString`` gives it (Spark's ``path`` column): decoded,
    and ``scheme:/path`` when the authority is empty (``file:///x`` is ``file:/x``)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    if parts.query or parts.fragment:  # a URI Spark writes has neither: '?' and '#' are escaped
        raise ValueError(uri)
    scheme = f"{parts.scheme}:" if parts.scheme else ""
    authority = f"//{parts.netloc}" if parts.netloc else ""
    return scheme + authority + unquote(parts.path)
