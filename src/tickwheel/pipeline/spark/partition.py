"""Stage 5: one key partition through one purgatory, Arrow in and Arrow out.

:func:`run_partitions` repartitions the fanned-out events and the carried
operations by (rule, key) and hands each partition to :func:`partition_function`
through ``mapInArrow``. Each partition runs one
:class:`~tickwheel.pipeline.core.PartitionProcessor` from the previous
watermark (``start_ms``; none for a batch run) to the new one, W:

1. its rows are split into events and carried state (:data:`IN_COLUMNS`;
   ``state_kind`` is null for an event);
2. state this run cannot change is carried straight to the output as Arrow
   columns, marked ``unchanged`` (:func:`_untouched_state`): a key's expiry
   marker, or a pending operation due after W, whose (rule, key) has no event
   here; a stream's run also gives the rest of the state back as ``replaced``
   rows, so that its next state's changes are filters of these rows
   (:func:`.outputs.ops_changes`);
3. the rest of the state seeds the processor, and the events, sorted by
   (time, sequence, event id, rule) in Arrow, go through it in slices; events
   above W are held (``buffered``);
4. the clock advances to W, and the processor's rows leave as one Arrow batch
   per kind (:data:`OUT_COLUMNS`): ``outcome`` (final), ``unmatched``,
   ``pending`` and ``expired`` (the next state's operations and expiry
   markers; a batch run, which has no next state, asks for no markers),
   ``buffered``, and one ``stats`` row: the partition's counters
   and timings as JSON, with the latencies of its resolved operations,
   sorted, for exact percentiles (:func:`.outputs.exact_percentile`).

Rows go in column by column (an event's rule index and kind are computed in
Arrow, then each column becomes a Python list, zipped into the processor's
tuples) and out as one struct array per kind of row, split into its columns;
no Python code runs per row on either side but the processor's. The cyclic
collector is paused throughout (see
:func:`~tickwheel.pipeline.core.cyclic_gc_paused`).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ..core import STATE_EXPIRED, STATE_PENDING, PartitionProcessor, StateRow, cyclic_gc_paused
from ..rules import Rules

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "IN_COLUMNS",
    "IN_DDL",
    "OUT_COLUMNS",
    "OUT_DDL",
    "partition_function",
    "run_partition_on_arrow",
    "run_partitions",
    "state_input_frame",
    "state_inputs",
]

#: A partition's input: (name, Spark type). Events have a null ``state_kind``;
#: carried state rows have ``pending`` or ``expired`` and no seq or event type.
IN_COLUMNS = (
    ("state_kind", "string"),
    ("rule", "string"),
    ("key", "string"),
    ("time", "long"),
    ("seq", "long"),
    ("event_id", "string"),
    ("event_type", "string"),
    ("deadline", "long"),
)
IN_DDL = ", ".join(f"{name} {kind}" for name, kind in IN_COLUMNS)

#: A partition's output: (name, Spark type); ``kind`` says which columns a row fills.
OUT_COLUMNS = (
    ("kind", "string"),
    ("rule", "string"),
    ("key", "string"),
    ("id", "string"),
    ("time", "long"),
    ("deadline", "long"),
    ("outcome", "string"),
    ("resolved_at", "long"),
    ("latency_ms", "long"),
    ("resolve_event_id", "string"),
    ("event_type", "string"),
    ("reason", "string"),
    ("seq", "long"),
    ("stats", "binary"),
    ("unchanged", "boolean"),  # a carried state row passed through as it came
    ("state_kind", "string"),  # a ``replaced`` row's kind as it came
)
OUT_DDL = ", ".join(f"{name} {kind}" for name, kind in OUT_COLUMNS)

#: The columns of the processor's input tuples, in their order (``_rule``: the
#: rule's index, ``_kind``: the event's kind in it; :func:`_event_input`).
_EVENT_TUPLE = ("_rule", "key", "time", "seq", "event_id", "_kind", "event_type")
#: Events are converted to Python this many rows at a time.
SLICE_ROWS = 65_536


def run_partitions(
    inputs: DataFrame,
    rules: Rules,
    partitions: int,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> DataFrame:
    """``inputs`` (:data:`IN_COLUMNS`) by (rule, key) through :func:`partition_function`.

    Lazy: one shuffle into ``partitions`` partitions, then ``mapInArrow``. Each
    worker checks that it runs the driver's tickwheel first
    (:func:`.workers.guarded`).
    """
    from .workers import guarded

    run = partition_function(rules, start_ms, watermark_ms, markers=markers, changes=changes)
    return inputs.repartition(partitions, "rule", "key").mapInArrow(
        guarded(run, OUT_COLUMNS), OUT_DDL
    )


def run_partition_on_arrow(
    spark: SparkSession,
    inputs: pa.Table,
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> DataFrame:
    """``inputs`` (:data:`IN_COLUMNS`, as Arrow in the driver) as one partition through
    :func:`partition_function`, in this process.

    What :func:`run_partitions` does with one partition, without its shuffle
    and its Python worker: the rows come back as a local relation (as
    :func:`.frames.driver_copy` gives). For a partition of a few thousand rows.
    O(rows) in the driver's memory. As in a worker, the cyclic collector is
    paused while the partition runs: the pause is process-wide, and only
    delays the collection of the other driver threads' cyclic garbage.
    """
    import pyarrow as pa

    from .frames import empty_frame

    run = partition_function(rules, start_ms, watermark_ms, markers=markers, changes=changes)
    batches = list(run(iter(inputs.to_batches())))
    if not batches:
        return empty_frame(spark, OUT_DDL)
    return spark.createDataFrame(pa.Table.from_batches(batches))


#: :func:`state_inputs` in SQL, for carried operations held by Spark
#: (:func:`state_input_frame`).
_STATE_INPUT_COLUMNS = (
    "kind AS state_kind",
    "rule",
    "key",
    "`time`",
    "CAST(NULL AS BIGINT) AS seq",
    "event_id",
    "CAST(NULL AS STRING) AS event_type",
    "deadline",
)


def state_input_frame(ops: DataFrame) -> DataFrame:
    """:func:`state_inputs` over a frame of carried operations: the same rows, planned
    by Spark. Lazy."""
    return ops.selectExpr(*_STATE_INPUT_COLUMNS)


def state_inputs(ops: pa.Table) -> pa.Table:
    """Carried operations (:data:`.outputs.OPS_COLUMNS`) as a partition's input rows
    (:data:`IN_COLUMNS`: ``state_kind`` set, no sequence or event type), from Arrow
    (:func:`state_input_frame` from a frame). O(1) copies."""
    import pyarrow as pa

    n = ops.num_rows
    columns = {
        "state_kind": ops["kind"],
        "rule": ops["rule"],
        "key": ops["key"],
        "time": ops["time"],
        "seq": pa.nulls(n, pa.int64()),
        "event_id": ops["event_id"],
        "event_type": pa.nulls(n, pa.string()),
        "deadline": ops["deadline"],
    }
    return pa.table([columns[name] for name, _kind in IN_COLUMNS], names=[n for n, _ in IN_COLUMNS])


def partition_function(
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: one purgatory per partition, seeded with its state.

    With ``changes``, the carried rows the processor took in come out as
    ``replaced`` rows (what a stream's changelog removes: :func:`.outputs.ops_rows`).
    No rows in: no rows out. With ``markers`` false, no ``expired`` rows (the
    keys' expiry markers) are output: only a next state needs them, and a
    batch run has none. ``tests/pipeline/test_stream_udf.py`` pins the
    column mapping and the routing against one processor run over all the events.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Paused from the first row in to the last row out: the conversions
        # allocate a tuple per row, and the restored state is most of the heap.
        with cyclic_gc_paused():
            out = _process(rules, start_ms, watermark_ms, batches, markers, changes)
        yield from out

    return run


def _untouched_state(rules: Rules, events: Any, state: Any, watermark_ms: int) -> Any:
    """Mask of the ``state`` rows this run cannot change. O(rows).

    A key's expiry marker changes only when an event of that key is applied or
    one of its operations expires; a pending operation changes only through an
    event of its key or its own deadline. So a state row is untouched when its
    (rule, key) has no event in ``events`` and no operation due by
    ``watermark_ms``, and it is an expiry marker or a pending operation whose
    deadline is after the watermark. Keys are matched per rule, so no
    (rule, key) encoding can collide. A row with a null where a value is needed
    is not untouched: the processor rejects it with a clear error. Nor is a
    marker whose retention ends by the watermark: the processor drops it.
    """
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    kind = state["state_kind"]
    pending = pc.equal(kind, STATE_PENDING)
    due = pc.and_kleene(pending, pc.less_equal(state["deadline"], watermark_ms))
    marker = pc.equal(kind, STATE_EXPIRED)
    if rules.input.retention_ms is not None:  # core.marker_holds at the watermark
        marker = pc.and_kleene(
            marker, pc.greater(state["time"], watermark_ms - rules.input.retention_ms)
        )
    carriable = pc.or_kleene(
        marker,
        pc.and_kleene(pending, pc.greater(state["deadline"], watermark_ms)),
    )
    touched = None
    for rule in rules.rules:
        in_rule = pc.equal(state["rule"], rule.name)
        keys = pa.chunked_array(
            [
                *events.filter(pc.equal(events["rule"], rule.name))["key"].chunks,
                *state.filter(pc.and_kleene(in_rule, due))["key"].chunks,
            ],
            type=pa.string(),
        )
        hit = pc.and_kleene(in_rule, pc.is_in(state["key"], value_set=pc.unique(keys)))
        touched = hit if touched is None else pc.or_kleene(touched, hit)
    assert touched is not None  # Rules has at least one rule
    return pc.fill_null(pc.and_kleene(carriable, pc.invert(touched)), False)


def _process(
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    batches: Iterator[pa.RecordBatch],
    markers: bool,
    changes: bool = False,
) -> list[pa.RecordBatch]:
    """One partition's rows in; its rows out (see the module doc's steps)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    started = time.perf_counter()
    batch_list = list(batches)
    if not batch_list or not sum(b.num_rows for b in batch_list):
        return []
    table = pa.Table.from_batches(batch_list)
    is_state = pc.is_valid(table["state_kind"])
    event_rows = table.filter(pc.invert(is_state))
    state_rows = table.filter(is_state)
    out = _Output(pa, rules.names)
    if state_rows.num_rows:
        unknown = set(pc.unique(state_rows["rule"]).to_pylist()) - set(rules.names)
        if unknown:
            raise ValueError(
                f"state rows name rules {sorted(unknown)}, not among {list(rules.names)}"
            )
        untouched = _untouched_state(rules, event_rows, state_rows, watermark_ms)
        carried = state_rows.filter(untouched)
        if not markers:
            carried = carried.filter(pc.not_equal(carried["state_kind"], STATE_EXPIRED))
        out.carried(carried)
        state_rows = state_rows.filter(pc.invert(untouched))
        if changes:  # a stream's next state: its changes say which rows it replaced
            out.replaced(state_rows)
    proc = PartitionProcessor(
        rules, rules.input.allowed_lateness_ms, state=_state_input(state_rows), start_ms=start_ms
    )
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        proc.process(_event_input(pa, rules, event_rows), watermark_ms=watermark_ms)
        proc.finish(watermark_ms)
        loop_s, loop_cpu = time.perf_counter() - wall, time.thread_time() - cpu
        out.processed(proc, markers)
        out.stats(proc, loop_s, loop_cpu, time.perf_counter() - started)
        return out.batches
    finally:
        proc.close()


def _state_input(state_rows: Any) -> list[StateRow]:
    """The state rows as the processor's :class:`~tickwheel.pipeline.core.StateRow`. O(rows)."""
    if not state_rows.num_rows:
        return []
    c = state_rows.to_pydict()
    return list(
        map(
            StateRow,
            c["state_kind"],
            c["rule"],
            c["key"],
            c["event_id"],
            c["time"],
            c["deadline"],
            repeat(None),
            repeat(None),
        )
    )


def _event_input(
    pa: Any, rules: Rules, event_rows: Any
) -> Iterator[tuple[int, str, int, int, str, int, str]]:
    """The events as the processor's input tuples, in its order. O(n log n).

    Sorted by (time, sequence, event id, rule index) in Arrow, where each
    event's rule index and kind are computed too, column at a time; then
    converted :data:`SLICE_ROWS` at a time. Each tuple is (rule index, key,
    time, sequence, event id, kind, event type). The tuples come from ``zip``
    objects chained together, so no Python frame runs per event.
    """
    import pyarrow.compute as pc

    if not event_rows.num_rows:
        return iter(())
    names = pa.array(rules.names, pa.string())
    ordered = event_rows.append_column(
        "_rule", pc.index_in(event_rows["rule"], value_set=names)
    ).sort_by([(name, "ascending") for name in ("time", "seq", "event_id", "_rule")])
    types = sorted({etype for rule in rules.rules for etype in rule.event_types})
    # kinds[rule index * len(types) + type index]: the type's kind in the rule, or
    # null where the rule does not use the type.
    kinds = pa.array([rule.kind_of(etype) for rule in rules.rules for etype in types], pa.int8())
    code = pc.add(
        pc.multiply(ordered["_rule"], len(types)),
        pc.index_in(ordered["event_type"], value_set=pa.array(types, pa.string())),
    )
    kind = pc.take(kinds, code)
    if kind.null_count:  # the fan-out selects only the rules' types
        first = ordered.filter(pc.is_null(kind)).slice(0, 1).to_pylist()[0]
        raise AssertionError(f"event of no rule's type: {(first['rule'], first['event_type'])}")
    ordered = ordered.append_column("_kind", kind)

    def tuples(start: int) -> Iterator[tuple[int, str, int, int, str, int, str]]:
        part = ordered.slice(start, SLICE_ROWS)
        return zip(*(part[name].to_pylist() for name in _EVENT_TUPLE), strict=True)

    return itertools.chain.from_iterable(map(tuples, range(0, ordered.num_rows, SLICE_ROWS)))


class _Output:
    """A partition's output batches of :data:`OUT_COLUMNS`, one per kind of row."""

    def __init__(self, pa: Any, names: Sequence[str]) -> None:
        self.pa = pa
        self.schema = pa.schema([(name, _ARROW_TYPES[kind](pa)) for name, kind in OUT_COLUMNS])
        self.rule_names = pa.array(names, pa.string())
        self.batches: list[Any] = []
        self.outcomes: Counter[str] = Counter()
        self.unmatched: Counter[str] = Counter()
        self.latencies: dict[str, Any] = {}  # outcome -> its latencies, sorted

    def _add(self, n: int, columns: Mapping[str, Any]) -> Any:
        pa, schema = self.pa, self.schema
        table = pa.table([columns.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema)
        self.batches.extend(table.to_batches())
        return table

    def carried(self, state: Any) -> None:
        """The untouched state rows, column for column, marked ``unchanged``. O(rows)."""
        if state.num_rows:
            self._add(state.num_rows, {
                "kind": state["state_kind"], "rule": state["rule"], "key": state["key"],
                "id": state["event_id"], "time": state["time"], "deadline": state["deadline"],
                "unchanged": self.pa.array([True] * state.num_rows, self.pa.bool_()),
            })  # fmt: skip

    def replaced(self, state: Any) -> None:
        """The state rows the processor took in, as ``replaced`` rows with their kind
        in ``state_kind``: what the next state no longer holds as it came (the
        processor's ``pending`` and ``expired`` rows hold what it holds). O(rows)."""
        if state.num_rows:
            self._add(state.num_rows, {
                "kind": self.pa.array(["replaced"] * state.num_rows, self.pa.string()),
                "state_kind": state["state_kind"], "rule": state["rule"], "key": state["key"],
                "id": state["event_id"], "time": state["time"], "deadline": state["deadline"],
            })  # fmt: skip

    def _rows(self, kind: str, rows: Sequence[tuple[Any, ...]], fields: Sequence[str]) -> Any:
        """Rows of the processor's raw tuples (``fields`` name their items; ``rule`` is
        the rule's index, ``_`` an item left out). None when there are none."""
        pa = self.pa
        if not rows:
            return None
        n = len(rows)
        # One conversion of the tuples as a struct array, split into its columns.
        items = pa.array(rows, pa.struct([(name, self._item_type(name)) for name in fields]))
        given = dict(zip(fields, items.flatten(), strict=True))
        given.pop("_", None)
        arrays = {"kind": pa.array([kind] * n, pa.string())}
        arrays["rule"] = self.rule_names.take(given.pop("rule"))
        arrays.update(given)
        if kind == "outcome":
            import pyarrow.compute as pc

            arrays["latency_ms"] = pc.subtract(arrays["resolved_at"], arrays["time"])
        return self._add(n, arrays)

    def _item_type(self, name: str) -> Any:
        """The Arrow type of a raw tuple's item ``name`` (see :meth:`_rows`)."""
        if name == "rule":
            return self.pa.int32()
        if name == "_":
            return self.pa.int64()
        return self.schema.field(name).type

    def processed(self, proc: PartitionProcessor, markers: bool) -> None:
        """The processor's outcomes, unmatched events, pending operations, expiry
        markers (when ``markers``) and held events. O(rows)."""
        outcomes = self._rows("outcome", proc.take_outcomes(), (
            "rule", "key", "id", "time", "deadline", "outcome", "resolved_at", "resolve_event_id",
        ))  # fmt: skip
        if outcomes is not None:
            self._count_outcomes(outcomes)
        unmatched = self._rows("unmatched", proc.take_unmatched(),
                               ("rule", "key", "id", "event_type", "time", "reason"))  # fmt: skip
        if unmatched is not None:
            self.unmatched.update(unmatched["reason"].to_pylist())
        pending = self._rows("pending", proc.pending_operations(),
                             ("rule", "key", "id", "time", "deadline"))  # fmt: skip
        if pending is not None:
            self.outcomes["pending"] += pending.num_rows
        if markers:
            self._rows("expired", proc.expired_markers(), ("rule", "key", "time"))
        self._rows("buffered", proc.take_buffered(),
                   ("rule", "key", "time", "seq", "id", "_", "event_type"))  # fmt: skip

    def _count_outcomes(self, outcomes: Any) -> None:
        import pyarrow.compute as pc

        names = outcomes["outcome"]
        for name in pc.unique(names).to_pylist():
            chosen = pc.filter(outcomes["latency_ms"], pc.equal(names, name)).combine_chunks()
            self.outcomes[name] += len(chosen)
            self.latencies[name] = chosen.sort()

    def stats(self, proc: PartitionProcessor, loop_s: float, loop_cpu: float, udf_s: float) -> None:
        """The counters row: JSON and the sorted latencies (int64, one run per outcome)."""
        pa = self.pa
        names = sorted(self.latencies)
        stats = {
            "events": proc.events_applied + proc.events_buffered,
            "applied": proc.events_applied,
            "buffered": proc.events_buffered,
            "outcomes": dict(self.outcomes),
            "unmatched": dict(self.unmatched),
            "latencies": [[name, len(self.latencies[name])] for name in names],
            "loop_seconds": loop_s,
            "loop_cpu_seconds": loop_cpu,
            "udf_seconds": udf_s,
        }
        blob = (
            json.dumps(stats).encode()
            + b"\n"
            + b"".join(_int64_bytes(pa, self.latencies[name]) for name in names)
        )
        self._add(1, {"kind": pa.array(["stats"]), "stats": pa.array([blob], pa.binary())})


_ARROW_TYPES = {
    "string": lambda pa: pa.string(),
    "long": lambda pa: pa.int64(),
    "binary": lambda pa: pa.binary(),
    "boolean": lambda pa: pa.bool_(),
}


def _int64_bytes(pa: Any, array: Any) -> bytes:
    """The little-endian int64 values of a null-free ``array``, as bytes. O(n)."""
    import sys

    values = pa.array(array, pa.int64())
    data = values.buffers()[1]
    raw: bytes = data.to_pybytes()[values.offset * 8 : (values.offset + len(values)) * 8]
    if sys.byteorder != "little":  # pragma: no cover - no big-endian machine here
        from array import array as typed

        swapped = typed("q", raw)
        swapped.byteswap()
        raw = swapped.tobytes()
    return raw
