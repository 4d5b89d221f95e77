"""A micro-batch's record counts, from Spark's aggregate or from its records held in the
driver as Arrow: the same counts either way."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.rules import parse_rules
from tickwheel.pipeline.spark.classify import (
    C_CONFLICT,
    C_DUPLICATE,
    C_EVENT,
    C_IGNORED,
    C_LATE,
    C_REJECTED,
)
from tickwheel.pipeline.spark.step import DelayedOperations, StepOptions
from tickwheel.pipeline.spark.watermark import RecordCounts

CLASSES = [C_EVENT, C_IGNORED, C_DUPLICATE, C_CONFLICT, C_LATE, C_REJECTED]

rows = st.lists(
    st.fixed_dictionaries({
        "c": st.sampled_from(CLASSES),
        "old": st.booleans(),
        "reason": st.one_of(st.none(), st.sampled_from(["conflict", "not json", "no key"])),
        "time": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    }),
    max_size=60,
)  # fmt: skip


def _grouped(records: list[dict[str, Any]]) -> list[dict[str, object]]:
    """The aggregate's rows, as :meth:`RecordCounts.collect` groups them, in Python."""
    groups: dict[tuple[Any, ...], list[int | None]] = {}
    sizes: Counter[tuple[Any, ...]] = Counter()
    for row in records:
        c = row["c"]
        key = (c, row["old"], row["reason"] if c in (C_CONFLICT, C_REJECTED) else None)
        sizes[key] += 1
        groups.setdefault(key, []).append(row["time"] if c <= C_IGNORED else None)
    out: list[dict[str, object]] = []
    for (c, old, r), times in groups.items():
        seen = [t for t in times if t is not None]
        first, last = (min(seen), max(seen)) if seen else (None, None)
        out.append({"c": c, "old": old, "r": r, "n": sizes[(c, old, r)], "first": first,
                    "last": last})  # fmt: skip
    return out


@settings(max_examples=200, deadline=None)
@given(rows)
def test_counting_the_records_in_arrow_gives_the_aggregates_counts(
    records: list[dict[str, Any]],
) -> None:
    schema = pa.schema([("c", pa.int32()), ("old", pa.bool_()), ("reason", pa.string()),
                        ("time", pa.int64()), ("event_id", pa.string())])  # fmt: skip
    table = pa.Table.from_pylist([{**r, "event_id": "e"} for r in records], schema=schema)
    assert RecordCounts.of_table(table) == RecordCounts.from_rows(_grouped(records))


@pytest.mark.spark
def test_a_micro_batchs_counts_are_the_same_from_spark_and_from_arrow(spark: Any) -> None:
    """Every class of record, carried events among them: the aggregate over the
    classified frame and the count of its rows collected as Arrow agree."""
    rules = parse_rules({"rules": {"r": {"open": ["a"], "complete": ["b"], "timeout": 10}},
                         "input": {"allowed_lateness": 5}})  # fmt: skip
    lines = [
        '{"event_id":"1","key":"k","type":"a","time":100}',
        '{"event_id":"1","key":"k","type":"a","time":100}',  # a duplicate
        '{"event_id":"1","key":"k","type":"b","time":100}',  # a conflict
        '{"event_id":"2","key":"k","type":"zz","time":120}',  # a type no rule uses
        '{"event_id":"3","key":"k","type":"b","time":10}',  # late
        "not json",
        '{"event_id":"4","type":"a","time":130}',  # no key
    ]
    frame = spark.createDataFrame([(v,) for v in lines], "value string")
    with DelayedOperations(frame, rules, StepOptions(partitions=2, now_ms=0)) as step:
        classified = step.classified()
        counts = RecordCounts.collect(classified)
        assert RecordCounts.of_table(classified.toArrow()) == counts
    assert (counts.kept, counts.ignored, counts.duplicates) == (2, 1, 1)
    assert counts.rejected_total == 3 and counts.max_time == 120
