"""Files → a records frame: what the command line's two drivers read their input with.

:func:`read_files` gives the records frame of a list of files, in a form of
:mod:`.records`, and the files it refused before reading them:

* JSON Lines (and Maxwell's binlog JSON) are read with Spark's ``text``
  source: a ``value`` column, one line per row (form ``"json"``);
* CSV files (with a header) are read with Spark's CSV reader, every value as
  text, one read per distinct header; a file whose header has an empty or a
  repeated name is refused whole;
* Parquet files are read together (their schemas merged); if that fails, one
  by one, so an unreadable file is refused and the others are read (form
  ``"columns"``).

A file listed then removed before it is read is refused too, and so is a
marker file (``*.heartbeat``) whose event time cannot be read
(:func:`read_heartbeats`). Refused files become ``rejected`` rows that name
them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..rules import Rules
from ..storage import LocalStorage, Storage
from .frames import union_all
from .records import MISSING_FILE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["HEARTBEAT_SUFFIX", "parse_time_text", "read_files", "read_heartbeats"]

HEARTBEAT_SUFFIX = ".heartbeat"

#: (raw, reason) of a file refused before its records were read.
Refused = tuple[str, str]


def read_files(
    spark: SparkSession,
    files: Sequence[str],
    input_format: str,
    storage: Storage | None = None,
) -> tuple[DataFrame | None, list[Refused]]:
    """(the records of ``files``, or None when no file gave any; the refused files).

    ``input_format`` is the rules' or the command line's: ``json`` (or
    ``jsonl``), ``maxwell``, ``csv`` or ``parquet``. Lazy: Spark reads the
    files when the records are first used; CSV headers are read here, through
    ``storage`` (default: local paths; :func:`~..storage.storage_for` for URIs).
    """
    storage = storage if storage is not None else LocalStorage()
    present = [f for f in files if storage.exists(f)]
    refused: list[Refused] = [
        (posixpath.basename(f), MISSING_FILE) for f in files if f not in set(present)
    ]
    if not present:
        return None, refused
    if input_format in ("json", "jsonl", "maxwell"):
        return spark.read.text(present), refused
    if input_format == "csv":
        return _csv_files(spark, present, refused, storage), refused
    if input_format == "parquet":
        return _parquet_files(spark, present, refused, storage), refused
    raise ValueError(f"input format must be json, maxwell, csv or parquet, got {input_format!r}")


def _csv_files(
    spark: SparkSession, files: Sequence[str], refused: list[Refused], storage: Storage
) -> DataFrame | None:
    """One read per distinct header, every value as text; bad headers refused."""
    by_header: dict[str, list[str]] = {}
    for path in files:
        header = _first_line(storage, path)
        if header is None:
            continue  # a zero-byte file: no records
        names = [h.strip().strip('"') for h in header.split(",")]
        if len(set(names)) != len(names) or not all(names):
            refused.append((posixpath.basename(path), f"bad CSV header: {header[:200]!r}"))
            continue
        by_header.setdefault(header, []).append(path)
    reader = spark.read.option("header", True).option("inferSchema", False)
    return union_all([reader.csv(paths) for paths in by_header.values()], allow_missing=True)


def _parquet_files(
    spark: SparkSession, files: Sequence[str], refused: list[Refused], storage: Storage
) -> DataFrame | None:
    """All files in one read (schemas merged); if that fails, file by file."""
    files = [f for f in files if storage.size(f) > 0]  # a zero-byte file: no records
    if not files:
        return None
    with contextlib.suppress(Exception):  # one bad file: find it below
        return spark.read.option("mergeSchema", True).parquet(*files)
    frames = []
    for path in files:
        try:
            frame = spark.read.parquet(path)
            frame.columns  # noqa: B018 - the schema is read here: a bad file fails now
        except Exception as exc:  # garbage or truncated: refuse the file, keep going
            text = str(exc).strip()
            first = text.splitlines()[0][:200] if text else type(exc).__name__
            refused.append((posixpath.basename(path), f"unreadable parquet file: {first}"))
            continue
        frames.append(frame)
    return union_all(frames, allow_missing=True)


def read_heartbeats(
    paths: Sequence[str], rules: Rules, storage: Storage | None = None
) -> tuple[list[int], list[Refused]]:
    """(event times of the marker files, the unreadable ones refused). O(files).

    A marker holds an event time: epoch ms or ISO-8601, alone or as
    ``{"time": ...}`` (or the rules' time field). It is read through
    ``storage`` (default: local paths).
    """
    storage = storage if storage is not None else LocalStorage()
    times, bad = [], []
    for path in paths:
        text = storage.read_bytes(path, 4096).decode("utf-8", errors="replace")
        value = text.strip()
        with contextlib.suppress(ValueError):
            obj = json.loads(value)
            if isinstance(obj, dict):
                value = str(obj.get("time", obj.get(rules.input.time, "")))
            elif isinstance(obj, int):
                value = str(obj)
        ms = parse_time_text(value)
        if ms is None or ms < 0:
            bad.append((text[:1000], "bad heartbeat: expected an event time"))
        else:
            times.append(ms)
    return times, bad


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


#: The longest CSV header read (a header line is read whole up to this).
_HEADER_BYTES = 1 << 20


def _first_line(storage: Storage, path: str) -> str | None:
    head = storage.read_bytes(path, _HEADER_BYTES)
    if not head:
        return None
    line = head.split(b"\n", 1)[0]
    return line.decode("utf-8", errors="replace").rstrip("\r\n")
