"""Choosing a sink: by name (:func:`make_sink`), a function or a sink
(:func:`as_sink`), or as a checkpoint's commit recorded it (:func:`reopen_sink`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import BatchSink, SinkError, SinkFunction
from .function import FunctionSink
from .parquet import ParquetSink
from .postgres import PostgresSink
from .sqlite import SqliteSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["as_sink", "make_sink", "reopen_sink"]


def as_sink(sink: BatchSink | SinkFunction) -> BatchSink:
    """``sink`` if it is a :class:`BatchSink`, else a :class:`FunctionSink` of it. O(1)."""
    if all(hasattr(sink, name) for name in ("stage", "commit", "is_committed")):
        return sink  # type: ignore[return-value]
    return FunctionSink(sink)  # type: ignore[arg-type]


def reopen_sink(location: Mapping[str, Any], spark: SparkSession | None = None) -> BatchSink | None:
    """The sink a checkpoint's commit recorded (a sink's ``location()``), opened again;
    None for a function's sink, whose rows are where the function put them. O(1)."""
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
    if kind == "parquet":
        return ParquetSink(output, spark)
    if kind == "sqlite":
        return SqliteSink(
            url or f"jdbc:sqlite:{os.path.join(os.path.abspath(output), 'tickwheel.db')}"
        )
    if kind in ("postgresql", "postgres"):
        return PostgresSink(url)
    raise SinkError(f"unknown sink {kind!r}: choose parquet, sqlite or postgresql")
