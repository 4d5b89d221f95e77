"""Both placements of the step's Arrow half give the same outputs and the same state.

Spark parses and Arrow decides: once the records are classified, the fan-out,
the purgatory and the tables run in the driver on Arrow (a small micro-batch)
or on the executors (``mapInArrow`` after a shuffle by key). This test runs
random streams of micro-batches through both, each placement carrying its own
state from one micro-batch to the next (in the driver, the operations indexed
as the stream holds them; on the executors, as frames), and after every
micro-batch compares every table, the counts, the watermark and the next
state. The records hold malformed lines and missing or bad fields, duplicates
and conflicting copies, ties, late and far-future events, two rules on
different key fields, and a retention; they come as JSON text, as bytes (a
Kafka value), as typed columns, and as Maxwell's binlog JSON.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stream_support import ROOT

from tickwheel.pipeline.rules import Rules, load_rules, parse_rules

pa = pytest.importorskip("pyarrow")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Random streams a run: the fast tier (`make check`, TICKWHEEL_TEST_EXAMPLES=few) runs
#: three, between edits; `make test` and CI run all ten.
EXAMPLES = 3 if os.environ.get("TICKWHEEL_TEST_EXAMPLES") == "few" else 10

#: The processing time of every micro-batch: the far-future guard's base.
NOW = 1_000_000_000
MAX_FUTURE = 100_000
#: Where the generated event times start.
T0 = NOW - 500_000

#: The tables compared. ``outcomes`` with its pending rows is compared in the first
#: micro-batch only: later, the driver's indexed operations reach the purgatory only
#: when touched, so its pending rows are those of the operations taken in.
TABLES = ("final_outcomes", "unmatched", "buffered", "rejected", "late")
MAXWELL_LINES = (ROOT / "examples" / "maxwell_orders.jsonl").read_text().splitlines()
MAXWELL_RULES = load_rules(ROOT / "examples" / "maxwell_orders.toml")


def _rules(lateness: int, retention: int | None) -> Rules:
    """Two rules on different key fields; ``created`` opens an operation in both."""
    return parse_rules({
        "input": {"key": "order_id", "type": "type", "time": "ts", "id": "event_id",
                  "sequence": "seq", "allowed_lateness": lateness,
                  "retention": "off" if retention is None else retention},
        "rules": {
            "payment": {"open": ["created"], "complete": ["paid"], "cancel": ["cancelled"],
                        "timeout": 30_000},
            "shipping": {"key": "customer", "open": ["created", "packed"],
                         "complete": ["shipped"], "timeout": 50_000},
        },
    })  # fmt: skip


TYPES = ("created", "paid", "cancelled", "packed", "shipped", "viewed")


@st.composite
def _record(draw: st.DrawFn, batch: int) -> dict[str, Any] | str:
    """One record: mostly valid, now and then broken, late, far in the future or a
    copy of an earlier id (the ids come from a small pool)."""
    shape = draw(st.sampled_from(["ok"] * 8 + ["malformed", "missing", "bad_time",
                                                "far_future", "bad_seq"]))  # fmt: skip
    if shape == "malformed":
        return draw(st.sampled_from(["not json", "[1, 2]", '{"event_id": "x"']))
    # Each micro-batch moves on in time; a low draw lands below the last watermark.
    ts = T0 + batch * 60_000 + draw(st.integers(-90_000, 60_000)) // 1_000 * 1_000
    record: dict[str, Any] = {
        "event_id": f"e{draw(st.integers(0, 40))}",
        "type": draw(st.sampled_from(TYPES)),
        "ts": ts,
        "order_id": f"o{draw(st.integers(0, 6))}",
        "customer": f"c{draw(st.integers(0, 3))}",
        "seq": draw(st.integers(0, 2)),
    }
    if shape == "missing":
        del record[draw(st.sampled_from(["event_id", "type", "ts", "order_id", "customer"]))]
    elif shape == "bad_time":
        record["ts"] = draw(st.sampled_from(["yesterday", -5, "2024-13-01T00:00:00Z"]))
    elif shape == "far_future":
        record["ts"] = NOW + MAX_FUTURE + draw(st.integers(1, 10**6))
    elif shape == "bad_seq":
        record["seq"] = "first"
    return record


@st.composite
def _streams(draw: st.DrawFn) -> dict[str, Any]:
    form = draw(st.sampled_from(["json", "bytes", "columns", "maxwell"]))
    batches = draw(st.integers(2, 3))
    if form == "maxwell":  # the sample binlog, cut into micro-batches anywhere
        cuts = sorted(draw(st.lists(st.integers(0, len(MAXWELL_LINES)), min_size=batches - 1,
                                    max_size=batches - 1)))  # fmt: skip
        bounds = [0, *cuts, len(MAXWELL_LINES)]
        parts = [MAXWELL_LINES[a:b] for a, b in itertools.pairwise(bounds)]
        return {"form": form, "rules": MAXWELL_RULES, "batches": parts, "max_future": None}
    records = [draw(st.lists(_record(b), max_size=25)) for b in range(batches)]
    # an exact copy of an earlier record in a later micro-batch: a duplicate across them
    if records[0] and draw(st.booleans()):
        records[-1].append(draw(st.sampled_from(records[0])))
    if form == "columns":
        records = [[r for r in batch if isinstance(r, dict)] for batch in records]
    rules = _rules(draw(st.sampled_from([0, 5_000])), draw(st.sampled_from([None, 20_000])))
    return {"form": form, "rules": rules, "batches": records, "max_future": MAX_FUTURE}


def _frame(spark: Any, form: str, batch: list[Any]) -> Any:
    """The micro-batch's records as a frame of ``form``."""
    if form == "columns":
        schema = "event_id string, type string, ts string, order_id string, " \
                 "customer string, seq string"  # fmt: skip
        fields = ("event_id", "type", "ts", "order_id", "customer", "seq")
        return spark.createDataFrame(
            [tuple(None if r.get(f) is None else str(r[f]) for f in fields) for r in batch],
            schema,
        )
    lines = [r if isinstance(r, str) else json.dumps(r) for r in batch]
    if form == "bytes":
        return spark.createDataFrame([(line.encode(),) for line in lines], "value binary")
    return spark.createDataFrame([(line,) for line in lines], "value string")


class _Carried:
    """What one placement carries from micro-batch to micro-batch."""

    def __init__(self, rules: Rules, in_driver: bool) -> None:
        from tickwheel.pipeline.stream.state.ops_index import OpsIndex

        self.rules, self.in_driver = rules, in_driver
        self.watermark: int | None = None
        self.max_time: int | None = None
        self.events: Any = None
        self.ops = OpsIndex(rules.names, rules.input.retention_ms) if in_driver else None
        self.ops_table: Any = None  # on the executors: the whole table, as a frame's rows

    def state(self, spark: Any) -> Any:
        from tickwheel.pipeline.spark.frames import from_arrow
        from tickwheel.pipeline.spark.step import CarriedState

        if self.watermark is None and self.events is None:
            return CarriedState(None, None)
        events = None if self.events is None else from_arrow(spark, self.events)
        if self.in_driver:
            return CarriedState(self.watermark, self.max_time, events, held_ops=self.ops)
        ops = None if self.ops_table is None else from_arrow(spark, self.ops_table)
        rows = (0 if self.events is None else self.events.num_rows) + (
            0 if self.ops_table is None else self.ops_table.num_rows
        )
        return CarriedState(self.watermark, self.max_time, events, ops, rows)

    def whole_ops(self) -> Any:
        return self.ops.whole() if self.in_driver else self.ops_table


def _micro_batch(
    spark: Any, case: dict[str, Any], frame: Any, carried: _Carried, expect: bool
) -> dict[str, Any]:
    """Run one micro-batch in ``carried``'s placement; what it gives, as multisets."""
    from tickwheel.pipeline.spark.frames import as_arrow
    from tickwheel.pipeline.spark.step import DelayedOperations, StepOptions

    options = StepOptions(
        partitions=2,
        max_future_ms=case["max_future"],
        now_ms=NOW,
        input_format="json" if case["form"] == "bytes" else case["form"],
        carry=True,
        rows_per_partition=10**6 if carried.in_driver else None,
        expect_driver=expect and carried.in_driver,
    )
    first = carried.watermark is None and carried.events is None
    names = [*TABLES, "events", *(["outcomes"] if first else [])]
    with DelayedOperations(frame, case["rules"], options, carried.state(spark)) as step:
        counts = step.counts()
        assert step.in_driver == carried.in_driver
        tables = {name: as_arrow(t) for name, t in step.tables(names).items()}
        changes = {name: as_arrow(t) for name, t in step.state_changes().items()}
        stats = step.stats()
        carried.watermark, carried.max_time = step.watermark, step.max_time
    carried.events = tables.pop("events")
    if carried.in_driver:
        assert carried.ops is not None
        carried.ops.add(changes["ops.added"])
    else:
        carried.ops_table = changes["ops"]
    out = {name: _multiset(table) for name, table in tables.items()}
    out["state events"] = _multiset(carried.events)
    out["state ops"] = _multiset(carried.whole_ops())
    out["counts"] = counts
    out["watermark"] = (carried.watermark, carried.max_time)
    final = {name: n for name, n in stats.outcomes.items() if name != "pending" or first}
    out["outcome counts"] = (final, stats.unmatched, stats.buffered, stats.latency)
    out["schemas"] = {name: table.schema.names for name, table in tables.items()}
    return out


def _multiset(table: Any) -> Counter[tuple[Any, ...]]:
    """A table's rows as a multiset of tuples (bytes for raw text, which may not be
    valid UTF-8 in the carried events)."""
    columns = [
        col.cast(pa.binary()).to_pylist() if pa.types.is_string(col.type) else col.to_pylist()
        for col in table.columns
    ]
    return Counter(zip(*columns, strict=True)) if columns else Counter()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=_streams(), expect=st.booleans())
def test_both_placements_give_the_same_outputs_and_state(
    spark: Any, case: dict[str, Any], expect: bool
) -> None:
    driver, executors = _Carried(case["rules"], True), _Carried(case["rules"], False)
    for number, batch in enumerate(case["batches"]):
        frame = _frame(spark, case["form"], batch)
        in_driver = _micro_batch(spark, case, frame, driver, expect)
        on_executors = _micro_batch(spark, case, frame, executors, expect)
        for name in in_driver:
            assert in_driver[name] == on_executors[name], f"micro-batch {number}: {name}"


def test_the_cases_reach_every_kind_of_record() -> None:
    """The strategy makes what the test claims: every reject reason but the
    Maxwell ones, duplicates and conflicts, late events, every form."""
    seen_forms, seen = set(), Counter[str]()

    @settings(max_examples=300, deadline=None, database=None)
    @given(case=_streams())
    def collect(case: dict[str, Any]) -> None:
        seen_forms.add(case["form"])
        ids: Counter[str] = Counter()
        for number, batch in enumerate(case["batches"]):
            for record in batch:
                if isinstance(record, str):
                    seen["malformed" if case["form"] != "maxwell" else "maxwell"] += 1
                    continue
                ids[record.get("event_id", "")] += 1
                ts = record.get("ts")
                if isinstance(ts, int) and ts > NOW + MAX_FUTURE:
                    seen["far_future"] += 1
                elif isinstance(ts, int) and ts < T0 + (number - 1) * 60_000:
                    seen["late"] += 1
        seen["copies"] += sum(n - 1 for n in ids.values() if n > 1)

    collect()
    assert seen_forms == {"json", "bytes", "columns", "maxwell"}
    assert min(seen[k] for k in ("malformed", "far_future", "late", "copies", "maxwell")) > 0
