"""A streaming data source that behaves like a Kafka topic, for the pipeline's tests.

No broker runs here, so the tests drive :func:`tickwheel.pipeline.start_stream`
with this source instead (``spark.readStream.format("kafka_like")``). What
matters of Kafka is kept:

* a topic of several partitions, each an append-only log: a directory
  ``TOPIC/`` with one file per partition (``p0``, ``p1``, ...), one record per
  line (its bytes as they are: invalid UTF-8 stays invalid);
* integer offsets per partition (``{"p0": 12, "p1": 9}``), so a micro-batch
  is a range of each log, and Spark's offset log pins it: a replay after a
  crash reads the same records;
* records appended while the query runs (:func:`append`) are taken by a
  later micro-batch, and all of one append at once: a reader sees a
  partition's records only up to its high watermark, and :func:`append`
  publishes the new high watermarks of every partition in one file, replaced
  whole (a reader seeing a partition's part of an append and not another's
  would take the later events of one partition first and find the others
  late);
* at most ``maxRecordsPerTrigger`` records per micro-batch, spread over the
  partitions, as Kafka's ``maxOffsetsPerTrigger`` does;
* rows shaped as Kafka's source gives them: ``key`` and ``value`` as bytes,
  ``topic``, ``partition``, ``offset``.

Python workers get the source's classes by value (:func:`register`), so the
tests' directory need not be on their path.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

NAME = "kafka_like"
SCHEMA = "key binary, value binary, topic string, partition int, offset long"


HIGH_WATERMARKS = "high_watermarks.json"


def create_topic(topic: Path, partitions: int) -> None:
    """An empty topic of ``partitions`` partitions."""
    topic.mkdir(parents=True, exist_ok=True)
    for p in range(partitions):
        (topic / f"p{p}").touch()
    _publish(topic, dict.fromkeys((f"p{p}" for p in range(partitions)), 0))


def _publish(topic: Path, high_watermarks: dict[str, int]) -> None:
    """Replace the topic's high watermarks in one step."""
    staged = topic / f".{HIGH_WATERMARKS}.tmp"
    with staged.open("w", encoding="utf-8") as fh:
        json.dump(high_watermarks, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(staged, topic / HIGH_WATERMARKS)


def _high_watermarks(topic: str | Path) -> dict[str, int]:
    with open(os.path.join(topic, HIGH_WATERMARKS), encoding="utf-8") as fh:
        return {str(p): int(n) for p, n in json.load(fh).items()}


def append(topic: Path, records: Sequence[bytes], key_of: Any = None) -> None:
    """Append ``records`` (one line each) to the partitions, by the hash of ``key_of(record)``
    (round robin when None), fsynced, as a producer would."""
    high_watermarks = _high_watermarks(topic)
    parts = sorted(high_watermarks, key=lambda name: int(name[1:]))
    by_part: dict[str, list[bytes]] = {p: [] for p in parts}
    for i, record in enumerate(records):
        index = i if key_of is None else sum(key_of(record))
        by_part[parts[index % len(parts)]].append(record)
    for part, lines in by_part.items():
        if lines:
            with (topic / part).open("ab") as fh:
                fh.write(b"".join(line.rstrip(b"\n") + b"\n" for line in lines))
                fh.flush()
                os.fsync(fh.fileno())
            high_watermarks[part] += len(lines)
    _publish(topic, high_watermarks)


@dataclass(frozen=True)
class TopicRange(InputPartition):
    """Offsets ``[start, end)`` of one partition."""

    path: str
    partition: int
    start: int
    end: int


class TopicReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets over the partitions' logs; see the module doc."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.topic = options["path"]
        self.parts = sorted(_high_watermarks(self.topic), key=lambda name: int(name[1:]))
        self.max_rows = int(options.get("maxRecordsPerTrigger") or 0)
        self._end: dict[str, int] | None = None  # the available-now snapshot's end

    def _lengths(self) -> dict[str, int]:
        return _high_watermarks(self.topic)

    def initialOffset(self) -> dict[str, int]:
        return dict.fromkeys(self.parts, 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._end = self._lengths()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        end = self._end if self._end is not None else self._lengths()
        if not isinstance(limit, ReadMaxRows):
            return dict(end)
        budget = limit.max_rows
        out = dict(start)
        while budget > 0:  # a record at a time from each partition in turn, as fair as Kafka's
            moved = False
            for p in self.parts:
                if budget and out[p] < end[p]:
                    out[p] += 1
                    budget -= 1
                    moved = True
            if not moved:
                break
        return out

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [
            TopicRange(os.path.join(self.topic, p), int(p[1:]), int(start[p]), int(end[p]))
            for p in self.parts
            if int(end[p]) > int(start[p])
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TopicRange)
        topic = os.path.basename(os.path.dirname(partition.path))
        with open(partition.path, "rb") as fh:
            for offset, line in enumerate(fh):
                if offset >= partition.end:
                    break
                if offset >= partition.start:
                    yield (None, line.rstrip(b"\n"), topic, partition.partition, offset)

    def commit(self, end: dict[str, int]) -> None:
        """Kafka keeps the log; so does this."""


class KafkaLikeSource(DataSource):
    """``spark.readStream.format("kafka_like").option("path", TOPIC)``; option
    ``maxRecordsPerTrigger``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> TopicReader:
        return TopicReader(self.options)


def register(spark: Any) -> None:
    """Register the source with ``spark``; its workers get these classes by value."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(KafkaLikeSource)
