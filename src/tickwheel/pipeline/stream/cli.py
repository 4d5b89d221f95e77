"""``tickwheel pipeline stream``: the stream driver over a directory of arriving files."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..spark.session import add_remote_argument, check_remote_or_master
from .checkpoint import StreamError
from .file_job import FileStreamJob, StreamConfig

__all__ = ["add_stream_arguments", "main", "run_stream_command"]


def add_stream_arguments(parser: Any) -> None:
    """Add the options of ``tickwheel pipeline stream`` to an argparse parser. O(1).

    No option takes a password: a command line is visible to every user of the
    machine. The PostgreSQL sink reads it as libpq does (``PGPASSWORD``, the
    password file), see :func:`tickwheel.pipeline.sinks.postgres_credentials`.
    """
    parser.add_argument("--rules", required=True, help="rules TOML file")
    parser.add_argument(
        "--input", required=True, help="directory (or URI) the stream watches for files"
    )
    parser.add_argument("--output", required=True, help="output directory or URI (and SQLite home)")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory or URI (one job)")
    parser.add_argument(
        "--drop-incompatible-state",
        action="store_true",
        help="when the rules changed in a way the checkpoint's state cannot follow (a "
        "removed rule with pending operations, a changed key/id/time/sequence field or input "
        "format), drop what the old rules left and go on, saying what was dropped",
    )
    parser.add_argument(
        "--progress-metrics",
        action="store_true",
        help="put each micro-batch's figures in Spark's StreamingQueryProgress, as the "
        "observed metrics 'tickwheel' of a companion query (costs a Spark job a micro-batch)",
    )
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="once | available-now (default) | interval=30s (runs until stopped)",
    )
    parser.add_argument(
        "--sink", default="parquet", choices=("parquet", "sqlite", "postgresql"), help="sink"
    )
    parser.add_argument(
        "--jdbc-url",
        help="JDBC URL for --sink sqlite/postgresql, without a password (ps shows command "
        "lines): PostgreSQL's comes from PGPASSWORD or the password file (PGPASSFILE, else "
        "~/.pgpass); without --jdbc-url, PGHOST/PGPORT/PGDATABASE name the server",
    )
    parser.add_argument(
        "--input-format",
        choices=("jsonl", "json", "csv", "parquet", "maxwell"),
        help="input format (default: the rules' [input].format)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help="key partitions, at most: a micro-batch's purgatory takes one per 250,000 rows "
        "(default: Spark's default parallelism)",
    )
    parser.add_argument(
        "--max-files-per-trigger", type=int, help="at most this many new files per micro-batch"
    )
    parser.add_argument(
        "--clean-source",
        choices=("off", "archive", "delete"),
        default="off",
        help="what becomes of an input file once its micro-batch is committed, as Spark's "
        "cleanSource: off (default), archive (moved under --source-archive-dir, at its "
        "absolute path) or delete",
    )
    parser.add_argument(
        "--source-archive-dir",
        metavar="DIR",
        help="with --clean-source archive: where the files go (not inside --input)",
    )
    parser.add_argument(
        "--max-file-age",
        metavar="DURATION",
        help="ignore files older than the newest file seen minus this ('7d', '12h', '30m'), "
        "as Spark's maxFileAge (default: no limit; Spark's own file source, used for a URI "
        "input or checkpoint, then keeps its 7d)",
    )
    parser.add_argument(
        "--max-future",
        default="1d",
        help="reject events stamped more than this after processing time as far_future "
        "('1d' default, '2h', ms, or 'off')",
    )
    parser.add_argument("--master", help="Spark master URL (default local[2])")
    add_remote_argument(parser)
    parser.add_argument(
        "--driver-memory",
        help="the Spark driver's heap, as spark-submit takes it ('8g'; default: a quarter "
        "of this machine's memory)",
    )
    parser.add_argument(
        "--driver-state-bytes",
        metavar="SIZE",
        help="the most of the driver's memory the state may take there, as bytes or '3g' "
        "(default: TICKWHEEL_DRIVER_STATE_BYTES, else an eighth of this machine's memory); "
        "past it, the state's operations are partitioned on the executors (classic "
        "sessions; under Spark Connect the stream stops)",
    )
    parser.add_argument(
        "--jit",
        choices=("auto", "c1", "c2"),
        default="auto",
        help="the JVM's compilers: c1 (quick only), c2 (quick and optimising), or auto: c1 "
        "for a local run of --trigger once/available-now over at most 96 MB of new files",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run_stream_command(args: Any) -> int:
    """Run ``tickwheel pipeline stream`` from parsed arguments; return the exit code."""
    from ..rules import RulesError
    from ..sinks import SinkError
    from ..spark.records import parse_max_future
    from ..spark.session import default_driver_memory, memory_failure

    try:
        max_future = parse_max_future(args.max_future)
        if args.partitions is not None and args.partitions < 1:
            raise StreamError("--partitions must be >= 1")
        problem = check_remote_or_master(args.remote, args.master)
        if problem is not None:
            raise StreamError(problem)
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
            clean_source=args.clean_source,
            source_archive_dir=args.source_archive_dir,
            max_file_age=args.max_file_age,
            max_future_ms=max_future,
            master=args.master,
            remote=args.remote,
            driver_memory=args.driver_memory or default_driver_memory(),
            driver_state_bytes=args.driver_state_bytes,
            jit=args.jit,
            drop_incompatible_state=args.drop_incompatible_state,
            progress_metrics=args.progress_metrics,
        )
        with _command_output(quiet=args.quiet), FileStreamJob(config) as job:
            job.run()
    except (StreamError, RulesError, SinkError) as exc:
        print(f"tickwheel pipeline stream: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        hint = memory_failure(exc, config.driver_memory or "", config.partitions)
        if hint is None:
            raise
        print(f"tickwheel pipeline stream: error: {hint}", file=sys.stderr)
        return 1
    return 0


class _CommandFormatter(logging.Formatter):
    """The command's lines: ``[HH:MM:SS] stream: ...`` for progress, and
    ``tickwheel pipeline stream: ...`` for a warning (its message names the batch)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"tickwheel pipeline stream: {message}"
        stamp = dt.datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        return f"[{stamp}] stream: {message}"


@contextlib.contextmanager
def _command_output(*, quiet: bool) -> Iterator[None]:
    """While the command runs, show the ``tickwheel.pipeline`` loggers' records as its
    output: INFO on standard output (not with ``quiet``), WARNING and above on
    standard error (always). O(1)."""
    logger = logging.getLogger("tickwheel.pipeline")
    formatter = _CommandFormatter()
    errors = logging.StreamHandler(sys.stderr)
    errors.setLevel(logging.WARNING)
    progress = logging.StreamHandler(sys.stdout)
    progress.setLevel(logging.INFO)
    progress.addFilter(lambda record: record.levelno < logging.WARNING)
    handlers = [errors] if quiet else [progress, errors]
    saved = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the command's output, not also the root's
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tickwheel.pipeline.stream.cli``: the same as ``tickwheel pipeline stream``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="tickwheel pipeline stream",
        description="Incremental, exactly-once pipeline over a directory of arriving files.",
    )
    add_stream_arguments(parser)
    return run_stream_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
