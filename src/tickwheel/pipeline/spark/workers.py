"""Whether Spark's Python workers can run tickwheel: the same release as the driver's.

The step runs Python in the executors (the purgatory), where Spark starts the
interpreter that ``PYSPARK_PYTHON`` (``spark.pyspark.python``) names, else
``python3`` on the workers' ``PATH``. Without this check, a worker that cannot
import tickwheel fails deep inside the first job that needs it, in a long
Py4J/JVM trace; one that imports another release would go unnoticed.

:func:`check_workers` runs one small job first, once per Spark application
(Connect: once per session): a plain Python UDF, pickled by value so that it
needs nothing of tickwheel to be unpickled, that reports each worker's
interpreter and tickwheel release.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["WorkersError", "check_workers"]

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

#: Applications (classic) and sessions (Connect) whose workers passed, this process.
_CHECKED: set[str] = set()


class WorkersError(RuntimeError):
    """Spark's Python workers cannot run this tickwheel."""


def _probe() -> Any:
    namespace: dict[str, Any] = {"__name__": "tickwheel_worker_probe"}
    exec(compile(_PROBE_SOURCE, "<tickwheel worker probe>", "exec"), namespace)
    return namespace["probe"]


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
    afterwards. The message names the workers' interpreter, what failed, and
    how to set ``PYSPARK_PYTHON`` or install tickwheel on the cluster.
    """
    from pyspark.sql import functions as F

    from ... import __version__

    key = _session_key(spark)
    if key in _CHECKED:
        return
    probe = F.udf(_probe(), "string", useArrow=False)  # a pickled UDF needs no pyarrow
    frame = spark.range(0, PROBE_PARTITIONS, 1, PROBE_PARTITIONS).select(probe("id").alias("r"))
    try:
        reports = [json.loads(row["r"]) for row in frame.distinct().collect()]
    except Exception as exc:  # the worker did not start, or could not run the probe
        cause = _first_line(str(exc))
        raise WorkersError(
            f"Spark's Python workers could not run tickwheel's check ({cause}). " + _advice(spark)
        ) from None
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
    _CHECKED.add(key)


def _first_line(text: str) -> str:
    """The line of a Spark failure that says what went wrong, not its stack."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line and not line.startswith(("at ", "File ")):
            return line[:500]
    return lines[0][:500] if lines else "no message"
