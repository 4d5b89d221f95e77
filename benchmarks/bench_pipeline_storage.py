"""The stream with its output and checkpoint at a local path and at a URI: what the URI costs.

    .venv/bin/python benchmarks/bench_pipeline_storage.py [--orders 1e5] [--repeat 3]

One classic ``local[2]`` session runs ``start_stream`` over
``spark.readStream.text`` of the same files (one file per micro-batch), with
the Parquet sink, its output and checkpoint

* at a local path: tickwheel's own files through :mod:`os`
  (``LocalStorage``), Spark's through its local file system; and
* at ``viewfs://bench/data``, a Hadoop mount table over another directory of
  the same disk: tickwheel's own files through Hadoop's ``FileSystem`` in
  the JVM (``HadoopStorage``, over Py4J), Spark's through the ``viewfs``
  client, as on ``hdfs://`` or ``s3a://``.

Same disk, so the difference is the way there: the calls through Py4J, Spark's
``createAtomic`` for each new small file, and a Spark job that counts the
state's rows where a local path reads the Parquet footers with pyarrow. The
two run alternately, ``--repeat`` times each after an untimed warm-up; each
run's outcomes are checked equal to the local run's. Prints the best of each,
their ratio and the cost per micro-batch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

MOUNT = "bench"


def _run(spark: Any, rules: Path, inp: Path, out: str, ck: str, partitions: int) -> float:
    """One stream to its end (available-now); its seconds."""
    from tickwheel.pipeline import start_stream

    records = spark.readStream.option("maxFilesPerTrigger", 1).text(str(inp))
    started = time.perf_counter()
    query = start_stream(records, rules, output=out, checkpoint=ck,
                         trigger="available-now", partitions=partitions)  # fmt: skip
    if not query.awaitTermination(1800):
        raise RuntimeError("the stream did not finish in 30 minutes")
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return time.perf_counter() - started


def _outcomes(spark: Any, out: str, ck: str) -> Any:
    from tickwheel.pipeline.sinks import ParquetSink
    from tickwheel.pipeline.stream.start import read_stream_outputs

    outs = read_stream_outputs(spark, ParquetSink(out, spark), ck)
    return outs["outcomes"].drop("batch_id")


def _same(spark: Any, local: tuple[str, str], uri: tuple[str, str]) -> int:
    a, b = _outcomes(spark, *local), _outcomes(spark, *uri)
    if a.exceptAll(b).count() or b.exceptAll(a).count():
        raise AssertionError("the URI run's outcomes differ from the local run's")
    return int(a.count())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=float, default=1e5)
    parser.add_argument("--increments", type=int, default=10, help="files = micro-batches")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from _pipeline_names import STREAM_SESSION_CONF, create_session, generate_orders
    from _stream_inputs import feed, lateness_rules

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-storage-"))
    mounted = work / "mounted"
    mounted.mkdir(parents=True, exist_ok=True)
    conf = {**STREAM_SESSION_CONF,
            f"spark.hadoop.fs.viewfs.mounttable.{MOUNT}.link./data": mounted.as_uri()}  # fmt: skip
    spark = create_session("local[2]", shuffle_partitions=args.partitions, conf=conf)
    rules = lateness_rules(work / "rules.toml")

    def inputs(n: int, tag: str) -> Path:
        gen = work / f"gen-{tag}"
        generate_orders(n, gen, seed=1, files=args.increments)
        feed(sorted(gen.glob("part-*.jsonl")), work / f"in-{tag}")
        return work / f"in-{tag}"

    def places(tag: str) -> dict[str, tuple[str, str]]:
        for path in (work / f"local-{tag}", mounted / tag):
            shutil.rmtree(path, ignore_errors=True)
        local = work / f"local-{tag}"
        uri = f"viewfs://{MOUNT}/data/{tag}"
        return {"local": (str(local / "out"), str(local / "ck")),
                "uri": (f"{uri}/out", f"{uri}/ck")}  # fmt: skip

    try:
        warm = inputs(1_000, "warm")
        for out, ck in places("warm").values():  # class loading, code generation: untimed
            _run(spark, rules, warm, out, ck, args.partitions)
        big = inputs(int(args.orders), "big")
        runs: dict[str, list[float]] = {"local": [], "uri": []}
        for attempt in range(args.repeat):
            where = places(f"run{attempt}")
            for kind, (out, ck) in where.items():
                runs[kind].append(_run(spark, rules, big, out, ck, args.partitions))
            rows = _same(spark, where["local"], where["uri"])
            took = f"local {runs['local'][-1]:.2f}s, uri {runs['uri'][-1]:.2f}s"
            print(f"run {attempt + 1}: {took}; outcomes equal ({rows:,} rows)", flush=True)
    finally:
        spark.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    local, uri = min(runs["local"]), min(runs["uri"])
    print()
    print(f"{int(args.orders):,} orders in {args.increments} micro-batches, local[2], "
          f"best of {args.repeat}")  # fmt: skip
    print()
    print("| output and checkpoint | best s | s per micro-batch | vs local path |")
    print("|---|---:|---:|---:|")
    print(f"| local path | {local:.2f} | {local / args.increments:.3f} | 1.00x |")
    print(f"| viewfs:// URI (Hadoop FileSystem) | {uri:.2f} | {uri / args.increments:.3f} | "
          f"{uri / local:.2f}x |")  # fmt: skip
    print()
    print(f"the URI's cost per micro-batch: {(uri - local) / args.increments * 1000:+.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
