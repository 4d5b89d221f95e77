"""The stream's query, started and watched: the one assembly that both drivers use
(:func:`~.start.start_stream` and :class:`~.file_job.FileStreamJob`).

:func:`before_first_batch` checks what a micro-batch could only fail on late;
:func:`start_query` puts the step on ``foreachBatch`` of a source with a sink,
a checkpoint and a trigger; the :class:`RunningStream` it returns ends the
query's hold on the checkpoint, from a listener (:meth:`~RunningStream.release_when_done`)
or in the caller's thread (:meth:`~RunningStream.wait`). Where this sits in the
protocol: ``docs/pipeline-design.md``, "One micro-batch".
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..rules import Rules
from ..spark.workers import check_workers
from .changelog import end_held_state
from .checkpoint import CheckpointFenced, StateStore, StreamError, checkpoint_of, spark_checkpoint
from .evolution import StateAdjustment, check_rules_change
from .resident import HeldState
from .runner import BatchInputs, BatchRunner, MicroBatches, StreamStep

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from ..sinks import BatchSink

__all__ = [
    "QUERY_POLL_S",
    "RunningStream",
    "before_first_batch",
    "parse_trigger",
    "start_query",
    "when_inactive",
    "with_trigger",
]

#: Seconds between two looks at whether a Spark Connect query is still active
#: (:func:`when_inactive`): its checkpoint is released at most this long after it ends.
QUERY_POLL_S = 1.0


def parse_trigger(text: str) -> tuple[str, int | None]:
    """Parse ``once``, ``available-now`` or ``interval=30s`` into (kind, interval ms). O(1)."""
    from ..rules import parse_duration

    if text in ("once", "available-now"):
        return text, None
    if text.startswith("interval="):
        ms = parse_duration(text[len("interval=") :], "--trigger interval")
        if ms <= 0:
            raise StreamError("--trigger interval must be positive")
        return "interval", ms
    raise StreamError(f"--trigger: expected once, available-now or interval=30s, got {text!r}")


def with_trigger(writer: DataStreamWriter, trigger: str | None) -> DataStreamWriter:
    """``writer`` with ``trigger`` (:func:`parse_trigger`'s text; None: Spark's default)."""
    if trigger is None:
        return writer
    kind, interval_ms = parse_trigger(trigger)
    if kind == "once":
        return writer.trigger(once=True)
    if kind == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{interval_ms} milliseconds")


def before_first_batch(
    spark: SparkSession,
    store: StateStore,
    rules: Rules,
    *,
    input_format: str | None,
    drop_incompatible_state: bool,
) -> StateAdjustment | None:
    """What both drivers check before their query starts (a failure inside a micro-batch
    is a long trace): the workers run this tickwheel, the state's format is one this
    release reads, and the rules' changes apply (:mod:`.evolution`). Returns what the
    first batch drops from the state. Then, once nothing refused the run, a job that
    took the checkpoint over from a predecessor fences it
    (:meth:`~.checkpoint.StateStore.fence`): a predecessor that froze may still run."""
    check_workers(spark)
    store.check_format()
    adjustment = check_rules_change(
        store, rules, spark, input_format=input_format,
        drop_incompatible_state=drop_incompatible_state,
    )  # fmt: skip
    if store.token is not None and store.token > 1:  # a predecessor held it before
        store.fence()
    return adjustment


def start_query(
    source: DataFrame,
    step: StreamStep,
    sink: BatchSink,
    store: StateStore,
    trigger: str | None,
    *,
    inputs: BatchInputs,
    held: HeldState | None = None,
    progress_metrics: bool = False,
    record_driver_jvm: bool = False,
) -> RunningStream:
    """Start the stream's query: ``source``'s micro-batches through ``step`` into
    ``sink``, committed in the checkpoint whose taken ``store`` is given
    (:func:`~.checkpoint.take_checkpoint`), under ``trigger``.

    Parameters
    ----------
    source
        The streaming frame ``foreachBatch`` receives (any source).
    step, sink, store, trigger
        What each micro-batch runs, where its outputs go, the checkpoint, and
        the trigger (:func:`parse_trigger`'s text; None: Spark's default).
    inputs
        What the driver makes of the frame Spark hands over for a batch id: its
        records and write-ahead plan.
    held
        The holder of the state between micro-batches (default: a new one).
    progress_metrics
        Each micro-batch's figures in Spark's progress, through a companion
        query (:mod:`.progress`).
    record_driver_jvm
        Record the JVM of this driver in the owner's record, and first wait for
        a killed predecessor's JVM on this host
        (:meth:`~.checkpoint.CheckpointOwner.write_owner`): for a driver that
        started its JVM itself (the command line).

    Returns
    -------
    RunningStream
        The query, started; the caller ends its hold on the checkpoint through
        it. A failure to start stops what had started.
    """
    from .progress import new_spool, start_progress_query

    if record_driver_jvm:
        _record_driver_jvm(source.sparkSession, store)
    spool = new_spool() if progress_metrics else None
    held = held if held is not None else HeldState()
    runner = BatchRunner(
        store, sink, MicroBatches(store, sink, step, inputs, held),
        publish=spool.write if spool is not None else None,
    )  # fmt: skip
    writer = source.writeStream.foreachBatch(runner).option(
        "checkpointLocation", spark_checkpoint(checkpoint_of(store.root))
    )
    query = with_trigger(writer, trigger).start()
    try:
        companion = (
            None
            if spool is None
            else start_progress_query(source.sparkSession, str(query.id), spool)
        )
    except BaseException:
        query.stop()
        raise
    return RunningStream(source.sparkSession, query, store, held, runner, companion)


def _record_driver_jvm(spark: SparkSession, store: StateStore) -> None:
    """The owner's record of this driver's JVM (none for a Connect client)."""
    from ..spark.session import is_classic

    jvm_pid = None
    if is_classic(spark):  # a Connect client has no JVM of its own to wait for
        with contextlib.suppress(Exception):
            jvm = spark.sparkContext._jvm
            assert jvm is not None
            jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    assert store.owner is not None
    store.owner.write_owner(jvm_pid)


@dataclass
class RunningStream:
    """A started stream query, and what ends its hold on the checkpoint."""

    spark: SparkSession
    query: StreamingQuery
    store: StateStore
    held: HeldState
    runner: BatchRunner
    companion: StreamingQuery | None = None

    def wait(self) -> None:
        """Wait for the query to end in this thread (the command line's job), then stop
        its companion and write the state held whole (:func:`~.changelog.end_held_state`).
        A fenced job raises :class:`~.checkpoint.CheckpointFenced` in one message."""
        from .progress import drain_and_stop

        try:
            self.query.awaitTermination()
        except Exception as exc:  # a fenced job says so in one message, not a trace
            fenced = CheckpointFenced.found_in(exc)
            if fenced is None:
                raise
            raise fenced from None
        finally:
            if self.query.isActive:
                self.query.stop()
            if self.companion is not None:
                drain_and_stop(self.companion)
        end_held_state(self.store, self.held)

    def release_when_done(self) -> None:
        """Release the checkpoint when the query terminates, however it ends (the library
        caller, who has the query). A classic session tells a listener, which first
        writes a state held in the driver whole; under Spark Connect a daemon thread
        polls ``query.isActive`` instead (:func:`when_inactive` says why); then the
        companion (:mod:`.progress`) reads what is left and stops."""
        from ..spark.session import is_classic

        owner, query = self.store.owner, self.query
        assert owner is not None
        owner.in_use = lambda: bool(query.isActive)
        spark = self.spark
        if not is_classic(spark):
            when_inactive(lambda: bool(query.isActive), self._after_connect_query)
            return
        _when_terminated(spark, query, self._after_classic_query)

    def _after_connect_query(self, session_gone: bool) -> None:
        from .progress import drain_and_stop

        assert self.store.owner is not None
        self.store.owner.release()
        if self.companion is not None and not session_gone:
            with contextlib.suppress(Exception):  # the session may stop meanwhile
                drain_and_stop(self.companion)

    def _after_classic_query(self) -> None:
        from .progress import drain_and_stop

        # A listener's thread must not run Spark jobs: a partitioned state goes unwritten.
        end_held_state(self.store, self.held, driver_only=True)
        assert self.store.owner is not None
        self.store.owner.release()
        if self.companion is not None:
            # Spark Connect calls listeners holding a lock that the companion's
            # calls need: wait for it from another thread.
            threading.Thread(target=drain_and_stop, args=(self.companion,), daemon=True).start()


def _when_terminated(spark: SparkSession, query: StreamingQuery, then: Callable[[], None]) -> None:
    """Call ``then`` once when ``query`` terminates, from a ``StreamingQueryListener``
    (or at once if it ended before the listener was in place)."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    ended = threading.Lock()

    def once() -> None:
        if ended.acquire(blocking=False):  # the listener and the check below may both call
            then()

    class Release(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if str(event.id) == str(query.id):
                once()
                # Spark Connect's client calls listeners holding the lock that
                # removeListener takes: remove it from another thread.
                threading.Thread(
                    target=spark.streams.removeListener, args=(self,), daemon=True
                ).start()

    spark.streams.addListener(Release())
    if not query.isActive:  # ended before the listener was in place
        once()


def when_inactive(
    is_active: Callable[[], bool],
    then: Callable[[bool], None],
    *,
    interval_s: float = QUERY_POLL_S,
) -> threading.Event:
    """Call ``then`` once, from a daemon thread, when ``is_active()`` says False (``then(False)``)
    or raises (``then(True)``: the session is gone); ``is_active`` is asked every
    ``interval_s``. The event returned stops the watch; the interpreter's exit sets it.

    Under Spark Connect this takes the place of a ``StreamingQueryListener``: pyspark's
    client keeps a listener's events on a thread that reads a server stream, and a
    session stopped while that stream is open (a script that stops its session right
    after its query ended, before the listener removed itself) ends that thread with
    the warning ``StreamingQueryListenerBus Handler thread received exception`` (the
    channel closed, or "cannot schedule new futures after shutdown"). A poll holds no
    stream open: a stopped session only makes the next look raise. O(1) a look.
    """
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                active = bool(is_active())
            except Exception:  # the session was stopped: its queries with it
                if not stop.is_set():
                    then(True)
                return
            if not active:
                then(False)
                return
            stop.wait(interval_s)

    atexit.register(stop.set)  # no look while the interpreter shuts down
    threading.Thread(target=watch, name="tickwheel-query-watch", daemon=True).start()
    return stop
