"""``foreachBatch``'s function: each micro-batch of a query once, in order, with the state
held between them (its part of ``docs/pipeline-design.md``, "One micro-batch").

* :class:`MicroBatches` runs one micro-batch (:class:`~.micro_batch.MicroBatch`)
  from what the query hands over, and holds the state between them;
* :class:`BatchRunner` skips a batch committed already (publishing it if a
  crash left it unpublished), reports each batch, and frees the driver's
  cyclic garbage now and then.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from ..spark.step import StepOptions
from .checkpoint import StateStore, StreamError, fault
from .evolution import StateAdjustment
from .micro_batch import GAUGES, MicroBatch, MicroBatchInput, publish_outputs
from .resident import HeldState

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ..sinks import BatchSink

__all__ = [
    "FULL_COLLECTION_EVERY_S",
    "BatchRunner",
    "MicroBatches",
    "StreamStep",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamStep:
    """What every micro-batch of a query runs: the rules, the step's options, and what
    the checks before the first batch found (:func:`~.query.before_first_batch`).

    ``input_format`` is the records' form, recorded in each plan and commit and
    compared with the checkpoint's; ``adjustment`` what the first batch drops
    from the state; ``outcome_counts`` adds the operations by outcome to each
    batch's counts (one more Spark job: the progress metrics).
    """

    rules: Rules
    options: StepOptions
    input_format: str
    adjustment: StateAdjustment | None = None
    outcome_counts: bool = False


#: What a driver makes of the frame Spark hands over for a batch id: the micro-batch's
#: records and its write-ahead plan (:meth:`~.checkpoint.StateStore.plan`).
BatchInputs = Callable[["DataFrame", int], MicroBatchInput]


@dataclass
class MicroBatches:
    """Runs each micro-batch of one query, and holds the state it leaves for the next.

    Called as ``process(frame, batch_id)`` by :class:`BatchRunner`: it makes
    the batch's input (``inputs``, the driver's), runs and commits it
    (:class:`~.micro_batch.MicroBatch`), and returns its plan and counts.
    ``held`` is the state between micro-batches (:mod:`.resident`): it belongs
    here, in the process that runs them, not to the checkpoint.
    """

    store: StateStore
    sink: BatchSink
    step: StreamStep
    inputs: BatchInputs
    held: HeldState = field(default_factory=HeldState)

    def __call__(self, frame: DataFrame, batch_id: int) -> tuple[Mapping[str, Any], dict[str, Any]]:
        """Run and commit micro-batch ``batch_id`` of ``frame``: its plan and counts."""
        batch = self.inputs(frame, batch_id)
        step = self.step
        counts = MicroBatch(
            step.rules, self.store, self.held, self.sink, step.options, batch, step.adjustment,
            outcome_counts=step.outcome_counts,
        ).run()  # fmt: skip
        return batch.plan, counts


#: At most how often (seconds) a micro-batch ends with a full collection of the
#: driver's Python garbage.
#:
#: A py4j ``JavaObject`` whose methods were called is in a reference cycle (it
#: keeps its ``JavaMember`` objects, and they point back at it), so Python frees
#: it only in a full collection, and until then the JVM keeps what it names: the
#: micro-batch's Datasets, with their plans and query executions. A driver that
#: allocates little runs a full collection seldom, so its JVM heap would grow with
#: the micro-batches run (``docs/benchmarks.md``, "A long stream"); a collection
#: this seldom costs a small fraction of the driver's time.
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
    warnings at WARNING (the logging configuration decides what is shown).
    """

    store: StateStore
    sink: BatchSink
    process: Callable[[DataFrame, int], tuple[Mapping[str, Any], dict[str, Any]]]
    publish: Callable[[int, Mapping[str, Any]], None] | None = None
    batches_run: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    last_collection: float = field(default_factory=time.monotonic)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        """Run micro-batch ``batch_id`` unless it is committed already (a replay)."""
        started = time.perf_counter()
        self.store.refresh()  # the checkpoint listed once per micro-batch
        if self.store.is_committed(batch_id):
            # Committed before a crash that came before Spark's own commit log: its
            # outputs may still wait for their publication, which this rolls forward.
            rolled = publish_outputs(self.store, self.sink, self.store.read_commit(batch_id))
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
        self.store.refresh()  # under Spark Connect, another process committed them
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
            summary["watermark"] = self.store.read_commit(last[-1]).watermark
        return summary
