"""One micro-batch of the stream: the step with the carried state, then the commit that
makes it count, once (its part of ``docs/pipeline-design.md``, "One micro-batch" and
"Commit protocol (exactly once)")."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..attempt import Attempt
from ..rules import Rules, format_duration
from ..spark.classify import EVENT_STATE_COLUMNS
from ..spark.frames import as_arrow, as_frame, empty_frame, from_arrow, sql_name
from ..spark.outputs import OPS_COLUMNS, split_ops, split_ops_frame
from ..spark.step import CarriedState, DelayedOperations, StepOptions
from ..spark.watermark import RecordCounts
from .changelog import committed_frames, rebuild, write_tables
from .checkpoint import Commit, StateEntry, StateStore, StreamError, fault
from .evolution import StateAdjustment, rules_record
from .resident import (
    DRIVER_STATE_BYTES_ENV,
    UNMEASURED_ROW_BYTES,
    HeldState,
    ResidentState,
    format_bytes,
    next_entry,
    next_resident,
)
from .state import OpsProvider
from .state.ops_index import OpsIndex
from .state.partitioned import PartitionedOps

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ..sinks import BatchSink

__all__ = [
    "GAUGES",
    "TABLES",
    "MicroBatch",
    "MicroBatchInput",
    "abnormal_batch_warnings",
    "publish_outputs",
]

logger = logging.getLogger(__name__)

#: The tables a micro-batch gives its sink.
TABLES = ("outcomes", "unmatched", "rejected", "late")

#: The figures of :meth:`MicroBatch.run` that hold after the micro-batch, not of it
#: (the operations pending, the watermark): a run's summary gives the last, not a sum.
GAUGES = ("pending", "watermark")


@dataclass(frozen=True)
class MicroBatchInput:
    """What one micro-batch processes: its records and what its driver learnt besides."""

    records: DataFrame
    plan: Mapping[str, Any]  # the write-ahead plan: batch_id, now_ms (and the files)
    refused: Sequence[tuple[str, str]] = ()  # (raw, reason) refused before reading
    event_times: Sequence[int] = ()  # heartbeats: event times seen without records


class MicroBatch:
    """The computation and commit of one micro-batch of a stream.

    :meth:`run` takes its steps in order: run the step on the records with the
    carried state (:meth:`carried_state`), check the batch
    (:func:`abnormal_batch_warnings`), build its :class:`~.checkpoint.Commit`,
    commit (:meth:`commit`: the outputs and the next state staged under the
    attempt's own names, then the one new commit file), and publish
    (:func:`publish_outputs`).
    """

    def __init__(
        self,
        rules: Rules,
        store: StateStore,
        held: HeldState,
        sink: BatchSink,
        options: StepOptions,
        batch: MicroBatchInput,
        adjustment: StateAdjustment | None = None,
        outcome_counts: bool = False,
    ) -> None:
        """O(1) but for the previous commit, read (or known) once.

        ``held`` is the state the runner holds between micro-batches.
        ``adjustment`` (:func:`.evolution.check_rules_change`) says what to drop
        from the state of the batch it names, when this batch carries that one.
        ``outcome_counts`` adds the rejected records and the operations
        completed, expired, cancelled and still pending to the counts :meth:`run`
        returns, at the cost of one Spark job over the cached rows.
        """
        self.rules, self.store, self.held, self.sink = rules, store, held, sink
        self.batch, self.options, self.outcome_counts = batch, options, outcome_counts
        self.batch_id = int(batch.plan["batch_id"])
        self.spark = batch.records.sparkSession
        before = store.latest_before(self.batch_id)
        #: The commit this batch carries the state of (None for the first).
        self.previous: Commit | None = None if before is None else store.read_commit(before)
        self.adjustment = (
            adjustment if adjustment is not None and adjustment.after == before else None
        )
        self.carried: ResidentState | None = None  # the carried state, once loaded

    # -- 1. the step -------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Compute the batch, check it, commit it and publish it; its counts and warnings."""
        try:
            with DelayedOperations(
                self.batch.records, self.rules, self._step_options(), self.carried_state()
            ) as step:
                counts = step.counts()
                self.held.records_fit_driver = step.records_in_driver
                commit = self.build_commit(step, counts, self.check(step, counts))
                committed = self.commit(step, commit)
                more = self._outcome_counts(step, counts) if self.outcome_counts else {}
        except BaseException:
            # The held operations the step took in are out of their index: a retry of
            # this batch rebuilds the state from the checkpoint.
            self.held.drop()
            raise
        self.publish(committed)
        far_future = commit.counts["far_future"]
        if far_future:
            logger.warning(
                "batch %d: %d record(s) stamped too far after processing time went to "
                "rejected/ as far_future", self.batch_id, far_future,
            )  # fmt: skip
        return {
            **commit.counts,
            **more,
            "watermark": commit.watermark,
            "warnings": list(commit.warnings),
        }

    def _step_options(self) -> StepOptions:
        """The driver's options with what this batch adds: its plan's processing time,
        the records refused before reading, the heartbeats, the carried state, and
        whether the last micro-batch's records fitted in the driver (this one's are
        then expected to: :attr:`~..spark.step.StepOptions.expect_driver`)."""
        return dataclasses.replace(
            self.options,
            now_ms=int(self.batch.plan["now_ms"]),
            carry=True,
            refused=self.batch.refused,
            event_times=self.batch.event_times,
            expect_driver=self.held.records_fit_driver,
        )

    def carried_state(self) -> CarriedState:
        """The state the latest committed batch left (nothing before the first): the one
        this process holds when it is that commit's (:mod:`.resident`), else rebuilt
        from the checkpoint's snapshot and changelogs. Its events as a local relation;
        of its operations, the step takes in only those it touches."""
        adjustment, previous = self.adjustment, self.previous
        if previous is None or (adjustment is not None and adjustment.everything):
            return CarriedState(None, None)  # as a new checkpoint would start
        held = self._carried(previous)
        events = (held.tables or {}).get("events")
        frame = None if events is None else from_arrow(self.spark, events)
        if held.ops is not None and adjustment is not None and adjustment.rules:
            held.ops = held.ops.without_rules(sorted(adjustment.rules))
        return CarriedState(previous.watermark, previous.max_time, frame, held_ops=held.ops)

    def _carried(self, previous: Commit) -> ResidentState:
        """The state ``previous`` left: the one held when it is that commit's, never
        another (a takeover, a fenced attempt, a replay), else rebuilt and held from
        now on (:meth:`_rebuilt`). A state the driver holds past its bound moves to
        the executors first (:meth:`_moved`)."""
        state = self.held.take_for(previous, self.batch_id)
        if state is None:
            state = self._rebuilt(previous)
            self.held.hold(state)
        if state.provider == "driver" and not self.held.fits_driver(state.nbytes):
            state = self._moved(state)
            self.held.hold(state)
        self.carried = state
        return state

    def _rebuilt(self, previous: Commit) -> ResidentState:
        """The state ``previous`` left, rebuilt from the checkpoint: in the driver, its
        operations indexed, when it fits the driver's bound by the bytes the driver
        last measured (or its rows, for a state the driver never held:
        :meth:`~.resident.HeldState.fits_driver`); else partitioned on the executors."""
        measured = previous.state_bytes if previous.state_provider in (None, "driver") else None
        if self.held.fits_driver(measured, previous.state_rows):
            state = rebuild(self.store, self.spark, previous, self._schemas())
            return state.indexed(self.rules.names, self.rules.input.retention_ms)
        self._need_partitioned((previous.state_rows or 0) * UNMEASURED_ROW_BYTES, "rebuilt")
        return rebuild(self.store, self.spark, previous, self._schemas(), self._load)

    def _moved(self, state: ResidentState) -> ResidentState:
        """``state``, held by the driver past its bound, partitioned on the executors from
        now on, and logged: the move sends its operations through the JVM once,
        O(rows); it never moves back within a run."""
        nbytes = state.nbytes
        if state.ops is None:  # no operations (an older format's state): nothing to move
            return state
        self._need_partitioned(nbytes, "moved")
        ops = self._load(from_arrow(self.spark, state.ops.whole()), state.tag)
        moved = dataclasses.replace(state, ops=ops)
        logger.info(
            "batch %d: the state (%d rows) takes %s of the driver's memory, past its bound "
            "of %s: its operations are partitioned on the executors from now on (raise the "
            "bound with --driver-state-bytes, driver_state_bytes= or %s)",
            self.batch_id, state.rows, format_bytes(nbytes),
            format_bytes(self.held.driver_state_bytes), DRIVER_STATE_BYTES_ENV,
        )  # fmt: skip
        return moved

    def _need_partitioned(self, nbytes: int, how: str) -> None:
        """Refuse, naming the bound, to hold a state of ``nbytes`` past the driver's bound
        where the partitioned provider cannot run: under Spark Connect (no RDDs)."""
        from ..spark.session import is_classic

        if is_classic(self.spark):
            return
        raise StreamError(
            f"batch {self.batch_id}: the state takes {format_bytes(nbytes)}, past the "
            f"driver's bound of {format_bytes(self.held.driver_state_bytes)}, and cannot be "
            f"{how} onto the executors under Spark Connect (the partitioned state needs a "
            "classic session): raise the bound with --driver-state-bytes, "
            f"driver_state_bytes= or {DRIVER_STATE_BYTES_ENV}, or run on a classic session"
        )

    def _load(self, ops: DataFrame, tag: str) -> PartitionedOps:
        """The operations ``ops`` (of the state ``tag`` names), partitioned on the
        executors (:class:`~.state.partitioned.PartitionedOps`), which restore from
        this checkpoint on a miss."""
        store, spark, schemas = self.store, self.spark, self._schemas()

        def restore(committed: str) -> DataFrame:
            commit = store.read_commit(int(committed.split(":", 1)[0]))
            if f"{commit.batch_id}:{commit.attempt}" != committed:
                raise StreamError(f"the state {committed} is no longer the checkpoint's")
            ops = committed_frames(store, spark, commit.batch_id, commit, schemas).get("ops")
            return ops if ops is not None else empty_frame(spark, schemas["ops"])

        retention = self.rules.input.retention_ms
        return PartitionedOps.load(
            spark, ops, tag, self.rules.names, retention, restore, str(store.token)
        )

    def _schemas(self) -> dict[str, str]:
        """Each state table's DDL: reading it then needs no job over its footers."""
        longs = {"time", "seq", "deadline"}

        def ddl(columns: Sequence[str]) -> str:
            return ", ".join(
                f"{sql_name(c)} {'bigint' if c in longs else 'string'}" for c in columns
            )

        keys = [f"k_{k}" for k in self.rules.key_fields]
        return {"events": ddl([*EVENT_STATE_COLUMNS, *keys]), "ops": ddl(OPS_COLUMNS)}

    def _outcome_counts(self, step: DelayedOperations, counts: RecordCounts) -> dict[str, int]:
        """The rejected records and the operations by outcome (after the writes, which
        cached the rows: one more job)."""
        outcomes = step.stats().outcomes
        more = {"rejected": counts.rejected_total}
        for outcome in ("completed", "expired", "cancelled", "pending"):
            more[outcome] = outcomes.get(outcome, 0)
        return more

    # -- 2. the check --------------------------------------------------------------------
    def check(self, step: DelayedOperations, counts: RecordCounts) -> list[str]:
        """What looks wrong about this batch (:func:`abnormal_batch_warnings`)."""
        previous = self.previous
        span = None
        if previous is not None and None not in (previous.new_min_time, previous.new_max_time):
            assert previous.new_min_time is not None and previous.new_max_time is not None
            span = previous.new_max_time - previous.new_min_time
        return abnormal_batch_warnings(
            arrived=counts.arrived,
            late=counts.late,
            previous_max_time=previous.max_time if previous is not None else None,
            watermark=step.watermark,
            longest_timeout_ms=max(r.timeout_ms for r in self.rules.rules),
            previous_span_ms=span,
        )

    # -- 3. the commit's record ------------------------------------------------------------
    def build_commit(
        self, step: DelayedOperations, counts: RecordCounts, warnings: Sequence[str]
    ) -> Commit:
        """What this batch's commit records of it, before its attempt, state and sink's
        staging are known (:meth:`commit` adds them). O(1) once counted."""
        plan = self.batch.plan
        files = plan.get("files")
        return Commit(
            batch_id=self.batch_id,
            watermark=step.watermark,
            max_time=step.max_time,
            new_min_time=counts.min_time,
            new_max_time=counts.max_time,
            files=None if files is None else tuple(files),
            rules=rules_record(self.rules),  # what a restart compares its rules with
            input=plan.get("input"),
            input_format=plan.get("input_format"),  # older plans lack it
            purgatory_partitions=step.placement.partitions,
            written_by="driver" if step.in_driver else "spark",
            counts={
                "late": counts.late,
                "far_future": counts.rejected.get("far_future", 0),
                "events": counts.events,
                "duplicates": counts.duplicates,
                "conflicts": counts.rejected.get("conflict", 0),
            },
            warnings=tuple(warnings),
        )

    # -- 4. the commit -------------------------------------------------------------------
    def commit(self, step: DelayedOperations, commit: Commit) -> Commit:
        """Stage the outputs and the next state under a new attempt's own names (their
        Spark jobs overlap), then commit: one new file in the batch's commit slot
        (:meth:`~.checkpoint.StateStore.commit`, fenced), naming the attempt, the
        state and what the sink staged. The state is held from then on; the
        commit as made is returned."""
        from concurrent.futures import ThreadPoolExecutor

        attempt = Attempt.new(self.store.token)
        tables = self._output_tables(step)  # the purgatory has run before the threads start
        with ThreadPoolExecutor(max_workers=2) as pool:
            state_write = pool.submit(self._write_state, step, attempt)
            staged = self._stage_outputs(step, attempt, tables)
            fault("after_outputs", self.batch_id)
            written, entry = state_write.result()
        fault("after_state", self.batch_id)
        try:
            committed = self.store.commit(dataclasses.replace(
                commit, attempt=attempt.tag, state_rows=written.rows, state=entry,
                state_provider=written.provider, state_bytes=written.nbytes,
                state_partitions=getattr(written.ops, "partitions", None),
                state_local_share=getattr(written.ops, "local_share", None),
                sink={**sink_location(self.sink), "staged": staged},
            ))  # fmt: skip
        except BaseException:
            written.release()
            raise
        if written.ops is not None:
            written.ops.committed()
        self.held.hold(written)
        fault("after_commit", self.batch_id)
        return committed

    def _output_tables(self, step: DelayedOperations) -> dict[str, Any]:
        """The four tables the sink stages (:data:`TABLES`): Arrow tables when the step ran
        in the driver and the sink takes them (:attr:`~..sinks.BatchSink.accepts_arrow`),
        else frames (lazy, or the driver's rows as local relations)."""
        tables = step.tables(["final_outcomes", "unmatched", "rejected", "late"])
        tables["outcomes"] = tables.pop("final_outcomes")
        if step.in_driver and not getattr(self.sink, "accepts_arrow", False):
            return {name: as_frame(self.spark, table) for name, table in tables.items()}
        return tables

    def _stage_outputs(
        self, step: DelayedOperations, attempt: Attempt, tables: Mapping[str, Any]
    ) -> Any:
        """The sink's staging of the four ``tables`` (None when the sink shows the batch
        already: an older release's sink committed before its checkpoint did)."""
        if self.sink.is_committed(self.batch_id):
            return None
        counts = step.counts()
        # Known from the counts, so an empty one costs no Spark job. (The outcomes' and
        # unmatched rows are counted by the partitions, which run inside the writes:
        # collecting their counters first would be one more job.)
        rows = {"rejected": counts.rejected_total, "late": counts.late}
        return self.sink.stage(
            self.batch_id,
            tables,
            attempt,
            on_table=lambda _name: fault("mid_batch", self.batch_id),
            empty={t for t, n in rows.items() if not n},
        )

    def _write_state(
        self, step: DelayedOperations, attempt: Attempt
    ) -> tuple[ResidentState, StateEntry]:
        """Write the next state under ``attempt``: its changes since the state carried
        in, or the whole of it when a snapshot is due (:func:`.resident.next_entry`;
        always after a rules change dropped state, which the changes do not show).
        Returns it, to hold once committed, and the commit's state entry.

        The driver holds the events as Arrow (as the step made them when it ran in
        the driver, else collected). The operations the step made go back to the
        provider the state carried in held (:meth:`~.state.OpsProvider.put_back`);
        a first state goes to the driver's index, or, past the driver's bound by
        its rows, is partitioned on the executors.
        """
        full = self.adjustment is not None
        carried = self.carried
        entry = next_entry(carried, self.held.snapshot_every, full=full)
        tables = step.tables(["events", "ops_rows"])
        events = as_arrow(tables["events"])
        ops = carried.ops if carried is not None else None
        tag = f"{self.batch_id}:{attempt.tag}"
        if ops is None:  # nothing held before: what the step carries on, all of it
            ops = self._first_ops(step, tables["ops_rows"], tag)
            changes: dict[str, Any] = {}
        else:
            changes = split_ops(as_arrow(tables["ops_rows"]))
            changes.pop("ops")
            ops.put_back(changes["ops.added"], changes["ops.removed"], tag)
        written, entry, out = next_resident(self.batch_id, attempt.tag, entry, events, changes, ops)
        # The attempt's state directory is its own: no earlier write used its name.
        write_tables(self.store, self.store.attempt_path(self.batch_id, attempt), out, fresh=True)
        return written, entry

    def _first_ops(self, step: DelayedOperations, ops_rows: Any, tag: str) -> OpsProvider:
        """The operations of the first state (``ops_rows``, the step's), held: indexed in
        the driver, or partitioned on the executors when their rows say they would
        pass the driver's bound."""
        kept = step.counts().kept
        if self.held.fits_driver(rows=kept):
            index = OpsIndex(self.rules.names, self.rules.input.retention_ms)
            index.add(split_ops(as_arrow(ops_rows))["ops"])
            return index
        self._need_partitioned(kept * UNMEASURED_ROW_BYTES, "held")
        return self._load(split_ops_frame(as_frame(self.spark, ops_rows))["ops"], tag)

    # -- 5. publication --------------------------------------------------------------------
    def publish(self, commit: Commit) -> None:
        """Make what ``commit`` named visible in the sink (:func:`publish_outputs`)."""
        publish_outputs(self.store, self.sink, commit)


def sink_location(sink: BatchSink) -> dict[str, Any]:
    """What the commit records of where its sink is, so that its outputs can be read
    without building the sink again (:func:`.start.read_stream_outputs`). O(1)."""
    locate = getattr(sink, "location", None)
    return dict(locate()) if callable(locate) else {"name": getattr(sink, "name", "?")}


def publish_outputs(store: StateStore, sink: BatchSink, commit: Commit) -> bool:
    """Publish ``commit``'s batch in ``sink``: what it staged becomes visible, exactly
    once; then, if this job still owns the checkpoint, the sink and the checkpoint
    drop what no commit names. False when it was published already.

    Any process that holds the commit may publish it: the job that committed,
    or the next one rolling the batch forward when a crash came between the
    commit and its publication (Spark then replays the batch, which is
    committed). Both publish the same files, so either may win. O(the batch's
    files) calls.
    """
    batch_id = commit.batch_id
    published = False
    if not sink.is_committed(batch_id):
        published = sink.commit(batch_id, commit.staged)
    fault("after_sink_commit", batch_id)
    if store.owns():  # only the owner cleans
        clean = getattr(sink, "clean", None)
        if callable(clean):
            clean(batch_id)
        store.prune(commit)
    return published


def abnormal_batch_warnings(
    *,
    arrived: int,
    late: int,
    previous_max_time: int | None,
    watermark: int | None,
    longest_timeout_ms: int,
    previous_span_ms: int | None = None,
) -> list[str]:
    """What looks wrong about one micro-batch, as messages for the user. O(1).

    * most of the batch's valid events (``late`` of ``arrived``) were older
      than the previous watermark: files arrived out of order, or an earlier
      record moved the watermark too far;
    * the watermark moved past the previous batch's largest event time by more
      than the longest rule timeout: every operation pending then has expired
      at once, which one record with a wrong time can cause. When the previous
      batch's own events spanned ``previous_span_ms`` of event time, the jump
      must also exceed three times that span: files that each cover an hour
      move the watermark an hour per batch, which is their normal pace.
    """
    warnings = []
    if arrived and late * 2 > arrived:
        warnings.append(
            f"{late:,} of this batch's {arrived:,} events were older than the watermark "
            "and went to late/"
        )
    if previous_max_time is not None and watermark is not None:
        jump = watermark - previous_max_time
        pace = 0 if previous_span_ms is None else 3 * previous_span_ms
        if jump > longest_timeout_ms and jump > pace:
            warnings.append(
                f"the watermark moved {format_duration(jump)} past the previous batch's largest "
                f"event time, more than the longest rule timeout "
                f"({format_duration(longest_timeout_ms)}): every operation pending then expired"
            )
    return warnings
