"""A model of the stream's micro-batches without Spark, shared by the tests of the carried
operations' providers (``test_touched_ops.py``, ``test_partitioned_state.py``): the
classification before the purgatory, the purgatory itself (the partitions' own
function, Arrow in and out) over the whole state or over the rows a provider took
out as touched, and what a micro-batch gives, as multisets.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from tickwheel.pipeline.rules import Rules, parse_rules
from tickwheel.pipeline.spark.partition import IN_COLUMNS, partition_function

OPS = ("kind", "rule", "key", "event_id", "time", "deadline")
OPS_SCHEMA = pa.schema(
    [("kind", pa.string()), ("rule", pa.string()), ("key", pa.string()),
     ("event_id", pa.string()), ("time", pa.int64()), ("deadline", pa.int64())]
)  # fmt: skip
IN_SCHEMA = pa.schema(
    [(name, pa.int64() if kind == "long" else pa.string()) for name, kind in IN_COLUMNS]
)
TYPES = ("created", "paid", "cancelled", "packed", "shipped")


def model_rules(retention: int | None, lateness: int, shipping: bool = True) -> Rules:
    doc: dict[str, Any] = {
        "input": {
            "key": "order_id", "type": "type", "time": "ts", "id": "event_id",
            "allowed_lateness": lateness, "retention": "off" if retention is None else retention,
        },
        "rules": {
            "payment": {"open": ["created"], "complete": ["paid"], "cancel": ["cancelled"],
                        "timeout": 50},
        },
    }  # fmt: skip
    if shipping:
        doc["rules"]["shipping"] = {"open": ["paid", "packed"], "complete": ["shipped"],
                                    "timeout": 120}  # fmt: skip
    return parse_rules(doc)


@dataclass(frozen=True)
class Record:
    event_id: str
    key: str
    type: str
    time: int


@dataclass
class Stream:
    """What both ways share before the purgatory: the watermark, the ids seen, and the
    events above the watermark carried to the next micro-batch."""

    rules: Rules
    watermark: int | None = None
    max_time: int | None = None
    seen: set[str] = field(default_factory=set)
    carried: list[Record] = field(default_factory=list)

    def classify(self, records: list[Record]) -> tuple[list[Record], int | None, int]:
        """The micro-batch's events for the purgatory (late ones and copies dropped, the
        carried ones again), its watermark, and the watermark before it."""
        before = self.watermark
        kept = []
        for record in records:
            late = before is not None and record.time < before
            if late or record.event_id in self.seen:
                continue
            self.seen.add(record.event_id)
            kept.append(record)
        events = [*self.carried, *kept]
        times = [r.time for r in kept] + ([self.max_time] if self.max_time is not None else [])
        if times:
            self.max_time = max(times)
            lateness = self.rules.input.allowed_lateness_ms
            candidate = self.max_time - lateness
            self.watermark = candidate if before is None else max(before, candidate)
        assert self.watermark is not None or not events
        w = self.watermark
        self.carried = [r for r in events if w is not None and r.time > w]
        return events, w, before

    def fan_out(self, events: list[Record]) -> Any:
        rows = [
            {"state_kind": None, "rule": rule.name, "key": r.key, "time": r.time, "seq": 0,
             "event_id": r.event_id, "event_type": r.type, "deadline": None}
            for r in events
            for rule in self.rules.rules
            if r.type in rule.event_types
        ]  # fmt: skip
        return pa.Table.from_pylist(rows, schema=IN_SCHEMA)


def state_rows(ops: Any) -> Any:
    """Carried operations in a partition's input columns."""
    n = ops.num_rows
    return pa.table(
        {"state_kind": ops["kind"], "rule": ops["rule"], "key": ops["key"], "time": ops["time"],
         "seq": pa.nulls(n, pa.int64()), "event_id": ops["event_id"],
         "event_type": pa.nulls(n, pa.string()), "deadline": ops["deadline"]},
        schema=IN_SCHEMA,
    )  # fmt: skip


def purgatory(rules: Rules, events: Any, ops: Any, start: int | None, w: int) -> Any:
    run = partition_function(rules, start, w, markers=True, changes=True)
    table = pa.concat_tables([events, state_rows(ops)])
    batches = list(run(iter(table.to_batches())))
    return pa.Table.from_batches(batches) if batches else None


def next_ops(out: Any) -> Any:
    """The operations the output carries on: pending ones and markers (unchanged or made)."""
    import pyarrow.compute as pc

    if out is None:
        return OPS_SCHEMA.empty_table()
    rows = out.filter(pc.is_in(out["kind"], value_set=pa.array(["pending", "expired"])))
    return pa.table({
        "kind": rows["kind"], "rule": rows["rule"], "key": rows["key"],
        "event_id": rows["id"], "time": rows["time"], "deadline": rows["deadline"],
    }, schema=OPS_SCHEMA)  # fmt: skip


def made_ops(out: Any) -> Any:
    """The operations the processor made (what the next state gains)."""
    import pyarrow.compute as pc

    if out is None:
        return OPS_SCHEMA.empty_table()
    return next_ops(out.filter(pc.equal(out["change"], "added")))


def results_of(out: Any) -> dict[str, Counter[tuple[Any, ...]]]:
    """What a micro-batch gives, as multisets: its outcome, unmatched and buffered rows,
    and its counters but for the pending operations (the untouched ones are not the
    purgatory's there)."""
    import json

    if out is None:
        return {}
    rows = out.to_pylist()
    results: dict[str, Counter[tuple[Any, ...]]] = {}
    for kind in ("outcome", "unmatched", "buffered"):
        results[kind] = Counter(
            tuple(sorted((k, v) for k, v in row.items() if v is not None and k != "stats"))
            for row in rows
            if row["kind"] == kind
        )
    counters: Counter[tuple[Any, ...]] = Counter()
    for row in rows:
        if row["kind"] == "stats":
            stats = json.loads(bytes(row["stats"]).split(b"\n", 1)[0])
            for name, count in stats["outcomes"].items():
                if name != "pending":
                    counters[("outcome", name)] += count
            for name, count in stats["unmatched"].items():
                counters[("unmatched", name)] += count
            counters[("events",)] += stats["events"]
    results["counters"] = +counters
    return {kind: rows for kind, rows in results.items() if rows}  # a run of no rows: none


@dataclass(frozen=True)
class WholeStep:
    """One micro-batch of the model through the whole state: what a provider's way needs
    to run it too (the fanned-out ``events``, the ``watermark`` and the one ``before``,
    the events' ``keys`` by rule), the whole way's output, and its next state."""

    events: Any
    watermark: int
    before: int | None
    keys: dict[str, Any]
    out: Any
    next_whole: Any


def whole_step(stream: Stream, whole: Any, records: list[Record]) -> WholeStep | None:
    """Micro-batch ``records`` through the whole state ``whole`` (None: no watermark yet,
    nothing to run)."""
    events, w, before = stream.classify(records)
    if w is None:
        return None
    fanned = stream.fan_out(events)
    keys = {
        rule.name: fanned.filter(pa.compute.equal(fanned["rule"], rule.name))["key"]
        for rule in stream.rules.rules
    }
    out = purgatory(stream.rules, fanned, whole, before, w)
    return WholeStep(fanned, w, before, keys, out, next_ops(out))


def multiset(table: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row[c] for c in OPS) for row in table.to_pylist())


records = st.builds(
    Record,
    event_id=st.integers(0, 60).map(lambda i: f"e{i}"),  # ids recur: duplicates
    key=st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(0, 10**6).map(lambda i: f"n{i}")),
    type=st.sampled_from(TYPES),
    time=st.integers(1_000, 1_400),
)
micro_batches = st.lists(st.lists(records, max_size=12), min_size=1, max_size=8)
