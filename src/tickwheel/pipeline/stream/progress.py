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

What a job killed without a clean stop leaves (SIGKILL: no listener fires):

* its spool directory. Each spool records its owner, the process that made
  it (the one that runs ``foreachBatch``), in ``owner.json`` (pid and host),
  and a new spool's creation first removes every spool whose owner was on
  this host and is gone (:func:`remove_stale_spools`); a live owner's spool,
  and one without an owner file (an older release's), are kept.
* under Spark Connect, its companion: the client that would have stopped it
  is gone, but both queries run on in the server. So the companion's reader
  stops the companion itself, by raising :class:`SpoolOwnerGone` (the query
  fails with that message, and its source's ``stop`` removes the spool),
  when nothing waits in the spool and the spool's owner has been gone for
  :data:`ORPHAN_GRACE_S`. The owner's life is the user's query's, on both
  kinds of session, without a Spark call from the reader (whose Python
  worker has no session): on a classic session the owner is the driver's
  Python process, whose death ends the JVM and both queries; under Spark
  Connect it is the ``foreachBatch`` worker beside the server, which the
  server ends when the user's query terminates, however it ends. The grace
  leaves the clean stop (:func:`drain_and_stop`, which reads what is
  left and stops the companion) to the client when there is one. Not
  covered: a user query that ended before its first micro-batch made the
  spool leaves no owner to watch.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from .checkpoint import pid_alive
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
    "SpoolOwnerGone",
    "drain_and_stop",
    "new_spool",
    "remove_stale_spools",
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

#: Seconds the companion goes on after its spool's owner is gone with nothing left
#: to read, before it stops itself (:class:`SpoolOwnerGone`); the reader's option
#: ``orphan_grace_s`` overrides it.
ORPHAN_GRACE_S = 30.0

#: The file in each spool that names its owner: ``{"pid": ..., "host": ...}``.
OWNER_FILE = "owner.json"


class SpoolOwnerGone(RuntimeError):
    """The process that filled a spool is gone without a clean stop: its companion stops."""


def _spools_root() -> str:
    return os.path.join(tempfile.gettempdir(), "tickwheel-progress")


def _read_owner(directory: str) -> dict[str, Any] | None:
    """The owner a spool directory records, or None (none, or unreadable). O(1)."""
    try:
        with open(os.path.join(directory, OWNER_FILE), encoding="utf-8") as fh:
            owner = json.load(fh)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _owner_gone(owner: Mapping[str, Any] | None) -> bool:
    """Whether ``owner`` was a process on this host that no longer exists. O(1)."""
    if owner is None or owner.get("host") != socket.gethostname():
        return False
    pid = owner.get("pid")
    return isinstance(pid, int) and not pid_alive(pid)


def remove_stale_spools(root: str | None = None) -> list[str]:
    """Delete the spools in ``root`` (default: this process's) whose owner was on this
    host and is gone; return their names. A spool whose owner lives, or that names no
    owner, is kept. O(spools)."""
    root = root or _spools_root()
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    removed = []
    for name in names:  # hidden ones too: a creation that was killed halfway
        directory = os.path.join(root, name)
        if os.path.isdir(directory) and _owner_gone(_read_owner(directory)):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(name)
    return removed


class ProgressSpool:
    """The directory where micro-batches leave their figures, one file each.

    Named by ``token``, and placed in the temporary directory of the process
    that uses it: the runner and the source's reader both run on the host of
    Spark's driver (under Spark Connect, the server's), where the client may
    not have the same temporary directory. A file appears whole (written
    under a hidden name, then renamed) and is named by its batch id. The
    directory appears with its :data:`OWNER_FILE` (made hidden, then
    renamed), after the stale spools are removed (:func:`remove_stale_spools`).
    """

    def __init__(self, token: str) -> None:
        """O(1): the directory is made on the first write."""
        self.token = token

    @property
    def path(self) -> str:
        """The directory, in this process's temporary directory. O(1)."""
        return os.path.join(_spools_root(), self.token)

    def _create(self) -> None:
        """Make the directory, owned by this process, after removing stale spools.
        O(spools)."""
        root = _spools_root()
        os.makedirs(root, exist_ok=True)
        remove_stale_spools(root)
        hidden = tempfile.mkdtemp(prefix=f".{self.token}.", dir=root)
        try:
            with open(os.path.join(hidden, OWNER_FILE), "w", encoding="utf-8") as fh:
                json.dump({"pid": os.getpid(), "host": socket.gethostname()}, fh)
            try:
                os.rename(hidden, self.path)
            except OSError:
                if not os.path.isdir(self.path):
                    raise
        finally:
            if os.path.isdir(hidden):  # made meanwhile by another process: theirs stands
                shutil.rmtree(hidden, ignore_errors=True)

    def owner(self) -> dict[str, Any] | None:
        """The process that made the spool (``pid``, ``host``), or None. O(1)."""
        return _read_owner(self.path)

    def owner_gone(self) -> bool:
        """Whether the spool's owner was on this host and is gone. O(1)."""
        return _owner_gone(self.owner())

    def write(self, batch_id: int, figures: Mapping[str, Any]) -> None:
        """Leave micro-batch ``batch_id``'s ``figures`` (by the names of :data:`SPOOLED`;
        a missing one is null). O(1), and O(spools) the first time."""
        directory = self.path
        if not os.path.isdir(directory):
            self._create()
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
        return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())

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
        """Delete the spool, its owner file and whatever waits in it. O(files)."""
        shutil.rmtree(self.path, ignore_errors=True)


class ProgressReader(SimpleDataSourceStreamReader):
    """The figures waiting in the spool, at most :data:`MAX_PER_READ` a read, in batch
    order; the offset is the last one's batch id."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.spool = ProgressSpool(options["spool"])
        self.grace_s = float(options.get("orphan_grace_s", ORPHAN_GRACE_S))
        self._gone_since: float | None = None

    def _stop_if_orphaned(self) -> None:
        """Raise :class:`SpoolOwnerGone` once the spool's owner has been gone for
        :attr:`grace_s` (called when nothing waits). O(1)."""
        if not self.spool.owner_gone():
            self._gone_since = None
            return
        now = time.monotonic()
        if self._gone_since is None:
            self._gone_since = now
        if now - self._gone_since >= self.grace_s:
            owner = self.spool.owner() or {}
            raise SpoolOwnerGone(
                f"tickwheel progress: the query that filled spool {self.spool.path} (pid "
                f"{owner.get('pid')} on {owner.get('host')}) is gone without a clean stop; "
                "its companion stops"
            )

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
            self._stop_if_orphaned()
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


def new_spool() -> ProgressSpool:
    """A new spool for one query's figures, under a token of its own. O(1)."""
    import uuid

    return ProgressSpool(uuid.uuid4().hex)


def drain_and_stop(companion: StreamingQuery) -> None:
    """Let ``companion`` read what its spool holds, then stop it. Bounded by its own
    micro-batches: a failed companion raises at once."""
    with contextlib.suppress(Exception):  # a failed companion is stopped all the same
        companion.processAllAvailable()
    companion.stop()
