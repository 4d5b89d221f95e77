"""Spark session set-up, in one place: the session, a job's settings, the JVM's options.

* :func:`create_session` starts (or gets) a SparkSession for the pipeline: the
  Python workers, loopback, the UI off, and on a local master the worker
  daemon of :mod:`.worker_daemon` and, when given, the class archive of
  :mod:`.class_archive`;
* :func:`quick_jit_for` decides when a fresh JVM compiles with C1 only;
* :func:`job_session` gives a job its own child session with
  :data:`JOB_SQL_SETTINGS`, leaving the caller's session as it was;
* :data:`STREAM_SESSION_CONF` is what a session that runs
  ``tickwheel pipeline stream`` sets besides;
* :func:`is_classic`, :func:`default_parallelism` and :func:`set_log_level`:
  what differs between a classic session and a Spark Connect one. The step
  uses only what both offer (DataFrame, SQL and streaming APIs); where a
  classic session has an extra, the session's class decides, never a
  process-wide flag.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .class_archive import java_options, session_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CODEGEN_CACHE_ENTRIES",
    "JOB_SQL_SETTINGS",
    "LOCAL_PYTHON",
    "PARTITION_INPUT_BYTES",
    "QUICK_JIT_MAX_INPUT_BYTES",
    "QUICK_JIT_OPTIONS",
    "STREAM_SESSION_CONF",
    "WORKER_DAEMON",
    "add_remote_argument",
    "check_remote_or_master",
    "connect_session",
    "create_session",
    "default_driver_memory",
    "default_parallelism",
    "is_classic",
    "is_local_master",
    "job_session",
    "local_python",
    "memory_failure",
    "partitions_for",
    "quick_jit_for",
    "set_log_level",
]


def is_classic(spark: SparkSession) -> bool:
    """Whether ``spark`` is a classic session (Py4J to a JVM in this process's reach),
    not a Spark Connect one. O(1).

    Decided by the session's class, so one process may hold both kinds.
    """
    from pyspark.sql.session import SparkSession as ClassicSession

    return isinstance(spark, ClassicSession)


#: Connect sessions' default parallelism, by session id (one small job each).
_PARALLELISM: dict[str, int] = {}


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism for ``spark`` (the cores of a local master). O(1)
    on a classic session; on Spark Connect one small job, the first time per session.

    A Connect client has no ``SparkContext``. A range with no partition count
    takes the default parallelism (``spark.sql.leafNodeDefaultParallelism``
    unset), so its largest partition id tells it.
    """
    if is_classic(spark):
        return int(spark.sparkContext.defaultParallelism)
    session_id = str(getattr(spark, "session_id", id(spark)))
    if session_id not in _PARALLELISM:
        from pyspark.sql import functions as F

        ids = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p"))
        row = ids.agg(F.max("p")).first()
        _PARALLELISM[session_id] = 1 + int(row[0]) if row is not None else 1
    return _PARALLELISM[session_id]


#: Connect sessions' masters, by session id (one call each).
_MASTERS: dict[str, str] = {}


def is_local_master(spark: SparkSession) -> bool:
    """Whether ``spark``'s master is local (``local[N]``): its tasks run as threads of one
    JVM, so spreading a small query over partitions gains no machine, only a
    shuffle. O(1); on Spark Connect one call, the first time per session."""
    if is_classic(spark):
        return str(spark.sparkContext.master).startswith("local")
    session_id = str(getattr(spark, "session_id", id(spark)))
    if session_id not in _MASTERS:
        _MASTERS[session_id] = str(spark.conf.get("spark.master", ""))
    return _MASTERS[session_id].startswith("local")


def set_log_level(spark: SparkSession, level: str) -> None:
    """Set the JVM's log level on a classic session; a Connect server keeps its own. O(1)."""
    if is_classic(spark):
        spark.sparkContext.setLogLevel(level)


#: A batch run on a local master over at most this much input is short enough
#: that the JVM's optimising compiler costs more than it saves (see
#: :func:`quick_jit_for`).
QUICK_JIT_MAX_INPUT_BYTES = 96 * 2**20
QUICK_JIT_OPTIONS = "-XX:TieredStopAtLevel=1"


def quick_jit_for(master: str, input_bytes: int) -> bool:
    """Whether a fresh JVM for a batch run should compile with C1 only. O(1).

    HotSpot compiles hot code twice: quickly (C1), then optimised (C2). On a
    run of a few seconds, C2's compilations are most of the JVM's CPU and
    finish too late to pay back; on a run of a few hundred MB they pay. The
    crossover, :data:`QUICK_JIT_MAX_INPUT_BYTES`, was measured
    (``docs/benchmarks.md``, "Cold start"). A cluster's executors are
    long-lived JVMs, and are left alone.
    """
    return master.startswith("local") and input_bytes <= QUICK_JIT_MAX_INPUT_BYTES


#: Generated classes a session keeps compiled (``spark.sql.codegen.cache.maxEntries``).
#:
#: Spark compiles each query's generated code once and keeps the class in
#: one cache of the JVM, 100 classes by default, least recently used out.
#: The batch job and the stream together come close to that, so other queries
#: in the same session evict their classes, and each run then compiles them
#: again, as does the JVM's JIT (``docs/pipeline-design.md``, "Execution"). A
#: thousand classes hold a few megabytes of bytecode.
CODEGEN_CACHE_ENTRIES = 1000


#: Input per key partition when the caller gives no partition count.
PARTITION_INPUT_BYTES = 64 * 2**20


def partitions_for(input_bytes: int, parallelism: int) -> int:
    """Key partitions for ``input_bytes`` of input: one per :data:`PARTITION_INPUT_BYTES`,
    and at least ``parallelism`` (so every core has a partition). O(1).

    A partition's events go through one Python worker's purgatory, and Spark's
    sorts and shuffles hold a partition's rows at once: sizing partitions by
    the input, not by the cores, keeps that memory flat as the input grows
    (``docs/scaling.md``).
    """
    return max(parallelism, 1, -(-input_bytes // PARTITION_INPUT_BYTES))


def default_driver_memory(total_bytes: int | None = None) -> str:
    """The driver JVM's heap when none is set: a quarter of this machine's memory, at least
    1 GiB and at most 64 GiB, in Spark's notation (``"6144m"``). O(1).

    On a local master the driver JVM is the executor too; the rest of the
    memory is left to the Python workers, the page cache and the system.
    """
    if total_bytes is None:
        total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    mb = min(max(total_bytes // 4 // 2**20, 1024), 64 * 1024)
    return f"{mb}m"


def memory_failure(exc: BaseException, driver_memory: str, partitions: int | None) -> str | None:
    """One line for a run that ran out of memory: what ran out and the option that fixes it;
    None for any other failure. O(len(message)).

    The JVM's ``OutOfMemoryError`` arrives wrapped in a Py4J error with its
    Java stack; a Python worker's ``MemoryError``, or a worker the kernel
    killed, in a Spark task failure; a JVM that died of it leaves Py4J unable
    to connect.
    """
    text = f"{type(exc).__name__}: {exc}"
    split = f"spread the work over more --partitions (it had {partitions or 'the default'})"
    if "java.lang.OutOfMemoryError" in text:
        detail = text.split("java.lang.OutOfMemoryError", 1)[1].splitlines()[0].strip(": ")
        return (
            f"the Spark JVM ran out of memory ({detail or 'OutOfMemoryError'}) with "
            f"--driver-memory {driver_memory}: give it more, or {split}"
        )
    if "MemoryError" in text or "Python worker exited unexpectedly" in text:
        return f"a Python worker ran out of memory: {split}"
    if type(exc).__name__ in ("Py4JNetworkError", "ConnectionRefusedError"):
        return (
            "the Spark JVM is gone (the kernel may have stopped it for want of memory): "
            f"give it less than --driver-memory {driver_memory}, or {split}"
        )
    return None


#: The Python worker daemon of local sessions (see :mod:`.worker_daemon`).
WORKER_DAEMON = "tickwheel.pipeline.spark.worker_daemon"
#: The command that runs ``python -m MODULE`` with the installed PySpark first
#: (``[project.scripts]``; see :func:`.worker_daemon.main`).
LOCAL_PYTHON = "tickwheel-spark-python"


def local_python() -> str:
    """The Python that local sessions start their processes with. O(1).

    :data:`LOCAL_PYTHON` from this environment's scripts directory when it is
    installed there, else this interpreter. Spark starts a Python data
    source's processes (its schema, its offsets, its read planning) as
    ``PYSPARK_PYTHON -m MODULE`` with ``pyspark.zip`` first on the path, and
    no setting names another module, unlike the workers' daemon.
    """
    import sysconfig

    script = os.path.join(sysconfig.get_path("scripts"), LOCAL_PYTHON)
    return script if os.access(script, os.X_OK) else sys.executable


def workers_python(master: str) -> tuple[str, bool]:
    """(the Python Spark's workers run, whether it is this interpreter). O(1).

    ``PYSPARK_PYTHON``, when the user set it to another Python: a cluster's
    workers may have theirs elsewhere (:mod:`.workers` checks it imports
    tickwheel). Otherwise this interpreter; on a local master, through
    :func:`local_python`.
    """
    # Paths, not resolved links: a virtual environment's python links to its base.
    mine = {os.path.abspath(sys.executable), os.path.abspath(local_python())}
    explicit = os.environ.get("PYSPARK_PYTHON")
    if explicit and os.path.abspath(shutil.which(explicit) or explicit) not in mine:
        return explicit, False
    return (local_python() if master.startswith("local") else sys.executable), True


def create_session(
    master: str = "local[2]",
    app_name: str = "tickwheel-pipeline",
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
    quick_jit: bool = False,
    class_archive: str | os.PathLike[str] | None = None,
    driver_memory: str | None = None,
    remote: str | None = None,
) -> SparkSession:
    """Start (or get) a SparkSession set up for the pipeline.

    With ``remote`` (a Spark Connect URL, ``sc://host:port``), connect to that
    server instead (:func:`connect_session`); ``master`` and the JVM's options
    then belong to the server. ``remote="local[N]"`` starts a Connect server of
    its own on that local master, in this process, on a free port of
    127.0.0.1 (as ``SparkSession.builder.remote("local[N]")`` does on port
    15002), set up as a classic session would be, and returns a client of it.

    ``driver_memory`` is the driver JVM's heap (default:
    :func:`default_driver_memory`), as ``spark-submit --driver-memory`` takes it.

    ``quick_jit`` starts the JVM with C1 only (:data:`QUICK_JIT_OPTIONS`; see
    :func:`quick_jit_for`); ``class_archive`` maps a checked class-data
    archive, with the class path it was recorded with (see
    :mod:`.class_archive`). Both have no effect when a JVM is
    already running, and ``spark.driver.extraJavaOptions`` in ``conf``
    replaces them.

    Sets ``PYSPARK_PYTHON`` to this interpreter (else workers fall back to the
    system python) unless it names another one (:func:`workers_python`),
    ``SPARK_LOCAL_IP`` to loopback when unset, turns off the UI and Spark's
    console progress bar, and keeps the log at WARN. On a local
    master the Python processes Spark starts import PySpark from the installed
    package, not from ``pyspark.zip``: the workers' daemon
    (:data:`WORKER_DAEMON`), which spares a fresh daemon compiling PySpark's
    modules, and the processes a Python data source runs in
    (:func:`local_python`), which spares each of them the same.

    It also turns off PySpark's DataFrame call-site capture
    (``spark.python.sql.dataFrameDebugging.enabled``). With it on, every
    DataFrame or Column call made from Python walks the Python stack, tries to
    import IPython, and makes three extra py4j round trips; the pipeline
    builds each micro-batch's plans from hundreds of such calls, and the call
    sites would only point into tickwheel's own code.

    It keeps up to :data:`CODEGEN_CACHE_ENTRIES` generated classes compiled,
    where Spark keeps 100, so that the pipeline's jobs and a caller's other
    queries in the same session do not compile each other's code again.
    """
    if remote is not None and not remote.startswith("local"):
        settings = {**_run_time_settings(shuffle_partitions), **(conf or {})}
        return connect_session(remote, app_name, settings)
    port = None
    if remote is not None:  # "local[N]": a Connect server of its own, set up as below
        master, port = remote, _free_loopback_port()
        conf = {
            **(conf or {}),
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
        }
    builder = _session_builder(
        master, app_name, shuffle_partitions, conf or {}, quick_jit, class_archive, driver_memory
    )
    spark = builder.getOrCreate()
    set_log_level(spark, "WARN")
    return spark if port is None else _client_of_local_server(port)


def _session_builder(
    master: str,
    app_name: str,
    shuffle_partitions: int,
    conf: Mapping[str, str],
    quick_jit: bool,
    class_archive: str | os.PathLike[str] | None,
    driver_memory: str | None,
) -> Any:
    """The builder of :func:`create_session`'s classic session, and the environment
    its JVM and workers start in. O(settings)."""
    python, ours = workers_python(master)
    os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import pyspark
    from pyspark.sql import SparkSession

    # local-cluster and standalone workers are started from SPARK_HOME: the
    # pip package is a complete Spark home.
    os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        .config("spark.driver.memory", driver_memory or default_driver_memory())
        .config("spark.executorEnv.PYSPARK_PYTHON", python)
    )
    jvm_options = [QUICK_JIT_OPTIONS] if quick_jit else []
    jvm_options += java_options(class_archive)
    if jvm_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(jvm_options))
    if class_archive is not None:  # the class path the archive was recorded with
        for name, value in session_conf().items():
            builder = builder.config(name, value)
    if master.startswith("local") and ours:  # workers on this interpreter: see worker_daemon
        builder = builder.config("spark.python.daemon.module", WORKER_DAEMON)
    for name, value in {**_run_time_settings(shuffle_partitions), **conf}.items():
        builder = builder.config(name, value)
    return builder


def _run_time_settings(shuffle_partitions: int) -> dict[str, str]:
    """The SQL settings of :func:`create_session` that a Spark Connect client may set
    too, where the server's static ones are out of its reach. O(1)."""
    return {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.maxRecordsPerBatch": "50000",
    }


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _client_of_local_server(port: int) -> SparkSession:
    """A Connect client to the server that this process's classic session hosts on
    ``port``: what ``SparkSession.builder.remote("local[N]")`` does, on a free port
    instead of Connect's one default port, so that several processes of a machine
    can each have one.

    PySpark's builder refuses a remote URL beside a classic session, so this goes
    to Connect's own builder, and sets the process-wide flag that the builder sets
    after it starts a local server: PySpark's functions are Connect's from now on.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    client = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    return client  # type: ignore[return-value]  # PySpark types both kinds as its one API


def add_remote_argument(parser: Any) -> None:
    """Add ``--remote`` (a Spark Connect URL; default ``SPARK_REMOTE``) to a command. O(1)."""
    parser.add_argument(
        "--remote",
        default=os.environ.get("SPARK_REMOTE") or None,
        metavar="sc://HOST:PORT",
        help="run on the Spark Connect server at this URL (default: SPARK_REMOTE); its "
        "paths are the server's",
    )


def check_remote_or_master(remote: str | None, master: str | None) -> str | None:
    """The message when both a Connect URL and a master are given, else None. O(1)."""
    if remote is not None and master is not None:
        return (
            f"--remote {remote} and --master {master}: give one (a Connect server has its "
            "own master); SPARK_REMOTE counts as --remote"
        )
    return None


def connect_session(url: str, app_name: str, settings: Mapping[str, str]) -> SparkSession:
    """A Spark Connect session to the server at ``url``, with those of ``settings``
    that a client may set. O(settings) round trips.

    A Connect server's static settings (the JVM, its jars, the workers' Python,
    the class cache) are its own, fixed when it started; a client sets only
    SQL settings that may change at run time, and the others are skipped.
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).appName(app_name).getOrCreate()
    for key, value in settings.items():
        if spark.conf.isModifiable(key):
            spark.conf.set(key, value)
    return spark


#: The SQL settings each pipeline job runs with, in its own child session.
#:
#: * No compression of in-memory caches. Both jobs cache frames that are
#:   mostly unique strings (raw record text, ids, keys) for the few Spark jobs
#:   of one run or micro-batch. Compressing a cache first hashes every string
#:   value into a dictionary, 10,000 rows at a time, before it gives up on a
#:   column of unique values. These caches are short-lived, so their CPU
#:   matters more than their size.
#: * No adaptive query execution. The jobs have no joins and set their own
#:   partition counts, so AQE has nothing to re-plan, but it still splits each
#:   query into stages planned one after another, which a cold run pays for.
#: * No byte limit on the Arrow batches sent to the purgatory's Python workers.
#:   Below Spark's "unlimited" value (``Int.MaxValue`` bytes), Spark measures
#:   the batch it is writing after every row, walking the Arrow vectors of the
#:   row's struct. A batch is still bounded by its rows
#:   (``maxRecordsPerBatch``, 50,000: :func:`create_session`), and a purgatory
#:   row holds a rule name, a key, an event id and a type, some megabytes per
#:   batch unless keys are kilobytes long.
JOB_SQL_SETTINGS = {
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647b",
}

#: The settings of the session ``tickwheel pipeline stream`` runs in.
#:
#: Spark writes a stream's offset and commit logs (two small files per
#: micro-batch) through its checkpoint file manager. The default one goes
#: through Hadoop's ``FileContext``, whose local file system looks up a path's
#: link status by running a ``readlink`` process (Hadoop has no native library
#: here), several for every micro-batch. The manager on Hadoop's
#: ``FileSystem`` API reads the same statuses in the JVM. It renames with the
#: file system's own rename, atomic on a local disk, which is where the
#: command's checkpoint is. A SQL setting, read when a query starts; it names
#: a Spark 4.3 class.
#:
#: Each read of a path (a micro-batch's input file, its state) leaves that
#: path's listing in Spark's file status cache, shared by the JVM, which keeps
#: up to 250 MB of them by default, never read again: two ``java.net.URI``, two
#: Hadoop ``Path`` and a ``LocatedFileStatus`` per file read, so a stream's heap
#: grew with every micro-batch. The cache's time-to-live (a static setting: it
#: takes effect in a new JVM only) drops them after a minute.
#:
#: Spark's status store (what its UI and status API show; kept whether the UI
#: runs or not, and it does not run here) holds the last 1,000 jobs, stages and
#: SQL executions by default. At a few of each per micro-batch it fills only
#: after some hundreds of micro-batches, and the heap grows until then: it is
#: kept to the last 100 of each.
STREAM_SESSION_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    "spark.sql.metadataCacheTTLSeconds": "60",
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.sql.ui.retainedExecutions": "100",
}


def job_session(spark: SparkSession, settings: Mapping[str, str] | None = None) -> SparkSession:
    """A child of ``spark`` for one job: ``spark``'s SQL settings plus ``settings``.

    The child shares the SparkContext and the cache, and copies every SQL
    setting of ``spark`` that can be changed at run time; ``settings`` (default
    :data:`JOB_SQL_SETTINGS`) are applied on top. The caller's session is never
    changed, so a job's settings cannot leak into it or race with its other
    threads. O(settings).
    """
    child = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if key.startswith("spark.sql.") and spark.conf.isModifiable(key):
            child.conf.set(key, value)
    for key, value in (JOB_SQL_SETTINGS if settings is None else settings).items():
        child.conf.set(key, value)
    return child
