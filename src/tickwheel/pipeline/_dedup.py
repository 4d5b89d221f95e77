"""Deduplication by event id: one window over the copies of each id, shared by both jobs.

The batch job and the stream keep, of the copies of one event id, the one
that sorts first (the stream first prefers a copy it has already applied),
count copies with the kept one's content as duplicates, and reject the others
as conflicts. Both rank the copies with :func:`rank_copies`.

The window sorts every record, raw text included, by its group and its
order; sorting (this window's and the key partitions') and the window are
about a fifth of the batch job's JVM samples at 1e6 orders
(``benchmarks/profile_pipeline.py --jfr``; see ``docs/benchmarks.md``). A
variant that sorted by a 64-bit hash of the group first, to give Spark's
sort a prefix that tells ids apart, and compared the content column by
column, measured no faster than sorting by the group and comparing one
struct (6.4–6.7 s against 6.5–6.6 s, alternating in one process, ``noop``
sink, 1e6 orders, 2026-11-25). So the group is sorted as it is; the content
is compared column by column, nulls equal to nulls, as a struct's equality.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["rank_copies"]


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
