"""The partitioned provider of the carried operations (``stream/state/partitioned.py``,
``stream/state/partition_store.py``): RocksDB stores on the executors, against the
driver's index and the whole state through the purgatory.

Random streams (``purgatory_model.py``) run micro-batch by micro-batch three ways:
the whole state through the purgatory, the driver's index, and the partitioned
provider, into which the driver's state moves at a random micro-batch (or which
holds it from the start). The outcomes and the state are equal after every
micro-batch, also when the stores are lost (a restore from the committed state),
when an attempt's changes never commit, and across a rules change that drops a
rule's state.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("rocksdict")

from purgatory_model import (  # noqa: E402
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

from tickwheel.pipeline.stream.state.ops_index import ALWAYS, OpsIndex  # noqa: E402
from tickwheel.pipeline.stream.state.partition_store import PartitionStore  # noqa: E402

pytestmark = pytest.mark.timeout(600)

#: Random streams a run: the fast tier (`make check`, TICKWHEEL_TEST_EXAMPLES=few) runs
#: four of the twelve.
EXAMPLES = 4 if os.environ.get("TICKWHEEL_TEST_EXAMPLES") == "few" else 12


def _stores_root(spark: Any) -> Path:
    """Where the tests' local executors keep their stores."""
    from pyspark import SparkFiles

    assert spark.sparkContext is not None
    return Path(SparkFiles.getRootDirectory()) / "tickwheel-state"


class _Checkpoint:
    """The committed states by tag, as the checkpoint would give them back on a miss."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.states: dict[str, Any] = {}

    def restore(self, tag: str) -> Any:
        from tickwheel.pipeline.spark.frames import from_arrow

        return from_arrow(self.spark, self.states[tag])


@pytest.mark.spark
@given(
    batches=micro_batches,
    retention=st.sampled_from([None, 30, 200]),
    lateness=st.sampled_from([0, 20]),
    move_at=st.integers(0, 4),
    lose_at=st.one_of(st.none(), st.integers(1, 6)),
    unlucky_at=st.one_of(st.none(), st.integers(1, 6)),
    drop_at=st.one_of(st.none(), st.integers(1, 6)),
)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_partitioned_provider_changes_nothing(
    spark: Any,
    batches: list[list[Record]],
    retention: int | None,
    lateness: int,
    move_at: int,
    lose_at: int | None,
    unlucky_at: int | None,
    drop_at: int | None,
) -> None:
    """Three ways through one random stream: the whole state, the driver's index, and the
    driver's index until micro-batch ``move_at``, the partitioned provider from then
    on. At ``lose_at`` every store is deleted (a lost executor's disk: the provider
    restores from the checkpoint); at ``unlucky_at`` an attempt's changes are put
    back but never commit, and a second attempt of the batch commits; at ``drop_at``
    a rules change drops the shipping rule's state. After every micro-batch the
    outcomes and the states are the same."""
    from pyspark.sql.utils import is_remote

    if is_remote():
        pytest.skip("the partitioned provider runs on classic sessions only")
    from tickwheel.pipeline.spark.frames import from_arrow
    from tickwheel.pipeline.stream.state.partitioned import PartitionedOps

    rules = model_rules(retention, lateness)
    stream = Stream(rules)
    whole = OPS_SCHEMA.empty_table()
    index = OpsIndex(rules.names, retention, OPS_SCHEMA.empty_table())
    checkpoint = _Checkpoint(spark)
    moved: PartitionedOps | None = None
    tag = "start"
    checkpoint.states[tag] = OPS_SCHEMA.empty_table()
    try:
        for n, records_n in enumerate(batches):
            if n == move_at:
                moved = PartitionedOps.load(
                    spark, from_arrow(spark, index.whole()), tag, rules.names, retention,
                    checkpoint.restore, "test-owner",
                )  # fmt: skip
            if n == drop_at:
                rules = model_rules(retention, lateness, shipping=False)
                stream.rules = rules
                whole = whole.filter(pa.compute.not_equal(whole["rule"], "shipping"))
                index = index.without_rules(["shipping"])
                if moved is not None:
                    moved = moved.without_rules(["shipping"])
            if n == lose_at and moved is not None:
                shutil.rmtree(_stores_root(spark), ignore_errors=True)
            step = whole_step(stream, whole, records_n)
            if step is None:
                continue
            touched = index.take_touched(step.keys, step.watermark)
            out_index = purgatory(rules, step.events, touched, step.before, step.watermark)
            index.add(made_ops(out_index))
            whole = step.next_whole
            assert results_of(out_index) == results_of(step.out), n
            if moved is not None:
                taken = moved.take_touched(step.keys, step.watermark)
                assert multiset(taken) == multiset(touched), n
                out_moved = purgatory(rules, step.events, taken, step.before, step.watermark)
                assert results_of(out_moved) == results_of(step.out), n
                if n == unlucky_at:  # an attempt that never commits
                    moved.put_back(OPS_SCHEMA.empty_table(), taken, f"{n}:lost")
                moved.put_back(made_ops(out_moved), taken, f"{n}:a")
                moved.committed()
                assert moved.rows == whole.num_rows, n
            tag = f"{n}:a"  # the commit of this micro-batch, whoever held its state
            checkpoint.states[tag] = whole
            assert multiset(index.whole()) == multiset(whole), n
        if moved is not None:
            assert multiset(moved.whole().toArrow()) == multiset(whole)
    finally:
        if moved is not None:
            moved.release()


# -- one store, without Spark -----------------------------------------------------------


def _row(key: str, due: int, kind: str = "pending", event: str = "e") -> tuple[Any, ...]:
    return (kind, "payment", key, f"{event}-{key}", 1, due, due)


def test_a_store_takes_by_key_and_by_due_watermark(tmp_path: Path) -> None:
    """A key's rows are found whole; rows due at the watermark are found with every row
    of their key when they are pending operations; rows that must always be seen
    (due at :data:`ALWAYS`) are found every time. Taking changes nothing."""
    store = PartitionStore(tmp_path / "p0")
    rows = sorted([_row("a", 100), _row("a", 500, "expired"), _row("b", 300),
                   _row("c", 900), ("pending", None, None, "x", 1, None, ALWAYS)],
                  key=lambda r: (str(r[1]), str(r[2])))  # fmt: skip
    store.write_rows(rows)
    store.finish_load("0:a")
    assert store.version == "0:a"
    by_key = store.take([_pair("payment", "c")], watermark=0)
    assert sorted(r[2] or "" for r in by_key) == ["", "c"]  # and the row always seen
    due = store.take([], watermark=100)  # a's pending op is due: all of a's rows come
    assert sorted((r[2] or "", r[0]) for r in due) == [("", "pending"), ("a", "expired"),
                                                       ("a", "pending")]  # fmt: skip
    assert store.take([], watermark=100) == due  # nothing was taken out
    assert sorted(r[2] for r in store.take([], 300) if r[2]) == ["a", "a", "b"]
    assert len(list(store.rows())) == 5
    store.close()


def _pair(rule: str, key: str) -> bytes:
    from tickwheel.pipeline.stream.state.partition_store import pair_key

    return pair_key(rule, key)


def test_a_store_applies_only_the_changes_made_on_the_state_it_holds(tmp_path: Path) -> None:
    """Changes made on another version change nothing (the lineage check); changes of
    the version held already are not applied twice; a removal of a row the store
    lacks fails loudly."""
    store = PartitionStore(tmp_path / "p0")
    store.write_rows([_row("a", 100)])
    store.finish_load("0:a")
    assert not store.apply("7:x", "8:x", [_row("b", 5)], [])
    assert store.version == "0:a" and len(list(store.rows())) == 1
    assert store.apply("0:a", "1:a", [_row("b", 5)], [_row("a", 100)[:6]])
    assert store.apply("0:a", "1:a", [_row("b", 5)], [_row("a", 100)[:6]])  # held already
    assert [r[2] for r in store.rows()] == ["b"]
    assert [r[2] for r in store.take([], 5)] == ["b"]
    with pytest.raises(ValueError, match="lacks"):
        store.apply("1:a", "2:a", [], [_row("zz", 1)[:6]])
    assert store.version == "1:a"
    store.close()


def _open_and_report(path: str, queue: Any) -> None:
    try:
        PartitionStore(Path(path)).close()
        queue.put("opened")
    except Exception as exc:  # RocksDB's lock, held by the first attempt
        queue.put(f"refused: {exc}")


def test_two_attempts_of_one_partition_cannot_both_open_its_store(tmp_path: Path) -> None:
    """While one attempt (this process) has a partition's store open, a second attempt
    in another process is refused by RocksDB's lock, and the store keeps the state
    the first leaves; once it closes, the second opens it."""
    path = tmp_path / "p0"
    first = PartitionStore(path)
    first.write_rows([_row("a", 100)])
    first.finish_load("0:a")
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    second = context.Process(target=_open_and_report, args=(str(path), queue))
    second.start()
    second.join(60)
    assert str(queue.get(timeout=60)).startswith("refused")
    assert first.apply("0:a", "1:a", [_row("b", 5)], [])
    first.close()
    again = context.Process(target=_open_and_report, args=(str(path), queue))
    again.start()
    again.join(60)
    assert queue.get(timeout=60) == "opened"
    store = PartitionStore(path)
    assert store.version == "1:a" and sorted(r[2] for r in store.rows()) == ["a", "b"]
    store.close()
