"""The partitioned provider: carried operations that outgrow the driver, held in P embedded
RocksDB stores on the executors, one per key partition (``docs/pipeline-design.md``,
"Carried state").

The driver keeps only what a micro-batch moves: the changes committed since the
stores last saw them, and the operations a micro-batch took in. Each micro-batch
runs one Spark job of P tasks over the *anchor*, a locally checkpointed RDD whose
blocks the load left on the executors that hold the stores; Spark prefers to run
a task where its block is, so a task finds its stores on its own disk. A task
brings each of its stores to the last commit (:meth:`~.partition_store.PartitionStore.apply`),
then reads what the micro-batch touches (:meth:`~.partition_store.PartitionStore.take`).

Locality is only an optimisation; correctness comes from the lineage check. A
store records the commit it holds, and a task given changes made on another
version reports a miss. The driver then loads every partition again from the
checkpoint (through Spark's readers, so any Hadoop URI serves) and runs the job
again. A lost executor fails the job (its anchor blocks cannot be recomputed),
which is handled the same way. Stores change only by committed changes, so a
fenced or concurrent attempt cannot leave one holding a state no commit names.

P is chosen at each load (Spark's default parallelism), not written in the
checkpoint, whose state is the same Parquet snapshots and changelogs whoever
holds it. Classic sessions only: Spark Connect has no RDDs.
"""

from __future__ import annotations

import functools
import logging
import pickle
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .ops_index import due_at, key_hashes, ops_schema, rule_indexes
from .partition_store import OpsRow, PartitionStore, pair_key

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["PartitionedOps", "partitions_of"]

logger = logging.getLogger(__name__)

#: Payloads larger than this go to the tasks as a broadcast, not in the job's closure.
_BROADCAST_BYTES = 1 << 20
_OPS_DDL = "kind string, rule string, key string, event_id string, time bigint, deadline bigint"


def partitions_of(keys: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """Each key's partition: its 64-bit hash (:func:`~.ops_index.key_hashes`, of the key
    alone, so a rules change moves nothing) modulo ``partitions``. O(bytes)."""
    import numpy as np

    hashes = key_hashes(np.zeros(len(keys), np.int64), keys)
    return (hashes % np.uint64(partitions)).astype(np.int64)


@dataclass(frozen=True)
class _Changes:
    """One batch's changes to the operations, made on the state tagged ``before``:
    ``added`` (with their due watermarks) and ``removed`` rows, as Arrow."""

    before: str
    after: str
    added: pa.Table
    removed: pa.Table

    @property
    def nbytes(self) -> int:
        return int(self.added.nbytes) + int(self.removed.nbytes)


class PartitionedOps:
    """Carried operations of the rules ``rule_names`` held in P RocksDB stores on the
    executors (:mod:`.partition_store`), found by key and by due watermark there.

    Made by :meth:`load`. ``restore(tag)`` gives the committed operations of the
    state ``tag`` names as a DataFrame, read from the checkpoint: a miss loads
    them again. The driver holds O(touched): the changes the stores have not
    applied yet and one micro-batch's taken rows. The partitioned provider
    (:class:`~.OpsProvider`).
    """

    provider = "partitioned"

    def __init__(
        self,
        spark: SparkSession,
        rule_names: Sequence[str],
        retention_ms: int | None,
        restore: Callable[[str], DataFrame],
        owner: str,
    ) -> None:
        """A provider holding nothing yet: :meth:`load` fills it. O(1)."""
        self.rule_names = tuple(rule_names)
        self.retention_ms = retention_ms
        self._spark = spark
        self._restore = restore
        self._owner = owner
        self._rows = 0  # the committed state's
        #: The partitions, and the share of them found on their own executor, holding
        #: the committed version, by the last micro-batch's job (None before one).
        self.partitions = 0
        self.local_share: float | None = None
        self.tag = ""  # the committed state the stores hold once `_pending` is applied
        self._applied = ""  # the state the stores hold
        self._loaded = ""  # the state the stores were loaded with
        self._empty: frozenset[int] = frozenset()  # partitions with no rows at the load
        self._homes: dict[int, int] = {}  # partition -> the anchor's partition it runs in
        self._anchor: RDD[Any] | None = None
        self._anchor_id = ""
        self._pending: list[_Changes] = []
        self._staged: _Changes | None = None
        #: Rules whose rows a reload leaves out: dropped by a rules change since the
        #: last commit, whose checkpointed state still holds them.
        self._dropped: tuple[str, ...] = ()

    @classmethod
    def load(
        cls,
        spark: SparkSession,
        ops: DataFrame,
        tag: str,
        rule_names: Sequence[str],
        retention_ms: int | None,
        restore: Callable[[str], DataFrame],
        owner: str,
    ) -> PartitionedOps:
        """The operations ``ops`` (the state ``tag`` names), loaded into stores on the
        executors by one Spark job: each row to its key's partition, sorted there by
        (rule, key). O(rows) across the cluster, none of it in the driver."""
        provider = cls(spark, rule_names, retention_ms, restore, owner)
        provider._load(ops, tag)
        return provider

    @property
    def rows(self) -> int:
        """The rows held, with the changes put back. O(1)."""
        staged = self._staged
        if staged is None:
            return self._rows
        return self._rows + int(staged.added.num_rows) - int(staged.removed.num_rows)

    @property
    def nbytes(self) -> int:
        """The bytes the driver holds for it: the changes not applied yet. O(changes)."""
        staged = [self._staged] if self._staged is not None else []
        return sum(changes.nbytes for changes in [*self._pending, *staged])

    # -- the load ------------------------------------------------------------------------
    def _load(self, ops: DataFrame, tag: str) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        sc = self._spark.sparkContext
        partitions = max(int(sc.defaultParallelism), 1)
        anchor_id = uuid.uuid4().hex
        keyed = ops.select(*ops_schema().names).mapInArrow(
            functools.partial(_with_partition, partitions, self.rule_names, self.retention_ms),
            f"{_OPS_DDL}, due bigint, pid int",
        )
        ordered = keyed.repartition(partitions, "pid").sortWithinPartitions(
            "pid", F.col("rule").asc_nulls_first(), F.col("key").asc_nulls_first()
        )
        loaded = ordered.mapInArrow(
            functools.partial(_load_stores, self._owner, anchor_id, tag), "pid int, rows bigint"
        )
        anchor = loaded.rdd.mapPartitionsWithIndex(_with_index)
        if not anchor.getNumPartitions():  # no rows: Spark planned no partition at all
            anchor = sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(
                _with_index_only
            )
        # Persisted, the later jobs' functions run over its blocks instead of composing
        # with the load's; checkpointed locally, its lineage back to the input is cut.
        anchor.persist(StorageLevel.MEMORY_AND_DISK)
        anchor.localCheckpoint()
        homes: dict[int, int] = {}
        rows = 0
        for index, loaded_rows in anchor.collect():
            for pid, count in loaded_rows:
                homes[int(pid)] = int(index)
                rows += int(count)
        anchors = anchor.getNumPartitions()
        empty = frozenset(pid for pid in range(partitions) if pid not in homes)
        for pid in empty:  # a partition with no rows yet: its store is made when first used
            homes[pid] = pid % anchors
        self.release()
        self._anchor, self._anchor_id, self._homes, self._empty = anchor, anchor_id, homes, empty
        self.partitions, self._rows = partitions, rows
        self.tag = self._applied = self._loaded = tag
        self._pending = []
        logger.info(
            "the operations (%d rows) loaded into %d partitions on the executors", rows, partitions
        )

    # -- one micro-batch -------------------------------------------------------------------
    def take_touched(self, keys: Mapping[str, pa.Array], watermark: int) -> pa.Table:
        """Take the rows a micro-batch can change (as
        :meth:`~.ops_index.OpsIndex.take_touched`): one Spark job of P tasks, each
        applying the changes committed since its stores last saw them, then reading
        the rows due at ``watermark`` and those of ``keys`` (by rule name). The rows
        stay in the stores until this batch's changes, once committed, remove them.
        On a miss or a lost executor, loads again from the checkpoint and runs
        again. O(touched) in the driver."""
        import pyarrow as pa

        pairs = self._pairs_by_partition(keys)
        found = self._run(_take_task, {"pairs": pairs, "watermark": watermark})
        rows = [row for _pid, taken in found for row in taken]
        return pa.Table.from_pylist(
            [dict(zip(ops_schema().names, row, strict=True)) for row in rows], ops_schema()
        )

    def _pairs_by_partition(self, keys: Mapping[str, pa.Array]) -> dict[int, list[bytes]]:
        import pyarrow as pa

        pairs: dict[int, list[bytes]] = {}
        for rule, array in keys.items():
            if rule not in self.rule_names or not len(array):
                continue
            array = array.cast(pa.string())
            for key, pid in zip(
                array.to_pylist(), partitions_of(array, self.partitions).tolist(), strict=True
            ):
                if key is not None:  # a null key matches no row
                    pairs.setdefault(pid, []).append(pair_key(rule, key))
        return pairs

    def put_back(self, added: pa.Table, removed: pa.Table, tag: str) -> None:
        """What this attempt changed, to be applied by the next micro-batch's job once it
        commits (:meth:`committed`): ``added`` rows (the operations the purgatory
        holds) and ``removed`` ones (those it took in). O(changes)."""
        import pyarrow as pa

        schema = ops_schema()
        added = added.select(schema.names).cast(schema)
        due = due_at(added, rule_indexes(added, self.rule_names), self.retention_ms)
        added = added.append_column("due", pa.array(due, pa.int64()))
        removed = removed.select(schema.names).cast(schema)
        self._staged = _Changes(self.tag, tag, added, removed)

    def committed(self) -> None:
        """The attempt whose changes were put back committed: the stores apply them in
        the next job. O(1)."""
        if self._staged is not None:
            self._rows = self.rows
            self._pending.append(self._staged)
            self.tag, self._staged = self._staged.after, None
            self._dropped = ()

    def whole(self) -> DataFrame:
        """Every row held, with the changes put back, as a DataFrame (a snapshot's): the
        stores brought to the last commit first (one job), then read by the writer's
        job. O(rows) across the cluster, none of it in the driver."""
        self._run(_take_task, {"pairs": {}, "watermark": None})  # brings each store up to date
        staged = self._staged
        overlay = None if staged is None else self._changes_by_partition(staged)
        payloads = self._payloads({"overlay": overlay})
        rdd = self._job(_dump_task, payloads)
        return self._spark.createDataFrame(rdd, _OPS_DDL)

    def without_rules(self, names: Iterable[str]) -> PartitionedOps:
        """A provider of the rows held but those of the rules ``names`` (a rules change
        that dropped their state), loaded anew from this one's stores. O(rows) across
        the cluster."""
        from pyspark.sql import functions as F

        dropped = tuple(sorted({*self._dropped, *names}))
        kept = self.whole().where(~F.col("rule").isin(list(dropped)))
        provider = PartitionedOps.load(
            self._spark, kept, self.tag, self.rule_names, self.retention_ms, self._restore,
            self._owner,
        )  # fmt: skip
        provider._dropped = dropped
        self.release()
        return provider

    def release(self) -> None:
        """Let the anchor's blocks go, and delete its stores where its tasks run (best
        effort: a store left behind is in the executor's work directory, which Spark's
        ``spark.worker.cleanup`` clears). O(partitions)."""
        anchor, self._anchor = self._anchor, None
        if anchor is None:
            return
        try:
            owner, anchor_id = self._owner, self._anchor_id
            anchor.foreachPartition(lambda _rows: _remove_stores(owner, anchor_id))
        except Exception as exc:  # an executor gone: its stores went with it
            logger.debug("the stores of anchor %s not all removed: %s", self._anchor_id, exc)
        anchor.unpersist(blocking=False)

    # -- the job ---------------------------------------------------------------------------
    def _run(self, task: Callable[..., Any], common: dict[str, Any]) -> list[tuple[int, Any]]:
        """Run ``task`` on every partition with the changes the stores lack; on a miss
        or a failed job, load again from the checkpoint and run once more."""
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
        from pyspark.errors.exceptions.captured import CapturedException

        for attempt in range(2):
            try:
                results = self._job(task, self._payloads(common, pending=True)).collect()
            except (Py4JJavaError, CapturedException) as exc:  # a job Spark failed
                if attempt:
                    raise
                logger.warning("the partitioned state's job failed (%s): loaded again", exc)
                self._reload()
                continue
            missed = [pid for pid, ok, _found in results if not ok]
            if attempt == 0:
                self.local_share = 1 - len(missed) / max(self.partitions, 1)
            if not missed:
                self._pending, self._applied = [], self.tag
                return [(pid, found) for pid, _ok, found in results]
            if attempt:
                raise RuntimeError(f"partitions {missed} missed their state after a reload")
            logger.warning(
                "%d of %d partition(s) found no store holding the committed state: loaded "
                "again from the checkpoint", len(missed), self.partitions,
            )  # fmt: skip
            self._reload()
        raise AssertionError("unreachable")

    def _reload(self) -> None:
        """Load the last committed state again, from the checkpoint."""
        from pyspark.sql import functions as F

        staged, ops = self._staged, self._restore(self.tag)
        if self._dropped:
            ops = ops.where(~F.col("rule").isin(list(self._dropped)))
        self._load(ops, self.tag)
        self._staged = staged

    def _payloads(self, common: dict[str, Any], pending: bool = False) -> list[dict[str, Any]]:
        """One payload per anchor partition: ``common``, its partitions' stores' paths and
        what each lacks (the changes not applied, by partition)."""
        anchors = self._anchor.getNumPartitions() if self._anchor is not None else 0
        changes = [self._changes_by_partition(c) for c in self._pending] if pending else []
        by_anchor: list[dict[str, Any]] = [
            {**common, "partitions": {}, "owner": self._owner, "anchor": self._anchor_id}
            for _ in range(anchors)
        ]
        fresh = self._applied == self._loaded
        for pid, index in self._homes.items():
            by_anchor[index]["partitions"][pid] = {
                "chain": [
                    (c.before, c.after, part.get(pid, ([], []))) for c, part in zip(
                        self._pending, changes, strict=True)
                ] if pending else [],
                "expected": self.tag if pending else self._applied,
                "empty": (self._loaded if fresh and pid in self._empty else None),
            }  # fmt: skip
        return by_anchor

    def _changes_by_partition(
        self, changes: _Changes
    ) -> dict[int, tuple[list[OpsRow], list[OpsRow]]]:
        """``changes``' rows as tuples, by partition: (added with due, removed)."""
        out: dict[int, tuple[list[OpsRow], list[OpsRow]]] = {}
        for side, table in ((0, changes.added), (1, changes.removed)):
            if not table.num_rows:
                continue
            pids = partitions_of(table["key"], self.partitions).tolist()
            rows = zip(*(table[name].to_pylist() for name in table.column_names), strict=True)
            for pid, row in zip(pids, rows, strict=True):
                out.setdefault(pid, ([], []))[side].append(row)
        return out

    def _job(self, task: Callable[..., Any], payloads: list[dict[str, Any]]) -> RDD[Any]:
        """``task`` over the anchor's partitions, each given its payload: in the job's
        closure, or as a broadcast when large."""
        if self._anchor is None:
            raise RuntimeError("the partitioned operations were released")
        sc = self._spark.sparkContext
        data = pickle.dumps(payloads, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > _BROADCAST_BYTES:
            shared = sc.broadcast(payloads)
            return self._anchor.mapPartitionsWithIndex(
                lambda index, _rows: task(shared.value[index])
            )
        return self._anchor.mapPartitionsWithIndex(lambda index, _rows: task(payloads[index]))


# -- on the executors ----------------------------------------------------------------------


def _store_path(owner: str, anchor_id: str, pid: int) -> Path:
    """Where this executor keeps partition ``pid``'s store of one anchor."""
    from pyspark import SparkFiles

    return Path(SparkFiles.getRootDirectory()) / "tickwheel-state" / owner / anchor_id / f"p{pid}"


def _remove_stores(owner: str, anchor_id: str) -> None:
    import shutil

    shutil.rmtree(_store_path(owner, anchor_id, 0).parent, ignore_errors=True)


def _with_partition(
    partitions: int, rule_names: Sequence[str], retention_ms: int | None, batches: Iterable[Any]
) -> Iterator[Any]:
    """Each row of carried operations with its due watermark and its key's partition."""
    import pyarrow as pa

    for batch in batches:
        table = pa.Table.from_batches([batch])
        due = due_at(table, rule_indexes(table, rule_names), retention_ms)
        pid = partitions_of(table["key"], partitions).astype("int32")
        table = table.append_column("due", pa.array(due, pa.int64()))
        yield from table.append_column("pid", pa.array(pid, pa.int32())).to_batches()


def _load_stores(owner: str, anchor_id: str, tag: str, batches: Iterable[Any]) -> Iterator[Any]:
    """Load this task's rows (sorted by partition, then pair) into a store a partition."""
    import pyarrow as pa

    counts: dict[int, int] = {}
    current: tuple[int, PartitionStore, list[OpsRow]] | None = None

    def flush(final: bool) -> None:
        nonlocal current
        if current is not None:
            pid, store, rows = current
            store.write_rows(rows)
            counts[pid] = counts.get(pid, 0) + len(rows)
            rows.clear()
            if final:
                store.finish_load(tag)
                store.close()
                current = None

    for batch in batches:
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        for *row, pid in zip(*columns, strict=True):
            if current is None or current[0] != pid:
                flush(final=True)
                current = (pid, PartitionStore(_store_path(owner, anchor_id, pid)), [])
            current[2].append(tuple(row))
        flush(final=False)
    flush(final=True)
    yield pa.RecordBatch.from_pydict(
        {"pid": list(counts), "rows": list(counts.values())},
        pa.schema([("pid", pa.int32()), ("rows", pa.int64())]),
    )


def _with_index(index: int, rows: Iterable[Any]) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    yield index, [(row["pid"], row["rows"]) for row in rows]


def _with_index_only(index: int, _rows: Iterable[Any]) -> Iterator[tuple[int, list[Any]]]:
    yield index, []


def _bring_up_to_date(owner: str, anchor_id: str, pid: int, part: dict[str, Any]) -> Any:
    """Partition ``pid``'s store, brought to the committed state the driver expects: made
    empty if it had no rows at the load, each change it lacks applied. None (the store
    closed) on a miss: it holds another state, or none."""
    store = PartitionStore(_store_path(owner, anchor_id, pid))
    if store.version is None and part["empty"] is not None:
        store.write_rows([])
        store.finish_load(part["empty"])
    for before, after, (added, removed) in part["chain"]:
        if not store.apply(before, after, added, removed):
            break
    if store.version != part["expected"]:
        store.close()
        return None
    return store


def _take_task(payload: dict[str, Any]) -> Iterator[tuple[int, bool, list[OpsRow]]]:
    """(partition, found, rows taken) of each partition of one anchor partition."""
    owner, anchor_id, watermark = payload["owner"], payload["anchor"], payload["watermark"]
    for pid, part in payload["partitions"].items():
        store = _bring_up_to_date(owner, anchor_id, pid, part)
        if store is None:
            yield pid, False, []
            continue
        try:
            pairs = payload["pairs"].get(pid, [])
            taken = [] if watermark is None else store.take(pairs, watermark)
        finally:
            store.close()
        yield pid, True, taken


def _dump_task(payload: dict[str, Any]) -> Iterator[OpsRow]:
    """Every row of each partition of one anchor partition, with the overlay's changes
    (an attempt's, not committed) applied in memory."""
    owner, anchor_id, overlay = payload["owner"], payload["anchor"], payload["overlay"] or {}
    for pid, part in payload["partitions"].items():
        store = _bring_up_to_date(owner, anchor_id, pid, part)
        if store is None:
            raise RuntimeError(f"partition {pid}'s store does not hold {part['expected']!r}")
        try:
            added, removed = overlay.get(pid, ([], []))
            yield from _without(store.rows(), [tuple(row) for row in removed])
            yield from (tuple(row[:6]) for row in added)
        finally:
            store.close()


def _without(rows: Iterable[OpsRow], removed: list[OpsRow]) -> Iterator[OpsRow]:
    """``rows`` without those of ``removed``, each once per copy."""
    left: dict[OpsRow, int] = {}
    for row in removed:
        left[row] = left.get(row, 0) + 1
    for row in rows:
        row = tuple(row)
        if left.get(row):
            left[row] -= 1
            continue
        yield row
    if any(left.values()):
        raise ValueError("an attempt removes rows its state lacks")
