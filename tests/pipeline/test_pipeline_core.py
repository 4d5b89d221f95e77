"""The per-partition processor alone (no Spark): boundaries, ties, state, and the reference."""

from __future__ import annotations

import gc
import random
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.reference import _sort_key, simulate
from tickwheel.pipeline.core import (
    Event,
    PartitionProcessor,
    StateRow,
    cyclic_gc_paused,
    marker_holds,
)
from tickwheel.pipeline.rules import DEFAULT_RETENTION_MS, Rule, parse_rules

PAY = Rule("pay", "order", ("created",), ("paid",), ("cancelled",), 100)
SHIP = Rule("ship", "order", ("packed",), ("shipped",), (), 50)
TYPES = {0: "created", 1: "paid", 2: "cancelled"}


def ev(key: str, time: int, kind: int, event_id: str, seq: int = 0, rule: int = 0) -> Event:
    types = (TYPES, {0: "packed", 1: "shipped"})[rule]
    return Event(rule, key, time, seq, event_id, kind, types[kind])


def run(
    events: list[Event],
    watermark: int | None = None,
    rules: tuple[Rule, ...] = (PAY,),
    retention_ms: int | None = DEFAULT_RETENTION_MS,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], PartitionProcessor]:
    proc = PartitionProcessor(rules, retention_ms=retention_ms)
    events = sorted(events, key=lambda e: (e.time, e.seq, e.event_id, e.rule))
    proc.process(events, watermark)
    proc.finish(watermark)
    outcomes = [tuple(r) for r in proc.outcome_rows() + proc.pending_rows()]
    unmatched = [tuple(r) for r in proc.unmatched_rows()]
    return sorted(outcomes, key=_sort_key), sorted(unmatched, key=_sort_key), proc


def outcome_of(outcomes: list[tuple[Any, ...]], op_id: str) -> tuple[Any, ...]:
    (row,) = [r for r in outcomes if r[2] == op_id]
    return row


def test_event_one_ms_before_the_deadline_completes() -> None:
    outcomes, unmatched, _ = run([ev("a", 1000, 0, "o"), ev("a", 1099, 1, "p")])
    assert outcome_of(outcomes, "o") == ("pay", "a", "o", 1000, 1100, "completed", 1099, 99, "p")
    assert unmatched == []


def test_event_exactly_at_the_deadline_finds_it_expired() -> None:
    outcomes, unmatched, _ = run([ev("a", 1000, 0, "o"), ev("a", 1100, 1, "p")])
    assert outcome_of(outcomes, "o") == ("pay", "a", "o", 1000, 1100, "expired", 1100, 100, None)
    assert unmatched == [("pay", "a", "p", "paid", 1100, "after_expiry")]


def test_operation_does_not_expire_one_ms_early() -> None:
    proc = PartitionProcessor([PAY])
    proc.process([ev("a", 0, 0, "o")])
    proc.advance_to(99)
    assert proc.take_outcomes() == []
    assert proc.num_pending == 1
    proc.advance_to(100)
    assert [r[5:7] for r in proc.take_outcomes()] == [("expired", 100)]


def test_ties_follow_sequence_then_id() -> None:
    # same millisecond: the paid event has the lower sequence, so it comes first
    outcomes, unmatched, _ = run([ev("a", 5, 0, "o", seq=1), ev("a", 5, 1, "p", seq=0)], 1000)
    assert outcome_of(outcomes, "o")[5] == "expired"
    assert unmatched == [("pay", "a", "p", "paid", 5, "no_operation")]
    # equal sequence: the event id decides ("a-open" < "b-pay")
    outcomes, unmatched, _ = run([ev("a", 5, 1, "b-pay"), ev("a", 5, 0, "a-open")], 1000)
    assert outcome_of(outcomes, "a-open")[5:7] == ("completed", 5)
    assert unmatched == []


def test_several_opens_per_key_resolve_together() -> None:
    events = [ev("k", 0, 0, "o1"), ev("k", 10, 0, "o2"), ev("k", 20, 2, "c"), ev("k", 30, 1, "p")]
    outcomes, unmatched, _ = run(events, 1000)
    assert [r[5] for r in outcomes] == ["cancelled", "cancelled"]
    assert {r[8] for r in outcomes} == {"c"}
    # the paid event finds nothing, and the last resolution was a cancel
    assert unmatched == [("pay", "k", "p", "paid", 30, "no_operation")]


def test_after_expiry_only_when_the_last_resolution_expired() -> None:
    events = [
        ev("k", 0, 0, "o1"),  # expires at 100
        ev("k", 150, 1, "late"),  # after_expiry
        ev("k", 160, 0, "o2"),
        ev("k", 170, 1, "p2"),  # completes o2
        ev("k", 180, 2, "again"),  # no_operation: the last op completed
        ev("x", 5, 1, "orphan"),  # no_operation: never opened
    ]
    outcomes, unmatched, _ = run(events, 1000)
    assert [(r[2], r[5]) for r in unmatched] == [
        ("again", "no_operation"),
        ("late", "after_expiry"),
        ("orphan", "no_operation"),
    ]
    assert [r[5] for r in outcomes] == ["expired", "completed"]


# -- retention: how long a key's expiry marker holds ---------------------------------


def _late_payments(*times: int) -> list[Event]:
    """Order o (deadline 100, so a marker at 100) and a payment of its key at each time."""
    return [ev("k", 0, 0, "o"), *(ev("k", t, 1, f"p{t}") for t in times)]


def test_marker_holds_until_its_time_plus_the_retention() -> None:
    # marker at 100, retention 50: a payment at 149 finds it, one at 150 does not
    _, unmatched, proc = run(_late_payments(149, 150, 400), 1000, retention_ms=50)
    assert [(r[2], r[5]) for r in unmatched] == [
        ("p149", "after_expiry"),
        ("p150", "no_operation"),
        ("p400", "no_operation"),
    ]
    assert proc.expired_markers() == []
    assert (marker_holds(100, 50, 149), marker_holds(100, 50, 150)) == (True, False)


def test_retention_zero_keeps_no_marker() -> None:
    _, unmatched, _ = run(_late_payments(100), 1000, retention_ms=0)
    assert [r[5] for r in unmatched] == ["no_operation"]


def test_retention_off_keeps_every_marker() -> None:
    late = 10 * DEFAULT_RETENTION_MS
    _, unmatched, proc = run(_late_payments(150, late), late, retention_ms=None)
    assert [r[5] for r in unmatched] == ["after_expiry", "after_expiry"]
    assert proc.expired_markers() == [(0, "k", 100)]
    assert proc.retention_ms is None


def test_default_retention_is_seven_days() -> None:
    assert DEFAULT_RETENTION_MS == 7 * 86_400_000
    assert PartitionProcessor([PAY]).retention_ms == DEFAULT_RETENTION_MS
    end = 100 + DEFAULT_RETENTION_MS  # the marker's time plus seven days
    proc = PartitionProcessor([PAY])
    proc.process(sorted(_late_payments(end - 1, end), key=lambda e: e.time), end)
    assert [(r[2], r[5]) for r in proc.take_unmatched()] == [
        (f"p{end - 1}", "after_expiry"),
        (f"p{end}", "no_operation"),
    ]
    # from a rules file: its [input].retention, default or set
    doc: dict[str, Any] = {"rules": {"pay": {"open": "a", "complete": "b", "timeout": 100}}}
    assert PartitionProcessor(parse_rules(doc)).retention_ms == DEFAULT_RETENTION_MS
    for text, ms in (("off", None), ("2h", 7_200_000)):
        rules = parse_rules({"input": {"retention": text}, **doc})
        assert PartitionProcessor(rules).retention_ms == ms
        assert PartitionProcessor(rules, retention_ms=5).retention_ms == 5  # an explicit one wins


def test_marker_leaves_the_exported_state_when_the_clock_reaches_its_end() -> None:
    proc = PartitionProcessor([PAY], retention_ms=50)
    proc.process([ev("k", 0, 0, "o")])
    proc.advance_to(149)
    assert proc.expired_markers() == [(0, "k", 100)]
    assert [r.kind for r in proc.export_state()] == ["expired"]
    proc.advance_to(150)
    assert proc.expired_markers() == []
    assert proc.export_state() == []


@pytest.mark.parametrize("retention", [None, 0, 30, 120])
@pytest.mark.parametrize("split", [0, 99, 100, 129, 130, 135, 200, 240])
def test_a_split_run_drops_what_one_run_ignores(retention: int | None, split: int) -> None:
    """Dropping markers at a split changes no row: later events could not find them."""
    events = sorted(
        [*_late_payments(129, 130, 231), ev("j", 30, 0, "o2"), ev("j", 135, 2, "c2")],
        key=lambda e: (e.time, e.seq, e.event_id),
    )
    whole_out, whole_unmatched, _ = run(events, 240, retention_ms=retention)
    first = PartitionProcessor([PAY], retention_ms=retention)
    first.process(events, split)
    first.finish(split)
    rows_out, rows_un = first.outcome_rows(), first.unmatched_rows()
    second = PartitionProcessor(
        [PAY], state=first.export_state(), start_ms=split, retention_ms=retention
    )
    second.process(second.take_buffered(), 240)
    second.finish(240)
    outcomes = [tuple(r) for r in rows_out + second.outcome_rows() + second.pending_rows()]
    unmatched = [tuple(r) for r in rows_un + second.unmatched_rows()]
    assert sorted(outcomes, key=_sort_key) == whole_out
    assert sorted(unmatched, key=_sort_key) == whole_unmatched


def test_watermark_buffers_later_events_and_leaves_pending() -> None:
    events = [ev("a", 0, 0, "o1"), ev("b", 50, 0, "o2"), ev("b", 120, 1, "p")]
    outcomes, unmatched, proc = run(events, watermark=110)
    assert outcome_of(outcomes, "o1")[5] == "expired"  # deadline 100 <= 110
    assert outcome_of(outcomes, "o2")[5:] == ("pending", None, None, None)  # deadline 150
    assert unmatched == []
    assert [e.event_id for e in proc.buffered_events()] == ["p"]
    assert proc.now_ms == 110


def test_rules_are_independent_on_the_same_key() -> None:
    events = [ev("k", 0, 0, "c", rule=0), ev("k", 0, 0, "pk", rule=1), ev("k", 60, 1, "s", rule=1)]
    outcomes, _, _ = run(events, 1000, rules=(PAY, SHIP))
    assert {(r[0], r[5]) for r in outcomes} == {("pay", "expired"), ("ship", "expired")}
    # the ship op (timeout 50) expired at 50, before the shipped event at 60


def test_out_of_order_events_are_refused() -> None:
    proc = PartitionProcessor([PAY])
    proc.process([ev("a", 10, 0, "o")])
    with pytest.raises(ValueError, match="older than the clock"):
        proc.process([ev("a", 5, 1, "p")])


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="at least one rule"):
        PartitionProcessor([])
    with pytest.raises(ValueError, match="allowed_lateness_ms"):
        PartitionProcessor([PAY], allowed_lateness_ms=-1)
    with pytest.raises(ValueError, match="names rule 'nope'"):
        PartitionProcessor([PAY], state=[StateRow("pending", "nope", "k", "o", 0, 10, None, None)])
    for bad in (-1, 1.5, "7d", True):
        with pytest.raises(ValueError, match="retention_ms"):
            PartitionProcessor([PAY], retention_ms=bad)  # type: ignore[arg-type]


def test_finish_uses_max_event_time_minus_lateness() -> None:
    proc = PartitionProcessor([PAY], allowed_lateness_ms=30)
    proc.process([ev("a", 0, 0, "o"), ev("b", 95, 0, "o2"), ev("b", 120, 1, "p")], 90)
    proc.finish()  # watermark = max event time 120 - 30
    assert proc.now_ms == 90
    assert proc.take_outcomes() == []  # deadline 100 > 90: still pending
    assert [r.op_id for r in proc.pending_rows()] == ["o"]
    assert [e.event_id for e in proc.buffered_events()] == ["o2", "p"]


# -- state carried from one run to the next ------------------------------------------


def _stream() -> list[Event]:
    return sorted(
        [
            ev("a", 0, 0, "a1"), ev("a", 40, 1, "a2"), ev("b", 10, 0, "b1"),
            ev("b", 130, 2, "b2"), ev("c", 20, 0, "c1"), ev("c", 125, 1, "c2"),
            ev("c", 150, 0, "c3"), ev("d", 60, 1, "d1"), ev("e", 90, 0, "e1"),
            ev("e", 230, 1, "e2"), ev("f", 199, 0, "f1"), ev("f", 200, 1, "f2"),
        ],
        key=lambda e: (e.time, e.seq, e.event_id),
    )  # fmt: skip


@pytest.mark.parametrize("split", [0, 50, 100, 110, 125, 199, 200, 240])
def test_export_and_restore_state_gives_the_same_outcomes(split: int) -> None:
    events = _stream()
    whole_out, whole_unmatched, _ = run(events, 240)
    first = PartitionProcessor([PAY])
    first.process(events, split)
    first.finish(split)
    rows_out = first.outcome_rows()
    rows_un = first.unmatched_rows()
    state = first.export_state()
    assert all(isinstance(r, StateRow) for r in state)
    second = PartitionProcessor([PAY], state=state, start_ms=split)
    second.process(second.take_buffered(), 240)
    second.finish(240)
    outcomes = [tuple(r) for r in rows_out + second.outcome_rows() + second.pending_rows()]
    unmatched = [tuple(r) for r in rows_un + second.unmatched_rows()]
    assert sorted(outcomes, key=_sort_key) == whole_out
    assert sorted(unmatched, key=_sort_key) == whole_unmatched


# -- the processor against the plain reference, on random streams --------------------

EVENT = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 400),
    st.sampled_from([0, 0, 1, 1, 2]),
    st.integers(-1, 1),
    st.sampled_from([0, 1]),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(EVENT, max_size=40),
    st.integers(0, 450),
    st.sampled_from([None, 0, 1, 60, 150, DEFAULT_RETENTION_MS]),
)
def test_processor_matches_the_reference(
    raw: list[tuple[Any, ...]], watermark: int, retention: int | None
) -> None:
    rules = (PAY, SHIP)
    events = []
    for i, (key, time, kind, seq, rule) in enumerate(raw):
        kind = min(kind, 1) if rule == 1 else kind
        events.append(ev(key, time, kind, f"e{i:03d}", seq=seq, rule=rule))
    streams: dict[tuple[str, str], list[tuple[int, int, str, str, int]]] = defaultdict(list)
    for e in events:
        streams[(rules[e.rule].name, e.key)].append(
            (e.time, e.seq, e.event_id, e.event_type, e.kind)
        )
    timeouts = {"pay": 100, "ship": 50}
    ref_out, ref_unmatched, ref_buffered = simulate(streams, timeouts, watermark, retention)
    outcomes, unmatched, proc = run(events, watermark, rules, retention)
    assert outcomes == sorted(ref_out, key=_sort_key)
    assert unmatched == sorted(ref_unmatched, key=_sort_key)
    buffered = [
        (rules[e.rule].name, e.key, e.event_id, e.event_type, e.time, e.seq)
        for e in proc.buffered_events()
    ]
    assert sorted(buffered, key=_sort_key) == sorted(ref_buffered, key=_sort_key)


def test_cyclic_gc_paused_restores_the_collector_state() -> None:
    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), cyclic_gc_paused():
        raise KeyError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def test_a_run_leaves_no_cyclic_garbage() -> None:
    """The premise of running the loop with the cyclic GC paused: refcounting frees it all."""
    rng = random.Random(7)
    events = []
    for i in range(3000):
        t = rng.randrange(0, 50_000)
        events.append(ev(f"k{i % 700}", t, 0, f"o{i}"))
        if rng.random() < 0.7:  # paid or cancelled, some after the 100 ms deadline
            events.append(ev(f"k{i % 700}", t + rng.randrange(0, 150), rng.choice((1, 2)), f"r{i}"))
    events.sort(key=lambda e: (e.time, e.seq, e.event_id))
    proc = PartitionProcessor([PAY])
    gc.collect()
    with cyclic_gc_paused():
        proc.process(events, watermark_ms=40_000)
        proc.finish(40_000)
    outcomes = proc.take_outcomes()
    unmatched = proc.take_unmatched()
    assert {o[5] for o in outcomes} == {"completed", "cancelled", "expired"}
    assert unmatched and proc.num_pending and proc.buffered_events()
    assert gc.collect() == 0
    proc.close()
