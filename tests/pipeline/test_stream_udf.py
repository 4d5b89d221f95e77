"""The stream's per-partition function alone (Arrow in, Arrow out; no Spark).

The stream feeds each partition its new events and its carried state as one
column set, and takes back outcomes, unmatched events and the next state as
another (``_PROC_OUT_SCHEMA``). These tests pin that column mapping against the
processor's own row API: two increments through the function must give what
one processor gives over all the events.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import RULES_TOML as BASE_RULES

from tickwheel.pipeline.core import Event, PartitionProcessor
from tickwheel.pipeline.rules import Rules, load_rules

pa = pytest.importorskip("pyarrow")

from tickwheel.pipeline.spark import partition as stream  # noqa: E402
from tickwheel.pipeline.spark.partition import (  # noqa: E402
    partition_function as _process_partitions,
)

# The shared payment rule with a short timeout, plus a second rule on the same key.
RULES_TOML = (
    BASE_RULES.replace('timeout = "30m"', "timeout = 100")
    + """
[rules.shipping]
open = ["packed"]
complete = ["shipped"]
timeout = 40
"""
)

IN_SCHEMA = [
    ("state_kind", "string"), ("rule", "string"), ("key", "string"), ("time", "int64"),
    ("seq", "int64"), ("event_id", "string"), ("event_type", "string"), ("deadline", "int64"),
]  # fmt: skip


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Rules:
    path: Path = tmp_path_factory.mktemp("udf") / "rules.toml"
    path.write_text(RULES_TOML, encoding="utf-8")
    return load_rules(path)


def _events(rules: Rules, seed: int, n: int, keys: int = 12) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ri = rng.randrange(len(rules.rules))
        rule = rules.rules[ri]
        etype = rng.choice([*rule.open, *rule.open, *rule.complete, *rule.cancel])
        kind = rule.kind_of(etype)
        assert kind is not None
        out.append(
            Event(ri, f"k{rng.randrange(keys)}", rng.randrange(400), 0, f"e{i:04}", kind, etype)
        )
    return sorted(out, key=lambda e: (e.time, e.seq, e.event_id, e.rule))


def _batch(rows: list[dict[str, Any]]) -> Any:
    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in IN_SCHEMA])
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _event_rows(rules: Rules, events: list[Event]) -> list[dict[str, Any]]:
    return [
        {
            "state_kind": None,
            "rule": rules.rules[e.rule].name,
            "key": e.key,
            "time": e.time,
            "seq": e.seq,
            "event_id": e.event_id,
            "event_type": e.event_type,
            "deadline": None,
        }
        for e in events
    ]


def _run(
    rules: Rules, rows: list[dict[str, Any]], start: int | None, wm: int
) -> list[dict[str, Any]]:
    # Two input batches, shuffled: the function must sort the events itself.
    random.Random(wm).shuffle(rows)
    half = len(rows) // 2
    out = _process_partitions(rules, start, wm)(iter([_batch(rows[:half]), _batch(rows[half:])]))
    rows = [row for batch in out for row in batch.to_pylist()]
    return [row for row in rows if row["kind"] != "stats"]  # the counters: see test_batch_partition


def _as_state(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function's next-state rows, as the next increment reads them back."""
    return [
        {
            "state_kind": r["kind"],
            "rule": r["rule"],
            "key": r["key"],
            "time": r["time"],
            "seq": None,
            "event_id": r["id"],
            "event_type": None,
            "deadline": r["deadline"],
        }
        for r in rows
        if r["kind"] in ("pending", "expired")
    ]


def _with_retention(rules: Rules, retention_ms: int | None) -> Rules:
    return dataclasses.replace(
        rules, input=dataclasses.replace(rules.input, retention_ms=retention_ms)
    )


@pytest.mark.parametrize("retention", [None, 150])
@pytest.mark.parametrize(("seed", "keys"), [(s, k) for s in range(6) for k in (12, 40)])
def test_increments_give_what_one_processor_gives(
    rules: Rules, seed: int, keys: int, retention: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three increments: with 40 keys most keys have no event in an increment,
    # so their state is carried around the processor (counted by the spy).
    carried: list[int] = []
    untouched_state = stream._untouched_state

    def spy(*args: Any) -> Any:
        mask = untouched_state(*args)
        carried.append(sum(mask.to_pylist()))
        return mask

    monkeypatch.setattr(stream, "_untouched_state", spy)
    rules = _with_retention(rules, retention)  # 150 ms: markers end an increment or two later
    events = _events(rules, seed, 120, keys)
    bounds = [130, 260, 400]
    rows: list[dict[str, Any]] = []
    state: list[dict[str, Any]] = []
    start = None
    for end in bounds:
        new = _event_rows(rules, [e for e in events if (start or -1) < e.time <= end])
        out = _run(rules, state + new, start, end)
        rows += out
        state = _as_state(out)
        start = end
    if keys == 40:
        assert sum(carried) > 0

    whole = PartitionProcessor(rules)
    whole.process(events, bounds[-1])
    whole.finish(bounds[-1])
    expected_outcomes = sorted(tuple(r) for r in whole.outcome_rows())
    expected_unmatched = sorted(tuple(r) for r in whole.unmatched_rows())
    expected_state = sorted(
        (s.kind, s.rule, s.key, s.event_id, s.time, s.deadline) for s in whole.export_state()
    )

    outcomes = sorted(
        (
            r["rule"],
            r["key"],
            r["id"],
            r["time"],
            r["deadline"],
            r["outcome"],
            r["resolved_at"],
            r["latency_ms"],
            r["resolve_event_id"],
        )
        for r in rows
        if r["kind"] == "outcome"
    )
    unmatched = sorted(
        (r["rule"], r["key"], r["id"], r["event_type"], r["time"], r["reason"])
        for r in rows
        if r["kind"] == "unmatched"
    )
    next_state = sorted(
        (s["state_kind"], s["rule"], s["key"], s["event_id"], s["time"], s["deadline"])
        for s in state
    )
    assert outcomes == expected_outcomes
    assert unmatched == expected_unmatched
    assert next_state == expected_state
    assert any(s["state_kind"] == "expired" for s in state)  # the markers are exercised
    if retention is not None:  # only the markers that hold at the last watermark are left
        markers = [s["time"] for s in state if s["state_kind"] == "expired"]
        assert all(time + retention > bounds[-1] for time in markers)
        keep_all = PartitionProcessor(rules, retention_ms=None)
        keep_all.process(events, bounds[-1])
        keep_all.finish(bounds[-1])
        assert len(keep_all.expired_markers()) > len(markers)  # some were dropped


def _state_row(kind: str, rule: str, key: str, time: int, **extra: Any) -> dict[str, Any]:
    row = dict.fromkeys(name for name, _ in IN_SCHEMA)
    row.update(state_kind=kind, rule=rule, key=key, time=time, **extra)
    return row


def test_state_of_untouched_keys_is_carried_unchanged(rules: Rules) -> None:
    state = [
        _state_row("expired", "payment", "quiet", 50),
        _state_row("pending", "payment", "far", 150, event_id="o1", deadline=250),
        # due by the watermark: its key's marker must go through the processor
        _state_row("expired", "payment", "due", 40),
        _state_row("pending", "payment", "due", 100, event_id="o2", deadline=200),
        # same key, other rule: an event of one rule does not touch the other's state
        _state_row("expired", "shipping", "busy", 60),
        _state_row("expired", "payment", "busy", 70),
    ]
    busy = _event_rows(
        rules, [Event(0, "busy", 210, 0, "p1", rules.rules[0].kind_of("paid") or 0, "paid")]
    )
    mask = stream._untouched_state(
        rules, pa.Table.from_pylist(busy), pa.Table.from_pylist(state), 220
    )
    assert mask.to_pylist() == [True, True, False, False, True, False]

    out = _run(rules, state + busy, 200, 220)
    got = sorted((r["kind"], r["rule"], r["key"], r["id"], r["time"], r["deadline"]) for r in out)
    assert got == [
        ("expired", "payment", "busy", None, 70, None),  # a paid without an operation keeps it
        ("expired", "payment", "due", None, 200, None),  # replaced by o2's expiry
        ("expired", "payment", "quiet", None, 50, None),
        ("expired", "shipping", "busy", None, 60, None),
        ("outcome", "payment", "due", "o2", 100, 200),
        ("pending", "payment", "far", "o1", 150, 250),
        ("unmatched", "payment", "busy", "p1", 210, None),
    ]
    assert [r["reason"] for r in out if r["kind"] == "unmatched"] == ["after_expiry"]


def test_markers_whose_retention_ended_are_dropped_not_carried(rules: Rules) -> None:
    rules = _with_retention(rules, 100)
    state = [
        _state_row("expired", "payment", "old", 120),  # 120 + 100 <= 220: dropped
        _state_row("expired", "payment", "young", 121),  # 121 + 100 > 220: carried
        _state_row("expired", "shipping", "old", 100),
        _state_row("pending", "payment", "far", 150, event_id="o1", deadline=250),
    ]
    no_events = pa.Table.from_batches([_batch([])])
    mask = stream._untouched_state(rules, no_events, pa.Table.from_pylist(state), 220)
    assert mask.to_pylist() == [False, True, False, True]
    out = _run(rules, list(state), 200, 220)
    got = sorted((r["kind"], r["rule"], r["key"], r["time"]) for r in out)
    assert got == [("expired", "payment", "young", 121), ("pending", "payment", "far", 150)]
    # with retention off, every marker is carried as it is
    out = _run(_with_retention(rules, None), list(state), 200, 220)
    assert sorted(r["key"] for r in out) == ["far", "old", "old", "young"]


def test_bad_state_is_refused_not_carried(rules: Rules) -> None:
    with pytest.raises(ValueError, match="refunds"):
        _run(rules, [_state_row("expired", "refunds", "k1", 50)], 100, 200)
    # No event touches its key, yet a pending row without a deadline is not
    # carried on silently: the processor names the problem.
    with pytest.raises(ValueError, match="needs event_id and deadline"):
        _run(rules, [_state_row("pending", "payment", "k1", 50, event_id="o1")], 100, 200)


def test_no_rows_give_no_batch(rules: Rules) -> None:
    assert list(_process_partitions(rules, None, 100)(iter([_batch([])]))) == []


def test_expired_markers_are_what_export_state_carries(rules: Rules) -> None:
    proc = PartitionProcessor(rules)
    proc.process(_events(rules, 7, 60), 400)
    proc.finish(400)
    names = [r.name for r in rules.rules]
    markers = [(names[r], k, at) for r, k, at in proc.expired_markers()]
    assert markers
    assert markers == [(s.rule, s.key, s.time) for s in proc.export_state() if s.kind == "expired"]


def test_events_converted_in_several_slices_give_the_same_rows(
    rules: Rules, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Events above the watermark (300) are held: they leave as buffered rows.
    events = _events(rules, 3, 200)
    whole = _run(rules, _event_rows(rules, events), None, 300)
    monkeypatch.setattr(stream, "SLICE_ROWS", 7)
    sliced = _run(rules, _event_rows(rules, events), None, 300)
    assert {row["kind"] for row in whole} >= {"outcome", "unmatched", "buffered"}
    assert sorted(map(repr, sliced)) == sorted(map(repr, whole))


def test_an_event_of_a_type_its_rule_does_not_use_is_an_error(rules: Rules) -> None:
    # The fan-out gives a rule only its own types; anything else is a bug upstream.
    row = _event_rows(rules, [Event(0, "k1", 10, 0, "e1", 0, "created")])[0]
    with pytest.raises(AssertionError, match=r"\('payment', 'packed'\)"):
        _run(rules, [row, {**row, "event_id": "e2", "event_type": "packed"}], None, 100)


def test_without_markers_no_expired_row_is_output(rules: Rules) -> None:
    # A marker carried in untouched (key "far") and those the run makes are both left out.
    events = _event_rows(rules, _events(rules, 5, 120))
    state = [_state_row("expired", "payment", "far", 50)]
    with_markers = _run(rules, state + events, None, 400)
    run = _process_partitions(rules, None, 400, markers=False)
    out = [row for batch in run(iter([_batch(state + events)])) for row in batch.to_pylist()]
    without = [row for row in out if row["kind"] != "stats"]
    assert any(row["kind"] == "expired" and row["key"] == "far" for row in with_markers)
    assert sorted(map(repr, without)) == sorted(
        repr(row) for row in with_markers if row["kind"] != "expired"
    )
