"""The state's versions in the checkpoint: each commit's changelog or snapshot written, and
a state rebuilt from the last snapshot and the changelogs after it
(``docs/pipeline-design.md``, "Versions of the state")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..storage import create_json, join
from .checkpoint import Commit, StateStore, fault
from .resident import HeldState, ResidentState

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from .state import OpsProvider

__all__ = [
    "SNAPSHOT_MARKER",
    "STATE_TABLES",
    "apply_table_changes",
    "committed_frames",
    "committed_tables",
    "end_held_state",
    "rebuild",
    "write_shutdown_snapshot",
    "write_tables",
]

logger = logging.getLogger(__name__)

#: The state's tables, in the order they are written.
STATE_TABLES = ("events", "ops")
#: The marker of a snapshot written after its batch's commit (at shutdown).
SNAPSHOT_MARKER = "_snapshot.json"


# -- changes -----------------------------------------------------------------------


def apply_table_changes(
    before: pa.Table, added: pa.Table | None, removed: pa.Table | None
) -> pa.Table:
    """``before`` without the rows of ``removed`` (each once per copy) and with those of
    ``added`` (None: no rows): how a rebuild replays a changelog. Vectorised in Arrow
    (:func:`_kept_rows`): O(n log n) in the rows of ``before`` and ``removed``, none
    of it per row in Python."""
    import pyarrow as pa

    remaining = before
    if removed is not None and removed.num_rows:
        remaining = before.filter(_kept_rows(before, removed.cast(before.schema)))
        missing = removed.num_rows - (before.num_rows - remaining.num_rows)
        if missing:
            raise ValueError(f"a changelog removes {missing} row(s) its state lacks")
    return remaining if added is None else pa.concat_tables([remaining, added.cast(before.schema)])


def _kept_rows(before: pa.Table, removed: pa.Table) -> pa.Array:
    """A mask over ``before``: False for each row that a copy in ``removed`` cancels.

    Rows compare whole, as a multiset: the n-th copy of a row in ``before`` is
    cancelled if ``removed`` holds at least n copies of it. The rows of ``before``
    whose every value occurs in ``removed``'s column are the candidates (a hash
    lookup a column); among them, each table's rows get their copy numbers
    (:func:`_numbered`), and one anti-join on every column and the copy number
    finds the rows kept. Nulls equal nulls, as in a multiset.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    candidates = np.arange(before.num_rows, dtype=np.int64)
    for i in range(before.num_columns):
        column = before.column(i)
        if len(candidates) < before.num_rows:  # only the rows still in the running
            column = column.take(pa.array(candidates))
        found = pc.is_in(column, value_set=removed.column(i).combine_chunks(), skip_nulls=False)
        candidates = candidates[found.to_numpy(zero_copy_only=False)]
    left, right = _join_keys(before.take(pa.array(candidates)), removed)
    keys = right.column_names
    left = _numbered(left.append_column("_row", pa.array(candidates)), keys)
    kept = left.join(_numbered(right, keys), keys=[*keys, "_copy"], join_type="left anti")
    mask = np.ones(before.num_rows, dtype=bool)
    mask[candidates] = False
    mask[kept["_row"].to_numpy()] = True
    return pa.array(mask)


def _join_keys(before: pa.Table, removed: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Both tables as join keys without nulls: a column that holds nulls in either
    becomes its values with the nulls filled, and whether each was null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    left: dict[str, pa.ChunkedArray] = {}
    right: dict[str, pa.ChunkedArray] = {}
    for i in range(before.num_columns):
        a, b = before.column(i), removed.column(i)
        if a.null_count or b.null_count:
            values = pc.drop_null(pa.chunked_array(a.chunks + b.chunks, type=a.type))
            if len(values):
                left[f"v{i}"], right[f"v{i}"] = (pc.fill_null(c, values[0]) for c in (a, b))
            left[f"n{i}"], right[f"n{i}"] = pc.is_null(a), pc.is_null(b)
        else:
            left[f"v{i}"], right[f"v{i}"] = a, b
    return pa.table(left), pa.table(right)


def _numbered(table: pa.Table, keys: list[str]) -> pa.Table:
    """``table`` sorted by ``keys``, with ``_copy``: each row's number among the rows
    equal to it in ``keys`` (0 for the first). O(n log n)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    if not n:
        return table.append_column("_copy", pa.array([], pa.int64()))
    ordered = table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for key in keys:  # a row starts a run of equal rows where any key changes
        column = ordered[key].combine_chunks()
        changed = pc.not_equal(column.slice(1), column.slice(0, n - 1))
        starts[1:] |= changed.to_numpy(zero_copy_only=False)
    positions = np.arange(n, dtype=np.int64)
    copy = positions - np.maximum.accumulate(np.where(starts, positions, 0))
    return ordered.append_column("_copy", pa.array(copy))


# -- rebuilding from storage -------------------------------------------------------


def _chain(store: StateStore, commit: Commit) -> list[Commit]:
    """The commits from the last snapshot to ``commit``, oldest first: a commit holding
    a whole state, or one whose attempt wrote a shutdown snapshot, then the
    changelogs after it. O(changelogs) reads."""
    chain = [commit]
    while True:
        current = chain[-1]
        state = current.state
        if state is None or not state.is_changelog or has_shutdown_snapshot(store, current):
            break
        assert state.after is not None
        chain.append(store.read_commit(state.after))
    chain.reverse()
    return chain


def has_shutdown_snapshot(store: StateStore, commit: Commit) -> bool:
    """Whether the attempt ``commit`` names has a whole state beside its changelog,
    written at a job's end. One look."""
    return store.storage.exists(join(store.state_path(commit), SNAPSHOT_MARKER))


def _replay(
    store: StateStore,
    chain: list[Commit],
    read: Callable[[str, str], Any],
    apply: Callable[[Any, Any, Any], Any],
    names: Sequence[str] = STATE_TABLES,
) -> dict[str, Any]:
    """The state's tables ``names`` at the end of ``chain`` (:func:`_chain`): its
    snapshot's tables, then
    each changelog in order, a table it holds whole taken as it is, another's rows
    removed and added (``apply(before, added, removed)``, None for no rows).
    ``read(path, table)`` gives a directory's rows, None when it was not written.
    A table missing from an older format's state is left out."""
    base = store.state_path(chain[0])
    state = {name: rows for name in names if (rows := read(join(base, name), name)) is not None}
    for changed in chain[1:]:
        directory = store.state_path(changed)
        whole = changed.state.whole if changed.state is not None else ()
        for name in names:
            if name in whole:
                rows = read(join(directory, name), name)
                if rows is not None:
                    state[name] = rows
                continue
            added = read(join(directory, f"{name}.added"), name)
            removed = read(join(directory, f"{name}.removed"), name)
            if name not in state:
                if added is not None:
                    state[name] = added
            elif added is not None or removed is not None:
                state[name] = apply(state[name], added, removed)
    return state


def committed_tables(
    store: StateStore, batch_id: int, commit: Commit | None = None
) -> dict[str, pa.Table]:
    """The state committed batch ``batch_id`` left (its ``commit``, read if not given),
    as Arrow tables read through the
    checkpoint's storage (no Spark): its last snapshot, then each changelog after
    it applied in order (:func:`apply_table_changes`). A table missing from an
    older format's state is left out. O(rows of the snapshot and of at most K - 1
    changelogs)."""
    return _tables(store, _chain(store, commit or store.read_commit(batch_id)))


def _tables(
    store: StateStore, chain: list[Commit], names: Sequence[str] = STATE_TABLES
) -> dict[str, pa.Table]:
    def read(path: str, _name: str) -> pa.Table | None:
        return _read_table(store, path)

    return _replay(store, chain, read, apply_table_changes, names)


def _read_table(store: StateStore, directory: str) -> pa.Table | None:
    """The Parquet files of ``directory`` as one Arrow table (None: no directory)."""
    import pyarrow as pa

    from ..storage import is_data_file

    if not store.storage.exists(directory):
        return None
    parts = [
        _parquet_table(store.storage.read_bytes(join(directory, name)))
        for name in sorted(store.storage.list_names(directory))
        if is_data_file(name)
    ]
    if not parts:
        return None
    return pa.concat_tables([p.replace_schema_metadata(None) for p in parts])


def _parquet_table(data: bytes) -> pa.Table:
    """A Parquet file's bytes as a table, read from a copy in Arrow's own memory. O(bytes).

    Over Python's ``bytes``, the reader's last reference may be dropped on one of
    Arrow's threads, which must then take the GIL; at interpreter exit it cannot,
    and the process aborts ("terminate called without an active exception").
    """
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    copy = pa.BufferOutputStream()
    copy.write(data)
    return pq.read_table(pa.BufferReader(copy.getvalue()))


def committed_frames(
    store: StateStore,
    spark: SparkSession,
    batch_id: int,
    commit: Commit | None = None,
    schemas: Mapping[str, str] | None = None,
) -> dict[str, DataFrame]:
    """The state committed batch ``batch_id`` left (its ``commit``, read if not given),
    as DataFrames read by Spark: the
    last snapshot with each changelog after it applied (``exceptAll``, then a union).
    ``schemas`` (each table's DDL) spares Spark reading the files' footers. A
    table missing from an older format's state is left out. Lazy: O(K) reads."""
    chain = _chain(store, commit or store.read_commit(batch_id))
    return _frames(store, spark, chain, schemas)


def _frames(
    store: StateStore,
    spark: SparkSession,
    chain: list[Commit],
    schemas: Mapping[str, str] | None,
    names: Sequence[str] = STATE_TABLES,
) -> dict[str, DataFrame]:
    def read(path: str, name: str) -> DataFrame | None:
        if not store.storage.exists(path):
            return None
        reader = spark.read if schemas is None else spark.read.schema(schemas[name])
        return reader.parquet(path)

    def apply(before: DataFrame, added: DataFrame | None, removed: DataFrame | None) -> DataFrame:
        after = before if removed is None else before.exceptAll(removed)
        return after if added is None else after.unionByName(added)

    return _replay(store, chain, read, apply, names)


def rebuild(
    store: StateStore,
    spark: SparkSession,
    commit: Commit,
    schemas: Mapping[str, str],
    load_ops: Callable[[DataFrame, str], OpsProvider] | None = None,
) -> ResidentState:
    """The state ``commit`` left, rebuilt from storage to be held: as Arrow in the driver
    (as :func:`committed_tables`, no Spark job); or, given ``load_ops``, the events so
    and the operations of the last snapshot read by Spark and handed to ``load_ops``
    (with the tag of the state they are), which loads them where they are held from
    now on, each changelog after it then put back and committed there in order: a
    restore reads the snapshot once and the changes, O(snapshot + changes)."""
    chain = _chain(store, commit)
    base, changelogs = chain[0].batch_id, len(chain) - 1
    state = ResidentState(commit.batch_id, commit.attempt, 0, base, changelogs)
    if load_ops is None:
        state.tables = _tables(store, chain)
    else:
        state.tables = _tables(store, chain, names=("events",))
        state.ops = _partitioned_ops(store, spark, chain, schemas, load_ops)
    state.rows = sum(t.num_rows for t in state.tables.values())
    state.rows += state.ops.rows if state.ops is not None else 0
    logger.info(
        "batch %d: its state rebuilt from the snapshot of batch %d and %d changelog(s)",
        commit.batch_id, base, changelogs,
    )  # fmt: skip
    return state


def _partitioned_ops(
    store: StateStore,
    spark: SparkSession,
    chain: list[Commit],
    schemas: Mapping[str, str],
    load_ops: Callable[[DataFrame, str], OpsProvider],
) -> OpsProvider:
    """The operations at the end of ``chain``: its snapshot's loaded by ``load_ops``, its
    changelogs' changes put back on them (read in the driver: O(changes)). A chain
    with a changelog that holds the operations whole (none since format 4 writes
    them) is replayed by Spark instead, and loaded at its end."""
    from ..spark.frames import empty_frame

    def tag(made: Commit) -> str:
        return f"{made.batch_id}:{made.attempt}"

    def read(path: str, name: str) -> pa.Table:
        table = _read_table(store, join(path, name))
        return table if table is not None else _empty_ops()

    whole = any(c.state is not None and "ops" in c.state.whole for c in chain[1:])
    replayed = chain if whole else chain[:1]
    ops = _frames(store, spark, replayed, schemas, names=("ops",)).get("ops")
    provider = load_ops(ops if ops is not None else empty_frame(spark, schemas["ops"]),
                        tag(replayed[-1]))  # fmt: skip
    for changed in [] if whole else chain[1:]:
        directory = store.state_path(changed)
        added, removed = read(directory, "ops.added"), read(directory, "ops.removed")
        provider.put_back(added, removed, tag(changed))
        provider.committed()
    return provider


def _empty_ops() -> pa.Table:
    from .state.ops_index import ops_schema

    return ops_schema().empty_table()


# -- writing ---------------------------------------------------------------------


def write_tables(
    store: StateStore, directory: str, tables: Mapping[str, Any], fresh: bool = False
) -> dict[str, int]:
    """Each table of ``tables`` into ``directory/<name>``: Arrow ones from the driver
    (:func:`~..spark.frames.write_arrow_parquet`, ``fresh`` as there; an empty change,
    ``<table>.added`` or ``.removed``, writes nothing), DataFrames by Spark's writer
    (a job each). Returns the Arrow tables' rows. O(rows)."""
    from ..spark.frames import is_arrow, write_arrow_parquet

    rows: dict[str, int] = {}
    for name, table in tables.items():
        if not is_arrow(table):  # a DataFrame: counting it would be one more job
            table.write.mode("error").parquet(join(directory, name))
            continue
        rows[name] = int(table.num_rows)
        if table.num_rows or "." not in name:  # a whole table always: it has the schema
            write_arrow_parquet(table, join(directory, name), store.storage, fresh=fresh)
    return rows


def write_shutdown_snapshot(store: StateStore, held: HeldState) -> bool:
    """Write the state ``held`` as a snapshot of its batch, if the commit of that batch
    holds only a changelog and this job still owns the checkpoint: the tables
    beside the changelog in the committed attempt's directory, then the marker
    (one new file) that makes :func:`rebuild` start there. True if written.

    A job killed midway leaves tables without the marker, which nothing reads
    and the owner's next prune deletes with the rest of the old attempt.
    """
    state = held.state
    if state is None or state.changelogs == 0 or not store.owns():
        return False
    commit = store.read_commit(state.batch_id)
    if not state.matches(commit) or has_shutdown_snapshot(store, commit):
        return False
    directory = store.state_path(commit)
    # The tables the changelog holds whole already (events) are written once.
    missing = {
        n: t for n, t in state.held().items() if not store.storage.exists(join(directory, n))
    }
    rows = write_tables(store, directory, missing)
    fault("mid_snapshot", state.batch_id)
    create_json(
        store.storage,
        join(directory, SNAPSHOT_MARKER),
        {"batch_id": state.batch_id, "attempt": state.attempt, "rows": rows,
         "owner_token": store.token},
    )  # fmt: skip
    logger.info("batch %d: its state written whole at the job's end", state.batch_id)
    state.base, state.changelogs = state.batch_id, 0
    return True


def end_held_state(store: StateStore, held: HeldState, driver_only: bool = False) -> None:
    """At a job's end: write the state ``held`` as a snapshot
    (:func:`write_shutdown_snapshot`), then let it go. A failure to write is
    logged, not raised: the changelogs hold the state already. With
    ``driver_only``, a state whose operations the executors hold is let go
    unwritten (from a thread that must not run Spark jobs)."""
    state = held.state
    if state is None:
        return
    if state.provider == "driver" or not driver_only:
        try:
            write_shutdown_snapshot(store, held)
        except Exception as exc:  # the job's outcome stands
            logger.warning("the state of batch %d was not written whole: %s", state.batch_id, exc)
    held.drop()
