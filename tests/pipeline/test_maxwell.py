"""Maxwell's binlog JSON as input: patterns, normalized events, and the sample stream."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from stream_support import ROOT, rows

from tickwheel.pipeline.maxwell import (
    MaxwellError,
    MaxwellMapping,
    maxwell_events,
    parse_event_spec,
)
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.stream import StreamConfig, StreamJob, read_stream_outputs

SAMPLE = ROOT / "examples" / "maxwell_orders.jsonl"
RULES = ROOT / "examples" / "maxwell_orders.toml"
T0 = 1_767_225_600_000  # the sample's first ts (2026-01-01T00:00:00Z) in ms


def test_event_patterns() -> None:
    """Each pattern form parses to its mapping; nonsense is refused with the forms."""
    assert parse_event_spec("created", "insert") == MaxwellMapping("created", "insert")
    assert parse_event_spec("paid", "status: created -> paid") == MaxwellMapping(
        "paid", None, "status", "created", "paid", True
    )
    assert parse_event_spec("c", "status: * -> 'cancelled'") == MaxwellMapping(
        "c", None, "status", "*", "cancelled", True
    )
    assert parse_event_spec("p", "status = paid") == MaxwellMapping(
        "p", None, "status", None, "paid"
    )
    assert parse_event_spec("d", "delete: status = gone") == MaxwellMapping(
        "d", "delete", "status", None, "gone"
    )
    with pytest.raises(MaxwellError, match="cannot read the pattern"):
        parse_event_spec("x", "whenever it rains")


def test_specs_from_rules_file() -> None:
    """The sample rules name the table, the key column and three event types."""
    (spec,) = load_rules(RULES).maxwell
    assert (spec.rule, spec.database, spec.table, spec.primary_key) == (
        "unpaid_orders",
        "shop",
        "orders",
        "id",
    )
    assert [m.event_type for m in spec.mappings] == ["created", "paid", "cancelled"]


@pytest.mark.spark
def test_maxwell_events_normalize_in_binlog_order(spark: Any) -> None:
    """Keys, types, times, ids and (xid, xoffset) sequences of the sample stream."""
    specs = load_rules(RULES).maxwell
    raw = spark.read.text(str(SAMPLE))
    events, rejected = maxwell_events(raw, specs)
    got = rows(events, ["key", "event_type", "event_time", "event_id", "seq"])
    # 19 lines - 2 rejected - 1 other table - 2 updates no pattern maps; the dup stays
    assert len(got) == 14
    by_id = {r[3]: r for r in got}
    assert len(by_id) == 13
    insert5 = by_id["shop.orders/5@105:0/created"]
    paid5 = by_id["shop.orders/5@106:0/paid"]
    # the update is listed first in the file, binlog order puts it after the insert
    assert insert5[2] == paid5[2] == T0 + 240_000
    assert insert5[4] < paid5[4]
    assert by_id["shop.orders/8@110:1/created"][4] == (110 << 20) + 1
    assert rows(rejected, ["reason"]) == [
        ("missing primary key 'id' in data",),
        ("not a Maxwell JSON record",),
    ]


@pytest.mark.spark
def test_maxwell_stream_end_to_end(spark: Any, tmp_path: Path) -> None:
    """The sample stream through ``stream --input-format maxwell``: the expected outcomes."""
    inp = tmp_path / "in"
    inp.mkdir()
    shutil.copy(SAMPLE, inp / SAMPLE.name)
    cfg = StreamConfig(
        rules_path=str(RULES),
        input=str(inp),
        output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        input_format="maxwell",
        trigger="once",
        quiet=True,
    )
    with StreamJob(cfg, spark=spark) as job:
        summary = job.run()
        assert job.sink is not None
        outs = read_stream_outputs(spark, job.sink, str(tmp_path / "ck"))
    assert summary["duplicates"] == 1  # Maxwell's producer sent order 1's insert twice
    s = 1000
    outcomes = rows(outs["outcomes"], ["key", "outcome", "opened_at", "resolved_at"])
    assert outcomes == [
        ("1", "completed", T0, T0 + 600 * s),
        ("2", "expired", T0 + 60 * s, T0 + 1860 * s),
        ("3", "cancelled", T0 + 120 * s, T0 + 300 * s),
        ("4", "expired", T0 + 180 * s, T0 + 1980 * s),
        ("5", "completed", T0 + 240 * s, T0 + 240 * s),
        ("7", "completed", T0 + 400 * s, T0 + 500 * s),
        ("8", "expired", T0 + 400 * s, T0 + 2200 * s),
    ]
    assert rows(outs["unmatched"], ["key", "event_type", "reason"]) == [
        ("4", "paid", "after_expiry")  # paid after the auto-cancel: a refund case
    ]
    assert rows(outs["buffered"], ["event_id"]) == [("shop.orders/9@130:0/created",)]
    assert len(rows(outs["rejected"], ["reason"])) == 2
