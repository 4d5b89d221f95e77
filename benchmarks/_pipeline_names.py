"""The tickwheel pipeline names the stream's benchmarks use, imported in one place.

``bench_pipeline_incremental.py`` and its helper modules, and
``peer_transform_with_state.py``, take these names from here: when a
pipeline module moves, re-point its import here and they all follow.
"""

from __future__ import annotations

from tickwheel.pipeline.batch import run_job
from tickwheel.pipeline.core import Event, PartitionProcessor
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import Rule, Rules, load_rules
from tickwheel.pipeline.sinks import make_sink
from tickwheel.pipeline.spark.records import INT_PATTERN, ISO_PATTERN
from tickwheel.pipeline.spark.session import STREAM_SESSION_CONF, create_session
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

__all__ = [
    "INT_PATTERN",
    "ISO_PATTERN",
    "STREAM_SESSION_CONF",
    "Event",
    "FileStreamJob",
    "PartitionProcessor",
    "Rule",
    "Rules",
    "StreamConfig",
    "create_session",
    "generate_orders",
    "load_rules",
    "make_sink",
    "read_stream_outputs",
    "run_job",
]  # fmt: skip
