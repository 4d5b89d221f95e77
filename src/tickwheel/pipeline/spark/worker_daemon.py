"""PySpark's Python worker daemon, importing PySpark from the installed package.

Spark starts its Python workers with ``pyspark.zip`` and py4j's source zip
first on ``PYTHONPATH``. Python cannot cache bytecode for modules imported
from a zip, so every fresh daemon compiles PySpark's modules from source, and
so does every worker it forks for the modules it imports after the fork
(``pyspark.worker`` and what that pulls in): on a cold ``tickwheel pipeline
run``, py-spy shows it before the purgatory's first row (``docs/benchmarks.md``,
"Cold start").

The installed package (the same PySpark that the driver imports) has its
bytecode cached, so this module moves the two zips to the end of
``sys.path`` and then runs ``pyspark.daemon`` as Spark would. The workers are
forked from it and inherit the order. :func:`~.session.create_session`
uses it for local masters only (``spark.python.daemon.module``), where the
workers run this interpreter, which has tickwheel installed. :func:`main` does
the same for the other processes Spark starts there (``tickwheel-spark-python``).
"""

from __future__ import annotations

import os
import runpy
import sys


def _is_spark_zip(entry: str) -> bool:
    name = os.path.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith(".zip"))


def installed_first(path: list[str]) -> list[str]:
    """``path`` with PySpark's and py4j's zips moved to the end, order otherwise kept. O(n)."""
    return [p for p in path if not _is_spark_zip(p)] + [p for p in path if _is_spark_zip(p)]


def main() -> None:
    """``tickwheel-spark-python -m MODULE [ARG...]``: ``python -m MODULE`` with the zips last.

    Spark starts the processes of a Python data source (and, without a daemon
    module, its workers) as ``PYSPARK_PYTHON -m MODULE``; local sessions set
    ``PYSPARK_PYTHON`` to this command (:func:`.session.local_python`). As
    ``python -m`` does, the current directory comes first on the path and
    ``sys.argv`` holds the module's arguments. Any other command line runs
    this interpreter with it unchanged.
    """
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    sys.path[:] = [os.getcwd(), *installed_first(sys.path[1:])]  # [0] was this script's dir
    sys.argv = [sys.argv[0], *args[2:]]
    if args[1] == __name__:  # the daemon module, imported already: run it, not again
        run_daemon()
    else:
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)


def run_daemon() -> None:
    """Run ``pyspark.daemon`` as Spark would, with the installed PySpark first."""
    sys.path[:] = installed_first(sys.path)
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_daemon()
