"""What the SQLite and PostgreSQL sinks share: staging tables, Spark's JDBC writer and
reader, and the SQL types of a DataFrame's schema (the drivers' jars are
:mod:`..spark.jdbc_drivers`').

Spark's JDBC writer cannot create tables in SQLite, and reads SQLite's BIGINT
back as a decimal; the JDBC sinks therefore create every table themselves from
the DataFrame's schema and read back with an explicit ``customSchema``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .base import BATCH_ID, SinkError
from .credentials import redact_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from ..attempt import Attempt


__all__ = ["ATTEMPT", "BATCHES_TABLE", "JdbcSink", "quote_identifier"]


def _with_batch_id(df: DataFrame, batch_id: int) -> DataFrame:
    from pyspark.sql import functions as F

    return df.withColumn(BATCH_ID, F.lit(batch_id).cast("long"))


def _sql_type(dtype: Any, dialect: str) -> str:
    from pyspark.sql import types as T

    if isinstance(dtype, T.LongType):
        return "BIGINT"
    if isinstance(dtype, (T.IntegerType, T.ShortType, T.ByteType)):
        return "INTEGER"
    if isinstance(dtype, (T.DoubleType, T.FloatType)):
        return "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    if isinstance(dtype, T.BooleanType):
        return "BOOLEAN" if dialect == "postgresql" else "INTEGER"
    if isinstance(dtype, T.TimestampType):
        return "TIMESTAMPTZ" if dialect == "postgresql" else "TEXT"
    if isinstance(dtype, T.StringType):
        return "TEXT"
    if isinstance(dtype, T.BinaryType):
        return "BYTEA" if dialect == "postgresql" else "BLOB"
    if isinstance(dtype, T.DecimalType):
        return f"NUMERIC({dtype.precision},{dtype.scale})"
    raise SinkError(f"the JDBC sinks cannot store a column of type {dtype.simpleString()}")


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (:class:`SinkError` for anything but letters,
    digits and ``_``). O(len)."""
    if not name.replace("_", "").isalnum():
        raise SinkError(f"unsafe SQL identifier {name!r}")
    return f'"{name}"'


def _create_table_sql(name: str, schema: StructType, dialect: str, staging: bool = False) -> str:
    cols = [f"{quote_identifier(f.name)} {_sql_type(f.dataType, dialect)}" for f in schema.fields]
    cols.append(f"{quote_identifier(BATCH_ID)} BIGINT NOT NULL")
    if staging:  # which attempt staged the row: a commit copies one attempt's rows
        cols.append(f"{quote_identifier(ATTEMPT)} TEXT")
    return f"CREATE TABLE IF NOT EXISTS {quote_identifier(name)} ({', '.join(cols)})"


def _attempt_literal(tag: str) -> str:
    """An attempt's tag (:class:`~..attempt.Attempt`) as an SQL string literal."""
    if not re.fullmatch(r"[A-Za-z0-9-]+", tag):
        raise SinkError(f"unsafe attempt tag {tag!r}")
    return f"'{tag}'"


def _custom_schema(schema: StructType) -> str:
    parts = [f"{f.name} {f.dataType.simpleString()}" for f in schema.fields]
    parts.append(f"{BATCH_ID} bigint")
    return ", ".join(parts)


#: The staging tables' column naming the attempt that staged each row.
ATTEMPT = "tickwheel_attempt"
BATCHES_TABLE = "tickwheel_batches"
_SCHEMAS_TABLE = "tickwheel_schemas"


class JdbcSink:
    """Shared logic of the SQLite and PostgreSQL sinks (staging tables + one transaction)."""

    name = "jdbc"
    dialect = "?"
    driver_class = "?"

    def __init__(self, url: str, *, prefix: str = "") -> None:
        self.url = url
        self.prefix = prefix
        self._schemas: dict[str, StructType] = {}
        self._ready = False

    # dialect hooks -------------------------------------------------------------
    def _execute(self, statements: Sequence[str], *, transaction: bool) -> None:
        raise NotImplementedError

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _jdbc_options(self) -> dict[str, str]:
        return {"url": self.url, "driver": self.driver_class}

    def _write_parallelism(self) -> int | None:
        return None

    # shared --------------------------------------------------------------------
    def describe(self) -> str:
        """Return ``<dialect>:<url>``, secrets redacted (:func:`redact_url`)."""
        return f"{self.name}:{redact_url(self.url)}"

    def _table(self, table: str) -> str:
        return f"{self.prefix}{table}"

    def _stage_table(self, table: str) -> str:
        return f"{self.prefix}stage_{table}"

    def _ensure_base(self) -> None:
        if self._ready:
            return
        self._execute(
            [
                f"CREATE TABLE IF NOT EXISTS {quote_identifier(self._table(BATCHES_TABLE))} ("
                "batch_id BIGINT PRIMARY KEY, committed_at DOUBLE PRECISION NOT NULL, "
                "row_counts TEXT NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {quote_identifier(self._table(_SCHEMAS_TABLE))} ("
                "table_name TEXT PRIMARY KEY, spark_schema TEXT NOT NULL)",
            ],
            transaction=True,
        )
        self._ready = True

    def _ensure_table(self, table: str, schema: StructType) -> None:
        from pyspark.sql.types import StructType

        if table in self._schemas:
            return
        rows = self._query(
            f"SELECT spark_schema FROM {quote_identifier(self._table(_SCHEMAS_TABLE))} "
            f"WHERE table_name = '{table}'"
        )
        if rows:
            stored = StructType.fromJson(json.loads(rows[0][0]))
            if [f.name for f in stored.fields] != [f.name for f in schema.fields]:
                raise SinkError(
                    f"table {self._table(table)!r} exists with columns "
                    f"{[f.name for f in stored.fields]}, the batch has "
                    f"{[f.name for f in schema.fields]}"
                )
            self._schemas[table] = stored
            self._ensure_attempt_column(table)
            return
        schema_json = json.dumps(schema.jsonValue()).replace("'", "''")
        self._execute(
            [
                _create_table_sql(self._table(table), schema, self.dialect),
                _create_table_sql(self._stage_table(table), schema, self.dialect, staging=True),
                f"INSERT INTO {quote_identifier(self._table(_SCHEMAS_TABLE))} "
                f"(table_name, spark_schema) VALUES ('{table}', '{schema_json}')",
            ],
            transaction=True,
        )
        self._schemas[table] = schema

    def _ensure_attempt_column(self, table: str) -> None:
        """Give a staging table of an older release the attempt column. One query."""
        stage = quote_identifier(self._stage_table(table))
        try:
            self._query(f"SELECT {quote_identifier(ATTEMPT)} FROM {stage} WHERE 1 = 0")
        except Exception:  # the column is missing: the staging table is older
            self._execute([f"ALTER TABLE {stage} ADD COLUMN {quote_identifier(ATTEMPT)} TEXT"],
                          transaction=True)  # fmt: skip

    def _known_tables(self) -> list[str]:
        """Every table the sink has created, their schemas loaded. One query."""
        from pyspark.sql.types import StructType

        rows = self._query(
            f"SELECT table_name, spark_schema FROM {quote_identifier(self._table(_SCHEMAS_TABLE))} "
            "ORDER BY table_name"
        )
        for name, schema in rows:
            self._schemas.setdefault(name, StructType.fromJson(json.loads(schema)))
        return [name for name, _ in rows]

    def _drop_staged(self, batch_id: int, tables: Sequence[str]) -> list[str]:
        """The statements that drop every staged row of ``batch_id`` and older batches:
        once a batch is published, no commit names any of them."""
        return [
            f"DELETE FROM {quote_identifier(self._stage_table(t))} "
            f"WHERE {BATCH_ID} <= {int(batch_id)}"
            for t in tables
        ]

    def _commit_preamble(self) -> list[str]:
        """Statements that open the commit's transaction (a dialect's lock)."""
        return []

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        attempt: Attempt,
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
    ) -> dict[str, Any]:
        """Append the batch's rows to the staging tables through Spark's JDBC writer,
        marked with ``attempt``'s tag; return the tag and the tables.

        No other attempt's rows are touched: a commit copies one attempt's. A
        table in ``empty`` is created when missing, and gets no write job.
        """
        from pyspark.sql import functions as F

        self._ensure_base()
        for table, df in tables.items():
            self._ensure_table(table, df.schema)
            if table in empty:
                if on_table is not None:
                    on_table(table)
                continue
            out = _with_batch_id(df, batch_id).withColumn(ATTEMPT, F.lit(attempt.tag))
            parallelism = self._write_parallelism()
            if parallelism is not None:
                out = out.coalesce(parallelism)
            writer = out.write.format("jdbc").mode("append")
            writer = writer.option("dbtable", self._stage_table(table))
            for key, value in self._jdbc_options().items():
                writer = writer.option(key, value)
            writer.option("batchsize", "10000").save()
            if on_table is not None:
                on_table(table)
        return {"attempt": attempt.tag, "tables": sorted(tables)}

    def commit(self, batch_id: int, staged: Mapping[str, Any] | None) -> bool:
        """ONE transaction: the rows ``staged`` names (one attempt's) copied into the
        tables, the ``tickwheel_batches`` row inserted, and the staged rows of this
        batch and older ones dropped; each insert guarded by the batch's absence, so
        a second commit of the batch (a roll-forward, a concurrent one) copies
        nothing. False when the batch was committed already."""
        self._ensure_base()
        tables = self._known_tables()
        if self.is_committed(batch_id):
            self._execute(self._drop_staged(batch_id, tables), transaction=True)
            return False
        if staged is None:
            raise SinkError(f"batch {batch_id} was not staged in {self.describe()}")
        where = (
            f"{BATCH_ID} = {int(batch_id)} AND {quote_identifier(ATTEMPT)} = "
            f"{_attempt_literal(str(staged['attempt']))}"
        )
        counts = {}
        for table in staged["tables"]:
            rows = self._query(f"SELECT COUNT(*) FROM {quote_identifier(self._stage_table(table))} "
                               f"WHERE {where}")  # fmt: skip
            counts[table] = int(rows[0][0])
        guard = (
            f"NOT EXISTS (SELECT 1 FROM {quote_identifier(self._table(BATCHES_TABLE))} "
            f"WHERE batch_id = {int(batch_id)})"
        )
        statements = self._commit_preamble()
        for table in staged["tables"]:
            cols = ", ".join(quote_identifier(f.name) for f in self._schemas[table].fields)
            cols += f", {quote_identifier(BATCH_ID)}"
            statements.append(
                f"INSERT INTO {quote_identifier(self._table(table))} ({cols}) SELECT {cols} FROM "
                f"{quote_identifier(self._stage_table(table))} WHERE {where} AND {guard}"
            )
        row_counts = json.dumps(counts, sort_keys=True)
        statements.append(
            f"INSERT INTO {quote_identifier(self._table(BATCHES_TABLE))} "
            f"(batch_id, committed_at, row_counts) SELECT {int(batch_id)}, {time.time()!r}, "
            f"'{row_counts}' WHERE {guard}"
        )
        statements.extend(self._drop_staged(batch_id, tables))
        self._execute(statements, transaction=True)
        return True

    def location(self) -> dict[str, Any]:
        """What the checkpoint records to find this sink again (no secret). O(1)."""
        return {"name": self.name, "url": self.url, "prefix": self.prefix}

    def is_committed(self, batch_id: int) -> bool:
        """True when ``tickwheel_batches`` holds ``batch_id``. One indexed query."""
        self._ensure_base()
        rows = self._query(
            f"SELECT 1 FROM {quote_identifier(self._table(BATCHES_TABLE))} "
            f"WHERE batch_id = {int(batch_id)}"
        )
        return bool(rows)

    def committed_batches(self) -> list[int]:
        """Return the committed batch ids in order."""
        self._ensure_base()
        rows = self._query(
            f"SELECT batch_id FROM {quote_identifier(self._table(BATCHES_TABLE))} ORDER BY batch_id"
        )
        return [int(r[0]) for r in rows]

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Read ``table`` back through Spark JDBC with its original Spark types."""
        self._ensure_base()
        rows = self._query(
            f"SELECT spark_schema FROM {quote_identifier(self._table(_SCHEMAS_TABLE))} "
            f"WHERE table_name = '{table}'"
        )
        if not rows:
            return None
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(json.loads(rows[0][0]))
        reader = spark.read.format("jdbc").option("dbtable", self._table(table))
        for key, value in self._jdbc_options().items():
            reader = reader.option(key, value)
        df = reader.option("customSchema", _custom_schema(schema)).load()
        # SQLite hands BIGINT/TEXT back loosely typed: cast to the stored Spark types.
        from pyspark.sql import functions as F

        return df.select(
            *[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields],
            F.col(BATCH_ID).cast("long").alias(BATCH_ID),
        )
