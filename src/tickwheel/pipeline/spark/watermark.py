"""Stage 3: count the classified records, and from their largest event time the watermark.

One aggregate over the classified records (:meth:`RecordCounts.collect`, the
first action on them) gives every count a run reports and the span of the new
kept events' times; :func:`advance_watermark` then gives the watermark W
before any operation runs: the largest event time seen (carried, new, or a
heartbeat's) minus the allowed lateness, never below the previous watermark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .classify import C_CONFLICT, C_DUPLICATE, C_EVENT, C_IGNORED, C_LATE, C_REJECTED
from .frames import sql_in

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

__all__ = ["RecordCounts", "advance_watermark"]


@dataclass(frozen=True)
class RecordCounts:
    """What the new records held, by class, and the span of their kept events' times."""

    kept: int  # new kept events some rule uses
    ignored: int  # new kept events of a type no rule uses
    duplicates: int  # copies with the kept one's content (a displaced carried event too)
    late: int  # valid, older than the previous watermark
    rejected: dict[str, int]  # reason -> records (conflicts included)
    min_time: int | None  # the smallest new kept event time
    max_time: int | None  # the largest new kept event time: the watermark's base

    @property
    def events(self) -> int:
        """New kept events, of any type. O(1)."""
        return self.kept + self.ignored

    @property
    def rejected_total(self) -> int:
        """Rejected records, every reason. O(reasons)."""
        return sum(self.rejected.values())

    @property
    def records(self) -> int:
        """Every new record. O(reasons)."""
        return self.events + self.duplicates + self.late + self.rejected_total

    @property
    def arrived(self) -> int:
        """New valid records: kept, late, and copies of either kind. O(1)."""
        return self.events + self.duplicates + self.late + self.rejected.get("conflict", 0)

    @classmethod
    def collect(cls, classified: DataFrame) -> RecordCounts:
        """One aggregate over the classified records (their first action). O(records)."""
        from pyspark.sql import functions as F

        rejected = sql_in("c", (C_CONFLICT, C_REJECTED))
        rows = (
            classified.selectExpr(
                "c", "old", f"CASE WHEN {rejected} THEN reason END AS r",
                f"CASE WHEN c <= {C_IGNORED} THEN `time` END AS kept_time",
            )
            .groupBy("c", "old", "r")
            .agg(*[F.expr(f"{agg} AS {name}") for name, agg in (
                ("n", "count(1)"), ("first", "min(kept_time)"), ("last", "max(kept_time)")
            )])
            .collect()
        )  # fmt: skip
        return cls.from_rows(row.asDict() for row in rows)

    @classmethod
    def of_table(cls, classified: pa.Table) -> RecordCounts:
        """The same counts from the classified records held in the driver, as
        :meth:`collect` gives them over the frame. O(rows)."""
        import pyarrow as pa
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        c = classified["c"]
        rejected = pc.is_in(c, value_set=pa.array([C_CONFLICT, C_REJECTED], c.type))
        kept = pc.less_equal(c, pa.scalar(C_IGNORED, c.type))
        reason, times = classified["reason"], classified["time"]
        grouped = (
            pa.table({
                "c": c,
                "old": classified["old"],
                "r": pc.if_else(rejected, reason, pa.scalar(None, reason.type)),
                "kept_time": pc.if_else(kept, times, pa.scalar(None, times.type)),
            })
            .group_by(["c", "old", "r"])
            .aggregate([([], "count_all"), ("kept_time", "min"), ("kept_time", "max")])
        )  # fmt: skip
        names = {"count_all": "n", "kept_time_min": "first", "kept_time_max": "last"}
        return cls.from_rows(
            {names.get(name, name): value for name, value in row.items()}
            for row in grouped.to_pylist()
        )

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, object]]) -> RecordCounts:
        """The counts from the aggregate's rows (``c``, ``old``, ``r``, ``n``, ``first``,
        ``last``): carried events count only where a new copy displaced them. O(rows)."""
        by_class: Counter[int] = Counter()
        rejected: Counter[str] = Counter()
        firsts: list[int] = []
        lasts: list[int] = []
        for row in rows:
            c, n = row["c"], row["n"]
            assert isinstance(c, int) and isinstance(n, int)
            if row["old"] and c <= C_IGNORED:
                continue  # a carried event kept again: not this run's
            by_class[c] += n
            if c in (C_CONFLICT, C_REJECTED):
                rejected[str(row["r"])] += n
            first, last = row["first"], row["last"]
            if isinstance(first, int) and isinstance(last, int):
                firsts.append(first)
                lasts.append(last)
        return cls(
            kept=by_class[C_EVENT],
            ignored=by_class[C_IGNORED],
            duplicates=by_class[C_DUPLICATE],
            late=by_class[C_LATE],
            rejected=dict(sorted(rejected.items())),
            min_time=min(firsts) if firsts else None,
            max_time=max(lasts) if lasts else None,
        )


def advance_watermark(
    previous: int | None, max_times: Iterable[int | None], allowed_lateness_ms: int
) -> tuple[int | None, int | None]:
    """(the new watermark, the largest event time seen). O(times).

    The watermark is the largest of ``max_times`` (None ones left out) minus
    the allowed lateness, and never below ``previous``; with no time at all,
    it stays ``previous``.
    """
    seen = [t for t in max_times if t is not None]
    if not seen:
        return previous, None
    largest = max(seen)
    watermark = largest - allowed_lateness_ms
    return (watermark if previous is None else max(previous, watermark)), largest
