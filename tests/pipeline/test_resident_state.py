"""The state held between micro-batches and its changelog commits (``stream/resident.py``,
``stream/changelog.py``), without Spark: Arrow tables committed through a local
checkpoint, as the driver commits a small state.

A model (a list of rows per table) runs beside the store: after each commit the
resident state, and the state rebuilt from the checkpoint alone (the last
snapshot and the changelogs after it), must equal the model's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from tickwheel.pipeline.storage import LocalStorage, join  # noqa: E402
from tickwheel.pipeline.stream.changelog import (  # noqa: E402
    SNAPSHOT_MARKER,
    apply_table_changes,
    committed_tables,
    write_shutdown_snapshot,
    write_tables,
)
from tickwheel.pipeline.stream.checkpoint import Attempt, Commit, StateEntry, StateStore  # noqa: E402
from tickwheel.pipeline.stream.resident import (  # noqa: E402
    DRIVER_STATE_BYTES_ENV,
    UNMEASURED_ROW_BYTES,
    HeldState,
    default_driver_state_bytes,
    driver_state_bytes,
    next_entry,
    next_resident,
    parse_bytes,
)

SCHEMA = pa.schema([("kind", pa.string()), ("key", pa.string()), ("time", pa.int64())])
Row = tuple[str | None, str, int]


def _table(rows: list[Row]) -> Any:
    return pa.table(
        {name: [row[i] for row in rows] for i, name in enumerate(SCHEMA.names)}, schema=SCHEMA
    )


class _TableOps:
    """A provider of operations (``stream/state``) that holds one Arrow table as it is:
    what the commits here write of it is its whole, or the changes given beside it."""

    provider = "driver"

    def __init__(self, table: Any) -> None:
        self.table = table

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def whole(self) -> Any:
        return self.table

    def release(self) -> None:
        pass


NO_EVENTS = pa.table({"event_id": pa.array([], pa.string())})


def _rows(table: Any) -> list[Row]:
    return sorted(
        zip(*(c.to_pylist() for c in table.columns), strict=True), key=lambda r: (str(r[0]), r[1:])
    )


def _changes(before: list[Row], after: list[Row]) -> tuple[Any, Any]:
    """(rows added, rows removed) from ``before`` to ``after``, as multisets: what the
    partitions' marks give a micro-batch."""
    old, new = Counter(before), Counter(after)
    return _table(list((new - old).elements())), _table(list((old - new).elements()))


rows_strategy = st.lists(
    st.tuples(
        st.sampled_from(["pending", "expired", None]), st.sampled_from("abc"), st.integers(0, 3)
    ),
    max_size=12,
)


@given(before=rows_strategy, after=rows_strategy)
@settings(max_examples=200, deadline=None)
def test_changes_applied_to_the_state_before_give_the_state_after(
    before: list[Row], after: list[Row]
) -> None:
    """Whole rows as a multiset: copies, nulls and reordering included."""
    added, removed = _changes(before, after)
    assert _rows(apply_table_changes(_table(before), added, removed)) == sorted(
        after, key=lambda r: (str(r[0]), r[1:])
    )


#: The events table's columns: text that may not be valid UTF-8, nulls in numbers.
EVENTS_SCHEMA = pa.schema([("event_id", pa.string()), ("time", pa.int64()),
                           ("seq", pa.int64()), ("raw", pa.string())])  # fmt: skip
event_rows = st.lists(
    st.tuples(
        st.sampled_from(["e1", "e2", None]),
        st.sampled_from([0, 2**62, -1]),
        st.sampled_from([None, 0, 1]),
        st.sampled_from([b"{}", b"\xff\xfe", b"", b"\x00"]),
    ),
    max_size=16,
)


def _events(rows: list[tuple[Any, ...]]) -> Any:
    """``rows`` as the events table; ``raw`` viewed as text without a UTF-8 check, as
    Spark's reader gives a Kafka value's bytes."""
    columns = list(zip(*rows, strict=True)) or [(), (), (), ()]
    arrays = [
        pa.array(list(values), type=field.type if i < 3 else pa.binary())
        for i, (values, field) in enumerate(zip(columns, EVENTS_SCHEMA, strict=True))
    ]
    arrays[3] = arrays[3].view(pa.string())
    return pa.table(arrays, schema=EVENTS_SCHEMA)


@given(before=event_rows, after=event_rows, seed=st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_changes_to_the_events_table_replay_as_a_multiset(
    before: list[tuple[Any, ...]], after: list[tuple[Any, ...]], seed: Any
) -> None:
    """The replay on the events' columns: invalid UTF-8, nulls in every column, copies,
    and the removed rows in any order and in any chunks."""
    old, new = Counter(before), Counter(after)
    removed = list((old - new).elements())
    seed.shuffle(removed)
    cut = seed.randint(0, len(removed))
    removed_table = pa.concat_tables([_events(removed[:cut]), _events(removed[cut:])])
    got = apply_table_changes(_events(before), _events(list((new - old).elements())),
                              removed_table)  # fmt: skip
    got_rows = zip(*(c.cast(pa.binary()) if pa.types.is_string(c.type) else c
                     for c in got.columns), strict=True)  # fmt: skip
    as_values = Counter(tuple(v.as_py() for v in row) for row in got_rows)
    expected = Counter(tuple(v.encode() if isinstance(v, str) else v for v in row) for row in after)
    assert as_values == expected


def test_a_changelog_that_removes_a_row_its_state_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="removes 1 row"):
        apply_table_changes(_table([]), None, _table([("pending", "a", 1)]))


@pytest.mark.parametrize("every", [1, 2, 3, 10])
def test_a_snapshot_every_k_commits(every: int) -> None:
    """The first commit and every K-th after a snapshot hold the whole state; the ones
    between hold changelogs, at most K - 1 after each snapshot."""
    held, kinds = None, []
    for batch_id in range(3 * every + 1):
        entry = next_entry(held, every)
        kinds.append(entry.kind)
        ops = _TableOps(_table([]))
        held, _, _ = next_resident(batch_id, f"a{batch_id}", entry, NO_EVENTS, {}, ops)  # type: ignore[arg-type]
        assert held.changelogs < every
    expected = ["snapshot" if b % every == 0 else "changelog" for b in range(3 * every + 1)]
    assert kinds == expected


class _Model:
    """A checkpoint committing Arrow states as the driver does, beside the model's rows."""

    def __init__(self, root: Path, every: int) -> None:
        self.store = StateStore(str(root), LocalStorage())
        self.held = HeldState(every)
        self.rows: list[Row] = []
        self.batch_id = -1

    def commit(self, rows: list[Row]) -> Commit:
        """Commit the state ``rows`` as the next batch, then prune as the owner does."""
        self.batch_id += 1
        store, held = self.store, self.held
        attempt = Attempt.new(store.token)
        entry = next_entry(held.state, held.snapshot_every)
        added, removed = _changes(self.rows, rows)
        changes = {"ops.added": added, "ops.removed": removed}
        state, entry, out = next_resident(
            self.batch_id,
            attempt.tag,
            entry,
            NO_EVENTS,
            changes,
            _TableOps(_table(rows)),  # type: ignore[arg-type]
        )
        write_tables(store, store.attempt_path(self.batch_id, attempt), out)
        record = store.commit(
            Commit(self.batch_id, attempt=attempt.tag, state=entry, state_rows=state.rows)
        )
        held.hold(state)
        self.rows = rows
        store.prune(record)
        return record

    def rebuilt(self) -> list[Row]:
        return _rows(committed_tables(self.store, self.batch_id)["ops"])

    def expected(self) -> list[Row]:
        return sorted(self.rows, key=lambda r: (str(r[0]), r[1:]))


@pytest.mark.parametrize("batches", [2, 3, 4])  # K - 1, K and K + 1 with K = 3
def test_a_restart_after_k_minus_1_k_and_k_plus_1_batches_rebuilds_the_state(
    tmp_path: Path, batches: int
) -> None:
    model = _Model(tmp_path / "ck", every=3)
    for b in range(batches):
        model.commit([("pending", f"k{b}", b), ("pending", f"k{b + 1}", b + 1)])
    fresh = StateStore(str(tmp_path / "ck"), LocalStorage())  # a new process: nothing held
    assert _rows(committed_tables(fresh, model.batch_id)["ops"]) == model.expected()


def test_the_state_and_the_checkpoint_stay_bounded_over_300_batches_with_retention(
    tmp_path: Path,
) -> None:
    """Each batch opens 3 operations and expires those older than a retention of 20
    batches: the state, the rows each changelog holds and the checkpoint's files
    stay flat over 300 batches, and the state rebuilt from the checkpoint alone
    equals the model's after every batch."""
    model = _Model(tmp_path / "ck", every=10)
    state_dir = tmp_path / "ck" / "state"
    sizes, files = [], []
    for b in range(300):
        kept = [row for row in model.rows if row[2] > b - 20]
        model.commit([*kept, *[("pending", f"k{b}-{i}", b) for i in range(3)]])
        assert model.rebuilt() == model.expected(), b
        sizes.append(len(model.rows))
        files.append(sum(1 for _ in state_dir.rglob("*.parquet")))
    assert max(sizes[30:]) == max(sizes[20:30]) == 60
    # At most the chains of the last two commits: a snapshot, K - 1 changelogs of three
    # files (rows added, rows removed, the events whole), and the snapshot before (two
    # files, events and operations): 3K + 1 files.
    assert max(files) <= 3 * 10 + 1, files


def test_a_snapshot_written_at_the_end_is_where_a_rebuild_starts(tmp_path: Path) -> None:
    model = _Model(tmp_path / "ck", every=10)
    for b in range(4):
        record = model.commit([("pending", f"k{i}", i) for i in range(b + 1)])
    assert record.state is not None and record.state.kind == "changelog"
    assert write_shutdown_snapshot(model.store, model.held)
    directory = model.store.state_path(record)
    assert (Path(directory) / SNAPSHOT_MARKER).exists()
    assert not write_shutdown_snapshot(model.store, model.held)  # once
    # The next batch builds on it: a changelog that counts from the end's snapshot.
    assert next_entry(model.held.state, 10) == StateEntry(
        "changelog", base=3, after=3, changelogs=1
    )
    # The changelogs before it are no longer read: delete them, the rebuild holds.
    for b in range(1, 3):
        for path in Path(model.store.batch_dir(b)).rglob("*.parquet"):
            path.unlink()
    assert model.rebuilt() == model.expected()


def test_a_snapshot_killed_before_its_marker_is_not_read(tmp_path: Path) -> None:
    """A job killed while writing its state whole at its end leaves tables without the
    marker: the rebuild reads the changelogs, never those tables."""
    model = _Model(tmp_path / "ck", every=10)
    model.commit([("pending", "a", 1)])
    record = model.commit([("pending", "b", 2)])
    directory = model.store.state_path(record)
    write_tables(model.store, directory, {"ops": _table([("pending", "half-written", 0)])})
    assert model.rebuilt() == model.expected() == [("pending", "b", 2)]


def test_a_resident_state_is_trusted_only_for_the_commit_that_made_it(tmp_path: Path) -> None:
    model = _Model(tmp_path / "ck", every=10)
    record = model.commit([("pending", "a", 1)])
    held = model.held.state
    assert held is not None and held.matches(record)
    assert not held.matches(replace(record, attempt="t2-another"))  # another attempt's commit
    assert not held.matches(replace(record, batch_id=1))  # a later commit, by another owner


def test_an_unreadable_changelog_fails_the_rebuild_loudly(tmp_path: Path) -> None:
    model = _Model(tmp_path / "ck", every=10)
    model.commit([("pending", "a", 1)])
    record = model.commit([("pending", "b", 2)])
    directory = model.store.state_path(record)
    for path in Path(join(directory, "ops.added")).rglob("*.parquet"):
        path.write_bytes(b"not parquet")
    with pytest.raises(Exception, match=r"(?i)parquet"):
        committed_tables(model.store, 1)


def test_a_large_table_is_written_in_pieces_and_read_back_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table larger than a piece becomes several files, each one storage call, named
    in the rows' order; the restore reads them back as the one table they were."""
    from types import SimpleNamespace

    from tickwheel.pipeline.spark import frames
    from tickwheel.pipeline.stream.changelog import _read_table

    table = _table([("pending", f"k{i}", i) for i in range(500)])
    monkeypatch.setattr(frames, "PIECE_BYTES", table.nbytes // 7)
    calls: list[str] = []

    class Counting(LocalStorage):
        def create(self, path: str, data: bytes) -> None:
            calls.append(path)
            assert len(data) < table.nbytes  # never the whole table in one call
            super().create(path, data)

    storage = Counting()
    names = frames.write_arrow_parquet(table, str(tmp_path / "ops"), storage)
    assert len(names) >= 7 and names == sorted(names)
    assert sorted(p.name for p in (tmp_path / "ops").iterdir()) == names
    assert len(calls) == len(names)
    back = _read_table(SimpleNamespace(storage=storage), str(tmp_path / "ops"))
    assert back.equals(table)
    # an empty table is still one file: it holds the schema
    assert len(frames.write_arrow_parquet(table.slice(0, 0), str(tmp_path / "e"), storage)) == 1


@pytest.mark.parametrize(
    ("given", "expected"),
    [(1, 1), (4096, 4096), ("4096", 4096), ("512m", 512 * 2**20), (" 3G ", 3 * 2**30),
     ("1.5k", 1536), ("2t", 2 * 2**40), ("10b", 10)],
)  # fmt: skip
def test_a_size_is_bytes_or_a_number_with_a_binary_unit(given: Any, expected: int) -> None:
    assert parse_bytes(given, "bound") == expected


@pytest.mark.parametrize("given", [0, -1, "0", "0.5", "-3g", "", "g", "3x", "3 gb", "inf", "nan"])
def test_a_size_below_a_byte_or_unreadable_is_refused_naming_the_option(given: Any) -> None:
    with pytest.raises(ValueError, match=r"^bound must be a size of at least 1 byte .*got"):
        parse_bytes(given, "bound")


def test_the_drivers_bound_is_given_else_the_environments_else_a_share_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DRIVER_STATE_BYTES_ENV, raising=False)
    assert default_driver_state_bytes(24 * 2**30) == 3 * 2**30
    assert driver_state_bytes() == default_driver_state_bytes() > 0
    assert HeldState().driver_state_bytes == default_driver_state_bytes()
    monkeypatch.setenv(DRIVER_STATE_BYTES_ENV, "2m")
    assert driver_state_bytes() == HeldState().driver_state_bytes == 2 * 2**20
    assert HeldState(state_bytes="1k").driver_state_bytes == 1024  # given beats the environment
    monkeypatch.setenv(DRIVER_STATE_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=DRIVER_STATE_BYTES_ENV):
        HeldState()


def test_the_command_line_refuses_a_bad_bound_before_it_takes_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tickwheel._cli import main

    ck = tmp_path / "ck"
    (tmp_path / "in").mkdir()
    code = main(["pipeline", "stream", "--rules", "examples/orders.toml", "--input",
                 str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--checkpoint",
                 str(ck), "--driver-state-bytes", "0"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "error: --driver-state-bytes must be a size of at least 1 byte" in err
    assert err.rstrip().endswith("got '0'")
    assert not ck.exists()


def test_a_driver_held_state_measures_its_bytes() -> None:
    from tickwheel.pipeline.stream.resident import ResidentState
    from tickwheel.pipeline.stream.state.ops_index import OpsIndex, ops_schema

    events = pa.table({"event_id": ["a", "b"], "time": [1, 2]})
    rows = [{"kind": "pending", "rule": "r", "key": f"k{i}", "event_id": f"e{i}", "time": i,
             "deadline": i + 10} for i in range(100)]  # fmt: skip
    ops = OpsIndex(["r"], None, pa.Table.from_pylist(rows, schema=ops_schema()))
    tables = {"events": events}
    state = ResidentState(3, "t", rows=102, base=0, changelogs=3, tables=tables, ops=ops)
    assert state.provider == "driver"
    assert state.nbytes == events.nbytes + ops.nbytes > events.nbytes


def test_a_state_fits_the_driver_by_its_measured_bytes_else_by_its_rows() -> None:
    held = HeldState(state_bytes=1000)
    assert held.fits_driver(1000) and not held.fits_driver(1001)
    assert held.fits_driver(rows=1000 // UNMEASURED_ROW_BYTES)
    assert not held.fits_driver(rows=1000 // UNMEASURED_ROW_BYTES + 1)
    assert held.fits_driver(10, rows=10**9)  # measured bytes win over the rows' estimate
    assert not held.fits_driver()  # nothing known: not in the driver
