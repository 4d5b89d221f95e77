"""Where a run's purgatory runs, and how wide: :class:`Placement`, from the run's sizes.

The batch driver gives the purgatory its key-hash partitions and lets Spark
write the tables. A stream's micro-batch takes a partition per
:data:`MICRO_BATCH_ROWS_PER_PARTITION` rows instead: one that fits a partition
has its tables written by the driver, and one within :data:`DRIVER_ROWS` is held
in the driver whole.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DRIVER_ROWS", "MICRO_BATCH_ROWS_PER_PARTITION", "Placement"]

#: The stream's purgatory takes one partition per this many rows (the new kept
#: events and the carried state), up to ``partitions``. Each partition costs a
#: task in the purgatory and in each of its writes, about as much as the
#: purgatory spends on this many rows on one core: a small micro-batch gains
#: nothing from a second partition.
MICRO_BATCH_ROWS_PER_PARTITION = 50_000

#: A micro-batch of one partition with at most this many records and this many
#: rows in its purgatory is held in the driver (:attr:`Placement.runs_in_driver`).
#: Its queries then need no shuffle and no cache, but Spark evaluates them row by
#: row as it plans them, with no generated code: below some 10,000 rows that
#: costs less than the jobs it saves, and above it more (``docs/benchmarks.md``).
DRIVER_ROWS = 10_000


@dataclass(frozen=True)
class Placement:
    """Where a run's purgatory runs, and how wide, from its sizes (:meth:`of`).

    ``driver_writes``: the run fits one partition, so its tables are small
    enough for the driver to collect and write (:func:`.frames.write_parquet`).
    ``runs_in_driver``: it is written by the driver and has at most
    :data:`DRIVER_ROWS` records and purgatory rows, so
    it is held in the driver whole: its classified records as a local
    relation (:func:`.frames.driver_copy`), its one partition run there
    (:func:`.partition.run_partition_on_arrow`: no shuffle, no Python
    worker), its tables and next state read from those rows with no shuffle
    and no scan of a cache.
    """

    partitions: int
    driver_writes: bool = False
    runs_in_driver: bool = False

    @classmethod
    def of(cls, partitions: int, per: int | None, records: int, rows: int | None) -> Placement:
        """The placement of a run of ``records`` records and ``rows`` purgatory rows
        (the new kept events and the carried state's rows; None: unknown). O(1).

        With ``per`` (:attr:`.step.StepOptions.rows_per_partition`) None, or the rows
        unknown: ``partitions``, written by Spark (the batch driver).
        Else one partition per ``per`` rows, at least one and at most
        ``partitions``; written by the driver when records and rows are at most ``per``.
        """
        if per is None or rows is None:
            return cls(partitions)
        largest = max(records, rows)
        return cls(
            partitions=max(1, min(partitions, -(-rows // per))),
            driver_writes=largest <= per,
            runs_in_driver=largest <= cls.driver_rows(per),
        )

    @staticmethod
    def driver_rows(per: int) -> int:
        """The most records, and the most purgatory rows, of a run held in the driver
        when a partition takes ``per`` rows: :data:`DRIVER_ROWS`, or ``per`` if fewer. O(1)."""
        return min(per, DRIVER_ROWS)
