"""Small frame helpers every stage uses: a run's values as data, empty frames, and
Parquet writes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ..storage import Storage

__all__ = [
    "PARAMETER_PREFIX",
    "driver_copy",
    "empty_frame",
    "from_arrow",
    "parameter_name",
    "run_parameters",
    "sql_in",
    "sql_name",
    "sql_string",
    "to_arrow",
    "union_all",
    "with_parameters",
    "write_arrow_parquet",
    "write_parquet",
]


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


def to_arrow(frame: DataFrame) -> Any:
    """``frame``'s rows as an Arrow table in the driver: without a Spark job when the
    driver holds them already, else through Spark's ``toArrow`` (one job).

    Spark's optimizer folds filters and projections over a local relation (a
    frame made from the driver's rows: :func:`driver_copy`) into a new local
    relation as it plans a query; collecting such a plan only hands its rows
    over, in the driver, but ``toArrow`` still runs them through a job, which
    costs more than converting a few thousand rows in Python. A classic
    session's planned query says which it is.
    """
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.pandas.types import to_arrow_schema

    jdf = getattr(frame, "_jdf", None)  # None under Spark Connect
    if jdf is None or jdf.queryExecution().executedPlan().nodeName() != "LocalTableScan":
        return frame.toArrow()
    schema = to_arrow_schema(frame.schema)
    columns = list(zip(*frame.collect(), strict=True)) or [() for _ in schema]
    return pa.table(
        [pa.array(values, type=f.type) for values, f in zip(columns, schema, strict=True)],
        schema=schema,
    )


def from_arrow(spark: SparkSession, table: Any) -> DataFrame:
    """The Arrow ``table`` as a local relation (no job), on either session kind: an
    empty one too, whose schema Spark Connect will not take from its rows. O(rows)."""
    if table.num_rows:
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    return empty_frame(spark, from_arrow_schema(table.schema))


def driver_copy(frame: DataFrame, collected: Any = None) -> DataFrame:
    """``frame``'s rows, collected to the driver as Arrow, as a local relation. One job,
    none when ``collected`` holds them already (``frame.toArrow()``'s table).

    Spark's optimizer evaluates the filters and projections over a local
    relation as it plans a query (into a new local relation), so a query that
    reads it needs no shuffle and no scan of a cache: collecting its result is
    one small job that only hands the rows over. For a frame of a few thousand
    rows read by several queries, that is cheaper than a cache. Every row
    passes through the driver's memory, so it is for small frames only.
    """
    return from_arrow(frame.sparkSession, frame.toArrow() if collected is None else collected)


def run_parameters(spark: SparkSession, **values: int | None) -> dict[str, Column]:
    """Columns ``_p_<name>`` (long; None is null) holding a run's values, by name. O(1).

    Add them beside a frame's own with :func:`with_parameters`; read them in
    SQL text with :func:`parameter_name`. Spark compiles each stage of a query
    to Java and writes every numeric literal into the code, so a value that
    changes from one micro-batch (or run) to the next, such as a watermark or
    the far-future limit, would make each batch's code new: compiled again by
    Spark, then run interpreted until the JVM's JIT compiles it again. Here
    each value is a scalar subquery over a one-row local table, as text cast
    to a long: Spark runs such a subquery in the driver with no job, and
    hands its text to the generated code as an object, not as code. So the
    code stays the same from batch to batch, and Spark's and the JIT's caches
    keep it (``docs/pipeline-design.md``, "Execution"). A value that is None gives
    code of its own, once. The cast costs each row a parse of a short text.
    """
    import pyarrow as pa

    table = pa.table(
        {name: pa.array([None if v is None else str(v)], pa.string()) for name, v in values.items()}
    )
    one_row = spark.createDataFrame(table)
    columns = {parameter_name(name): one_row.select(name).scalar() for name in values}
    return {column: value.cast("bigint").alias(column) for column, value in columns.items()}


def with_parameters(frame: DataFrame, parameters: dict[str, Column]) -> DataFrame:
    """``frame`` with the columns of :func:`run_parameters` after its own. Lazy."""
    return frame.select("*", *parameters.values())


#: The prefix of :func:`run_parameters`' column names.
PARAMETER_PREFIX = "_p_"


def parameter_name(name: str) -> str:
    """The column name of :func:`run_parameters`' value ``name``, for SQL text. O(1)."""
    return f"{PARAMETER_PREFIX}{name}"


def sql_name(name: str) -> str:
    """``name`` quoted as a Spark SQL identifier (any characters). O(len)."""
    return "`" + name.replace("`", "``") + "`"


def sql_in(column: str, values: Sequence[str | int]) -> str:
    """SQL: ``column`` (SQL text) is one of ``values`` (false for none). O(values)."""
    if not values:
        return "false"
    items = (str(v) if isinstance(v, int) else sql_string(v) for v in values)
    return f"{column} IN ({', '.join(items)})"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (any characters). O(len)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


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


def write_parquet(
    frame: DataFrame, directory: str, *, in_driver: bool = False, storage: Storage | None = None
) -> list[str] | None:
    """Write ``frame``'s rows as Parquet files in ``directory``, which must not exist.

    By default Spark's writer does it: one job, a file per partition, and
    Hadoop's commit protocol (task and job commits, ``_SUCCESS``), which for a
    table of a few rows costs more than the rows do. With ``in_driver`` the
    rows are collected to the driver as Arrow (one job) and written there as
    one file with pyarrow, through ``storage`` (default: a local path):
    cheaper for a small table, and for a small table only, since every row
    passes through the driver's memory. Either way the files hold the same
    rows under the same column names and Spark types.

    Returns the names of the files written when the driver wrote them; None
    when Spark's writer did (list ``directory`` for them).
    """
    if not in_driver:
        frame.write.mode("error").parquet(directory)  # "errorifexists": not on Connect
        return None
    return [write_arrow_parquet(to_arrow(frame), directory, storage)]


def write_arrow_parquet(table: Any, directory: str, storage: Storage | None = None) -> str:
    """``table`` (Arrow) as one Parquet file in the new ``directory``, through ``storage``
    (default: a local path), seen whole or not at all (:meth:`~..storage.Storage.create`);
    the file's name."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from ..storage import LocalStorage, join

    target = storage if storage is not None else LocalStorage()
    if target.exists(directory):  # as Spark's writer in mode error: never into old files
        raise FileExistsError(directory)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    # a name of its own, as Spark's writer gives each file: a replay never reuses a path
    name = f"part-00000-{uuid.uuid4()}-driver.parquet"
    target.create(join(directory, name), buffer.getvalue().to_pybytes())
    return name
