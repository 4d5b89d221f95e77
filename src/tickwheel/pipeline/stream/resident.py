"""The carried state held between micro-batches, and the changelogs that commit it.

A micro-batch starts from the state the previous one committed, held in this
process (:class:`ResidentState`): in the driver as Arrow tables when it is
small (:attr:`~..spark.step.Placement.small`, the states the driver collects
anyway to write them), else where Spark keeps it, a locally checkpointed
DataFrame in the executors' block managers. It is not read back from storage.

Each commit writes what changed, not the whole state. The carried operations
(``ops``) are most of a state: the commit writes the rows the purgatory made
(``state/N/<attempt>/ops.added/``) and the carried rows it took in
(``ops.removed/``), which the partitions mark as they run, so the changes are
filters of their rows (:func:`~..spark.outputs.ops_changes`), with no join
against the state before. The carried events are those above the watermark, at
most the allowed lateness's worth of them: written whole (``events/``). Every
:func:`snapshot_every`-th commit after a snapshot writes the whole state
instead, and so does the first batch, a batch after a rules change that drops
state, and a job ending on a classic session (:func:`write_shutdown_snapshot`,
a marker ``_snapshot.json`` beside the tables in the committed attempt's
directory). The commit records which in its ``state`` entry
(:func:`state_entry`): ``{"kind": "changelog", "base": S, "after": P,
"changelogs": n}`` or ``{"kind": "snapshot"}``; a commit of an older format,
which has no such entry, holds a whole state.

A restart, a takeover by another owner, and any resident state that is not
the one the last commit names (its batch id and attempt, :meth:`ResidentState.matches`)
rebuild the state from the last snapshot and the changelogs after it
(:func:`rebuild`), at most ``K - 1`` of them. Changelogs are files of the
attempt the commit names, so the fenced commit protocol covers them as it
covers whole states: what no commit names is never read.

This is how Spark's RocksDB state store commits with changelog checkpointing
(``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``):
each version's commit uploads the changelog of its writes, and a snapshot is
made once ``minDeltasForSnapshot`` (10) changelogs have accumulated since the
last one; a restart loads the last snapshot and replays the changelogs after
it. Spark's maintenance thread uploads that snapshot in the background; here
the K-th commit writes it itself, so the commit that makes a snapshot due
also makes it, and no snapshot is ever behind (a rejected alternative: a
background writer, whose snapshots a takeover would have to tell apart from
a dead owner's half-written ones).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..storage import create_json, join
from .checkpoint import (
    SNAPSHOT_EVERY,
    SNAPSHOT_EVERY_ENV,
    ResidentState,
    StateStore,
    fault,
    snapshot_base,
    snapshot_every,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SNAPSHOT_EVERY",
    "SNAPSHOT_EVERY_ENV",
    "STATE_TABLES",
    "ResidentState",
    "apply_table_changes",
    "committed_frames",
    "committed_tables",
    "end_resident_state",
    "next_resident",
    "rebuild",
    "snapshot_base",
    "snapshot_every",
    "state_entry",
    "write_shutdown_snapshot",
]

logger = logging.getLogger(__name__)

#: The state's tables, in the order they are written.
STATE_TABLES = ("events", "ops")
#: The marker of a snapshot written after its batch's commit (at shutdown).
SNAPSHOT_MARKER = "_snapshot.json"


def state_entry(previous: ResidentState | None, every: int, full: bool = False) -> dict[str, Any]:
    """The ``state`` entry of the commit after the one that left ``previous`` (None:
    no state before): a changelog on it, or a snapshot when ``full``, when there
    is nothing before, or when ``every`` - 1 changelogs follow the last snapshot
    already. O(1)."""
    if full or previous is None or previous.changelogs + 1 >= every:
        return {"kind": "snapshot"}
    return {
        "kind": "changelog",
        "base": previous.base,
        "after": previous.batch_id,
        "changelogs": previous.changelogs + 1,
    }


def next_resident(
    held: ResidentState | None,
    batch_id: int,
    attempt: str,
    entry: Mapping[str, Any],
    state: Mapping[str, Any],
    changes: Mapping[str, Any],
) -> tuple[ResidentState, dict[str, Any], dict[str, Any]]:
    """The state that batch ``batch_id``'s attempt leaves (``state``: its tables), to
    hold once it commits; the commit's ``state`` entry; and what the commit writes:
    every table whole for a snapshot ``entry`` (:func:`state_entry`); else
    ``changes`` (the rows each changed table gained and lost since ``held``:
    ``ops.added``, ``ops.removed``) and, whole, each table they do not cover
    (``events``, the events above the watermark: at most the allowed lateness's
    worth), which the entry names in ``whole``: a rebuild reads no other.

    The tables are all Arrow tables (held in the driver) or all DataFrames
    (held by Spark, locally checkpointed: their rows are counted, one job
    each). O(tables) calls.
    """
    snapshot = entry["kind"] == "snapshot"
    resident = ResidentState(
        batch_id,
        attempt,
        rows=0,
        base=batch_id if snapshot else int(entry["base"]),
        changelogs=int(entry.get("changelogs", 0)),
    )
    if all(hasattr(table, "num_rows") for table in state.values()):
        resident.tables = dict(state)
        resident.rows = sum(int(table.num_rows) for table in state.values())
    else:
        resident.frames = dict(state)
        resident.rows = sum(frame.count() for frame in state.values())
    if snapshot:
        return resident, dict(entry), dict(state)
    changed = {name.split(".")[0] for name in changes}
    whole = {name: table for name, table in state.items() if name not in changed}
    return resident, {**entry, "whole": sorted(whole)}, {**whole, **changes}


# -- changes -----------------------------------------------------------------------


def _rows(table: pa.Table) -> Iterable[tuple[Any, ...]]:
    return zip(*(column.to_pylist() for column in table.columns), strict=True)


def _table(pa: Any, schema: pa.Schema, rows: Iterable[tuple[Any, ...]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) or [() for _ in schema.names]
    arrays = [
        pa.array(list(values), type=field.type)
        for values, field in zip(columns, schema, strict=True)
    ]
    return pa.table(arrays, schema=schema)


def apply_table_changes(
    before: pa.Table, added: pa.Table | None, removed: pa.Table | None
) -> pa.Table:
    """``before`` without the rows of ``removed`` (each once per copy) and with those of
    ``added`` (None: no rows): how a rebuild replays a changelog. O(rows)."""
    import pyarrow as pa

    if removed is None or not removed.num_rows:
        return before if added is None else pa.concat_tables([before, added.cast(before.schema)])
    drop = Counter(_rows(removed))
    kept = []
    for row in _rows(before):
        if drop[row]:
            drop[row] -= 1
        else:
            kept.append(row)
    missing = +drop
    if missing:
        raise ValueError(f"a changelog removes {sum(missing.values())} row(s) its state lacks")
    remaining = _table(pa, before.schema, kept)
    return remaining if added is None else pa.concat_tables([remaining, added.cast(before.schema)])


# -- rebuilding from storage -------------------------------------------------------


def _chain(
    store: StateStore, batch_id: int, meta: Mapping[str, Any] | None
) -> list[tuple[int, dict[str, Any]]]:
    """The commits from the last snapshot to ``batch_id``'s, oldest first: a commit
    holding a whole state, or one whose attempt wrote a shutdown snapshot, then
    the changelogs after it. O(changelogs) reads."""
    chain = [(batch_id, dict(meta) if meta is not None else store.meta(batch_id))]
    while True:
        current, current_meta = chain[-1]
        entry = current_meta.get("state") or {}
        if entry.get("kind") != "changelog" or has_shutdown_snapshot(store, current, current_meta):
            break
        previous = int(entry["after"])
        chain.append((previous, store.meta(previous)))
    chain.reverse()
    return chain


def _whole(meta: Mapping[str, Any]) -> list[str]:
    """The tables a changelog's commit holds whole (a snapshot's, written later at a
    job's end, count only with their marker: :func:`has_shutdown_snapshot`)."""
    return list((meta.get("state") or {}).get("whole", []))


def has_shutdown_snapshot(store: StateStore, batch_id: int, meta: Mapping[str, Any]) -> bool:
    """Whether committed batch ``batch_id``'s attempt has a whole state beside its
    changelog, written at a job's end. One look."""
    return store.storage.exists(join(store.state_path(batch_id, meta), SNAPSHOT_MARKER))


def _replay(
    store: StateStore,
    chain: list[tuple[int, dict[str, Any]]],
    read: Callable[[str, str], Any],
    apply: Callable[[Any, Any, Any], Any],
) -> dict[str, Any]:
    """The state at the end of ``chain`` (:func:`_chain`): its snapshot's tables, then
    each changelog in order, a table it holds whole taken as it is, another's rows
    removed and added (``apply(before, added, removed)``, None for no rows).
    ``read(path, table)`` gives a directory's rows, None when it was not written.
    A table missing from an older format's state is left out."""
    base = store.state_path(*chain[0])
    state = {
        name: rows for name in STATE_TABLES if (rows := read(join(base, name), name)) is not None
    }
    for changed_id, changed_meta in chain[1:]:
        directory = store.state_path(changed_id, changed_meta)
        for name in STATE_TABLES:
            if name in _whole(changed_meta):
                whole = read(join(directory, name), name)
                if whole is not None:
                    state[name] = whole
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
    store: StateStore, batch_id: int, meta: Mapping[str, Any] | None = None
) -> dict[str, pa.Table]:
    """The state committed batch ``batch_id`` left, as Arrow tables read through the
    checkpoint's storage (no Spark): its last snapshot, then each changelog after
    it applied in order (:func:`apply_table_changes`). A table missing from an
    older format's state is left out. O(rows of the snapshot and of at most K - 1
    changelogs)."""
    return _tables(store, _chain(store, batch_id, meta))


def _tables(store: StateStore, chain: list[tuple[int, dict[str, Any]]]) -> dict[str, pa.Table]:
    return _replay(store, chain, lambda path, _name: _read_table(store, path), apply_table_changes)


def _read_table(store: StateStore, directory: str) -> pa.Table | None:
    """The Parquet files of ``directory`` as one Arrow table (None: no directory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from ..storage import is_data_file

    if not store.storage.exists(directory):
        return None
    parts = [
        pq.read_table(pa.BufferReader(store.storage.read_bytes(join(directory, name))))
        for name in sorted(store.storage.list_names(directory))
        if is_data_file(name)
    ]
    if not parts:
        return None
    return pa.concat_tables([p.replace_schema_metadata(None) for p in parts])


def committed_frames(
    store: StateStore,
    spark: SparkSession,
    batch_id: int,
    meta: Mapping[str, Any] | None = None,
    schemas: Mapping[str, str] | None = None,
) -> dict[str, DataFrame]:
    """The state committed batch ``batch_id`` left, as DataFrames read by Spark: the
    last snapshot with each changelog after it applied (``exceptAll``, then a union).
    ``schemas`` (each table's DDL) spares Spark reading the files' footers. A
    table missing from an older format's state is left out. Lazy: O(K) reads."""
    return _frames(store, spark, _chain(store, batch_id, meta), schemas)


def _frames(
    store: StateStore,
    spark: SparkSession,
    chain: list[tuple[int, dict[str, Any]]],
    schemas: Mapping[str, str] | None,
) -> dict[str, DataFrame]:
    def read(path: str, name: str) -> DataFrame | None:
        if not store.storage.exists(path):
            return None
        reader = spark.read if schemas is None else spark.read.schema(schemas[name])
        return reader.parquet(path)

    def apply(before: DataFrame, added: DataFrame | None, removed: DataFrame | None) -> DataFrame:
        after = before if removed is None else before.exceptAll(removed)
        return after if added is None else after.unionByName(added)

    return _replay(store, chain, read, apply)


def rebuild(
    store: StateStore,
    spark: SparkSession,
    batch_id: int,
    meta: Mapping[str, Any],
    schemas: Mapping[str, str],
    in_driver: bool,
) -> ResidentState:
    """The state committed batch ``batch_id`` left, rebuilt from storage to be held:
    as Arrow in the driver when ``in_driver`` (as :func:`committed_tables`, no Spark
    job), else locally checkpointed by Spark (as :func:`committed_frames`)."""
    chain = _chain(store, batch_id, meta)
    base, changelogs = chain[0][0], len(chain) - 1
    state = ResidentState(batch_id, meta.get("attempt"), 0, base, changelogs)
    if in_driver:
        state.tables = _tables(store, chain)
        state.rows = sum(t.num_rows for t in state.tables.values())
    else:
        frames = _frames(store, spark, chain, schemas)
        state.frames = {name: frame.localCheckpoint(eager=True) for name, frame in frames.items()}
        state.rows = sum(frame.count() for frame in state.frames.values())
    logger.info(
        "batch %d: its state rebuilt from the snapshot of batch %d and %d changelog(s)",
        batch_id, base, changelogs,
    )  # fmt: skip
    return state


# -- writing ---------------------------------------------------------------------


def write_tables(store: StateStore, directory: str, tables: Mapping[str, Any]) -> dict[str, int]:
    """Each table of ``tables`` into ``directory/<name>``: Arrow ones from the driver
    (:func:`~..spark.frames.write_arrow_parquet`; an empty change, ``<table>.added``
    or ``.removed``, writes nothing), DataFrames by Spark's writer (a job each).
    Returns the Arrow tables' rows. O(rows)."""
    from ..spark.frames import write_arrow_parquet

    rows: dict[str, int] = {}
    for name, table in tables.items():
        if not hasattr(table, "num_rows"):  # a DataFrame: counting it would be one more job
            table.write.mode("error").parquet(join(directory, name))
            continue
        rows[name] = int(table.num_rows)
        if table.num_rows or "." not in name:  # a whole table always: it has the schema
            write_arrow_parquet(table, join(directory, name), store.storage)
    return rows


def write_shutdown_snapshot(store: StateStore) -> bool:
    """Write the resident state as a snapshot of its batch, if the commit of that batch
    holds only a changelog and this job still owns the checkpoint: the tables
    beside the changelog in the committed attempt's directory, then the marker
    (one new file) that makes :func:`rebuild` start there. True if written.

    A job killed midway leaves tables without the marker, which nothing reads
    and the owner's next prune deletes with the rest of the old attempt.
    """
    state = store.resident
    if state is None or state.changelogs == 0 or not store.owns():
        return False
    meta = store.meta(state.batch_id)
    if not state.matches(state.batch_id, meta):
        return False
    if has_shutdown_snapshot(store, state.batch_id, meta):
        return False
    directory = store.state_path(state.batch_id, meta)
    held: Mapping[str, Any] = state.tables if state.tables is not None else state.frames or {}
    # The tables the changelog holds whole already (events) are written once.
    missing = {n: t for n, t in held.items() if not store.storage.exists(join(directory, n))}
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


def end_resident_state(store: StateStore, driver_only: bool = False) -> None:
    """At a job's end: write the resident state as a snapshot
    (:func:`write_shutdown_snapshot`), then let it go. A failure to write is
    logged, not raised: the changelogs hold the state already. With
    ``driver_only``, a state Spark holds is let go unwritten (from a thread that
    must not run Spark jobs)."""
    state = store.resident
    if state is None:
        return
    if state.tables is not None or not driver_only:
        try:
            write_shutdown_snapshot(store)
        except Exception as exc:  # the job's outcome stands
            logger.warning("the state of batch %d was not written whole: %s", state.batch_id, exc)
    state.release()
    store.resident = None
