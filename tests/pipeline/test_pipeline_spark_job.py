"""The Spark job against the plain-Python reference, and invariance to the run's shape."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pipeline_helpers import (
    RULES_TOML,
    make_input,
    merge_into_one_file,
    read_outputs,
    spark_compilations,
)

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.batch import run_job
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.spark.session import JOB_SQL_SETTINGS, job_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pipeline")
    rules_path = root / "rules.toml"
    rules_path.write_text(RULES_TOML, encoding="utf-8")
    rules = load_rules(rules_path)
    data = make_input(root / "input")
    reference = run_reference(iter_input_lines(data), rules)
    return {"root": root, "rules": rules, "input": data, "reference": reference}


@pytest.fixture(scope="module")
def three_partitions(spark: SparkSession, workload: dict[str, Any]) -> dict[str, Any]:
    out = workload["root"] / "out-3"
    summary = run_job(spark, workload["rules"], str(workload["input"]), str(out), partitions=3)
    return {"summary": summary, "outputs": read_outputs(out), "dir": out}


def test_the_data_covers_every_case(workload: dict[str, Any]) -> None:
    ref = workload["reference"]
    counts = ref.counts
    assert counts["duplicates"] > 0 and counts["conflicts"] >= 2 and counts["ignored"] == 1
    outcomes = {row[5] for row in ref.outcomes}
    assert outcomes == {"completed", "expired", "cancelled", "pending"}
    assert {row[5] for row in ref.unmatched} == {"after_expiry", "no_operation"}
    assert ref.buffered, "no event above the watermark"
    reasons = {row[1] for row in ref.rejected}
    assert {"malformed", "conflict", "bad_time", "bad_sequence"} <= reasons
    assert {"missing_field:event_id", "missing_field:order_id", "missing_field:ts"} <= reasons
    # ties at the deadline: a payment stamped exactly at its order's deadline
    deadlines = {(r[1], r[4]) for r in ref.outcomes if r[5] == "expired"}
    assert any((u[1], u[4]) in deadlines for u in ref.unmatched if u[5] == "after_expiry")
    # several operations opened on one key
    keys = [r[1] for r in ref.outcomes]
    assert len(keys) > len(set(keys))


def test_spark_output_equals_the_reference(
    workload: dict[str, Any], three_partitions: dict[str, Any]
) -> None:
    ref = workload["reference"]
    got = three_partitions["outputs"]
    assert got["outcomes"] == ref.outcomes
    assert got["unmatched"] == ref.unmatched
    assert got["rejected"] == ref.rejected
    assert got["buffered"] == ref.buffered


def test_summary_counts_match_the_reference(
    workload: dict[str, Any], three_partitions: dict[str, Any]
) -> None:
    ref = workload["reference"]
    summary = three_partitions["summary"]
    on_disk = json.loads((three_partitions["dir"] / "summary.json").read_text())
    assert on_disk == summary
    counts = summary["counts"]
    for name in ("records", "duplicates", "conflicts", "events", "ignored", "rejected", "buffered"):
        assert counts[name] == ref.counts.get(name, 0), name
    for outcome, n in counts["outcomes"].items():
        assert n == ref.counts[f"outcome_{outcome}"]
    assert sum(counts["unmatched"].values()) == ref.counts["unmatched"]
    assert summary["watermark"] == ref.watermark
    assert summary["partitions"] == 3
    expired = summary["latency_ms"]["expired"]
    assert expired == {"p50": 1_800_000, "p90": 1_800_000, "p99": 1_800_000}
    assert summary["loop"]["events"] == counts["events"] - counts["ignored"]
    assert summary["loop"]["events_per_s"] > 0


@pytest.mark.parametrize("partitions", [1, 8])
def test_same_output_for_any_partition_count(
    spark: SparkSession,
    workload: dict[str, Any],
    three_partitions: dict[str, Any],
    partitions: int,
) -> None:
    out = workload["root"] / f"out-{partitions}"
    before = {key: spark.conf.get(key) for key in (_PARTITIONS, _COMPRESSED)}
    run_job(spark, workload["rules"], str(workload["input"]), str(out), partitions=partitions)
    assert read_outputs(out) == three_partitions["outputs"]
    # the job's own settings lived in its child session, not in the caller's
    assert {key: spark.conf.get(key) for key in (_PARTITIONS, _COMPRESSED)} == before


_PARTITIONS = "spark.sql.shuffle.partitions"
_COMPRESSED = "spark.sql.inMemoryColumnarStorage.compressed"


def test_job_session_copies_the_callers_settings_and_adds_its_own(spark: SparkSession) -> None:
    before = spark.conf.get(_PARTITIONS)
    spark.conf.set(_PARTITIONS, "7")  # set at run time: the SparkContext does not know it
    try:
        child = job_session(spark)
        assert child is not spark
        assert child.sparkContext is spark.sparkContext
        assert child.conf.get(_PARTITIONS) == "7"
        for key, value in JOB_SQL_SETTINGS.items():
            assert child.conf.get(key) == value
        assert spark.conf.get(_COMPRESSED) == "true"
        explicit = job_session(spark, {_PARTITIONS: "2"})
        assert explicit.conf.get(_PARTITIONS) == "2"
        assert explicit.conf.get(_COMPRESSED) == "true"  # only the given settings
        assert spark.conf.get(_PARTITIONS) == "7"
    finally:
        spark.conf.set(_PARTITIONS, before)


def test_same_output_for_one_file_or_many(
    spark: SparkSession, workload: dict[str, Any], three_partitions: dict[str, Any]
) -> None:
    one = merge_into_one_file(workload["input"], workload["root"] / "one-file")
    assert len(list(one.iterdir())) == 1 and len(list(workload["input"].iterdir())) == 5
    out = workload["root"] / "out-one-file"
    run_job(spark, workload["rules"], str(one), str(out), partitions=3)
    assert read_outputs(out) == three_partitions["outputs"]


def test_missing_input_is_a_clear_error(spark: SparkSession, workload: dict[str, Any]) -> None:
    with pytest.raises(FileNotFoundError, match="no json input files"):
        run_job(spark, workload["rules"], str(workload["root"] / "nope"), str(workload["root"]))


def test_json_output_format(spark: SparkSession, tmp_path: Path, workload: dict[str, Any]) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text(
        '{"event_id":"1","order_id":"a","type":"created","ts":0}\n'
        '{"event_id":"2","order_id":"a","type":"paid","ts":5}\n'
        '{"event_id":"3","order_id":"b","type":"created","ts":3600000}\n',
        encoding="utf-8",
    )
    summary = run_job(
        spark, workload["rules"], str(data), str(tmp_path / "out"), output_format="json"
    )
    assert summary["counts"]["outcomes"] == {"completed": 1}
    assert summary["counts"]["buffered"] == 1  # above the watermark: 3,600,000 - 10 minutes
    rows = [
        json.loads(line)
        for f in sorted((tmp_path / "out" / "outcomes").glob("part-*"))
        for line in f.read_text().splitlines()
    ]
    completed = [r for r in rows if r["outcome"] == "completed"]
    assert completed == [
        {"rule": "payment", "key": "a", "op_id": "1", "opened_at": 0, "deadline": 1_800_000,
         "outcome": "completed", "resolved_at": 5, "latency_ms": 5, "resolve_event_id": "2"}
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_input(spark: SparkSession, tmp_path: Path, fmt: str) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from tickwheel.pipeline.rules import parse_rules

    table = pa.table(
        {
            "id": ["1", "2", "3", "4", "4", "5"],
            "order": ["a", "a", "b", "c", "c", "d"],
            "kind": ["created", "paid", "created", "created", "created", "paid"],
            "at": ["0", "1999", "2024-01-01T00:00:00Z", "10", "10", "soon"],
        }
    )
    data = tmp_path / "in"
    data.mkdir()
    if fmt == "csv":
        pacsv.write_csv(table, data / "events.csv")
    else:
        pq.write_table(table, data / "events.parquet")
    rules = parse_rules(
        {
            "input": {"key": "order", "type": "kind", "time": "at", "id": "id", "format": fmt},
            "rules": {"pay": {"open": ["created"], "complete": ["paid"], "timeout": "2s"}},
        }
    )
    out = tmp_path / "out"
    summary = run_job(spark, rules, str(data), str(out), partitions=2)
    assert summary["counts"]["duplicates"] == 1
    assert summary["counts"]["rejected_by_reason"] == {"bad_time": 1}
    got = read_outputs(out)
    assert [(r[1], r[5], r[6]) for r in got["outcomes"]] == [
        ("a", "completed", 1999),
        ("b", "pending", None),
        ("c", "expired", 2010),
    ]
    assert got["unmatched"] == []
    (rejected,) = got["rejected"]
    assert rejected[:2] == ("5", "bad_time") and '"soon"' in rejected[2]


def test_sessions_skip_pyspark_call_site_capture(spark: SparkSession) -> None:
    """create_session turns off the per-call DataFrame debugging (see its docstring)."""
    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"


def test_a_jobs_compiled_code_outlives_more_queries_than_sparks_default_keeps(
    spark: SparkSession, workload: dict[str, Any]
) -> None:
    """create_session keeps CODEGEN_CACHE_ENTRIES generated classes, where Spark keeps
    100: after 120 other queries, each with code of its own, the batch job runs again
    without compiling any of its code."""
    out = workload["root"] / "out-codegen"
    run_job(spark, workload["rules"], str(workload["input"]), str(out / "1"), partitions=2)
    first = spark_compilations(spark)
    for i in range(120):  # a literal is part of the generated code: 120 new classes
        spark.range(1).selectExpr(f"id * 7 + {i} AS x").collect()
    others = spark_compilations(spark)
    assert others >= first + 100
    run_job(spark, workload["rules"], str(workload["input"]), str(out / "2"), partitions=2)
    assert spark_compilations(spark) == others


def test_batch_job_applies_the_retention_as_the_reference(
    spark: SparkSession, workload: dict[str, Any]
) -> None:
    """A short retention: late payments after it are no_operation, in the job and the reference."""
    rules = dataclasses.replace(
        workload["rules"],
        input=dataclasses.replace(workload["rules"].input, retention_ms=5 * 60_000),
    )
    ref = run_reference(iter_input_lines(workload["input"]), rules)
    keep_all = workload["reference"]  # the default retention, 7d: longer than the data
    reasons = {row[2]: row[5] for row in ref.unmatched}
    changed = {row[2] for row in keep_all.unmatched if reasons[row[2]] != row[5]}
    assert changed and {reasons[e] for e in changed} == {"no_operation"}
    assert "after_expiry" in reasons.values()  # within the retention: still after_expiry
    out = workload["root"] / "out-retention"
    summary = run_job(spark, rules, str(workload["input"]), str(out), partitions=2)
    assert summary["retention_ms"] == 5 * 60_000
    got = read_outputs(out)
    assert got["outcomes"] == ref.outcomes == keep_all.outcomes
    assert got["unmatched"] == ref.unmatched
