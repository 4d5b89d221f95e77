"""The helpers of ``spark/frames.py``: SQL text and a run's parameters.

The step writes its column expressions as SQL text, with rule names, event
types and field names from the user's rules file inside it, so quoting must
hold for every string, not only for tame ones. A run's parameters must be
data to Spark's generated code, and cost no Spark job of their own.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_helpers import spark_compilations

from tickwheel.pipeline.spark.frames import (
    parameter_name,
    run_parameters,
    sql_in,
    sql_name,
    sql_string,
    with_parameters,
)

pytestmark = pytest.mark.spark

# Spark's strings are UTF-8: surrogates cannot reach it from Python.
TEXT = st.text(
    st.one_of(st.sampled_from("'\\`\"\n"), st.characters(exclude_categories=("Cs",))),
    max_size=12,
)
TRICKY = ["", "'", "\\", "\\'", "''", "`", "a`b", "\\u0041", "line\nbreak", "$x {y}", "é€😀"]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.lists(TEXT, min_size=1, max_size=6))
def test_sql_string_reads_back_as_the_same_text(spark: Any, texts: list[str]) -> None:
    """Each literal is read back as the text it quotes, character for character."""
    query = "SELECT " + ", ".join(f"{sql_string(t)} AS c{i}" for i, t in enumerate(texts))
    assert list(spark.sql(query).first()) == texts


def test_sql_string_sql_name_and_sql_in_on_tricky_strings(spark: Any) -> None:
    """Quotes, backslashes, escapes-looking text and backticks, as values and as names."""
    literals = ", ".join(f"{sql_string(t)} AS {sql_name(f'n{t}')}" for t in TRICKY)
    row = spark.sql(f"SELECT {literals}").first()
    assert list(row) == TRICKY
    assert row.__fields__ == [f"n{t}" for t in TRICKY]
    frame = spark.createDataFrame([(t,) for t in TRICKY], "v string")
    assert frame.where(sql_in("v", TRICKY[1:4])).count() == 3
    assert frame.where(sql_in("v", [])).count() == 0  # no values: false, not a syntax error
    assert spark.range(5).where(sql_in("id", (1, 3))).count() == 2


def _jobs_of(spark: Any, group: str, action: Any) -> tuple[Any, int]:
    """``action()``'s result, and how many Spark jobs it ran."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return result, len(context.statusTracker().getJobIdsForGroup(group))


def test_run_parameters_change_no_generated_code_and_run_no_job(spark: Any) -> None:
    """The same query with other values compiles nothing new, gives the rows the
    values select, and runs the jobs of the query without them: no broadcast."""
    rows = spark.range(1000).selectExpr("id", "id % 10 AS t")

    def query(low: int | None, high: int | None) -> Any:
        bounded = with_parameters(rows, run_parameters(low=low, high=high))
        low_, high_ = parameter_name("low"), parameter_name("high")
        kept = bounded.where(f"t >= {low_} AND (t < {high_} OR {high_} IS NULL)")
        return kept.repartition(2, "id").groupBy("t").count().orderBy("t")

    def counts(low: int | None, high: int | None, tag: str) -> tuple[list[Any], int]:
        return _jobs_of(
            spark, f"params-{tag}", lambda: [tuple(r) for r in query(low, high).collect()]
        )

    counts(1, 4, "warm")  # compiles the query's code, and its code for a null bound
    counts(2, None, "warm-null")
    before = spark_compilations(spark)
    got, jobs = counts(3, 6, "a")
    assert got == [(3, 100), (4, 100), (5, 100)]
    got, _ = counts(8, None, "b")
    assert got == [(8, 100), (9, 100)]
    assert spark_compilations(spark) == before
    plain = rows.where("t >= 3 AND t < 6").repartition(2, "id").groupBy("t").count().orderBy("t")
    _, plain_jobs = _jobs_of(spark, "params-plain", plain.collect)
    assert jobs == plain_jobs


def test_run_parameters_are_longs_and_null_for_none(spark: Any) -> None:
    """Values beyond 32 bits and None read back as given, in columns named by parameter_name."""
    params = run_parameters(w=2**53 + 1, limit=None)
    assert list(params) == [parameter_name("w"), parameter_name("limit")]
    frame = with_parameters(spark.range(2), params)
    assert [f.dataType.simpleString() for f in frame.schema.fields[1:]] == ["bigint", "bigint"]
    assert [tuple(r) for r in frame.collect()] == [(0, 2**53 + 1, None), (1, 2**53 + 1, None)]
