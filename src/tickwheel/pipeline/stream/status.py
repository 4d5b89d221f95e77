"""What a stream checkpoint holds: its last commit, what is pending, who holds it.

:func:`checkpoint_status` reads a checkpoint (``CK/tickwheel/``, laid out as
:mod:`.checkpoint` describes, and Spark's ``CK/spark/`` beside it) and returns
plain, JSON-able figures: the last committed batch and when it committed, the
watermark and how far it lags processing time, the rules in force, the
pending operations per rule with the oldest deadline, the carried events, the
state's size, the files taken and those still waiting, and the owner.
``tickwheel pipeline status`` prints them (:func:`render_status`).

It only reads. A local checkpoint is read with :mod:`os` and pyarrow (no JVM,
no Spark); a URI one through a classic session's Hadoop file systems
(:func:`~..storage.storage_for`), its Parquet through Spark. Whether the owner
still holds the checkpoint is decided as :class:`~.checkpoint.CheckpointOwner`
decides it, without waiting: on a local path by trying the ``flock`` of
``LOCK`` on a fresh descriptor, released at once; on a URI by ``T.released``,
the owner's process on this host, or the age of its last heartbeat.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
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
from .checkpoint import HEARTBEAT_ENV, MISSED_BEATS, StateStore, StreamError, pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["checkpoint_status", "render_status"]


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
    return top, join(top, "tickwheel")


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
    committed = store.committed()
    last = committed[-1] if committed else None
    meta: dict[str, Any] = {}
    if last is not None:
        try:
            meta = store.meta(last)
        except ValueError as exc:
            raise StreamError(
                f"checkpoint {top}: the commit of batch {last} cannot be read: {exc}"
            ) from None
    committed_at = _int_or_none(meta.get("committed_at_ms"))
    watermark = _int_or_none(meta.get("watermark"))
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
        "max_time": _int_or_none(meta.get("max_time")),
        "rules": meta.get("rules"),
        "format": meta.get("format"),
        "tickwheel": meta.get("tickwheel"),
        "last_batch_counts": meta.get("counts"),
        "warnings": meta.get("warnings") or [],
    }
    if last is None:
        status.update(pending=None, markers=None, events=None, state=None)
    else:
        state = store.path(last)
        figures = (
            _spark_state(spark, state, watermark)
            if is_uri(root) and spark is not None
            else _local_state(state, watermark)
        )
        pending, markers, events, buffered = figures
        for name in _rule_names(meta.get("rules")):
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
                "rows": _int_or_none(meta.get("state_rows")),
                "bytes": sum(size for _path, size, _mtime in listed),
                "files": len(listed),
            },
        )
    given = None if input is None else absolute(input)
    status["files"] = _files(storage, spark, top, root, given or meta.get("input"))
    status["owner"] = _owner(storage, root, now)
    return status


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rule_names(rules: Any) -> list[str]:
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


def _parquet_files(directory: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [
        os.path.join(directory, n)
        for n in names
        if n.endswith(".parquet") and not n.startswith((".", "_"))
    ]


def _local_state(state: str, watermark: int | None) -> tuple[Pending, int, int, int]:
    """(pending by rule, expiry markers, events, buffered events) read with pyarrow."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    pending: Pending = {}
    markers = 0
    for path in _parquet_files(os.path.join(state, "ops")):
        for batch in pq.ParquetFile(path).iter_batches(columns=["kind", "rule", "deadline"]):
            table = pa.Table.from_batches([batch])
            is_pending = pc.equal(table["kind"], "pending")
            waiting = table.filter(is_pending)
            markers += table.num_rows - waiting.num_rows
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
    for path in _parquet_files(os.path.join(state, "events")):
        for batch in pq.ParquetFile(path).iter_batches(columns=["time"]):
            events += batch.num_rows
            if watermark is not None:
                buffered += int(pc.sum(pc.greater(batch.column(0), watermark)).as_py() or 0)
    return pending, markers, events, buffered


def _add_pending(pending: Pending, rule: str, count: int, oldest: int | None) -> None:
    entry = pending.setdefault(rule, {"count": 0, "oldest_deadline": None})
    entry["count"] += int(count)
    if oldest is not None and (
        entry["oldest_deadline"] is None or oldest < entry["oldest_deadline"]
    ):
        entry["oldest_deadline"] = int(oldest)


def _spark_state(
    spark: SparkSession, state: str, watermark: int | None
) -> tuple[Pending, int, int, int]:
    """The same figures as :func:`_local_state`, read by Spark (two jobs)."""
    from pyspark.sql import functions as F

    storage = storage_for(state, spark)
    pending: Pending = {}
    markers = 0
    ops = join(state, "ops")
    if storage.exists(ops):
        frame = spark.read.schema("kind string, rule string, deadline bigint").parquet(ops)
        grouped = frame.groupBy("kind", "rule").agg(
            F.count(F.lit(1)).alias("n"), F.min("deadline").alias("oldest")
        )
        for row in grouped.collect():
            if row["kind"] == "pending":
                _add_pending(pending, row["rule"], row["n"], row["oldest"])
            else:
                markers += int(row["n"])
    events = buffered = 0
    path = join(state, "events")
    if storage.exists(path):
        above = F.col("time") > F.lit(watermark) if watermark is not None else F.lit(False)
        row = (
            spark.read.schema("time bigint")
            .parquet(path)
            .agg(F.count(F.lit(1)).alias("n"), F.sum(F.when(above, 1).otherwise(0)).alias("b"))
            .collect()[0]
        )
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
    if takes is None or not isinstance(input, str) or not _listable(input):
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
    log_path = join(root, "files.log")
    if storage.exists(log_path):
        from .file_source import FileLog

        log = FileLog.from_bytes(storage.read_bytes(log_path))
        return "tickwheel", log.end, log.take_rule()
    spark_log = join(top, "spark", "sources", "0")
    paths = _spark_source_paths(storage, spark_log) if storage.exists(spark_log) else None
    if paths is None:
        return None, None, None
    seen = {_normal(p) for p in paths}

    def takes_unseen(path: str, _mtime_ns: int) -> bool:
        return path not in seen

    return "spark", len(paths), takes_unseen


def _listable(input: str) -> bool:
    """A URI, or an absolute path: a relative one (as a job may record it) names a
    directory relative to where that job ran, which is not known here."""
    return is_uri(input) or os.path.isabs(input)


def _spark_source_paths(storage: Storage, directory: str) -> list[str] | None:
    """The files Spark's file source logged (``sources/0``: batch files, and every
    tenth batch's ``N.compact`` holding every entry up to it). None when the log
    is not a file source's (Kafka's offsets, say)."""
    batches: dict[int, str] = {}
    for name in storage.list_names(directory):
        stem = name[: -len(".compact")] if name.endswith(".compact") else name
        if stem.isdigit() and not name.startswith("."):
            batches[int(stem)] = name
    compacts = [b for b, n in batches.items() if n.endswith(".compact")]
    start = max(compacts, default=min(batches, default=0))
    paths: list[str] = []
    for batch in sorted(b for b in batches if b >= start):
        lines = storage.read_bytes(join(directory, batches[batch])).decode("utf-8").splitlines()
        if not lines or not lines[0].startswith("v"):
            return None
        for line in lines[1:]:
            if not line.strip():
                continue
            entry = json.loads(line)
            if not isinstance(entry, dict) or "path" not in entry:
                return None
            paths.append(str(entry["path"]))
    return paths


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
    holding, how = (
        _local_holder(root) if not is_uri(root) else _uri_holder(storage, owners, token, info, now)
    )
    owner.update(holding=holding, how=how)
    return owner


def _local_holder(root: str) -> tuple[bool, str]:
    """Whether a process holds ``LOCK``'s flock: tried on a fresh descriptor, released
    at once (a job starting in that instant would find the checkpoint in use)."""
    try:
        fd = os.open(os.path.join(root, "LOCK"), os.O_RDONLY)
    except FileNotFoundError:
        return False, "no LOCK file"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True, "a process holds the flock on LOCK"
    finally:
        os.close(fd)  # closing releases a lock we took
    return False, "LOCK is free"


def _uri_holder(
    storage: Storage, owners: str, token: int, info: Mapping[str, Any], now: int
) -> tuple[bool, str]:
    """As :meth:`~.checkpoint.CheckpointOwner.acquire` decides, without waiting for a beat."""
    names = storage.list_names(owners)
    if f"{token}.released" in names:
        return False, "released"
    pid = info.get("pid")
    if info.get("host") == socket.gethostname() and isinstance(pid, int):
        alive = pid_alive(pid)
        return alive, f"process {pid} on this host is {'running' if alive else 'gone'}"
    beat_s = float(os.environ.get(HEARTBEAT_ENV) or 10)
    signs = [
        mtime
        for path, _size, mtime in storage.list_files(owners)
        if path.rsplit("/", 1)[-1].startswith((f"{token}.alive", f"{token}.json"))
    ]
    if not signs:
        return False, "no heartbeat"
    age = now - max(signs)
    alive = age < MISSED_BEATS * beat_s * 1000
    return alive, f"last heartbeat {_duration(age)} ago (every {beat_s:g}s)"


# -- the report -------------------------------------------------------------------


def _duration(ms: int) -> str:
    """``ms`` for a reader: ``850ms``, ``12.0s``, ``3.5h``, ``2.0d``."""
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{sign}{ms / size:,.1f}{unit}"
    return f"{sign}{ms}ms"


def _when(ms: int | None) -> str:
    if ms is None:
        return "unknown"
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _size(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def render_status(status: Mapping[str, Any]) -> str:
    """:func:`checkpoint_status`'s figures as a report for a reader. O(rules + lines)."""
    out = [f"checkpoint {status['checkpoint']}"]

    def line(label: str, text: str) -> None:
        out.append(f"  {label:<16}{text}")

    last = status["last_batch"]
    if last is None:
        line("last batch", "none committed yet")
    else:
        at = status["committed_at_ms"]
        when = (
            "commit time not recorded"
            if at is None
            else f"committed {_when(at)} ({_duration(status['commit_age_ms'])} ago)"
        )
        line("last batch", f"{last}, {when}")
    if status.get("running_batch") is not None:
        line("running batch", f"{status['running_batch']} (planned by Spark, not committed)")
    wm = status["watermark"]
    if wm is None:
        line("watermark", "none yet")
    else:
        line("watermark", f"{_when(wm)} ({_duration(status['watermark_lag_ms'])} behind now)")
    if status.get("last_batch") is not None:  # a commit records them
        line("rules", _rules_text(status.get("rules")))
    if status.get("format") is not None or status.get("tickwheel") is not None:
        made = [f"state format {status['format']}"] if status.get("format") is not None else []
        if status.get("tickwheel") is not None:
            made.append(f"written by tickwheel {status['tickwheel']}")
        line("written", ", ".join(made))
    pending = status.get("pending")
    if pending is not None:
        line("pending", f"{pending['total']:,} operation(s)")
        for rule, figures in pending["by_rule"].items():
            oldest = figures["oldest_deadline"]
            first = "" if oldest is None else f", oldest deadline {_when(oldest)}"
            if oldest is not None and wm is not None:
                first += f" ({_duration(oldest - wm)} after the watermark)"
            line(f"  {rule}", f"{figures['count']:,}{first}")
        line("expiry markers", f"{status['markers']:,}")
        events = status["events"]
        line("events carried", f"{events['rows']:,} ({events['buffered']:,} buffered above "
             "the watermark)")  # fmt: skip
        state = status["state"]
        rows = "unknown" if state["rows"] is None else f"{state['rows']:,}"
        line("state", f"{rows} rows, {_size(state['bytes'])} in {state['files']} file(s)")
    files = status["files"]
    source = {"tickwheel": "tickwheel's file log", "spark": "Spark's file source log"}
    taken = (
        "unknown (no file log in the checkpoint)"
        if files["taken"] is None
        else f"{files['taken']:,} taken ({source.get(files['source'], files['source'])})"
    )
    line("files", taken)
    if files["waiting"] is not None:
        size = _size(files["waiting_bytes"])
        waiting = f"{files['waiting']:,} file(s) ({size}) in {files['input']}"
    elif files["input"] is None:
        waiting = "unknown (no input recorded: give --input)"
    elif not _listable(files["input"]):
        waiting = f"unknown (the input recorded, {files['input']}, is relative: give --input)"
    else:
        waiting = f"unknown ({files['input']} not listed)"
    line("waiting", waiting)
    for path in files.get("next_waiting") or []:
        line("  next", path)
    owner = status.get("owner")
    if owner is None:
        line("owner", "none recorded")
    else:
        who = (
            f"pid {owner['pid']} on {owner['host']} since {owner['since']} (token {owner['token']})"
        )
        state_text = "HOLDS the checkpoint" if owner["holding"] else "not holding it"
        line("owner", f"{who}: {state_text} ({owner['how']})")
    for warning in status.get("warnings") or []:
        line("warning", f"batch {last}: {warning}")
    return "\n".join(out) + "\n"


def _rules_text(rules: Any) -> str:
    """The recorded rules in one line: each rule's types and timeout, else its name."""
    if rules is None:
        return "not recorded (a checkpoint of an older release)"
    inner = rules.get("rules") if isinstance(rules, Mapping) else None
    if isinstance(inner, list) and all(isinstance(r, Mapping) for r in inner):
        text = "; ".join(_rule_text(r) for r in inner)
        lateness = rules.get("input", {}).get("allowed_lateness_ms")
        if isinstance(lateness, int):
            text += f"; allowed lateness {_duration(lateness)}"
        return text
    names = _rule_names(rules)
    return ", ".join(names) if names else json.dumps(rules, sort_keys=True)


def _rule_text(rule: Mapping[str, Any]) -> str:
    parts = [
        f"{kind} {'|'.join(map(str, rule[kind]))}"
        for kind in ("open", "complete", "cancel")
        if rule.get(kind)
    ]
    timeout = rule.get("timeout_ms")
    if isinstance(timeout, int):
        parts.append(f"timeout {_duration(timeout)}")
    if rule.get("key"):
        parts.append(f"key {rule['key']}")
    return f"{rule.get('name')} ({', '.join(parts)})"
