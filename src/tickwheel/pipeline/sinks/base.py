"""The sinks' shared contract: the :class:`BatchSink` protocol, its errors and its builders.

Every sink's module imports this one, and this one imports no sink; the
functions that choose a sink are in :mod:`.make`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ..attempt import Attempt


__all__ = [
    "BATCH_ID",
    "BatchSink",
    "SinkError",
    "SinkFunction",
    "write_empty_parquet",
]

#: The column every sink adds to every table: the micro-batch id.
BATCH_ID = "batch_id"


class SinkError(RuntimeError):
    """A sink cannot be used (missing driver jar, bad URL, unreachable database)."""


class BatchSink(Protocol):
    """Where the pipeline's per-batch tables go; published exactly once per batch id.

    The stream calls :meth:`stage` for each attempt at a batch, records what
    it returns in the checkpoint's commit of the batch (the commit point),
    then calls :meth:`commit` with it. After a crash between the two, the
    next job calls :meth:`commit` again with the same record, so it must be
    a no-op for a batch already published, and must publish exactly what the
    record names, whichever attempt wrote it.
    """

    name: str

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        attempt: Attempt,
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
    ) -> Mapping[str, Any] | None:
        """Write the batch's rows out of readers' sight, under names of ``attempt``'s own
        (no other attempt's files are touched); return what was staged, as JSON values.

        ``on_table(name)`` is called after each table is written (progress, tests).
        ``empty`` names tables known to have no rows: the sink writes none of
        them (no Spark job), and still has each table once it has been declared.
        A sink whose class sets ``accepts_arrow = True`` gets the tables of a
        micro-batch run in the driver as pyarrow Tables, which it writes from the
        driver; any other sink gets DataFrames (local relations of those rows).
        """

    def commit(self, batch_id: int, staged: Mapping[str, Any] | None) -> bool:
        """Publish what a commit of the checkpoint named (``staged``, from
        :meth:`stage`) exactly once; False when the batch already was."""

    def is_committed(self, batch_id: int) -> bool:
        """True when ``batch_id`` is visible in the sink."""

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Return all committed rows of ``table`` (with ``batch_id``), or None if none."""

    def describe(self) -> str:
        """A short human description (for progress messages and summaries)."""


#: A user's sink, Spark's way: ``fn(tables, batch_id)`` as ``foreachBatch`` calls it.
SinkFunction = Callable[[Mapping[str, "DataFrame"], int], object]


def write_empty_parquet(storage: Storage, directory: str, schema: StructType) -> str:
    """A new table directory holding one Parquet file of ``schema`` and no rows; the
    file's name. O(columns)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.pandas.types import to_arrow_schema

    from ..spark.frames import write_arrow_parquet

    empty = pa.Table.from_batches([], schema=to_arrow_schema(schema))
    (name,) = write_arrow_parquet(empty, directory, storage)
    return name
