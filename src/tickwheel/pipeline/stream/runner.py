"""What the stream's two drivers share around their query: the ``foreachBatch`` runner
and the steps before the first micro-batch.

* :class:`BatchRunner`: ``foreachBatch``'s function, each micro-batch once, in
  order, with its progress line;
* :func:`parse_trigger` and the query's trigger; the checkpoint opened and
  taken (:func:`_checkpoint_root`); the checks before the first micro-batch
  (:func:`_before_first_batch`: workers, state format, rules change).

:func:`~.start.start_stream` and :class:`~.file_job.StreamJob` both build their
query from these.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from ..spark.workers import check_workers
from ..storage import StorageError, absolute, join, storage_for
from .checkpoint import (
    CheckpointOwner,
    StateStore,
    StreamError,
    fault,
)
from .evolution import StateAdjustment, check_rules_change
from .micro_batch import GAUGES, publish_outputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from ..sinks import BatchSink

__all__ = [
    "FULL_COLLECTION_EVERY_S",
    "BatchRunner",
    "parse_trigger",
]

Say = Callable[[str], None]


def parse_trigger(text: str) -> tuple[str, int | None]:
    """Parse ``once``, ``available-now`` or ``interval=30s`` into (kind, interval ms). O(1)."""
    from ..rules import parse_duration

    if text in ("once", "available-now"):
        return text, None
    if text.startswith("interval="):
        ms = parse_duration(text[len("interval=") :], "--trigger interval")
        if ms <= 0:
            raise StreamError("--trigger interval must be positive")
        return "interval", ms
    raise StreamError(f"--trigger: expected once, available-now or interval=30s, got {text!r}")


def _with_trigger(writer: DataStreamWriter, trigger: str | None) -> DataStreamWriter:
    """``writer`` with ``trigger`` (:func:`parse_trigger`'s text; None: Spark's default)."""
    if trigger is None:
        return writer
    kind, interval_ms = parse_trigger(trigger)
    if kind == "once":
        return writer.trigger(once=True)
    if kind == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{interval_ms} milliseconds")


logger = logging.getLogger(__name__)


#: At most how often (seconds) a micro-batch ends with a full collection of the
#: driver's Python garbage.
#:
#: A py4j ``JavaObject`` whose methods were called is in a reference cycle (it
#: keeps its ``JavaMember`` objects, and they point back at it), so Python frees
#: it only in a full collection, and until then the JVM keeps what it names: the
#: micro-batch's Datasets, with their plans and query executions. A driver that
#: allocates little runs a full collection seldom, so its JVM heap rose with the
#: micro-batches run (after a full GC of the JVM, 100 → 146 MiB over 300 of them
#: in ``benchmarks/bench_pipeline_soak.py``). A full collection takes about 30 ms
#: here: every 10 s, at most 0.3 % of the driver's time.
FULL_COLLECTION_EVERY_S = 10.0


@dataclass
class BatchRunner:
    """``foreachBatch``'s function: each micro-batch once, in order, with its progress line.

    ``process(frame, batch_id)`` computes and commits the micro-batch from what
    the query hands over, and returns its plan and its counts; ``publish``, if
    given, then receives the batch id and the counts with the watermark (the
    figures of :mod:`.progress`). A micro-batch ends with a full collection of
    Python's garbage when the last one is :data:`FULL_COLLECTION_EVERY_S` old.

    The progress lines go to this module's logger at INFO, a micro-batch's
    warnings at WARNING; ``quiet`` is kept for compatibility and changes
    nothing (the logging configuration decides what is shown).
    """

    store: StateStore
    sink: BatchSink
    process: Callable[[DataFrame, int], tuple[Mapping[str, Any], dict[str, Any]]]
    quiet: bool = False
    publish: Callable[[int, Mapping[str, Any]], None] | None = None
    batches_run: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    last_collection: float = field(default_factory=time.monotonic)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        """Run micro-batch ``batch_id`` unless it is committed already (a replay)."""
        started = time.perf_counter()
        if self.store.is_committed(batch_id):
            # Committed before a crash that came before Spark's own commit log: its
            # outputs may still wait for their publication, which this rolls forward.
            rolled = publish_outputs(self.store, self.sink, batch_id)
            done = "its outputs published now" if rolled else "skipped"
            logger.info("batch %d: already committed; %s (replay)", batch_id, done)
            return
        later = [b for b in self.store.committed() if b > batch_id]
        if later:
            raise StreamError(
                f"checkpoint {self.store.root}: Spark replays batch {batch_id} "
                f"but tickwheel's state is already at batch {later[-1]}; the checkpoint was "
                "tampered with"
            )
        fault("batch_start", batch_id)
        try:
            plan, counts = self.process(frame, batch_id)
        except Exception:
            # A job that froze and woke after a takeover may fail on whatever the new
            # owner cleaned meanwhile (its own attempt's files): say why, once.
            self.store.check_owner()
            raise
        self._report(batch_id, plan, counts, time.perf_counter() - started)
        if self.publish is not None:
            try:
                self.publish(batch_id, counts)
            except OSError as exc:  # the figures are for watching: the stream goes on
                logger.warning("batch %d: warning: its figures were not published: %s",
                               batch_id, exc)  # fmt: skip
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        """A full collection of Python's garbage, if the last one is old enough. O(1),
        or O(the driver's Python objects) when it collects."""
        if time.monotonic() - self.last_collection >= FULL_COLLECTION_EVERY_S:
            gc.collect()
            self.last_collection = time.monotonic()

    def _report(
        self, batch_id: int, plan: Mapping[str, Any], counts: dict[str, Any], seconds: float
    ) -> None:
        warnings: list[str] = counts.pop("warnings")
        for message in warnings:
            logger.warning("batch %d: warning: %s", batch_id, message)
        self.warnings.extend(f"batch {batch_id}: {message}" for message in warnings)
        for name, value in counts.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.totals[name] = value if name in GAUGES else self.totals.get(name, 0) + value
        self.batches_run += 1
        files = plan.get("files")
        took = f"{len(files)} file(s), " if files is not None else ""
        logger.info(
            "%s",
            f"batch {batch_id}: {took}"
            + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            + f" in {seconds:.1f}s"
            + "".join(f"; WARNING: {message}" for message in warnings),
        )

    def summary(self, seconds: float) -> dict[str, Any]:
        """The run's summary: batches, the counts' totals (of the gauges, the last
        micro-batch's), warnings and the last watermark. O(batches)."""
        last = self.store.committed()
        summary: dict[str, Any] = {
            "batches_run": self.batches_run,
            "last_batch": last[-1] if last else None,
            "seconds": round(seconds, 3),
            "sink": self.sink.describe(),
            **self.totals,
            "warnings": self.warnings,
        }
        if last:
            summary["watermark"] = self.store.meta(last[-1])["watermark"]
        return summary


def _new_plan(batch_id: int, **more: Any) -> dict[str, Any]:
    """A new write-ahead plan: the batch id, ``more``, and the processing time now."""
    return {"batch_id": batch_id, **more, "now_ms": int(time.time() * 1000)}


def _spark_checkpoint(checkpoint: str) -> str:
    """Where Spark keeps its own checkpoint (offsets, commits) under ``checkpoint``."""
    return join(checkpoint, "spark")


def _checkpoint_root(
    checkpoint: str, spark: SparkSession | None = None
) -> tuple[str, StateStore, CheckpointOwner]:
    """The checkpoint's tickwheel directory, its state store and its owner (taken).

    A URI checkpoint goes through ``spark``'s Hadoop file systems.
    """
    root = join(absolute(checkpoint), "tickwheel")
    try:
        storage = storage_for(root, spark)
    except StorageError as exc:
        raise StreamError(f"--checkpoint {exc}") from None
    owner = CheckpointOwner(root, storage)
    owner.acquire()
    store = StateStore(root, storage, owner)
    try:
        store.check_format()
    except BaseException:
        owner.release()
        raise
    return root, store, owner


def _before_first_batch(
    spark: SparkSession,
    store: StateStore,
    rules: Rules,
    *,
    input_format: str | None,
    drop_incompatible_state: bool,
) -> StateAdjustment | None:
    """What both drivers check before their query starts (a failure inside a micro-batch
    is a long trace): the workers run this tickwheel, the state's format is one this
    release reads, and the rules' changes apply (:mod:`.evolution`). Returns what the
    first batch drops from the state. Then, once nothing refused the run, a job that
    took the checkpoint over from a predecessor fences it
    (:meth:`~.checkpoint.StateStore.fence`): a predecessor that froze may still run."""
    check_workers(spark)
    store.check_format()
    adjustment = check_rules_change(
        store, rules, spark, input_format=input_format,
        drop_incompatible_state=drop_incompatible_state,
    )  # fmt: skip
    if store.token is not None and store.token > 1:  # a predecessor held it before
        store.fence()
    return adjustment
