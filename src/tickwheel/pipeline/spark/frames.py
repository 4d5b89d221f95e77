"""Small frame helpers every stage uses: a run's values as data, and empty frames."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["empty_frame", "parameter", "run_parameters", "union_all"]


def empty_frame(spark: SparkSession, schema: StructType | str) -> DataFrame:
    """An empty frame of ``schema`` (a StructType or DDL), built in the JVM. O(1).

    ``spark.createDataFrame([], schema)`` goes through a Python RDD: each job
    that reads it runs a task per default partition in a Python worker, rows
    or not. This one is an empty local relation, which Spark plans away.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    struct = T.StructType.fromDDL(schema) if isinstance(schema, str) else schema
    assert isinstance(struct, T.StructType), schema
    return spark.range(0).select(
        *[F.lit(None).cast(field.dataType).alias(field.name) for field in struct.fields]
    )


def run_parameters(spark: SparkSession, **values: int | None) -> DataFrame:
    """A one-row frame of a run's values, to cross-join where a query needs them. O(1).

    Columns ``_p_<name>`` (long; None is null); read them with
    :func:`parameter`. Spark compiles each stage of a query to Java and writes
    every literal into the code, so a value that changes from one micro-batch
    (or run) to the next, such as a watermark or the far-future limit, would
    make each batch's code new: compiled again by Spark, then run interpreted
    until the JVM's JIT compiles it again. A value read from a broadcast local
    table is data, not code: the code stays the same from batch to batch, and
    Spark's and the JIT's caches keep it (``docs/pipeline.md``, "Execution").
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import functions as F

    table = pa.table(
        {f"_p_{name}": pa.array([value], pa.int64()) for name, value in values.items()}
    )
    return F.broadcast(spark.createDataFrame(table))


def parameter(name: str) -> Column:
    """The column of :func:`run_parameters`' value ``name``. O(1)."""
    from pyspark.sql import functions as F

    return F.col(f"_p_{name}")


def union_all(frames: list[DataFrame], allow_missing: bool = False) -> DataFrame | None:
    """The rows of ``frames`` matched by column name (None for no frames). Lazy; O(frames).

    ``allow_missing``: a column some frames lack is null in their rows.
    """
    if not frames:
        return None
    out = frames[0]
    for more in frames[1:]:
        out = out.unionByName(more, allowMissingColumns=allow_missing)
    return out
