"""Incremental, exactly-once pipeline: Structured Streaming + carried state + atomic commits.

``tickwheel pipeline stream --rules R --input DIR --output OUT --checkpoint CK``

A Spark Structured Streaming source that lists new files in (modification
time, name) order (:mod:`._file_source`; Spark checkpoints which files each
micro-batch took, in ``CK/spark/``) feeds ``foreachBatch``. Each micro-batch
``N``:

1. reads its new files with the batch pipeline's reader (bad lines and bad
   files become ``rejected`` rows, with events stamped too far in the future:
   ``--max-future``), drops events older than the previous watermark into
   ``late``, and warns when most of them are late or the watermark jumps;
2. deduplicates by event id against the carried *events* state (every kept event
   at or above the previous watermark: the events still buffered, and the ids a
   duplicate could still arrive for within the lateness);
3. advances the watermark (max event time − allowed lateness) and runs the
   events at or below it through the per-partition purgatory of
   :mod:`tickwheel.pipeline.core`, seeded with the carried *operations* state
   (pending operations + each key's last expiry); state rows of keys with no
   new event and no operation due are carried to the next state as they are;
4. commits: outputs staged in the sink and, at the same time, the next state
   staged in ``CK/tickwheel/staging/N``; then the sink's commit (idempotent per
   batch id), and finally the rename ``staging/N → state/N``: the commit point.

A micro-batch that Spark replays after a crash (``state/N`` missing) recomputes
from the same files and the same ``state/N-1`` and gets the same rows; the
sink replaces (Parquet) or skips (SQLite, PostgreSQL) its own earlier copy. A
batch whose ``state/N`` exists is skipped. See ``docs/pipeline.md``.

Heartbeat: a *marker file* ``*.heartbeat`` in the input directory holding an
event time (epoch ms or ISO-8601) raises the max event time seen, so the
watermark advances and deadlines fire while real input stalls.

Fault injection (tests): ``TICKWHEEL_FAULT=POINT:BATCH`` makes the driver kill
itself with SIGKILL at ``POINT`` of micro-batch ``BATCH`` (see
:data:`FAULT_POINTS`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .core import STATE_EXPIRED, STATE_PENDING
from .events import DEFAULT_MAX_FUTURE_MS, MISSING_FILE
from .rules import Rules

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from .sinks import BatchSink

__all__ = [
    "FAULT_ENV",
    "FAULT_POINTS",
    "CheckpointInUse",
    "StreamConfig",
    "StreamError",
    "StreamJob",
    "parse_trigger",
    "read_stream_outputs",
]

FAULT_ENV = "TICKWHEEL_FAULT"
#: Where ``TICKWHEEL_FAULT=POINT:BATCH`` can kill the driver, in batch order.
FAULT_POINTS = (
    "batch_start",  # before anything of the batch is written
    "mid_batch",  # after some outputs were staged, before the others
    "after_outputs",  # all outputs staged, next state maybe half-written
    "after_state",  # outputs and next state staged, nothing committed
    "after_sink_commit",  # sink committed, checkpoint state not
    "after_commit",  # state committed, Spark's own commit log not yet
)

_HEARTBEAT_SUFFIX = ".heartbeat"
_TABLES = ("outcomes", "unmatched", "rejected", "late")


class StreamError(RuntimeError):
    """The stream cannot run (bad options, inconsistent checkpoint)."""


class CheckpointInUse(StreamError):
    """Another job holds the checkpoint's lock."""


def _fault(point: str, batch_id: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec and spec == f"{point}:{batch_id}":
        sys.stderr.write(f"tickwheel: fault injection: SIGKILL at {point} of batch {batch_id}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def parse_trigger(text: str) -> tuple[str, int | None]:
    """Parse ``once``, ``available-now`` or ``interval=30s`` into (kind, interval ms). O(1)."""
    from .rules import parse_duration

    if text in ("once", "available-now"):
        return text, None
    if text.startswith("interval="):
        ms = parse_duration(text[len("interval=") :], "--trigger interval")
        if ms <= 0:
            raise StreamError("--trigger interval must be positive")
        return "interval", ms
    raise StreamError(f"--trigger: expected once, available-now or interval=30s, got {text!r}")


@dataclass(frozen=True)
class StreamConfig:
    """Options of one ``tickwheel pipeline stream`` job."""

    rules_path: str
    input: str
    output: str
    checkpoint: str
    trigger: str = "available-now"
    sink: str = "parquet"
    jdbc_url: str | None = None
    input_format: str | None = None  # default: the rules' [input].format
    partitions: int | None = None
    max_files_per_trigger: int | None = None
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS
    master: str | None = None
    quiet: bool = False


# ----------------------------------------------------------------------------- lock


class _CheckpointLock:
    """An exclusive ``flock`` on ``CK/tickwheel/LOCK``; the kernel drops it if we die."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "LOCK")
        self.owner = os.path.join(root, "owner.json")
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            who = "another job"
            with contextlib.suppress(OSError, ValueError), open(self.owner, encoding="utf-8") as fh:
                info = json.load(fh)
                who = f"job pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"
            raise CheckpointInUse(
                f"checkpoint {os.path.dirname(os.path.dirname(self.path))} is in use by {who}; "
                "two jobs on one checkpoint would corrupt it. Stop the other job or use "
                "another --checkpoint."
            ) from None
        self._fd = fd

    def write_owner(self, jvm_pid: int | None) -> None:
        previous = None
        with contextlib.suppress(OSError, ValueError), open(self.owner, encoding="utf-8") as fh:
            previous = json.load(fh)
        info = {
            "pid": os.getpid(),
            "jvm_pid": jvm_pid,
            "host": socket.gethostname(),
            "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        _write_json(self.owner, info)
        # A previous driver killed with SIGKILL leaves its JVM to notice that its
        # parent is gone; wait for it, so two JVMs never write the checkpoint.
        if previous and previous.get("host") == info["host"]:
            old = previous.get("jvm_pid")
            if isinstance(old, int) and old != jvm_pid:
                _wait_gone(old, 60.0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"java" not in fh.read():
                    return
        except OSError:
            return
        time.sleep(0.1)


def _write_json(path: str, payload: Mapping[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, sort_keys=True, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
        return data


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- state


class _StateStore:
    """``CK/tickwheel/state/N`` directories: the carried state after each batch."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.state = os.path.join(root, "state")
        self.staging = os.path.join(root, "staging")
        self.plans = os.path.join(root, "plans")
        for path in (self.state, self.staging, self.plans):
            os.makedirs(path, exist_ok=True)

    def committed(self) -> list[int]:
        return sorted(int(n) for n in os.listdir(self.state) if n.isdigit())

    def path(self, batch_id: int) -> str:
        return os.path.join(self.state, str(batch_id))

    def staged(self, batch_id: int) -> str:
        return os.path.join(self.staging, str(batch_id))

    def latest_before(self, batch_id: int) -> int | None:
        ids = [b for b in self.committed() if b < batch_id]
        return ids[-1] if ids else None

    def plan(self, batch_id: int, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The write-ahead plan of a batch: made once, reused when the batch replays."""
        path = os.path.join(self.plans, f"{batch_id}.json")
        if os.path.exists(path):
            return _read_json(path)
        plan = make()
        _write_json(path, plan)
        return plan

    def commit(self, batch_id: int) -> None:
        os.rename(self.staged(batch_id), self.path(batch_id))
        _fsync_dir(self.state)

    def prune(self, batch_id: int) -> None:
        """Keep the state of ``batch_id`` and the one before it; drop older ones."""
        keep = {batch_id, self.latest_before(batch_id)}
        for b in self.committed():
            if b not in keep and b < batch_id:
                shutil.rmtree(self.path(b), ignore_errors=True)
        for name in os.listdir(self.plans):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < batch_id:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.plans, name))


# ----------------------------------------------------------------------------- processing

#: The per-partition function's output columns: (name, Spark type). Spark reads
#: them as ``_PROC_OUT_SCHEMA``; the function writes them as ``_proc_out_arrow_schema``.
_PROC_OUT_COLUMNS = (
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
_PROC_OUT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in _PROC_OUT_COLUMNS)
_OPS_SCHEMA = "kind string, rule string, key string, event_id string, time long, deadline long"


def _process_partitions(
    rules: Rules, start_ms: int | None, watermark_ms: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: one purgatory per partition, seeded with its state.

    Only the state this increment can change goes through Python: the rows of
    keys with new events, and of keys with an operation due by the watermark.
    The rest (most expiry markers, and far-off pending operations) is carried
    to the next state as Arrow columns, untouched (see :func:`_untouched_state`).

    Rows that do go through Python go in and out column by column (``zip`` over
    Arrow columns as Python lists), not row by row, with the cyclic collector
    paused throughout. ``tests/pipeline/test_stream_udf.py`` pins the column
    mapping and the routing against one processor run over all the events.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from .core import cyclic_gc_paused

        # Paused from the first row in to the last row out: the conversions
        # allocate a tuple per row, and the restored state is most of the heap.
        with cyclic_gc_paused():
            out = _process_increment(rules, start_ms, watermark_ms, batches)
        yield from out

    return run


def _untouched_state(rules: Rules, events: Any, state: Any, watermark_ms: int) -> Any:
    """Mask of the ``state`` rows this increment cannot change. O(rows).

    A key's expiry marker changes only when an event of that key is applied or
    one of its operations expires; a pending operation changes only through an
    event of its key or its own deadline. So a state row is untouched when its
    (rule, key) has no event in ``events`` and no operation due by
    ``watermark_ms``, and it is an expiry marker or a pending operation whose
    deadline is after the watermark. Keys are matched per rule, so no
    (rule, key) encoding can collide. A row with a null where a value is needed
    is not untouched: the processor rejects it with a clear error.
    """
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    kind = state["state_kind"]
    pending = pc.equal(kind, STATE_PENDING)
    due = pc.and_kleene(pending, pc.less_equal(state["deadline"], watermark_ms))
    carriable = pc.or_kleene(
        pc.equal(kind, STATE_EXPIRED),
        pc.and_kleene(pending, pc.greater(state["deadline"], watermark_ms)),
    )
    touched = None
    for rule in rules.rules:
        in_rule = pc.equal(state["rule"], rule.name)
        keys = pa.chunked_array(
            [
                *events.filter(pc.equal(events["rule"], rule.name))["key"].chunks,
                *state.filter(pc.and_kleene(in_rule, due))["key"].chunks,
            ],
            type=pa.string(),
        )
        hit = pc.and_kleene(in_rule, pc.is_in(state["key"], value_set=pc.unique(keys)))
        touched = hit if touched is None else pc.or_kleene(touched, hit)
    assert touched is not None  # Rules has at least one rule
    return pc.fill_null(pc.and_kleene(carriable, pc.invert(touched)), False)


def _process_increment(
    rules: Rules, start_ms: int | None, watermark_ms: int, batches: Iterator[pa.RecordBatch]
) -> list[pa.RecordBatch]:
    """One partition's rows in; its outputs and next state out (no rows in: none out)."""
    from itertools import repeat
    from operator import itemgetter

    import pyarrow as pa
    import pyarrow.compute as pc

    from .core import PartitionProcessor, StateRow

    batch_list = list(batches)
    if not batch_list:
        return []
    table = pa.Table.from_batches(batch_list)
    is_state = pc.is_valid(table["state_kind"])
    event_rows = table.filter(pc.invert(is_state))
    state_rows = table.filter(is_state)
    out_schema = _proc_out_arrow_schema(pa)
    names = rules.names
    out: list[pa.RecordBatch] = []
    if state_rows.num_rows:
        unknown = set(pc.unique(state_rows["rule"]).to_pylist()) - set(names)
        if unknown:
            raise ValueError(f"state rows name rules {sorted(unknown)}, not among {list(names)}")
        untouched = _untouched_state(rules, event_rows, state_rows, watermark_ms)
        carried = state_rows.filter(untouched)
        state_rows = state_rows.filter(pc.invert(untouched))
        if carried.num_rows:
            n = carried.num_rows
            columns = {
                "kind": carried["state_kind"],
                "rule": carried["rule"],
                "key": carried["key"],
                "id": carried["event_id"],
                "time": carried["time"],
                "deadline": carried["deadline"],
            }
            out.extend(
                pa.table(
                    [columns.get(f.name, pa.nulls(n, f.type)) for f in out_schema],
                    schema=out_schema,
                ).to_batches()
            )

    # (rule name, event type) -> (rule index, kind): one lookup per event
    kind_of = {
        (rule.name, etype): (i, rule.kind_of(etype))
        for i, rule in enumerate(rules.rules)
        for etype in (*rule.open, *rule.complete, *rule.cancel)
    }
    state: list[StateRow] = []
    events: list[tuple[int, str, int, int, str, int, str]] = []
    if state_rows.num_rows:
        c = state_rows.to_pydict()
        state.extend(
            map(
                StateRow,
                c["state_kind"],
                c["rule"],
                c["key"],
                c["event_id"],
                c["time"],
                c["deadline"],
                repeat(None),
                repeat(None),
            )
        )
    if event_rows.num_rows:
        c = event_rows.to_pydict()
        try:
            rule_kind = list(map(kind_of.__getitem__, zip(c["rule"], c["event_type"], strict=True)))
        except KeyError as exc:  # the fan-out selects only the rules' types
            raise AssertionError(f"event of no rule's type: {exc}") from None
        index, kind = zip(*rule_kind, strict=True)
        events.extend(
            zip(
                index,
                c["key"],
                c["time"],
                c["seq"],
                c["event_id"],
                kind,
                c["event_type"],
                strict=True,
            )
        )
    if not state and not events:
        return out
    events.sort(key=itemgetter(2, 3, 4, 0))  # (time, seq, event id, rule)
    proc = PartitionProcessor(
        rules, rules.input.allowed_lateness_ms, state=state, start_ms=start_ms
    )
    try:
        proc.process(events, watermark_ms=watermark_ms)
        proc.finish(watermark_ms)
        if proc.buffered_events():  # cannot happen: only events <= watermark come in
            raise AssertionError(f"unexpected buffered events: {proc.buffered_events()[:3]}")
        out.append(
            _processed_batch(
                pa,
                out_schema,
                names,
                proc.take_outcomes(),
                proc.take_unmatched(),
                proc.pending_operations(),
                proc.expired_markers(),
            )
        )
        return out
    finally:
        proc.close()


def _processed_batch(
    pa: Any,
    schema: Any,
    names: Sequence[str],
    outcomes: Sequence[tuple[Any, ...]],
    unmatched: Sequence[tuple[Any, ...]],
    pending: Sequence[tuple[Any, ...]],
    expired: Sequence[tuple[Any, ...]],
) -> Any:
    """One record batch of ``schema``: outcome, unmatched, pending and expired rows.

    The tuples are :class:`~.core.PartitionProcessor`'s raw rows
    (``take_outcomes``, ``take_unmatched``, ``pending_operations``,
    ``expired_markers``); each output column is built in one go.
    """
    o = list(zip(*outcomes, strict=True)) or [()] * 8
    u = list(zip(*unmatched, strict=True)) or [()] * 6
    p = list(zip(*pending, strict=True)) or [()] * 5
    e = list(zip(*expired, strict=True)) or [()] * 3
    no, nu, np_, ne = len(outcomes), len(unmatched), len(pending), len(expired)

    def nulls(n: int) -> list[None]:
        return [None] * n

    columns = {
        "kind": ["outcome"] * no + ["unmatched"] * nu + ["pending"] * np_ + ["expired"] * ne,
        "rule": [names[i] for i in (*o[0], *u[0], *p[0], *e[0])],
        "key": [*o[1], *u[1], *p[1], *e[1]],
        "id": [*o[2], *u[2], *p[2], *nulls(ne)],
        "time": [*o[3], *u[4], *p[3], *e[2]],
        "deadline": [*o[4], *nulls(nu), *p[4], *nulls(ne)],
        "outcome": [*o[5], *nulls(nu + np_ + ne)],
        "resolved_at": [*o[6], *nulls(nu + np_ + ne)],
        "latency_ms": [
            *(None if at is None else at - at0 for at0, at in zip(o[3], o[6], strict=True)),
            *nulls(nu + np_ + ne),
        ],
        "resolve_event_id": [*o[7], *nulls(nu + np_ + ne)],
        "event_type": [*nulls(no), *u[3], *nulls(np_ + ne)],
        "reason": [*nulls(no), *u[5], *nulls(np_ + ne)],
    }
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def _proc_out_arrow_schema(pa: Any) -> Any:
    """``_PROC_OUT_SCHEMA`` as an Arrow schema."""
    arrow_type = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, arrow_type[kind]) for name, kind in _PROC_OUT_COLUMNS])


# ----------------------------------------------------------------------------- the job


def _log(config: StreamConfig, message: str) -> None:
    if not config.quiet:
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp}] stream: {message}", flush=True)


def _parse_time_text(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return int(when.timestamp() * 1000)


class StreamJob:
    """One ``tickwheel pipeline stream`` run: lock, SparkSession, query, per-batch commits."""

    def __init__(self, config: StreamConfig, spark: SparkSession | None = None) -> None:
        """Validate the options and take the checkpoint lock (refused if held). O(1)."""
        from .maxwell import split_maxwell_tables
        from .rules import RulesError, parse_rules

        self.config = config
        try:
            import tomllib

            with open(config.rules_path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError:
            raise StreamError(f"{config.rules_path}: no such rules file") from None
        except ValueError as exc:
            raise StreamError(f"{config.rules_path}: not valid TOML: {exc}") from None
        clean, self.maxwell_specs = split_maxwell_tables(doc)
        try:
            self.rules: Rules = parse_rules(clean)
        except RulesError as exc:
            raise StreamError(f"{config.rules_path}: {exc}") from None
        self.input_format = config.input_format or self.rules.input.format
        if self.input_format == "jsonl":
            self.input_format = "json"
        if self.input_format not in ("json", "csv", "parquet", "maxwell"):
            raise StreamError(
                "--input-format: expected jsonl, csv, parquet or maxwell, "
                f"got {self.input_format!r}"
            )
        if self.input_format == "maxwell" and not self.maxwell_specs:
            raise StreamError(
                f"{config.rules_path}: --input-format maxwell needs a [rules.NAME.maxwell] table"
            )
        if self.input_format == "maxwell" and self.rules.input.sequence is None:
            raise StreamError(
                f"{config.rules_path}: --input-format maxwell orders events by binlog position; "
                'set [input].sequence (for example sequence = "seq")'
            )
        self.trigger, self.interval_ms = parse_trigger(config.trigger)
        if not os.path.isdir(config.input):
            raise StreamError(f"--input {config.input}: not a directory")
        self.checkpoint = os.path.abspath(config.checkpoint)
        self.root = os.path.join(self.checkpoint, "tickwheel")
        os.makedirs(self.root, exist_ok=True)
        self._lock = _CheckpointLock(self.root)
        self._lock.acquire()
        self.store = _StateStore(self.root)
        self._spark = spark
        self._batch_spark: SparkSession | None = None
        self.sink: BatchSink | None = None
        self.batches_run = 0
        self.totals: dict[str, int] = {}
        self.warnings: list[str] = []
        self._persisted: list[DataFrame] = []
        self._marks: list[tuple[str, float]] = []

    # -- session ------------------------------------------------------------
    def _session(self) -> SparkSession:
        if self._spark is not None:
            return self._spark
        from .sinks import spark_jdbc_conf
        from .spark_job import create_session

        conf = {"spark.sql.session.timeZone": "UTC", **spark_jdbc_conf()}
        spark = create_session(
            master=self.config.master or "local[2]",
            app_name="tickwheel-stream",
            shuffle_partitions=self.config.partitions or 4,
            conf=conf,
        )
        spark.sparkContext.setLogLevel("ERROR")
        self._spark = spark
        return spark

    def _batch_session(self) -> SparkSession:
        """The session the micro-batches run in: a child of :meth:`_session`.

        Made once by :func:`~tickwheel.pipeline.spark_job.job_session`, with the
        pipeline's :data:`~tickwheel.pipeline.spark_job.JOB_SQL_SETTINGS`; the
        caller's session is not changed.
        """
        if self._batch_spark is None:
            from .spark_job import job_session

            self._batch_spark = job_session(self._session())
        return self._batch_spark

    def close(self) -> None:
        """Release the checkpoint lock (the SparkSession is left to its owner)."""
        self._lock.release()

    def __enter__(self) -> StreamJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the query to the end of the trigger (once / available-now) or forever."""
        from .sinks import make_sink

        spark = self._session()
        jvm_pid = None
        with contextlib.suppress(Exception):
            jvm = spark.sparkContext._jvm
            assert jvm is not None
            jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        self._lock.write_owner(jvm_pid)
        self.sink = make_sink(self.config.sink, self.config.output, spark, url=self.config.jdbc_url)
        _log(
            self.config,
            f"rules {self.rules.names}, input {self.config.input} "
            f"({self.input_format}), sink {self.sink.describe()}, checkpoint {self.checkpoint}",
        )
        from ._file_source import SOURCE_NAME, OrderedFileSource

        # Spark's own file source orders files by modification time only; this
        # one by (modification time, name), logged in the checkpoint.
        spark.dataSource.register(OrderedFileSource)
        reader = spark.readStream.format(SOURCE_NAME).option(
            "log", os.path.join(self.root, "files.log")
        )
        if self.config.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", str(self.config.max_files_per_trigger))
        source = reader.load(os.path.abspath(self.config.input))
        writer = source.writeStream.foreachBatch(self._on_batch).option(
            "checkpointLocation", os.path.join(self.checkpoint, "spark")
        )
        if self.trigger == "once":
            writer = writer.trigger(once=True)
        elif self.trigger == "available-now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.interval_ms} milliseconds")
        started = time.perf_counter()
        query = writer.start()
        try:
            query.awaitTermination()
        finally:
            if query.isActive:
                query.stop()
        elapsed = time.perf_counter() - started
        last = self.store.committed()
        summary = {
            "batches_run": self.batches_run,
            "last_batch": last[-1] if last else None,
            "seconds": round(elapsed, 3),
            "sink": self.sink.describe(),
            **self.totals,
            "warnings": self.warnings,
        }
        if last:
            summary["watermark"] = _read_json(os.path.join(self.store.path(last[-1]), "meta.json"))[
                "watermark"
            ]
        _log(self.config, f"done: {json.dumps(summary, sort_keys=True)}")
        return summary

    def _mark(self, phase: str) -> None:
        self._marks.append((phase, time.perf_counter()))

    def _phases(self) -> str:
        marks = self._marks
        return " ".join(f"{name}={t - marks[i][1]:.1f}s" for i, (name, t) in enumerate(marks[1:]))

    def _on_batch(self, files_df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        if os.path.isdir(self.store.path(batch_id)):
            _log(self.config, f"batch {batch_id}: already committed; skipped (replay)")
            return
        later = [b for b in self.store.committed() if b > batch_id]
        if later:
            raise StreamError(
                f"checkpoint {self.checkpoint}: Spark replays batch {batch_id} but tickwheel's "
                f"state is already at batch {later[-1]}; the checkpoint was tampered with"
            )
        _fault("batch_start", batch_id)
        self._marks = [("start", time.perf_counter())]
        listed = [r["path"] for r in files_df.collect()]  # in the source's order
        self._mark("list")
        plan = self.store.plan(
            batch_id,
            lambda: {"batch_id": batch_id, "files": listed, "now_ms": int(time.time() * 1000)},
        )
        counts = self._run_batch(batch_id, plan)
        warnings = counts.pop("warnings")
        for message in warnings:  # on stderr even with --quiet
            print(f"tickwheel pipeline stream: batch {batch_id}: warning: {message}",
                  file=sys.stderr, flush=True)  # fmt: skip
        self.warnings.extend(f"batch {batch_id}: {message}" for message in warnings)
        for name, value in counts.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.totals[name] = self.totals.get(name, 0) + value
        self.batches_run += 1
        _log(
            self.config,
            f"batch {batch_id}: {len(plan['files'])} file(s), "
            + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            + f" in {time.perf_counter() - started:.1f}s ({self._phases()})"
            + "".join(f"; WARNING: {message}" for message in warnings),
        )

    # -- reading ------------------------------------------------------------
    def _fields(self) -> list[str]:
        from .events import _fields

        return _fields(self.rules)

    def _read(self, spark: SparkSession, files: Sequence[str]) -> tuple[DataFrame, DataFrame]:
        """Read ``files`` into the batch reader's record frame, plus rejected rows.

        The records have the columns of :func:`tickwheel.pipeline.events.read_records`
        (``raw``, ``malformed``, ``f_<field>``). Unlike the batch reader, each CSV
        or Parquet file is read on its own, so one file's extra or missing columns
        or one unreadable file cannot spoil the others: an unreadable file becomes
        one ``rejected`` row naming it.
        """
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from .events import CORRUPT

        fields = self._fields()
        record_schema = T.StructType(
            [T.StructField("raw", T.StringType()), T.StructField("malformed", T.BooleanType())]
            + [T.StructField(f"f_{f}", T.StringType()) for f in fields]
        )
        rejected_schema = "event_id string, reason string, raw string"
        rejected = [spark.createDataFrame([], rejected_schema)]
        parts: list[DataFrame] = []

        def reject_file(path: str, reason: str) -> None:
            rejected.append(
                spark.createDataFrame([(None, reason, os.path.basename(path))], rejected_schema)
            )

        def from_text(lines: DataFrame) -> DataFrame:
            schema = T.StructType(
                [T.StructField(f, T.StringType()) for f in fields]
                + [T.StructField(CORRUPT, T.StringType())]
            )
            parsed = lines.where(F.trim(F.col("value")) != "").select(
                F.col("value").alias("raw"),
                F.from_json(
                    "value", schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
                ).alias("s"),
            )
            return parsed.select(
                "raw",
                (F.col("s").isNull() | F.col(f"s.{CORRUPT}").isNotNull()).alias("malformed"),
                *[F.col("s").getField(f).alias(f"f_{f}") for f in fields],
            )

        if files and self.input_format in ("json", "maxwell"):
            lines = spark.read.text(list(files))
            if self.input_format == "maxwell":
                from .maxwell import maxwell_records

                cfg = self.rules.input
                if len(self.rules.key_fields) != 1:
                    raise StreamError("--input-format maxwell needs one key field for all rules")
                lines, mrej = maxwell_records(
                    lines.where(F.trim("value") != ""),
                    self.maxwell_specs,
                    key=self.rules.key_fields[0],
                    type_field=cfg.type,
                    time_field=cfg.time,
                    id_field=cfg.id,
                    sequence_field=cfg.sequence,
                )
                rejected.append(
                    mrej.select(F.lit(None).cast("string").alias("event_id"), "reason", "raw")
                )
            parts.append(from_text(lines))
        elif self.input_format == "csv":
            for path in files:
                header = _first_line(path)
                if header is None:
                    continue  # a zero-byte file: no records
                names = [h.strip().strip('"') for h in header.split(",")]
                if len(set(names)) != len(names) or not all(names):
                    reject_file(path, f"bad CSV header: {header[:200]!r}")
                    continue
                schema = ", ".join(f"`{n}` STRING" for n in names)
                lines = spark.read.text(path).where(F.col("value") != header)
                lines = lines.where(F.trim(F.col("value")) != "")
                parsed = lines.select(
                    F.col("value").alias("raw"),
                    F.from_csv("value", schema, {"mode": "PERMISSIVE"}).alias("s"),
                )
                parts.append(
                    parsed.select(
                        "raw",
                        F.col("s").isNull().alias("malformed"),
                        *[
                            (F.col(f"s.`{f}`") if f in names else F.lit(None).cast("string")).alias(
                                f"f_{f}"
                            )
                            for f in fields
                        ],
                    )
                )
        else:  # parquet
            for path in files:
                if os.path.getsize(path) == 0:
                    continue  # a zero-byte file: no records
                try:
                    frame = spark.read.parquet(path)
                    present = set(frame.columns)
                except Exception as exc:  # garbage or truncated: reject the file, keep going
                    text = str(exc).strip()
                    first = text.splitlines()[0][:200] if text else type(exc).__name__
                    reject_file(path, f"unreadable parquet file: {first}")
                    continue
                raw = F.to_json(F.struct(*[F.col(f"`{c}`") for c in frame.columns]))
                parts.append(
                    frame.select(
                        raw.alias("raw"),
                        F.lit(False).alias("malformed"),
                        *[
                            (
                                F.col(f"`{f}`").cast("string")
                                if f in present
                                else F.lit(None).cast("string")
                            ).alias(f"f_{f}")
                            for f in fields
                        ],
                    )
                )
        records = spark.createDataFrame([], record_schema)
        for part in parts:
            records = records.unionByName(part)
        out = rejected[0]
        for more in rejected[1:]:
            out = out.unionByName(more)
        return records, out

    def _validate(
        self, records: DataFrame, max_time_ms: int | None
    ) -> tuple[DataFrame, DataFrame, DataFrame]:
        """Records → (parsed, events, rejected) with the batch pipeline's own validation.

        ``parsed`` (every record, with its reason) is persisted for the batch.
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from .events import key_column, parse_records

        parsed = parse_records(records, self.rules, max_time_ms)
        parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
        self._persisted.append(parsed)
        rejected = parsed.where(F.col("reason").isNotNull()).select("event_id", "reason", "raw")
        events = parsed.where(F.col("reason").isNull()).select(
            "event_id",
            "event_type",
            "time",
            "seq",
            "raw",
            *[F.col(key_column(i)).alias(f"k_{k}") for i, k in enumerate(self.rules.key_fields)],
        )
        return parsed, events, rejected

    # -- one micro-batch ------------------------------------------------------
    def _heartbeats(self, spark: SparkSession, paths: Sequence[str]) -> tuple[list[int], list[Any]]:
        times, bad = [], []
        for path in paths:
            with open(path, "rb") as fh:
                text = fh.read(4096).decode("utf-8", errors="replace")
            value = text.strip()
            with contextlib.suppress(ValueError):
                obj = json.loads(value)
                if isinstance(obj, dict):
                    value = str(obj.get("time", obj.get(self.rules.input.time, "")))
                elif isinstance(obj, int):
                    value = str(obj)
            ms = _parse_time_text(value)
            if ms is None or ms < 0:
                bad.append((None, "bad heartbeat: expected an event time", text[:1000]))
            else:
                times.append(ms)
        return times, bad

    def _run_batch(self, batch_id: int, plan: Mapping[str, Any]) -> dict[str, Any]:
        from concurrent.futures import ThreadPoolExecutor

        from pyspark import StorageLevel
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        spark = self._batch_session()
        assert self.sink is not None
        cfg = self.rules.input
        lateness = cfg.allowed_lateness_ms
        key_cols = [f"k_{k}" for k in self.rules.key_fields]
        prev = self.store.latest_before(batch_id)
        meta_prev: dict[str, Any] = (
            _read_json(os.path.join(self.store.path(prev), "meta.json")) if prev is not None else {}
        )
        w_prev: int | None = meta_prev.get("watermark")
        max_prev: int | None = meta_prev.get("max_time")
        files = [p[len("file:") :] if p.startswith("file:") else p for p in plan["files"]]
        # A file listed, then removed before this batch read it: one rejected row.
        gone = [p for p in files if not os.path.exists(p)]
        files = [p for p in files if p not in gone]
        hb_files = [p for p in files if p.endswith(_HEARTBEAT_SUFFIX)]
        data_files = [p for p in files if not p.endswith(_HEARTBEAT_SUFFIX)]
        hb_times, file_rejects = self._heartbeats(spark, hb_files)
        file_rejects.extend((None, MISSING_FILE, os.path.basename(p)) for p in gone)

        records, rejected_read = self._read(spark, data_files)
        future_limit = (
            None
            if self.config.max_future_ms is None
            else int(plan["now_ms"]) + self.config.max_future_ms
        )
        parsed, events, rejected_bad = self._validate(records, future_limit)
        rejected_parts = [rejected_read, rejected_bad]
        if file_rejects:
            rejected_parts.append(
                spark.createDataFrame(file_rejects, "event_id string, reason string, raw string")
            )
        # The first action on the parsed (cached) batch: what the warnings and
        # the progress line count.
        valid, reason = F.col("reason").isNull(), F.col("reason")
        is_late = F.lit(False) if w_prev is None else valid & (F.col("time") < w_prev)
        seen = parsed.agg(
            F.sum(F.when(valid, 1).otherwise(0)).alias("valid"),
            F.sum(F.when(is_late, 1).otherwise(0)).alias("late"),
            F.sum(F.when(reason == "far_future", 1).otherwise(0)).alias("far_future"),
        ).collect()[0]
        arrived, n_late = int(seen["valid"] or 0), int(seen["late"] or 0)
        n_far_future = int(seen["far_future"] or 0)
        if w_prev is not None:
            late = events.where(F.col("time") < w_prev).select(
                "event_id",
                "event_type",
                F.col("time").alias("event_time"),
                *[F.col(c).alias(c[2:]) for c in key_cols],
                F.lit(w_prev).cast("long").alias("watermark"),
                F.lit("late: event time below the watermark").alias("reason"),
                "raw",
            )
            events = events.where(F.col("time") >= w_prev)
        else:
            late = events.where(F.lit(False)).select(
                "event_id",
                "event_type",
                F.col("time").alias("event_time"),
                *[F.col(c).alias(c[2:]) for c in key_cols],
                F.lit(None).cast("long").alias("watermark"),
                F.lit(None).cast("string").alias("reason"),
                "raw",
            )
        event_cols = ["event_id", "event_type", "time", "seq", "raw", *key_cols]
        state_events_path = (
            os.path.join(self.store.path(prev), "events") if prev is not None else None
        )
        if state_events_path and os.path.isdir(state_events_path):
            # The schema is known: giving it spares Spark a job reading the footers.
            old = spark.read.schema(events.select(*event_cols).schema).parquet(state_events_path)
            old = old.withColumn("_old", F.lit(True)).withColumn(
                "_applied", F.col("time") <= F.lit(w_prev)
            )
        else:
            old = events.where(F.lit(False)).select(*event_cols)
            old = old.withColumn("_old", F.lit(True)).withColumn("_applied", F.lit(True))
        new = events.select(*event_cols).withColumn("_old", F.lit(False))
        new = new.withColumn("_applied", F.lit(False))
        both = old.unionByName(new)
        by_id = Window.partitionBy("event_id").orderBy(
            F.col("_applied").desc(), "time", "seq", "raw"
        )
        content = F.struct("event_type", "time", "seq", *key_cols)
        ranked = (
            both.withColumn("_rn", F.row_number().over(by_id))
            .withColumn("_kept", F.first(content).over(by_id))
            .withColumn("_same", content == F.col("_kept"))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        stats_row = ranked.agg(
            F.max(F.when((F.col("_rn") == 1) & ~F.col("_old"), F.col("time"))).alias("max_new"),
            F.sum(F.when((F.col("_rn") == 1) & ~F.col("_old"), 1).otherwise(0)).alias("events"),
            F.sum(F.when((F.col("_rn") > 1) & F.col("_same"), 1).otherwise(0)).alias("duplicates"),
            F.sum(F.when((F.col("_rn") > 1) & ~F.col("_same"), 1).otherwise(0)).alias("conflicts"),
        ).collect()[0]
        self._mark("parse+dedup")
        candidates = [m for m in (max_prev, stats_row["max_new"], *hb_times) if m is not None]
        max_time = max(candidates) if candidates else None
        w_new = w_prev
        if max_time is not None:
            w_new = max_time - lateness if w_prev is None else max(w_prev, max_time - lateness)
        rejected_parts.append(
            ranked.where((F.col("_rn") > 1) & ~F.col("_same")).select(
                "event_id", F.lit("conflict").alias("reason"), "raw"
            )
        )
        kept = ranked.where(F.col("_rn") == 1)
        if w_new is not None:
            next_events = kept.where(F.col("time") >= w_new).select(*event_cols)
            todo = kept.where(~F.col("_applied") & (F.col("time") <= w_new))
        else:
            next_events = kept.select(*event_cols)
            todo = kept.where(F.lit(False))
        # fan out to the rules: one row per (rule, event) whose type the rule uses
        fan: list[DataFrame] = []
        for rule in self.rules.rules:
            types = [*rule.open, *rule.complete, *rule.cancel]
            fan.append(
                todo.where(F.col("event_type").isin(*types)).select(
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
        ops_path = os.path.join(self.store.path(prev), "ops") if prev is not None else None
        if ops_path and os.path.isdir(ops_path):
            fan.append(
                spark.read.schema(_OPS_SCHEMA)
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
        proc_in = fan[0]
        for more in fan[1:]:
            proc_in = proc_in.unionByName(more)
        partitions = self.config.partitions or int(
            spark.conf.get("spark.sql.shuffle.partitions") or 4
        )
        if w_new is not None:
            proc_out = (
                proc_in.repartition(partitions, "rule", "key")
                .mapInArrow(_process_partitions(self.rules, w_prev, w_new), _PROC_OUT_SCHEMA)
                .persist(StorageLevel.MEMORY_AND_DISK)
            )
        else:
            proc_out = spark.createDataFrame([], _PROC_OUT_SCHEMA)
        outcomes = proc_out.where(F.col("kind") == "outcome").select(
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
        unmatched = proc_out.where(F.col("kind") == "unmatched").select(
            "rule",
            "key",
            F.col("id").alias("event_id"),
            "event_type",
            F.col("time").alias("event_time"),
            "reason",
        )
        ops = proc_out.where(F.col("kind").isin("pending", "expired")).select(
            "kind", "rule", "key", F.col("id").alias("event_id"), "time", "deadline"
        )
        rejected = rejected_parts[0]
        for more in rejected_parts[1:]:
            rejected = rejected.unionByName(more)
        tables = {
            "outcomes": outcomes,
            "unmatched": unmatched,
            "rejected": _valid_raw(rejected),
            "late": _valid_raw(late),
        }
        try:
            counts: dict[str, Any] = {
                "events": int(stats_row["events"] or 0),
                "duplicates": int(stats_row["duplicates"] or 0),
                "conflicts": int(stats_row["conflicts"] or 0),
                "late": n_late,
                "far_future": n_far_future,
            }
            warnings = abnormal_batch_warnings(
                arrived=arrived,
                late=n_late,
                previous_max_time=max_prev,
                watermark=w_new,
                longest_timeout_ms=max(r.timeout_ms for r in self.rules.rules),
            )
            staged = self.store.staged(batch_id)
            shutil.rmtree(staged, ignore_errors=True)
            os.makedirs(staged)
            # The next state does not depend on the outputs: its two tables are
            # written while the outputs are staged, so the Spark jobs overlap.
            # Nothing is committed until both are staged (see the module doc).
            with ThreadPoolExecutor(max_workers=2) as pool:
                state_writes = [
                    pool.submit(next_events.write.parquet, os.path.join(staged, "events")),
                    pool.submit(ops.write.parquet, os.path.join(staged, "ops")),
                ]
                if not self.sink.is_committed(batch_id):  # a replay after the sink's commit
                    self.sink.stage(
                        batch_id, tables, on_table=lambda _name: _fault("mid_batch", batch_id)
                    )
                self._mark("outputs")
                _fault("after_outputs", batch_id)
                for future in state_writes:
                    future.result()
            _write_json(
                os.path.join(staged, "meta.json"),
                {
                    "batch_id": batch_id,
                    "watermark": w_new,
                    "max_time": max_time,
                    "files": plan["files"],
                    "counts": counts,
                    "warnings": warnings,
                },
            )
            self._mark("state")
            _fault("after_state", batch_id)
            self.sink.commit(batch_id)
            _fault("after_sink_commit", batch_id)
            self.store.commit(batch_id)
            _fault("after_commit", batch_id)
            self.store.prune(batch_id)
            self._mark("commit")
        finally:
            ranked.unpersist()
            proc_out.unpersist()
            for df in self._persisted:
                df.unpersist()
            self._persisted.clear()
        counts["watermark"] = w_new
        counts["warnings"] = warnings
        return counts


def abnormal_batch_warnings(
    *,
    arrived: int,
    late: int,
    previous_max_time: int | None,
    watermark: int | None,
    longest_timeout_ms: int,
) -> list[str]:
    """What looks wrong about one micro-batch, as messages for the user. O(1).

    * most of the batch's valid events (``late`` of ``arrived``) were older
      than the previous watermark: files arrived out of order, or an earlier
      record moved the watermark too far;
    * the watermark moved past the previous batch's largest event time by more
      than the longest rule timeout: every operation pending then has expired
      at once, which one record with a wrong time can cause.
    """
    warnings = []
    if arrived and late * 2 > arrived:
        warnings.append(
            f"{late:,} of this batch's {arrived:,} events were older than the watermark "
            "and went to late/"
        )
    if previous_max_time is not None and watermark is not None:
        jump = watermark - previous_max_time
        if jump > longest_timeout_ms:
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


def _valid_raw(frame: DataFrame) -> DataFrame:
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


def _first_line(path: str) -> str | None:
    with open(path, "rb") as fh:
        line = fh.readline()
    if not line:
        return None
    return line.decode("utf-8", errors="replace").rstrip("\r\n")


def read_stream_outputs(
    spark: SparkSession, sink: BatchSink, checkpoint: str
) -> dict[str, DataFrame | None]:
    """The job's outputs so far: every committed batch's rows plus the current state.

    ``outcomes`` holds the final outcomes of all committed batches and one
    ``pending`` row for each operation still pending in the latest committed
    state (what a single batch run over the same data writes); ``unmatched``,
    ``rejected`` and ``late`` are the union of the batches; ``buffered`` lists
    the events above the watermark, not applied yet. ``batch_id`` is kept on
    the batch tables. O(output size).
    """
    from pyspark.sql import functions as F

    store = _StateStore(os.path.join(os.path.abspath(checkpoint), "tickwheel"))
    out: dict[str, DataFrame | None] = {t: sink.read_table(spark, t) for t in _TABLES}
    committed = store.committed()
    if not committed:
        out["buffered"] = None
        return out
    last = store.path(committed[-1])
    meta = _read_json(os.path.join(last, "meta.json"))
    ops = spark.read.parquet(os.path.join(last, "ops"))
    pending = ops.where(F.col("kind") == "pending").select(
        "rule",
        "key",
        F.col("event_id").alias("op_id"),
        F.col("time").alias("opened_at"),
        "deadline",
        F.lit("pending").alias("outcome"),
        F.lit(None).cast("long").alias("resolved_at"),
        F.lit(None).cast("long").alias("latency_ms"),
        F.lit(None).cast("string").alias("resolve_event_id"),
        F.lit(None).cast("long").alias("batch_id"),
    )
    final = out["outcomes"]
    out["outcomes"] = pending if final is None else final.unionByName(pending)
    events = spark.read.parquet(os.path.join(last, "events"))
    watermark = meta.get("watermark")
    out["buffered"] = events if watermark is None else events.where(F.col("time") > watermark)
    return out


# ----------------------------------------------------------------------------- CLI


def add_stream_arguments(parser: Any) -> None:
    """Add the options of ``tickwheel pipeline stream`` to an argparse parser. O(1)."""
    parser.add_argument("--rules", required=True, help="rules TOML file")
    parser.add_argument("--input", required=True, help="directory the stream watches for files")
    parser.add_argument("--output", required=True, help="output directory (and SQLite home)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (one job)")
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="once | available-now (default) | interval=30s (runs until stopped)",
    )
    parser.add_argument(
        "--sink", default="parquet", choices=("parquet", "sqlite", "postgresql"), help="sink"
    )
    parser.add_argument("--jdbc-url", help="JDBC URL for --sink sqlite/postgresql")
    parser.add_argument(
        "--input-format",
        choices=("jsonl", "json", "csv", "parquet", "maxwell"),
        help="input format (default: the rules' [input].format)",
    )
    parser.add_argument("--partitions", type=int, help="partitions of the purgatory stage")
    parser.add_argument(
        "--max-files-per-trigger", type=int, help="at most this many new files per micro-batch"
    )
    parser.add_argument(
        "--max-future",
        default="1d",
        help="reject events stamped more than this after processing time as far_future "
        "('1d' default, '2h', ms, or 'off')",
    )
    parser.add_argument("--master", help="Spark master URL (default local[2])")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run_stream_command(args: Any) -> int:
    """Run ``tickwheel pipeline stream`` from parsed arguments; return the exit code."""
    from .events import parse_max_future
    from .rules import RulesError
    from .sinks import SinkError

    try:
        max_future = parse_max_future(args.max_future)
        if args.partitions is not None and args.partitions < 1:
            raise StreamError("--partitions must be >= 1")
        config = StreamConfig(
            rules_path=args.rules,
            input=args.input,
            output=args.output,
            checkpoint=args.checkpoint,
            trigger=args.trigger,
            sink=args.sink,
            jdbc_url=args.jdbc_url,
            input_format=args.input_format,
            partitions=args.partitions,
            max_files_per_trigger=args.max_files_per_trigger,
            max_future_ms=max_future,
            master=args.master,
            quiet=args.quiet,
        )
        with StreamJob(config) as job:
            job.run()
    except (StreamError, RulesError, SinkError) as exc:
        print(f"tickwheel pipeline stream: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tickwheel.pipeline.stream``: the same as ``tickwheel pipeline stream``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tickwheel pipeline stream",
        description="Incremental, exactly-once pipeline over a directory of arriving files.",
    )
    add_stream_arguments(parser)
    return run_stream_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
