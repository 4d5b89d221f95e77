"""The batch job's per-partition step: one key partition's events through one purgatory.

:func:`partition_function` is the function the batch job gives ``mapInArrow``.
The job knows the global watermark ``W`` before this runs, and sends only the
events at or below it, sorted by (time, sequence, event id, rule). Each
partition runs one :class:`~tickwheel.pipeline.core.PartitionProcessor` over
them, advances its clock to ``W`` (expiring what is due by then) and yields
final rows: outcomes (pending ones included), unmatched events, and one row
of its counters.

Rows go in and out column by column: Arrow columns become Python lists
(``to_pylist``), zipped into the processor, and the outcomes go back as
Arrow arrays built from lists, with the cyclic collector paused (see
:func:`~tickwheel.pipeline.core.cyclic_gc_paused`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from .rules import Rules

__all__ = ["EVENT_COLUMNS", "K_OUTCOME", "K_STATS", "K_UNMATCHED", "ROWS_DDL", "partition_function"]

#: The columns of the events the processor takes, in its order.
EVENT_COLUMNS = ("rule", "key", "time", "seq", "event_id", "kind", "event_type")

#: The rows mapInArrow yields: one schema for all, ``k`` says which output a row is for.
#:   K_OUTCOME:   id=op_id, t0=opened_at, t1=deadline, s=outcome, t2=resolved_at, ref=resolve id
#:   K_UNMATCHED: id=event_id, t0=event_time, s=reason, ref=event_type
#:   K_STATS:     s=JSON of the partition's counters and timings
ROWS_DDL = (
    "k byte, rule int, key string, id string, t0 long, t1 long, s string, t2 long, ref string"
)
K_OUTCOME, K_UNMATCHED, K_STATS = 0, 1, 2


def partition_function(
    rules: Rules, watermark_ms: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the batch job, for the global watermark ``watermark_ms``."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition = _PartitionRun(rules, watermark_ms)
        try:
            for batch in batches:
                yield from partition.apply(batch)
            yield from partition.finish()
        finally:
            partition.proc.close()

    return run


class _PartitionRun:
    """One partition of the batch job: its processor, its counters and its timings."""

    def __init__(self, rules: Rules, watermark_ms: int) -> None:
        import pyarrow as pa

        from .core import PartitionProcessor

        self.started = time.perf_counter()
        self.pa = pa
        self.schema = _rows_schema(pa)
        self.watermark_ms = watermark_ms
        self.proc = PartitionProcessor(rules)
        self.loop_s = 0.0  # wall time of the loop
        self.loop_cpu = 0.0  # CPU time of this thread in the loop: robust to a busy machine
        self.events = 0
        self.outcomes: Counter[str] = Counter()

    def apply(self, batch: Any) -> Iterator[Any]:
        """Run one batch of sorted events through the processor; yield its outcomes."""
        from .core import cyclic_gc_paused

        if not batch.num_rows:
            return
        # The collector stays off from the columns' conversion to the
        # outcomes' batch, so it runs between batches, not within them.
        with cyclic_gc_paused():
            columns = [batch.column(name).to_pylist() for name in EVENT_COLUMNS]
            wall, cpu = time.perf_counter(), time.thread_time()
            self.proc.process(zip(*columns, strict=True))
            self.loop_s += time.perf_counter() - wall
            self.loop_cpu += time.thread_time() - cpu
            out = self._outcomes(self.proc.take_outcomes())
        self.events += batch.num_rows
        if out is not None:
            yield out

    def finish(self) -> Iterator[Any]:
        """Advance to the watermark; yield what expires, the pending operations, the
        unmatched events and the partition's counters."""
        self.proc.finish(self.watermark_ms)
        expired = self._outcomes(self.proc.take_outcomes())
        if expired is not None:
            yield expired
        pending = self.proc.pending_operations()
        if pending:
            rule, key, op_id, opened, deadline = zip(*pending, strict=True)
            n = len(rule)
            self.outcomes["pending"] += n
            yield self._batch(K_OUTCOME, rule, key, op_id, opened, deadline, ["pending"] * n)
        unmatched = self.proc.take_unmatched()
        reasons: Counter[str] = Counter()
        if unmatched:
            rule, key, event_id, event_type, event_time, reason = zip(*unmatched, strict=True)
            reasons.update(reason)
            yield self._batch(K_UNMATCHED, rule, key, event_id, event_time, None, reason,
                              None, event_type)  # fmt: skip
        stats = {
            "events": self.events,
            "outcomes": dict(self.outcomes),
            "unmatched": dict(reasons),
            "loop_seconds": self.loop_s,
            "loop_cpu_seconds": self.loop_cpu,
            "udf_seconds": time.perf_counter() - self.started,
        }
        yield self._batch(K_STATS, [-1], [None], [None], [None], None, [json.dumps(stats)])

    def _outcomes(self, rows: list[Any]) -> Any:
        if not rows:
            return None
        rule, key, op_id, opened, deadline, outcome, at, ref = zip(*rows, strict=True)
        self.outcomes.update(outcome)
        return self._batch(K_OUTCOME, rule, key, op_id, opened, deadline, outcome, at, ref)

    def _batch(self, k: int, rule: Any, key: Any, id_: Any, t0: Any, t1: Any, s: Any,
               t2: Any = None, ref: Any = None) -> Any:  # fmt: skip
        pa, n = self.pa, len(rule)
        arrays = [pa.array([k] * n, pa.int8())]
        values = (rule, key, id_, t0, t1, s, t2, ref)
        for value, column in zip(values, list(self.schema)[1:], strict=True):
            arrays.append(
                pa.nulls(n, column.type) if value is None else pa.array(value, column.type)
            )
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _rows_schema(pa: Any) -> Any:
    return pa.schema(
        [
            ("k", pa.int8()),
            ("rule", pa.int32()),
            ("key", pa.string()),
            ("id", pa.string()),
            ("t0", pa.int64()),
            ("t1", pa.int64()),
            ("s", pa.string()),
            ("t2", pa.int64()),
            ("ref", pa.string()),
        ]
    )
