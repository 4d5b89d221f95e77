"""Restarts and takeovers of a stream whose state is held between micro-batches.

Generated orders in five increments, one micro-batch each, with a snapshot
every K = 3 commits (batches 0 and 3; 1, 2 and 4 hold changelogs). An
uninterrupted run records the state it holds after each batch. Then, for a
stop after K - 1, K and K + 1 batches, a first job runs that many and a second
job, a new owner, runs the rest: the state it rebuilds from the checkpoint must
equal the uninterrupted run's at that batch, and the outputs the reference's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference, feed, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.stream import micro_batch, query
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.resident import SNAPSHOT_EVERY_ENV, HeldState, ResidentState
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

K = 3
INCREMENTS = 5


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("resident")
    generate_orders(400, tmp / "gen", seed=49, files=INCREMENTS)
    files = sorted((tmp / "gen").glob("part-*.jsonl"))
    rules = write_rules(tmp / "rules.toml")
    lines = [line for file in files for line in iter_input_lines(file)]
    return {"files": files, "rules": rules, "ref": run_reference(lines, load_rules(rules))}


def _rows(tables: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    for name, table in tables.items():
        columns = [table[c].to_pylist() for c in sorted(table.column_names)]
        out[name] = sorted(zip(*columns, strict=True), key=repr)
    return out


def _run(
    orders: dict[str, Any], tmp: Path, spark: Any, held: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One job over the files fed so far; ``held`` gets the state held after each batch."""
    config = StreamConfig(
        rules_path=str(orders["rules"]), input=str(tmp / "in"), output=str(tmp / "out"),
        checkpoint=str(tmp / "ck"), partitions=2, max_files_per_trigger=1,
    )  # fmt: skip
    with FileStreamJob(config, spark=spark) as job:
        if held is not None:
            prune = job.store.prune

            def recording(commit: Any) -> None:
                resident = job.held.state
                assert resident is not None and resident.batch_id == commit.batch_id
                held.append(_rows(resident.as_tables()))
                prune(commit)

            job.store.prune = recording  # type: ignore[method-assign]
        summary: dict[str, Any] = job.run()
    return summary


@pytest.fixture(scope="module")
def uninterrupted(
    spark: Any, orders: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SNAPSHOT_EVERY_ENV, str(K))
        tmp = tmp_path_factory.mktemp("uninterrupted")
        feed(orders["files"], tmp / "in", INCREMENTS)
        held: list[dict[str, Any]] = []
        assert _run(orders, tmp, spark, held)["batches_run"] == INCREMENTS
        compare_with_reference(
            read_stream_outputs(spark, checkpoint=str(tmp / "ck")), orders["ref"]
        )
    return held


def _first_job_then_the_rest(
    orders: dict[str, Any],
    tmp: Path,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
    first: int,
    clean_end: bool,
) -> list[tuple[int, int, dict[str, Any]]]:
    """A first job over ``first`` files (ended cleanly, or losing its state as a kill
    would), then the rest of the files fed: the rebuilds the next job makes."""
    monkeypatch.setenv(SNAPSHOT_EVERY_ENV, str(K))
    feed(orders["files"][:first], tmp / "in", first)
    with monkeypatch.context() as crash:
        if not clean_end:  # as a kill would: the state held is lost, nothing written at the end
            crash.setattr(query, "end_held_state", _drop_held)
        assert _run(orders, tmp, spark)["batches_run"] == first
    feed(orders["files"][first:], tmp / "in", INCREMENTS - first, start=first)
    return _rebuilds(monkeypatch)


def _rebuilds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, dict[str, Any]]]:
    """(batch, changelogs read, rows) of each state the micro-batches rebuild."""
    seen: list[tuple[int, int, dict[str, Any]]] = []
    rebuild = micro_batch.rebuild

    def recording(*args: Any, **kwargs: Any) -> ResidentState:
        state = rebuild(*args, **kwargs)
        seen.append((state.batch_id, state.changelogs, _rows(state.as_tables())))
        return state

    monkeypatch.setattr(micro_batch, "rebuild", recording)
    return seen


@pytest.mark.parametrize(
    ("first", "clean_end", "changelogs"),
    [
        (K - 1, False, 1),  # batch 1: the snapshot of batch 0 and one changelog
        # K: batch 2, the snapshot of batch 0 and two changelogs, is the takeover's below
        (K + 1, False, 0),  # batch 3: a snapshot
        (K - 1, True, 0),  # batch 1, written whole when the first job ended
    ],
)
def test_a_restart_rebuilds_the_state_an_uninterrupted_run_held(
    spark: Any,
    orders: dict[str, Any],
    uninterrupted: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    first: int,
    clean_end: bool,
    changelogs: int,
) -> None:
    rebuilt = _first_job_then_the_rest(orders, tmp_path, spark, monkeypatch, first, clean_end)
    assert _run(orders, tmp_path, spark)["batches_run"] == INCREMENTS - first
    assert [(b, n) for b, n, _ in rebuilt] == [(first - 1, changelogs)]
    assert rebuilt[0][2] == uninterrupted[first - 1]
    outs = read_stream_outputs(spark, checkpoint=str(tmp_path / "ck"))
    compare_with_reference(outs, orders["ref"])


def test_a_takeover_rebuilds_and_never_trusts_a_state_held_before(
    spark: Any,
    orders: dict[str, Any],
    uninterrupted: list[dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart after K micro-batches, whose new owner's store is handed a state held
    for the right batch but not the attempt its commit names, with a row the
    state never had: the owner rebuilds (from the snapshot of batch 0 and two
    changelogs), and nothing of that row reaches its state or outputs."""
    rebuilt = _first_job_then_the_rest(orders, tmp_path, spark, monkeypatch, K, clean_end=False)
    opened = FileStreamJob.__enter__

    def with_a_foreign_state(job: FileStreamJob) -> FileStreamJob:
        entered = opened(job)
        import pyarrow as pa

        ghost = pa.table({"kind": ["pending"], "rule": ["payment"], "key": ["ghost"],
                          "event_id": ["ghost-1"], "time": [0], "deadline": [1]})  # fmt: skip
        job.held.state = ResidentState(
            K - 1, "t1-000000000000", 1, base=0, changelogs=2, tables={"ops": ghost}
        )
        return entered

    monkeypatch.setattr(FileStreamJob, "__enter__", with_a_foreign_state)
    _run(orders, tmp_path, spark)
    assert [(b, n) for b, n, _ in rebuilt] == [(K - 1, 2)]
    assert rebuilt[0][2] == uninterrupted[K - 1]
    outs = read_stream_outputs(spark, checkpoint=str(tmp_path / "ck"))
    compare_with_reference(outs, orders["ref"])


def _drop_held(store: Any, held: HeldState, driver_only: bool = False) -> None:
    held.drop()
