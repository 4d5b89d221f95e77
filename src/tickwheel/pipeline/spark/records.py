"""Stage 1: records of any form → validated rows, each with its raw text and a reason or none.

A *records* frame comes from any Spark source, in one of three forms:

* ``"json"``: a ``value`` column of text or bytes, one JSON object per row:
  what Spark's ``text`` source gives for JSON Lines, and its Kafka source
  (``value`` as bytes, or ``CAST(value AS STRING)``). A blank or null value
  is not a record (a Kafka tombstone carries none);
* ``"columns"``: the fields named in ``[input]`` as columns of any Spark type,
  read as text (a ``TIMESTAMP``, an instant, as its epoch milliseconds); the raw text
  of a record is the row as JSON. CSV and Parquet files, and tables, give it;
* ``"maxwell"``: a ``value`` column of Maxwell's binlog JSON, turned into
  records by :mod:`.maxwell`.

:func:`record_fields_frame` turns each form into one shape (``raw``, ``malformed``,
``rejected`` and ``f_<field>``, all text), so :func:`parse_records` validates
all of them with the same Spark expressions; no Python row loop runs here.

Rules of validation (the same as the plain-Python reference of the tests):

* a record that is not a JSON object is ``malformed`` (form ``"json"``: Spark's
  ``from_json`` flags it, or gives nothing);
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

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..rules import Rules
from .frames import PARAMETER_PREFIX, Step, apply_steps, sql_in, sql_name, sql_string

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "DEFAULT_MAX_FUTURE_MS",
    "FORMS",
    "MAX_TIME_MS",
    "MISSING_FILE",
    "RECORDS_DDL_PREFIX",
    "input_form",
    "json_value_steps",
    "key_column",
    "parse_max_future",
    "parse_records",
    "parse_steps",
    "parsed_columns",
    "raw_text_columns",
    "record_fields_frame",
    "rejected_records",
    "used_type",
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
#: The forms a records frame can take (see the module doc).
FORMS = ("json", "columns", "maxwell")
#: The columns every form becomes, before the ``f_<field>`` text columns.
RECORDS_DDL_PREFIX = "raw string, malformed boolean, rejected string"


def key_column(index: int) -> str:
    """Name of the parsed column holding the ``index``-th key field. O(1)."""
    return f"k{index}"


def parse_max_future(value: int | str | None) -> int | None:
    """The far-future guard's setting as ms: a duration (``"1d"``, ``"2h"``, an int of
    ms) or ``"off"``/None (no guard). O(1).

    Raises :class:`~tickwheel.pipeline.rules.RulesError` naming ``--max-future``.
    """
    from ..rules import parse_duration

    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    return parse_duration(value, "--max-future")


def raw_text_columns(raw: str) -> tuple[str, str]:
    """SQL: the column ``raw`` as valid UTF-8 text, and ``raw_bytes``: its exact bytes
    when it is not.

    Spark keeps a text file's (or a Kafka value's) bytes as they are, so a line
    of random bytes is an invalid UTF-8 string, which Spark writes to Parquet
    and JSON unchanged and which Arrow, pandas and PostgreSQL then refuse to
    read. The text gets U+FFFD in place of each invalid sequence; ``raw_bytes``
    (binary) holds the original bytes, or is null when the text was already
    valid, so nothing is lost. O(length) per row.
    """
    column = sql_name(raw)
    return (
        f"make_valid_utf8({column})",
        f"CASE WHEN NOT is_valid_utf8({column}) THEN CAST({column} AS BINARY) END",
    )


def _is_text_or_bytes(frame: DataFrame, column: str) -> bool:
    from pyspark.sql import types as T

    return column in frame.columns and isinstance(
        frame.schema[column].dataType, T.StringType | T.BinaryType
    )


def input_form(records: DataFrame, rules: Rules, input_format: str | None = None) -> str:
    """The form of ``records`` (:data:`FORMS`): ``input_format``, checked, or guessed. O(columns).

    Guessed: ``"columns"`` when the id, type and time fields of ``[input]`` are
    all columns, else ``"json"`` when there is a ``value`` column of text or
    bytes. Raises ValueError naming what is missing.
    """
    cfg = rules.input
    needed = [cfg.id, cfg.type, cfg.time]
    has_value = _is_text_or_bytes(records, "value")
    form = "json" if input_format == "jsonl" else input_format
    if form is None:
        if all(name in records.columns for name in needed):
            return "columns"
        if has_value:
            return "json"
        raise ValueError(
            "records: expected a 'value' column of text or bytes (one record per row) or "
            f"the columns {needed} that [input] names; got columns {records.columns}"
        )
    if form not in FORMS:
        raise ValueError(f"input_format must be one of {', '.join(FORMS)} or None, got {form!r}")
    if form in ("json", "maxwell") and not has_value:
        raise ValueError(
            f"records of input_format {form!r} need a 'value' column of text or bytes; "
            f"got columns {records.columns}"
        )
    return form


def record_fields_frame(records: DataFrame, rules: Rules, form: str) -> DataFrame:
    """``records`` of ``form`` as columns ``raw``, ``malformed``, ``rejected``, ``f_<field>``.

    ``rejected`` is a reason decided before validation (by the Maxwell
    adapter), null otherwise. Lazy.
    """
    if form == "columns":
        return _from_columns(records, rules)
    if form == "maxwell":
        return _from_maxwell(records, rules)
    return _from_json_values(records, rules)


def _from_json_values(records: DataFrame, rules: Rules) -> DataFrame:
    """JSON text, one object per row: :func:`json_value_steps` as DataFrame calls."""
    return apply_steps(records, json_value_steps(rules))


def json_value_steps(rules: Rules) -> list[Step]:
    """The steps (:func:`.frames.steps_sql`) that parse a ``value`` of JSON text, one
    object per row, with ``from_json``: each keeps its raw text, in the columns of
    :func:`record_fields_frame`.

    ``value`` is taken as text; bytes are taken as they are (invalid UTF-8 is
    kept, see above). SQL text: one call into the JVM per column.
    """
    fields = rules.record_fields
    schema = ", ".join(f"{sql_name(name)} STRING" for name in (*fields, CORRUPT))
    options = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {sql_string(CORRUPT)})"
    return [
        ("select", ["CAST(value AS STRING) AS raw"]),
        ("where", "trim(raw) != ''"),
        ("select", ["raw", f"from_json(raw, {sql_string(schema)}, {options}) AS s"]),
        ("select", [
            "raw",
            f"s IS NULL OR s.{sql_name(CORRUPT)} IS NOT NULL AS malformed",
            "CAST(NULL AS STRING) AS rejected",
            *[f"s.{sql_name(name)} AS {sql_name(f'f_{name}')}" for name in fields],
        ]),
    ]  # fmt: skip


def _field_text(records: DataFrame, name: str) -> Column:
    """A field of a typed record as text: a TIMESTAMP as its epoch milliseconds."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    column = F.col(f"`{name}`")
    if isinstance(records.schema[name].dataType, T.TimestampType):
        return F.unix_millis(column).cast("string")
    return column.cast("string")


def _from_columns(records: DataFrame, rules: Rules) -> DataFrame:
    """Typed records: each field as text, the raw text the record as JSON."""
    from pyspark.sql import functions as F

    present = set(records.columns)
    raw = F.to_json(F.struct(*[F.col(f"`{c}`") for c in records.columns]))
    return records.select(
        raw.alias("raw"),
        F.lit(False).alias("malformed"),
        F.lit(None).cast("string").alias("rejected"),
        *[
            (_field_text(records, name) if name in present else F.lit(None).cast("string")).alias(
                f"f_{name}"
            )
            for name in rules.record_fields
        ],
    )


def _from_maxwell(values: DataFrame, rules: Rules) -> DataFrame:
    """Maxwell's binlog JSON → the records it describes, and rows rejected with their reason."""
    from pyspark.sql import functions as F

    from .maxwell import maxwell_records

    records, rejected = maxwell_records(values, rules)
    refused = rejected.select(
        F.col("raw"),
        F.lit(False).alias("malformed"),
        F.col("reason").alias("rejected"),
        *[F.lit(None).cast("string").alias(f"f_{name}") for name in rules.record_fields],
    )
    return records.unionByName(refused)


def rejected_records(
    spark: SparkSession, rules: Rules, rows: Sequence[tuple[str, str]]
) -> DataFrame | None:
    """Records refused before they were read, as ``(raw, reason)`` pairs, in the shape of
    :func:`record_fields_frame` (a file listed then removed, an unreadable file). O(rows)."""
    if not rows:
        return None
    fields = rules.record_fields
    schema = RECORDS_DDL_PREFIX + "".join(f", `f_{name}` string" for name in fields)
    return spark.createDataFrame(
        [(raw, False, reason, *([None] * len(fields))) for raw, reason in rows], schema
    )


def _missing(column: str) -> str:
    """SQL: the text ``column`` is absent (null or empty)."""
    return f"({column} IS NULL OR {column} = '')"


def _time_ms(text: str) -> str:
    """SQL: the time text ``text`` as epoch ms (an integer, or ISO 8601), else null."""
    return (
        f"CASE WHEN {text} RLIKE {sql_string(INT_PATTERN)} THEN try_cast({text} AS BIGINT) "
        f"WHEN {text} RLIKE {sql_string(ISO_PATTERN)} "
        f"THEN unix_millis(try_cast({text} AS TIMESTAMP)) END"
    )


def _sequence(rules: Rules) -> str:
    """SQL: the sequence field as a long (0 when absent), null when it is not an integer."""
    if rules.input.sequence is None:
        return "CAST(0 AS BIGINT)"
    text = _field(rules.input.sequence)
    return (
        f"CASE WHEN {_missing(text)} THEN CAST(0 AS BIGINT) "
        f"WHEN {text} RLIKE {sql_string(INT_PATTERN)} THEN try_cast({text} AS BIGINT) END"
    )


def _field(name: str) -> str:
    """SQL: the text column of the record field ``name``."""
    return sql_name(f"f_{name}")


def used_type(rules: Rules, column: str) -> str:
    """SQL: the event type in ``column`` (SQL text) is one some rule uses. O(types)."""
    return sql_in(column, rules.event_types)


def _reason(rules: Rules, max_time: int | str | None) -> str:
    """SQL: the first reason a record is rejected for, or null. Reads ``_time`` and ``_seq``.

    ``max_time`` is the far-future limit: epoch ms, or a column's name.
    """
    cfg = rules.input
    type_text = _field(cfg.type)
    cases = [
        ("rejected IS NOT NULL", "rejected"),
        ("malformed", sql_string("malformed")),
        *[
            (_missing(_field(name)), sql_string(f"missing_field:{name}"))
            for name in (cfg.id, cfg.type, cfg.time)
        ],
    ]
    for name in rules.key_fields:
        types = sorted({t for r in rules.rules if r.key == name for t in r.event_types})
        cases.append(
            (f"{sql_in(type_text, types)} AND {_missing(_field(name))}",
             sql_string(f"missing_field:{name}"))
        )  # fmt: skip
    time_ok = f"_time IS NOT NULL AND _time >= 0 AND _time <= {MAX_TIME_MS}"
    cases.append((f"NOT ({time_ok})", "'bad_time'"))
    if max_time is not None:
        limit = str(max_time) if isinstance(max_time, int) else sql_name(max_time)
        cases.append((f"_time > {limit}", "'far_future'"))
    cases.append(("_seq IS NULL", "'bad_sequence'"))
    return "CASE " + " ".join(f"WHEN {test} THEN {value}" for test, value in cases) + " END"


def parse_records(records: DataFrame, rules: Rules, max_time: int | str | None = None) -> DataFrame:
    """Validate ``records`` (from :func:`record_fields_frame`) with Spark SQL expressions:
    :func:`parse_steps` as DataFrame calls, the run parameters (columns whose names
    start with ``_p_``) kept. Lazy."""
    params = [c for c in records.columns if c.startswith(PARAMETER_PREFIX)]
    return apply_steps(records, parse_steps(rules, max_time, params))


def parsed_columns(rules: Rules, params: Sequence[str] = ()) -> list[str]:
    """The columns of the parsed records (:func:`parse_steps`), in order. O(key fields)."""
    keys = [key_column(i) for i in range(len(rules.key_fields))]
    return ["raw", "reason", "event_id", "event_type", "time", "seq", *keys, "relevant", *params]


def parse_steps(rules: Rules, max_time: int | str | None, params: Sequence[str]) -> list[Step]:
    """The steps (:func:`.frames.steps_sql`) that validate records of the columns of
    :func:`record_fields_frame`, with Spark SQL expressions.

    ``max_time`` is the far-future guard's limit: a later event time is
    rejected as ``far_future`` (None: no guard). It is epoch ms, or the name
    of a column, such as a run parameter's, so that the query's code does not
    change with it. ``params`` names columns passed through (run parameters).

    Output columns (:func:`parsed_columns`): ``raw``, ``reason`` (None for a valid
    record), ``event_id``, ``event_type``, ``time`` (epoch ms), ``seq``,
    ``k0..kN`` (one per key field of the rules, see :func:`key_column`),
    ``relevant`` (some rule uses the type), and ``params``.
    """
    cfg = rules.input
    id_text, type_text = _field(cfg.id), _field(cfg.type)
    # The time and the sequence (regular expressions and casts) are computed once
    # per record in this projection; the checks below only read the columns.
    # Spark keeps the two projections apart because the expressions are not cheap.
    return [
        ("select", ["*", f"{_time_ms(_field(cfg.time))} AS _time", f"{_sequence(rules)} AS _seq"]),
        ("select", [
            "raw",
            f"{_reason(rules, max_time)} AS reason",
            f"CASE WHEN NOT {_missing(id_text)} THEN {id_text} END AS event_id",
            f"{type_text} AS event_type",
            "_time AS `time`",
            "_seq AS seq",
            *[f"{_field(name)} AS {key_column(i)}" for i, name in enumerate(rules.key_fields)],
            f"{used_type(rules, type_text)} AS relevant",
            *[sql_name(name) for name in params],
        ]),
    ]  # fmt: skip
