"""The ``tickwheel`` command: trace a wheel, run the pipeline."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence

from . import __version__
from ._accel import COMPILED
from ._trace import EXAMPLE_DELAYS, EXAMPLE_START_MS, render_trace, run_trace

__all__ = ["main"]


def _delays(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--delays must be comma-separated integer milliseconds, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("--delays needs at least one delay")
    return values


def _positive(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _cmd_trace(args: argparse.Namespace) -> int:
    steps = run_trace(
        tick_ms=args.tick_ms,
        wheel_size=args.wheel_size,
        start_ms=args.start_ms,
        delays=args.delays,
        max_steps=args.max_steps,
    )
    try:
        if args.json:
            json.dump([step.to_dict() for step in steps], sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(render_trace(steps))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``tickwheel trace | head``): stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tickwheel", description="Kafka's hierarchical timing wheel for Python."
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"tickwheel {__version__} ({'compiled' if COMPILED else 'pure Python'} core)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    trace = sub.add_parser(
        "trace",
        help="trace a timing wheel step by step",
        description=(
            "Add one task per delay on a manual clock, then move the clock bucket by "
            "bucket and print every level, bucket and the delay queue after each step. "
            "The defaults are the worked example of the TimingWheel docs."
        ),
    )
    trace.add_argument("--tick-ms", type=_positive(1), default=1000)
    trace.add_argument("--wheel-size", type=_positive(2), default=3)
    trace.add_argument("--start-ms", type=_positive(0), default=EXAMPLE_START_MS)
    trace.add_argument(
        "--delays", type=_delays, default=EXAMPLE_DELAYS, help="comma-separated delays in ms"
    )
    trace.add_argument("--max-steps", type=_positive(1), default=1000)
    trace.add_argument("--json", action="store_true", help="print the states as JSON")
    trace.set_defaults(func=_cmd_trace)

    try:
        pipeline_cli = importlib.import_module("tickwheel.pipeline._cli")
    except ModuleNotFoundError as exc:  # the pipeline is not part of this install
        if exc.name not in ("tickwheel.pipeline", "tickwheel.pipeline._cli"):
            raise
    else:
        pipeline_cli.add_pipeline_parser(sub)
    return parser


#: The packages of the ``spark`` extra: a command that needs one says so in one line.
SPARK_EXTRA_MODULES = frozenset({"pyspark", "py4j", "pyarrow", "pandas", "matplotlib"})


#: The exit status of a command whose reader went away (128 + SIGPIPE, as a shell says).
BROKEN_PIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tickwheel`` command.

    A reader that stops early (``tickwheel pipeline status | head -1``) ends the
    command quietly with :data:`BROKEN_PIPE_EXIT`, as Python's documentation of
    ``SIGPIPE`` advises: the rest of the output goes to ``os.devnull``, so the
    interpreter's last flush at exit has nothing to complain about.
    """
    try:
        result = _run(argv)
        sys.stdout.flush()  # a pipe closed early shows here at the latest
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE_EXIT
    return result


def _run(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run its command. O(the command)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in SPARK_EXTRA_MODULES:
            raise
        print(
            f"tickwheel {args.command}: needs the spark extra (no module {missing!r}): "
            "pip install 'tickwheel[spark]'",
            file=sys.stderr,
        )
        return 2
    return result


if __name__ == "__main__":
    raise SystemExit(main())
