"""A micro-batch's purgatory takes in only the operations it can change
(``stream/state/ops_index.py``).

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

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from purgatory_model import (  # noqa: E402
    OPS,
    OPS_SCHEMA,
    Record,
    Stream,
    made_ops,
    micro_batches,
    model_rules,
    multiset,
    purgatory,
    results_of,
    whole_step,
)

from tickwheel.pipeline.stream.state.ops_index import OpsIndex, key_hashes  # noqa: E402

#: What the move of a state past the driver's bound logs.
PARTITIONED_FROM_NOW_ON = "partitioned on the executors from now on"


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
    rules = model_rules(retention, lateness)
    stream = Stream(rules)
    whole = OPS_SCHEMA.empty_table()
    index = OpsIndex(rules.names, retention, OPS_SCHEMA.empty_table())
    for n, records_n in enumerate(batches):
        if n == drop_at:  # the shipping rule removed, its state dropped (both ways)
            rules = model_rules(retention, lateness, shipping=False)
            stream.rules = rules
            whole = whole.filter(pa.compute.not_equal(whole["rule"], "shipping"))
            index = OpsIndex(rules.names, retention, index.whole().filter(
                pa.compute.not_equal(index.whole()["rule"], "shipping")
            ))  # fmt: skip
        step = whole_step(stream, whole, records_n)
        if step is None:
            continue
        touched = index.take_touched(step.keys, step.watermark)
        out_touched = purgatory(rules, step.events, touched, step.before, step.watermark)
        index.add(made_ops(out_touched))
        whole = step.next_whole
        assert results_of(out_touched) == results_of(step.out), n
        assert multiset(index.whole()) == multiset(whole), n
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
def test_a_stream_gives_the_same_whether_the_driver_or_the_executors_hold_its_state(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same files through the stream three times: its operations indexed in the
    driver; partitioned on the executors from the start (the bound, from the
    environment, below any state); and moved at run time, when the driver's state
    passes a bound (given in the job's options) between the first and the last
    micro-batch. Each committed state, and the outputs, are the same, and the
    reference's; the commits say who held each state, and the driver's measured
    bytes; the move is logged once, at INFO."""
    import logging

    from stream_support import compare_with_reference, feed, write_rules

    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.stream.changelog import committed_tables
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
    from tickwheel.pipeline.stream.resident import DRIVER_STATE_BYTES_ENV
    from tickwheel.pipeline.stream.start import read_stream_outputs
    from tickwheel.pipeline.stream.status import checkpoint_status
    from tickwheel.pipeline.stream.status_report import render_status

    gen = tmp_path / "gen"
    generate_orders(200, gen, seed=5, files=4)
    files = sorted(gen.glob("part-*.jsonl"))
    rules = write_rules(tmp_path / "rules.toml")
    reference = run_reference(iter_input_lines(gen), load_rules(rules))

    shares: list[float | None] = []  # the partitioned commits' share of partitions found

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
        shares.clear()
        with FileStreamJob(config, spark=spark) as job:
            commit = job.store.commit

            def recording(made: Any) -> Any:
                record = commit(made)
                held.append((record.state_provider, record.state_bytes))
                if record.state_provider == "partitioned":  # where its partitions were found
                    partitions = record.state_partitions
                    assert partitions is not None and partitions >= 1, record
                    share = record.state_local_share
                    assert share is None or 0 <= share <= 1, record
                    shares.append(share)
                ops = committed_tables(job.store, record.batch_id, record)["ops"]
                states.append(multiset(ops.select(list(OPS))))
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

    caplog.set_level(logging.INFO, logger="tickwheel.pipeline.stream.micro_batch")
    moved, held_moved = run("moved", bound=sizes[0])
    moves = [r for r in caplog.records if PARTITIONED_FROM_NOW_ON in r.getMessage()]
    assert len(moves) == 1 and "batch 2:" in moves[0].getMessage()
    assert moves[0].levelno == logging.INFO
    assert held_moved[:2] == held_indexed[:2]
    assert [by for by, _nbytes in held_moved[2:]] == ["partitioned"] * (len(files) - 2)

    monkeypatch.setenv(DRIVER_STATE_BYTES_ENV, "1")
    caplog.set_level(logging.INFO, logger="tickwheel.pipeline.stream.state.partitioned")
    partitioned, held_partitioned = run("partitioned")
    # The stores stayed where they were loaded: no micro-batch loaded them again.
    reloads = [r.getMessage() for r in caplog.records if "loaded again" in r.getMessage()]
    assert not reloads, reloads
    assert [by for by, _nbytes in held_partitioned] == ["partitioned"] * len(files)
    # On one machine every store is where its task runs: each job found all of them.
    assert set(shares) <= {None, 1.0} and shares[-1] == 1.0, shares
    status = checkpoint_status(str(tmp_path / "partitioned" / "ck"), spark=spark)
    assert status["state"]["provider"] == "partitioned"
    assert status["state"]["partitions"] >= 1 and status["state"]["partitions_local"] == 1.0
    held_by = (f"  state held by   the executors ({status['state']['partitions']} key "
               "partitions, 100% found local by the last micro-batch), ")  # fmt: skip
    assert held_by in render_status(status)
    assert indexed == moved == partitioned


@pytest.mark.spark
def test_a_restart_rebuilds_the_state_where_the_bound_then_says(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The executors hold the state while the bound is below it; a restart with a bound
    it fits rebuilds it in the driver (it moves back), and one with a bound below the
    bytes the driver measured rebuilds it partitioned, without holding it in the
    driver first. The outputs stay the reference's throughout."""
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

    caplog.set_level(logging.INFO, logger="tickwheel.pipeline.stream.micro_batch")
    run(1, "1")
    run(2, None)  # the default bound: back in the driver, its bytes measured
    run(3, "1")  # below what the driver measured: rebuilt partitioned, not moved
    assert [by for by, _nbytes in held] == ["partitioned", "driver", "partitioned"]
    assert held[1][1] is not None and held[1][1] > 1
    assert not [r for r in caplog.records if PARTITIONED_FROM_NOW_ON in r.getMessage()]


@pytest.mark.spark
@pytest.mark.connect
def test_start_stream_with_a_state_past_its_bound_partitions_it_or_stops_under_connect(
    spark: Any, tmp_path: Path
) -> None:
    """``start_stream(driver_state_bytes=)`` over files, one a micro-batch: with no bound the
    driver holds every state; with a bound the state passes after its second
    micro-batch. On a classic session the commits say the executors hold it from the
    third on, and the outputs and the last state are the unbounded run's. Under
    Spark Connect, which has no RDDs for the partitioned state, the stream stops at
    the third micro-batch with an error naming the bound and how to raise it."""
    import json

    from stream_support import compare_with_reference, connect_run, feed, write_rules

    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.stream.changelog import committed_tables
    from tickwheel.pipeline.stream.checkpoint import Commit, take_checkpoint
    from tickwheel.pipeline.stream.resident import DRIVER_STATE_BYTES_ENV
    from tickwheel.pipeline.stream.start import read_stream_outputs, start_stream

    gen = tmp_path / "gen"
    generate_orders(200, gen, seed=5, files=4)
    files = sorted(gen.glob("part-*.jsonl"))
    rules = write_rules(tmp_path / "rules.toml")
    reference = run_reference(iter_input_lines(gen), load_rules(rules))

    def start(name: str, bound: int | None) -> Any:
        work = tmp_path / name
        feed(files, work / "in", len(files))
        records = spark.readStream.option("maxFilesPerTrigger", 1).text(str(work / "in"))
        query = start_stream(
            records, rules, output=str(work / "out"), checkpoint=str(work / "ck"),
            trigger="available-now", partitions=2, driver_state_bytes=bound,
        )  # fmt: skip
        with contextlib.suppress(Exception):  # a failure is read from the query below
            assert query.awaitTermination(300), "the stream did not end in 300 s"
        return query

    def commits_of(name: str) -> list[Commit]:
        made = [
            json.loads(p.read_text())
            for p in (tmp_path / name / "ck" / "tickwheel" / "commits").glob("*")
        ]
        return sorted((Commit.from_json(m) for m in made if not m.get("fence")),
                      key=lambda c: c.batch_id)  # fmt: skip

    def run(name: str, bound: int | None) -> tuple[list[Commit], Counter[tuple[Any, ...]]]:
        work = tmp_path / name
        query = start(name, bound)
        assert query.exception() is None
        compare_with_reference(
            read_stream_outputs(spark, str(work / "out"), str(work / "ck")), reference
        )
        commits = commits_of(name)
        store = take_checkpoint(str(work / "ck"))
        try:
            last = committed_tables(store, commits[-1].batch_id, commits[-1])["ops"]
        finally:
            assert store.owner is not None
            store.owner.release()
        return commits, multiset(last.select(list(OPS)))

    unbounded, last_unbounded = run("unbounded", None)
    assert [c.batch_id for c in unbounded] == list(range(len(files)))
    assert all(c.state_provider == "driver" and c.state_bytes for c in unbounded)
    first, second = (c.state_bytes or 0 for c in unbounded[:2])
    assert first < second  # so the state passes a bound of `first` after the second batch
    if connect_run():
        query = start("bounded", first)
        error = str(query.exception())
        assert "batch 2:" in error and "under Spark Connect" in error, error
        assert "--driver-state-bytes" in error and DRIVER_STATE_BYTES_ENV in error, error
        assert [c.state_provider for c in commits_of("bounded")] == ["driver", "driver"]
        return
    bounded, last_bounded = run("bounded", first)
    providers = [(c.state_provider, c.state_bytes) for c in bounded]
    assert providers[:2] == [("driver", first), ("driver", second)]
    assert [by for by, _nbytes in providers[2:]] == ["partitioned", "partitioned"]
    assert last_bounded == last_unbounded
