"""The SQL text helpers of ``spark/frames.py``: any name and any text survive Spark's parser.

The step writes its column expressions as SQL text, with rule names, event
types and field names from the user's rules file inside it, so quoting must
hold for every string, not only for tame ones.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.spark.frames import sql_in, sql_name, sql_string

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
