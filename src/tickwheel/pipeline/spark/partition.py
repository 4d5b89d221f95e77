"""Stage 5: one key partition through one purgatory, Arrow in and Arrow out.

A partition's rows are the events its run applies, fanned out to their rules
(:func:`.fanout.rule_events`), and the carried operations of their keys. Where
they run is the placement's (:mod:`.placement`): in the driver, a small
micro-batch's one partition (:func:`run_partition`: an Arrow table in, one
out); on the executors, one partition per key hash (:func:`run_partitions`:
the events routed by key, :func:`.fanout.routed_events`, shuffled with the
operations, then ``mapInArrow``, whose function fans the events out first).
Either way the same function runs each partition through one
:class:`~tickwheel.pipeline.core.PartitionProcessor` from the previous
watermark (``start_ms``; none for a batch run) to the new one, W:

1. its rows are split into events and carried state (:data:`IN_COLUMNS`;
   ``state_kind`` is null for an event);
2. state this run cannot change is carried straight to the output as Arrow
   columns, marked ``kept`` (:func:`_untouched_state`): a key's expiry
   marker, or a pending operation due after W, whose (rule, key) has no event
   here; a stream's run also gives the rest of the state back as ``replaced``
   rows, marked ``removed``, so that its next state's changes are filters of
   these rows (:data:`.outputs.OPS_ROWS`);
3. the rest of the state seeds the processor, and the events, sorted by
   (time, sequence, event id, rule) in Arrow, go through it in slices; events
   above W are held (``buffered``);
4. the clock advances to W, and the processor's rows leave as one Arrow batch
   per kind (:data:`OUT_COLUMNS`): ``outcome`` (final), ``unmatched``,
   ``pending`` and ``expired`` (the next state's operations and expiry
   markers, marked ``added``; a batch run, which has no next state, asks for
   no markers), ``buffered``, and one ``stats`` row: the partition's counters
   and timings as JSON, with the latencies of its resolved operations,
   sorted, for exact percentiles (:func:`.outputs.exact_percentile`).

Each output table is a choice of these rows by kind and of their columns
(:mod:`.outputs`), so no step after the partitions computes anything.

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
from .fanout import route_column, rule_events

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

__all__ = [
    "CHANGE_ADDED",
    "CHANGE_KEPT",
    "CHANGE_REMOVED",
    "IN_COLUMNS",
    "IN_DDL",
    "OUT_COLUMNS",
    "OUT_DDL",
    "arrow_schema",
    "event_inputs",
    "out_schema",
    "partition_function",
    "routed_partition_function",
    "run_partition",
    "run_partitions",
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
    # The next state's rows (``pending``, ``expired``) and those it no longer holds as
    # they came (``replaced``): the state's kind, and how the row changed it.
    ("state_kind", "string"),
    ("change", "string"),
)
OUT_DDL = ", ".join(f"{name} {kind}" for name, kind in OUT_COLUMNS)

#: How a state row of the output (``state_kind`` set) changed the state carried in:
#: passed through as it came, made by the processor, or taken in by it.
CHANGE_KEPT, CHANGE_ADDED, CHANGE_REMOVED = "kept", "added", "removed"

#: The columns of the processor's input tuples, in their order (``_rule``: the
#: rule's index, ``_kind``: the event's kind in it; :func:`_event_input`).
_EVENT_TUPLE = ("_rule", "key", "time", "seq", "event_id", "_kind", "event_type")
#: Events are converted to Python this many rows at a time.
SLICE_ROWS = 65_536


def run_partitions(
    events: DataFrame,
    ops: DataFrame | None,
    rules: Rules,
    partitions: int,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> DataFrame:
    """The purgatory on the executors: ``events`` (:func:`.fanout.routed_events`) and the
    carried ``ops`` (:data:`.outputs.OPS_COLUMNS`; None: none) by key hash, each
    partition through :func:`routed_partition_function`. Rows of :data:`OUT_COLUMNS`.

    Lazy: one shuffle into ``partitions`` partitions by the route (an event's key,
    an operation's), then ``mapInArrow``. Each worker checks that it runs the
    driver's tickwheel first (:func:`.workers.guarded`).
    """
    from .workers import guarded

    # The events' rows have no state columns, the operations' no key columns.
    inputs = events.selectExpr(
        "*", *[f"CAST(NULL AS {kind}) AS {name}" for name, kind in IN_COLUMNS
               if name not in events.columns]
    )  # fmt: skip
    route = route_column(rules)
    if ops is not None:
        state = ops.selectExpr(*_STATE_INPUT_COLUMNS, f"key AS {route}")
        inputs = inputs.unionByName(state, allowMissingColumns=True)
    run = routed_partition_function(rules, start_ms, watermark_ms, markers=markers, changes=changes)
    return inputs.repartition(partitions, route).mapInArrow(guarded(run, OUT_COLUMNS), OUT_DDL)


def run_partition(
    events: pa.Table,
    ops: pa.Table | None,
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> pa.Table:
    """The purgatory in the driver: ``events`` (:func:`.fanout.rule_events`) and the carried
    ``ops`` (:data:`.outputs.OPS_COLUMNS`; None: none) as one partition, in this
    process. The rows of :data:`OUT_COLUMNS`, as Arrow.

    What :func:`run_partitions` does with one partition, without its shuffle,
    its Python worker and its plan. O(rows) in the driver's memory. As in a
    worker, the cyclic collector is paused while the partition runs: the pause
    is process-wide, and only delays the collection of the other driver
    threads' cyclic garbage.
    """
    import pyarrow as pa

    with cyclic_gc_paused():  # as _partition_runner's
        started = time.perf_counter()
        state = state_inputs(ops) if ops is not None else arrow_schema(IN_COLUMNS).empty_table()
        batches = _process(rules, start_ms, watermark_ms, event_inputs(events), state,
                           markers, changes, started)  # fmt: skip
    return pa.Table.from_batches(batches, schema=out_schema())


#: :func:`state_inputs` in SQL, for carried operations held by Spark.
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


def _in_table(pa: Any, n: int, columns: Mapping[str, Any]) -> pa.Table:
    """A partition's input rows (:data:`IN_COLUMNS`): ``columns``, the others null."""
    schema = arrow_schema(IN_COLUMNS)
    return pa.table(
        [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
         for f in schema],
        schema=schema,
    )  # fmt: skip


def event_inputs(events: pa.Table) -> pa.Table:
    """Fanned-out events (:data:`.fanout.COLUMNS`) as a partition's input rows
    (:data:`IN_COLUMNS`: no ``state_kind``, no deadline). O(1) copies."""
    import pyarrow as pa

    return _in_table(pa, events.num_rows, {name: events[name] for name in events.column_names})


def state_inputs(ops: pa.Table) -> pa.Table:
    """Carried operations (:data:`.outputs.OPS_COLUMNS`) as a partition's input rows
    (:data:`IN_COLUMNS`: ``state_kind`` set, no sequence or event type), from Arrow
    (``_STATE_INPUT_COLUMNS`` from a frame). O(1) copies."""
    import pyarrow as pa

    names = ("rule", "key", "time", "event_id", "deadline")
    return _in_table(
        pa, ops.num_rows, {"state_kind": ops["kind"], **{name: ops[name] for name in names}}
    )


def arrow_schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    """The Arrow schema of ``columns`` ((name, Spark type) pairs: :data:`IN_COLUMNS`,
    :data:`OUT_COLUMNS`), every field nullable. O(columns)."""
    import pyarrow as pa

    return pa.schema([(name, _ARROW_TYPES[kind](pa)) for name, kind in columns])


def out_schema() -> pa.Schema:
    """The Arrow schema of a partition's output rows (:data:`OUT_COLUMNS`). O(columns)."""
    return arrow_schema(OUT_COLUMNS)


def partition_function(
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """One purgatory per partition, seeded with its state: a function from Arrow batches
    of :data:`IN_COLUMNS` (events and carried state) to batches of :data:`OUT_COLUMNS`.

    With ``changes``, the carried rows the processor took in come out as
    ``replaced`` rows (what a stream's changelog removes: :data:`.outputs.OPS_ROWS`).
    No rows in: no rows out. With ``markers`` false, no ``expired`` rows (the
    keys' expiry markers) are output: only a next state needs them, and a
    batch run has none. ``tests/pipeline/test_stream_udf.py`` pins the
    column mapping and the routing against one processor run over all the events.
    """

    def split(batches: list[pa.RecordBatch]) -> tuple[pa.Table, pa.Table]:
        import pyarrow as pa
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        table = _concat(pa, batches, arrow_schema(IN_COLUMNS))
        is_state = pc.is_valid(table["state_kind"])
        return table.filter(pc.invert(is_state)), table.filter(is_state)

    return _partition_runner(rules, start_ms, watermark_ms, markers, changes, split)


def routed_partition_function(
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    *,
    markers: bool = True,
    changes: bool = False,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """:func:`partition_function` for the executors' partitions: the events come routed
    (:func:`.fanout.routed_events`: the classified records' columns and a route)
    and are fanned out here, each (rule, key) in the partition of its key's route
    (:func:`.fanout.rule_events`); the carried operations come as a partition's
    input rows, with their route."""

    def split(batches: list[pa.RecordBatch]) -> tuple[pa.Table, pa.Table]:
        import pyarrow as pa
        import pyarrow.compute as pc

        table = pa.Table.from_batches(batches)
        is_state = pc.is_valid(table["state_kind"])
        events = event_inputs(rule_events(table.filter(pc.invert(is_state)), rules, True))
        return events, table.filter(is_state).select([name for name, _ in IN_COLUMNS])

    return _partition_runner(rules, start_ms, watermark_ms, markers, changes, split)


def _partition_runner(
    rules: Rules,
    start_ms: int | None,
    watermark_ms: int,
    markers: bool,
    changes: bool,
    split: Callable[[list[pa.RecordBatch]], tuple[pa.Table, pa.Table]],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The one body of both partition functions: ``split`` makes a partition's non-empty
    input batches its (events, state) rows of :data:`IN_COLUMNS`, which
    :func:`_process` runs. No rows in: no rows out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Paused from the first row in to the last row out: the conversions
        # allocate a tuple per row, and the restored state is most of the heap.
        with cyclic_gc_paused():
            started = time.perf_counter()
            given = [b for b in batches if b.num_rows]
            if not given:
                return
            events, state = split(given)
            out = _process(rules, start_ms, watermark_ms, events, state, markers, changes,
                           started)  # fmt: skip
        yield from out

    return run


def _concat(pa: Any, batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """Non-empty ``batches`` as one table of ``schema`` (their columns cast to its types)."""
    return pa.concat_tables([pa.Table.from_batches([b]).cast(schema) for b in batches])


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
    import pyarrow.compute as pc

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
    event_rows: pa.Table,
    state_rows: pa.Table,
    markers: bool,
    changes: bool,
    started: float,
) -> list[pa.RecordBatch]:
    """One partition's events and state rows (:data:`IN_COLUMNS`) in; its rows out (see
    the module doc's steps). No rows in, no rows out. ``started``: when the
    partition's function started (its ``udf_seconds``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not event_rows.num_rows and not state_rows.num_rows:
        return []
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
        self.schema = out_schema()
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

    def _repeat(self, value: str, n: int) -> Any:
        return self.pa.array([value] * n, self.pa.string())

    def _state_rows(self, kind: Any, change: str, state: Any) -> None:
        """Carried ``state`` rows (:data:`IN_COLUMNS`) as rows of ``kind``, marked ``change``."""
        import pyarrow.compute as pc

        n = state.num_rows
        pending = self.pa.scalar(STATE_PENDING, self.pa.string())
        self._add(n, {
            "kind": kind, "state_kind": state["state_kind"], "change": self._repeat(change, n),
            "rule": state["rule"], "key": state["key"], "id": state["event_id"],
            "time": state["time"], "deadline": state["deadline"],
            "outcome": pc.if_else(pc.equal(state["state_kind"], pending), pending, None),
        })  # fmt: skip

    def carried(self, state: Any) -> None:
        """The untouched state rows, column for column, as they came (``kept``). O(rows)."""
        if state.num_rows:
            self._state_rows(state["state_kind"], CHANGE_KEPT, state)

    def replaced(self, state: Any) -> None:
        """The state rows the processor took in, as ``replaced`` rows (``removed``) with
        their kind in ``state_kind``: what the next state no longer holds as it came
        (the processor's ``pending`` and ``expired`` rows hold what it holds). O(rows)."""
        if state.num_rows:
            self._state_rows(self._repeat("replaced", state.num_rows), CHANGE_REMOVED, state)

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
        arrays = {"kind": self._repeat(kind, n)}
        arrays["rule"] = self.rule_names.take(given.pop("rule"))
        arrays.update(given)
        if kind == "outcome":
            import pyarrow.compute as pc

            arrays["latency_ms"] = pc.subtract(arrays["resolved_at"], arrays["time"])
        elif kind in (STATE_PENDING, STATE_EXPIRED):  # the next state's: made here
            arrays["state_kind"] = arrays["kind"]
            arrays["change"] = self._repeat(CHANGE_ADDED, n)
            if kind == STATE_PENDING:  # an outcome to a batch run (its ``outcomes`` table)
                arrays["outcome"] = arrays["kind"]
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
