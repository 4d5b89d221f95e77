"""A micro-batch's purgatory takes in only the operations it can change (``stream/ops_index.py``).

Random streams run in micro-batches both ways, through the partitions' own function
(Arrow in, Arrow out; no Spark): the whole carried state through the purgatory, as
before, and only the rows the index takes out as touched, the others held. The
outputs (outcomes, unmatched, buffered events, the counters) and the next state
must be equal after every micro-batch. The streams have keys that recur and keys
that do not, completions, cancels, late and duplicate events (dropped before the
purgatory, as the classify stage drops them), events above the watermark carried to
the next micro-batch, expiry markers with and without a retention, and a rules
change that drops a rule's state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.rules import Rules, parse_rules

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from tickwheel.pipeline.spark.partition import IN_COLUMNS, partition_function  # noqa: E402
from tickwheel.pipeline.stream.ops_index import OpsIndex, key_hashes  # noqa: E402

OPS = ("kind", "rule", "key", "event_id", "time", "deadline")
OPS_SCHEMA = pa.schema(
    [("kind", pa.string()), ("rule", pa.string()), ("key", pa.string()),
     ("event_id", pa.string()), ("time", pa.int64()), ("deadline", pa.int64())]
)  # fmt: skip
IN_SCHEMA = pa.schema(
    [(name, pa.int64() if kind == "long" else pa.string()) for name, kind in IN_COLUMNS]
)
TYPES = ("created", "paid", "cancelled", "packed", "shipped")


def _rules(retention: int | None, lateness: int, shipping: bool = True) -> Rules:
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


def _state_rows(ops: Any) -> Any:
    """Carried operations in a partition's input columns."""
    n = ops.num_rows
    return pa.table(
        {"state_kind": ops["kind"], "rule": ops["rule"], "key": ops["key"], "time": ops["time"],
         "seq": pa.nulls(n, pa.int64()), "event_id": ops["event_id"],
         "event_type": pa.nulls(n, pa.string()), "deadline": ops["deadline"]},
        schema=IN_SCHEMA,
    )  # fmt: skip


def _purgatory(rules: Rules, events: Any, ops: Any, start: int | None, w: int) -> Any:
    run = partition_function(rules, start, w, markers=True, changes=True)
    table = pa.concat_tables([events, _state_rows(ops)])
    batches = list(run(iter(table.to_batches())))
    return pa.Table.from_batches(batches) if batches else None


def _next_ops(out: Any) -> Any:
    """The operations the output carries on: pending ones and markers (unchanged or made)."""
    import pyarrow.compute as pc

    if out is None:
        return OPS_SCHEMA.empty_table()
    rows = out.filter(pc.is_in(out["kind"], value_set=pa.array(["pending", "expired"])))
    return pa.table({
        "kind": rows["kind"], "rule": rows["rule"], "key": rows["key"],
        "event_id": rows["id"], "time": rows["time"], "deadline": rows["deadline"],
    }, schema=OPS_SCHEMA)  # fmt: skip


def _made(out: Any) -> Any:
    """The operations the processor made (what the next state gains)."""
    import pyarrow.compute as pc

    if out is None:
        return OPS_SCHEMA.empty_table()
    return _next_ops(out.filter(pc.equal(out["change"], "added")))


def _results(out: Any) -> dict[str, Counter[tuple[Any, ...]]]:
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


def _multiset(table: Any) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(row[c] for c in OPS) for row in table.to_pylist())


records = st.builds(
    Record,
    event_id=st.integers(0, 60).map(lambda i: f"e{i}"),  # ids recur: duplicates
    key=st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(0, 10**6).map(lambda i: f"n{i}")),
    type=st.sampled_from(TYPES),
    time=st.integers(1_000, 1_400),
)
micro_batches = st.lists(st.lists(records, max_size=12), min_size=1, max_size=8)


@given(
    batches=micro_batches,
    retention=st.sampled_from([None, 30, 200]),
    lateness=st.sampled_from([0, 20]),
    drop_at=st.one_of(st.none(), st.integers(1, 7)),
)
@settings(max_examples=300, deadline=None)
def test_taking_in_only_the_touched_operations_changes_nothing(
    batches: list[list[Record]], retention: int | None, lateness: int, drop_at: int | None
) -> None:
    rules = _rules(retention, lateness)
    stream = Stream(rules)
    whole = OPS_SCHEMA.empty_table()
    index = OpsIndex(rules.names, retention, OPS_SCHEMA.empty_table())
    for n, records_n in enumerate(batches):
        if n == drop_at:  # the shipping rule removed, its state dropped (both ways)
            rules = _rules(retention, lateness, shipping=False)
            stream.rules = rules
            whole = whole.filter(pa.compute.not_equal(whole["rule"], "shipping"))
            index = OpsIndex(rules.names, retention, index.table().filter(
                pa.compute.not_equal(index.table()["rule"], "shipping")
            ))  # fmt: skip
        events, w, before = stream.classify(records_n)
        if w is None:
            continue
        fanned = stream.fan_out(events)
        out_whole = _purgatory(rules, fanned, whole, before, w)
        keys = {
            rule.name: fanned.filter(pa.compute.equal(fanned["rule"], rule.name))["key"]
            for rule in rules.rules
        }
        touched = index.take_touched(keys, w)
        out_touched = _purgatory(rules, fanned, touched, before, w)
        index.add(_made(out_touched))
        whole = _next_ops(out_whole)
        assert _results(out_touched) == _results(out_whole), n
        assert _multiset(index.table()) == _multiset(whole), n
        assert index.rows == whole.num_rows


def test_a_key_hash_is_the_same_in_any_array() -> None:
    """The hash of a (rule, key) does not depend on where the key sits: its array's
    chunks, offset and neighbours."""
    import numpy as np

    keys = pa.array(["", "a", "ab", "ba", None, "ключ", "a" * 300])
    whole = key_hashes(np.zeros(len(keys), np.int64), keys)
    for i in range(len(keys)):
        one = key_hashes(np.zeros(1, np.int64), keys.slice(i, 1))
        assert one[0] == whole[i]
    chunked = pa.chunked_array([keys.slice(0, 3), keys.slice(3)])
    assert (key_hashes(np.zeros(len(keys), np.int64), chunked) == whole).all()
    assert len(set(whole[[0, 1, 2, 3, 5, 6]].tolist())) == 6
    other_rule = key_hashes(np.ones(len(keys), np.int64), keys)
    assert not (other_rule == whole).any()


def test_touched_operations_are_found_among_many_segments() -> None:
    """Rows added over many micro-batches, merged as they grow: a key's rows are found
    wherever they are, and rows are never found twice."""
    index = OpsIndex(["payment"], None, OPS_SCHEMA.empty_table())
    for batch in range(40):
        keys = [f"k{i % 97}" if batch >= 20 else f"d{batch}-{i}" for i in range(batch * 7)]
        index.add(pa.Table.from_pylist(
            [{"kind": "pending", "rule": "payment", "key": key, "event_id": f"{batch}-{i}",
              "time": batch, "deadline": 10_000 + batch} for i, key in enumerate(keys)],
            schema=OPS_SCHEMA,
        ))  # fmt: skip
    total = index.rows
    assert total == sum(b * 7 for b in range(40))
    taken = index.take_touched({"payment": pa.array(["k5", "k5", "k96", "nobody"])}, 0)
    assert set(taken["key"].to_pylist()) == {"k5", "k96"}
    assert taken.num_rows == len(set(taken["event_id"].to_pylist()))
    assert index.rows == total - taken.num_rows
    again = index.take_touched({"payment": pa.array(["k5"])}, 0)
    assert again.num_rows == 0
    due = index.take_touched({}, 10_010)  # deadlines of batches 0..10, keys of their own
    assert sorted(set(due["time"].to_pylist())) == list(range(1, 11))


def test_the_index_measures_the_bytes_it_holds() -> None:
    """``nbytes`` is what the segments hold, Arrow and indexes: at least the rows'
    buffers, growing with the rows, shrinking once taken rows merge away."""
    index = OpsIndex(["payment"], None)
    assert index.nbytes == 0
    table = pa.Table.from_pylist(
        [{"kind": "pending", "rule": "payment", "key": f"k{i}", "event_id": f"e{i}",
          "time": i, "deadline": 10_000 + i} for i in range(1_000)],
        schema=OPS_SCHEMA,
    )  # fmt: skip
    index.add(table)
    held = index.nbytes
    assert held >= table.nbytes + 1_000 * (6 * 8 + 1)  # the rows and 7 index words a row
    index.add(table.slice(0, 10))
    assert index.nbytes > held
    index.take_touched({"payment": pa.array([f"k{i}" for i in range(900)])}, 0)
    assert index.rows == 100 and index.nbytes < held / 2  # mostly dead: merged away


def test_a_null_the_purgatory_needs_is_always_taken_in() -> None:
    """A row the purgatory would refuse is not hidden by the index: it goes in, and the
    purgatory says what is wrong with it."""
    table = pa.Table.from_pylist(
        [{"kind": "pending", "rule": "payment", "key": "a", "event_id": "x", "time": 1,
          "deadline": None},
         {"kind": "pending", "rule": "gone", "key": "b", "event_id": "y", "time": 1,
          "deadline": 9}],
        schema=OPS_SCHEMA,
    )  # fmt: skip
    index = OpsIndex(["payment"], None, table)
    assert index.take_touched({}, 0).num_rows == 2


@pytest.mark.spark
def test_a_stream_gives_the_same_whether_the_driver_or_spark_holds_its_state(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same files through the stream three times: its state held in the driver, its
    operations indexed (the micro-batches take in what they touch); held by Spark from
    the start (the bound, from the environment, below any state: they go through the
    purgatory whole); and moved at run time, when the driver's state passes a bound
    (given in the job's options) between the first and the last micro-batch. Each
    committed state, and the outputs, are the same, and the reference's; the commits
    say who held each state, and the driver's measured bytes; the move is logged once."""
    import logging

    from stream_support import compare_with_reference, feed, write_rules

    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.stream.changelog import committed_tables
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
    from tickwheel.pipeline.stream.resident import DRIVER_STATE_BYTES_ENV
    from tickwheel.pipeline.stream.start import read_stream_outputs

    gen = tmp_path / "gen"
    generate_orders(200, gen, seed=5, files=4)
    files = sorted(gen.glob("part-*.jsonl"))
    rules = write_rules(tmp_path / "rules.toml")
    reference = run_reference(iter_input_lines(gen), load_rules(rules))

    def run(name: str, bound: int | None = None) -> tuple[list[Any], list[Any]]:
        """Each commit's operations (a multiset) and (held by, bytes) of its state."""
        work = tmp_path / name
        feed(files, work / "in", len(files))
        config = StreamConfig(
            rules_path=str(rules), input=str(work / "in"), output=str(work / "out"),
            checkpoint=str(work / "ck"), max_files_per_trigger=1, partitions=2,
            driver_state_bytes=bound,
        )  # fmt: skip
        states: list[Counter[tuple[Any, ...]]] = []
        held: list[tuple[str | None, int | None]] = []
        with FileStreamJob(config, spark=spark) as job:
            commit = job.store.commit

            def recording(made: Any) -> Any:
                record = commit(made)
                held.append((record.state_provider, record.state_bytes))
                ops = committed_tables(job.store, record.batch_id, record)["ops"]
                states.append(_multiset(ops.select(list(OPS))))
                return record

            job.store.commit = recording  # type: ignore[method-assign]
            assert job.run()["batches_run"] == len(files)
            assert job.sink is not None
            compare_with_reference(
                read_stream_outputs(spark, job.sink, str(work / "ck")), reference
            )
        return states, held

    indexed, held_indexed = run("indexed")
    assert all(by == "driver" and nbytes is not None and nbytes > 0 for by, nbytes in held_indexed)
    sizes = [nbytes for _by, nbytes in held_indexed]
    assert sizes[0] < sizes[1]  # so a bound between them is passed after the second

    caplog.set_level(logging.WARNING, logger="tickwheel.pipeline.stream.micro_batch")
    moved, held_moved = run("moved", bound=sizes[0])
    moves = [r for r in caplog.records if "Spark holds it from now on" in r.getMessage()]
    assert len(moves) == 1 and "batch 2:" in moves[0].getMessage()
    assert held_moved == [*held_indexed[:2], *[("spark", None)] * (len(files) - 2)]

    monkeypatch.setenv(DRIVER_STATE_BYTES_ENV, "1")
    by_spark, held_by_spark = run("spark")
    assert held_by_spark == [("spark", None)] * len(files)
    assert indexed == moved == by_spark


@pytest.mark.spark
def test_a_restart_rebuilds_the_state_where_the_bound_then_says(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark holds the state while the bound is below it; a restart with a bound it fits
    rebuilds it in the driver (it moves back), and one with a bound below the bytes
    the driver measured rebuilds it with Spark, without holding it in the driver
    first. The outputs stay the reference's throughout."""
    import logging

    from stream_support import compare_with_reference, feed, write_rules

    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
    from tickwheel.pipeline.stream.start import read_stream_outputs

    gen = tmp_path / "gen"
    generate_orders(150, gen, seed=9, files=3)
    files = sorted(gen.glob("part-*.jsonl"))
    rules = write_rules(tmp_path / "rules.toml")
    held: list[tuple[str | None, int | None]] = []

    def run(taken: int, bound: str | None) -> None:
        feed(files[taken - 1 : taken], tmp_path / "in", 1, start=taken - 1)
        config = StreamConfig(
            rules_path=str(rules), input=str(tmp_path / "in"), output=str(tmp_path / "out"),
            checkpoint=str(tmp_path / "ck"), max_files_per_trigger=1, partitions=2,
            driver_state_bytes=bound,
        )  # fmt: skip
        with FileStreamJob(config, spark=spark) as job:
            commit = job.store.commit

            def recording(made: Any) -> Any:
                record = commit(made)
                held.append((record.state_provider, record.state_bytes))
                return record

            job.store.commit = recording  # type: ignore[method-assign]
            assert job.run()["batches_run"] == 1
            assert job.sink is not None
            lines = [line for f in files[:taken] for line in iter_input_lines(f)]
            reference = run_reference(lines, load_rules(rules))
            compare_with_reference(
                read_stream_outputs(spark, job.sink, str(tmp_path / "ck")), reference
            )

    caplog.set_level(logging.WARNING, logger="tickwheel.pipeline.stream.micro_batch")
    run(1, "1")
    run(2, None)  # the default bound: back in the driver, its bytes measured
    run(3, "1")  # below what the driver measured: rebuilt with Spark, not moved
    assert [by for by, _nbytes in held] == ["spark", "driver", "spark"]
    assert held[1][1] is not None and held[1][1] > 1
    assert not [r for r in caplog.records if "Spark holds it from now on" in r.getMessage()]


@pytest.mark.spark
@pytest.mark.connect
def test_start_stream_moves_a_state_past_its_bound_to_spark_on_either_session_kind(
    spark: Any, tmp_path: Path
) -> None:
    """``start_stream(driver_state_bytes=)`` over files, one a micro-batch: with no bound the
    driver holds every state; with a bound the state passes after its second
    micro-batch, the commits say Spark holds it from the third on. The outputs are
    the reference's both ways, and so are the last states."""
    import json

    from stream_support import compare_with_reference, feed, write_rules

    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.stream.changelog import committed_tables
    from tickwheel.pipeline.stream.checkpoint import Commit, take_checkpoint
    from tickwheel.pipeline.stream.start import read_stream_outputs, start_stream

    gen = tmp_path / "gen"
    generate_orders(200, gen, seed=5, files=4)
    files = sorted(gen.glob("part-*.jsonl"))
    rules = write_rules(tmp_path / "rules.toml")
    reference = run_reference(iter_input_lines(gen), load_rules(rules))

    def run(name: str, bound: int | None) -> tuple[list[Commit], Counter[tuple[Any, ...]]]:
        work = tmp_path / name
        feed(files, work / "in", len(files))
        records = spark.readStream.option("maxFilesPerTrigger", 1).text(str(work / "in"))
        query = start_stream(
            records, rules, output=str(work / "out"), checkpoint=str(work / "ck"),
            trigger="available-now", partitions=2, driver_state_bytes=bound,
        )  # fmt: skip
        assert query.awaitTermination(300), "the stream did not end in 300 s"
        assert query.exception() is None
        compare_with_reference(
            read_stream_outputs(spark, str(work / "out"), str(work / "ck")), reference
        )
        made = [
            json.loads(p.read_text()) for p in (work / "ck" / "tickwheel" / "commits").glob("*")
        ]
        commits = sorted((Commit.from_json(m) for m in made if not m.get("fence")),
                         key=lambda c: c.batch_id)  # fmt: skip
        store = take_checkpoint(str(work / "ck"))
        try:
            last = committed_tables(store, commits[-1].batch_id, commits[-1])["ops"]
        finally:
            assert store.owner is not None
            store.owner.release()
        return commits, _multiset(last.select(list(OPS)))

    unbounded, last_unbounded = run("unbounded", None)
    assert [c.batch_id for c in unbounded] == list(range(len(files)))
    assert all(c.state_provider == "driver" and c.state_bytes for c in unbounded)
    first, second = (c.state_bytes or 0 for c in unbounded[:2])
    assert first < second  # so the state passes a bound of `first` after the second batch
    bounded, last_bounded = run("bounded", first)
    providers = [(c.state_provider, c.state_bytes) for c in bounded]
    assert providers == [("driver", first), ("driver", second), ("spark", None), ("spark", None)]
    assert last_bounded == last_unbounded
