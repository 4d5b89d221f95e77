"""Stage 6: outputs and counts: the step's tables, its next state, and the partitions' counters.

The partitions' rows (:data:`.partition.OUT_COLUMNS`) give ``outcomes``,
``unmatched``, ``buffered`` and the next state's operations; the classified
records give ``rejected``, ``late`` and the next state's events. None of these
runs Python. :class:`PartitionStats` sums the partitions' ``stats`` rows and
merges their sorted latencies into exact percentiles.
"""

from __future__ import annotations

import heapq
import json
import math
import sys
from array import array
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from .classify import C_CONFLICT, C_IGNORED, C_LATE, C_REJECTED
from .frames import parameter_name, sql_in, sql_name, sql_string
from .records import key_column, raw_text_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "BUFFERED_COLUMNS",
    "LATE_REASON",
    "OPS_COLUMNS",
    "OUTCOME_COLUMNS",
    "REJECTED_COLUMNS",
    "UNMATCHED_COLUMNS",
    "PartitionStats",
    "buffered_table",
    "exact_percentile",
    "late_table",
    "next_events",
    "next_ops",
    "ops_changes",
    "ops_rows",
    "outcome_table",
    "read_latencies",
    "rejected_table",
    "split_ops",
    "unmatched_table",
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


def _kind(rows: DataFrame, *kinds: str) -> DataFrame:
    return rows.where(sql_in("kind", kinds))


# The tables' columns are SQL text: one call into the JVM each, where a
# ``Column`` expression takes one per operator (a micro-batch plans them anew).


def outcome_table(rows: DataFrame, with_pending: bool) -> DataFrame:
    """``outcomes``: final outcomes and, ``with_pending``, one ``pending`` row per pending
    operation (what a batch run writes; the stream carries them instead). Lazy."""
    chosen = _kind(rows, "outcome", "pending") if with_pending else _kind(rows, "outcome")
    return chosen.selectExpr(
        "rule", "key", "id AS op_id", "`time` AS opened_at", "deadline",
        "coalesce(outcome, 'pending') AS outcome", "resolved_at", "latency_ms",
        "resolve_event_id",
    )  # fmt: skip


def unmatched_table(rows: DataFrame) -> DataFrame:
    """``unmatched``: complete and cancel events that found no operation, and why. Lazy."""
    return _kind(rows, "unmatched").selectExpr(
        "rule", "key", "id AS event_id", "event_type", "`time` AS event_time", "reason"
    )


def buffered_table(rows: DataFrame) -> DataFrame:
    """``buffered``: the events above the watermark, one row per rule, not applied. Lazy."""
    return _kind(rows, "buffered").selectExpr(
        "rule", "key", "id AS event_id", "event_type", "`time` AS event_time", "seq"
    )


def _with_raw_text(frame: DataFrame, *columns: str) -> DataFrame:
    """``frame``'s ``columns`` (SQL), then ``raw`` as valid UTF-8 and ``raw_bytes`` beside it."""
    text, exact = raw_text_columns("raw")
    return frame.selectExpr(*columns, f"{text} AS raw", f"{exact} AS raw_bytes")


def rejected_table(classified: DataFrame) -> DataFrame:
    """``rejected``: invalid records and conflicting copies, with their reason. Lazy."""
    rejected = classified.where(sql_in("c", (C_CONFLICT, C_REJECTED)))
    return _with_raw_text(rejected, "event_id", "reason")


def late_table(classified: DataFrame, rules: Rules) -> DataFrame:
    """``late`` (the stream's): valid records below the previous watermark ``w_prev``
    (a run parameter among the columns of ``classified``), with that watermark. Lazy."""
    late = classified.where(f"c = {C_LATE}")
    return _with_raw_text(
        late,
        "event_id",
        "event_type",
        "`time` AS event_time",
        *[f"{key_column(i)} AS {sql_name(name)}" for i, name in enumerate(rules.key_fields)],
        f"{parameter_name('w_prev')} AS watermark",
        f"{sql_string(LATE_REASON)} AS reason",
    )


def next_events(classified: DataFrame, rules: Rules, watermark: str | None) -> DataFrame:
    """The events the stream carries: kept ones at or above the new ``watermark``
    (SQL text: a column or a literal; None: all), with their raw text, keys as
    ``k_<field>``. Lazy."""
    kept = classified.where(f"c <= {C_IGNORED}")
    if watermark is not None:
        kept = kept.where(f"`time` >= {watermark}")
    return kept.selectExpr(
        "event_id", "event_type", "`time`", "seq", "raw",
        *[f"{key_column(i)} AS {sql_name(f'k_{name}')}" for i, name in enumerate(rules.key_fields)],
    )  # fmt: skip


def ops_rows(rows: DataFrame) -> DataFrame:
    """The carried operations before and after the partitions ran, in the columns of
    :data:`OPS_COLUMNS` and ``change``: ``kept`` (carried, passed through
    ``unchanged``), ``added`` (made by the processor) or ``removed`` (carried, taken
    in by the processor: its ``replaced`` rows). The next state is the rows not
    removed (:func:`next_ops`); its changes since the state carried in are the rows
    added and the rows removed (:func:`ops_changes`, :func:`split_ops`). Lazy."""
    return _kind(rows, "pending", "expired", "replaced").selectExpr(
        "CASE WHEN kind = 'replaced' THEN state_kind ELSE kind END AS kind",
        "rule", "key", "id AS event_id", "`time`", "deadline",
        "CASE WHEN kind = 'replaced' THEN 'removed' "
        "WHEN unchanged THEN 'kept' ELSE 'added' END AS change",
    )  # fmt: skip


def next_ops(rows: DataFrame) -> DataFrame:
    """The operations the stream carries: pending ones and expiry markers. Lazy."""
    return ops_rows(rows).where("change <> 'removed'").drop("change")


def ops_changes(rows: DataFrame) -> dict[str, DataFrame]:
    """The carried operations' changes (:func:`ops_rows`): ``ops.added`` and
    ``ops.removed``. Filters of the partitions' rows, with no join against the
    state before. Lazy."""
    frame = ops_rows(rows)
    return {
        f"ops.{change}": frame.where(f"change = '{change}'").drop("change")
        for change in ("added", "removed")
    }


def split_ops(table: Any) -> dict[str, Any]:
    """:func:`ops_rows` collected as Arrow, split as :func:`next_ops` and
    :func:`ops_changes` split them: ``ops``, ``ops.added``, ``ops.removed``. O(rows)."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    change = table["change"]
    rows = table.drop_columns(["change"])
    return {
        "ops": rows.filter(pc.not_equal(change, "removed")),
        "ops.added": rows.filter(pc.equal(change, "added")),
        "ops.removed": rows.filter(pc.equal(change, "removed")),
    }


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
            bytes(row["stats"]) for row in _kind(rows, "stats").select("stats").collect()
        )

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
