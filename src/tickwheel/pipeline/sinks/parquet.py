"""The Parquet directory sink (the default): each batch's tables in place, then a marker."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..storage import StorageError, absolute, create_json, join, storage_for
from .base import BATCH_ID, SinkError, _write_empty_parquet

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


__all__ = [
    "ParquetSink",
]


class ParquetSink:
    """Parquet directory sink (the default): each batch's tables in place, then a marker.

    Layout: ``OUT/<table>/batch_id=N/`` for the rows of batch ``N``, and
    ``OUT/_batches/N.json``, the commit marker. A batch's rows count once its
    marker exists: :meth:`read_table` takes only those batches, and a replay
    of an uncommitted batch first deletes what the failed attempt wrote. No
    directory is renamed and no file overwritten, so ``OUT`` may be a local
    path or any URI Spark writes (through ``spark``'s Hadoop file systems,
    on a classic session). ``commit`` costs one new small file. A reader that
    lists ``OUT/<table>`` itself should keep the ``batch_id`` values that have
    a marker.
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
        self._staged: dict[int, list[str]] = {}

    def describe(self) -> str:
        """Return ``parquet:<dir>``."""
        return f"parquet:{self.root}"

    def __getstate__(self) -> dict[str, Any]:
        """Shipped to Spark Connect's foreachBatch process, which has only local paths."""
        return {**self.__dict__, "_staged": {}}

    def _marker(self, batch_id: int) -> str:
        return join(self._markers, f"{batch_id}.json")

    def _batch_dir(self, table: str, batch_id: int) -> str:
        return join(self.root, table, f"{BATCH_ID}={batch_id}")

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
        small: bool = False,
    ) -> None:
        """Write each table in ``<table>/batch_id=N/``, deleting a crashed attempt's first.

        A committed batch is left as it is (its rows are never written twice).
        The tables are written by concurrent Spark jobs (one thread each): a
        micro-batch's tables are small, so their fixed per-job costs dominate and
        overlap. With ``small``, each is collected and written by the driver
        instead (:func:`~tickwheel.pipeline.spark.frames.write_parquet`), which skips Hadoop's
        commit protocol. ``on_table`` is called as each one finishes. A table
        in ``empty`` gets an empty Parquet file of its schema, written here
        without a Spark job.
        """
        from concurrent.futures import ThreadPoolExecutor, as_completed

        from ..spark.frames import write_parquet

        if self.is_committed(batch_id):
            return
        names = sorted(tables)
        for name in names:  # what a failed attempt of this uncommitted batch left
            self.storage.delete(self._batch_dir(name, batch_id))
        for name in empty:  # no Spark job: an empty file of the table's schema
            _write_empty_parquet(self.storage, self._batch_dir(name, batch_id),
                                 tables[name].schema)  # fmt: skip
            if on_table is not None:
                on_table(name)
        tables = {name: df for name, df in tables.items() if name not in empty}

        def write(table: str, df: DataFrame) -> str:
            write_parquet(df, self._batch_dir(table, batch_id), in_driver=small,
                          storage=self.storage)  # fmt: skip
            return table

        with ThreadPoolExecutor(max_workers=max(1, len(tables))) as pool:
            futures = [pool.submit(write, table, df) for table, df in tables.items()]
            for future in as_completed(futures):
                table = future.result()
                if on_table is not None:
                    on_table(table)
        self._staged[batch_id] = names

    def commit(self, batch_id: int) -> bool:
        """Create the marker ``_batches/N.json`` of the tables :meth:`stage` wrote; False
        when the batch was committed already."""
        if self.is_committed(batch_id):
            return False
        tables = self._staged.pop(batch_id, None)
        if tables is None:
            raise SinkError(f"batch {batch_id} was not staged in {self.root}")
        try:
            marker = {"batch_id": batch_id, "tables": tables, "committed_at": time.time()}
            create_json(self.storage, self._marker(batch_id), marker)
        except FileExistsError:
            return False
        return True

    def is_committed(self, batch_id: int) -> bool:
        """True when the batch's marker exists. O(1)."""
        return self.storage.exists(self._marker(batch_id))

    def committed_batches(self) -> list[int]:
        """Return the committed batch ids in order. O(batches)."""
        ids = []
        for name in self.storage.list_names(self._markers):
            if name.endswith(".json") and name[:-5].isdigit():
                ids.append(int(name[:-5]))
        return sorted(ids)

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Read the committed rows of ``table``, ``batch_id`` as a column."""
        from pyspark.sql import functions as F

        path = join(self.root, table)
        if not any(n.startswith(f"{BATCH_ID}=") for n in self.storage.list_names(path)):
            return None
        committed = self.committed_batches()
        df = spark.read.option("basePath", path).parquet(path)
        df = df.withColumn(BATCH_ID, F.col(BATCH_ID).cast("long"))
        return df.where(F.col(BATCH_ID).isin(committed))
