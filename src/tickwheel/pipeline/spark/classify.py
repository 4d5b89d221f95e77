"""Stage 2: classify and deduplicate: each record and carried event gets its class.

The new records and the events carried from earlier micro-batches go through
one window by event id (:func:`rank_copies`). Of the copies of one id the one
that sorts first is kept (a copy already applied first, then the smallest
(time, sequence, raw text)); copies with the kept one's content are
duplicates, and the others are rejected as conflicts. Rejected records, and
valid records older than the previous watermark (late), fall in windows of
their own (the window is partitioned by reason and lateness too), so every
record is read and parsed once and classified in one pass (:func:`classify`).

The window sorts every record, raw text included, by its group and its
order. Sorting by a 64-bit hash of the group first, to give Spark's sort a
prefix that tells ids apart, measured no faster (``docs/benchmarks.md``), so
the group is sorted as it is; the content is compared column by column, nulls
equal to nulls, as a struct's equality.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .frames import parameter
from .records import key_column

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "C_CONFLICT",
    "C_DUPLICATE",
    "C_EVENT",
    "C_IGNORED",
    "C_LATE",
    "C_REJECTED",
    "EVENT_STATE_COLUMNS",
    "classify",
    "rank_copies",
]

# A record's class (column ``c`` of the classified records).
C_EVENT = 0  # kept event of a type some rule uses: its rules' events
C_IGNORED = 1  # kept event of a type no rule uses: counted, its time raises the watermark
C_DUPLICATE = 2  # a copy with the kept record's content: counted only
C_CONFLICT = 3  # a copy with other content: rejected, reason "conflict"
C_REJECTED = 4  # invalid record: rejected with its reason
C_LATE = 5  # valid, older than the previous watermark: the stream's late/

#: The carried events' columns before the key columns (``k_<field>`` in the state files).
EVENT_STATE_COLUMNS = ("event_id", "event_type", "time", "seq", "raw")


def rank_copies(
    frame: DataFrame,
    by: Sequence[str],
    order: Sequence[str | Column],
    content: Sequence[str],
) -> DataFrame:
    """``frame`` with ``_rn`` (1: the kept copy of its ``by`` group) and ``_same``.

    ``order`` sorts the copies of one group (the first is kept); ``_same`` is
    true where the row's ``content`` columns equal the kept copy's, nulls
    equal to nulls. Lazy; one shuffle by ``by`` and a sort within it.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy(*by).orderBy(*order)
    kept = [F.first(name).over(window).alias(f"_kept_{i}") for i, name in enumerate(content)]
    ranked = frame.select("*", F.row_number().over(window).alias("_rn"), *kept)
    same = F.lit(True)
    for i, name in enumerate(content):
        same = same & F.col(name).eqNullSafe(F.col(f"_kept_{i}"))
    return ranked.select(*[F.col(f"`{c}`") for c in frame.columns], "_rn", same.alias("_same"))


def _class(rules_relevant: Column) -> Column:
    from pyspark.sql import functions as F

    return (
        F.when(F.col("reason").isNotNull(), F.lit(C_REJECTED))
        .when(F.col("late"), F.lit(C_LATE))
        .when(
            F.col("_rn") == 1,
            F.when(rules_relevant, F.lit(C_EVENT)).otherwise(F.lit(C_IGNORED)),
        )
        .when(F.col("_same"), F.lit(C_DUPLICATE))
        .otherwise(F.lit(C_CONFLICT))
        .cast("int")
    )


def classify(
    parsed: DataFrame,
    key_count: int,
    partitions: int,
    carried: DataFrame | None = None,
    keep_raw: bool = False,
) -> DataFrame:
    """The records of ``parsed`` and the ``carried`` events, classified. Lazy.

    ``parsed`` comes from :func:`.records.parse_records` with the run
    parameter ``w_prev`` (the previous watermark, null for none) among its
    columns; ``carried`` has the columns of ``parsed`` (a carried event is
    valid and relevant as its type says). Columns of the result: ``c`` (the
    class, ``C_*``), ``old`` (a carried event), ``applied`` (carried and at or
    below the previous watermark), ``reason`` (``conflict`` for conflicts),
    ``raw`` (kept for rejected and late records, and for kept events when
    ``keep_raw``: the stream carries it for the next batch's ranking),
    ``event_id``, ``event_type``, ``time``, ``seq`` and the key columns.
    One shuffle into ``partitions`` partitions by (reason, late, event id),
    then a sort within them.
    """
    from pyspark.sql import functions as F

    keys = [key_column(i) for i in range(key_count)]
    valid = F.col("reason").isNull()
    new = parsed.select(
        *parsed.columns,
        (valid & F.coalesce(F.col("time") < parameter("w_prev"), F.lit(False))).alias("late"),
        F.lit(False).alias("old"),
        F.lit(False).alias("applied"),
    )
    if carried is not None:
        old = carried.select(
            *parsed.columns,
            F.lit(False).alias("late"),
            F.lit(True).alias("old"),
            F.coalesce(F.col("time") <= parameter("w_prev"), F.lit(False)).alias("applied"),
        )
        new = old.unionByName(new)
    group = ["reason", "late", "event_id"]
    ranked = rank_copies(
        new.repartition(partitions, *group),
        by=group,
        order=[F.col("applied").desc(), "time", "seq", "raw"],
        content=["event_type", "time", "seq", *keys],
    )
    cls = _class(F.col("relevant"))
    raw_kept = cls >= C_CONFLICT
    if keep_raw:
        raw_kept = raw_kept | (cls <= C_IGNORED)
    return ranked.select(
        cls.alias("c"),
        "old",
        "applied",
        F.when(cls == C_CONFLICT, F.lit("conflict")).otherwise(F.col("reason")).alias("reason"),
        F.when(raw_kept, F.col("raw")).alias("raw"),
        "event_id",
        "event_type",
        "time",
        "seq",
        *keys,
    )
