"""One micro-batch of the stream: the one step with carried state, then the commit.

:meth:`MicroBatch.run` takes the micro-batch's records (a frame from any
source), loads the state the latest committed batch left
(:meth:`~MicroBatch.carried_state`), runs the delayed-operations step of
:mod:`tickwheel.pipeline.spark.step` on both, warns about abnormal batches,
and :meth:`~MicroBatch.commit`\\ s: the outputs staged in the sink and the next
state written in the checkpoint, each under the attempt's own names; then the
one new file that is the commit point, which names them; then the sink
publishes what the commit named (:func:`publish_outputs`, which a replay after a
crash repeats). See ``docs/pipeline-design.md``, "Commit protocol".
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from ..spark.classify import EVENT_STATE_COLUMNS
from ..spark.frames import sql_name, to_arrow
from ..spark.outputs import OPS_COLUMNS, split_ops
from ..spark.step import CarriedState, DelayedOperations, StepOptions
from .checkpoint import Attempt, StateStore, fault
from .evolution import StateAdjustment, rules_record
from .resident import ResidentState, next_resident, rebuild, state_entry, write_tables

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ..sinks import BatchSink

__all__ = ["GAUGES", "MicroBatch", "MicroBatchInput", "abnormal_batch_warnings", "publish_outputs"]

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
    """The computation and commit of one micro-batch of a stream."""

    def __init__(
        self,
        rules: Rules,
        store: StateStore,
        sink: BatchSink,
        options: StepOptions,
        batch: MicroBatchInput,
        adjustment: StateAdjustment | None = None,
        outcome_counts: bool = False,
    ) -> None:
        """O(1): nothing is read until :meth:`run`.

        ``adjustment`` (:func:`.evolution.check_rules_change`) says what to drop
        from the state of the batch it names, when this batch carries that one.
        ``outcome_counts`` adds the rejected records and the operations
        completed, expired, cancelled and still pending to the counts :meth:`run`
        returns, at the cost of one Spark job over the cached rows.
        """
        self.rules, self.store, self.sink, self.batch = rules, store, sink, batch
        self.batch_id = int(batch.plan["batch_id"])
        self.options, self.outcome_counts = options, outcome_counts
        self.spark = batch.records.sparkSession
        self.previous = store.latest_before(self.batch_id)
        self.meta: dict[str, Any] = store.meta(self.previous) if self.previous is not None else {}
        self.adjustment = (
            adjustment if adjustment is not None and adjustment.after == self.previous else None
        )
        self.held: ResidentState | None = None  # the carried state, once loaded

    def carried_state(self) -> CarriedState:
        """The state the latest committed batch left (nothing before the first): the one
        this process holds when it is that commit's (:mod:`.resident`), else rebuilt
        from the checkpoint's snapshot and changelogs. Lazy frames."""
        adjustment = self.adjustment
        if adjustment is not None and adjustment.everything:
            return CarriedState(None, None)  # as a new checkpoint would start
        held = self._held_state()
        if held is None:
            return CarriedState(None, None)
        frames = held.as_frames(self.spark)
        rows: int | None = held.rows
        ops = frames.get("ops")
        if adjustment is not None and adjustment.rules and ops is not None:
            from pyspark.sql import functions as F

            ops, rows = ops.where(~F.col("rule").isin(sorted(adjustment.rules))), None
        return CarriedState(
            self.meta.get("watermark"), self.meta.get("max_time"), frames.get("events"), ops, rows
        )

    def _held_state(self) -> ResidentState | None:
        """The previous commit's state, held: this process's own if it is the one the
        commit names, never another (a takeover, a fenced attempt, a replay), else
        rebuilt and held from now on. None before the first batch."""
        if self.previous is None:
            return None
        store, held = self.store, self.store.resident
        if held is not None and held.matches(self.previous, self.meta):
            self.held = held
            return held
        if held is not None:
            logger.info(
                "batch %d: the state held (batch %d) is not the last commit's (batch %d): "
                "rebuilt", self.batch_id, held.batch_id, self.previous,
            )  # fmt: skip
            held.release()
        rows = self.meta.get("state_rows")
        per = self.options.rows_per_partition
        small = isinstance(rows, int) and per is not None and rows <= per
        store.resident = self.held = rebuild(
            store, self.spark, self.previous, self.meta, self._schemas(), in_driver=small
        )
        return self.held

    def _schemas(self) -> dict[str, str]:
        """Each state table's DDL: reading it then needs no job over its footers."""
        longs = {"time", "seq", "deadline"}

        def ddl(columns: Sequence[str]) -> str:
            return ", ".join(
                f"{sql_name(c)} {'bigint' if c in longs else 'string'}" for c in columns
            )

        keys = [f"k_{k}" for k in self.rules.key_fields]
        return {"events": ddl([*EVENT_STATE_COLUMNS, *keys]), "ops": ddl(OPS_COLUMNS)}

    def _previous_span(self) -> int | None:
        """The previous batch's own events' span of event time (older states lack it)."""
        first, last = self.meta.get("new_min_time"), self.meta.get("new_max_time")
        return None if first is None or last is None else last - first

    def run(self) -> dict[str, Any]:
        """Compute the batch and commit it; return its counts and warnings."""
        options = StepOptions(
            partitions=self.options.partitions,
            max_future_ms=self.options.max_future_ms,
            now_ms=int(self.batch.plan["now_ms"]),
            input_format=self.options.input_format,
            carry=True,
            refused=self.batch.refused,
            event_times=self.batch.event_times,
            rows_per_partition=self.options.rows_per_partition,
        )
        with DelayedOperations(
            self.batch.records, self.rules, options, self.carried_state()
        ) as step:
            counts = step.counts()
            warnings = abnormal_batch_warnings(
                arrived=counts.arrived,
                late=counts.late,
                previous_max_time=self.meta.get("max_time"),
                watermark=step.watermark,
                longest_timeout_ms=max(r.timeout_ms for r in self.rules.rules),
                previous_span_ms=self._previous_span(),
            )
            reported = {
                "late": counts.late,
                "far_future": counts.rejected.get("far_future", 0),
                "events": counts.events,
                "duplicates": counts.duplicates,
                "conflicts": counts.rejected.get("conflict", 0),
            }
            tables = {
                "outcomes": step.final_outcomes,
                "unmatched": step.unmatched,
                "rejected": step.rejected,
                "late": step.late,
            }
            # Known from the counts, so an empty one costs no Spark job. (The outcomes'
            # and unmatched rows are counted by the partitions, which run inside the
            # writes: collecting their counters first would be one more job.)
            rows = {"rejected": counts.rejected_total, "late": counts.late}
            meta = {
                "batch_id": self.batch_id,
                "watermark": step.watermark,
                "max_time": step.max_time,
                "new_min_time": counts.min_time,
                "new_max_time": counts.max_time,
                "files": self.batch.plan.get("files"),
                "rules": rules_record(self.rules),  # what a restart compares its rules with
                "input": self.batch.plan.get("input"),
                "input_format": self.batch.plan.get("input_format"),  # older plans lack it
                "purgatory_partitions": step.placement.partitions,
                "written_by": "driver" if step.placement.small else "spark",
                "counts": reported,
                "warnings": warnings,
            }
            self.commit(
                tables,
                step,
                meta,
                empty={t for t, n in rows.items() if not n},
                small=step.placement.small,
            )
            more: dict[str, int] = {}
            if self.outcome_counts:  # after the writes, which cached the rows
                outcomes = step.stats().outcomes
                more["rejected"] = counts.rejected_total
                for outcome in ("completed", "expired", "cancelled", "pending"):
                    more[outcome] = outcomes.get(outcome, 0)
        if reported["far_future"]:
            logger.warning(
                "batch %d: %d record(s) stamped too far after processing time went to "
                "rejected/ as far_future",
                self.batch_id, reported["far_future"],
            )  # fmt: skip
        return {**reported, **more, "watermark": meta["watermark"], "warnings": warnings}

    def commit(
        self,
        tables: Mapping[str, DataFrame],
        step: DelayedOperations,
        meta: Mapping[str, Any],
        empty: Collection[str] = (),
        small: bool = False,
    ) -> None:
        """Stage the outputs and the next state (their Spark jobs overlap), commit, then
        publish.

        This attempt writes under names of its own (:class:`~.checkpoint.Attempt`):
        the next state of ``step`` in ``state/N/<attempt>/``, as its changes since
        the state carried in or whole (:mod:`.resident`), the outputs where the
        sink stages them, out of readers' sight. The commit point is one new file in the
        batch's commit slot (:meth:`~.checkpoint.StateStore.commit`, fenced),
        which names the attempt and what the sink staged; only then does the
        sink publish it (:func:`publish_outputs`). Tables in ``empty`` are known to
        have no rows (from the counts): no Spark job writes them. With
        ``small`` (:attr:`.step.Placement.small`) the driver collects and
        writes the state and the sink's tables
        (:func:`~..spark.frames.write_parquet`).
        """
        from concurrent.futures import ThreadPoolExecutor

        batch_id, sink, store = self.batch_id, self.sink, self.store
        attempt = Attempt.new(store.token)
        staged = None
        with ThreadPoolExecutor(max_workers=2) as pool:
            state_write = pool.submit(self._write_state, step, attempt, small)
            # An older release's sink committed before its checkpoint did: published.
            if not sink.is_committed(batch_id):
                staged = sink.stage(
                    batch_id,
                    tables,
                    attempt,
                    on_table=lambda _name: fault("mid_batch", batch_id),
                    empty=empty,
                    small=small,
                )
            fault("after_outputs", batch_id)
            written, entry = state_write.result()
        fault("after_state", batch_id)
        try:
            record = store.commit(batch_id, {
                **meta, "state_rows": written.rows, "state": entry, "attempt": attempt.tag,
                "sink": {**sink_location(sink), "staged": staged},
            })  # fmt: skip
        except BaseException:
            written.release()
            raise
        previous, store.resident = store.resident, written
        if previous is not None and previous is not written:
            previous.release()
        fault("after_commit", batch_id)
        publish_outputs(store, sink, batch_id, record)

    def _write_state(
        self, step: DelayedOperations, attempt: Attempt, small: bool
    ) -> tuple[ResidentState, dict[str, Any]]:
        """Write the next state under ``attempt``: its changes since the state carried
        in, or the whole of it when a snapshot is due (:func:`.resident.state_entry`;
        always after a rules change dropped state, which the changes do not show).
        Returns it, held as the next batch will take it, and the commit's ``state``
        entry.

        ``small``: the tables collected to the driver as Arrow (no job for those
        the driver holds already: :func:`~..spark.frames.to_arrow`) and written
        there. Else locally checkpointed by Spark, where they stay, and written
        by Spark's writer.
        """
        entry = state_entry(self.held, self.store.snapshot_every, full=self.adjustment is not None)
        if small:  # two collections: the events, the operations with their changes
            ops = split_ops(to_arrow(step.ops_rows()))
            state = {"events": to_arrow(step.next_state()["events"]), "ops": ops.pop("ops")}
            changes: dict[str, Any] = ops
        else:
            state = {n: f.localCheckpoint(eager=False) for n, f in step.next_state().items()}
            changes = step.state_changes()
        held, entry, out = next_resident(
            self.held, self.batch_id, attempt.tag, entry, state, changes
        )
        write_tables(self.store, self.store.attempt_path(self.batch_id, attempt), out)
        return held, entry


def sink_location(sink: BatchSink) -> dict[str, Any]:
    """What the commit records of where its sink is, so that its outputs can be read
    without building the sink again (:func:`.start.read_stream_outputs`). O(1)."""
    locate = getattr(sink, "location", None)
    return dict(locate()) if callable(locate) else {"name": getattr(sink, "name", "?")}


def publish_outputs(
    store: StateStore, sink: BatchSink, batch_id: int, meta: Mapping[str, Any] | None = None
) -> bool:
    """Publish committed batch ``batch_id`` in ``sink``: what its commit (``meta``,
    read if not given) staged becomes visible, exactly once; then, if this job
    still owns the checkpoint, the sink and the checkpoint drop what no commit
    names. False when it was published already.

    Any process that holds the commit may publish it: the job that committed,
    or the next one rolling the batch forward when a crash came between the
    commit and its publication (Spark then replays the batch, which is
    committed). Both publish the same files, so either may win. O(the batch's
    files) calls.
    """
    if meta is None:
        meta = store.meta(batch_id)
    staged = (meta.get("sink") or {}).get("staged")
    published = False
    if not sink.is_committed(batch_id):
        published = sink.commit(batch_id, staged)
    fault("after_sink_commit", batch_id)
    if store.owns():  # only the owner cleans
        clean = getattr(sink, "clean", None)
        if callable(clean):
            clean(batch_id)
        store.prune(batch_id, meta)
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
                f"the watermark moved {_duration_text(jump)} past the previous batch's largest "
                f"event time, more than the longest rule timeout "
                f"({_duration_text(longest_timeout_ms)}): every operation pending then expired"
            )
    return warnings


def _duration_text(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:,.1f}{unit}"
    return f"{ms}ms"
