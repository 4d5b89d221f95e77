"""tickwheel.pipeline: event-time delayed operations over keyed event streams, on Spark.

The public step, on DataFrames (needs the ``spark`` extra; imported on first use):

* :func:`delayed_operations`: a batch DataFrame of records from any source →
  ``outcomes``, ``unmatched``, ``rejected`` and ``buffered`` DataFrames, and
  ``summary()``;
* :func:`start_stream`: a streaming DataFrame from any replayable source →
  Spark's ``StreamingQuery``, committing each micro-batch exactly once;
* :func:`checkpoint_status`: what a stream's checkpoint holds (pending
  operations, watermark, files, owner), as a dict.

The package, by role (imports run down this list, never up):

* :mod:`.rules`: the rules TOML file;
* :mod:`.core`: :class:`PartitionProcessor`, one partition's purgatory on an
  event-time clock (pure Python; compiled twin ``_loop``);
* :mod:`.storage`: the pipeline's own files at a local path or any URI Spark
  writes (Hadoop's ``FileSystem``), created once, never renamed or overwritten;
* :mod:`.attempt`: one attempt at a micro-batch, whose files' names are its own;
* :mod:`.spark`: the one step, one module per stage (Maxwell's binlog JSON is a
  form of records there), the session set-up and the JDBC drivers' jars;
* :mod:`.sinks`: Parquet, SQLite and PostgreSQL sinks, idempotent per batch id;
* :mod:`.batch`: the batch driver (``tickwheel pipeline run``);
* :mod:`.stream`: the stream driver (``tickwheel pipeline stream``), its
  micro-batch, checkpoint and file source;
* :mod:`.prepare`: ``tickwheel pipeline prepare`` (the JVM's class archive);
* :mod:`.generate` and :mod:`.report`: demo data and reports;
* :mod:`._cli`: the ``tickwheel pipeline`` commands.

Importing this package does not import pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core import Event, OutcomeRow, PartitionProcessor, StateRow, UnmatchedRow
from .rules import InputConfig, Rule, Rules, RulesError, load_rules, parse_duration, parse_rules

if TYPE_CHECKING:
    from .spark.step import DelayedOperations, delayed_operations
    from .stream.start import read_stream_outputs, start_stream
    from .stream.status import checkpoint_status

__all__ = [
    "DelayedOperations",
    "Event",
    "InputConfig",
    "OutcomeRow",
    "PartitionProcessor",
    "Rule",
    "Rules",
    "RulesError",
    "StateRow",
    "UnmatchedRow",
    "checkpoint_status",
    "delayed_operations",
    "load_rules",
    "parse_duration",
    "parse_rules",
    "read_stream_outputs",
    "start_stream",
]

#: The names that need the spark extra (pyspark, or pyarrow), and the module each lives in.
_SPARK_NAMES = {
    "checkpoint_status": "stream.status",
    "DelayedOperations": "spark.step",
    "delayed_operations": "spark.step",
    "read_stream_outputs": "stream.start",
    "start_stream": "stream.start",
}


def __getattr__(name: str) -> Any:
    """The DataFrame step's names, imported on first use (they import pyspark)."""
    module = _SPARK_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
