"""The one step: records in, delayed operations' outcomes out, on any Spark DataFrame.

Spark parses, Arrow decides. :class:`DelayedOperations` runs the stages in
order; each is one module of this package:

1. :mod:`.records`: read and validate the records, whatever their form;
2. :mod:`.classify`: classify and deduplicate them, with the events carried
   from earlier micro-batches, in one window by event id;

   (both in Catalyst, in one Spark job that counts the records too; then, as
   Arrow functions, in the driver or on the executors as :mod:`.placement`
   says:)
3. :mod:`.watermark`: the counts, and the watermark;
4. :mod:`.fanout`: one row per (kept event, rule using its type);
5. :mod:`.partition`: with the carried operations, by (rule, key), through one
   purgatory per partition;
6. :mod:`.outputs`: the tables, the next state and the counters.

Two drivers call it. The batch driver (:func:`delayed_operations`, and
``tickwheel pipeline run`` through :mod:`tickwheel.pipeline.batch`) gives it no
state and takes the final rows: pending operations are ``pending`` outcomes,
and events above the watermark are ``buffered``. The stream
(:mod:`tickwheel.pipeline.stream`) gives it the state the previous
micro-batch committed and carries the next state on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..rules import Rules, load_rules
from .classify import classify
from .fanout import APPLIED_EVENTS, events_to_apply, routed_events, rule_events
from .frames import (
    Step,
    empty_frame,
    frame_ref,
    from_arrow,
    parameter_columns,
    parameter_name,
    run_parameters,
    sql_name,
    sql_over,
    steps_sql,
    to_arrow,
)
from .outputs import (
    BUFFERED,
    OPS_COLUMNS,
    OPS_ROWS,
    OUTCOMES,
    OUTCOMES_WITH_PENDING,
    REJECTED,
    UNMATCHED,
    PartitionStats,
    Shape,
    late_shape,
    next_events_shape,
    split_ops,
    split_ops_frame,
)
from .partition import OUT_DDL, out_schema, run_partition, run_partitions
from .placement import Placement
from .records import (
    DEFAULT_MAX_FUTURE_MS,
    input_form,
    json_value_steps,
    key_column,
    parse_max_future,
    parse_steps,
    parsed_columns,
    record_fields_frame,
    rejected_records,
    used_type,
)
from .session import default_parallelism, is_local_master
from .watermark import RecordCounts, advance_watermark

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

__all__ = [
    "TABLES",
    "CarriedOps",
    "CarriedState",
    "DelayedOperations",
    "StepOptions",
    "delayed_operations",
]


class CarriedOps(Protocol):
    """Carried operations held where a micro-batch takes in only those it can change
    (the stream's :class:`~tickwheel.pipeline.stream.state.ops_index.OpsIndex`)."""

    def take_touched(self, keys: Mapping[str, pa.Array], watermark: int) -> pa.Table:
        """Take out, and return, the operations (:data:`.outputs.OPS_COLUMNS`) that a
        micro-batch whose events have ``keys`` (by rule name) can change at
        ``watermark``: those the partitions would not pass through unchanged."""


@dataclass(frozen=True)
class CarriedState:
    """What a stream carries from one micro-batch to the next.

    ``events`` has the columns of :func:`.outputs.next_events_shape`, ``ops`` those
    of :data:`.outputs.OPS_COLUMNS`; either may be None (nothing carried).
    ``rows`` is their number of rows together, when known (it sizes the
    purgatory: :attr:`StepOptions.rows_per_partition`). ``held_ops``, instead
    of ``ops``: the operations held by the stream, of which the purgatory
    takes in only those the micro-batch can change (:meth:`DelayedOperations.touched_ops`);
    the others stay where they are, and the step's next state and changes are
    then those of the operations taken in.
    """

    watermark: int | None
    max_time: int | None
    events: DataFrame | None = None
    ops: DataFrame | None = None
    rows: int | None = None
    held_ops: CarriedOps | None = None


@dataclass(frozen=True)
class StepOptions:
    """How :class:`DelayedOperations` runs; every field has a default."""

    partitions: int | None = None  # key-hash partitions; default: Spark's default parallelism
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS  # None: no far-future guard
    now_ms: int | None = None  # processing time for the guard; default: the clock now
    input_format: str | None = None  # see .records.FORMS; None: guessed
    # Keep what the next micro-batch needs: kept events' raw text, keys' expiry markers.
    carry: bool = False
    refused: Sequence[tuple[str, str]] = ()  # (raw, reason) of records refused before reading
    event_times: Sequence[int] = ()  # more event times seen (the stream's heartbeats)
    # None: the purgatory runs in ``partitions``. Else one partition per this many
    # rows, up to ``partitions`` (the stream: .placement.MICRO_BATCH_ROWS_PER_PARTITION),
    # and a run small enough runs in the driver (.placement.Placement).
    rows_per_partition: int | None = None
    # The records are expected few enough for the driver (a stream's last micro-batch
    # was): they are classified in one partition, with no shuffle and no cache.
    expect_driver: bool = False


class DelayedOperations:
    """The step over one records frame: lazy tables, in Arrow or in Spark as it is placed.

    Spark parses: the records are read, validated and classified in Catalyst
    (stages 1-2), in one job that also counts them. Arrow decides: everything
    after (the watermark, the fan-out, the carried operations taken in, the
    purgatory, the tables) is Arrow functions, run where the
    :class:`~.placement.Placement` says: in the driver, for a micro-batch small
    enough to collect, with no Spark plan after its one job; else on the
    executors, the classified records persisted and the purgatory one
    ``mapInArrow`` after a shuffle by key. :meth:`unpersist` (or leaving a
    ``with`` block) releases what Spark persisted. Costs: classifying is one
    shuffle by event id and a sort (none for a micro-batch expected small:
    :attr:`StepOptions.expect_driver`); on the executors the purgatory is one
    shuffle by key and a sort in each partition; O(1) per event (amortised) in
    the timing wheel.
    """

    def __init__(
        self,
        records: DataFrame,
        rules: Rules,
        options: StepOptions | None = None,
        state: CarriedState | None = None,
    ) -> None:
        """Check the options and plan the first stages; nothing runs yet. O(columns)."""
        from .workers import check_workers

        opts = options or StepOptions()
        spark = records.sparkSession
        check_workers(spark)  # one small job, the first time per application (see .workers)
        self.rules, self.options, self.state = rules, opts, state or CarriedState(None, None)
        self.spark = spark
        self.partitions = _check_partitions(opts.partitions, default_parallelism(spark))
        if opts.rows_per_partition is not None:
            _check_partitions(opts.rows_per_partition, 1, name="rows_per_partition")
        if opts.max_future_ms is not None and (
            type(opts.max_future_ms) is not int or opts.max_future_ms < 0
        ):
            raise ValueError(
                f"max_future must be a duration >= 0 or None, got {opts.max_future_ms!r}"
            )
        now_ms = int(time.time() * 1000) if opts.now_ms is None else opts.now_ms
        self.future_limit = None if opts.max_future_ms is None else now_ms + opts.max_future_ms
        self.form = input_form(records, rules, opts.input_format)
        self._records = records
        self._classified: DataFrame | None = None  # persisted, or the held records' relation
        self._held_records: pa.Table | None = None  # the classified records held in the driver
        self._touched: pa.Table | None = None  # the held operations taken in
        self._counts: RecordCounts | None = None
        self._rows: DataFrame | None = None  # the partitions' rows, on the executors
        self._held_rows: pa.Table | None = None  # the partitions' rows, in the driver
        self._stats: PartitionStats | None = None

    # -- stages 1-2: Spark parses ------------------------------------------------------
    def _classified_plan(self, partitions: int | None) -> DataFrame:
        """Stages 1-2 planned: the records read, validated and classified, with the carried
        events, in one window by event id over ``partitions`` partitions (None: one
        partition, no shuffle). One query in SQL text over the records (and the
        carried events), analysed once (:func:`.frames.sql_over`). Lazy."""
        rules, frames = self.rules, {"records": self._records}
        if self.form == "json":
            fields = steps_sql(frame_ref("records"), json_value_steps(rules))
        else:
            frames["records"] = record_fields_frame(self._records, rules, self.form)
            fields = f"SELECT * FROM {frame_ref('records')}"
        refused = rejected_records(self.spark, rules, self.options.refused)
        if refused is not None:
            frames["refused"] = refused
            fields = f"{fields} UNION ALL SELECT * FROM {frame_ref('refused')}"
        # This run's values as data, not literals: see frames.parameter_sql.
        limit = None if self.future_limit is None else parameter_name("limit")
        parsed = steps_sql(f"({fields})", [
            ("select", ["*", *parameter_columns(limit=self.future_limit)]),
            *parse_steps(rules, limit, ()),
        ])  # fmt: skip
        carried = None
        if self.state.events is not None:
            frames["carried"] = self.state.events
            carried = steps_sql(frame_ref("carried"), [self._carried_events()])
        query = classify(
            parsed, parsed_columns(rules), len(rules.key_fields), partitions,
            self.state.watermark, carried, keep_raw=self.options.carry,
        )  # fmt: skip
        return sql_over(self.spark, query, frames)

    def _carried_events(self) -> Step:
        """The step that gives the carried events the columns of the parsed records."""
        return ("select", [
            "raw",
            "CAST(NULL AS STRING) AS reason",
            "event_id",
            "event_type",
            "`time`",
            "seq",
            *[f"{sql_name(f'k_{name}')} AS {key_column(i)}"
              for i, name in enumerate(self.rules.key_fields)],
            f"{used_type(self.rules, 'event_type')} AS relevant",
        ])  # fmt: skip

    def classified(self) -> DataFrame:
        """The classified records (:func:`.classify.classify`) as a frame: persisted on
        first use, or, once counted, those held in the driver as a local relation."""
        if self._classified is None:
            if self._held_records is not None:
                self._classified = from_arrow(self.spark, self._held_records)
            else:
                self._classified = _persisted(self._classified_plan(self.partitions))
        return self._classified

    # -- stage 3: the counts and the watermark ----------------------------------------
    def counts(self) -> RecordCounts:
        """The records' counts: the first action, which classifies them. Cached.

        A micro-batch expected small (:attr:`StepOptions.expect_driver`) is read,
        classified and collected to the driver in one job, without a cache, and
        counted there; on a local master in one partition, with no shuffle (on a
        cluster the shuffle keeps the records' scan on many executors, near their
        files). Any other run is classified once, persisted, and counted by one
        aggregate; then, a stream's micro-batch few enough for the driver
        (:meth:`Placement.driver_rows`) is collected there from the cache, one
        more job. One expected small that proves larger is classified again.
        """
        if self._counts is None:
            per = self.options.rows_per_partition
            most = None if per is None else Placement.driver_rows(per)
            collected = None
            if most is not None and self.options.expect_driver:
                one = is_local_master(self.spark)
                plan = self._classified_plan(None if one else self.partitions)
                collected = plan.limit(most + 1).toArrow()
                if collected.num_rows > most:
                    collected = None
            if collected is not None:
                self._counts = RecordCounts.of_table(collected)
            else:
                cached = self.classified()
                self._counts = RecordCounts.collect(cached)
                if most is not None and self._counts.records <= most:
                    collected = cached.toArrow()
                    cached.unpersist()
                    self._classified = None
            self._held_records = collected
        return self._counts

    @property
    def watermark(self) -> int | None:
        """The new watermark W (needs :meth:`counts`). O(1) once counted."""
        return self._watermark()[0]

    @property
    def max_time(self) -> int | None:
        """The largest event time seen, carried or new. O(1) once counted."""
        return self._watermark()[1]

    def _watermark(self) -> tuple[int | None, int | None]:
        times = (self.state.max_time, self.counts().max_time, *self.options.event_times)
        return advance_watermark(self.state.watermark, times, self.rules.input.allowed_lateness_ms)

    # -- where Arrow decides ------------------------------------------------------------
    @property
    def placement(self) -> Placement:
        """Where and how wide the purgatory runs (:class:`Placement`): from the records
        and the rows it takes in, the kept events and the carried operations (of held
        ones, those it touches: :meth:`touched_ops`). O(1) once counted and taken."""
        counts, state = self.counts(), self.state
        if state.held_ops is not None:
            rows: int | None = counts.kept + self.touched_ops().num_rows
        elif state.rows is None and (state.events is not None or state.ops is not None):
            rows = None  # unknown
        else:
            rows = counts.kept + (state.rows or 0)
        return Placement.of(self.partitions, self.options.rows_per_partition, counts.records, rows)

    @property
    def records_in_driver(self) -> bool:
        """Whether the classified records were few enough to collect to the driver, where
        they are held (needs :meth:`counts`). O(1)."""
        self.counts()
        return self._held_records is not None

    @property
    def in_driver(self) -> bool:
        """Whether the step after the records' job runs in the driver, on Arrow. O(1) once
        counted and taken."""
        return self.placement.in_driver

    def _rule_events(self) -> pa.Table:
        """The events the purgatory applies, one row per rule (:func:`.fanout.rule_events`),
        as Arrow in the driver: from the records held there, else collected (one job)."""
        if self._held_records is not None:
            return rule_events(events_to_apply(self._held_records), self.rules)
        return rule_events(self.classified().where(APPLIED_EVENTS).toArrow(), self.rules)

    def touched_ops(self) -> pa.Table:
        """The held operations this micro-batch can change, taken out of
        :attr:`CarriedState.held_ops` once (:data:`.outputs.OPS_COLUMNS`): those of the
        keys of its events, and those due by its watermark. The keys are read in the
        driver: from the records held there without a job, else one job."""
        held = self.state.held_ops
        assert held is not None, "touched_ops needs operations held by the stream"
        if self._touched is None:
            watermark = self.watermark
            if watermark is None:  # no event, nothing carried
                import pyarrow as pa

                self._touched = pa.table({name: [] for name in OPS_COLUMNS})
                return self._touched
            import pyarrow.compute as pc  # type: ignore[import-untyped]

            keys = self._rule_events()
            by_rule = {
                rule.name: keys.filter(pc.equal(keys["rule"], rule.name))["key"]
                for rule in self.rules.rules
            }
            self._touched = held.take_touched(by_rule, watermark)
        return self._touched

    # -- stages 4-5: the fan-out and the purgatory ----------------------------------------
    def rows(self) -> DataFrame:
        """The partitions' rows (:data:`.partition.OUT_COLUMNS`) as a frame: persisted on
        first use, or, in the driver, a local relation of its rows."""
        if self.in_driver:
            return from_arrow(self.spark, self._rows_in_driver())
        return self._rows_on_executors()

    def _rows_in_driver(self) -> pa.Table:
        """The purgatory's one partition run in the driver (:func:`.partition.run_partition`),
        from the records and the operations held there: no plan, no Python worker."""
        if self._held_rows is None:
            watermark = self.watermark
            if watermark is None:  # no event, nothing carried: no partition has rows
                self._held_rows = out_schema().empty_table()
            else:
                self._held_rows = run_partition(
                    self._rule_events(),
                    self._carried_ops_table(),
                    self.rules,
                    self.state.watermark,
                    watermark,
                    markers=self.options.carry,
                    changes=self.options.carry,
                )
        return self._held_rows

    def _carried_ops_table(self) -> pa.Table | None:
        """The carried operations the purgatory takes in, as Arrow in the driver."""
        if self.state.held_ops is not None:
            return self.touched_ops()
        if self.state.ops is not None:
            return to_arrow(self.state.ops)
        return None

    def _rows_on_executors(self) -> DataFrame:
        """The purgatory on the executors (:func:`.partition.run_partitions`), persisted."""
        if self._rows is None:
            watermark = self.watermark
            if watermark is None:  # no event, nothing carried: no partition has rows
                self._rows = empty_frame(self.spark, OUT_DDL)
            else:
                ops = self.state.ops
                if self.state.held_ops is not None:
                    ops = from_arrow(self.spark, self.touched_ops())
                self._rows = _persisted(
                    run_partitions(
                        routed_events(self.classified(), self.rules),
                        ops,
                        self.rules,
                        self.placement.partitions,
                        self.state.watermark,
                        watermark,
                        markers=self.options.carry,
                        changes=self.options.carry,
                    )
                )
        return self._rows

    def stats(self) -> PartitionStats:
        """The partitions' counters, merged: the action that runs the purgatory. Cached."""
        if self._stats is None:
            if self.in_driver:
                self._stats = PartitionStats.of_table(self._rows_in_driver())
            else:
                self._stats = PartitionStats.collect(self._rows_on_executors())
        return self._stats

    # -- stage 6: the tables -----------------------------------------------------------
    def tables(self, names: Sequence[str]) -> dict[str, pa.Table | DataFrame]:
        """The tables ``names`` (of :data:`TABLES`), each as Arrow when the step runs in the
        driver, else as a lazy frame: a choice of the partitions' rows or of the
        classified records (:class:`.outputs.Shape`)."""
        return {name: self._table(name) for name in names}

    def _table(self, name: str) -> pa.Table | DataFrame:
        shape, source = self._shape(name)
        values = {"w_prev": self.state.watermark, "w_new": self.watermark}
        if self.in_driver:
            rows = self._rows_in_driver() if source == "rows" else self._held_records
            return shape.of_arrow(rows, values)
        frame = self._rows_on_executors() if source == "rows" else self.classified()
        return shape.of_frame(frame, run_parameters(**values))

    def _shape(self, name: str) -> tuple[Shape, str]:
        """The shape of the table ``name``, and what it is read from: ``rows`` (the
        partitions') or ``records`` (the classified)."""
        from_rows = {
            "outcomes": OUTCOMES_WITH_PENDING,
            "final_outcomes": OUTCOMES,
            "unmatched": UNMATCHED,
            "buffered": BUFFERED,
            "ops_rows": OPS_ROWS,
        }
        if name in from_rows:
            return from_rows[name], "rows"
        if name == "rejected":
            return REJECTED, "records"
        if name == "late":
            return late_shape(self.rules), "records"
        if name == "events":
            return next_events_shape(self.rules), "records"
        raise ValueError(f"no table {name!r}; the step's tables are {', '.join(TABLES)}")

    def _frame(self, name: str) -> DataFrame:
        table = self._table(name)
        return from_arrow(self.spark, table) if self.in_driver else table

    @property
    def outcomes(self) -> DataFrame:
        """Final outcomes and one ``pending`` row per operation still pending at W."""
        return self._frame("outcomes")

    @property
    def final_outcomes(self) -> DataFrame:
        """Final outcomes only (completed, expired, cancelled): what the stream writes."""
        return self._frame("final_outcomes")

    @property
    def unmatched(self) -> DataFrame:
        """Complete and cancel events that found no pending operation, with the reason."""
        return self._frame("unmatched")

    @property
    def rejected(self) -> DataFrame:
        """Invalid records and conflicting copies, with the reason and the raw text."""
        return self._frame("rejected")

    @property
    def buffered(self) -> DataFrame:
        """Events above the watermark, one row per rule using their type, not applied."""
        return self._frame("buffered")

    @property
    def late(self) -> DataFrame:
        """Valid records older than the previous watermark (none without carried state)."""
        return self._frame("late")

    def next_state(self) -> dict[str, pa.Table | DataFrame]:
        """The state the next micro-batch needs: ``events`` and ``ops`` (see CarriedState),
        as Arrow in the driver, else as frames. The events are those at or above the
        new watermark. Needs :attr:`StepOptions.carry`, which keeps the raw text and
        the expiry markers the next state is made of."""
        if not self.options.carry:
            raise ValueError("next_state needs StepOptions(carry=True): it keeps what is carried")
        return {"events": self._table("events"), "ops": self.state_changes()["ops"]}

    def state_changes(self) -> dict[str, pa.Table | DataFrame]:
        """The carried operations after the purgatory (``ops``) and how they differ from
        those carried in (``ops.added``, ``ops.removed``): choices of the partitions'
        rows (:func:`.outputs.split_ops`), with no join against the state before. As
        Arrow in the driver, else as frames. Needs :attr:`StepOptions.carry`."""
        if not self.options.carry:
            raise ValueError("state_changes needs StepOptions(carry=True)")
        rows = self._table("ops_rows")
        return split_ops(rows) if self.in_driver else split_ops_frame(rows)

    def summary(self) -> dict[str, Any]:
        """The counts of ``summary.json``: records by class, rejects by reason, outcomes,
        the watermark, exact latency percentiles, the loop's own rate. Runs both actions."""
        counts, stats = self.counts(), self.stats()
        return {
            "partitions": self.partitions,
            "allowed_lateness_ms": self.rules.input.allowed_lateness_ms,
            "retention_ms": self.rules.input.retention_ms,  # None: off
            "max_future_ms": self.options.max_future_ms,
            "far_future_after_ms": self.future_limit,
            "max_event_time": self.max_time,
            "watermark": self.watermark,
            "counts": {
                "records": counts.records,
                "rejected": counts.rejected_total,
                "rejected_by_reason": counts.rejected,
                "duplicates": counts.duplicates,
                "conflicts": counts.rejected.get("conflict", 0),
                "events": counts.events,
                "ignored": counts.ignored,
                "late": counts.late,
                "rule_events": stats.events,
                "buffered": stats.buffered,
                "outcomes": stats.outcomes,
                "unmatched": stats.unmatched,
            },
            "latency_ms": stats.latency,
            "loop": stats.summary(),
        }

    def unpersist(self) -> None:
        """Release the persisted stages (a later table recomputes them). O(1)."""
        for frame in (self._rows, self._classified):
            if frame is not None:
                frame.unpersist()
        self._rows = self._classified = None
        self._held_records = self._held_rows = None
        self._counts = self._stats = None

    def __enter__(self) -> DelayedOperations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unpersist()


#: The step's tables (:meth:`DelayedOperations.tables`): ``outcomes`` (with the pending
#: operations) and ``final_outcomes``, ``unmatched``, ``buffered``, ``rejected``,
#: ``late``; the next state's ``events`` and the carried operations with their change,
#: ``ops_rows``.
TABLES = ("outcomes", "final_outcomes", "unmatched", "buffered", "rejected", "late", "events",
          "ops_rows")  # fmt: skip


def _persisted(frame: DataFrame) -> DataFrame:
    """``frame`` persisted as Spark's ``Dataset.cache()`` keeps it: its column batches in
    memory as built, spilled to disk when memory runs short. Lazy.

    PySpark's ``MEMORY_AND_DISK`` is the serialized level (Python's own RDDs are
    pickled), under which Spark serializes each cached batch as it stores it
    and deserializes it at each scan: work the deserialized level skips.
    """
    from pyspark import StorageLevel

    return frame.persist(StorageLevel.MEMORY_AND_DISK_DESER)


def _check_partitions(partitions: int | None, default: int, name: str = "partitions") -> int:
    if partitions is None:
        return max(default, 1)
    if type(partitions) is not int or partitions < 1:
        raise ValueError(f"{name} must be an int >= 1, got {partitions!r}")
    return partitions


def delayed_operations(
    records: DataFrame,
    rules: Rules | str | os.PathLike[str],
    *,
    partitions: int | None = None,
    max_future: int | str | None = DEFAULT_MAX_FUTURE_MS,
    input_format: str | None = None,
    now_ms: int | None = None,
) -> DelayedOperations:
    """The delayed operations of ``records`` under ``rules``, as a batch: a DataFrame step.

    ``records`` is a (non-streaming) DataFrame from any source, of one of the
    forms of :mod:`.records`: a ``value`` column of text or bytes (JSON per row,
    as the ``text`` and Kafka sources give), or the ``[input]`` fields as
    columns; ``input_format`` (``"json"``, ``"columns"``, ``"maxwell"``) says
    which when guessing is not wanted. ``rules`` is a :class:`Rules` or a rules
    file's path. ``partitions`` is the number of key-hash partitions (default:
    Spark's default parallelism). ``max_future`` is the far-future guard: a
    record stamped later than ``now_ms`` (default: now) plus it is rejected as
    ``far_future`` (ms, a duration like ``"1d"``, or None/``"off"``).

    Returns a :class:`DelayedOperations` whose ``outcomes``, ``unmatched``,
    ``rejected`` and ``buffered`` are DataFrames with the columns and rows of
    ``tickwheel pipeline run``'s output directories, and whose ``summary()``
    gives ``summary.json``'s counts. Use it in a ``with`` block to release
    what it persists. Nothing runs until a table is read or counted.
    """
    if records.isStreaming:
        raise ValueError(
            "delayed_operations takes a batch DataFrame; for a streaming one use start_stream"
        )
    if not isinstance(rules, Rules):
        rules = load_rules(os.fspath(rules))
    options = StepOptions(
        partitions=partitions,
        max_future_ms=parse_max_future(max_future),
        now_ms=now_ms,
        input_format=input_format,
    )
    return DelayedOperations(records, rules, options)
