"""The sinks' shared contract: the :class:`BatchSink` protocol, its errors and its builders.

Importing this module imports no sink: :func:`make_sink` and :func:`as_sink`
import the sink classes when they are called.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..storage import Storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ..stream.checkpoint import Attempt


__all__ = [
    "BATCH_ID",
    "BatchSink",
    "SinkError",
    "SinkFunction",
    "as_sink",
    "make_sink",
    "reopen_sink",
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
        small: bool = False,
    ) -> Mapping[str, Any] | None:
        """Write the batch's rows out of readers' sight, under names of ``attempt``'s own
        (no other attempt's files are touched); return what was staged, as JSON values.

        ``on_table(name)`` is called after each table is written (progress, tests).
        ``empty`` names tables known to have no rows: the sink writes none of
        them (no Spark job), and still has each table once it has been declared.
        ``small`` says every table is small enough to collect to the driver,
        which a sink may do rather than run Spark's writer.
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


def as_sink(sink: BatchSink | SinkFunction) -> BatchSink:
    """``sink`` if it is a :class:`BatchSink`, else a :class:`FunctionSink` of it. O(1)."""
    if all(hasattr(sink, name) for name in ("stage", "commit", "is_committed")):
        return sink  # type: ignore[return-value]
    from .function import FunctionSink

    return FunctionSink(sink)  # type: ignore[arg-type]


def _write_empty_parquet(storage: Storage, directory: str, schema: StructType) -> None:
    """A new table directory holding one Parquet file of ``schema`` and no rows. O(columns)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.pandas.types import to_arrow_schema

    from ..spark.frames import write_arrow_parquet

    empty = pa.Table.from_batches([], schema=to_arrow_schema(schema))
    write_arrow_parquet(empty, directory, storage)


def reopen_sink(location: Mapping[str, Any], spark: SparkSession | None = None) -> BatchSink | None:
    """The sink a checkpoint's commit recorded (a sink's ``location()``), opened again;
    None for a function's sink, whose rows are where the function put them. O(1)."""
    from .parquet import ParquetSink
    from .postgres import PostgresSink
    from .sqlite import SqliteSink

    name, prefix = location.get("name"), str(location.get("prefix") or "")
    if name == "parquet":
        return ParquetSink(str(location["output"]), spark)
    if name == "sqlite":
        return SqliteSink(str(location["url"]), prefix=prefix)
    if name == "postgresql":
        return PostgresSink(str(location["url"]), prefix=prefix)
    if name == "function":
        return None
    raise SinkError(
        f"the checkpoint's outputs are in a sink this release cannot open ({name!r}): pass the sink"
    )


def make_sink(kind: str, output: str, spark: SparkSession, *, url: str | None = None) -> BatchSink:
    """Build the sink named ``kind`` (parquet, sqlite or postgresql). O(1).

    ``output`` is the output directory (parquet) and the default home of the
    SQLite file (``OUT/tickwheel.db``); ``url`` overrides the JDBC URL. For
    PostgreSQL it is required unless ``PGHOST``/``PGPORT``/``PGDATABASE`` say
    where the server is; the password is best left out of it
    (:func:`postgres_credentials`). No sink keeps ``spark``: their commits need
    no session (it stays a parameter for the callers).
    """
    from .parquet import ParquetSink
    from .postgres import PostgresSink
    from .sqlite import SqliteSink

    if kind == "parquet":
        return ParquetSink(output, spark)
    if kind == "sqlite":
        return SqliteSink(
            url or f"jdbc:sqlite:{os.path.join(os.path.abspath(output), 'tickwheel.db')}"
        )
    if kind in ("postgresql", "postgres"):
        return PostgresSink(url)
    raise SinkError(f"unknown sink {kind!r}: choose parquet, sqlite or postgresql")
