"""The stream's per-partition function alone (Arrow in, Arrow out; no Spark).

The stream feeds each partition its new events and its carried state as one
column set, and takes back outcomes, unmatched events and the next state as
another (``_PROC_OUT_SCHEMA``). These tests pin that column mapping against the
processor's own row API: two increments through the function must give what
one processor gives over all the events.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import RULES_TOML as BASE_RULES

from tickwheel.pipeline.core import Event, PartitionProcessor
from tickwheel.pipeline.rules import Rules, load_rules

pa = pytest.importorskip("pyarrow")

from tickwheel.pipeline.stream import _process_partitions  # noqa: E402

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


def _events(rules: Rules, seed: int, n: int) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ri = rng.randrange(len(rules.rules))
        rule = rules.rules[ri]
        etype = rng.choice([*rule.open, *rule.open, *rule.complete, *rule.cancel])
        kind = rule.kind_of(etype)
        assert kind is not None
        out.append(
            Event(ri, f"k{rng.randrange(12)}", rng.randrange(400), 0, f"e{i:04}", kind, etype)
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
    out = list(
        _process_partitions(rules, start, wm)(iter([_batch(rows[:half]), _batch(rows[half:])]))
    )
    assert len(out) <= 1
    return out[0].to_pylist() if out else []


@pytest.mark.parametrize("seed", range(6))
def test_two_increments_give_what_one_processor_gives(rules: Rules, seed: int) -> None:
    events = _events(rules, seed, 120)
    split, end = 180, 400
    first = _run(rules, _event_rows(rules, [e for e in events if e.time <= split]), None, split)
    state = [
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
        for r in first
        if r["kind"] in ("pending", "expired")
    ]
    later = _event_rows(rules, [e for e in events if e.time > split])
    second = _run(rules, state + later, split, end)

    whole = PartitionProcessor(rules)
    whole.process(events, end)
    whole.finish(end)
    expected_outcomes = sorted(tuple(r) for r in whole.outcome_rows())
    expected_unmatched = sorted(tuple(r) for r in whole.unmatched_rows())
    expected_state = sorted(
        (s.kind, s.rule, s.key, s.event_id, s.time, s.deadline) for s in whole.export_state()
    )

    rows = first + second
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
        (r["kind"], r["rule"], r["key"], r["id"], r["time"], r["deadline"])
        for r in second
        if r["kind"] in ("pending", "expired")
    )
    assert outcomes == expected_outcomes
    assert unmatched == expected_unmatched
    assert next_state == expected_state
    assert any(r["kind"] == "expired" for r in second)  # the markers are exercised


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
