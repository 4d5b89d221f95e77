"""Where a run's Arrow half runs, and how wide: :class:`Placement`, from the run's sizes.

Spark parses, Arrow decides: once the records are classified (in Catalyst),
the rest of the step is Arrow functions (:mod:`.fanout`, :mod:`.partition`,
:mod:`.outputs`), and the placement says where they run. A micro-batch small
enough runs them in the driver, on the records its one Spark job collected,
with no plan after it; anything larger, and the batch job, runs them on the
executors, the purgatory one ``mapInArrow`` per key-hash partition after a
shuffle. Where the stream's state is held is another question
(:mod:`tickwheel.pipeline.stream.resident`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DRIVER_ROWS", "MICRO_BATCH_ROWS_PER_PARTITION", "Placement"]

#: A stream's micro-batch takes one partition per this many rows (the new kept events
#: and the carried operations its purgatory takes in), up to ``partitions``: one such
#: partition runs in the driver, several on the executors. On the executors each
#: partition costs a task in the purgatory and in each write of its tables, and the
#: run several Spark jobs of its own; in the driver a partition costs only its rows
#: (Arrow, the purgatory, pyarrow's writes), some hundred bytes each of the driver's
#: memory. The figures behind this size: ``docs/benchmarks.md``, "Placement".
MICRO_BATCH_ROWS_PER_PARTITION = 250_000

#: A micro-batch with at most this many records and this many rows in its purgatory
#: runs in the driver (:attr:`Placement.in_driver`): its records are collected by
#: the job that classifies them, and everything after is Arrow in the driver's
#: memory, with no Spark plan; a partition's worth, the executors' unit of work.
DRIVER_ROWS = MICRO_BATCH_ROWS_PER_PARTITION


@dataclass(frozen=True)
class Placement:
    """Where a run's Arrow half runs, and how wide, from its sizes (:meth:`of`).

    ``in_driver``: the run's records were collected to the driver and its
    purgatory's rows are few (:meth:`driver_rows`), so its fan-out, purgatory
    and tables run there on Arrow (:func:`.partition.run_partition`), and its
    tables are written there. Else they run on the executors in ``partitions``
    key-hash partitions (:func:`.partition.run_partitions`), and Spark's writer
    writes the tables.
    """

    partitions: int
    in_driver: bool = False

    @classmethod
    def of(cls, partitions: int, per: int | None, records: int, rows: int | None) -> Placement:
        """The placement of a run of ``records`` records and ``rows`` purgatory rows
        (the new kept events and the carried operations it takes in; None: unknown).
        O(1).

        With ``per`` (:attr:`.step.StepOptions.rows_per_partition`) None, or the rows
        unknown: the executors, ``partitions`` wide (the batch driver). Else one
        partition per ``per`` rows, at least one and at most ``partitions``; in the
        driver when records and rows are at most :meth:`driver_rows`.
        """
        if per is None or rows is None:
            return cls(partitions)
        return cls(
            partitions=max(1, min(partitions, -(-rows // per))),
            in_driver=max(records, rows) <= cls.driver_rows(per),
        )

    @staticmethod
    def driver_rows(per: int) -> int:
        """The most records, and the most purgatory rows, of a run in the driver when a
        partition takes ``per`` rows: :data:`DRIVER_ROWS`, or ``per`` if fewer. O(1)."""
        return min(per, DRIVER_ROWS)
