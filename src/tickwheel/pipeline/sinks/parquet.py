"""The Parquet directory sink (the default): Spark's file sink layout, an attempt's own
files, published by the checkpoint's commit."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..storage import (
    StorageError,
    absolute,
    create_json,
    is_data_file,
    is_uri,
    join,
    local_path,
    storage_for,
)
from .base import BATCH_ID, SinkError, write_empty_parquet
from .file_sink_log import FileSinkLog, SinkFile

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from ..attempt import Attempt


__all__ = [
    "STAGING_DIR",
    "ParquetSink",
]

#: Where the attempts stage their tables until a commit names one (hidden from the
#: readers that list the output themselves: its name starts with ``_``).
STAGING_DIR = "_staging"


class ParquetSink:
    """Parquet directory sink (the default): Spark's file sink layout, one attempt's files.

    Layout, for each table ``outcomes``, ``unmatched``, ``rejected`` and ``late``::

        OUT/<table>/batch_id=N/part-K-<attempt>.parquet   the published rows of batch N
        OUT/<table>/_spark_metadata/N                     Spark's file sink log naming them
        OUT/_batches/N.json                               the batch's marker, written last
        OUT/_staging/N/<attempt>/<table>/                 an attempt's files, until published

    :meth:`stage` writes an attempt's tables under its own staging directory,
    out of every reader's sight (a name starting with ``_``), and returns
    their files. The checkpoint's commit records them; :meth:`commit` then
    publishes exactly those: each file moved to its published name, the
    table's ``_spark_metadata`` entry (:mod:`.._file_sink_log`) and the
    marker. Every Spark reader of ``OUT/<table>`` (``spark.read.parquet``, on
    a classic or a Connect session) reads the files the log names and no
    other, so a crashed or fenced attempt's files are never read; a reader
    that lists the directory itself (pandas, pyarrow) should read
    :meth:`committed_files` instead. Publishing again (a roll-forward after a
    crash) finds the files moved and the entries written, and changes
    nothing. No directory is renamed and no file overwritten, so ``OUT`` may
    be a local path or any URI Spark writes (through ``spark``'s Hadoop file
    systems, on a classic session).
    """

    name = "parquet"

    def __init__(self, output: str, spark: SparkSession | None = None) -> None:
        """Use ``output`` (a directory or URI) as the sink's root."""
        self.root = absolute(output)
        try:
            self.storage = storage_for(self.root, spark)
        except StorageError as exc:
            raise SinkError(f"the parquet sink: {exc}") from None
        self._markers = join(self.root, "_batches")
        # What this sink did itself, so that the next batch need not list it: the last
        # batch it logged in each table's _spark_metadata, the last it cleaned, and
        # the tables it published a file of (whose schema readers can then find).
        self._logged: dict[str, int] = {}
        self._cleaned: int | None = None
        self._with_files: set[str] = set()

    def describe(self) -> str:
        """Return ``parquet:<dir>``."""
        return f"parquet:{self.root}"

    def location(self) -> dict[str, Any]:
        """What the checkpoint records to find this sink again. O(1)."""
        return {"name": self.name, "output": self.root}

    def __getstate__(self) -> dict[str, Any]:
        """Shipped to Spark Connect's foreachBatch process, which has only local paths."""
        return dict(self.__dict__)

    def _marker(self, batch_id: int) -> str:
        return join(self._markers, f"{batch_id}.json")

    def _batch_dir(self, table: str, batch_id: int) -> str:
        return join(self.root, table, f"{BATCH_ID}={batch_id}")

    def _staging(self, batch_id: int, tag: str | None = None) -> str:
        batch = join(self.root, STAGING_DIR, str(batch_id))
        return batch if tag is None else join(batch, tag)

    #: :meth:`stage` takes Arrow tables too (a micro-batch run in the driver gives them).
    accepts_arrow = True

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame | pa.Table],
        attempt: Attempt,
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
    ) -> dict[str, Any]:
        """Write each table in ``_staging/N/<attempt>/<table>/``; return the files written.

        An Arrow table (a micro-batch run in the driver) is written by the driver,
        one file with pyarrow (:func:`~..spark.frames.write_parquet`), which skips
        Hadoop's commit protocol. Frames are written by concurrent Spark jobs (one
        thread each): a micro-batch's tables are small, so their fixed per-job costs
        dominate and overlap. A table with no rows (an empty Arrow table, or a frame
        in ``empty``) gets no file once this sink published one of that table, as
        Spark's own file sink writes none for an empty micro-batch; before that, an
        empty Parquet file of its schema, written here without a Spark job, so that
        readers find the table's columns. ``on_table`` is called as each table is
        written. O(tables) files.
        """
        from concurrent.futures import ThreadPoolExecutor, as_completed

        from ..spark.frames import is_arrow, write_parquet

        staging = self._staging(batch_id, attempt.tag)
        # The files of each table: those the driver wrote, named as it wrote them; Spark's
        # writer names its own, so those tables' directories are listed.
        files: dict[str, list[str] | None] = {}

        def write(table: str, rows: DataFrame | pa.Table) -> tuple[str, list[str] | None]:
            no_rows = table in empty or (is_arrow(rows) and not rows.num_rows)
            if no_rows and table in self._with_files:  # its schema is in a file already
                return table, []
            if table in empty and not is_arrow(rows):  # no Spark job
                return table, [write_empty_parquet(self.storage, join(staging, table),
                                                   rows.schema)]  # fmt: skip
            # The attempt's staging directory is its own: no earlier write used its name.
            return table, write_parquet(rows, join(staging, table), self.storage, fresh=True)

        by_spark = {n: t for n, t in tables.items() if not is_arrow(t)}
        for name in (n for n in tables if n not in by_spark or n in empty):
            files[name] = write(name, tables[name])[1]
            if on_table is not None:
                on_table(name)
        written = {name: df for name, df in by_spark.items() if name not in empty}
        if written:
            with ThreadPoolExecutor(max_workers=len(written)) as pool:
                futures = [pool.submit(write, table, df) for table, df in written.items()]
                for future in as_completed(futures):
                    table, files[table] = future.result()
                    if on_table is not None:
                        on_table(table)
        return {
            "attempt": attempt.tag,
            "tables": {
                table: sorted(names) if names is not None
                else self._parquet_names(join(staging, table))
                for table, names in sorted(files.items())
            },
        }  # fmt: skip

    def _parquet_names(self, directory: str) -> list[str]:
        return sorted(n for n in self.storage.list_names(directory) if is_data_file(n))

    def commit(self, batch_id: int, staged: Mapping[str, Any] | None) -> bool:
        """Publish the files a commit named (``staged``, from :meth:`stage`): each moved to
        ``<table>/batch_id=N/``, logged in the table's ``_spark_metadata``, then the
        marker. False when the batch was published already. O(files) calls."""
        if self.is_committed(batch_id):
            return False
        if staged is None:
            raise SinkError(f"batch {batch_id} was not staged in {self.root}")
        tag = str(staged["attempt"])
        tables: Mapping[str, Sequence[str]] = staged["tables"]
        for table, names in sorted(tables.items()):
            self._publish_table(batch_id, table, tag, names)
        with contextlib.suppress(FileExistsError):  # published meanwhile by another
            create_json(self.storage, self._marker(batch_id), {
                "batch_id": batch_id, "tables": sorted(tables), "attempt": tag,
                "committed_at": time.time(),
            })  # fmt: skip
        return True

    def clean(self, batch_id: int) -> None:
        """Drop the staging of ``batch_id`` and older batches: after the publication of
        ``batch_id`` what is left there is no commit's (crashed or fenced attempts,
        and the published attempt's leftovers). The owner's to call. O(batches)."""
        staging = join(self.root, STAGING_DIR)
        if self._cleaned == batch_id - 1:  # this sink cleaned the older ones: no listing
            self.storage.delete(join(staging, str(batch_id)))
        else:
            for name in self.storage.list_names(staging):
                if name.isdigit() and int(name) <= batch_id:
                    self.storage.delete(join(staging, name))
        self._cleaned = batch_id

    def _publish_table(self, batch_id: int, table: str, tag: str, names: Sequence[str]) -> None:
        """Move ``table``'s staged files to their published names and log them."""
        target_dir = self._batch_dir(table, batch_id)
        targets = [join(target_dir, f"part-{k:05d}-{tag}.parquet") for k in range(len(names))]
        for name, target in zip(names, targets, strict=True):
            try:
                self.storage.rename(join(self._staging(batch_id, tag), table, name), target)
            except FileExistsError:
                pass  # moved by an earlier publication of the same commit
            except FileNotFoundError:
                if not self.storage.exists(target):
                    raise SinkError(
                        f"{self.root}: batch {batch_id}'s committed file {table}/{name} of "
                        f"attempt {tag} is missing from its staging directory"
                    ) from None
        found = {path.rstrip("/").rsplit("/", 1)[-1]: (size, mtime)
                 for path, size, mtime in self.storage.list_files(target_dir)
                 } if targets else {}  # fmt: skip
        entries = []
        for target in targets:
            size, mtime = found[target.rsplit("/", 1)[-1]]
            entries.append(SinkFile(self.storage.uri(target), size, mtime))
        log = FileSinkLog(self.storage, join(self.root, table))
        # The log's batches: known without a listing when this sink logged the one before.
        known = [batch_id - 1] if self._logged.get(table) == batch_id - 1 else log.batch_ids()
        earlier = [] if known else self._unlogged_files(table, batch_id)
        try:
            log.add(batch_id, entries, earlier, known)
        except ValueError as exc:
            raise SinkError(str(exc)) from None
        self._logged[table] = batch_id
        if entries:
            self._with_files.add(table)

    def _unlogged_files(self, table: str, before: int) -> list[SinkFile]:
        """The files of the batches an older release committed (marker, no log) before
        ``before``: the new log's first entry, so readers keep them. O(files)."""
        files = []
        for batch_id in self.committed_batches():
            if batch_id < before:
                for path, size, mtime in self.storage.list_files(self._batch_dir(table, batch_id)):
                    if is_data_file(path.rstrip("/").rsplit("/", 1)[-1]):
                        files.append(SinkFile(self.storage.uri(path), size, mtime))
        return files

    def is_committed(self, batch_id: int) -> bool:
        """True when the batch's marker exists (it is written last). O(1)."""
        return self.storage.exists(self._marker(batch_id))

    def committed_batches(self) -> list[int]:
        """Return the committed batch ids in order. O(batches)."""
        ids = []
        for name in self.storage.list_names(self._markers):
            if name.endswith(".json") and name[:-5].isdigit():
                ids.append(int(name[:-5]))
        return sorted(ids)

    def committed_files(self, table: str) -> list[str]:
        """``table``'s committed files, as Spark's readers take them from its
        ``_spark_metadata`` log (their paths for a local output, else their URIs):
        what pandas or pyarrow should read, since they read every file of a
        directory. O(files)."""
        uris = FileSinkLog(self.storage, join(self.root, table)).files()
        return uris if is_uri(self.root) else [local_path(uri) for uri in uris]

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Read the committed rows of ``table``, ``batch_id`` as a column: Spark's reader,
        which honours the table's ``_spark_metadata`` (an output of an older release,
        without one, is filtered by the markers). None when the table has no batch."""
        from pyspark.sql import functions as F

        path = join(self.root, table)
        if FileSinkLog(self.storage, path).exists():
            df = spark.read.parquet(path)
            return df.withColumn(BATCH_ID, F.col(BATCH_ID).cast("long"))
        if not any(n.startswith(f"{BATCH_ID}=") for n in self.storage.list_names(path)):
            return None
        committed = self.committed_batches()
        df = spark.read.option("basePath", path).parquet(path)
        df = df.withColumn(BATCH_ID, F.col(BATCH_ID).cast("long"))
        return df.where(F.col(BATCH_ID).isin(committed))
