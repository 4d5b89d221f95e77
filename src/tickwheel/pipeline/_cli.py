"""``tickwheel pipeline generate|run|prepare|report|stream|status`` (``stream``'s options:
``stream.cli``).

Importing this module must stay cheap: pyspark, pandas and matplotlib are
imported inside the commands, so ``tickwheel --help`` does not start them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

__all__ = ["add_pipeline_parser"]


def _int_at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _duration(text: str) -> int:
    from .rules import RulesError, parse_duration

    try:
        return parse_duration(text, "--timeout")
    except RulesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _max_future(text: str) -> int | None:
    from .rules import RulesError
    from .spark.records import parse_max_future

    try:
        return parse_max_future(text)
    except RulesError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 'off'") from None


def _cmd_generate(args: argparse.Namespace) -> int:
    from .generate import generate_orders

    started = time.perf_counter()
    stats = generate_orders(
        args.orders,
        args.out,
        seed=args.seed,
        files=args.files,
        timeout_ms=args.timeout,
        mean_gap_ms=args.mean_gap_ms,
    )
    print(
        f"wrote {stats.records:,} records ({stats.events_per_order():.2f} per order) for "
        f"{stats.orders:,} orders to {args.out} in {stats.files} file(s) "
        f"in {time.perf_counter() - started:.1f}s"
    )
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .batch import resolve_inputs
    from .rules import RulesError, load_rules
    from .spark.session import (
        check_remote_or_master,
        default_driver_memory,
        default_parallelism,
        memory_failure,
        partitions_for,
    )
    from .spark.workers import WorkersError
    from .storage import StorageError, is_uri, storage_for

    try:
        rules = load_rules(args.rules)
        fmt = args.input_format or rules.input.format
        # A URI's files are listed once Spark is up, through its Hadoop file systems.
        input_bytes = None if is_uri(args.input) else resolve_inputs(args.input, fmt).bytes
        problem = check_remote_or_master(args.remote, args.master)
        if problem is not None:
            raise ValueError(problem)
    except (RulesError, FileNotFoundError, ValueError) as exc:
        print(f"tickwheel pipeline run: {exc}", file=sys.stderr)
        return 2

    memory = args.driver_memory or default_driver_memory()
    spark, existing = _start_spark(args, input_bytes, memory)
    partitions = args.partitions or 0
    try:
        if input_bytes is None:
            try:
                input_bytes = resolve_inputs(args.input, fmt, storage_for(args.input, spark)).bytes
            except (FileNotFoundError, StorageError) as exc:
                print(f"tickwheel pipeline run: {exc}", file=sys.stderr)
                return 2
        partitions = args.partitions or partitions_for(input_bytes, default_parallelism(spark))
        summary = _run_job(spark, rules, args, partitions)
    except WorkersError as exc:
        print(f"tickwheel pipeline run: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        hint = memory_failure(exc, memory, partitions)
        if hint is None:
            raise
        print(f"tickwheel pipeline run: {hint}", file=sys.stderr)
        return 1
    finally:
        if existing is None:
            with contextlib.suppress(Exception):  # a JVM that died cannot be stopped
                spark.stop()
    from .report import render_summary

    print()
    print(render_summary(summary), end="")
    print(f"\noutputs in {args.output}: outcomes/ unmatched/ rejected/ buffered/ summary.json")
    return 0


def _say(message: str) -> None:
    print(message, flush=True)


def _start_spark(args: argparse.Namespace, input_bytes: int | None, memory: str) -> tuple[Any, Any]:
    """(the session ``pipeline run`` uses, the session that was active before it).

    ``input_bytes`` is None when not known before Spark is up (a URI): then
    the JVM keeps both compilers, as for a large input.
    """
    from pyspark.sql import SparkSession

    from .spark.class_archive import startup_note
    from .spark.session import create_session, quick_jit_for

    started = time.perf_counter()
    existing = SparkSession.getActiveSession()
    if args.remote is not None:
        _say(f"[    0.0s] connecting to Spark Connect at {args.remote}")
        spark = create_session(remote=args.remote, shuffle_partitions=args.partitions or 4)
        _say(f"[{time.perf_counter() - started:7.1f}s] Spark {spark.version} is up")
        return spark, existing
    master = args.master or "local[2]"
    known = input_bytes is not None
    quick = args.jit == "c1" or (
        args.jit == "auto" and known and quick_jit_for(master, input_bytes or 0)
    )
    jit = "C1 only" if quick else "C1 and C2"
    size = f"{input_bytes / 2**20:,.0f} MB" if input_bytes is not None else "a URI's"
    archive, classes = startup_note(master)
    classes = f"; {classes}" if classes else ""
    _say(f"[    0.0s] starting Spark ({master}; JIT: {jit}, driver memory {memory}, "
         f"for {size} of input{classes})")  # fmt: skip
    spark = create_session(
        master,
        shuffle_partitions=args.partitions or 4,
        quick_jit=quick,
        class_archive=archive,
        driver_memory=memory,
    )
    _say(f"[{time.perf_counter() - started:7.1f}s] Spark {spark.version} is up")
    return spark, existing


def _run_job(spark: Any, rules: Any, args: argparse.Namespace, partitions: int) -> Any:
    from .batch import run_job

    return run_job(
        spark,
        rules,
        args.input,
        args.output,
        partitions=partitions,
        output_format=args.format,
        progress=_say,
        max_future_ms=args.max_future,
        input_format=args.input_format,
    )


def _cmd_prepare(args: argparse.Namespace) -> int:
    from .prepare import build
    from .spark.class_archive import ArchiveError

    try:
        build(force=args.force, say=_say)
    except ArchiveError as exc:
        print(f"tickwheel pipeline prepare: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import load_summary, render_summary, write_plots

    try:
        summary = load_summary(args.output)
    except FileNotFoundError as exc:
        print(f"tickwheel pipeline report: {exc}", file=sys.stderr)
        return 2
    print(render_summary(summary), end="")
    if not args.no_plots:
        for path in write_plots(args.output, summary.get("format", "parquet")):
            print(f"plot: {path}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    """Print what a stream checkpoint holds; a URI one through a local classic session."""
    import json

    from .storage import is_uri
    from .stream.checkpoint import StreamError
    from .stream.status import checkpoint_status
    from .stream.status_report import render_status

    spark = None
    if is_uri(args.checkpoint) or (args.input is not None and is_uri(args.input)):
        from .spark.session import create_session, set_log_level

        spark = create_session("local[1]", app_name="tickwheel-status", shuffle_partitions=1)
        set_log_level(spark, "ERROR")
    try:
        status = checkpoint_status(args.checkpoint, spark=spark, input=args.input)
    except StreamError as exc:
        print(f"tickwheel pipeline status: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()
    if args.json:
        print(json.dumps(status, indent=1, sort_keys=True))
    else:
        print(render_status(status), end="")
    return 0


def add_pipeline_parser(subparsers: Any) -> None:
    """Add ``pipeline`` with its ``generate``, ``run``, ``stream``, ``status``, ``prepare`` and
    ``report`` commands to the CLI."""
    pipeline = subparsers.add_parser(
        "pipeline",
        help="event-time delayed operations over keyed event streams, on Spark",
        description="Generate order events, run the pipeline on Spark, report on its output.",
    )
    sub = pipeline.add_subparsers(dest="pipeline_command", required=True)

    gen = sub.add_parser("generate", help="write realistic order events (JSON Lines)")
    gen.add_argument("--orders", type=_int_at_least(0), required=True)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", required=True, help="output directory")
    gen.add_argument("--files", type=_int_at_least(1), default=4, help="number of files")
    gen.add_argument("--timeout", type=_duration, default=1_800_000, help="the rule's timeout")
    gen.add_argument("--mean-gap-ms", type=_int_at_least(1), default=50,
                     help="mean time between orders")  # fmt: skip
    gen.set_defaults(func=_cmd_generate)

    from .spark.session import add_remote_argument

    run = sub.add_parser("run", help="run the batch pipeline on Spark")
    run.add_argument("--rules", required=True, help="rules TOML file")
    run.add_argument("--input", required=True, help="input directory, glob or file")
    run.add_argument("--output", required=True, help="output directory")
    run.add_argument("--partitions", type=_int_at_least(1), default=None,
                     help="key-hash partitions (default: one per 64 MB of input, at least "
                          "Spark's default parallelism)")  # fmt: skip
    run.add_argument("--driver-memory", help="the Spark driver's heap, as spark-submit takes "
                     "it ('8g'; default: a quarter of this machine's memory)")  # fmt: skip
    run.add_argument("--master", help="Spark master URL (default local[2])")
    add_remote_argument(run)
    run.add_argument("--format", choices=("parquet", "csv", "json"), default="parquet")
    run.add_argument("--input-format", choices=("jsonl", "json", "csv", "parquet", "maxwell"),
                     help="input format (default: the rules' [input].format)")  # fmt: skip
    run.add_argument("--max-future", type=_max_future, default="1d",
                     help="reject events stamped more than this after now as far_future "
                          "('1d' default, '2h', ms, or 'off')")  # fmt: skip
    run.add_argument("--jit", choices=("auto", "c1", "c2"), default="auto",
                     help="the JVM's compilers: c1 only suits short runs; auto picks c1 for "
                          "a local master and at most 96 MB of input")  # fmt: skip
    run.set_defaults(func=_cmd_run)

    from .stream.cli import add_stream_arguments, run_stream_command

    stream = sub.add_parser(
        "stream", help="incremental, exactly-once run over a directory of arriving files"
    )
    add_stream_arguments(stream)
    stream.set_defaults(func=run_stream_command)

    prepare = sub.add_parser(
        "prepare",
        help="archive the JVM classes a job loads, so that cold starts are faster (~180 MB)",
        description="Record, check and install a class-data archive (AppCDS) for this JVM "
        "and Spark; local runs then use it (TICKWHEEL_CLASS_ARCHIVE=off: not).",
    )
    prepare.add_argument("--force", action="store_true", help="record it again")
    prepare.set_defaults(func=_cmd_prepare)

    status = sub.add_parser(
        "status",
        help="what a stream checkpoint holds: last batch, watermark, pending, files, owner",
        description="Read a stream checkpoint (nothing is written) and report its last "
        "commit, watermark lag, rules, pending operations per rule, carried events, files "
        "taken and waiting, and whether a job holds it.",
    )
    status.add_argument("--checkpoint", required=True, help="the stream's checkpoint (or URI)")
    status.add_argument("--input", help="the input directory, to count the files waiting "
                        "(default: the one the last commit recorded)")  # fmt: skip
    status.add_argument("--json", action="store_true", help="print the figures as JSON")
    status.set_defaults(func=_cmd_status)

    report = sub.add_parser("report", help="print the summary and write PNG plots")
    report.add_argument("output", help="a pipeline output directory")
    report.add_argument("--no-plots", action="store_true")
    report.set_defaults(func=_cmd_report)
