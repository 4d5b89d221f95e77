"""What one small micro-batch of the stream asks of Spark and of storage: counts, not times.

The stream (``tickwheel pipeline stream``, available-now, one file per
micro-batch) runs over ``--files`` files of about ``--records`` records each, in
one process on a classic ``local[2]`` session. For each micro-batch it counts:

* **Spark jobs**: the jobs the application started during the micro-batch,
  Spark's own and the step's (the scheduler's job counter before and after);
* **storage calls**: calls the checkpoint's and the Parquet sink's storage
  answered (``exists``, ``list_names``, ``read_bytes``, ``create``,
  ``delete``, ``rename``...), each a round trip on an object store, and the
  time spent in them;
* **files written**: the files that appeared under the output and the
  checkpoint (Spark's writers' files included);
* **job ms**: the time to the records' counts, the step's first action,
  whose one Spark job reads, classifies and collects them.

It prints the median over the warm micro-batches (the first left out) and the
same counts for Spark's floor of a micro-batch, a ``foreachBatch`` that writes
each micro-batch as one Parquet file: with Spark's writer, and with the rows
collected to the driver as Arrow and written with pyarrow. Counts do not depend on the machine's
load, so a count from the code before a change, run from its tree with
``PYTHONPATH``, compares exactly.

It also times the least the commit protocol's own writes cost at a local
path: as many durable creates (written, fsynced, linked, the directory
fsynced) as the stream makes in a micro-batch. ``--from-batch 1000`` with
``--files 1010`` or more reports a long stream's micro-batches, whose sink
logs have compacted many times.

With ``--uri`` the output and the checkpoint are ``file://`` URIs: each storage
call then goes through Hadoop's ``FileSystem`` in the JVM, as on HDFS or an
object store.

Run::

    .venv/bin/python benchmarks/bench_micro_batch_calls.py [--uri] [--files 1010 --from-batch 1000]
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

from tickwheel.pipeline.spark import placement
from tickwheel.pipeline.spark.step import DelayedOperations
from tickwheel.pipeline.storage import LocalStorage
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


def _count_storage(storage: Any, calls: Counter[str], seconds: Counter[str]) -> None:
    """Count the calls ``storage`` answers, by method name, into ``calls``, and the time
    spent in them into ``seconds``."""
    for name in STORAGE_CALLS:
        method = getattr(storage, name, None)
        if method is None:
            continue

        def counted(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                seconds[_name] += time.perf_counter() - started

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
        seconds: Counter[str] = Counter()
        runner_call = MicroBatches.__call__
        counts_call = DelayedOperations.counts
        job_seconds = [0.0]

        def timed_counts(self: DelayedOperations) -> Any:
            # The first call runs the records' one job (read, classify, collect).
            started = time.perf_counter()
            try:
                return counts_call(self)
            finally:
                job_seconds[0] += time.perf_counter() - started

        def counting(self: MicroBatches, frame: Any, batch_id: int) -> Any:
            # The checkpoint's and the sink's storage, counted from the first micro-batch
            # (a URI checkpoint opens when the job runs).
            for storage in (job.store.storage, getattr(job.sink, "storage", None)):
                if storage is not None and not getattr(storage, "_counted", False):
                    _count_storage(storage, calls, seconds)
                    storage._counted = True
            calls.clear()
            seconds.clear()
            job_seconds[0] = 0.0
            files, first_job, started = _files(work), jobs(), time.perf_counter()
            out = runner_call(self, frame, batch_id)
            names = [_job_name(spark, j) for j in range(first_job, jobs())]
            per_batch.append({
                "batch_id": batch_id,
                "jobs": jobs() - first_job,
                "job_names": names,
                "storage_ms": 1000 * sum(seconds.values()),
                "job_ms": 1000 * job_seconds[0],
                "storage": sum(calls.values()),
                "by_call": dict(calls),
                "files": len(_files(work) - files),
                "ms": 1000 * (time.perf_counter() - started),
            })  # fmt: skip
            return out

        MicroBatches.__call__ = counting  # type: ignore[method-assign]
        DelayedOperations.counts = timed_counts  # type: ignore[method-assign]
        try:
            job.run()
        finally:
            MicroBatches.__call__ = runner_call  # type: ignore[method-assign]
            DelayedOperations.counts = counts_call  # type: ignore[method-assign]
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
            "batch_id": batch_id, "jobs": jobs() - first_job, "storage": 0, "by_call": {},
            "storage_ms": 0.0, "job_ms": 0.0,
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
    return statistics.median(b[key] for b in batches)


def _durable_create_ms(directory: Path, count: int, rounds: int = 9) -> float:
    """The least the commit protocol's own creates cost at a local path: ``count`` durable
    creates of small files (``LocalStorage.create``: written, fsynced, linked, the
    directory fsynced), the median of ``rounds`` rounds, in ms."""
    storage = LocalStorage()
    payload = b"{}" * 100
    times = []
    for r in range(rounds):
        round_dir = directory / f"round-{r}"
        round_dir.mkdir(parents=True)
        started = time.perf_counter()
        for i in range(count):
            storage.create(str(round_dir / f"file-{i}"), payload)
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10, help="files = micro-batches")
    parser.add_argument("--records", type=int, default=1000, help="records per file, about")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--jobs", action="store_true", help="name the last batch's jobs")
    parser.add_argument(
        "--placement", choices=("auto", "executors"), default="auto",
        help="executors: run every micro-batch's Arrow half on the executors, as one larger "
        "than a partition's worth runs (auto: the stream's own choice)",
    )  # fmt: skip
    parser.add_argument(
        "--from-batch", type=int, default=1,
        help="report the micro-batches from this id on (the first is cold; Spark's sink "
        "logs compact every tenth, so ids past 1,000 show a long stream's logs)",
    )  # fmt: skip
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
    if args.placement == "executors":
        placement.DRIVER_ROWS = 0  # no micro-batch is small enough for the driver
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
    stream, floors = (
        _reported(stream, args.from_batch),
        {writer: _reported(batches, args.from_batch) for writer, batches in floors.items()},
    )
    print(
        f"{args.files} micro-batches of about {args.records:,} records, placement "
        f"{args.placement}; medians of the {len(stream)} from id {args.from_batch} on"
    )
    print(
        f"{'':34}{'Spark jobs':>12}{'storage calls':>15}{'their ms':>10}{'files written':>15}"
        f"{'job ms':>8}{'ms':>8}"
    )
    floor_rows = [(f"foreachBatch floor, {writer} writer", f) for writer, f in floors.items()]
    for name, batches in [("stream", stream), *floor_rows]:
        print(
            f"{name:34}{_median(batches, 'jobs'):>12.0f}{_median(batches, 'storage'):>15.0f}"
            f"{_median(batches, 'storage_ms'):>10.1f}{_median(batches, 'files'):>15.0f}"
            f"{_median(batches, 'job_ms'):>8.0f}{_median(batches, 'ms'):>8.0f}"
        )
    calls: Counter[str] = Counter()
    for b in stream:
        calls.update(b["by_call"])
    print("stream's storage calls per micro-batch, by call: " + ", ".join(
        f"{name} {count / len(stream):.1f}" for name, count in calls.most_common()
    ))  # fmt: skip
    creates = round(calls["create"] / len(stream))
    floor_ms = _durable_create_ms(work / "creates", creates)
    print(f"the commit protocol's floor at a local path: {creates} durable creates "
          f"(LocalStorage.create) take {floor_ms:.1f} ms")  # fmt: skip
    if args.jobs:
        print("the jobs of the last micro-batch: " + "; ".join(stream[-1]["job_names"]))
    cheaper = min(floors.values(), key=lambda batches: _median(batches, "ms"))
    ms = _median(stream, "ms") / _median(cheaper, "ms")
    jobs = _median(stream, "jobs") / max(1, _median(cheaper, "jobs"))
    print(f"ratio stream / the cheaper floor: ms {ms:.2f}x, jobs {jobs:.1f}x")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _reported(batches: list[dict[str, Any]], from_batch: int) -> list[dict[str, Any]]:
    reported = [b for b in batches if b["batch_id"] >= from_batch]
    if not reported:
        raise SystemExit(f"no micro-batch from id {from_batch} on: raise --files")
    return reported


if __name__ == "__main__":
    raise SystemExit(main())
