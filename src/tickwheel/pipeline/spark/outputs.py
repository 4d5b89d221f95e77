"""Stage 6: outputs and counts: the step's tables, its next state, and the partitions' counters.

Every table is a choice of rows and columns, nothing computed: a
:class:`Shape` (which rows by the values of one column, which columns under
which names), read off the partitions' rows (:data:`.partition.OUT_COLUMNS`:
``outcomes``, ``unmatched``, ``buffered``, and the carried operations with
their change, :data:`OPS_ROWS`) or off the classified records (``rejected``,
``late`` and the next state's events). A shape is taken from Arrow tables in
the driver (:meth:`Shape.of_arrow`) or from DataFrames on the executors
(:meth:`Shape.of_frame`), as the placement has it (:mod:`.placement`): the
same rows either way. :class:`PartitionStats` sums the partitions' ``stats``
rows and merges their sorted latencies into exact percentiles.
"""

from __future__ import annotations

import heapq
import json
import math
import sys
from array import array
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from .classify import C_CONFLICT, C_EVENT, C_IGNORED, C_LATE, C_REJECTED
from .frames import parameter_name, sql_in, sql_name, sql_string, with_parameters
from .partition import CHANGE_ADDED, CHANGE_REMOVED
from .records import key_column

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import Column, DataFrame

__all__ = [
    "BUFFERED",
    "BUFFERED_COLUMNS",
    "LATE_REASON",
    "OPS_COLUMNS",
    "OPS_ROWS",
    "OUTCOMES",
    "OUTCOMES_WITH_PENDING",
    "OUTCOME_COLUMNS",
    "REJECTED",
    "REJECTED_COLUMNS",
    "UNMATCHED",
    "UNMATCHED_COLUMNS",
    "PartitionStats",
    "RunValue",
    "Shape",
    "Text",
    "exact_percentile",
    "late_shape",
    "next_events_shape",
    "read_latencies",
    "split_ops",
    "split_ops_frame",
]

OUTCOME_COLUMNS = (
    "rule", "key", "op_id", "opened_at", "deadline", "outcome", "resolved_at", "latency_ms",
    "resolve_event_id",
)  # fmt: skip
UNMATCHED_COLUMNS = ("rule", "key", "event_id", "event_type", "event_time", "reason")
REJECTED_COLUMNS = ("event_id", "reason", "raw", "raw_bytes")
BUFFERED_COLUMNS = ("rule", "key", "event_id", "event_type", "event_time", "seq")
#: The carried operations (``ops`` of the stream's state): pending ones and expiry markers.
OPS_COLUMNS = ("kind", "rule", "key", "event_id", "time", "deadline")
LATE_REASON = "late: event time below the watermark"


@dataclass(frozen=True)
class RunValue:
    """A column of a run's value (a long, or null): ``w_prev``, ``w_new``. In a frame it
    is read as a run parameter (:func:`.frames.run_parameters`), so that the query's
    code does not change with it."""

    name: str


@dataclass(frozen=True)
class Text:
    """A column of one text for every row."""

    value: str


#: Where a column of a :class:`Shape` comes from: a column's name, a run's value, a text.
Source = str | RunValue | Text


@dataclass(frozen=True)
class Shape:
    """An output table: the rows whose ``where`` column is one of ``values`` (and, with
    ``at_least``, whose column is at or above a run's value, when it is not null),
    then ``columns``, (name, :data:`Source`) pairs, in order.

    Taken from Arrow (:meth:`of_arrow`) or from a frame (:meth:`of_frame`), it
    gives the same rows under the same names and types.
    """

    where: str
    values: tuple[str | int, ...]
    columns: tuple[tuple[str, Source], ...]
    at_least: tuple[str, RunValue] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The table's column names, in order. O(columns)."""
        return tuple(name for name, _ in self.columns)

    def _run_values(self) -> list[str]:
        bound = [self.at_least[1].name] if self.at_least is not None else []
        return bound + [s.name for _, s in self.columns if isinstance(s, RunValue)]

    def of_arrow(self, rows: pa.Table, values: Mapping[str, int | None] | None = None) -> pa.Table:
        """The table from ``rows`` held as Arrow, the run's ``values`` by name. O(rows)."""
        import pyarrow as pa
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        given = values or {}
        column = rows[self.where]
        mask = pc.is_in(column, value_set=pa.array(self.values, column.type))
        if self.at_least is not None and given.get(self.at_least[1].name) is not None:
            bound = given[self.at_least[1].name]
            mask = pc.and_(mask, pc.fill_null(pc.greater_equal(rows[self.at_least[0]], bound),
                                              False))  # fmt: skip
        chosen = rows.filter(mask)
        n = chosen.num_rows
        arrays = []
        for _name, source in self.columns:
            if isinstance(source, RunValue):
                arrays.append(pa.array([given.get(source.name)] * n, pa.int64()))
            elif isinstance(source, Text):
                arrays.append(pa.array([source.value] * n, pa.string()))
            else:
                arrays.append(chosen[source])
        return pa.table(arrays, names=list(self.names))

    def of_frame(
        self, rows: DataFrame, parameters: Mapping[str, Column] | None = None
    ) -> DataFrame:
        """The table from the frame ``rows``; ``parameters`` holds the run's values it reads
        (:func:`.frames.run_parameters`). Lazy. SQL text: one call into the JVM a column."""
        needed = self._run_values()
        if needed:
            assert parameters is not None, f"the table reads the run's {needed}"
            rows = with_parameters(rows, {parameter_name(n): parameters[parameter_name(n)]
                                          for n in dict.fromkeys(needed)})  # fmt: skip
        chosen = rows.where(sql_in(sql_name(self.where), self.values))
        if self.at_least is not None:
            bound = sql_name(parameter_name(self.at_least[1].name))
            column = sql_name(self.at_least[0])
            chosen = chosen.where(f"{bound} IS NULL OR {column} >= {bound}")
        return chosen.selectExpr(*[f"{_sql(source)} AS {sql_name(name)}"
                                   for name, source in self.columns])  # fmt: skip


def _sql(source: Source) -> str:
    if isinstance(source, RunValue):
        return sql_name(parameter_name(source.name))
    if isinstance(source, Text):
        return sql_string(source.value)
    return sql_name(source)


def _same(*names: str) -> tuple[tuple[str, Source], ...]:
    return tuple((name, name) for name in names)


#: ``outcomes`` of a stream: final outcomes (completed, expired, cancelled).
OUTCOMES = Shape("kind", ("outcome",), (
    *_same("rule", "key"), ("op_id", "id"), ("opened_at", "time"),
    *_same("deadline", "outcome", "resolved_at", "latency_ms", "resolve_event_id"),
))  # fmt: skip
#: ``outcomes`` of a batch run: final outcomes and one ``pending`` row per pending operation.
OUTCOMES_WITH_PENDING = Shape("kind", ("outcome", "pending"), OUTCOMES.columns)
#: ``unmatched``: complete and cancel events that found no operation, and why.
UNMATCHED = Shape("kind", ("unmatched",), (
    *_same("rule", "key"), ("event_id", "id"), ("event_type", "event_type"),
    ("event_time", "time"), ("reason", "reason"),
))  # fmt: skip
#: ``buffered``: the events above the watermark, one row per rule, not applied.
BUFFERED = Shape("kind", ("buffered",), (
    *_same("rule", "key"), ("event_id", "id"), ("event_type", "event_type"),
    ("event_time", "time"), ("seq", "seq"),
))  # fmt: skip
#: The carried operations before and after the partitions ran, in the columns of
#: :data:`OPS_COLUMNS` and ``change``: ``kept`` (carried, passed through as it came),
#: ``added`` (made by the processor) or ``removed`` (carried, taken in by the
#: processor: its ``replaced`` rows). The next state is the rows not removed; its
#: changes since the state carried in are the rows added and the rows removed
#: (:func:`split_ops`).
OPS_ROWS = Shape("kind", ("pending", "expired", "replaced"), (
    ("kind", "state_kind"), *_same("rule", "key"), ("event_id", "id"),
    *_same("time", "deadline", "change"),
))  # fmt: skip
#: ``rejected``: invalid records and conflicting copies, with their reason (the raw
#: text made valid UTF-8 as it was classified, its exact bytes in ``raw_bytes``).
REJECTED = Shape("c", (C_CONFLICT, C_REJECTED), _same(*REJECTED_COLUMNS))


def late_shape(rules: Rules) -> Shape:
    """``late`` (the stream's): valid records below the previous watermark ``w_prev``,
    with that watermark. O(key fields)."""
    keys = tuple((name, key_column(i)) for i, name in enumerate(rules.key_fields))
    return Shape("c", (C_LATE,), (
        *_same("event_id", "event_type"), ("event_time", "time"), *keys,
        ("watermark", RunValue("w_prev")), ("reason", Text(LATE_REASON)),
        *_same("raw", "raw_bytes"),
    ))  # fmt: skip


def next_events_shape(rules: Rules) -> Shape:
    """The events the stream carries: kept ones at or above the new watermark ``w_new``
    (all of them when it is null), with their raw text, keys as ``k_<field>``.
    O(key fields)."""
    keys = tuple((f"k_{name}", key_column(i)) for i, name in enumerate(rules.key_fields))
    return Shape(
        "c", (C_EVENT, C_IGNORED),
        (*_same("event_id", "event_type", "time", "seq", "raw"), *keys),
        at_least=("time", RunValue("w_new")),
    )  # fmt: skip


def split_ops(table: pa.Table) -> dict[str, pa.Table]:
    """:data:`OPS_ROWS` held as Arrow, split: ``ops`` (the next state's operations, the
    rows not removed), ``ops.added`` and ``ops.removed`` (its changes). O(rows)."""
    import pyarrow.compute as pc

    change = table["change"]
    rows = table.drop_columns(["change"])
    return {
        "ops": rows.filter(pc.not_equal(change, CHANGE_REMOVED)),
        "ops.added": rows.filter(pc.equal(change, CHANGE_ADDED)),
        "ops.removed": rows.filter(pc.equal(change, CHANGE_REMOVED)),
    }


def split_ops_frame(frame: DataFrame) -> dict[str, DataFrame]:
    """:func:`split_ops` over a frame of :data:`OPS_ROWS`. Lazy."""
    rows = {
        "ops": frame.where(f"change <> {sql_string(CHANGE_REMOVED)}"),
        "ops.added": frame.where(f"change = {sql_string(CHANGE_ADDED)}"),
        "ops.removed": frame.where(f"change = {sql_string(CHANGE_REMOVED)}"),
    }
    return {name: rows.drop("change") for name, rows in rows.items()}


def read_latencies(stats: dict[str, Any], blob: bytes) -> dict[str, array[int]]:
    """The sorted latency arrays of one ``stats`` row: outcome -> ``array('q')``. O(n)."""
    out: dict[str, array[int]] = {}
    offset = 0
    for name, count in stats["latencies"]:
        values = array("q", blob[offset : offset + 8 * count])
        if sys.byteorder != "little":  # pragma: no cover - no big-endian machine here
            values.byteswap()
        out[name] = values
        offset += 8 * count
    return out


def exact_percentile(ordered: Sequence[int], fraction: float) -> float | None:
    """The exact ``fraction`` percentile of ``ordered`` (sorted), as Spark's ``percentile``.

    Linear interpolation between the two closest ranks: at position
    ``(n - 1) * fraction``, ``values[lo] + (pos - lo) * (values[hi] - values[lo])``,
    in the same floating-point steps as Spark 4, so the figures are the ones
    its exact ``percentile`` aggregate gives (a test compares them). None for
    no values. O(1).
    """
    if not ordered:
        return None
    position = (len(ordered) - 1) * fraction
    lower, higher = math.floor(position), math.ceil(position)
    low, high = ordered[lower], ordered[higher]
    if higher == lower or low == high:
        return float(low)
    return float(low) + (position - lower) * (float(high) - float(low))


@dataclass(frozen=True)
class PartitionStats:
    """The partitions' own counters (their ``stats`` rows), summed."""

    partitions: int  # partitions that had rows
    events: int  # rule events
    applied: int  # of which at or below the watermark, run through the processor
    buffered: int  # of which above it
    outcomes: dict[str, int]  # pending included
    unmatched: dict[str, int]
    latency: dict[str, Any]  # outcome -> exact p50, p90, p99 of latency_ms
    loop_s: float
    loop_cpu: float
    udf_s: float

    @classmethod
    def collect(cls, rows: DataFrame) -> PartitionStats:
        """The ``stats`` rows of the partitions, merged. O(operations) on the driver.

        The latency percentiles are exact: each partition sends its latencies
        sorted, and they are merged here, which costs less than Spark's
        ``percentile`` aggregate over the rows.
        """
        return cls.merge(
            bytes(row["stats"]) for row in rows.where("kind = 'stats'").select("stats").collect()
        )

    @classmethod
    def of_table(cls, rows: pa.Table) -> PartitionStats:
        """:meth:`collect` over the partitions' rows held as Arrow in the driver. O(n)."""
        import pyarrow.compute as pc

        return cls.merge(rows.filter(pc.equal(rows["kind"], "stats"))["stats"].to_pylist())

    @classmethod
    def merge(cls, blobs: Any) -> PartitionStats:
        """Sum the counters of ``stats`` blobs (JSON, a newline, the latencies). O(n)."""
        stats, latencies = [], defaultdict(list)
        for blob in blobs:
            head, _, tail = blob.partition(b"\n")
            one = json.loads(head)
            stats.append(one)
            for outcome, values in read_latencies(one, tail).items():
                latencies[outcome].append(values)
        outcomes: Counter[str] = Counter()
        unmatched: Counter[str] = Counter()
        for s in stats:
            outcomes.update(s["outcomes"])
            unmatched.update(s["unmatched"])
        latency = {}
        for outcome, parts in sorted(latencies.items()):
            ordered = list(heapq.merge(*parts))
            p50, p90, p99 = (exact_percentile(ordered, q) for q in (0.5, 0.9, 0.99))
            latency[outcome] = {"p50": p50, "p90": p90, "p99": p99}
        return cls(
            partitions=len(stats),
            events=sum(s["events"] for s in stats),
            applied=sum(s["applied"] for s in stats),
            buffered=sum(s["buffered"] for s in stats),
            outcomes=dict(sorted(outcomes.items())),
            unmatched=dict(sorted(unmatched.items())),
            latency=latency,
            loop_s=sum(s["loop_seconds"] for s in stats),
            loop_cpu=sum(s["loop_cpu_seconds"] for s in stats),
            udf_s=sum(s["udf_seconds"] for s in stats),
        )

    def rate(self) -> float:
        """Events per CPU second of the loop (per core). O(1)."""
        return self.applied / self.loop_cpu if self.loop_cpu else 0.0

    def summary(self) -> dict[str, Any]:
        """The summary's ``loop`` entry. O(1)."""
        return {
            "events": self.events,
            "applied": self.applied,
            "seconds": round(self.loop_s, 3),
            "cpu_seconds": round(self.loop_cpu, 3),
            "events_per_s": round(self.rate(), 1) if self.loop_cpu else None,
            "events_per_wall_s": round(self.applied / self.loop_s, 1) if self.loop_s else None,
            "udf_seconds": round(self.udf_s, 3),
            "note": (
                "per-partition purgatory loop measured inside mapInArrow: events counts the "
                "run's rule events, applied those at or below the watermark, which the loop "
                "ran; events_per_s is per core (applied / CPU seconds of the loop), "
                "events_per_wall_s uses wall time"
            ),
        }
