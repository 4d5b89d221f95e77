"""Each micro-batch's figures in Spark's ``StreamingQueryProgress``: a companion query.

Spark fills ``StreamingQueryProgress.observedMetrics`` from the ``observe``
nodes of a streaming query's own plan, evaluated over the rows its source
gives. The step runs inside ``foreachBatch`` on plans of its own, and its
figures (expirations, pending operations, the watermark) exist only once the
micro-batch has run; no node of the user's query ever sees them. So, with
``start_stream(..., progress_metrics=True)``, each micro-batch's figures go
where a streaming query can read them, and a second query reads them:

1. the ``foreachBatch`` runner, after the commit, writes one small JSON file
   per micro-batch to a spool directory (:class:`ProgressSpool`) on the host
   that runs it: the driver's, or the Spark Connect server's;
2. the companion query reads the spool through :class:`ProgressSource` (a
   Python data source whose reader runs on that same host): each of its
   micro-batches takes every figure waiting, and Spark's ``observe`` sums
   them under :data:`OBSERVATION`;
3. Spark posts the companion's ``StreamingQueryProgress`` to every
   ``StreamingQueryListener``: ``event.progress.observedMetrics["tickwheel"]``
   is a row of :data:`REPORT`, covering the micro-batches of the user's query
   since the previous one, each also on its own in ``micro_batches``.

The companion is named ``tickwheel progress of <query id>``, writes to
Spark's ``noop`` sink with a temporary checkpoint, triggers every
:data:`TRIGGER_INTERVAL` (so it keeps up with a query of any pace, at one
micro-batch of its own a trigger at most), and stops once it has read what
the user's query left when that one ends. The spool is not state: a figure
the companion has not read when the job dies is gone (the micro-batch's
``commits/N.json`` keeps its counts).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from .micro_batch import GAUGES

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "COMPANION_PREFIX",
    "COUNTERS",
    "GAUGES",
    "OBSERVATION",
    "REPORT",
    "SPOOLED",
    "ProgressSource",
    "ProgressSpool",
    "start_progress_query",
]

#: The name of the companion's observation in ``observedMetrics``.
OBSERVATION = "tickwheel"

#: What a micro-batch counted: new events kept, duplicate copies dropped,
#: records rejected for any reason, valid records older than the watermark,
#: operations completed, expired and cancelled. A report sums them.
COUNTERS = ("events", "duplicates", "rejected", "late", "completed", "expired", "cancelled")

#: :data:`~.micro_batch.GAUGES`, what holds after a micro-batch: the operations
#: pending, the watermark (epoch ms; null before the first event). A report gives
#: the last micro-batch's.

#: One micro-batch's figures, as the runner spools them (all integers).
SPOOLED = ("batch_id", *COUNTERS, *GAUGES)

#: The observed row's fields: the user's query's id (a string); ``batch_id``,
#: the last micro-batch it covers, and ``batches``, how many; the
#: :data:`COUNTERS` summed over them and the :data:`GAUGES` of the last; and
#: ``micro_batches``, each one's :data:`SPOOLED` figures. A report with
#: ``batches`` 0 covers none, its other figures null: Spark runs a new query's
#: first micro-batch even with nothing to read.
REPORT = ("query_id", "batch_id", "batches", *COUNTERS, *GAUGES, "micro_batches")

SOURCE_NAME = "tickwheel_progress"

#: The companion's name, before the id of the query it reports.
COMPANION_PREFIX = "tickwheel progress of "

#: How often the companion looks at the spool: a figure appears at most this
#: long after its micro-batch commits (plus the companion's own micro-batch).
TRIGGER_INTERVAL = "1 second"

#: At most this many micro-batches' figures in one report (one read of the spool).
MAX_PER_READ = 1000


class ProgressSpool:
    """The directory where micro-batches leave their figures, one file each.

    Named by ``token``, and placed in the temporary directory of the process
    that uses it: the runner and the source's reader both run on the host of
    Spark's driver (under Spark Connect, the server's), where the client may
    not have the same temporary directory. A file appears whole (written
    under a hidden name, then renamed) and is named by its batch id.
    """

    def __init__(self, token: str) -> None:
        """O(1): the directory is made on the first write."""
        self.token = token

    @property
    def path(self) -> str:
        """The directory, in this process's temporary directory. O(1)."""
        return os.path.join(tempfile.gettempdir(), "tickwheel-progress", self.token)

    def write(self, batch_id: int, figures: Mapping[str, Any]) -> None:
        """Leave micro-batch ``batch_id``'s ``figures`` (by the names of :data:`SPOOLED`;
        a missing one is null). O(1)."""
        directory = self.path
        os.makedirs(directory, exist_ok=True)
        hidden = os.path.join(directory, f".{batch_id}.json.tmp")
        row = {**{name: figures.get(name) for name in SPOOLED}, "batch_id": batch_id}
        with open(hidden, "w", encoding="utf-8") as fh:
            json.dump(row, fh)
        os.replace(hidden, os.path.join(directory, f"{batch_id}.json"))

    def batch_ids(self) -> list[int]:
        """The batch ids whose figures wait, in order. O(files)."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(int(name[:-5]) for name in names if name.endswith(".json"))

    def read(self, batch_id: int) -> tuple[Any, ...]:
        """Micro-batch ``batch_id``'s figures, as a row of :data:`SPOOLED`. O(1)."""
        with open(os.path.join(self.path, f"{batch_id}.json"), encoding="utf-8") as fh:
            figures = json.load(fh)
        return tuple(figures.get(name) for name in SPOOLED)

    def forget_through(self, batch_id: int) -> None:
        """Delete the figures of the batches up to ``batch_id``. O(files)."""
        for waiting in self.batch_ids():
            if waiting <= batch_id:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.path, f"{waiting}.json"))

    def remove(self) -> None:
        """Delete the spool and whatever waits in it. O(files)."""
        self.forget_through(2**63 - 1)
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


class ProgressReader(SimpleDataSourceStreamReader):
    """The figures waiting in the spool, at most :data:`MAX_PER_READ` a read, in batch
    order; the offset is the last one's batch id."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.spool = ProgressSpool(options["spool"])

    def initialOffset(self) -> dict[str, int]:
        return {"batch": -1}

    def _waiting(self, after: int, through: int | None = None) -> list[int]:
        """The batch ids in the spool after ``after`` (up to ``through``), at most
        :data:`MAX_PER_READ` of them. O(files)."""
        ids = [b for b in self.spool.batch_ids() if b > after and (through is None or b <= through)]
        return ids[:MAX_PER_READ]

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        waiting = self._waiting(int(start["batch"]))
        if not waiting:
            return iter([]), start
        return iter([self.spool.read(b) for b in waiting]), {"batch": waiting[-1]}

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[tuple[Any, ...]]:
        """A replay of the companion's micro-batch: what is still in the spool."""
        waiting = self._waiting(int(start["batch"]), int(end["batch"]))
        return iter([self.spool.read(b) for b in waiting])

    def commit(self, end: dict[str, int]) -> None:
        self.spool.forget_through(int(end["batch"]))

    def stop(self) -> None:
        self.spool.remove()


class ProgressSource(DataSource):
    """``spark.readStream.format("tickwheel_progress").option("spool", TOKEN)``: the
    figures a :class:`ProgressSpool` holds, as rows of :data:`SPOOLED` (all longs)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return ", ".join(f"{name} long" for name in SPOOLED)

    def simpleStreamReader(self, schema: Any) -> ProgressReader:
        return ProgressReader(self.options)


def start_progress_query(
    spark: SparkSession, query_id: str, spool: ProgressSpool
) -> StreamingQuery:
    """Start the companion query that reports what ``spool`` receives. O(1) Spark calls."""
    from pyspark.sql import functions as F

    spark.dataSource.register(ProgressSource)
    figures = spark.readStream.format(SOURCE_NAME).option("spool", spool.token).load()
    last = F.col("batch_id")
    report: list[Column] = [
        F.lit(query_id).alias("query_id"),
        F.max(last).alias("batch_id"),
        F.count(F.lit(1)).alias("batches"),
        *[F.sum(name).alias(name) for name in COUNTERS],
        *[F.max_by(name, last).alias(name) for name in GAUGES],
        F.collect_list(F.struct(*SPOOLED)).alias("micro_batches"),
    ]
    writer = figures.observe(OBSERVATION, *report).writeStream.format("noop")
    writer = writer.queryName(f"{COMPANION_PREFIX}{query_id}")
    return writer.trigger(processingTime=TRIGGER_INTERVAL).start()
