"""Reading one micro-batch's files into the batch job's records.

:class:`BatchReader` turns a batch's files into the record frame of
:func:`tickwheel.pipeline.events.read_records` (``raw``, ``malformed``,
``f_<field>``) and validates it with the batch job's own
:func:`~tickwheel.pipeline.events.parse_records`. Unlike the batch reader, each
CSV or Parquet file is read on its own, so one file's extra or missing columns,
or one unreadable file, cannot spoil the others: an unreadable file becomes one
``rejected`` row naming it. Marker files (``*.heartbeat``) hold an event time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .events import CORRUPT, _fields, empty_frame, key_column, parse_records

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from .rules import Rules

__all__ = ["HEARTBEAT_SUFFIX", "BatchReader"]

HEARTBEAT_SUFFIX = ".heartbeat"
REJECTED_SCHEMA = "event_id string, reason string, raw string"


class BatchReader:
    """Reads and validates the files of one micro-batch, for one input format."""

    def __init__(self, rules: Rules, input_format: str) -> None:
        """``input_format`` is json, csv, parquet or maxwell (already checked). O(1)."""
        self.rules = rules
        self.input_format = input_format
        self.fields = _fields(rules)

    def read(self, spark: SparkSession, files: Sequence[str]) -> tuple[DataFrame, DataFrame]:
        """(records, rejected rows) of ``files``; cost: one lazy frame per CSV/Parquet file."""
        from pyspark.sql import types as T

        rejected = [empty_frame(spark, REJECTED_SCHEMA)]
        parts: list[DataFrame] = []
        if files and self.input_format in ("json", "maxwell"):
            parts.append(self._json_lines(spark, files, rejected))
        elif self.input_format == "csv":
            for path in files:
                self._csv_file(spark, path, parts, rejected)
        else:
            for path in files:
                self._parquet_file(spark, path, parts, rejected)
        records = empty_frame(
            spark,
            T.StructType(
                [T.StructField("raw", T.StringType()), T.StructField("malformed", T.BooleanType())]
                + [T.StructField(f"f_{f}", T.StringType()) for f in self.fields]
            ),
        )
        for part in parts:
            records = records.unionByName(part)
        out = rejected[0]
        for more in rejected[1:]:
            out = out.unionByName(more)
        return records, out

    def _json_lines(
        self, spark: SparkSession, files: Sequence[str], rejected: list[DataFrame]
    ) -> DataFrame:
        """JSON Lines (or Maxwell's binlog JSON, turned into them) parsed with ``from_json``."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        lines = spark.read.text(list(files))
        if self.input_format == "maxwell":
            from .maxwell import maxwell_records

            records, mrej = maxwell_records(lines, self.rules)
            rejected.append(
                mrej.select(F.lit(None).cast("string").alias("event_id"), "reason", "raw")
            )
            return records
        schema = T.StructType(
            [T.StructField(f, T.StringType()) for f in self.fields]
            + [T.StructField(CORRUPT, T.StringType())]
        )
        parsed = lines.where(F.trim(F.col("value")) != "").select(
            F.col("value").alias("raw"),
            F.from_json(
                "value", schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
            ).alias("s"),
        )
        return parsed.select(
            "raw",
            (F.col("s").isNull() | F.col(f"s.{CORRUPT}").isNotNull()).alias("malformed"),
            *[F.col("s").getField(f).alias(f"f_{f}") for f in self.fields],
        )

    def _csv_file(
        self, spark: SparkSession, path: str, parts: list[DataFrame], rejected: list[DataFrame]
    ) -> None:
        """One CSV file with a header, read as text and parsed with ``from_csv``."""
        from pyspark.sql import functions as F

        header = _first_line(path)
        if header is None:
            return  # a zero-byte file: no records
        names = [h.strip().strip('"') for h in header.split(",")]
        if len(set(names)) != len(names) or not all(names):
            rejected.append(_file_reject(spark, path, f"bad CSV header: {header[:200]!r}"))
            return
        schema = ", ".join(f"`{n}` STRING" for n in names)
        lines = spark.read.text(path).where(F.col("value") != header)
        lines = lines.where(F.trim(F.col("value")) != "")
        parsed = lines.select(
            F.col("value").alias("raw"),
            F.from_csv("value", schema, {"mode": "PERMISSIVE"}).alias("s"),
        )
        parts.append(
            parsed.select(
                "raw",
                F.col("s").isNull().alias("malformed"),
                *[
                    (F.col(f"s.`{f}`") if f in names else F.lit(None).cast("string")).alias(
                        f"f_{f}"
                    )
                    for f in self.fields
                ],
            )
        )

    def _parquet_file(
        self, spark: SparkSession, path: str, parts: list[DataFrame], rejected: list[DataFrame]
    ) -> None:
        """One Parquet file; its raw text is the record as JSON."""
        from pyspark.sql import functions as F

        if os.path.getsize(path) == 0:
            return  # a zero-byte file: no records
        try:
            frame = spark.read.parquet(path)
            present = set(frame.columns)
        except Exception as exc:  # garbage or truncated: reject the file, keep going
            text = str(exc).strip()
            first = text.splitlines()[0][:200] if text else type(exc).__name__
            rejected.append(_file_reject(spark, path, f"unreadable parquet file: {first}"))
            return
        raw = F.to_json(F.struct(*[F.col(f"`{c}`") for c in frame.columns]))
        parts.append(
            frame.select(
                raw.alias("raw"),
                F.lit(False).alias("malformed"),
                *[
                    (
                        F.col(f"`{f}`").cast("string")
                        if f in present
                        else F.lit(None).cast("string")
                    ).alias(f"f_{f}")
                    for f in self.fields
                ],
            )
        )

    def parse(self, records: DataFrame, max_time_ms: int | Column | None) -> DataFrame:
        """The batch job's validation (with the far-future limit ``max_time_ms``). Lazy."""
        return parse_records(records, self.rules, max_time_ms)

    def events(self, parsed: DataFrame) -> DataFrame:
        """The valid records of ``parsed`` as events, with keys as ``k_<field>``. Lazy."""
        from pyspark.sql import functions as F

        return parsed.where(F.col("reason").isNull()).select(
            "event_id",
            "event_type",
            "time",
            "seq",
            "raw",
            *[F.col(key_column(i)).alias(f"k_{k}") for i, k in enumerate(self.rules.key_fields)],
        )

    def heartbeats(self, paths: Sequence[str]) -> tuple[list[int], list[Any]]:
        """(event times of the marker files, rejected rows for the unreadable ones). O(files)."""
        times, bad = [], []
        for path in paths:
            with open(path, "rb") as fh:
                text = fh.read(4096).decode("utf-8", errors="replace")
            value = text.strip()
            with contextlib.suppress(ValueError):
                obj = json.loads(value)
                if isinstance(obj, dict):
                    value = str(obj.get("time", obj.get(self.rules.input.time, "")))
                elif isinstance(obj, int):
                    value = str(obj)
            ms = parse_time_text(value)
            if ms is None or ms < 0:
                bad.append((None, "bad heartbeat: expected an event time", text[:1000]))
            else:
                times.append(ms)
        return times, bad


def _file_reject(spark: SparkSession, path: str, reason: str) -> DataFrame:
    return spark.createDataFrame([(None, reason, os.path.basename(path))], REJECTED_SCHEMA)


def parse_time_text(text: str) -> int | None:
    """A marker's event time: epoch ms or ISO-8601 with an offset; None if neither. O(1)."""
    text = text.strip()
    if not text:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return int(when.timestamp() * 1000)


def _first_line(path: str) -> str | None:
    with open(path, "rb") as fh:
        line = fh.readline()
    if not line:
        return None
    return line.decode("utf-8", errors="replace").rstrip("\r\n")
