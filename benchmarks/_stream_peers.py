"""Spark's own stateful answers to the stream's job, and the floor of its micro-batch.

The peers a Spark user would pick for "an order not paid within the timeout":

* ``transformWithStateInPandas`` (Spark 4.0) and the row-based
  ``transformWithState`` (Spark 4.1): a :class:`StatefulProcessor` per order
  key, with event-time timers (``timeMode="EventTime"``);
* ``applyInPandasWithState`` (Spark 3.4), with ``EventTimeTimeout``.

All three read the same files through Spark's JSON file source, one file per
trigger (``maxFilesPerTrigger``), parse the time as tickwheel does, put a
watermark of the rules' allowed lateness on the event time, drop copies of an
event id within it (``dropDuplicatesWithinWatermark``), and apply one rule
machine, :class:`OneOpRule` (``_one_op_rule.py``): the same code in all
three, and in PyFlink's peer, so they differ only in their API. They run as
their documentation advises (:data:`PEER_CONF`): the RocksDB state store
(which ``transformWithState`` requires) with changelog checkpointing, and
shuffle partitions matching the cores (set by the caller's session).

:func:`floor_query` is the least a micro-batch of this shape costs on Spark:
a ``foreachBatch`` over the same source that writes one Parquet file per
micro-batch, nothing else.

What is comparable with tickwheel (:func:`check_peer`): the machine keeps one
operation per key, applies events in arrival order (sorted by time and
sequence within a micro-batch), and an event-time timer fires only once the
watermark is *above* its time (Spark's timers fire when the timestamp is
below the watermark; tickwheel's operations are final when the deadline is
at or below it). tickwheel applies events only once the watermark passes them
(it buffers the others) and allows several operations per key. So outcomes
are compared on the keys where both semantics agree by construction: one
operation in tickwheel's outcomes, resolved (completed, cancelled, or expired
with its deadline below the final watermark), no unmatched or buffered event.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import _one_op_rule
from _one_op_rule import EMPTY, OUTCOME_FIELDS, OneOpRule, Outcome, State
from _pipeline_names import INT_PATTERN, ISO_PATTERN, Rule
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

__all__ = [
    "EMPTY", "OUTCOME_FIELDS", "PEERS", "PEER_CONF", "OneOpRule", "PandasOrderProcessor",
    "ProgressLog", "RowOrderProcessor", "check_peer", "comparable_outcomes", "files_per_trigger",
    "floor_query", "missing_dependency", "order_events", "peer_outcomes", "peer_session",
    "run_peer", "ship_to_workers",
]  # fmt: skip

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: The SQL settings every stateful peer runs with: the RocksDB state store
#: (transformWithState runs on no other; Spark's guide advises it for large
#: state), with changelog checkpointing (a commit writes the micro-batch's
#: changes, not RocksDB's files: Spark's guide gives it for shorter
#: checkpoints and end-to-end latency; Databricks advises it for every
#: stateful query).
PEER_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}

KEY_FIELD = "order_id"
#: The file source's schema (the generated orders' fields; ``amount`` unread).
SOURCE_SCHEMA = "event_id string, order_id string, type string, ts string, seq long"
#: One row per resolved operation, as every peer emits it (``OUTCOME_FIELDS``).
OUTCOME_SCHEMA = "key string, opened_at long, deadline long, outcome string, resolved_at long"
#: Per key: the pending operation's (time, sequence), and a resolution that
#: arrived before its operation's open, as (type, time, sequence).
STATE_SCHEMA = "open_ms long, open_seq long, early_type string, early_ms long, early_seq long"

# ----------------------------------------------------------------------------- the processors


def _frame_events(frames: Iterable[Any]) -> list[tuple[int, int, str, str]]:
    """(time, seq, id, type) of every row of pandas ``frames``."""
    events: list[tuple[int, int, str, str]] = []
    for frame in frames:
        columns = (frame[name].tolist() for name in ("ms", "seq", "event_id", "type"))
        events.extend(zip(*columns, strict=True))
    return events


class _TimedKeys:
    """The state and timer handling both transformWithState processors share."""

    rule: OneOpRule
    handle: Any
    state: Any

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.state = handle.getValueState("op", STATE_SCHEMA)

    def _apply(self, key: str, events: list[tuple[int, int, str, str]]) -> list[Outcome]:
        stored = self.state.get()  # one call to the JVM's state server
        old: State = EMPTY if stored is None else tuple(stored)  # type: ignore[assignment]
        new, out = self.rule.apply(key, old, events)
        before, after = self.rule.timer(old), self.rule.timer(new)
        if before != after:
            if before is not None:
                self.handle.deleteTimer(before)
            if after is not None:
                self.handle.registerTimer(after)
        if new == EMPTY:
            if stored is not None:
                self.state.clear()
        elif new != old:
            self.state.update(new)
        return out

    def _expire(self, key: str, expiry_ms: int) -> list[Outcome]:
        stored = self.state.get()
        if stored is None:
            return []
        self.state.clear()  # Spark deletes the fired timer itself
        return self.rule.expire(key, tuple(stored), expiry_ms)  # type: ignore[arg-type]

    def close(self) -> None:
        pass


class PandasOrderProcessor(_TimedKeys, StatefulProcessor):
    """:class:`OneOpRule` for ``transformWithStateInPandas``: pandas frames in and out."""

    def __init__(self, rule: Rule) -> None:
        self.rule = OneOpRule(rule)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        out = self._apply(key[0], _frame_events(rows))
        if out:
            yield pd.DataFrame(out, columns=list(OUTCOME_FIELDS))

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        import pandas as pd

        out = self._expire(key[0], expiredTimerInfo.getExpiryTimeInMs())
        if out:
            yield pd.DataFrame(out, columns=list(OUTCOME_FIELDS))


class RowOrderProcessor(_TimedKeys, StatefulProcessor):
    """:class:`OneOpRule` for the row-based ``transformWithState``: Rows in and out."""

    def __init__(self, rule: Rule) -> None:
        self.rule = OneOpRule(rule)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        from pyspark.sql import Row

        events = [(row.ms, row.seq, row.event_id, row.type) for row in rows]
        for outcome in self._apply(key[0], events):
            yield Row(**dict(zip(OUTCOME_FIELDS, outcome, strict=True)))

    def handleExpiredTimer(
        self, key: Any, timerValues: Any, expiredTimerInfo: Any
    ) -> Iterator[Any]:
        from pyspark.sql import Row

        for outcome in self._expire(key[0], expiredTimerInfo.getExpiryTimeInMs()):
            yield Row(**dict(zip(OUTCOME_FIELDS, outcome, strict=True)))


def _apply_in_pandas_with_state_step(machine: OneOpRule) -> Any:
    """The function applyInPandasWithState calls per key: the same machine, one timeout."""
    import pandas as pd

    def step(key: Any, frames: Any, state: Any) -> Any:
        old: State = tuple(state.get) if state.exists else EMPTY  # type: ignore[assignment]
        if state.hasTimedOut:
            expiry = machine.timer(old)
            out = [] if expiry is None else machine.expire(key[0], old, expiry)
            state.remove()
        else:
            new, out = machine.apply(key[0], old, _frame_events(frames))
            timer = machine.timer(new)
            if timer is None:
                if state.exists:
                    state.remove()
            else:
                state.update(new)
                state.setTimeoutTimestamp(timer)
        yield pd.DataFrame(out, columns=list(OUTCOME_FIELDS))

    return step


# ----------------------------------------------------------------------------- the queries


def missing_dependency(names: Iterable[str]) -> str | None:
    """What the peers ``names`` need that is not installed, as an error message, or None.

    transformWithState's Python workers talk to the JVM's state server in
    protobuf messages; PySpark does not require protobuf, and without it the
    query dies in its first micro-batch ("cannot import name 'descriptor'
    from 'google.protobuf'").
    """
    stateful = [name for name in names if name.startswith("transformWithState")]
    if not stateful:
        return None
    try:
        import google.protobuf.descriptor  # noqa: F401
    except ImportError:
        return (
            f"{' and '.join(stateful)} need protobuf, which PySpark does not install: "
            "pip install 'protobuf==6.33.5' (the version PySpark 4.3's state messages "
            "were generated with)"
        )
    return None


def ship_to_workers() -> None:
    """Pickle this module and the rule machine by value: the workers cannot import them."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cloudpickle.register_pickle_by_value(_one_op_rule)


def peer_session(spark: Any) -> Any:
    """A child of ``spark`` with :data:`PEER_CONF`; ``spark``'s own settings are unchanged."""
    child = spark.newSession()
    for name, value in PEER_CONF.items():
        child.conf.set(name, value)
    return child


def files_per_trigger(inp: Path, triggers: int) -> int:
    """The ``maxFilesPerTrigger`` that reads the files of ``inp`` in ``triggers`` triggers."""
    files = [p for p in inp.iterdir() if p.is_file() and not p.name.startswith((".", "_"))]
    return max(1, math.ceil(len(files) / triggers))


def order_events(spark: Any, inp: Path, lateness_ms: int, per_trigger: int = 1) -> Any:
    """The peers' input: the files as a stream, parsed, watermarked, deduplicated by id."""
    from pyspark.sql import functions as F

    src = (
        spark.readStream.schema(SOURCE_SCHEMA)
        .option("maxFilesPerTrigger", str(per_trigger))
        .option("mode", "DROPMALFORMED")
        .json(str(inp))
    )
    ts = F.col("ts")
    ms = F.when(ts.rlike(INT_PATTERN), ts.try_cast("long")).when(
        ts.rlike(ISO_PATTERN), F.unix_millis(ts.try_cast("timestamp"))
    )
    return (
        src.select(
            "event_id", KEY_FIELD, "type", F.coalesce("seq", F.lit(0)).alias("seq"), ms.alias("ms")
        )
        .where(
            F.col("ms").isNotNull() & F.col(KEY_FIELD).isNotNull() & F.col("event_id").isNotNull()
        )
        .withColumn("event_time", F.timestamp_millis("ms"))
        .withWatermark("event_time", f"{lateness_ms} milliseconds")
        .dropDuplicatesWithinWatermark(["event_id"])
    )


#: The peers by name: how each turns the events, grouped by key, into outcomes.
PEERS = ("transformWithStateInPandas", "transformWithState", "applyInPandasWithState")


def peer_outcomes(name: str, events: Any, rule: Rule) -> Any:
    """Peer ``name``'s outcome stream over ``events`` (see :data:`PEERS`)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    by_key = events.groupBy(KEY_FIELD)
    if name == "transformWithStateInPandas":
        return by_key.transformWithStateInPandas(
            PandasOrderProcessor(rule), OUTCOME_SCHEMA, "Append", "EventTime"
        )
    if name == "transformWithState":
        return by_key.transformWithState(
            RowOrderProcessor(rule), OUTCOME_SCHEMA, "Append", "EventTime"
        )
    if name == "applyInPandasWithState":
        return by_key.applyInPandasWithState(
            _apply_in_pandas_with_state_step(OneOpRule(rule)), OUTCOME_SCHEMA, STATE_SCHEMA,
            "append", GroupStateTimeout.EventTimeTimeout,
        )  # fmt: skip
    raise ValueError(f"unknown peer {name!r}; expected one of {PEERS}")


def run_peer(
    spark: Any, name: str, inp: Path, out: Path, checkpoint: Path, rule: Rule,
    lateness_ms: int, per_trigger: int = 1,
) -> float:  # fmt: skip
    """Run peer ``name`` over ``inp`` to the end (available-now) into Parquet; its seconds."""
    for path in (out, checkpoint):
        shutil.rmtree(path, ignore_errors=True)
    events = order_events(spark, inp, lateness_ms, per_trigger)
    query = (
        peer_outcomes(name, events, rule)
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    query.start().awaitTermination()
    return time.perf_counter() - started


#: The floors' writers: Spark's (one partition, its Parquet writer and commit
#: protocol), or the rows collected to the driver as Arrow and written with pyarrow.
FLOOR_WRITERS = ("spark", "arrow")


def floor_query(
    spark: Any, inp: Path, out: Path, checkpoint: Path, per_trigger: int = 1, writer: str = "spark"
) -> float:
    """The floor of a micro-batch: foreachBatch, one Parquet file per micro-batch; seconds.

    ``per_trigger`` files make one micro-batch (``maxFilesPerTrigger``); ``writer``
    (:data:`FLOOR_WRITERS`) writes each micro-batch's file.
    """
    for path in (out, checkpoint):
        shutil.rmtree(path, ignore_errors=True)

    def write(frame: Any, batch_id: int) -> None:
        if writer == "spark":
            frame.coalesce(1).write.parquet(str(out / f"batch-{batch_id}"))
            return
        import pyarrow.parquet as pq

        (out / f"batch-{batch_id}").mkdir(parents=True)
        pq.write_table(frame.toArrow(), str(out / f"batch-{batch_id}" / "part-0.parquet"))

    query = (
        spark.readStream.schema(SOURCE_SCHEMA)
        .option("maxFilesPerTrigger", str(per_trigger))
        .json(str(inp))
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    query.start().awaitTermination()
    return time.perf_counter() - started


class ProgressLog:
    """Every micro-batch's progress of the queries of one session, from its listener bus.

    Each micro-batch is a dict: ``batch`` (its id), ``data`` (whether it read
    input), ``ms`` (Spark's ``triggerExecution``) and ``state_rows`` (each
    stateful operator's ``numRowsTotal``, by operator name). With ``path``,
    each is also appended to that file as a JSON line as soon as Spark reports
    it, so a run stopped midway leaves the micro-batches it finished.
    """

    def __init__(self, spark: Any, path: Path | None = None) -> None:
        """Listen to ``spark``'s streaming queries (a py4j callback per event). O(1)."""
        from pyspark.sql.streaming import StreamingQueryListener

        log = self
        self.batches: list[dict[str, Any]] = []
        self._ended = threading.Event()

        class Listener(StreamingQueryListener):  # type: ignore[misc]
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                progress = event.progress
                ms = progress.durationMs.get("triggerExecution", 0)
                # A batch with input moved a source's offset. (tickwheel's file
                # source reports no input rows: its driver reads the logs.)
                moved = any(s.startOffset != s.endOffset for s in progress.sources)
                rows = {op.operatorName: op.numRowsTotal for op in progress.stateOperators}
                batch = {"batch": progress.batchId, "data": moved, "ms": ms, "state_rows": rows}
                log.batches.append(batch)
                if path is not None:
                    with path.open("a", encoding="utf-8") as out:
                        out.write(json.dumps(batch) + "\n")

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                log._ended.set()

        self.listener = Listener()
        spark.streams.addListener(self.listener)

    def reset(self) -> None:
        """Forget what was seen; call before a query starts. O(1)."""
        self.batches = []
        self._ended.clear()

    def wait(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The batches of the query that ended since :meth:`reset` (events come after it)."""
        if not self._ended.wait(timeout_s):
            raise RuntimeError(f"no end of query reported within {timeout_s:.0f} s")
        return list(self.batches)


# ----------------------------------------------------------------------------- the check


def comparable_outcomes(outputs: dict[str, Any], watermark_ms: int) -> dict[str, Outcome]:
    """tickwheel's outcome per key where a peer's semantics must give the same row.

    ``outputs`` are tickwheel's (``outcomes``, ``unmatched``, ``buffered``
    DataFrames); ``watermark_ms`` its final watermark. See the module doc.
    """
    rows = outputs["outcomes"].select("key", *OUTCOME_FIELDS[1:]).collect()
    per_key = Counter(row[0] for row in rows)
    excluded: set[str] = set()
    for name in ("unmatched", "buffered"):
        frame = outputs.get(name)
        if frame is not None:  # the carried events name their key k_<field>
            column = "key" if "key" in frame.columns else f"k_{KEY_FIELD}"
            excluded.update(row[0] for row in frame.select(column).distinct().collect())
    chosen: dict[str, Outcome] = {}
    for key, opened, deadline, outcome, resolved in rows:
        if per_key[key] != 1 or key in excluded:
            continue
        final = outcome in ("completed", "cancelled") or deadline < watermark_ms
        if outcome != "pending" and final:
            chosen[key] = (key, opened, deadline, outcome, resolved)
    return chosen


def check_peer(
    name: str, spark: Any, out: Path, expected: dict[str, Outcome], fmt: str = "parquet"
) -> str:
    """Compare a peer's outcomes with ``expected``; raise SystemExit if they differ.

    ``out`` holds them as Parquet, or as JSON Lines with ``fmt="json"`` (PyFlink's).
    """
    reader = spark.read.format(fmt)
    if fmt == "json":
        reader = reader.schema(OUTCOME_SCHEMA)
    got: dict[str, list[Outcome]] = {}
    for row in reader.load(str(out)).select(*OUTCOME_FIELDS).collect():
        if row[0] in expected:
            got.setdefault(row[0], []).append(tuple(row))  # type: ignore[arg-type]
    wrong = sorted(key for key, want in expected.items() if got.get(key) != [want])
    if wrong:
        examples = "; ".join(f"{key}: tickwheel {expected[key]}, {name} {got.get(key)}"
                             for key in wrong[:5])  # fmt: skip
        raise SystemExit(
            f"MISMATCH: {name} differs from tickwheel on {len(wrong):,} of {len(expected):,} "
            f"comparable keys, e.g. {examples}"
        )
    counts = Counter(outcome for _k, _o, _d, outcome, _r in expected.values())
    return (f"equal on {len(expected):,} keys (completed {counts['completed']:,}, "
            f"cancelled {counts['cancelled']:,}, expired {counts['expired']:,})")  # fmt: skip
