"""Reading, parsing and validating input records with Spark's own functions.

No Python row loop runs here: every check is a Spark SQL expression, so the
work stays in the JVM. The result of :func:`parse_records` has one row per
input record with its raw text and either a parsed event or a reject reason.

Rules of validation (the same as :mod:`tickwheel.pipeline.reference`):

* JSON Lines: a blank line is not a record; a line that is not a JSON object is
  ``malformed``;
* the id, type and time fields are required, and so is the key field of every
  rule that uses the record's type (``missing_field:<name>``; an empty string
  counts as missing);
* the time is epoch milliseconds (an integer) or ISO-8601 with an offset
  (``2024-01-01T10:00:00.123+02:00`` or ``...Z``), between 1970 and 9999;
  anything else is ``bad_time``;
* the far-future guard: a time later than the limit the run was given (by
  default processing time + one day, :data:`DEFAULT_MAX_FUTURE_MS`) is
  ``far_future``, so one mistyped record cannot drag the watermark years ahead;
* the sequence, when configured, is an integer (``bad_sequence`` otherwise);
  a missing sequence is 0.

Values are read as text, as from a CSV file: a time written as a string of
digits (``"1704067200000"``) is epoch milliseconds, and a key written as a
JSON array or object is taken as its compact JSON text (``["o1"]``).

Raw text in outputs is valid UTF-8: :func:`raw_text_columns` replaces invalid
bytes and keeps the exact bytes beside it, in ``raw_bytes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .rules import Rules

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "DEFAULT_MAX_FUTURE_MS",
    "MAX_TIME_MS",
    "MISSING_FILE",
    "empty_frame",
    "key_column",
    "parameter",
    "parse_max_future",
    "parse_records",
    "raw_text_columns",
    "read_records",
    "run_parameters",
]

MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
#: The far-future guard's default: an event may be stamped at most one day after
#: the run's processing time (``--max-future 1d``; ``--max-future off`` turns it off).
DEFAULT_MAX_FUTURE_MS = 86_400_000
#: The reject reason of a file that was listed, then removed before it was read.
MISSING_FILE = "missing_file: removed before it was read"
INT_PATTERN = r"^-?[0-9]+$"
ISO_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
)
CORRUPT = "_tickwheel_corrupt"


def empty_frame(spark: SparkSession, schema: StructType | str) -> DataFrame:
    """An empty frame of ``schema`` (a StructType or DDL), built in the JVM. O(1).

    ``spark.createDataFrame([], schema)`` goes through a Python RDD: each job
    that reads it runs a task per default partition in a Python worker, rows
    or not. The stream built a few such frames per micro-batch (the rejected
    rows' start, the records' start); this one is an empty local relation,
    which Spark plans away.
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
    every literal into the code. A value that changes from one micro-batch (or
    run) to the next, such as a watermark or the far-future limit, made each
    batch's code new: Spark compiled 14 classes per micro-batch, and the JVM
    ran them interpreted until its JIT compiled them again, which took more of
    the stream's CPU than its tasks did (at 1e6 orders in 10 increments: 27.7
    s of JIT threads against 36.5 s of task threads, 2026-11-25). A value read
    from a broadcast local table is data, not code: the code stays the same
    from batch to batch, and Spark's and the JIT's caches keep it.
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


def key_column(index: int) -> str:
    """Name of the parsed column holding the ``index``-th key field. O(1)."""
    return f"k{index}"


def parse_max_future(text: str) -> int | None:
    """``--max-future``'s value: a duration (``"1d"``, ``"2h"``, ms) or ``"off"`` (None).

    Raises :class:`~tickwheel.pipeline.rules.RulesError` naming the option. O(1).
    """
    from .rules import parse_duration

    if text.strip().lower() == "off":
        return None
    return parse_duration(text, "--max-future")


def raw_text_columns(raw: Column) -> tuple[Column, Column]:
    """``raw`` as valid UTF-8 text, and ``raw_bytes``: its exact bytes when it is not.

    Spark keeps a text file's bytes as they are, so a line of random bytes is
    an invalid UTF-8 string, which Spark writes to Parquet and JSON unchanged
    and which Arrow, pandas and PostgreSQL then refuse to read. The text gets
    U+FFFD in place of each invalid sequence; ``raw_bytes`` (binary) holds the
    original bytes, or is null when the text was already valid, so nothing is
    lost. O(length) per row.
    """
    from pyspark.sql import functions as F

    return F.make_valid_utf8(raw), F.when(~F.is_valid_utf8(raw), raw.cast("binary"))


def _fields(rules: Rules) -> list[str]:
    cfg = rules.input
    names = [cfg.id, cfg.type, cfg.time]
    if cfg.sequence is not None:
        names.append(cfg.sequence)
    names.extend(rules.key_fields)
    seen: dict[str, None] = {}
    for name in names:
        seen.setdefault(name, None)
    return list(seen)


def read_records(spark: SparkSession, paths: list[str], rules: Rules) -> DataFrame:
    """Read the input as strings: columns ``raw``, ``malformed`` and one per needed field.

    JSON Lines are read as text and parsed with ``from_json`` (so each record
    keeps its raw line); CSV (with a header) and Parquet are read by Spark and
    their raw text is the record as JSON. Field columns are named ``f_<field>``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    fmt = rules.input.format
    fields = _fields(rules)
    if not paths:  # every listed file was removed before the read
        return spark.createDataFrame(
            [],
            T.StructType(
                [T.StructField("raw", T.StringType()), T.StructField("malformed", T.BooleanType())]
                + [T.StructField(f"f_{name}", T.StringType()) for name in fields]
            ),
        )
    if fmt == "json":
        schema = T.StructType(
            [T.StructField(name, T.StringType()) for name in fields]
            + [T.StructField(CORRUPT, T.StringType())]
        )
        text = spark.read.text(paths)
        text = text.filter(F.trim(F.col("value")) != "")
        parsed = text.select(
            F.col("value").alias("raw"),
            F.from_json(
                F.col("value"), schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
            ).alias("s"),
        )
        return parsed.select(
            "raw",
            F.col(f"s.{CORRUPT}").isNotNull().alias("malformed"),
            *[F.col("s").getField(name).alias(f"f_{name}") for name in fields],
        )
    if fmt == "csv":
        frame = spark.read.option("header", True).option("inferSchema", False).csv(paths)
    elif fmt == "parquet":
        frame = spark.read.parquet(*paths)
    else:  # pragma: no cover - rules validation refuses other formats
        raise ValueError(f"unknown input format {fmt!r}")
    present = set(frame.columns)
    cols = [
        (
            F.col(f"`{name}`").cast("string") if name in present else F.lit(None).cast("string")
        ).alias(f"f_{name}")
        for name in fields
    ]
    raw = F.to_json(F.struct(*[F.col(f"`{c}`") for c in frame.columns]))
    return frame.select(raw.alias("raw"), F.lit(False).alias("malformed"), *cols)


def _missing(col: Column) -> Column:
    from pyspark.sql import functions as F

    return col.isNull() | (col == F.lit(""))


def parse_records(
    records: DataFrame, rules: Rules, max_time_ms: int | Column | None = None
) -> DataFrame:
    """Validate ``records`` (from :func:`read_records`) with Spark SQL expressions.

    ``max_time_ms`` is the far-future guard's limit: a later event time is
    rejected as ``far_future`` (None: no guard). It may be a column, such as
    a :func:`parameter`, so that the query's code does not change with it.

    Output columns: ``raw``, ``reason`` (None for a valid record), ``event_id``,
    ``event_type``, ``time`` (epoch ms), ``seq``, ``k0..kN`` (one per key field of
    the rules, see :func:`key_column`) and ``relevant`` (some rule uses the type).
    """
    from pyspark.sql import functions as F

    cfg = rules.input
    id_col = F.col(f"f_{cfg.id}")
    type_col = F.col(f"f_{cfg.type}")
    time_text = F.col(f"f_{cfg.time}")
    time_ms = (
        F.when(time_text.rlike(INT_PATTERN), time_text.try_cast("long"))
        .when(time_text.rlike(ISO_PATTERN), F.unix_millis(time_text.try_cast("timestamp")))
        .otherwise(F.lit(None).cast("long"))
    )
    if cfg.sequence is not None:
        seq_text = F.col(f"f_{cfg.sequence}")
        seq_value = (
            F.when(_missing(seq_text), F.lit(0).cast("long"))
            .when(seq_text.rlike(INT_PATTERN), seq_text.try_cast("long"))
            .otherwise(F.lit(None).cast("long"))
        )
    else:
        seq_value = F.lit(0).cast("long")
    # The time and the sequence (regular expressions and casts) are computed once
    # per record in this projection; the checks below only read the columns.
    # Spark keeps the two projections apart because the expressions are not cheap.
    records = records.select("*", time_ms.alias("_time"), seq_value.alias("_seq"))
    time_col = F.col("_time")
    seq = F.col("_seq")
    time_ok = time_col.isNotNull() & (time_col >= 0) & (time_col <= MAX_TIME_MS)
    reason = (
        F.when(F.col("malformed"), F.lit("malformed"))
        .when(_missing(id_col), F.lit(f"missing_field:{cfg.id}"))
        .when(_missing(type_col), F.lit(f"missing_field:{cfg.type}"))
        .when(_missing(time_text), F.lit(f"missing_field:{cfg.time}"))
    )
    for name in rules.key_fields:
        types = sorted(
            {t for r in rules.rules if r.key == name for t in (*r.open, *r.complete, *r.cancel)}
        )
        reason = reason.when(
            type_col.isin(types) & _missing(F.col(f"f_{name}")), F.lit(f"missing_field:{name}")
        )
    reason = reason.when(~time_ok, F.lit("bad_time"))
    if max_time_ms is not None:
        limit = max_time_ms if not isinstance(max_time_ms, int) else F.lit(max_time_ms)
        reason = reason.when(time_col > limit, F.lit("far_future"))
    reason = reason.when(seq.isNull(), F.lit("bad_sequence"))
    return records.select(
        "raw",
        reason.alias("reason"),
        F.when(~_missing(id_col), id_col).alias("event_id"),
        type_col.alias("event_type"),
        time_col.alias("time"),
        seq.alias("seq"),
        *[F.col(f"f_{name}").alias(key_column(i)) for i, name in enumerate(rules.key_fields)],
        type_col.isin(list(rules.event_types)).alias("relevant"),
    )
