"""What a stream checkpoint holds: its last commit, what is pending, who holds it.

:func:`checkpoint_status` reads a checkpoint (``CK/tickwheel/``, laid out as
:mod:`.checkpoint` describes, and Spark's ``CK/spark/`` beside it) and returns
plain, JSON-able figures: the last committed batch and when it committed, the
watermark and how far it lags processing time, the rules in force, the
pending operations per rule with the oldest deadline, the carried events, the
state's size, the files taken and those still waiting, and the owner.
``tickwheel pipeline status`` prints them (:func:`~.status_report.render_status`).

It only reads. A local checkpoint is read with :mod:`os` and pyarrow (no JVM,
no Spark); a URI one through a classic session's Hadoop file systems
(:func:`~..storage.storage_for`), its Parquet through Spark. Whether the owner
still holds the checkpoint is decided by :func:`~.checkpoint.owner_holding`,
as :class:`~.checkpoint.CheckpointOwner` decides it, without waiting: on a
local path by trying the ``flock`` of ``LOCK`` on a fresh descriptor, released
at once; on a URI by ``T.released``, the owner's process on this host, or the
age of its last heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..storage import (
    Storage,
    StorageError,
    absolute,
    is_uri,
    join,
    local_path,
    read_json,
    storage_for,
)
from .changelog import committed_frames, committed_tables
from .checkpoint import StateStore, StreamError, owner_holding, tickwheel_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["checkpoint_status", "listable", "rule_names"]


def checkpoint_status(
    checkpoint: str,
    *,
    spark: SparkSession | None = None,
    input: str | None = None,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """The figures of the stream checkpoint ``checkpoint`` (``CK``, or its ``CK/tickwheel``).

    Returns a dict of JSON values (see ``docs/pipeline.md``, "Inspecting a
    checkpoint"): ``last_batch``, ``committed_at_ms``, ``watermark`` and
    ``watermark_lag_ms`` (``now_ms`` minus it; default: now), ``rules``,
    ``format`` and ``tickwheel`` (None when the commit did not record them),
    ``pending`` (per rule: ``count`` and ``oldest_deadline``), ``events``,
    ``state``, ``files`` (taken, and waiting in ``input``, else in the input
    the commit recorded) and ``owner``.

    A URI checkpoint needs ``spark``, a classic session (default: the active
    one). Raises :class:`~.checkpoint.StreamError` naming the path when it is
    not a checkpoint or cannot be read.

    Cost: O(pending and expiry rows + carried events) for the last state's
    Parquet, three columns of it read (pyarrow, batch by batch; on a URI two
    Spark jobs); O(the source log's lines + files in the input) for the file figures;
    O(batches kept + owners) listings. Nothing is written.
    """
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    top, root = _roots(checkpoint)
    if is_uri(root):
        spark = _classic(spark, root)
    try:
        storage = storage_for(root, spark)
    except StorageError as exc:
        raise StreamError(f"checkpoint {exc}") from None
    try:
        return _status(top, root, storage, spark, input, now)
    except StreamError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise StreamError(f"checkpoint {top}: cannot be read: {exc}") from None


def _roots(checkpoint: str) -> tuple[str, str]:
    """(``CK``, ``CK/tickwheel``) of what the user named: either of the two."""
    top = absolute(checkpoint).rstrip("/") or "/"
    named_root = top.rsplit("/", 1)[-1] == "tickwheel" and not is_uri(top)
    layout = ("commits", "owners", "state")
    if named_root and any(os.path.isdir(os.path.join(top, d)) for d in layout):
        return top.rsplit("/", 1)[0] or "/", top
    return top, tickwheel_root(top)


def _classic(spark: SparkSession | None, where: str) -> SparkSession:
    """``spark``, else the active session: one is needed to reach ``where``."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    if spark is None:
        raise StreamError(f"{where}: a URI needs a Spark session (spark=) to reach its file system")
    return spark


def _status(
    top: str,
    root: str,
    storage: Storage,
    spark: SparkSession | None,
    input: str | None,
    now: int,
) -> dict[str, Any]:
    if not storage.exists(top):
        raise StreamError(f"checkpoint {top}: not found")
    if not storage.exists(root):
        raise StreamError(
            f"checkpoint {top}: not a tickwheel stream checkpoint (no tickwheel/ directory)"
        )
    store = StateStore(root, storage)
    try:
        committed = store.committed()
        last = committed[-1] if committed else None
        commit = store.read_commit(last) if last is not None else None
    except ValueError as exc:  # names the batch whose commit it is
        raise StreamError(f"checkpoint {top}: {exc}") from None
    committed_at = _int_or_none(commit.committed_at_ms if commit else None)
    watermark = _int_or_none(commit.watermark if commit else None)
    status: dict[str, Any] = {
        "checkpoint": top,
        "now_ms": now,
        "last_batch": last,
        "committed_batches": committed,
        "committed_at_ms": committed_at,
        "commit_age_ms": None if committed_at is None else now - committed_at,
        "running_batch": _running_batch(storage, top, last),
        "watermark": watermark,
        "watermark_lag_ms": None if watermark is None else now - watermark,
        "max_time": _int_or_none(commit.max_time if commit else None),
        "rules": commit.rules if commit else None,
        "format": commit.stamp.format if commit else None,
        "tickwheel": commit.stamp.tickwheel if commit else None,
        "last_batch_counts": dict(commit.counts) if commit else None,
        "warnings": list(commit.warnings) if commit else [],
    }
    if last is None or commit is None:
        status.update(pending=None, markers=None, events=None, state=None)
    else:
        state = store.state_path(commit)
        figures = (
            _spark_state(committed_frames(store, spark, last, commit), watermark)
            if is_uri(root) and spark is not None
            else _local_state(committed_tables(store, last, commit), watermark)
        )
        pending, markers, events, buffered = figures
        for name in rule_names(commit.rules):
            pending.setdefault(name, {"count": 0, "oldest_deadline": None})
        listed = list(storage.list_files(state)) if storage.exists(state) else []
        status.update(
            pending={
                "total": sum(p["count"] for p in pending.values()),
                "by_rule": dict(sorted(pending.items())),
            },
            markers=markers,
            events={"rows": events, "buffered": buffered},
            state={
                "path": state,
                "rows": _int_or_none(commit.state_rows),
                "provider": commit.state_provider,
                "memory_bytes": _int_or_none(commit.state_bytes),
                "partitions": _int_or_none(commit.state_partitions),
                "partitions_local": commit.state_local_share,
                "bytes": sum(size for _path, size, _mtime in listed),
                "files": len(listed),
            },
        )
    given = None if input is None else absolute(input)
    status["files"] = _files(storage, spark, top, root, given or (commit.input if commit else None))
    status["owner"] = _owner(storage, root, now)
    return status


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rule_names(rules: Any) -> list[str]:
    """The rule names in the recorded rules, when their shape says them."""
    if not isinstance(rules, Mapping):
        return []
    inner = rules.get("rules")
    if isinstance(inner, Mapping):
        return [str(name) for name in inner]
    if isinstance(inner, list):
        return [str(r["name"]) for r in inner if isinstance(r, Mapping) and "name" in r]
    return []


def _running_batch(storage: Storage, top: str, last: int | None) -> int | None:
    """A batch Spark planned after the last commit (running, or left by a crash)."""
    ids = [int(n) for n in storage.list_names(join(top, "spark", "offsets")) if n.isdigit()]
    newest = max(ids, default=None)
    return newest if newest is not None and (last is None or newest > last) else None


# -- the last state -------------------------------------------------------------

Pending = dict[str, dict[str, Any]]


def _local_state(tables: Mapping[str, Any], watermark: int | None) -> tuple[Pending, int, int, int]:
    """(pending by rule, expiry markers, events, buffered events) of the state's Arrow
    tables (:func:`.resident.committed_tables`)."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    pending: Pending = {}
    markers = 0
    ops = tables.get("ops")
    if ops is not None:
        is_pending = pc.equal(ops["kind"], "pending")
        waiting = ops.filter(is_pending)
        markers += ops.num_rows - waiting.num_rows
        grouped = waiting.group_by("rule").aggregate(
            [("deadline", "count", pc.CountOptions(mode="all")), ("deadline", "min")]
        )
        for rule, count, oldest in zip(
            grouped["rule"].to_pylist(),
            grouped["deadline_count"].to_pylist(),
            grouped["deadline_min"].to_pylist(),
            strict=True,
        ):
            _add_pending(pending, rule, count, oldest)
    events = buffered = 0
    found = tables.get("events")
    if found is not None:
        events = found.num_rows
        if watermark is not None:
            buffered = int(pc.sum(pc.greater(found["time"], watermark)).as_py() or 0)
    return pending, markers, events, buffered


def _add_pending(pending: Pending, rule: str, count: int, oldest: int | None) -> None:
    entry = pending.setdefault(rule, {"count": 0, "oldest_deadline": None})
    entry["count"] += int(count)
    if oldest is not None and (
        entry["oldest_deadline"] is None or oldest < entry["oldest_deadline"]
    ):
        entry["oldest_deadline"] = int(oldest)


def _spark_state(
    frames: Mapping[str, DataFrame], watermark: int | None
) -> tuple[Pending, int, int, int]:
    """The same figures as :func:`_local_state`, of the state's DataFrames
    (:func:`.resident.committed_frames`; two jobs)."""
    from pyspark.sql import functions as F

    pending: Pending = {}
    markers = 0
    ops = frames.get("ops")
    if ops is not None:
        grouped = ops.groupBy("kind", "rule").agg(
            F.count(F.lit(1)).alias("n"), F.min("deadline").alias("oldest")
        )
        for row in grouped.collect():
            if row["kind"] == "pending":
                _add_pending(pending, row["rule"], row["n"], row["oldest"])
            else:
                markers += int(row["n"])
    events = buffered = 0
    found = frames.get("events")
    if found is not None:
        above = F.col("time") > F.lit(watermark) if watermark is not None else F.lit(False)
        row = found.agg(
            F.count(F.lit(1)).alias("n"), F.sum(F.when(above, 1).otherwise(0)).alias("b")
        ).collect()[0]
        events, buffered = int(row["n"]), int(row["b"] or 0)
    return pending, markers, events, buffered


# -- files ------------------------------------------------------------------------


def _files(
    storage: Storage, spark: SparkSession | None, top: str, root: str, input: Any
) -> dict[str, Any]:
    """The files taken (the ordered source's log, else Spark's file source log) and
    those waiting in ``input``."""
    source, taken, takes = _taken_files(storage, top, root)
    figures: dict[str, Any] = {
        "source": source,
        "taken": taken,
        "input": input if isinstance(input, str) else None,
        "waiting": None,
        "waiting_bytes": None,
        "next_waiting": [],
    }
    if takes is None or not isinstance(input, str) or not listable(input):
        return figures
    try:
        listed = _input_files(input, spark)
    except (OSError, StorageError, StreamError):
        return figures  # the input is gone or out of reach: waiting unknown
    waiting = sorted(
        (mtime_ns, os.path.basename(path), path, size)
        for path, size, mtime_ns in listed
        if takes(_normal(path), mtime_ns)
    )
    figures.update(
        waiting=len(waiting),
        waiting_bytes=sum(w[3] for w in waiting),
        next_waiting=[w[2] for w in waiting[:5]],
    )
    return figures


def _taken_files(
    storage: Storage, top: str, root: str
) -> tuple[str | None, int | None, Callable[[str, int], bool] | None]:
    """Which source logged the files it took, how many, and whether it would take a
    file it lists (by its normal path and modification time in ns). The ordered
    source takes a file it does not remember and that is not below the age limit
    its log records (``maxFileAge``); Spark's, a file not in its log. All None
    without a log of either."""
    from .file_log import FileLog, spark_source_logged_paths

    log_path = join(root, "files.log")
    if storage.exists(log_path):
        log = FileLog.from_bytes(storage.read_bytes(log_path))
        return "tickwheel", log.end, log.take_rule()
    spark_log = join(top, "spark", "sources", "0")
    paths = spark_source_logged_paths(storage, spark_log) if storage.exists(spark_log) else None
    if paths is None:
        return None, None, None
    seen = {_normal(p) for p in paths}

    def takes_unseen(path: str, _mtime_ns: int) -> bool:
        return path not in seen

    return "spark", len(paths), takes_unseen


def listable(input: str) -> bool:
    """A URI, or an absolute path: a relative one (as a job may record it) names a
    directory relative to where that job ran, which is not known here."""
    return is_uri(input) or os.path.isabs(input)


def _input_files(input: str, spark: SparkSession | None) -> Iterable[tuple[str, int, int]]:
    """``(path, size, mtime ns)`` of the input's data files, as the sources list them:
    names starting with ``.`` or ``_`` are not data."""
    if not is_uri(input):
        if not os.path.isdir(input):
            raise FileNotFoundError(input)
        found = []
        with os.scandir(input) as entries:  # the ordered source: the directory's files
            for entry in entries:
                if entry.name.startswith((".", "_")) or not entry.is_file():
                    continue
                info = entry.stat()
                found.append((os.path.abspath(entry.path), info.st_size, info.st_mtime_ns))
        return found
    storage = storage_for(input, _classic(spark, input))
    if not storage.exists(input):
        raise FileNotFoundError(input)
    base = input.rstrip("/")
    return [
        (path, size, mtime_ms * 1_000_000)
        for path, size, mtime_ms in storage.list_files(input)
        if not any(p.startswith((".", "_")) for p in _normal(path)[len(_normal(base)) :].split("/"))
    ]


def _normal(path: str) -> str:
    """``path`` comparable across spellings: ``file:///x``, ``file:/x`` and ``/x`` alike."""
    if path.startswith("file:"):
        return os.path.normpath(local_path(path))
    if not is_uri(path):
        return os.path.normpath(os.path.abspath(path))
    return path.rstrip("/")


# -- the owner --------------------------------------------------------------------


def _owner(storage: Storage, root: str, now: int) -> dict[str, Any] | None:
    """The newest owner and whether it still holds the checkpoint (never waits)."""
    owners = join(root, "owners")
    names = storage.list_names(owners)
    tokens = sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
    if not tokens:
        return None
    token = tokens[-1]
    info: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        info = read_json(storage, join(owners, f"{token}.json"))
    owner: dict[str, Any] = {
        "token": token,
        "host": info.get("host"),
        "pid": info.get("pid"),
        "since": info.get("since"),
    }
    with contextlib.suppress(OSError, ValueError):
        jvm = read_json(storage, join(owners, f"{token}.jvm.json")).get("jvm_pid")
        owner["jvm_pid"] = jvm
    holding, how = owner_holding(root, storage, token, info, now_ms=now)
    owner.update(holding=holding, how=how)
    return owner
