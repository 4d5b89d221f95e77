"""Deduplication by event id: one window over the copies of each id, shared by both jobs.

The batch job and the stream keep, of the copies of one event id, the one
that sorts first (the stream first prefers a copy it has already applied),
count copies with the kept one's content as duplicates, and reject the others
as conflicts. Both rank the copies with :func:`rank_copies`.

Why the window is built the way it is (measured with
``benchmarks/profile_pipeline.py`` at 1e6 orders, JFR on the JVM):

* **A hash first.** A window sorts its rows by its partition columns, then
  its order columns. Spark compares rows by an 8-byte prefix of the first
  sort column before it compares whole rows; event ids share their leading
  bytes (``e00000…``) and a reason column is null on most rows, so every
  comparison fell through to the whole row and the window's sort was a fifth
  of the job's JVM samples. Partitioning by ``xxhash64`` of the columns
  first gives a prefix that differs between nearly any two ids; rows of one
  id still meet in one window.
* **Content compared column by column**, null-safe, instead of as one struct:
  ``first(struct)`` builds a generic row per input row, which the
  comparison then walks field by field through interpreted code.
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

    window = Window.partitionBy(F.xxhash64(*by), *by).orderBy(*order)
    kept = [F.first(name).over(window).alias(f"_kept_{i}") for i, name in enumerate(content)]
    ranked = frame.select("*", F.row_number().over(window).alias("_rn"), *kept)
    same = F.lit(True)
    for i, name in enumerate(content):
        same = same & F.col(name).eqNullSafe(F.col(f"_kept_{i}"))
    return ranked.select(*[F.col(f"`{c}`") for c in frame.columns], "_rn", same.alias("_same"))
