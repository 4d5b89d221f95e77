"""The incremental pipeline in-process: equivalence with one batch, bad input, locking."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference, feed, fresh, rows, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.stream.checkpoint import CheckpointInUse, StreamError
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.query import parse_trigger
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """400 generated orders in 20 arrival-ordered files, the rules and the reference."""
    base = tmp_path_factory.mktemp("orders")
    gen = base / "gen"
    generate_orders(400, gen, seed=11, files=20)
    rules = write_rules(base / "rules.toml")
    files = sorted(gen.glob("part-*.jsonl"))
    ref = run_reference(iter_input_lines(gen), load_rules(rules))
    return {"files": files, "rules": rules, "ref": ref, "base": base}


def _config(tmp: Path, rules: Path, **kw: Any) -> StreamConfig:
    """A quiet job on ``tmp``'s ``in``, ``out`` and ``ck`` directories."""
    return StreamConfig(
        rules_path=str(rules),
        input=str(tmp / "in"),
        output=str(tmp / "out"),
        checkpoint=str(tmp / "ck"),
        **kw,
    )


def _run(spark: Any, tmp: Path, rules: Path, **kw: Any) -> dict[str, Any]:
    with FileStreamJob(_config(tmp, rules, **kw), spark=spark) as job:
        summary = job.run()
        assert job.sink is not None
        summary["outputs"] = read_stream_outputs(spark, job.sink, str(tmp / "ck"))
    return summary


@pytest.mark.slow
@pytest.mark.timeout(900)  # 10 micro-batches on a shared local[2] session
@pytest.mark.parametrize(
    ("increments", "partitions", "separate_runs"),
    [(1, 2, False), (5, 1, True), (10, 3, False)],
    ids=["1-increment-2-partitions", "5-runs-1-partition", "10-increments-3-partitions"],
)
def test_increments_equal_one_batch_run(
    spark: Any,
    tmp_path: Path,
    orders: dict[str, Any],
    increments: int,
    partitions: int,
    separate_runs: bool,
) -> None:
    """1, 5 or 10 increments, any partition count: the same outputs as the batch semantics.

    One partition per row keeps every purgatory at ``partitions`` (these
    micro-batches are far below MICRO_BATCH_ROWS_PER_PARTITION).
    """
    inp = tmp_path / "in"
    if separate_runs:  # a new job per increment: state carried through the checkpoint
        per = len(orders["files"]) // increments
        for i in range(increments):
            feed(orders["files"][i * per : (i + 1) * per], inp, 1, start=i)
            summary = _run(
                spark, tmp_path, orders["rules"], partitions=partitions, trigger="once",
                rows_per_partition=1,
            )  # fmt: skip
            assert summary["batches_run"] == 1
    else:
        feed(orders["files"], inp, increments)
        summary = _run(
            spark,
            tmp_path,
            orders["rules"],
            partitions=partitions,
            trigger="available-now",
            max_files_per_trigger=1,
            rows_per_partition=1,
        )
        assert summary["batches_run"] == increments
    assert {m["purgatory_partitions"] for m in _committed_metas(tmp_path)} == {partitions}
    assert summary["last_batch"] == increments - 1
    assert summary["watermark"] == orders["ref"].watermark
    compare_with_reference(summary["outputs"], orders["ref"])


def _committed_metas(tmp: Path) -> list[dict[str, Any]]:
    """The commit of every committed micro-batch left in the checkpoint."""
    commits = tmp / "ck" / "tickwheel" / "commits"
    metas = [json.loads(p.read_text()) for p in sorted(commits.glob("*.json"))]
    return [m for m in metas if not m.get("fence")]  # a new owner's fence commits nothing


def _parquet_rows(directory: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in directory.glob("part-*.parquet"))


@pytest.mark.parametrize(
    "rows_per_partition", [None, 50], ids=["default-size", "50-rows-per-partition"]
)
def test_a_micro_batch_sizes_its_purgatory_by_its_rows(
    spark: Any, tmp_path: Path, orders: dict[str, Any], rows_per_partition: int | None
) -> None:
    """Up to ``partitions``, one purgatory partition per ``rows_per_partition`` rows.

    A micro-batch of about 40 records with 3 partitions takes one under the
    default size; with 50 rows per partition, it takes ceil(rows / 50), rows
    being what its purgatory takes in: its kept events, and the carried
    operations they touch, which its changelog removes (``ops.removed``,
    counted from the Parquet footers). A micro-batch that fits one partition
    has its tables written by the driver, a larger one by Spark. The outputs
    stay the reference's.
    """
    feed(orders["files"][:6], tmp_path / "in", 3)
    size = {} if rows_per_partition is None else {"rows_per_partition": rows_per_partition}
    summary = _run(spark, tmp_path, orders["rules"], partitions=3, max_files_per_trigger=1, **size)
    assert summary["batches_run"] == 3
    metas = _committed_metas(tmp_path)
    last, before = metas[-1], metas[-2]
    state = tmp_path / "ck" / "tickwheel" / "state" / str(last["batch_id"]) / last["attempt"]
    assert last["state_rows"] == _parquet_rows(state / "events") + _parquet_rows(state / "ops")
    assert before["state_rows"] > 0
    if rows_per_partition is None:
        assert {m["purgatory_partitions"] for m in metas} == {1}
        assert {m["written_by"] for m in metas} == {"driver"}  # each fits one partition
    else:  # every generated event is of a type the rules use: kept == events
        assert last["state"]["kind"] == "changelog"
        removed = state / "ops.removed"
        taken_in = _parquet_rows(removed) if removed.exists() else 0
        rows = last["counts"]["events"] + taken_in
        assert taken_in < before["state_rows"]  # not the whole state
        assert last["purgatory_partitions"] == min(3, -(-rows // rows_per_partition)) > 1
        assert last["written_by"] == "spark"  # its rows exceed one partition's 50


@pytest.mark.parametrize("driver_rows", [None, 10], ids=["default", "10-rows"])
def test_a_micro_batch_below_driver_rows_runs_its_partition_in_the_driver(
    spark: Any,
    tmp_path: Path,
    orders: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    driver_rows: int | None,
) -> None:
    """Each micro-batch here (about 150 records) is below the default DRIVER_ROWS:
    the driver runs its purgatory (no shuffle, no Python worker) on the records its
    one job collected, and writes its tables. With DRIVER_ROWS at 10, Spark's
    partitions run it and Spark's writer writes them. The outputs of 5
    micro-batches are the reference's either way."""
    from tickwheel.pipeline.spark import partition, placement, step

    held = driver_rows is None
    if not held:
        monkeypatch.setattr(placement, "DRIVER_ROWS", driver_rows)
    runs: list[str] = []

    def counted_spark_partitions(*args: Any, **kw: Any) -> Any:
        runs.append("spark")
        return partition.run_partitions(*args, **kw)

    def counted_driver_partition(*args: Any, **kw: Any) -> Any:
        runs.append("driver")
        return partition.run_partition(*args, **kw)

    monkeypatch.setattr(step, "run_partitions", counted_spark_partitions)
    monkeypatch.setattr(step, "run_partition", counted_driver_partition)
    feed(orders["files"], tmp_path / "in", 5)
    summary = _run(spark, tmp_path, orders["rules"], partitions=2, max_files_per_trigger=1)
    assert summary["batches_run"] == 5
    assert runs == (["driver"] if held else ["spark"]) * 5
    written_by = {m["written_by"] for m in _committed_metas(tmp_path)}
    assert written_by == ({"driver"} if held else {"spark"})
    compare_with_reference(summary["outputs"], orders["ref"])


class _FilesCheckedJob(FileStreamJob):
    """A stream job that also reads each batch's files from its rows, to compare."""

    seen: list[tuple[list[str], list[str]]]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        listed_by_logs = self.files._files

        def files(files_df: Any, batch_id: int, store: Any) -> list[str]:
            listed = listed_by_logs(files_df, batch_id, store)
            self.seen.append((listed, [r["path"] for r in files_df.collect()]))
            return listed

        self.files._files = files  # type: ignore[method-assign]


def test_each_batchs_files_come_from_the_logs_as_its_rows_give_them(
    spark: Any, tmp_path: Path, orders: dict[str, Any]
) -> None:
    """The driver takes a batch's files from Spark's offset log and the file log
    (no job): the same files, in the same order, as the source's rows for the
    batch."""
    from tickwheel.pipeline.stream.file_log import FileLog, logged_batch_files

    feed(orders["files"][:6], tmp_path / "in", 3)
    job = _FilesCheckedJob(_config(tmp_path, orders["rules"], max_files_per_trigger=2), spark=spark)
    job.seen = []
    with job:
        assert job.run()["batches_run"] == 2
    assert [len(from_logs) for from_logs, _ in job.seen] == [2, 1]
    assert all(from_logs == from_rows for from_logs, from_rows in job.seen)
    log = FileLog(str(tmp_path / "ck" / "tickwheel" / "files.log"), repair=False)
    assert logged_batch_files(str(tmp_path / "ck" / "spark"), log, 1) == job.seen[1][0]


def test_rows_per_partition_must_be_a_positive_int(spark: Any, tmp_path: Path) -> None:
    """A bad ``rows_per_partition`` is refused, naming the option."""
    from tickwheel.pipeline.spark.step import DelayedOperations, StepOptions

    rules = load_rules(str(write_rules(tmp_path / "rules.toml")))
    records = spark.createDataFrame([("{}",)], "value string")
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match="rows_per_partition must be an int >= 1"):
            DelayedOperations(records, rules, StepOptions(rows_per_partition=bad))  # type: ignore[arg-type]


def test_rerun_without_new_files_changes_nothing(
    spark: Any, tmp_path: Path, orders: dict[str, Any]
) -> None:
    """A second run on the same checkpoint with no new file runs no batch."""
    feed(orders["files"][:4], tmp_path / "in", 2)
    first = _run(spark, tmp_path, orders["rules"], max_files_per_trigger=1)
    assert first["batches_run"] == 2
    again = _run(spark, tmp_path, orders["rules"])
    assert again["batches_run"] == 0
    assert rows(again["outputs"]["outcomes"], ["op_id", "outcome"]) == rows(
        first["outputs"]["outcomes"], ["op_id", "outcome"]
    )


def test_micro_batches_run_in_a_child_session(
    spark: Any, tmp_path: Path, orders: dict[str, Any]
) -> None:
    """The job's own SQL setting stays in its child session; the caller's settings reach it."""
    fresh(tmp_path / "in")
    compressed = "spark.sql.inMemoryColumnarStorage.compressed"
    partitions = "spark.sql.shuffle.partitions"
    before = {key: spark.conf.get(key) for key in (compressed, partitions)}
    spark.conf.set(partitions, "3")  # a runtime setting, not one the SparkContext knows
    try:
        with FileStreamJob(_config(tmp_path, orders["rules"]), spark=spark) as job:
            child = job._batch_session()
            assert child is not spark
            assert child.sparkContext is spark.sparkContext
            assert child.conf.get(compressed) == "false"
            assert child.conf.get(partitions) == "3"
            assert job._batch_session() is child
        assert spark.conf.get(compressed) == before[compressed]
    finally:
        spark.conf.set(partitions, before[partitions])


def test_second_job_on_same_checkpoint_is_refused(tmp_path: Path, orders: dict[str, Any]) -> None:
    """The checkpoint lock refuses a concurrent job with a clear error."""
    fresh(tmp_path / "in")
    cfg = _config(tmp_path, orders["rules"])
    with FileStreamJob(cfg), pytest.raises(CheckpointInUse, match="is in use by"):
        FileStreamJob(cfg)
    FileStreamJob(cfg).close()  # released: a later job may take it


def test_bad_options_are_named(tmp_path: Path, orders: dict[str, Any]) -> None:
    """Bad options fail early, naming the option."""
    fresh(tmp_path / "in")
    base = {
        "rules_path": str(orders["rules"]),
        "input": str(tmp_path / "in"),
        "output": str(tmp_path / "out"),
        "checkpoint": str(tmp_path / "ck"),
    }
    with pytest.raises(StreamError, match="--trigger"):
        FileStreamJob(StreamConfig(**{**base, "trigger": "sometimes"}))
    with pytest.raises(StreamError, match="not a directory"):
        FileStreamJob(StreamConfig(**{**base, "input": str(tmp_path / "missing")}))
    with pytest.raises(StreamError, match="maxwell"):
        FileStreamJob(StreamConfig(**{**base, "input_format": "maxwell"}))
    assert parse_trigger("interval=30s") == ("interval", 30_000)
    assert parse_trigger("once") == ("once", None)


def _line(event_id: str, key: str, kind: str, ts: int | str, seq: int = 0) -> str:
    return json.dumps(
        {"event_id": event_id, "order_id": key, "type": kind, "ts": ts, "seq": seq},
        separators=(",", ":"),
    )


def test_bad_input_files_are_rejected_not_fatal(spark: Any, tmp_path: Path) -> None:
    """Truncated, zero-byte, garbage, extra/missing columns, far future: rows, not crashes."""
    rules = write_rules(tmp_path / "rules.toml", lateness="1m")
    inp = fresh(tmp_path / "in")
    t0 = 1_767_225_600_000
    good = [_line("a1", "o1", "created", t0), _line("a2", "o2", "created", t0 + 1000)]
    files = {
        "01-good.jsonl": "\n".join(good) + "\n",
        "02-truncated.jsonl": _line("b1", "o3", "created", t0 + 2000) + "\n" + '{"event_id":"b2",',
        "03-empty.jsonl": "",
        "04-garbage.jsonl": "",  # written as bytes below
        "05-columns.jsonl": json.dumps(
            {"event_id": "c1", "order_id": "o1", "type": "paid", "ts": t0 + 5000, "extra": 1}
        )
        + "\n"
        + json.dumps({"event_id": "c2", "type": "paid", "ts": t0 + 6000})
        + "\n",
        "06-future.jsonl": _line("d1", "o4", "created", t0 + 400 * 86_400_000) + "\n",
        "07-late.jsonl": _line("e1", "o5", "created", t0 - 3_600_000) + "\n",
        # a heartbeat (marker file) moves the watermark while input stalls
        "08-marker.heartbeat": str(t0 + 10 * 60_000),
    }
    for i, (name, text) in enumerate(files.items()):
        path = inp / name
        data = text.encode() if not name.endswith("garbage.jsonl") else b"\x00\x01\xffbin\n\n%%\n"
        path.write_bytes(data)
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    summary = _run(
        spark,
        tmp_path,
        rules,
        trigger="available-now",
        max_files_per_trigger=1,
        max_future_ms=86_400_000,
    )
    assert summary["batches_run"] == len(files)
    outs = summary["outputs"]
    rejected = rows(outs["rejected"], ["event_id", "reason"])
    reasons = [r[1] for r in rejected]
    assert ("c2", "missing_field:order_id") in rejected  # a missing column
    assert reasons.count("malformed") == 3  # the truncated line and two garbage lines
    assert any(r[0] == "d1" and r[1].startswith("far_future") for r in rejected)
    # the extra column is ignored: c1 is a valid payment of o1
    outcomes = dict(rows(outs["outcomes"], ["op_id", "outcome"]))
    assert outcomes == {"a1": "completed", "a2": "pending", "b1": "pending"}
    assert summary["watermark"] == t0 + 10 * 60_000 - 60_000
    assert rows(outs["late"], ["event_id", "reason"]) == [
        ("e1", "late: event time below the watermark")
    ]
