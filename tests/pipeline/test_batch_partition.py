"""The batch job's exact latency percentiles: computed from the partitions' sorted
latencies, they must be the figures Spark's own exact ``percentile`` gives."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.spark.outputs import exact_percentile, read_latencies

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

QUANTILES = (0.5, 0.9, 0.99)


@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=60), st.floats(0, 1))
def test_exact_percentile_lies_between_its_ranks(values: list[int], fraction: float) -> None:
    ordered = sorted(values)
    got = exact_percentile(ordered, fraction)
    assert got is not None
    position = (len(ordered) - 1) * fraction
    assert ordered[int(position)] <= got <= ordered[min(len(ordered) - 1, int(position) + 1)]


def test_exact_percentile_of_nothing_is_none() -> None:
    assert exact_percentile([], 0.5) is None


def test_read_latencies_splits_the_blob_by_outcome() -> None:
    from array import array

    blob = array("q", [1, 5, 9, -3, 7]).tobytes()
    stats = {"latencies": [["completed", 3], ["expired", 2]]}
    got = read_latencies(stats, blob)
    assert {k: list(v) for k, v in got.items()} == {"completed": [1, 5, 9], "expired": [-3, 7]}


@pytest.mark.spark
def test_exact_percentile_equals_sparks_percentile(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    rnd = random.Random(7)
    cases = [[rnd.randrange(0, 1_800_000) for _ in range(n)] for n in (1, 2, 3, 10, 101, 997)]
    cases.append([5] * 40 + [6] * 3)
    rows = [(i, v) for i, values in enumerate(cases) for v in values]
    frame = spark.createDataFrame(rows, "g int, v long")
    got = frame.groupBy("g").agg(
        F.percentile("v", F.array(*[F.lit(q) for q in QUANTILES])).alias("p")
    )
    by_group = {row["g"]: list(row["p"]) for row in got.collect()}
    for i, values in enumerate(cases):
        ordered = sorted(values)
        assert [exact_percentile(ordered, q) for q in QUANTILES] == by_group[i], values


@pytest.mark.spark
def test_summary_percentiles_are_those_of_the_outcomes(spark: SparkSession, tmp_path: Path) -> None:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
    from pipeline_helpers import RULES_TOML, make_input

    from tickwheel.pipeline.batch import run_job
    from tickwheel.pipeline.rules import load_rules

    rules_path = tmp_path / "rules.toml"
    rules_path.write_text(RULES_TOML, encoding="utf-8")
    summary = run_job(
        spark, load_rules(rules_path), str(make_input(tmp_path / "in")), str(tmp_path / "out"),
        partitions=3,
    )  # fmt: skip
    table = pq.read_table(tmp_path / "out" / "outcomes").to_pydict()
    by_outcome: dict[str, list[int]] = {}
    for outcome, latency in zip(table["outcome"], table["latency_ms"], strict=True):
        if latency is not None:
            by_outcome.setdefault(outcome, []).append(latency)
    expected = {
        outcome: dict(
            zip(
                ("p50", "p90", "p99"),
                [exact_percentile(sorted(v), q) for q in QUANTILES],
                strict=True,
            )
        )
        for outcome, v in sorted(by_outcome.items())
    }
    assert len(expected) >= 2
    assert summary["latency_ms"] == expected
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["latency_ms"] == expected


@settings(max_examples=25)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=30))
def test_exact_percentile_is_the_order_statistic_at_whole_positions(values: list[int]) -> None:
    ordered = sorted(values)
    assert exact_percentile(ordered, 0.0) == ordered[0]
    assert exact_percentile(ordered, 1.0) == ordered[-1]
