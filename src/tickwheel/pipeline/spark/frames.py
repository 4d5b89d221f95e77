"""Small frame helpers every stage uses: a run's values as data, empty frames, and
Parquet writes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ..storage import Storage

__all__ = [
    "PARAMETER_PREFIX",
    "Step",
    "apply_steps",
    "as_arrow",
    "as_frame",
    "empty_frame",
    "frame_ref",
    "from_arrow",
    "is_arrow",
    "parameter_columns",
    "parameter_name",
    "parameter_sql",
    "run_parameters",
    "sql_in",
    "sql_name",
    "sql_over",
    "sql_string",
    "steps_sql",
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
    frame made from the driver's rows: :func:`from_arrow`) into a new local
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


def is_arrow(table: object) -> bool:
    """Whether ``table`` is an Arrow table held in the driver (else a DataFrame). O(1).

    Asked by type: a Spark Connect DataFrame answers every attribute name with a
    column, so it cannot be told apart by what it has."""
    import pyarrow as pa

    return isinstance(table, pa.Table)


def as_arrow(table: Any) -> Any:
    """``table`` as Arrow in the driver: an Arrow table as it is, a frame's rows collected
    (:func:`to_arrow`). O(rows)."""
    return table if is_arrow(table) else to_arrow(table)


def as_frame(spark: SparkSession, table: Any) -> DataFrame:
    """``table`` as a frame: a frame as it is, an Arrow table as a local relation
    (:func:`from_arrow`). O(rows)."""
    return from_arrow(spark, table) if is_arrow(table) else table


def parameter_sql(value: int | None) -> str:
    """SQL: a run's ``value`` (a long; None is null), read as data, not as a literal. O(1).

    Spark compiles each stage of a query to Java and writes every numeric
    literal into the code, so a value that changes from one micro-batch (or
    run) to the next, such as a watermark or the far-future limit, would make
    each batch's code new: compiled again by Spark, then run interpreted until
    the JVM's JIT compiles it again. Here the value is a scalar subquery over a
    one-row inline table of its text, cast to a long outside the subquery:
    Spark runs such a subquery in the driver with no job, and hands its text to
    the generated code as an object, not as code. So the code stays the same
    from batch to batch, and Spark's and the JIT's caches keep it
    (``docs/pipeline-design.md``, "Execution"). A value that is None gives code
    of its own, once. The cast costs each row a parse of a short text.
    """
    text = "NULL" if value is None else sql_string(str(int(value)))
    return f"CAST((SELECT v FROM VALUES (CAST({text} AS STRING)) AS _p(v)) AS BIGINT)"


def parameter_columns(**values: int | None) -> list[str]:
    """SQL: the columns ``_p_<name>`` of :func:`parameter_sql` holding a run's values,
    by name, as a ``SELECT`` lists them. O(values)."""
    return [f"{parameter_sql(v)} AS {sql_name(parameter_name(n))}" for n, v in values.items()]


def run_parameters(**values: int | None) -> dict[str, Column]:
    """Columns ``_p_<name>`` (long; None is null) holding a run's values, by name
    (:func:`parameter_sql`). O(1), no call into the JVM.

    Add them beside a frame's own with :func:`with_parameters`; read them in
    SQL text with :func:`parameter_name`.
    """
    from pyspark.sql import functions as F

    return {
        parameter_name(name): F.expr(parameter_sql(value)).alias(parameter_name(name))
        for name, value in values.items()
    }


def with_parameters(frame: DataFrame, parameters: dict[str, Column]) -> DataFrame:
    """``frame`` with the columns of :func:`run_parameters` after its own. Lazy."""
    return frame.select("*", *parameters.values())


#: The prefix of :func:`run_parameters`' column names.
PARAMETER_PREFIX = "_p_"


def parameter_name(name: str) -> str:
    """The column name of :func:`run_parameters`' value ``name``, for SQL text. O(1)."""
    return f"{PARAMETER_PREFIX}{name}"


#: A step of a query written as SQL text: ``("select", columns)``, ``("where",
#: predicate)``, ``("repartition", (n, columns))`` or ``("one partition", ())``.
Step = tuple[str, Any]


def steps_sql(source: str, steps: Sequence[Step]) -> str:
    """``steps`` over the relation ``source`` (a quoted name, or a query in parentheses)
    as one SQL query, each step a subquery of the next. O(steps).

    A query planned from its whole text is analysed once (:func:`sql_over`),
    where a chain of DataFrame calls is analysed at every call (classic sessions
    analyse each new DataFrame); :func:`apply_steps` gives the same rows as a
    frame.
    """
    query = f"SELECT * FROM {source}"
    for kind, what in steps:
        if kind == "select":
            query = f"SELECT {', '.join(what)} FROM ({query})"
        elif kind == "where":
            query = f"SELECT * FROM ({query}) WHERE {what}"
        elif kind == "repartition":
            n, columns = what
            query = f"SELECT /*+ REPARTITION({int(n)}, {', '.join(columns)}) */ * FROM ({query})"
        elif kind == "one partition":
            query = f"SELECT /*+ COALESCE(1) */ * FROM ({query})"
        else:
            raise ValueError(f"unknown step {kind!r}")
    return query


def apply_steps(frame: DataFrame, steps: Sequence[Step]) -> DataFrame:
    """``steps`` (:func:`steps_sql`) applied to ``frame``, one DataFrame call each. Lazy."""
    for kind, what in steps:
        if kind == "select":
            frame = frame.selectExpr(*what)
        elif kind == "where":
            frame = frame.where(what)
        elif kind == "repartition":
            frame = frame.repartition(what[0], *what[1])
        elif kind == "one partition":
            frame = frame.coalesce(1)
        else:
            raise ValueError(f"unknown step {kind!r}")
    return frame


def frame_ref(name: str) -> str:
    """A place in SQL text for the frame ``name`` of :func:`sql_over`. O(1)."""
    return f"\x00{name}\x00"


def sql_over(spark: SparkSession, text: str, frames: Mapping[str, DataFrame]) -> DataFrame:
    """The query ``text`` over ``frames``, each where :func:`frame_ref` of its name is:
    one query, analysed once. Lazy.

    Through PySpark's own frames in SQL (``spark.sql(query, name=frame)``): a
    classic session reads each frame as a temporary view of its own, dropped
    once the query is analysed; Spark Connect sends them with the query.
    """
    escaped = text.replace("{", "{{").replace("}", "}}")  # str.format's, in PySpark
    for name in frames:
        escaped = escaped.replace(frame_ref(name), "{" + name + "}")
    return spark.sql(escaped, None, **frames)


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
    table: DataFrame | Any, directory: str, storage: Storage | None = None, *, fresh: bool = False
) -> list[str] | None:
    """Write ``table``'s rows as Parquet files in ``directory``, which must not exist.

    A frame is written by Spark's writer: one job, a file per partition, and
    Hadoop's commit protocol (task and job commits, ``_SUCCESS``), which for a
    table of a few rows costs more than the rows do. An Arrow table, held in
    the driver, is written there with pyarrow, a file a piece of it, through ``storage``
    (default: a local path) (:func:`write_arrow_parquet`, ``fresh`` as there).
    Either way the files hold the same rows under the same column names and
    Spark types.

    Returns the names of the files written when the driver wrote them; None
    when Spark's writer did (list ``directory`` for them).
    """
    if is_arrow(table):
        return write_arrow_parquet(table, directory, storage, fresh=fresh)
    table.write.mode("error").parquet(directory)  # "errorifexists": not on Connect
    return None


#: The most bytes of Arrow memory one Parquet file the driver writes holds. A larger
#: table is written in pieces, a file each: no file is one huge byte array in memory
#: or in one storage call (a Java array at a URI stops at 2 GiB).
PIECE_BYTES = 256 * 2**20


def write_arrow_parquet(
    table: Any, directory: str, storage: Storage | None = None, *, fresh: bool = False
) -> list[str]:
    """``table`` (Arrow) as Parquet files in the new ``directory``, through ``storage``
    (default: a local path), each seen whole or not at all
    (:meth:`~..storage.Storage.create`); the files' names, in the rows' order. One
    file holds at most :data:`PIECE_BYTES` of the table's memory, so a large table is
    written a piece at a time. ``fresh``: the caller knows ``directory`` is new (an
    attempt's own, named by no earlier write), so it is not looked for first. One
    call a file, and one more without ``fresh``."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from ..storage import LocalStorage, join

    target = storage if storage is not None else LocalStorage()
    # As Spark's writer in mode error: never into old files.
    if not fresh and target.exists(directory):
        raise FileExistsError(directory)
    names = []
    # a name of its own, as Spark's writer gives each file: a replay never reuses a path
    run = uuid.uuid4()
    for number, piece in enumerate(_pieces(table)):
        buffer = pa.BufferOutputStream()
        pq.write_table(piece, buffer)
        name = f"part-{number:05d}-{run}-driver.parquet"
        target.create(join(directory, name), buffer.getvalue().to_pybytes())
        names.append(name)
    return names


def _pieces(table: Any) -> list[Any]:
    """``table`` cut into slices of at most :data:`PIECE_BYTES` each (at least a row);
    an empty table as itself, so its file holds the schema. Zero-copy."""
    rows = table.num_rows
    if rows == 0 or table.nbytes <= PIECE_BYTES:
        return [table]
    per = max(1, rows * PIECE_BYTES // table.nbytes)
    return [table.slice(start, per) for start in range(0, rows, per)]
