"""Maxwell's binlog JSON as input: patterns, normalized events, and the sample stream."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from stream_support import ROOT, rows

from tickwheel.pipeline.rules import Rules, RulesError, load_rules, parse_rules
from tickwheel.pipeline.spark.maxwell import (
    MaxwellError,
    MaxwellMapping,
    check_maxwell_rules,
    maxwell_events,
    maxwell_records,
    parse_event_spec,
)
from tickwheel.pipeline.spark.records import parse_records, record_fields_frame
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

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


def _stream_sample(
    spark: Any, tmp_path: Path, sample: Path = SAMPLE, rules: Path = RULES, **config: Any
) -> tuple[Any, Any]:
    """``sample`` through ``stream --input-format maxwell`` (one trigger): its summary and
    outputs (``read_stream_outputs``)."""
    inp = tmp_path / "in"
    inp.mkdir()
    shutil.copy(sample, inp / sample.name)
    cfg = StreamConfig(
        rules_path=str(rules),
        input=str(inp),
        output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        input_format="maxwell",
        trigger="once",
        **config,
    )
    with FileStreamJob(cfg, spark=spark) as job:
        summary = job.run()
        assert job.sink is not None
        outs = read_stream_outputs(spark, job.sink, str(tmp_path / "ck"))
    return summary, outs


@pytest.mark.spark
def test_maxwell_stream_end_to_end(spark: Any, tmp_path: Path) -> None:
    """The sample stream through ``stream --input-format maxwell``: the expected outcomes."""
    summary, outs = _stream_sample(spark, tmp_path)
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


# ----------------------------------------------------------------------------- real Maxwell shapes

BOOTSTRAP_SAMPLE = ROOT / "examples" / "maxwell_bootstrap.jsonl"
BOOTSTRAP_RULES = ROOT / "examples" / "maxwell_bootstrap.toml"
TS = 1_767_225_600  # Maxwell's ts, seconds
CONTENT_ID = r"#[0-9a-f]{16}"


def _doc(events: dict[str, Any], **rule: Any) -> dict[str, Any]:
    maxwell = {"database": "shop", "table": "orders", "primary_key": "id", "events": events}
    return {
        "input": {"key": "order_id", "time": "ts", "sequence": "seq"},
        "rules": {
            "unpaid": {
                "open": ["created"],
                "complete": ["paid"],
                "cancel": ["cancelled"],
                "timeout": "30m",
                "maxwell": maxwell,
                **rule,
            }
        },
    }


ORDERS = _doc({"created": "insert", "paid": "status: created -> paid", "cancelled": "delete"})


def _row(kind: str, key: int | None, ts: int = TS, status: str = "created", **extra: Any) -> str:
    """One Maxwell record of shop.orders (no xid, no position unless given)."""
    record: dict[str, Any] = {"database": "shop", "table": "orders", "type": kind, "ts": ts}
    record.update(extra)
    if "data" not in record:
        record["data"] = {} if key is None else {"id": key, "status": status}
    return json.dumps(record, separators=(",", ":"))


def _normalize(spark: Any, lines: list[str], rules: Rules) -> tuple[dict[str, Any], dict[str, str]]:
    """Run ``lines`` through maxwell_records: (record fields by raw line, reason by raw line).

    A line that becomes several records maps to a list of them.
    """
    records, rejected = maxwell_records(
        spark.createDataFrame([(x,) for x in lines], "value string"), rules
    )
    got: dict[str, Any] = {}
    for r in records.collect():
        fields = {
            "id": r["f_event_id"],
            "type": r["f_type"],
            "time": int(r["f_ts"]),
            "seq": int(r["f_seq"]),
            "key": r["f_order_id"],
            "malformed": r["malformed"],
        }
        got.setdefault(r["raw"], []).append(fields)
    reasons = {r["raw"]: r["reason"] for r in rejected.collect()}
    return {raw: v[0] if len(v) == 1 else v for raw, v in got.items()}, reasons


def test_rules_carry_their_maxwell_tables(tmp_path: Path) -> None:
    """One loader: load_rules/parse_rules read the maxwell tables; errors name file and table."""
    rules = parse_rules(_doc({"created": ["insert", "bootstrap: status = created"]}))
    (spec,) = rules.maxwell
    assert spec.event_types == ("created",)
    assert spec.mappings[1] == MaxwellMapping("created", "bootstrap", "status", None, "created")
    assert parse_event_spec("b", "bootstrap") == MaxwellMapping("b", "bootstrap")
    bad = [
        (_doc({"created": "whenever"}), r"\[rules\.unpaid\.maxwell\]\.events\.created: .*cannot"),
        (_doc({"shipped": "insert"}), r"\['shipped'\] are not among the rule's"),
        (_doc({"created": []}), "a pattern or a list of patterns"),
        (_doc({}), r"\[rules\.unpaid\.maxwell\]\.events: must map"),
        (_doc({"created": "insert"}) | {"input": {}}, None),  # fine without a sequence
    ]
    for doc, message in bad:
        if message is None:
            parse_rules(doc)
            continue
        with pytest.raises(MaxwellError, match=message):
            parse_rules(doc)
    path = tmp_path / "r.toml"
    path.write_text(
        RULES.read_text(encoding="utf-8").replace('primary_key = "id"', "primary_key = 7"),
        encoding="utf-8",
    )
    with pytest.raises(
        RulesError, match=r"r\.toml: \[rules\.unpaid_orders\.maxwell\]\.primary_key"
    ):
        load_rules(path)
    with pytest.raises(MaxwellError, match=r"\[input\]\.sequence"):
        check_maxwell_rules(parse_rules(_doc({"created": "insert"}) | {"input": {}}))
    with pytest.raises(MaxwellError, match=r"needs a \[rules\.NAME\.maxwell\] table"):
        check_maxwell_rules(load_rules(ROOT / "examples" / "orders.toml"))


@pytest.mark.spark
def test_commit_info_off_orders_a_second_by_a_rows_life(spark: Any) -> None:
    """No xid (output_commit_info=false): accepted, ordered by ts, then insert < update < delete."""
    update = _row("update", 7, status="paid", old={"status": "created"})
    insert = _row("insert", 7)
    delete = _row("delete", 8)
    insert8 = _row("insert", 8, ts=TS - 1)
    # two different payments of one order in one second: two events, two ids
    paid_again = _row(
        "update",
        7,
        status="paid",
        old={"status": "created"},
        data={"id": 7, "status": "paid", "amount": 2},
    )
    lines = [update, insert, insert, delete, insert8, paid_again]
    got, rejected = _normalize(spark, lines, parse_rules(ORDERS))
    assert rejected == {}
    assert len(got[insert]) == 2 and got[insert][0] == got[insert][1]  # a duplicate: one id
    first = got[insert][0]
    assert (first["type"], first["time"], first["seq"], first["key"]) == (
        "created",
        TS * 1000,
        1,
        "7",
    )
    assert re.fullmatch(rf"shop\.orders/7@{TS * 1000}{CONTENT_ID}/created", first["id"])
    assert (got[update]["type"], got[update]["seq"]) == ("paid", 2)
    assert got[update]["id"] != got[paid_again]["id"]
    assert first["seq"] < got[update]["seq"]  # the update cannot overtake its insert
    assert (got[delete]["type"], got[delete]["seq"]) == ("cancelled", 3)
    assert not any(r["malformed"] for r in [first, got[update], got[delete]])


@pytest.mark.spark
def test_binlog_position_is_the_order(spark: Any) -> None:
    """position "FILE.N:OFFSET": the file number, then the offset; it wins over xid."""
    insert = _row("insert", 5, xid=900, position="master.999999:4000")
    # the next binlog file (7 digits after 999999), a smaller offset, an older xid
    update = _row(
        "update", 5, status="paid", old={"status": "created"}, xid=10, position="master.1000000:4"
    )
    other = _row("insert", 6, xid=900, position="master.999999:4000")  # same rows event
    bad_form = _row("insert", 9, position="master:12")
    bad_file = _row("insert", 9, position=f"master.{1 << 30}:4")
    bad_offset = _row("insert", 9, position=f"master.1:{1 << 32}")
    lines = [update, insert, other, insert, bad_form, bad_file, bad_offset]
    got, rejected = _normalize(spark, lines, parse_rules(ORDERS))
    assert got[insert][0]["seq"] == (1 << 62) + (999_999 << 32) + 4000
    assert got[update]["seq"] == (1 << 62) + (1_000_000 << 32) + 4
    assert got[insert][0]["seq"] < got[update]["seq"]
    assert got[insert][0]["id"] == "shop.orders/5@master.999999:4000/created"
    assert got[insert][0] == got[insert][1]
    assert got[other]["id"] == "shop.orders/6@master.999999:4000/created"
    assert got[update]["id"] == "shop.orders/5@master.1000000:4/paid"
    assert rejected[bad_form] == "invalid field 'position': expected FILE.N:OFFSET, got master:12"
    for line in (bad_file, bad_offset):
        assert "cannot be encoded in the sequence" in rejected[line]
    assert len(rejected) == 3


@pytest.mark.spark
def test_xid_and_xoffset_order_a_transaction(spark: Any) -> None:
    """With xid: xoffset within the transaction; its last row (commit, no xoffset) last."""
    first = _row("insert", 1, xid=42, xoffset=0)
    last = _row("update", 1, status="paid", old={"status": "created"}, xid=42, commit=True)
    alone = _row("insert", 2, xid=41, commit=True)
    no_offset = _row("insert", 3, xid=43)
    big_xid = _row("insert", 4, xid=1 << 42)
    bad_xid = _row("insert", 4, xid="forty")
    big_offset = _row("insert", 4, xid=44, xoffset=(1 << 20) - 1)
    lines = [last, first, alone, no_offset, big_xid, bad_xid, big_offset]
    got, rejected = _normalize(spark, lines, parse_rules(ORDERS))
    assert got[first]["seq"] == 42 << 20
    assert got[last]["seq"] == (42 << 20) + (1 << 20) - 1
    assert got[alone]["seq"] == (41 << 20) + (1 << 20) - 1
    assert got[no_offset]["seq"] == 43 << 20
    assert got[first]["id"] == "shop.orders/1@42:0/created"
    assert got[last]["id"] == "shop.orders/1@42:0/paid"
    assert rejected == {
        big_xid: f"xid {1 << 42} cannot be encoded: expected 0 to 2^42 - 1",
        bad_xid: "xid forty cannot be encoded: expected 0 to 2^42 - 1",
        big_offset: f"xoffset {(1 << 20) - 1} cannot be encoded: expected 0 to 2^20 - 2",
    }


@pytest.mark.spark
def test_bootstrap_markers_are_counted_and_rows_follow_the_bootstrap_pattern(spark: Any) -> None:
    """bootstrap-start/complete: ignored records; bootstrap-insert: an event only by pattern."""
    where = {"position": "master.000003:1200"}
    start = _row("bootstrap-start", None, **where)
    unpaid = _row("bootstrap-insert", 2, **where)
    paid = _row("bootstrap-insert", 1, status="paid", **where)
    complete = _row("bootstrap-complete", None, ts=TS + 1, position="master.000003:1650")
    restarted = _row("bootstrap-insert", 2, ts=TS + 60, **where)  # Maxwell restarted it
    # a change of the same row in the same second, sent after the bootstrap (mixed shapes)
    change = _row("update", 2, status="paid", old={"status": "created"}, xid=7, commit=True)
    lines = [start, unpaid, paid, complete, restarted, change, unpaid]
    plain, rejected = _normalize(spark, lines, parse_rules(ORDERS))
    assert rejected == {}
    assert plain[start]["type"] == "maxwell:bootstrap-start"
    assert plain[complete]["type"] == "maxwell:bootstrap-complete"
    assert plain[unpaid][0]["type"] == "maxwell:bootstrap-insert"  # `insert` does not match it
    assert plain[start]["key"] is None
    assert re.fullmatch(
        rf"shop\.orders@{TS * 1000}{CONTENT_ID}/maxwell:bootstrap-start", plain[start]["id"]
    )
    with_pattern = _doc(
        {"created": ["insert", "bootstrap: status = created"], "paid": "status: created -> paid"}
    )
    got, rejected = _normalize(spark, lines, parse_rules(with_pattern))
    assert rejected == {}
    row = got[unpaid][0]
    assert (row["type"], row["time"], row["key"]) == ("created", TS * 1000, "2")
    assert got[unpaid][1] == row  # redelivered: a duplicate
    assert re.fullmatch(rf"shop\.orders/2@{TS * 1000}{CONTENT_ID}/created", row["id"])
    assert got[restarted]["id"] != row["id"]  # a restarted bootstrap reads again: new events
    assert got[paid]["type"] == "maxwell:bootstrap-insert"  # no pattern maps a paid row
    # by position the bootstrap row is below any xid's sequence: it comes first
    assert row["seq"] == (1 << 62) + (3 << 32) + 1200
    no_position = _row("bootstrap-insert", 2)
    got, _ = _normalize(spark, [no_position, change], parse_rules(with_pattern))
    assert got[no_position]["seq"] == 0 < got[change]["seq"]


@pytest.mark.spark
def test_malformed_and_foreign_records(spark: Any) -> None:
    """Rejected with a reason; schema changes, other tables and unmatched changes ignored."""
    ddl = json.dumps(
        {"type": "table-alter", "database": "shop", "table": "orders", "ts": TS * 1000 + 5,
         "old": {"columns": [{"name": "id"}]}, "def": {"columns": []}, "sql": "alter table"}
    )  # fmt: skip
    other = _row("insert", 1, data={"id": 1}).replace('"orders"', '"customers"')
    unmatched = _row("update", 1, status="created", old={"amount": 1})
    cases = {
        "{not json": "not a Maxwell JSON record",
        "[1, 2]": "not a Maxwell JSON record",
        _row("insert", 1, ts="soon"): "missing or invalid field 'ts'",
        _row("insert", 1, ts=1.5e9): "missing or invalid field 'ts'",
        _row("heartbeat", 1): "unknown change type heartbeat",
        _row("insert", 1, data="ENCRYPTED"): "missing or invalid field 'data'",
        _row("insert", 1).replace('"database":"shop",', ""): "missing or invalid field 'database'",
        _row("insert", None, data={"status": "created"}): "missing primary key 'id' in data",
    }
    got, rejected = _normalize(spark, [*cases, ddl, other, unmatched, "   "], parse_rules(ORDERS))
    assert rejected == cases
    assert (got[ddl]["type"], got[ddl]["time"]) == ("maxwell:table-alter", TS * 1000 + 5)
    assert got[other]["type"] == "maxwell:insert"
    assert got[unmatched]["type"] == "maxwell:update"
    assert len(got) == 3  # the blank line is no record


@pytest.mark.spark
def test_records_have_the_json_paths_shape(spark: Any, tmp_path: Path) -> None:
    """maxwell_records gives read_records' columns; parse_records accepts every record.

    Binary values (Kafka's raw bytes) work, invalid UTF-8 included; two rules that
    map one table to one event type give ONE event carrying both rules' keys.
    """
    doc = _doc({"created": "insert"})
    doc["rules"]["audit"] = {
        "key": "customer",
        "open": ["created"],
        "complete": ["audited"],
        "timeout": "1d",
        "maxwell": {"database": "shop", "table": "orders", "primary_key": "customer_id",
                    "events": {"created": "insert"}},
    }  # fmt: skip
    rules = parse_rules(doc)
    (tmp_path / "x.jsonl").write_text("{}\n", encoding="utf-8")
    json_shape = record_fields_frame(spark.read.text(str(tmp_path / "x.jsonl")), rules, "json")
    insert = _row("insert", 3, data={"id": 3, "customer_id": 77})
    raw = [
        insert.encode(),
        b'{"database":"shop","table":"orders","type":"insert","ts":1,"data":{"id":"\xff","customer_id":5}}',
        b"\xff\xfe",
    ]
    values = spark.createDataFrame([(bytearray(b),) for b in raw], "value binary")
    records, rejected = maxwell_records(values, rules)
    assert records.dtypes == json_shape.dtypes
    parsed = parse_records(records, rules).collect()
    assert [r["reason"] for r in parsed] == [None, None]
    by_key = {r["k0"]: r for r in parsed}
    assert by_key["3"]["k1"] == "77" and by_key["3"]["relevant"]
    assert by_key["\ufffd"]["k1"] == "5"  # invalid UTF-8 in a value: read as text
    assert [r["reason"] for r in rejected.collect()] == ["not a Maxwell JSON record"]


@pytest.mark.spark
def test_bootstrap_sample_end_to_end(spark: Any, tmp_path: Path) -> None:
    """examples/maxwell_bootstrap.jsonl (no xid, positions, a bootstrap) through the stream."""
    summary, outs = _stream_sample(spark, tmp_path, BOOTSTRAP_SAMPLE, BOOTSTRAP_RULES)
    assert summary["duplicates"] == 1  # the paid update of order 2, sent twice
    # 8 events of the rule, 5 not events: the request row, the markers, order 1's
    # snapshot (paid: no pattern maps it) and the schema change; none rejected
    assert summary["events"] == 13
    s = 1000
    outcomes = rows(outs["outcomes"], ["key", "outcome", "opened_at", "resolved_at"])
    assert outcomes == [
        ("2", "completed", T0, T0 + 1 * s),  # opened by the bootstrap, paid a second later
        ("3", "cancelled", T0, T0 + 300 * s),
        ("4", "expired", T0 + 60 * s, T0 + 1860 * s),
        ("5", "completed", T0 + 120 * s, T0 + 120 * s),  # insert in .000003, paid in .000004
    ]
    assert rows(outs["unmatched"], ["key"]) == []
    assert rows(outs["rejected"], ["reason"]) == []
    assert rows(outs["buffered"], ["event_id"]) == [("shop.orders/6@master.000004:900/created",)]


@pytest.mark.spark
def test_the_batch_step_reads_maxwell_as_the_stream_does(spark: Any, tmp_path: Path) -> None:
    """``delayed_operations(..., input_format="maxwell")`` and ``pipeline run --input-format
    maxwell`` give the outcomes the stream gives for the same sample."""
    from tickwheel._cli import main
    from tickwheel.pipeline import delayed_operations

    rules = load_rules(RULES)
    values = spark.read.text(str(SAMPLE))
    with delayed_operations(values, rules, input_format="maxwell", max_future=None) as ops:
        batch = sorted(tuple(r) for r in ops.outcomes.select("key", "op_id", "outcome").collect())
    _, outs = _stream_sample(spark, tmp_path, max_future_ms=None)
    assert outs["outcomes"] is not None
    stream = sorted(tuple(r) for r in outs["outcomes"].select("key", "op_id", "outcome").collect())
    assert batch == stream and batch
    code = main(["pipeline", "run", "--rules", str(RULES), "--input", str(tmp_path / "in"),
                 "--input-format", "maxwell", "--output", str(tmp_path / "cli"),
                 "--max-future", "off"])  # fmt: skip
    assert code == 0
    import pyarrow.parquet as pq

    cli = pq.read_table(tmp_path / "cli" / "outcomes").to_pydict()
    assert sorted(zip(cli["key"], cli["op_id"], cli["outcome"], strict=True)) == batch
