"""The one step: records in, delayed operations' outcomes out, on any Spark DataFrame.

:class:`DelayedOperations` runs the stages in order; each is one module of
this package:

1. :mod:`.records`: read and validate the records, whatever their form;
2. :mod:`.classify`: classify and deduplicate them, with the events carried
   from earlier micro-batches, in one window by event id (persisted);
3. :mod:`.watermark`: count them in one aggregate, and advance the watermark;
4. :mod:`.fanout`: one row per (kept event, rule using its type);
5. :mod:`.partition`: with the carried operations, by (rule, key), through one
   purgatory per partition (persisted; a small micro-batch's one partition
   runs in the driver: :data:`.placement.DRIVER_ROWS`);
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
from .classify import C_EVENT, classify
from .fanout import rule_events
from .frames import (
    driver_copy,
    empty_frame,
    from_arrow,
    parameter_name,
    run_parameters,
    sql_name,
    to_arrow,
    with_parameters,
)
from .outputs import (
    OPS_COLUMNS,
    PartitionStats,
    buffered_table,
    late_table,
    next_events,
    next_ops,
    ops_changes,
    ops_rows,
    outcome_table,
    rejected_table,
    unmatched_table,
)
from .partition import (
    IN_COLUMNS,
    OUT_DDL,
    run_partition_on_arrow,
    run_partitions,
    state_input_frame,
    state_inputs,
)
from .placement import Placement
from .records import (
    DEFAULT_MAX_FUTURE_MS,
    input_form,
    key_column,
    parse_max_future,
    parse_records,
    record_fields_frame,
    rejected_records,
    used_type,
)
from .session import default_parallelism
from .watermark import RecordCounts, advance_watermark

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

__all__ = [
    "CarriedOps",
    "CarriedState",
    "DelayedOperations",
    "StepOptions",
    "delayed_operations",
]


class CarriedOps(Protocol):
    """Carried operations held where a micro-batch takes in only those it can change
    (the stream's :class:`~tickwheel.pipeline.stream.ops_index.OpsIndex`)."""

    def take_touched(self, keys: Mapping[str, pa.Array], watermark: int) -> pa.Table:
        """Take out, and return, the operations (:data:`.outputs.OPS_COLUMNS`) that a
        micro-batch whose events have ``keys`` (by rule name) can change at
        ``watermark``: those the partitions would not pass through unchanged."""


@dataclass(frozen=True)
class CarriedState:
    """What a stream carries from one micro-batch to the next.

    ``events`` has the columns of :func:`.outputs.next_events`, ``ops`` those
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
    # rows, up to ``partitions`` (the stream: .placement.MICRO_BATCH_ROWS_PER_PARTITION).
    rows_per_partition: int | None = None


class DelayedOperations:
    """The step over one records frame: lazy tables, with their shared stages persisted.

    The first table or count asked for runs the stages it needs; the
    classified records and the partitions' rows are persisted, so reading all
    the tables runs each stage once. :meth:`unpersist` (or leaving a ``with``
    block) releases them. Costs: classifying is one shuffle by event id and a
    sort; the purgatory one shuffle by (rule, key), a sort in each partition
    and O(1) per event (amortised) in the timing wheel.
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
        # This run's values as data, not literals: see frames.run_parameters.
        self.params = run_parameters(spark, limit=self.future_limit, w_prev=self.state.watermark)
        self._classified_plan = classify(
            self._parsed(records),
            len(rules.key_fields),
            self.partitions,
            carried=self._carried_events(),
            keep_raw=opts.carry,
        )
        self._classified: DataFrame | None = None
        self._records_in_driver = False  # the classified records held in the driver
        self._touched: pa.Table | None = None  # the held operations taken in
        self._counts: RecordCounts | None = None
        self._rows: DataFrame | None = None
        self._stats: PartitionStats | None = None

    # -- stages 1-2 --------------------------------------------------------------
    def _parsed(self, records: DataFrame) -> DataFrame:
        fields = record_fields_frame(records, self.rules, self.form)
        refused = rejected_records(self.spark, self.rules, self.options.refused)
        if refused is not None:
            fields = fields.unionByName(refused)
        limit = None if self.future_limit is None else parameter_name("limit")
        return parse_records(with_parameters(fields, self.params), self.rules, limit)

    def _carried_events(self) -> DataFrame | None:
        """The carried events in the columns of the parsed records."""
        events = self.state.events
        if events is None:
            return None
        return with_parameters(events, self.params).selectExpr(
            "raw",
            "CAST(NULL AS STRING) AS reason",
            "event_id",
            "event_type",
            "`time`",
            "seq",
            *[f"{sql_name(f'k_{name}')} AS {key_column(i)}"
              for i, name in enumerate(self.rules.key_fields)],
            f"{used_type(self.rules, 'event_type')} AS relevant",
            *[sql_name(c) for c in self.params],
        )  # fmt: skip

    def classified(self) -> DataFrame:
        """The classified records (:func:`.classify.classify`), persisted on first use.

        Once counted, a micro-batch small enough (:attr:`Placement.runs_in_driver`)
        has them held in the driver instead (:func:`.frames.driver_copy`): its
        purgatory's input and its tables then read them with no shuffle and no
        scan of a cache.
        """
        if self._classified is None:
            self._classified = _persisted(self._classified_plan)
        return self._classified

    # -- stage 3 -------------------------------------------------------------------
    def counts(self) -> RecordCounts:
        """The records' counts: the first action, which classifies them (a small
        micro-batch's in the one job that collects them: :meth:`_collected_if_few`). Cached."""
        if self._counts is None:
            collected = self._collected_if_few()
            if collected is None:
                self._counts = RecordCounts.collect(self.classified())
            else:
                self._counts = RecordCounts.of_table(collected)
            if self._records_placement().runs_in_driver:  # known from the counts
                cached = self.classified()
                self._classified = driver_copy(cached, collected)
                self._records_in_driver = True
                cached.unpersist()
        return self._counts

    def _collected_if_few(self) -> pa.Table | None:
        """The classified records as Arrow, when there may be few enough to hold in the
        driver (:attr:`Placement.runs_in_driver`) and are: one job that reads, classifies
        and hands them over, counted then in the driver. None when more: their counts
        are then an aggregate over the cached frame, so a larger micro-batch pays one
        more job and the transfer of its first rows. O(records)."""
        per = self.options.rows_per_partition
        if per is None:
            return None
        most = Placement.driver_rows(per)
        collected = self.classified().limit(most + 1).toArrow()
        return collected if collected.num_rows <= most else None

    def _records_placement(self) -> Placement:
        """Where the records go, from the counts: held in the driver when the run, the
        carried operations it takes in aside (held ones are known only from the
        records' keys: :meth:`touched_ops`), fits :attr:`Placement.runs_in_driver`."""
        state, counts = self.state, self.counts()
        if state.held_ops is not None:
            rows: int | None = counts.kept
        else:
            unknown = state.rows is None and (state.events is not None or state.ops is not None)
            rows = None if unknown else counts.kept + (state.rows or 0)
        return Placement.of(self.partitions, self.options.rows_per_partition, counts.records, rows)

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

    # -- stages 4-5 ------------------------------------------------------------------
    def rows(self) -> DataFrame:
        """The partitions' rows (:data:`.partition.OUT_COLUMNS`), persisted on first use.

        A micro-batch small enough (:attr:`Placement.runs_in_driver`) has its one
        partition run in the driver (:func:`.partition.run_partition_on_arrow`),
        with no shuffle and no Python worker; its rows are then held there.
        """
        if self._rows is None:
            watermark = self.watermark
            if watermark is None:  # no event, nothing carried: no partition has rows
                self._rows = empty_frame(self.spark, OUT_DDL)
            elif self.placement.runs_in_driver:
                self._rows = run_partition_on_arrow(
                    self.spark,
                    self._partition_input_table(),
                    self.rules,
                    self.state.watermark,
                    watermark,
                    markers=self.options.carry,
                    changes=self.options.carry,
                )
            else:
                self._rows = _persisted(
                    run_partitions(
                        self._partition_inputs(),
                        self.rules,
                        self.placement.partitions,
                        self.state.watermark,
                        watermark,
                        markers=self.options.carry,
                        changes=self.options.carry,
                    )
                )
        return self._rows

    @property
    def placement(self) -> Placement:
        """Where and how wide the purgatory runs (:class:`Placement`): from the records
        and the rows it takes in, the kept events and the carried operations (of held
        ones, those it touches: :meth:`touched_ops`). O(1) once counted and taken."""
        if self.state.held_ops is None:
            return self._records_placement()
        counts = self.counts()
        rows = counts.kept + self.touched_ops().num_rows
        return Placement.of(self.partitions, self.options.rows_per_partition, counts.records, rows)

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

            keys = to_arrow(self._event_inputs().select("rule", "key"))
            by_rule = {
                rule.name: keys.filter(pc.equal(keys["rule"], rule.name))["key"]
                for rule in self.rules.rules
            }
            self._touched = held.take_touched(by_rule, watermark)
        return self._touched

    def _event_inputs(self) -> DataFrame:
        """The kept events not applied yet, one row per rule, in :data:`.partition.IN_COLUMNS`."""
        kept = self.classified().where(f"c = {C_EVENT} AND NOT applied")
        given = ("rule", "key", "time", "seq", "event_id", "event_type")
        return rule_events(kept, self.rules).selectExpr(
            *[sql_name(name) if name in given else f"CAST(NULL AS {ddl}) AS {name}"
              for name, ddl in IN_COLUMNS]
        )  # fmt: skip

    def _carried_ops(self) -> DataFrame | None:
        """The carried operations the purgatory takes in (of held ones, those touched)."""
        if self.state.held_ops is not None:
            return from_arrow(self.spark, self.touched_ops())
        return self.state.ops

    def _partition_inputs(self) -> DataFrame:
        """The kept events not applied yet, one row per rule, and the carried operations."""
        events, ops = self._event_inputs(), self._carried_ops()
        if ops is None:
            return events
        return events.unionByName(state_input_frame(ops))

    def _partition_input_table(self) -> pa.Table:
        """:meth:`_partition_inputs` as Arrow in the driver: the events collected (without a
        job when the records are held there), the carried operations as they are held."""
        import pyarrow as pa

        events = to_arrow(self._event_inputs())
        if self.state.held_ops is not None:
            ops = state_inputs(self.touched_ops())
        elif self.state.ops is not None:
            ops = to_arrow(state_input_frame(self.state.ops))
        else:
            return events
        # Spark says which columns the events never leave null; the operations leave seq null.
        schema = pa.schema([field.with_nullable(True) for field in events.schema])
        return pa.concat_tables([events.cast(schema), ops.cast(schema)])

    def stats(self) -> PartitionStats:
        """The partitions' counters, merged: the action that runs the purgatory. Cached."""
        if self._stats is None:
            self._stats = PartitionStats.collect(self.rows())
        return self._stats

    # -- stage 6: the tables -----------------------------------------------------------
    @property
    def outcomes(self) -> DataFrame:
        """Final outcomes and one ``pending`` row per operation still pending at W."""
        return outcome_table(self.rows(), with_pending=True)

    @property
    def final_outcomes(self) -> DataFrame:
        """Final outcomes only (completed, expired, cancelled): what the stream writes."""
        return outcome_table(self.rows(), with_pending=False)

    @property
    def unmatched(self) -> DataFrame:
        """Complete and cancel events that found no pending operation, with the reason."""
        return unmatched_table(self.rows())

    @property
    def rejected(self) -> DataFrame:
        """Invalid records and conflicting copies, with the reason and the raw text."""
        return rejected_table(self.classified())

    @property
    def buffered(self) -> DataFrame:
        """Events above the watermark, one row per rule using their type, not applied."""
        return buffered_table(self.rows())

    @property
    def late(self) -> DataFrame:
        """Valid records older than the previous watermark (none without carried state)."""
        return late_table(with_parameters(self.classified(), self.params), self.rules)

    def next_state(self) -> dict[str, DataFrame]:
        """The state the next micro-batch needs: ``events`` and ``ops`` (see CarriedState).

        The events are those at or above the new watermark. Spark compiles that
        bound into the query's code unless it reads it as data (a run
        parameter), except over events held in the driver, where it evaluates
        the filter as it plans it: there the bound is a literal. Needs
        :attr:`StepOptions.carry`, which keeps the raw text and the expiry
        markers the next state is made of.
        """
        if not self.options.carry:
            raise ValueError("next_state needs StepOptions(carry=True): it keeps what is carried")
        watermark, events = self.watermark, self.classified()
        if watermark is None:
            bound = None
        elif self._records_in_driver:
            bound = str(watermark)
        else:
            events = with_parameters(events, run_parameters(self.spark, w_new=watermark))
            bound = sql_name(parameter_name("w_new"))
        return {"events": next_events(events, self.rules, bound), "ops": next_ops(self.rows())}

    def state_changes(self) -> dict[str, DataFrame]:
        """How :meth:`next_state`'s ``ops`` differ from the state carried in: the rows
        added and removed (:func:`.outputs.ops_changes`), read off the partitions'
        rows. Needs :attr:`StepOptions.carry`."""
        if not self.options.carry:
            raise ValueError("state_changes needs StepOptions(carry=True)")
        return ops_changes(self.rows())

    def ops_rows(self) -> DataFrame:
        """The carried operations with their change (:func:`.outputs.ops_rows`): the
        next state's ``ops`` and its changes in one frame, collected at once."""
        return ops_rows(self.rows())

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
        self._counts = self._stats = None

    def __enter__(self) -> DelayedOperations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unpersist()


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
