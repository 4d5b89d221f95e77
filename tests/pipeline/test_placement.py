"""Where a run's Arrow half runs: ``Placement.of``, a pure function of the run's sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tickwheel.pipeline.spark.placement import (
    DRIVER_ROWS,
    MICRO_BATCH_ROWS_PER_PARTITION,
    Placement,
)

PER = MICRO_BATCH_ROWS_PER_PARTITION


@pytest.mark.parametrize(
    ("records", "rows", "expected"),
    [
        (1_000, 5_000, Placement(1, in_driver=True)),
        (DRIVER_ROWS, DRIVER_ROWS, Placement(1, in_driver=True)),
        (DRIVER_ROWS + 1, 5_000, Placement(1, in_driver=False)),
        (1_000, DRIVER_ROWS + 1, Placement(2, in_driver=False)),
        (PER + 1, PER, Placement(1, in_driver=False)),
        (1_000, PER + 1, Placement(2, in_driver=False)),
        (1_000, 10 * PER, Placement(3, in_driver=False)),
    ],
)
def test_a_micro_batch_is_placed_by_its_records_and_rows(
    records: int, rows: int, expected: Placement
) -> None:
    """One partition per PER rows up to 3; in the driver within DRIVER_ROWS of
    records and of rows."""
    assert Placement.of(3, PER, records, rows) == expected


def test_a_smaller_partition_bounds_the_driver_too() -> None:
    """With fewer rows per partition than DRIVER_ROWS, a run in the driver has at most
    that many (a partition's worth)."""
    assert Placement.of(4, 50, 50, 50) == Placement(1, in_driver=True)
    assert Placement.of(4, 50, 51, 10) == Placement(1, in_driver=False)
    assert Placement.of(4, 50, 10, 120) == Placement(3, in_driver=False)


@given(st.integers(1, 64), st.integers(0, 10**7), st.one_of(st.none(), st.integers(0, 10**7)))
def test_the_batch_driver_and_unknown_state_take_every_partition(
    partitions: int, records: int, rows: int | None
) -> None:
    """No rows per partition (the batch driver), or carried rows of unknown number:
    all ``partitions``, on the executors."""
    assert Placement.of(partitions, None, records, rows) == Placement(partitions)
    assert Placement.of(partitions, PER, records, None) == Placement(partitions)


@given(st.integers(1, 64), st.integers(1, 10**6), st.integers(0, 10**7), st.integers(0, 10**7))
def test_placement_invariants(partitions: int, per: int, records: int, rows: int) -> None:
    """Between one and ``partitions`` partitions; a run in the driver has one."""
    placed = Placement.of(partitions, per, records, rows)
    assert 1 <= placed.partitions <= partitions
    assert not placed.in_driver or placed.partitions == 1
    assert placed.in_driver == (max(records, rows) <= min(per, DRIVER_ROWS))
