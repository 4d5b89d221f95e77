"""Whether Spark's Python workers can run tickwheel: the same release as the driver's.

The step runs Python in the executors (the purgatory), where Spark starts the
interpreter that ``PYSPARK_PYTHON`` (``spark.pyspark.python``) names, else
``python3`` on the workers' ``PATH``. Without this check, a worker that cannot
import tickwheel fails deep inside the first job that needs it, in a long
Py4J/JVM trace; one that imports another release would go unnoticed.

Two ways to check, with the same messages (:class:`WorkersError`):

* :func:`check_workers` runs one small job first, once per Spark application
  (Connect: once per session): a plain Python UDF, pickled by value so that
  it needs nothing of tickwheel to be unpickled, that reports each worker's
  interpreter and tickwheel release. The library's callers and the stream
  use it: their first job with Python is out of the step's hands.
* The batch job (:func:`checked_by_the_job`) runs no job of its own: the check
  rides on its first job that runs Python on the workers anyway, the
  purgatory. Each partition's function is :func:`guarded`: on the worker, it
  imports tickwheel and compares the release before it unpickles the
  partition's own function (which needs tickwheel); a worker that fails
  gives one row of kind :data:`REPORT_KIND` instead of the partition's rows,
  and :meth:`JobCheck.after_first_python_job` raises the error before
  anything is written: one small job over the purgatory's persisted rows. A
  fresh application's cold job then pays no probe of its own, whose query was
  the first a cold JVM planned and whose Python worker started before the
  first stage could run (``benchmarks/bench_pipeline_cold.py``). A worker that
  cannot even run the purgatory's Arrow function (no pyarrow, another Python
  version) fails that job before the guard; the probe then says why.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "REPORT_KIND",
    "JobCheck",
    "WorkersError",
    "check_workers",
    "checked_by_the_job",
    "guarded",
]

T = TypeVar("T")

#: Partitions of the probe: enough to reach a few executors, small enough to cost
#: one short job (a worker reports once per distinct interpreter and release).
PROBE_PARTITIONS = 8

#: The probe's source: compiled into a module that does not exist anywhere, so that
#: cloudpickle ships the function by value and a worker unpickles it without tickwheel.
_PROBE_SOURCE = """
def probe(_row_id):
    import json, sys
    try:
        import tickwheel
        return json.dumps({"python": sys.executable, "version": tickwheel.__version__})
    except Exception as exc:
        return json.dumps({"python": sys.executable, "error": f"{type(exc).__name__}: {exc}"})
"""

#: The ``kind`` of the row a guarded partition gives instead of its own rows when
#: its worker cannot run the driver's tickwheel; the report is JSON in ``stats``.
REPORT_KIND = "workers"

#: The guard's source, shipped by value as the probe is. ``payload`` is the
#: partition's function, pickled on the driver: a worker unpickles it (which
#: imports tickwheel) only once the check has passed. ``columns`` are the
#: output's (name, ``string``/``long``/``binary``/``boolean``); with ``report`` false, a
#: worker that fails raises instead of giving the report row.
_GUARD_SOURCE = """
def guard(version, payload, columns, report):
    def run(batches):
        import json, sys
        try:
            import tickwheel
            found = {"python": sys.executable, "version": tickwheel.__version__}
        except Exception as exc:
            found = {"python": sys.executable, "error": f"{type(exc).__name__}: {exc}"}
        if found.get("version") == version:
            import pickle
            yield from pickle.loads(payload)(batches)
            return
        if not report:
            raise RuntimeError(
                f"Spark's Python workers cannot run tickwheel {version}: {json.dumps(found)}"
            )
        import pyarrow as pa
        types = {"string": pa.string(), "long": pa.int64(), "binary": pa.binary(),
                 "boolean": pa.bool_()}  # fmt: skip
        given = {"kind": "workers", "stats": json.dumps(found).encode()}
        yield pa.record_batch(
            [pa.array([given.get(name)], types[kind]) for name, kind in columns],
            names=[name for name, _ in columns],
        )
    return run
"""

#: Applications (classic) and sessions (Connect) whose workers passed, this process.
_CHECKED: set[str] = set()


class _Deferred(threading.local):
    """The session whose check this thread's job makes itself (:func:`checked_by_the_job`)."""

    key: str | None = None


_DEFERRED = _Deferred()


class WorkersError(RuntimeError):
    """Spark's Python workers cannot run this tickwheel."""


def _by_value(source: str, module: str, name: str) -> Any:
    """The function ``name`` of ``source``, compiled into a module that exists nowhere."""
    namespace: dict[str, Any] = {"__name__": module}
    exec(compile(source, f"<{module}>", "exec"), namespace)
    return namespace[name]


def _probe() -> Any:
    return _by_value(_PROBE_SOURCE, "tickwheel_worker_probe", "probe")


def guarded(function: Callable[..., Any], columns: Sequence[tuple[str, str]]) -> Any:
    """``function`` (a ``mapInArrow`` function) behind the workers' check. O(its pickle).

    On the worker, the returned function imports tickwheel and compares its
    release with this process's before it unpickles and runs ``function``.
    ``columns`` are the output's, (name, ``string``, ``long`` or ``binary``),
    among them ``kind`` (string) and ``stats`` (binary). A worker that fails
    gives one row of kind :data:`REPORT_KIND`, its report as JSON in
    ``stats``, when this thread runs a job that checks it afterwards
    (:func:`checked_by_the_job`); otherwise it raises, naming what it found
    (the caller checked the workers first, with :func:`check_workers`: only a
    worker that joined since gets there).
    """
    from pyspark import cloudpickle

    from ... import __version__

    guard = _by_value(_GUARD_SOURCE, "tickwheel_worker_guard", "guard")
    payload = cloudpickle.dumps(function)  # type: ignore[no-untyped-call]
    return guard(__version__, payload, tuple(columns), _DEFERRED.key is not None)


def _session_key(spark: SparkSession) -> str:
    from .session import is_classic

    if is_classic(spark):
        return f"app:{spark.sparkContext.applicationId}"
    return f"connect:{getattr(spark, 'session_id', id(spark))}"


def _configured_python(spark: SparkSession) -> str:
    """The interpreter this session starts its workers with, as far as the client knows."""
    import os

    from .session import is_classic

    if is_classic(spark):  # what PySpark ships with each Python function
        return str(spark.sparkContext.pythonExec)
    return os.environ.get("PYSPARK_PYTHON") or "python3 (the workers' PATH)"


def _advice(spark: SparkSession) -> str:
    from ... import __version__

    return (
        f"Install tickwheel {__version__} (the same wheel as the driver's) in the workers' "
        "Python on every node, or point Spark at a Python that has it: set PYSPARK_PYTHON="
        "/path/to/python in the environment before the session starts (spark-submit also "
        'takes spark.pyspark.python); see docs/pipeline.md, "Installing tickwheel where '
        f'Spark runs Python". The workers run {_configured_python(spark)}.'
    )


def check_workers(spark: SparkSession) -> None:
    """Raise :class:`WorkersError` unless every probed worker imports this tickwheel.

    One Spark job of :data:`PROBE_PARTITIONS` one-row tasks, the first time
    per application (classic) or session (Connect) in this process; O(1)
    afterwards, and in a job that checks the workers itself
    (:func:`checked_by_the_job`). The message names the workers' interpreter,
    what failed, and how to set ``PYSPARK_PYTHON`` or install tickwheel on the
    cluster.
    """
    key = _session_key(spark)
    if key in _CHECKED or _DEFERRED.key == key:
        return
    _probe_workers(spark)
    _CHECKED.add(key)


def _probe_workers(spark: SparkSession) -> None:
    """The probe's job (see :func:`check_workers`); raises :class:`WorkersError`."""
    from pyspark.sql import functions as F

    probe = F.udf(_probe(), "string", useArrow=False)  # a pickled UDF needs no pyarrow
    frame = spark.range(0, PROBE_PARTITIONS, 1, PROBE_PARTITIONS).select(probe("id").alias("r"))
    try:
        reports = [json.loads(row["r"]) for row in frame.distinct().collect()]
    except Exception as exc:  # the worker did not start, or could not run the probe
        cause = _first_line(str(exc))
        raise WorkersError(
            f"Spark's Python workers could not run tickwheel's check ({cause}). " + _advice(spark)
        ) from None
    _raise_for(spark, reports)


def _raise_for(spark: SparkSession, reports: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`WorkersError` for the first report of a worker that cannot run this
    tickwheel (``python`` and ``error``, or ``python`` and ``version``). O(reports)."""
    from ... import __version__

    for report in reports:
        if "error" in report:
            raise WorkersError(
                f"Spark's Python workers cannot import tickwheel: {report['python']} says "
                f"{report['error']}. " + _advice(spark)
            )
        if report["version"] != __version__:
            raise WorkersError(
                f"Spark's Python workers run tickwheel {report['version']} "
                f"({report['python']}), the driver {__version__}: the state and the rows "
                "they write must come from one release. " + _advice(spark)
            )


class JobCheck:
    """The workers' check of one job that makes it itself (:func:`checked_by_the_job`)."""

    def __init__(self, spark: SparkSession, key: str) -> None:
        self.spark, self.key = spark, key

    @property
    def done(self) -> bool:
        """Whether this application's (session's) workers passed already. O(1)."""
        return self.key in _CHECKED

    def after_first_python_job(
        self, action: Callable[[], T], rows: Callable[[], DataFrame], ran: Callable[[T], bool]
    ) -> T:
        """Run ``action``, the job's first action that runs Python on the workers, and check
        what they reported, before anything is written; return what ``action`` returns.

        ``rows`` gives the rows of the :func:`guarded` partitions (persisted by
        ``action``): their report rows are read in one small job. ``ran`` tells
        from ``action``'s result whether any partition ran Python (none may have:
        no event, no partition); only then have the workers passed. Should
        ``action`` fail, the probe of :func:`check_workers` runs: a worker that
        cannot run the partitions' function at all (no pyarrow, another Python)
        fails before the guard, and the probe names it; otherwise ``action``'s
        own error is raised. Raises :class:`WorkersError`.
        """
        if self.done:
            return action()
        try:
            result = action()
        except Exception:
            self._probe_after_failure()
            raise
        reports = rows().where(f"kind = '{REPORT_KIND}'").select("stats").collect()
        _raise_for(self.spark, [json.loads(bytes(row["stats"])) for row in reports])
        if ran(result):
            _CHECKED.add(self.key)
        return result

    def _probe_after_failure(self) -> None:
        previous, _DEFERRED.key = _DEFERRED.key, None
        try:
            _probe_workers(self.spark)
        except WorkersError:
            raise
        except Exception:  # the session itself is gone: the job's own error says more
            return
        finally:
            _DEFERRED.key = previous


@contextlib.contextmanager
def checked_by_the_job(spark: SparkSession) -> Iterator[JobCheck]:
    """Within the block, this thread's job checks ``spark``'s workers itself. O(1).

    :func:`check_workers` runs no job for ``spark`` here, and the partitions
    built here are :func:`guarded` with report rows; the job then calls
    :meth:`JobCheck.after_first_python_job` around its first action that runs
    Python on the workers, before it writes anything.
    """
    key = _session_key(spark)
    previous, _DEFERRED.key = _DEFERRED.key, key
    try:
        yield JobCheck(spark, key)
    finally:
        _DEFERRED.key = previous


def _first_line(text: str) -> str:
    """The line of a Spark failure that says what went wrong, not its stack."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line and not line.startswith(("at ", "File ")):
            return line[:500]
    return lines[0][:500] if lines else "no message"
