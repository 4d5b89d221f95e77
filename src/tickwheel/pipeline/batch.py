"""The batch driver: files → a records frame → the one step, with no state → output files.

``tickwheel pipeline run`` is :func:`run_job`: it reads its input files into a
records frame (:func:`.spark.files.read_files`), runs the delayed-operations
step on it (:class:`.spark.step.DelayedOperations`, no carried state: pending
operations are written ``pending`` and events above the watermark
``buffered``), and writes ``outcomes/``, ``unmatched/``, ``rejected/``,
``buffered/`` and ``summary.json``:

1. **read, validate, deduplicate** (one Spark job, persisted): one aggregate
   over the classified records gives the counts and the watermark W before
   any operation runs;
2. **the purgatory** (one Spark job, persisted): the kept events by (rule,
   key), each partition through one purgatory, up to W. It is the job's
   first with Python on the workers, and the workers' check rides on it
   (:func:`.spark.workers.checked_by_the_job`: one small job over its rows);
3. **write** the four tables concurrently (their fixed costs overlap), and
   the summary.

A Spark user calls the same step on their own DataFrame:
:func:`tickwheel.pipeline.delayed_operations`. Nothing here is specific to a
local master: the job runs unchanged on a cluster, as the separate-JVM test
shows.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .rules import Rules
from .spark.files import read_files
from .spark.outputs import (
    BUFFERED_COLUMNS,
    OUTCOME_COLUMNS,
    REJECTED_COLUMNS,
    UNMATCHED_COLUMNS,
)
from .spark.records import DEFAULT_MAX_FUTURE_MS
from .spark.session import (
    JOB_SQL_SETTINGS,
    default_parallelism,
    is_classic,
    job_session,
    partitions_for,
)
from .spark.step import DelayedOperations, StepOptions
from .spark.workers import JobCheck, checked_by_the_job
from .storage import LocalStorage, Storage, absolute, is_uri, join, storage_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BUFFERED_COLUMNS",
    "OUTCOME_COLUMNS",
    "REJECTED_COLUMNS",
    "UNMATCHED_COLUMNS",
    "resolve_inputs",
    "run_job",
    "text_columns",
]

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
OUTPUT_FORMATS = ("parquet", "csv", "json")
INPUT_FORMATS = ("json", "csv", "parquet", "maxwell")


def resolve_inputs(path: str, fmt: str, storage: Storage | None = None) -> InputFiles:
    """The input files and their bytes: a directory (its data files), a glob, or one file.

    A URI goes through ``storage`` (:func:`~.storage.storage_for`; default: a
    local path). Raises FileNotFoundError naming ``path`` when nothing
    matches. O(files under ``path``).
    """
    json_lines = (".json", ".jsonl", ".ndjson")
    suffixes = {
        "json": json_lines,
        "maxwell": json_lines,
        "csv": (".csv",),
        "parquet": (".parquet",),
    }
    storage = storage if storage is not None else LocalStorage()
    found: list[tuple[str, int]] = []
    if any(c in path for c in "*?["):
        found = storage.glob(path)
    elif storage.exists(path):
        base = path.rstrip("/")
        for file, size, _ in storage.list_files(path):
            below = _relative(file, base)
            if below == ".":  # path is the file itself
                found = [(file, size)]
                break
            hidden = any(part.startswith((".", "_")) for part in below.split("/"))
            if not hidden and file.endswith(suffixes[fmt]):  # not Spark's markers either
                found.append((file, size))
    if not found:
        raise FileNotFoundError(f"no {fmt} input files at {path!r}")
    found.sort()
    return InputFiles([p for p, _ in found], sum(size for _, size in found))


def _relative(path: str, base: str) -> str:
    """``path`` below the directory ``base``, by their path parts (a file system may
    spell a URI's scheme and authority more fully than it was given)."""
    if not is_uri(base):
        return os.path.relpath(path, base)
    from urllib.parse import urlsplit

    return posixpath.relpath(urlsplit(path).path, urlsplit(base).path or "/")


@dataclass(frozen=True)
class InputFiles:
    """The files a batch run reads, and their total bytes (which size the run)."""

    paths: list[str]
    bytes: int

    def __len__(self) -> int:
        return len(self.paths)


def _iso_ms(ms: int | None) -> str:
    """Epoch milliseconds as ISO-8601 UTC, for messages. O(1)."""

    if ms is None:
        return "never"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _watch_stages(
    spark: SparkSession, say: Progress, started: float, stop: threading.Event, every_s: float = 5.0
) -> None:
    """Report the running Spark stages' task progress every ``every_s`` seconds until ``stop``."""
    tracker = spark.sparkContext.statusTracker()
    last = ""
    while not stop.wait(every_s):
        try:
            infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
        except Exception:  # the context is stopping
            return
        parts = [
            f"stage {info.stageId}: {info.numCompletedTasks}/{info.numTasks} tasks"
            for info in sorted((i for i in infos if i is not None), key=lambda i: i.stageId)
        ]
        line = ", ".join(parts)
        if line and line != last:
            say(f"[{time.perf_counter() - started:7.1f}s]   running {line}")
            last = line


@dataclass
class _Phases:
    """The job's progress lines and the seconds of each phase."""

    say: Progress
    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=dict)
    _last: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def line(self, message: str) -> None:
        self.say(f"[{self.elapsed():7.1f}s] {message}")

    def end(self, name: str, message: str) -> None:
        now = self.elapsed()
        self.seconds[name] = round(now - self._last, 3)
        self._last = now
        self.line(message)


@contextlib.contextmanager
def _stage_progress(spark: SparkSession, phases: _Phases, on: bool) -> Iterator[None]:
    """While the body runs, report the Spark stages' progress (when ``on``).

    Only a classic session has a status tracker; on Spark Connect the phases'
    own lines are the progress.
    """
    on = on and is_classic(spark)
    stop = threading.Event()
    watcher = threading.Thread(
        target=_watch_stages,
        args=(spark, phases.say, phases.started, stop),
        name="tickwheel-progress",
        daemon=True,
    )
    if on:
        watcher.start()
    try:
        yield
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(timeout=10)


def _described(spark: SparkSession, text: str, action: Callable[[], Any]) -> Any:
    """Run ``action`` with ``text`` as its Spark jobs' description (as the UI shows it).

    The description is a property of the calling thread, so concurrent
    actions, each in its own thread, keep their own. A Spark Connect client
    cannot set it (it has no ``SparkContext``): there the action just runs.
    """
    if not is_classic(spark):
        return action()
    spark.sparkContext.setJobDescription(f"tickwheel batch: {text}")
    try:
        return action()
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]


def _write(frame: DataFrame, path: str, fmt: str) -> None:
    """Write one output; CSV cannot hold binary, so its binary columns become base64."""
    writer = frame.write.mode("overwrite")
    if fmt == "parquet":
        writer.parquet(path)
    elif fmt == "csv":
        writer = text_columns(frame).write.mode("overwrite")
        writer.option("header", True).csv(path)
    elif fmt == "json":
        writer.json(path)
    else:
        raise ValueError(f"output format must be parquet, csv or json, got {fmt!r}")


def text_columns(frame: DataFrame) -> DataFrame:
    """``frame`` with each binary column as base64 text (Spark's JSON writer's encoding). O(1)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    return frame.select(
        *[
            F.base64(F.col(f.name)).alias(f.name)
            if isinstance(f.dataType, T.BinaryType)
            else F.col(f.name)
            for f in frame.schema.fields
        ]
    )


def _write_outputs(
    spark: SparkSession, tables: Mapping[str, DataFrame], out: str, output_format: str
) -> None:
    """Write the four outputs concurrently.

    Each reads persisted rows only: submitted together, their fixed costs
    (planning, code generation, the committer) overlap.
    """
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    with ThreadPoolExecutor(max_workers=len(tables)) as pool:
        writes = [
            pool.submit(
                _described, spark, f"write {name}/",
                partial(_write, frame, join(out, name), output_format),
            )
            for name, frame in tables.items()
        ]  # fmt: skip
        for future in writes:
            future.result()


def _input_format(fmt: str) -> str:
    fmt = "json" if fmt == "jsonl" else fmt
    if fmt not in INPUT_FORMATS:
        raise ValueError(f"input format must be one of {', '.join(INPUT_FORMATS)}, got {fmt!r}")
    return fmt


def _check_output_format(output_format: str) -> None:
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output format must be parquet, csv or json, got {output_format!r}")


def _records(
    spark: SparkSession, files: list[str], input_format: str, storage: Storage
) -> tuple[DataFrame, list[tuple[str, str]]]:
    """The input files as a records frame (an empty one when none gave any), and the
    files refused before reading."""
    from .spark.frames import empty_frame

    records, refused = read_files(spark, files, input_format, storage)
    if records is None:
        records = empty_frame(spark, "value string")
    return records, refused


def run_job(
    spark: SparkSession,
    rules: Rules,
    input_path: str,
    output_dir: str,
    partitions: int | None = None,
    output_format: str = "parquet",
    progress: Progress | None = None,
    max_future_ms: int | None = DEFAULT_MAX_FUTURE_MS,
    now_ms: int | None = None,
    input_format: str | None = None,
) -> dict[str, Any]:
    """Run the batch pipeline; write the outputs and ``summary.json``; return the summary.

    ``partitions`` is the number of key-hash partitions (default: one per 64 MiB
    of input, at least Spark's default parallelism:
    :func:`.spark.session.partitions_for`). ``progress`` receives one line per
    phase with counts and the elapsed time (default: this module's logger, at
    INFO, without the Spark stages' lines). ``max_future_ms`` is the
    far-future guard: a record stamped later than ``now_ms`` (default: the
    clock at the start) plus it is rejected as ``far_future`` instead of
    moving the watermark; None turns it off.
    ``input_format`` (``json``, ``csv``, ``parquet`` or ``maxwell``) overrides
    the rules' ``[input].format``.

    Cost: one Spark job reads, parses and deduplicates (one shuffle by event
    id), keeping the classified records in memory; a second repartitions the
    kept events by key (a second shuffle) and runs the purgatory, keeping its
    rows, and checks in one small job over them that the workers run this
    tickwheel (:class:`~.spark.workers.WorkersError` otherwise, before
    anything is written); the outputs and the summary are then small jobs
    over those, run concurrently.
    """
    _check_output_format(output_format)
    phases = _Phases(progress if progress is not None else logger.info)
    out = absolute(output_dir)
    out_storage = storage_for(out, spark)
    if not is_uri(out):
        os.makedirs(out, exist_ok=True)
    fmt = _input_format(input_format or rules.input.format)
    in_storage = storage_for(input_path, spark)
    inputs = resolve_inputs(input_path, fmt, in_storage)
    files = inputs.paths
    if partitions is None:
        partitions = partitions_for(inputs.bytes, default_parallelism(spark))
    count = partitions
    spark = job_session(
        spark, {**JOB_SQL_SETTINGS, "spark.sql.shuffle.partitions": str(max(count, 2))}
    )
    phases.line(f"reading {len(files)} {fmt} file(s) from {input_path}")
    records, refused = _records(spark, files, fmt, in_storage)
    options = StepOptions(
        partitions=partitions,
        max_future_ms=max_future_ms,
        now_ms=now_ms,
        input_format="columns" if fmt in ("csv", "parquet") else fmt,
        refused=refused,
    )
    with (
        _stage_progress(spark, phases, on=progress is not None),
        checked_by_the_job(spark) as workers,
        DelayedOperations(records, rules, options) as step,
    ):
        _run_phases(spark, step, phases, out, output_format, workers)
        summary = {
            "input": input_path,
            "input_files": len(files),
            "output": out,
            "format": output_format,
            "rules": [
                {"name": r.name, "key": r.key, "timeout_ms": r.timeout_ms} for r in rules.rules
            ],
            **step.summary(),
        }
    _say_far_future(phases, summary)
    job_s = phases.elapsed()
    total = summary["counts"]["records"]
    summary["seconds"] = round(job_s, 3)
    summary["phases_seconds"] = phases.seconds
    summary["events_per_s"] = round(total / job_s, 1) if job_s else None
    _write_summary(out_storage, out, summary)
    phases.line(f"done: {total:,} records, {summary['events_per_s']:,} records/s")
    return summary


def _write_summary(storage: Storage, out: str, summary: Mapping[str, Any]) -> None:
    """``OUT/summary.json``, replacing the one of the run before (as the tables are)."""
    path = join(out, "summary.json")
    storage.delete(path)
    storage.create(path, (json.dumps(summary, indent=2) + "\n").encode())


def _run_phases(
    spark: SparkSession,
    step: DelayedOperations,
    phases: _Phases,
    out: str,
    output_format: str,
    workers: JobCheck,
) -> None:
    """The job's three phases, each with its progress line.

    The workers' check rides on the purgatory, the first job that runs Python
    on them (:func:`.spark.workers.checked_by_the_job`), and fails the run
    before anything is written.
    """
    records = _described(spark, "read, validate, deduplicate", step.counts)
    phases.end(
        "read_dedup",
        f"parsed and deduplicated ({records.duplicates:,} duplicates, "
        f"{records.ignored:,} ignored, {records.rejected_total:,} rejected); "
        f"watermark {step.watermark}",
    )
    loop = _described(
        spark,
        "purgatory",
        lambda: workers.after_first_python_job(
            step.stats, step.rows, lambda stats: stats.partitions > 0
        ),
    )
    phases.end(
        "purgatory",
        f"ran {loop.partitions} partition(s) through the purgatory: "
        f"{loop.events:,} rule events, loop {loop.rate():,.0f} events/s per core",
    )
    tables = {
        "outcomes": step.outcomes,
        "unmatched": step.unmatched,
        "rejected": step.rejected,
        "buffered": step.buffered,
    }
    _write_outputs(spark, tables, out, output_format)
    conflicts = records.rejected.get("conflict", 0)
    phases.end(
        "write",
        f"wrote rejected/ ({records.rejected_total:,} records, {conflicts:,} conflicts), "
        "outcomes/ ("
        + ", ".join(f"{k} {v:,}" for k, v in loop.outcomes.items())
        + f"), unmatched/ ({sum(loop.unmatched.values()):,}) and buffered/ ({loop.buffered:,})",
    )


def _say_far_future(phases: _Phases, summary: Mapping[str, Any]) -> None:
    far_future = summary["counts"]["rejected_by_reason"].get("far_future", 0)
    if far_future:
        phases.line(
            f"rejected {far_future:,} far_future record(s): event time after "
            f"{_iso_ms(summary['far_future_after_ms'])} (--max-future; 'off' to accept)"
        )
