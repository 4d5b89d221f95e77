"""The batch job's per-partition step: one key partition's events through one purgatory.

:func:`partition_function` is the function the batch job gives ``mapInArrow``.
The job knows the global watermark ``W`` before this runs. Each partition
gets its (rule, key) events sorted by (time, sequence, event id, rule) and
runs one :class:`~tickwheel.pipeline.core.PartitionProcessor` over them: the
events at or below ``W`` are applied, the ones above it are held (they are
the ``buffered`` output); then the clock advances to ``W``, expiring what is
due by then. The partition yields final rows: outcomes (pending ones
included), unmatched events, buffered events, and one row of its counters,
which also carries the latencies of its resolved operations, sorted, for the
job's exact percentiles (:func:`exact_percentile`).

Rows go in and out column by column: Arrow columns become Python lists
(``to_pylist``), zipped into the processor, and the outcomes go back as
Arrow arrays built from lists, with the cyclic collector paused (see
:func:`~tickwheel.pipeline.core.cyclic_gc_paused`).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from .rules import Rules

__all__ = [
    "EVENT_COLUMNS",
    "K_BUFFERED",
    "K_OUTCOME",
    "K_STATS",
    "K_UNMATCHED",
    "ROWS_DDL",
    "exact_percentile",
    "partition_function",
    "read_latencies",
]

#: The columns of the events the processor takes, in its order.
EVENT_COLUMNS = ("rule", "key", "time", "seq", "event_id", "kind", "event_type")

#: The rows mapInArrow yields: one schema for all, ``k`` says which output a row is for.
#:   K_OUTCOME:   id=op_id, t0=opened_at, t1=deadline, s=outcome, t2=resolved_at, ref=resolve id
#:   K_UNMATCHED: id=event_id, t0=event_time, s=reason, ref=event_type
#:   K_BUFFERED:  id=event_id, t0=event_time, t1=seq, ref=event_type
#:   K_STATS:     s=JSON of the partition's counters and timings; b=its sorted latencies
#:                (int64, one array per outcome, in the order the JSON's "latencies" names)
ROWS_DDL = (
    "k byte, rule int, key string, id string, t0 long, t1 long, s string, t2 long, ref string,"
    " b binary"
)
K_OUTCOME, K_UNMATCHED, K_BUFFERED, K_STATS = 0, 1, 2, 3


def partition_function(
    rules: Rules, watermark_ms: int | None
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

    def __init__(self, rules: Rules, watermark_ms: int | None) -> None:
        import pyarrow as pa

        from .core import PartitionProcessor

        self.started = time.perf_counter()
        self.pa = pa
        self.schema = _rows_schema(pa)
        self.watermark_ms = watermark_ms
        self.proc = PartitionProcessor(rules)
        self.loop_s = 0.0  # wall time of the loop
        self.loop_cpu = 0.0  # CPU time of this thread in the loop: robust to a busy machine
        self.outcomes: Counter[str] = Counter()
        self.latencies: dict[str, list[Any]] = {}  # outcome -> int64 arrays

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
            self.proc.process(zip(*columns, strict=True), self.watermark_ms)
            self.loop_s += time.perf_counter() - wall
            self.loop_cpu += time.thread_time() - cpu
            out = self._outcomes(self.proc.take_outcomes())
        if out is not None:
            yield out

    def finish(self) -> Iterator[Any]:
        """Advance to the watermark; yield what expires, the pending operations, the
        unmatched and the buffered events, and the partition's counters."""
        if self.watermark_ms is not None:
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
        held = self.proc.take_buffered()
        if held:
            rule, key, event_time, seq, event_id, _kind, event_type = zip(*held, strict=True)
            yield self._batch(K_BUFFERED, rule, key, event_id, event_time, seq, None, None,
                              event_type)  # fmt: skip
        yield self._stats(reasons, len(held))

    def _stats(self, unmatched: Counter[str], buffered: int) -> Any:
        """The counters row: JSON in ``s``, the sorted latencies in ``b``."""
        pa = self.pa
        names = sorted(self.latencies)
        arrays = [pa.concat_arrays(self.latencies[name]).sort() for name in names]
        stats = {
            "events": self.proc.events_applied + buffered,
            "applied": self.proc.events_applied,
            "buffered": buffered,
            "outcomes": dict(self.outcomes),
            "unmatched": dict(unmatched),
            "latencies": [[name, len(array)] for name, array in zip(names, arrays, strict=True)],
            "loop_seconds": self.loop_s,
            "loop_cpu_seconds": self.loop_cpu,
            "udf_seconds": time.perf_counter() - self.started,
        }
        blob = b"".join(_int64_bytes(pa, array) for array in arrays)
        return self._batch(K_STATS, [-1], [None], [None], [None], None, [json.dumps(stats)],
                           blob=[blob])  # fmt: skip

    def _outcomes(self, rows: list[Any]) -> Any:
        if not rows:
            return None
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        rule, key, op_id, opened, deadline, outcome, at, ref = zip(*rows, strict=True)
        self.outcomes.update(outcome)
        batch = self._batch(K_OUTCOME, rule, key, op_id, opened, deadline, outcome, at, ref)
        latency = pc.subtract(batch.column("t2"), batch.column("t0"))
        names = batch.column("s")
        for name in set(outcome):
            self.latencies.setdefault(name, []).append(pc.filter(latency, pc.equal(names, name)))
        return batch

    def _batch(self, k: int, rule: Any, key: Any, id_: Any, t0: Any, t1: Any, s: Any,
               t2: Any = None, ref: Any = None, blob: Any = None) -> Any:  # fmt: skip
        pa, n = self.pa, len(rule)
        arrays = [pa.array([k] * n, pa.int8())]
        values = (rule, key, id_, t0, t1, s, t2, ref, blob)
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
            ("b", pa.binary()),
        ]
    )


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


def read_latencies(stats: dict[str, Any], blob: bytes) -> dict[str, Any]:
    """The sorted latency arrays of one counters row: outcome -> ``array('q')``. O(n)."""
    import sys
    from array import array

    out: dict[str, Any] = {}
    offset = 0
    for name, count in stats["latencies"]:
        values = array("q", blob[offset : offset + 8 * count])
        if sys.byteorder != "little":  # pragma: no cover - no big-endian machine here
            values.byteswap()
        out[name] = values
        offset += 8 * count
    return out


def exact_percentile(ordered: Sequence[int], fraction: float) -> float | None:
    """The exact ``fraction`` percentile of ``ordered`` (sorted), as Spark's ``percentile``.

    Linear interpolation between the two closest ranks: at position
    ``(n - 1) * fraction``, ``values[lo] + (pos - lo) * (values[hi] - values[lo])``,
    in the same floating-point steps as Spark 4, so the figures are the ones
    its exact ``percentile`` aggregate gives (a test compares them). None for
    no values. O(1).
    """
    if not ordered:
        return None
    position = (len(ordered) - 1) * fraction
    lower, higher = math.floor(position), math.ceil(position)
    low, high = ordered[lower], ordered[higher]
    if higher == lower or low == high:
        return float(low)
    return float(low) + (position - lower) * (float(high) - float(low))
