"""The stream against the batch job and against Spark's own stateful APIs, in one process.

Measured in one process, on one SparkContext (``local[2]``, 2 shuffle
partitions), the same generated orders fed as K increments (files, one
micro-batch each), the same rule:

(a) the batch job (``tickwheel pipeline run``) over all the data, at each N
    of ``--orders`` (1e5 and 1e6 by default);
(b) the stream (``tickwheel pipeline stream``, available-now, one file per
    micro-batch, state carried), at N; its outcomes are checked equal to (a)'s;
(c) at a smaller N (``--peer-orders``, 1e5 by default: the peers run at a
    few thousand events/s), the stream again, then Spark's stateful peers
    (see ``benchmarks/_stream_peers.py``), each over the same files on the same
    schedule, tuned as their documentation advises (RocksDB state store with
    changelog checkpointing, shuffle partitions = cores: a child session of
    the stream's, ``_stream_peers.peer_session``, as the state store is a SQL
    setting), each checked equal to the stream's outcomes on the keys where
    their semantics must agree; their rows give peer seconds / stream seconds,
    which is the stream's events/s / the peer's:

    * ``transformWithStateInPandas`` (Spark 4.0), event-time timers;
    * ``transformWithState`` (row-based, Spark 4.1), event-time timers;
    * ``applyInPandasWithState`` (Spark 3.4), ``EventTimeTimeout``;

    and two floors: the *floor* of a micro-batch (a ``foreachBatch`` over the
    same source that writes one Parquet file per micro-batch, nothing else),
    and the *stream skeleton*, the least a correct incremental job does per
    micro-batch, done as cheaply as Spark allows: the JSON file source with a
    schema (no validation), the carried state read back, ``dropDuplicates``
    by event id over both (copies of one id may carry different keys, so this
    is its own shuffle), one shuffle by key into an identity ``mapInArrow``,
    and two writes (results and next state). No outputs of the real job's
    kinds, no commit protocol;
(d) the fixed cost of a micro-batch: the stream and the floor over K files of
    about ``--fixed-records`` records each, the median time of a warm
    micro-batch (Spark's ``triggerExecution``, from the query listener, the
    first micro-batch of each run left out). The floor runs twice, alternated:
    its file written by Spark's writer, and its rows collected to the driver as
    Arrow and written with pyarrow; the stream is compared with the cheaper.

Also the carried state's size per pending operation: in the driver's Python
heap (tracemalloc over a processor holding only pending operations) and on
disk (the checkpoint's Parquet state); and the memory after each increment.

Seconds exclude the SparkSession start, the data generation and an untimed
warm-up of every job on 1,000 orders (``--no-warm-up`` skips it). (a), (b),
the stream at the peers' N and the floors run ``--repeat`` times each (at
the peers' N, once more after each peer), with fresh outputs and
checkpoints; the table gives each job's best run (the JVM's JIT warm) and
its first. Each peer runs once: it takes minutes, so its JIT is warm for most
of its run.

``--cli`` measures instead as a user runs them, one process (one JVM) each:
``tickwheel pipeline run``, ``tickwheel pipeline stream
--max-files-per-trigger 1``, ``benchmarks/peer_transform_with_state.py`` and
its floor over the same generated files (see :func:`cli_comparison`), at each
N of ``--cli-orders``; ``--cli-peers`` picks the programs beside the stream,
among them PyFlink's ``KeyedProcessFunction`` (``pyflink``: see
``benchmarks/peer_pyflink.py``; it runs in its own environment, which ``make
bench-env-pyflink`` creates).

Run::

    .venv/bin/python benchmarks/bench_pipeline_incremental.py --repeat 3
    .venv/bin/python benchmarks/bench_pipeline_incremental.py --orders 0   # the peers only
    .venv/bin/python benchmarks/bench_pipeline_incremental.py --cli
    .venv/bin/python benchmarks/bench_pipeline_incremental.py --cli --cli-peers pyflink \
        --cli-orders 2e4 1e5 1e6
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _stream_peers as peers
from _cli_comparison import add_arguments as add_cli_arguments
from _cli_comparison import cli_comparison
from _pipeline_names import (
    STREAM_SESSION_CONF,
    FileStreamJob,
    Rule,
    Rules,
    StreamConfig,
    create_session,
    generate_orders,
    load_rules,
    read_stream_outputs,
    run_job,
)
from _stream_inputs import count_records, feed, lateness_rules, sci
from _stream_state import (
    memory_per_batch,
    parquet_bytes_per_pending,
    print_memory,
    state_bytes_per_pending,
    state_line,
)

#: Records per generated order (1.83 measured): sizes the fixed-cost workload.
RECORDS_PER_ORDER = 1.83


def _incremental(
    spark: Any,
    rules: Path,
    inp: Path,
    work: Path,
    partitions: int,
    memory: list[dict[str, float]] | None = None,
) -> Any:
    cfg = StreamConfig(
        rules_path=str(rules),
        input=str(inp),
        output=str(work / "out"),
        checkpoint=str(work / "ck"),
        trigger="available-now",
        max_files_per_trigger=1,
        partitions=partitions,
    )
    started = time.perf_counter()
    sampled = memory_per_batch(spark, memory) if memory is not None else contextlib.nullcontext()
    with FileStreamJob(cfg, spark=spark) as job, sampled:
        summary = job.run()
        seconds = time.perf_counter() - started
        assert job.sink is not None
        outs = read_stream_outputs(spark, job.sink, str(work / "ck"))
    return seconds, summary, outs


def _identity(batches: Any) -> Any:
    yield from batches


def _stream_skeleton(spark: Any, inp: Path, work: Path, partitions: int) -> float:
    """The floor of (c): a micro-batch per file, state carried, dedup, by key, 2 writes."""
    from pyspark.sql import functions as F

    out = work / "skeleton-out"
    ck = work / "skeleton-ck"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ck, ignore_errors=True)
    schema = "event_id string, order_id string, type string, ts string, seq string"

    def batch(df: Any, batch_id: int) -> None:
        events = df
        if batch_id > 0:
            carried = spark.read.schema(df.schema).parquet(str(out / f"state-{batch_id - 1}"))
            events = events.unionByName(carried)
        grouped = (
            events.dropDuplicates(["event_id"])
            .repartition(partitions, "order_id")
            .mapInArrow(_identity, events.schema)
            .persist()
        )
        grouped.where(F.col("type") == "paid").write.parquet(str(out / f"results-{batch_id}"))
        df.where(F.col("type") == "created").write.parquet(str(out / f"state-{batch_id}"))
        grouped.unpersist()

    query = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", "1")
        .json(str(inp))
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    started = time.perf_counter()
    query.awaitTermination()
    return time.perf_counter() - started


# ----------------------------------------------------------------------------- the runs


@dataclass
class _Row:
    """One job's line in the table: its runs' seconds and what its outputs were checked for."""

    name: str
    orders: int
    records: int
    runs: list[float]
    batches: str
    check: str = ""


@dataclass
class _Target:
    """One line of the targets table: a measured value beside the issue's target."""

    name: str
    value: float
    unit: str  # "x" or "s"
    target: str
    ok: bool | None = None


def _batches(progress: list[dict[str, Any]]) -> str:
    """The micro-batches a query ran: with data, plus those without (watermark moves)."""
    data = sum(1 for batch in progress if batch["data"])
    empty = len(progress) - data
    return f"{data}+{empty}" if empty else str(data)


@dataclass
class _Bench:
    """One in-process run: the session, the workloads, and what was measured."""

    args: argparse.Namespace
    work: Path
    spark: Any
    rules_path: Path
    rows: list[_Row] = field(default_factory=list)
    targets: list[_Target] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    memory: list[dict[str, float]] = field(default_factory=list)  # the best stream run's
    big: tuple[int, int, float, float] | None = None  # (a), (b): orders, records, seconds
    aip: tuple[int, float] | None = None  # applyInPandasWithState: orders, events/s

    def __post_init__(self) -> None:
        self.rules: Rules = load_rules(self.rules_path)
        self.rule: Rule = self.rules.rules[0]
        self.peer_spark = peers.peer_session(self.spark)
        self.log = peers.ProgressLog(self.spark)
        self.peer_log = peers.ProgressLog(self.peer_spark)

    def workload(self, n: int, tag: str, files: int | None = None) -> tuple[Path, int]:
        """``n`` generated orders as ``files`` arrival-ordered files; the input dir, records."""
        gen = self.work / f"gen-{tag}"
        generate_orders(n, gen, seed=1, files=files or self.args.increments)
        paths = sorted(gen.glob("part-*.jsonl"))
        feed(paths, self.work / f"in-{tag}")
        return self.work / f"in-{tag}", count_records(paths)

    def measured(self, row: _Row) -> None:
        self.rows.append(row)
        print(f"measured: {row.name}: {row.orders:,} orders, {row.records:,} records, "
              + ", ".join(f"{secs:.1f}" for secs in row.runs) + " s", flush=True)  # fmt: skip

    def stream(self, inp: Path, tag: str, memory: list[dict[str, float]] | None = None) -> Any:
        """tickwheel's stream over ``inp`` from a fresh checkpoint: seconds, summary, outputs."""
        shutil.rmtree(self.work / f"inc-{tag}", ignore_errors=True)
        return _incremental(self.spark, self.rules_path, inp, self.work / f"inc-{tag}",
                            self.args.partitions, memory)  # fmt: skip

    def floor(
        self, inp: Path, tag: str, writer: str = "spark"
    ) -> tuple[float, list[dict[str, Any]]]:
        """The floor of a micro-batch over ``inp``, its files written by ``writer``
        (``_stream_peers.FLOOR_WRITERS``): seconds and its micro-batches' progress."""
        self.log.reset()
        secs = peers.floor_query(self.spark, inp, self.work / f"floor-{tag}",
                                 self.work / f"floor-ck-{tag}", writer=writer)  # fmt: skip
        return secs, self.log.wait()

    def peer(self, name: str, inp: Path, tag: str) -> tuple[float, Path, list[dict[str, Any]]]:
        """Peer ``name`` over ``inp``: seconds, its outcomes' directory, its progress."""
        out = self.work / f"peer-{name}-{tag}"
        self.peer_log.reset()
        secs = peers.run_peer(self.peer_spark, name, inp, out, self.work / f"peer-ck-{name}-{tag}",
                              self.rule, self.rules.input.allowed_lateness_ms)  # fmt: skip
        return secs, out, self.peer_log.wait()

    def warm_up(self) -> None:
        """Run every job once on 1,000 orders, untimed: class loading, code generation."""
        started = time.perf_counter()
        inp, _ = self.workload(1_000, "warm", files=2)
        self.stream(inp, "warm")
        self.floor(inp, "warm")
        for name in self.args.peers:
            self.peer(name, inp, "warm")
        print(f"warm-up: {time.perf_counter() - started:.1f}s (not counted)", flush=True)

    def batch_vs_stream(self, n: int) -> None:
        """(a) and (b) at ``n``, alternately; each stream run checked equal to its batch run."""
        tag = f"big-{n}"
        inp, records = self.workload(n, tag)
        batch_runs: list[float] = []
        stream_runs: list[float] = []
        for attempt in range(self.args.repeat):
            batch_out = self.work / f"batch-{tag}-{attempt}"
            started = time.perf_counter()
            run_job(self.spark, self.rules, str(self.work / f"gen-{tag}"), str(batch_out),
                    partitions=self.args.partitions)  # fmt: skip
            batch_runs.append(time.perf_counter() - started)
            memory: list[dict[str, float]] = []
            secs, _summary, outs = self.stream(inp, tag, memory)
            if not stream_runs or secs < min(stream_runs):
                self.memory = memory
            stream_runs.append(secs)
            checked = _check_against_batch(self.spark, batch_out, outs)
            print(
                f"run {attempt + 1}: batch {batch_runs[-1]:.1f}s, stream {secs:.1f}s; "
                f"checked: stream outcomes == batch outcomes ({checked:,} rows)",
                flush=True,
            )
            shutil.rmtree(batch_out, ignore_errors=True)
        k = self.args.increments
        self.measured(_Row("batch job", n, records, batch_runs, "-", "the reference"))
        self.measured(_Row(f"stream, {k} micro-batches", n, records, stream_runs, str(k),
                           "equal to the batch job"))  # fmt: skip
        self.lines.append(state_line(self.spark, self.work / f"inc-{tag}"))
        ratio = min(stream_runs) / min(batch_runs)
        bound = {1_000_000: 1.5}.get(n)
        self.targets.append(_Target(
            f"stream, {sci(n)} orders in {k} micro-batches, vs the batch job", ratio, "x",
            f"<= {bound}x" if bound else "(report)", None if bound is None else ratio <= bound,
        ))  # fmt: skip
        self.big = (n, records, min(batch_runs), min(stream_runs))

    def peers_at(self, n: int) -> None:
        """(c) at ``n``: the stream and the floors, then each peer once, checked.

        A stream run and a floor run follow each peer, and the peer's ratios
        use the better of the runs just before and just after it: the load of
        a shared machine moves within minutes, and a peer runs for minutes.
        """
        k = self.args.increments
        inp, records = self.workload(n, "peers")
        stream_runs: list[float] = []
        floor_runs: list[float] = []
        skeleton_runs: list[float] = []

        def tickwheel_round() -> tuple[dict[str, Any], dict[str, Any]]:
            secs, summary, outs = self.stream(inp, "peers")
            stream_runs.append(secs)
            floor_runs.append(self.floor(inp, "peers")[0])
            return summary, outs

        for _attempt in range(self.args.repeat):
            summary, outs = tickwheel_round()
            skeleton_runs.append(_stream_skeleton(self.spark, inp, self.work, self.args.partitions))
        expected = peers.comparable_outcomes(outs, summary["watermark"])
        peer_rows = []
        for name in self.args.peers:
            secs, out, progress = self.peer(name, inp, "peers")
            check = peers.check_peer(name, self.peer_spark, out, expected)  # exits if unequal
            peer_rows.append(_Row(name, n, records, [secs], _batches(progress), check))
            tickwheel_round()
            self._peer_targets(name, n, secs, min(stream_runs[-2:]), min(floor_runs[-2:]))
            if name == "applyInPandasWithState":
                self.aip = (n, records / secs)
        self.measured(_Row(f"stream, {k} micro-batches", n, records, stream_runs, str(k),
                           f"the reference: {len(expected):,} comparable keys"))  # fmt: skip
        self.measured(_Row("floor: foreachBatch, 1 Parquet file", n, records, floor_runs, str(k),
                           "no outputs: the least a micro-batch costs"))  # fmt: skip
        self.measured(_Row("stream skeleton (floor)", n, records, skeleton_runs, str(k),
                           "no outputs: state carried, dedup, by key"))  # fmt: skip
        for row in peer_rows:
            self.measured(row)
        ratio = min(stream_runs) / min(floor_runs)
        self.targets.append(_Target(
            f"stream, {sci(n)} orders in {k} micro-batches, vs the foreachBatch floor", ratio,
            "x", "<= 3x" if n == 100_000 else "(report)", ratio <= 3 if n == 100_000 else None,
        ))  # fmt: skip

    def _peer_targets(
        self, name: str, n: int, secs: float, stream_s: float, floor_s: float
    ) -> None:
        """The target rows of peer ``name``: against the stream, and against the floor."""
        k = self.args.increments
        api = f"{name} (row API)" if name == "transformWithState" else name
        ratio, stateful = secs / stream_s, name != "applyInPandasWithState"
        self.targets.append(_Target(
            f"stream vs {api}, events/s, {sci(n)} in {k} triggers each", ratio, "x",
            ">= 20x" if stateful else "(report)", ratio >= 20 if stateful else None,
        ))  # fmt: skip
        self.targets.append(_Target(f"  floor vs {api}: the most any stream can reach",
                                    secs / floor_s, "x", "(floor)"))  # fmt: skip
        print(
            f"{name}: {secs:.1f}s; the stream around it {stream_s:.1f}s, the floor "
            f"{floor_s:.1f}s (the better of the runs just before and after)",
            flush=True,
        )

    def fixed_cost(self) -> None:
        """(d): a warm micro-batch of about ``--fixed-records`` records: the stream, and the
        floor with each writer (Spark's, and pyarrow's in the driver), alternated."""
        k = self.args.increments
        n = max(1, round(self.args.fixed_records * k / RECORDS_PER_ORDER))
        inp, records = self.workload(n, "fixed")
        stream_ms: list[float] = []
        floor_ms: dict[str, list[float]] = {writer: [] for writer in peers.FLOOR_WRITERS}
        for _attempt in range(self.args.repeat):
            self.log.reset()
            self.stream(inp, "fixed")
            stream_ms += [batch["ms"] for batch in self.log.wait()[1:] if batch["data"]]
            for writer, ms in floor_ms.items():
                runs = self.floor(inp, f"fixed-{writer}", writer)[1][1:]
                ms += [batch["ms"] for batch in runs if batch["data"]]
        stream_s = statistics.median(stream_ms) / 1e3
        floor_s = {writer: statistics.median(ms) / 1e3 for writer, ms in floor_ms.items()}
        label = f"fixed cost of a micro-batch of {records // k:,} records, warm"
        self.targets.append(_Target(f"{label}: stream", stream_s, "s", "(report)"))
        for writer, secs in floor_s.items():
            self.targets.append(_Target(f"{label}: floor, {writer} writer", secs, "s", "(floor)"))
        ratio = stream_s / min(floor_s.values())
        self.targets.append(_Target(f"{label}: stream vs the cheaper floor", ratio, "x", "<= 2x",
                                    ratio <= 2))  # fmt: skip
        self.lines.append(
            f"fixed cost: {n:,} orders = {records:,} records in {k} files; the median of "
            f"{len(stream_ms)} warm micro-batches (Spark's triggerExecution, each run's first "
            f"left out): stream {stream_s:.2f} s (min {min(stream_ms) / 1e3:.2f}), "
            + ", ".join(
                f"floor with the {writer} writer {floor_s[writer]:.2f} s (min {min(ms) / 1e3:.2f})"
                for writer, ms in floor_ms.items()
            )
        )

    def report(self) -> None:
        """Print the runs, the memory, and the targets."""
        print(f"\n{'run':38} {'orders':>9} {'records':>9} {'batches':>7} {'seconds':>8} "
              f"{'first s':>8} {'s/batch':>8} {'events/s':>9}  check")  # fmt: skip
        for row in self.rows:
            best = min(row.runs)
            per = f"{best / int(row.batches.split('+')[0]):.2f}" if row.batches != "-" else ""
            print(
                f"{row.name:38} {row.orders:>9,} {row.records:>9,} {row.batches:>7} {best:>8.1f} "
                f"{row.runs[0]:>8.1f} {per:>8} {row.records / best:>9,.0f}  {row.check}"
            )
        print(f"seconds: best of {self.args.repeat} runs (each peer: 1 run); first s: the first; "
              "batches: with data (+ without: the watermark's last move)")  # fmt: skip
        for line in self.lines:
            print(line)
        if self.memory:
            print_memory(self.memory)
        if self.big and self.aip:
            n, records, batch_s, stream_s = self.big
            for name, secs in (("batch", batch_s), ("stream", stream_s)):
                ratio = records / secs / self.aip[1]
                self.targets.append(_Target(
                    f"{name} events/s at {sci(n)} vs applyInPandasWithState at {sci(self.aip[0])}",
                    ratio, "x", ">= 100x", ratio >= 100))  # fmt: skip
        print(f"\n{'target':76} {'measured':>9} {'target':>9}  verdict")
        for t in self.targets:
            verdict = "" if t.ok is None else ("met" if t.ok else "NOT met")
            value = f"{t.value:.2f}{t.unit}"
            print(f"{t.name:76} {value:>9} {t.target:>9}  {verdict}")
        print(f"driver heap: {state_bytes_per_pending():.0f} B per pending operation "
              "(tracemalloc, 100k ops)")  # fmt: skip
        print(f"checkpoint: {parquet_bytes_per_pending():.1f} B per pending operation "
              "(ops state as Parquet, snappy, 100k ops)")  # fmt: skip


def _check_against_batch(spark: Any, batch_out: Path, outs: dict[str, Any]) -> int:
    """The number of outcome rows; SystemExit if the stream's differ from the batch job's."""
    cols = ["rule", "key", "op_id", "opened_at", "deadline", "outcome", "resolved_at",
            "latency_ms", "resolve_event_id"]  # fmt: skip
    batch = spark.read.parquet(str(batch_out / "outcomes")).select(*cols)
    stream = outs["outcomes"].select(*cols)
    diff = batch.exceptAll(stream).count() + stream.exceptAll(batch).count()
    if diff:
        raise SystemExit(f"MISMATCH: {diff} outcome rows differ between batch and stream")
    return int(batch.count())


# ----------------------------------------------------------------------------- main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=float, nargs="+", default=[1e5, 1e6],
                        help="(a), (b) at each size; 0 skips them")  # fmt: skip
    parser.add_argument("--increments", type=int, default=10, help="files = micro-batches")
    parser.add_argument("--peer-orders", type=float, default=1e5, help="(c); 0 skips it")
    parser.add_argument("--peers", nargs="*", choices=peers.PEERS, default=list(peers.PEERS),
                        help="Spark's stateful peers to run in (c) (default: all)")  # fmt: skip
    parser.add_argument("--fixed-records", type=int, default=1_000,
                        help="records per micro-batch of (d); 0 skips it")  # fmt: skip
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--no-warm-up", action="store_true", help="skip the untimed warm-up")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each tickwheel job, floor")
    add_cli_arguments(parser)
    args = parser.parse_args(argv)
    for name in ("repeat", "cli_repeat", "increments", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("peer_orders", "fixed_records"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if any(n < 1 for n in args.cli_orders) or args.cli_timeout <= 0:
        parser.error("--cli-orders must be >= 1 and --cli-timeout > 0")
    args.cli_orders = sorted({int(n) for n in args.cli_orders})
    if any(n < 0 for n in args.orders):
        parser.error(f"--orders must be >= 0, got {' '.join(f'{n:g}' for n in args.orders)}")
    args.orders = sorted({int(n) for n in args.orders if n})
    needs = args.cli_peers if args.cli else args.peers if args.peer_orders else []
    missing = peers.missing_dependency(needs)
    if missing:
        parser.error(missing)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables."""
    args = _parse(argv)
    if args.cli:
        return cli_comparison(args)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-inc-"))
    work.mkdir(parents=True, exist_ok=True)
    # The stream's session settings, as the CLI's stream starts its own session.
    spark = create_session("local[2]", shuffle_partitions=args.partitions,
                           conf=STREAM_SESSION_CONF)  # fmt: skip
    # As the CLI's stream does; and transformWithState logs a WARN line for
    # every read of an empty state (each new key), which would slow its peers.
    spark.sparkContext.setLogLevel("ERROR")
    peers.ship_to_workers()
    print(f"python {sys.version.split()[0]}, spark {spark.version}, local[2], "
          f"{os.cpu_count()} CPUs, work {work}")  # fmt: skip
    bench = _Bench(args, work, spark, lateness_rules(work / "rules.toml"))
    try:
        if not args.no_warm_up:
            bench.warm_up()
        for n in args.orders:  # ascending: the largest size's memory and state are reported
            bench.batch_vs_stream(n)
        if args.peer_orders:
            bench.peers_at(int(args.peer_orders))
        if args.fixed_records:
            bench.fixed_cost()
        bench.report()
    finally:
        spark.stop()
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
