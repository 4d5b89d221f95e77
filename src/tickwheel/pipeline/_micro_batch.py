"""One micro-batch of the stream, in the steps the module doc of ``stream`` lists.

:meth:`MicroBatch.run` calls them in order; each step is one method:

1. :meth:`~MicroBatch.read` the plan's files and validate their records;
2. :meth:`~MicroBatch.classify` them with the carried events in one window by
   event id (late and rejected records in windows of their own), persisted;
3. :meth:`~MicroBatch.count` them in one aggregate, the batch's first action;
4. :meth:`~MicroBatch.advance_watermark`;
5. :meth:`~MicroBatch.run_purgatory`: the kept events fanned out to their
   rules, with the carried operations, through one processor per partition;
6. :meth:`~MicroBatch.outputs`: the batch's tables and the next state;
7. :meth:`~MicroBatch.commit`: stage, commit the sink, then the commit point.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._checkpoint import fault, read_json, write_json
from .events import MISSING_FILE, empty_frame, parameter, run_parameters

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from .stream import StreamJob

__all__ = ["OPS_SCHEMA", "PROC_OUT_SCHEMA", "MicroBatch", "abnormal_batch_warnings"]

#: The per-partition function's output columns: (name, Spark type).
PROC_OUT_COLUMNS = (
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
)
PROC_OUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in PROC_OUT_COLUMNS)
OPS_SCHEMA = "kind string, rule string, key string, event_id string, time long, deadline long"
REJECTED_SCHEMA = "event_id string, reason string, raw string"

#: ``process(rules, start_ms, watermark_ms)`` → the ``mapInArrow`` function.
ProcessFactory = Callable[..., Any]


class MicroBatch:
    """The computation and commit of one micro-batch ``batch_id`` of a :class:`StreamJob`."""

    def __init__(
        self,
        job: StreamJob,
        batch_id: int,
        plan: Mapping[str, Any],
        process_partitions: ProcessFactory,
    ) -> None:
        """Load what the last committed batch left (its watermark and state paths). O(1)."""
        self.job, self.batch_id, self.plan = job, batch_id, plan
        self.rules, self.config = job.rules, job.config
        self.spark = job._batch_session()
        self.process_partitions = process_partitions
        self.key_cols = [f"k_{k}" for k in self.rules.key_fields]
        self.event_cols = ["event_id", "event_type", "time", "seq", "raw", *self.key_cols]
        self.prev = job.store.latest_before(batch_id)
        meta = (
            read_json(os.path.join(job.store.path(self.prev), "meta.json"))
            if self.prev is not None
            else {}
        )
        self.w_prev: int | None = meta.get("watermark")
        self.max_prev: int | None = meta.get("max_time")
        # The previous batch's own events' span of event time (older states lack it).
        first, last = meta.get("new_min_time"), meta.get("new_max_time")
        self.span_prev: int | None = None if first is None or last is None else last - first
        self.rejected_parts: list[DataFrame] = []
        self.counts: dict[str, Any] = {}
        self._persisted: list[DataFrame] = []

    def _previous_state(self, name: str) -> str | None:
        if self.prev is None:
            return None
        path = os.path.join(self.job.store.path(self.prev), name)
        return path if os.path.isdir(path) else None

    def _persist(self, frame: DataFrame) -> DataFrame:
        from pyspark import StorageLevel

        frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(frame)
        return frame

    # -- the steps -----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Compute the batch and commit it; return its counts and warnings."""
        try:
            parsed, heartbeat_times = self.read()
            classified = self.classify(parsed)
            max_new = self.count(classified)
            self.job._mark("parse+dedup")
            w_new, max_time = self.advance_watermark(max_new, heartbeat_times)
            proc_out = self.run_purgatory(classified, w_new)
            tables, next_state = self.outputs(classified, proc_out)
            warnings = abnormal_batch_warnings(
                arrived=self.counts.pop("_arrived"),
                late=self.counts["late"],
                previous_max_time=self.max_prev,
                watermark=w_new,
                longest_timeout_ms=max(r.timeout_ms for r in self.rules.rules),
                previous_span_ms=self.span_prev,
            )
            self.commit(tables, next_state, w_new, max_time, warnings)
        finally:
            for frame in self._persisted:
                frame.unpersist()
        return {**self.counts, "watermark": w_new, "warnings": warnings}

    def read(self) -> tuple[DataFrame, list[int]]:
        """The plan's files → (validated records, heartbeat times). Lazy.

        Unreadable files, and a file listed then removed before this batch
        read it, are rejected rows kept aside; the records carry a ``reason``
        (None for a valid one) from the batch job's validation.
        """
        from ._stream_read import HEARTBEAT_SUFFIX

        files = [p[len("file:") :] if p.startswith("file:") else p for p in self.plan["files"]]
        gone = [p for p in files if not os.path.exists(p)]
        files = [p for p in files if p not in gone]
        reader = self.job.reader
        heartbeat_times, file_rejects = reader.heartbeats(
            [p for p in files if p.endswith(HEARTBEAT_SUFFIX)]
        )
        file_rejects.extend((None, MISSING_FILE, os.path.basename(p)) for p in gone)
        records, rejected_read = reader.read(
            self.spark, [p for p in files if not p.endswith(HEARTBEAT_SUFFIX)]
        )
        max_future = self.config.max_future_ms
        limit = None if max_future is None else int(self.plan["now_ms"]) + max_future
        # This batch's values as data, not literals: see run_parameters.
        self.params = run_parameters(self.spark, limit=limit, w_prev=self.w_prev)
        parsed = reader.parse(
            records.crossJoin(self.params), None if limit is None else parameter("limit")
        )
        self.rejected_parts.append(rejected_read)
        if file_rejects:
            self.rejected_parts.append(self.spark.createDataFrame(file_rejects, REJECTED_SCHEMA))
        return parsed, heartbeat_times

    def classify(self, parsed: DataFrame) -> DataFrame:
        """The batch's records and the carried events in one window by event id. Persisted.

        Columns: the event columns, ``reason`` (rejected records), ``_late``
        (valid, below the previous watermark: for ``late/``), ``_old`` (a
        carried event), ``_applied`` (carried and at or below the previous
        watermark), ``_live`` (neither rejected nor late), and the window's
        ``_rn`` and ``_same`` (:func:`._dedup.rank_copies`).

        The live records are ranked by event id with the carried events: a
        copy already applied stays the kept one; otherwise the smallest (time,
        sequence, raw). Copies with the kept content are duplicates, the others
        conflicts. Rejected and late records fall in windows of their own
        (partitioned by reason and lateness too), as in the batch job, so the
        records are read and parsed once and kept once.
        """
        from pyspark.sql import functions as F

        from ._dedup import rank_copies
        from .events import key_column

        valid = F.col("reason").isNull()
        new = parsed.crossJoin(self.params).select(
            "event_id",
            "event_type",
            "time",
            "seq",
            "raw",
            *[F.col(key_column(i)).alias(c) for i, c in enumerate(self.key_cols)],
            "reason",
            (valid & F.coalesce(F.col("time") < parameter("w_prev"), F.lit(False))).alias("_late"),
            F.lit(False).alias("_old"),
            F.lit(False).alias("_applied"),
        )
        path = self._previous_state("events")
        if path is not None:
            # The schema is known: giving it spares Spark a job reading the footers.
            old = self.spark.read.schema(new.select(*self.event_cols).schema).parquet(path)
            old = old.crossJoin(self.params).select(
                *self.event_cols,
                F.lit(None).cast("string").alias("reason"),
                F.lit(False).alias("_late"),
                F.lit(True).alias("_old"),
                F.coalesce(F.col("time") <= parameter("w_prev"), F.lit(False)).alias("_applied"),
            )
            records = old.unionByName(new)
        else:
            records = new
        ranked = rank_copies(
            records,
            by=["reason", "_late", "event_id"],
            order=[F.col("_applied").desc(), "time", "seq", "raw"],
            content=["event_type", "time", "seq", *self.key_cols],
        )
        return self._persist(ranked.withColumn("_live", valid & ~F.col("_late")))

    def count(self, classified: DataFrame) -> int | None:
        """One aggregate over the classified records (their first action): the batch's
        counts into :attr:`counts`; return the largest new kept event time."""
        from pyspark.sql import functions as F

        live, new = F.col("_live"), ~F.col("_old")
        first_new = live & (F.col("_rn") == 1) & new
        copy = live & (F.col("_rn") > 1)
        seen = classified.agg(
            F.sum(F.when(new & F.col("reason").isNull(), 1).otherwise(0)).alias("valid"),
            F.sum(F.when(F.col("_late"), 1).otherwise(0)).alias("late"),
            F.sum(F.when(F.col("reason") == "far_future", 1).otherwise(0)).alias("far_future"),
            F.max(F.when(first_new, F.col("time"))).alias("max_new"),
            F.min(F.when(first_new, F.col("time"))).alias("min_new"),
            F.sum(F.when(first_new, 1).otherwise(0)).alias("events"),
            F.sum(F.when(copy & F.col("_same"), 1).otherwise(0)).alias("duplicates"),
            F.sum(F.when(copy & ~F.col("_same"), 1).otherwise(0)).alias("conflicts"),
        ).collect()[0]
        self.counts["_arrived"] = int(seen["valid"] or 0)
        for name in ("late", "far_future", "events", "duplicates", "conflicts"):
            self.counts[name] = int(seen[name] or 0)
        self.new_span = (seen["min_new"], seen["max_new"])
        max_new: int | None = seen["max_new"]
        return max_new

    def advance_watermark(
        self, max_new: int | None, heartbeat_times: list[int]
    ) -> tuple[int | None, int | None]:
        """(new watermark, largest event time seen): max(previous, largest − lateness)."""
        seen = [m for m in (self.max_prev, max_new, *heartbeat_times) if m is not None]
        max_time = max(seen) if seen else None
        if max_time is None:
            return self.w_prev, None
        w_new = max_time - self.rules.input.allowed_lateness_ms
        return (w_new if self.w_prev is None else max(self.w_prev, w_new)), max_time

    def run_purgatory(self, classified: DataFrame, w_new: int | None) -> DataFrame:
        """The kept, not yet applied events up to ``w_new``, fanned out to their rules,
        and the carried operations, through one processor per (rule, key) partition."""
        from pyspark.sql import functions as F

        self.params_new = run_parameters(self.spark, w_new=w_new)
        self.next_events = self._next_events(classified, w_new)
        if w_new is None:
            return empty_frame(self.spark, PROC_OUT_SCHEMA)
        kept = classified.where(F.col("_live") & (F.col("_rn") == 1)).crossJoin(self.params_new)
        todo = kept.where(~F.col("_applied") & (F.col("time") <= parameter("w_new")))
        rows = []
        for rule in self.rules.rules:  # one row per (rule, event) whose type the rule uses
            rows.append(
                todo.where(
                    F.col("event_type").isin(*rule.open, *rule.complete, *rule.cancel)
                ).select(
                    F.lit(None).cast("string").alias("state_kind"),
                    F.lit(rule.name).alias("rule"),
                    F.col(f"k_{rule.key}").alias("key"),
                    "time",
                    "seq",
                    "event_id",
                    "event_type",
                    F.lit(None).cast("long").alias("deadline"),
                )
            )
        ops_path = self._previous_state("ops")
        if ops_path is not None:
            rows.append(
                self.spark.read.schema(OPS_SCHEMA)
                .parquet(ops_path)
                .select(
                    F.col("kind").alias("state_kind"),
                    "rule",
                    "key",
                    "time",
                    F.lit(None).cast("long").alias("seq"),
                    "event_id",
                    F.lit(None).cast("string").alias("event_type"),
                    "deadline",
                )
            )
        proc_in = rows[0]
        for more in rows[1:]:
            proc_in = proc_in.unionByName(more)
        partitions = self.config.partitions or int(
            self.spark.conf.get("spark.sql.shuffle.partitions") or 4
        )
        return self._persist(
            proc_in.repartition(partitions, "rule", "key").mapInArrow(
                self.process_partitions(self.rules, self.w_prev, w_new), PROC_OUT_SCHEMA
            )
        )

    def _next_events(self, classified: DataFrame, w_new: int | None) -> DataFrame:
        """The carried events of the next state: kept ones at or above the new watermark."""
        from pyspark.sql import functions as F

        kept = classified.where(F.col("_live") & (F.col("_rn") == 1))
        if w_new is not None:
            kept = kept.crossJoin(self.params_new).where(F.col("time") >= parameter("w_new"))
        return kept.select(*self.event_cols)

    def outputs(
        self, classified: DataFrame, proc_out: DataFrame
    ) -> tuple[dict[str, DataFrame], dict[str, DataFrame]]:
        """(the batch's tables for the sink, the next state's ``events`` and ``ops``)."""
        from pyspark.sql import functions as F

        late = (
            classified.where(F.col("_late"))
            .crossJoin(self.params)
            .select(
                "event_id",
                "event_type",
                F.col("time").alias("event_time"),
                *[F.col(c).alias(c[2:]) for c in self.key_cols],
                parameter("w_prev").alias("watermark"),
                F.lit("late: event time below the watermark").alias("reason"),
                "raw",
            )
        )
        conflict = F.col("_live") & (F.col("_rn") > 1) & ~F.col("_same")
        self.rejected_parts += [
            classified.where(F.col("reason").isNotNull()).select("event_id", "reason", "raw"),
            classified.where(conflict).select("event_id", F.lit("conflict").alias("reason"), "raw"),
        ]

        kind = F.col("kind")
        outcomes = proc_out.where(kind == "outcome").select(
            "rule",
            "key",
            F.col("id").alias("op_id"),
            F.col("time").alias("opened_at"),
            "deadline",
            "outcome",
            "resolved_at",
            "latency_ms",
            "resolve_event_id",
        )
        unmatched = proc_out.where(kind == "unmatched").select(
            "rule",
            "key",
            F.col("id").alias("event_id"),
            "event_type",
            F.col("time").alias("event_time"),
            "reason",
        )
        ops = proc_out.where(kind.isin("pending", "expired")).select(
            "kind", "rule", "key", F.col("id").alias("event_id"), "time", "deadline"
        )
        rejected = self.rejected_parts[0]
        for more in self.rejected_parts[1:]:
            rejected = rejected.unionByName(more)
        tables = {
            "outcomes": outcomes,
            "unmatched": unmatched,
            "rejected": valid_raw(rejected),
            "late": valid_raw(late),
        }
        return tables, {"events": self.next_events, "ops": ops}

    def commit(
        self,
        tables: Mapping[str, DataFrame],
        next_state: Mapping[str, DataFrame],
        w_new: int | None,
        max_time: int | None,
        warnings: list[str],
    ) -> None:
        """Stage the outputs and the next state (their Spark jobs overlap), then commit.

        Nothing is visible until both are staged; the rename of the staged
        state is the commit point (see the commit protocol in ``stream``).
        """
        from concurrent.futures import ThreadPoolExecutor

        job, batch_id = self.job, self.batch_id
        sink = job.sink
        assert sink is not None
        staged = job.store.staged(batch_id)
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged)
        with ThreadPoolExecutor(max_workers=2) as pool:
            state_writes = [
                pool.submit(frame.write.parquet, os.path.join(staged, name))
                for name, frame in next_state.items()
            ]
            if not sink.is_committed(batch_id):  # a replay after the sink's commit
                sink.stage(batch_id, tables, on_table=lambda _name: fault("mid_batch", batch_id))
            job._mark("outputs")
            fault("after_outputs", batch_id)
            for future in state_writes:
                future.result()
        write_json(
            os.path.join(staged, "meta.json"),
            {
                "batch_id": batch_id,
                "watermark": w_new,
                "max_time": max_time,
                "new_min_time": self.new_span[0],
                "new_max_time": self.new_span[1],
                "files": self.plan["files"],
                "counts": self.counts,
                "warnings": warnings,
            },
        )
        job._mark("state")
        fault("after_state", batch_id)
        sink.commit(batch_id)
        fault("after_sink_commit", batch_id)
        job.store.commit(batch_id)
        fault("after_commit", batch_id)
        job.store.prune(batch_id)
        job._mark("commit")


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
      move the watermark an hour per batch, which is their normal pace (the
      incremental benchmark's ten files, 1.3 h each, warned at every batch).
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


def valid_raw(frame: DataFrame) -> DataFrame:
    """``frame`` with ``raw`` made valid UTF-8 and ``raw_bytes`` beside it (see events)."""
    from pyspark.sql import functions as F

    from .events import raw_text_columns

    text, exact = raw_text_columns(F.col("raw"))
    return frame.select(
        *[
            col
            for name in frame.columns
            for col in (
                (text.alias("raw"), exact.alias("raw_bytes")) if name == "raw" else (F.col(name),)
            )
        ]
    )
