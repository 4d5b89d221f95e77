"""What one small micro-batch of the stream asks of Spark and of storage: counts, not times.

The stream (``tickwheel pipeline stream``, available-now, one file per
micro-batch) runs over ``--files`` files of about ``--records`` records each, in
one process on a classic ``local[2]`` session. For each micro-batch it counts:

* **Spark jobs**: the jobs the application started during the micro-batch,
  Spark's own and the step's (the scheduler's job counter before and after);
* **storage calls**: calls the checkpoint's and the Parquet sink's storage
  answered (``exists``, ``list_names``, ``read_bytes``, ``create``,
  ``delete``, ``rename``...), each a round trip on an object store;
* **files written**: the files that appeared under the output and the
  checkpoint (Spark's writers' files included).

It prints the median over the warm micro-batches (the first left out) and the
same counts for Spark's floor of a micro-batch, a ``foreachBatch`` that writes
each micro-batch as one Parquet file: with Spark's writer, and with the rows
collected to the driver as Arrow and written with pyarrow. Counts do not depend on the machine's
load, so a count from the code before a change, run from its tree with
``PYTHONPATH``, compares exactly.

With ``--uri`` the output and the checkpoint are ``file://`` URIs: each storage
call then goes through Hadoop's ``FileSystem`` in the JVM, as on HDFS or an
object store.

Run::

    .venv/bin/python benchmarks/bench_micro_batch_calls.py [--uri]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _pipeline_names import FileStreamJob, StreamConfig, create_session, generate_orders
from _stream_inputs import feed, lateness_rules
from _stream_peers import SOURCE_SCHEMA

from tickwheel.pipeline.stream.runner import MicroBatches

#: The storage methods counted: each is one request (or more) to an object store.
STORAGE_CALLS = (
    "exists", "list_names", "read_bytes", "create", "delete", "rename", "size", "list_files",
    "glob", "parquet_rows",
)  # fmt: skip


def _job_counter(spark: Any) -> Any:
    """The number of jobs the application has started (the DAG scheduler's next id)."""
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()
    return lambda: int(scheduler.nextJobId())  # py4j gives the AtomicInteger as an int


def _job_name(spark: Any, job_id: int) -> str:
    """A job's call site, as Spark's UI names it (its last stage's name)."""
    tracker = spark.sparkContext.statusTracker()
    info = tracker.getJobInfo(job_id)
    if info is None or not info.stageIds:
        return "?"
    stages = [tracker.getStageInfo(i) for i in sorted(info.stageIds)]
    return " / ".join(f"{st.name} ({st.numTasks} tasks)" for st in stages if st is not None)


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _count_storage(storage: Any, calls: Counter[str]) -> None:
    """Count the calls ``storage`` answers, by method name, into ``calls``."""
    for name in STORAGE_CALLS:
        method = getattr(storage, name, None)
        if method is None:
            continue

        def counted(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(storage, name, counted)


def _stream_counts(
    spark: Any, rules: Path, inp: Path, work: Path, scheme: str = ""
) -> list[dict[str, Any]]:
    config = StreamConfig(
        rules_path=str(rules), input=str(inp), output=f"{scheme}{work / 'out'}",
        checkpoint=f"{scheme}{work / 'ck'}", trigger="available-now", max_files_per_trigger=1,
        partitions=2,
    )  # fmt: skip
    jobs = _job_counter(spark)
    per_batch: list[dict[str, Any]] = []
    with FileStreamJob(config, spark=spark) as job:
        calls: Counter[str] = Counter()
        runner_call = MicroBatches.__call__

        def counting(self: MicroBatches, frame: Any, batch_id: int) -> Any:
            # The checkpoint's and the sink's storage, counted from the first micro-batch
            # (a URI checkpoint opens when the job runs).
            for storage in (job.store.storage, getattr(job.sink, "storage", None)):
                if storage is not None and not getattr(storage, "_counted", False):
                    _count_storage(storage, calls)
                    storage._counted = True
            calls.clear()
            files, first_job, started = _files(work), jobs(), time.perf_counter()
            out = runner_call(self, frame, batch_id)
            names = [_job_name(spark, j) for j in range(first_job, jobs())]
            per_batch.append({
                "jobs": jobs() - first_job,
                "job_names": names,
                "storage": sum(calls.values()),
                "by_call": dict(calls),
                "files": len(_files(work) - files),
                "ms": 1000 * (time.perf_counter() - started),
            })  # fmt: skip
            return out

        MicroBatches.__call__ = counting  # type: ignore[method-assign]
        try:
            job.run()
        finally:
            MicroBatches.__call__ = runner_call  # type: ignore[method-assign]
    return per_batch


def _floor_counts(spark: Any, inp: Path, work: Path, writer: str) -> list[dict[str, Any]]:
    """The floor's micro-batches, their file written by ``writer``: Spark's, or pyarrow's
    from the rows collected to the driver as Arrow."""
    jobs = _job_counter(spark)
    per_batch: list[dict[str, Any]] = []

    def write(frame: Any, directory: Path) -> None:
        if writer == "spark":
            frame.coalesce(1).write.mode("error").parquet(str(directory))
        else:
            import pyarrow.parquet as pq

            directory.mkdir(parents=True)
            pq.write_table(frame.toArrow(), str(directory / "part-0.parquet"))

    def batch(frame: Any, batch_id: int) -> None:
        files, first_job, started = _files(work), jobs(), time.perf_counter()
        write(frame, work / "out" / f"batch={batch_id}")
        per_batch.append({
            "jobs": jobs() - first_job, "storage": 0, "by_call": {},
            "files": len(_files(work) - files), "ms": 1000 * (time.perf_counter() - started),
        })  # fmt: skip

    query = (
        spark.readStream.schema(SOURCE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(inp))
        .writeStream.foreachBatch(batch).trigger(availableNow=True)
        .option("checkpointLocation", str(work / "ck")).start()
    )  # fmt: skip
    query.awaitTermination(600)
    return per_batch


def _median(batches: list[dict[str, Any]], key: str) -> float:
    return statistics.median(b[key] for b in batches[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10, help="files = micro-batches")
    parser.add_argument("--records", type=int, default=1000, help="records per file, about")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--jobs", action="store_true", help="name the last batch's jobs")
    parser.add_argument(
        "--uri", action="store_true",
        help="the output and checkpoint at file:// URIs: their storage through Hadoop's "
        "FileSystem in the JVM, as on HDFS or an object store",
    )  # fmt: skip
    args = parser.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-calls-"))
    orders = max(1, round(args.records * args.files / 1.83))  # 1.83 records per order
    generate_orders(orders, work / "gen", seed=7, files=args.files)
    feed(sorted((work / "gen").glob("part-*.jsonl")), work / "in")
    rules = lateness_rules(work / "rules.toml")
    spark = create_session("local[2]", shuffle_partitions=2)
    try:
        scheme = "file://" if args.uri else ""
        stream = _stream_counts(spark, rules, work / "in", work / "stream", scheme)
        floors = {
            writer: _floor_counts(spark, work / "in", work / f"floor-{writer}", writer)
            for writer in ("spark", "arrow")
        }
    finally:
        spark.stop()
    print(f"{args.files} micro-batches of about {args.records:,} records; medians of the "
          f"{len(stream) - 1} warm ones (the first left out)")  # fmt: skip
    print(f"{'':34}{'Spark jobs':>12}{'storage calls':>15}{'files written':>15}{'ms':>8}")
    floor_rows = [(f"foreachBatch floor, {writer} writer", f) for writer, f in floors.items()]
    for name, batches in [("stream", stream), *floor_rows]:
        print(
            f"{name:34}{_median(batches, 'jobs'):>12.0f}{_median(batches, 'storage'):>15.0f}"
            f"{_median(batches, 'files'):>15.0f}{_median(batches, 'ms'):>8.0f}"
        )
    calls: Counter[str] = Counter()
    for b in stream[1:]:
        calls.update(b["by_call"])
    warm = max(1, len(stream) - 1)
    print("stream's storage calls per micro-batch, by call: " + ", ".join(
        f"{name} {count / warm:.1f}" for name, count in calls.most_common()
    ))  # fmt: skip
    if args.jobs:
        print("the jobs of the last micro-batch: " + "; ".join(stream[-1]["job_names"]))
    cheaper = min(floors.values(), key=lambda batches: _median(batches, "ms"))
    ms = _median(stream, "ms") / _median(cheaper, "ms")
    jobs = _median(stream, "jobs") / max(1, _median(cheaper, "jobs"))
    print(f"ratio stream / the cheaper floor: ms {ms:.2f}x, jobs {jobs:.1f}x")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
