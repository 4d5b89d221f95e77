"""Rules edited between runs of a stream on one checkpoint (``stream/evolution.py``).

Each change that applies is checked against the reference's meaning of its
documented rule: operations opened before a timeout change are those of the
reference under the old rules, those opened after it of the reference under
the new ones; a new rule sees only the events applied after it came. Each
change the state cannot follow is refused before a batch runs, in one
message, unless ``drop_incompatible_state`` drops what it concerns.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stream_support import OUTCOME_COLS, rows, subprocess_env

from support.reference import run_reference
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.stream.checkpoint import STATE_FORMAT, StreamError
from tickwheel.pipeline.stream.evolution import RulesChangeRefused, compare_rules, rules_record
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

MIN = 60_000
INPUT = """[input]
key = "order_id"
type = "type"
time = "ts"
id = "event_id"
allowed_lateness = "{lateness}"
retention = "{retention}"
"""
PAYMENT = """
[rules.{name}]
key = "{key}"
open = ["created"]
complete = ["paid"]
cancel = [{cancel}]
timeout = "{timeout}"
"""
SHIPPING = """
[rules.shipping]
open = ["paid"]
complete = ["shipped"]
timeout = "1h"
"""


def rules_text(
    *, timeout: str = "30m", name: str = "payment", key: str = "order_id", lateness: str = "0",
    retention: str = "7d", cancel: str = "", shipping: bool = False,
) -> str:  # fmt: skip
    text = INPUT.format(lateness=lateness, retention=retention)
    text += PAYMENT.format(name=name, key=key, cancel=cancel, timeout=timeout)
    return text + (SHIPPING if shipping else "")


def event(event_id: str, kind: str, order: str, minute: float) -> str:
    return json.dumps({"event_id": event_id, "type": kind, "order_id": order,
                       "ts": int(minute * MIN)})  # fmt: skip


class Stream:
    """One checkpoint, input and output in ``tmp``; each :meth:`run` takes the new files."""

    def __init__(self, spark: Any, tmp: Path) -> None:
        self.spark, self.tmp = spark, tmp
        self.inp = tmp / "in"
        self.inp.mkdir()
        self.files = 0
        self.lines: list[list[str]] = []

    def add(self, *lines: str) -> None:
        self.files += 1
        (self.inp / f"{self.files:03d}.jsonl").write_text("\n".join(lines) + "\n")
        self.lines.append(list(lines))

    def run(self, rules: str, **options: Any) -> dict[str, Any]:
        path = self.tmp / f"rules-{self.files}.toml"
        path.write_text(rules)
        config = StreamConfig(
            rules_path=str(path), input=str(self.inp), output=str(self.tmp / "out"),
            checkpoint=str(self.tmp / "ck"), partitions=1, **options,
        )  # fmt: skip
        with FileStreamJob(config, spark=self.spark) as job:
            summary: dict[str, Any] = job.run()
        return summary

    def outputs(self) -> dict[str, Any]:
        sink = ParquetSink(str(self.tmp / "out"))
        return read_stream_outputs(self.spark, sink, str(self.tmp / "ck"))

    def commits(self) -> list[str]:
        return sorted(p.name for p in (self.tmp / "ck" / "tickwheel" / "commits").iterdir())


def outcomes_by_op(stream: Stream) -> dict[tuple[str, str], tuple[Any, ...]]:
    """The outcome rows, final and pending, by (rule, op id)."""
    return {(row[0], row[2]): row for row in rows(stream.outputs()["outcomes"], OUTCOME_COLS)}


def reference_by_op(lines: list[str], rules: str, tmp: Path) -> dict[Any, tuple[Any, ...]]:
    path = tmp / "reference.toml"
    path.write_text(rules)
    return {(r[0], r[2]): r for r in run_reference(lines, load_rules(path)).outcomes}


def test_a_timeout_change_keeps_the_deadlines_of_open_operations(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """30m -> 45m: A, opened before, keeps its 30m (the old rules' outcome); B, opened
    after, takes 45m (the new rules' outcome)."""
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0))
    stream.run(rules_text(timeout="30m"))
    stream.add(event("b1", "created", "B", 10), event("a2", "paid", "A", 40),
               event("b2", "paid", "B", 50), event("z", "created", "Z", 200))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="tickwheel.pipeline"):
        stream.run(rules_text(timeout="45m"))
    out = caplog.text
    assert "rule 'payment': timeout 30m -> 45m: pending operations keep the deadline" in out
    got = outcomes_by_op(stream)
    lines = [line for batch in stream.lines for line in batch]
    old = reference_by_op(lines, rules_text(timeout="30m"), tmp_path)
    new = reference_by_op(lines, rules_text(timeout="45m"), tmp_path)
    assert old[("payment", "a1")] != new[("payment", "a1")]  # the rule decides
    assert got[("payment", "a1")] == old[("payment", "a1")]
    assert got[("payment", "a1")][5] == "expired"
    assert got[("payment", "b1")] == new[("payment", "b1")] != old[("payment", "b1")]
    assert got[("payment", "b1")][5] == "completed"


def test_a_new_rule_and_new_types_apply_to_the_events_applied_after_them(
    spark: Any, tmp_path: Path
) -> None:
    """A new rule (shipping, opened by paid) and a new cancel type: X was paid before
    they came and opens no shipping operation; Y, paid after, does, and the new
    cancel type cancels W's payment operation."""
    stream = Stream(spark, tmp_path)
    stream.add(event("x1", "created", "X", 0), event("x2", "paid", "X", 1),
               event("w1", "created", "W", 2))  # fmt: skip
    stream.run(rules_text())
    stream.add(event("y1", "created", "Y", 3), event("y2", "paid", "Y", 4),
               event("w2", "cancelled", "W", 5), event("z", "created", "Z", 300))  # fmt: skip
    stream.run(rules_text(shipping=True, cancel='"cancelled"'))
    got = outcomes_by_op(stream)
    new = reference_by_op(
        [line for batch in stream.lines for line in batch],
        rules_text(shipping=True, cancel='"cancelled"'),
        tmp_path,
    )
    assert ("shipping", "x2") in new and ("shipping", "x2") not in got
    assert got[("shipping", "y2")] == new[("shipping", "y2")]
    assert got[("payment", "w1")] == new[("payment", "w1")]
    assert got[("payment", "w1")][5] == "cancelled"


def test_lateness_and_retention_changes_apply(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """allowed_lateness 0 -> 10m: the next watermark is the largest time minus 10m, and
    never below the last; the retention's change is said."""
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 100))
    caplog.set_level(logging.INFO, logger="tickwheel.pipeline")
    first = stream.run(rules_text())
    assert first["watermark"] == 100 * MIN
    stream.add(event("b1", "created", "B", 105))
    second = stream.run(rules_text(lateness="10m", retention="1d"))
    assert second["watermark"] == 100 * MIN  # 105m - 10m is below the last watermark
    stream.add(event("c1", "created", "C", 130))
    third = stream.run(rules_text(lateness="10m", retention="1d"))
    assert third["watermark"] == 120 * MIN
    out = caplog.text
    assert "allowed_lateness 0ms -> 10m" in out and "retention 7d -> 1d" in out


def test_a_renamed_rule_with_pending_operations_is_refused_before_a_batch(
    spark: Any, tmp_path: Path
) -> None:
    """payment -> pay: one message naming the rule, its pending count and the ways out;
    nothing committed. With drop_incompatible_state the stream goes on, says what it
    dropped, and the old rule's operation is gone from the state."""
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0), event("b1", "created", "B", 1))
    stream.run(rules_text())
    before = stream.commits()
    stream.add(event("c1", "created", "C", 2))
    with pytest.raises(RulesChangeRefused) as refused:
        stream.run(rules_text(name="pay"))
    message = str(refused.value)
    assert "rule 'payment' was removed (or renamed) and has 2 pending operations" in message
    assert "a new checkpoint" in message and "--drop-incompatible-state" in message
    assert stream.commits() == before
    summary = stream.run(rules_text(name="pay"), drop_incompatible_state=True)
    assert summary["batches_run"] == 1
    pending = [r for r in rows(stream.outputs()["outcomes"], OUTCOME_COLS) if r[5] == "pending"]
    assert [(r[0], r[2]) for r in pending] == [("pay", "c1")]


def test_refusals_name_every_difference(spark: Any, tmp_path: Path) -> None:
    """A changed key field and a changed input format, in one message."""
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0))
    stream.run(rules_text())
    with pytest.raises(RulesChangeRefused) as refused:
        stream.run(rules_text(key="customer"), input_format="csv")
    message = str(refused.value)
    assert "rule 'payment': its key field changed: 'order_id' -> 'customer'" in message
    assert "the input format changed: 'json' -> 'csv'" in message


def test_a_frame_of_the_other_form_is_refused_like_an_input_format_change(
    spark: Any, tmp_path: Path
) -> None:
    """start_stream without input_format: the form it guesses from the frame (a value
    column: json; else the fields as columns) is recorded and compared, so a restart
    on a frame of the other form is refused as an explicit change is."""
    from tickwheel.pipeline.stream.start import start_stream

    rules = tmp_path / "rules.toml"
    rules.write_text(rules_text())
    checkpoint, output = str(tmp_path / "ck"), str(tmp_path / "out")
    lines = [event("a1", "created", "A", 0)]
    values = spark.readStream.format("text").load(str(_text_dir(tmp_path, lines)))
    query = start_stream(values, rules, output=output, checkpoint=checkpoint, trigger="once")
    query.awaitTermination()
    columns = values.selectExpr(
        "get_json_object(value, '$.event_id') AS event_id",
        "get_json_object(value, '$.type') AS type",
        "get_json_object(value, '$.order_id') AS order_id",
        "CAST(get_json_object(value, '$.ts') AS LONG) AS ts",
    )
    with pytest.raises(RulesChangeRefused, match="the input format changed: 'json' -> 'columns'"):
        start_stream(columns, rules, output=output, checkpoint=checkpoint, trigger="once")


def _text_dir(tmp: Path, lines: list[str]) -> Path:
    directory = tmp / "text"
    directory.mkdir()
    (directory / "0.jsonl").write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.parametrize("provider", ["driver", "partitioned"])
def test_a_removed_rule_without_pending_operations_applies(
    spark: Any, tmp_path: Path, provider: str
) -> None:
    """Shipping removed when none of its operations is pending: its expiry marker, kept for
    the retention, is dropped from the state, whether the driver holds its operations
    or they are partitioned on the executors (a bound of one byte)."""
    from tickwheel.pipeline.storage import LocalStorage
    from tickwheel.pipeline.stream.changelog import committed_tables
    from tickwheel.pipeline.stream.checkpoint import StateStore

    bound = {"driver_state_bytes": 1} if provider == "partitioned" else {}
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0), event("a2", "paid", "A", 1),
               event("z", "created", "Z", 100))  # fmt: skip
    stream.run(rules_text(shipping=True), **bound)
    store = StateStore(str(tmp_path / "ck" / "tickwheel"), LocalStorage())
    before = committed_tables(store, 0)["ops"]
    assert "shipping" in before["rule"].to_pylist()  # A's shipping expiry marker
    stream.add(event("b1", "created", "B", 101))
    assert stream.run(rules_text(), **bound)["batches_run"] == 1
    last = store.read_commit(1)
    assert last.state_provider == provider
    assert "shipping" not in committed_tables(store, 1, last)["ops"]["rule"].to_pylist()


@pytest.mark.jvm_process
def test_the_cli_refuses_in_one_message(spark: Any, tmp_path: Path) -> None:
    """``pipeline stream`` on a renamed rule: exit 2, one line of error, no traceback."""
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0))
    stream.run(rules_text())
    rules = tmp_path / "renamed.toml"
    rules.write_text(rules_text(name="pay"))
    args = [sys.executable, "-m", "tickwheel._cli", "pipeline", "stream", "--rules", str(rules),
            "--input", str(stream.inp), "--output", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "ck")]  # fmt: skip
    proc = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "tickwheel pipeline stream: error: checkpoint" in proc.stderr
    assert "rule 'payment' was removed (or renamed) and has 1 pending operations" in proc.stderr
    assert "batch 1" not in proc.stdout


def test_a_newer_state_format_is_refused(spark: Any, tmp_path: Path) -> None:
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0))
    stream.run(rules_text())
    commit = tmp_path / "ck" / "tickwheel" / "commits" / "0.json"
    meta = json.loads(commit.read_text())
    assert meta["format"] == STATE_FORMAT and meta["rules"]["rules"][0]["name"] == "payment"
    commit.unlink()
    commit.write_text(json.dumps({**meta, "format": STATE_FORMAT + 1, "tickwheel": "9.0"}))
    with pytest.raises(StreamError, match=rf"format {STATE_FORMAT + 1}, written by tickwheel 9.0"):
        stream.run(rules_text())


def test_compare_rules_without_spark() -> None:
    """The comparison itself: unchanged rules differ in nothing."""
    path_text = rules_text(shipping=True)
    rules = _rules(path_text)
    assert not compare_rules(rules_record(rules), rules)
    change = compare_rules(rules_record(rules), _rules(rules_text()))
    assert change.removed == ["shipping"] and not change.refused


def _rules(text: str) -> Any:
    import tomllib

    from tickwheel.pipeline.rules import parse_rules

    return parse_rules(tomllib.loads(text))
