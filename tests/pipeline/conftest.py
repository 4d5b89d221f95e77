"""Shared fixtures of the pipeline tests: ONE SparkSession per test process.

Spark tests are marked ``@pytest.mark.spark``. The session is ``local[2]`` with
the UI off, few shuffle partitions, loopback networking and this interpreter
for the Python workers; it starts on first use and stops at the end.

Its kind is the process's: classic by default, Spark Connect with
``TICKWHEEL_TEST_SESSION=connect`` (``SparkSession.builder.remote("local[2]")``,
a Connect server on a local master, as PySpark's parity tests run). PySpark
picks its functions' implementation by a process-wide flag, so one process
cannot hold both kinds: ``make test`` runs the tests marked
``@pytest.mark.connect`` a second time, in processes of their own, on
Connect, as ``pyspark.sql.tests.connect`` reruns the classic tests' mixins.
Under Connect, the tests not marked so are deselected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from stream_support import connect_run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under Connect, keep only the tests that claim to run on both session kinds."""
    if not connect_run():
        return
    kept = [item for item in items if item.get_closest_marker("connect") is not None]
    deselected = [item for item in items if item.get_closest_marker("connect") is None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def outputs_load_in_pandas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the end of the run, load every output any pipeline test wrote into pandas.

    Through pyarrow for Parquet, and with pandas' own readers for CSV, JSON and
    SQLite: a table those tools cannot load fails the run here, naming it.
    """
    yield
    if "pyspark" not in sys.modules:  # no Spark test ran
        return
    from output_readers import find_outputs, load_everywhere

    outputs = find_outputs(tmp_path_factory.getbasetemp())
    for output, fmt in outputs:
        try:
            load_everywhere(output, fmt)
        except Exception as exc:  # name the table, keep the cause
            raise AssertionError(f"{output} ({fmt}) does not load into pandas: {exc}") from exc


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of this test process (local[2]): classic, or Spark
    Connect under ``TICKWHEEL_TEST_SESSION=connect``."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from tickwheel.pipeline.sinks import spark_jdbc_conf
    from tickwheel.pipeline.spark.class_archive import find
    from tickwheel.pipeline.spark.session import STREAM_SESSION_CONF, create_session

    conf = {
        "spark.driver.memory": "1g",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "500",
        # the JDBC sinks' Debian jars (SQLite, PostgreSQL), when installed
        **spark_jdbc_conf(),
        # the stream's checkpoint logs, as tickwheel pipeline stream writes them
        **STREAM_SESSION_CONF,
    }
    # Under Connect, a Connect server on a local master in this process, on a free
    # port (as SparkSession.builder.remote("local[2]") does on 15002), so that the
    # test processes and the jobs they start can each have one; its Python workers
    # run this interpreter, as the classic session's do.
    # C1 only: the two test processes keep both cores busy, so the CPU the optimising
    # compiler spends is taken from the other process's tests, and the short queries
    # of a test rarely run long enough to pay it back.
    remote = "local[2]" if connect_run() else None
    session = create_session(
        "local[2]", app_name="tickwheel-tests", shuffle_partitions=4, conf=conf, remote=remote,
        quick_jit=True, class_archive=find(),  # find: when `make test` recorded one
    )  # fmt: skip
    try:
        yield session
    finally:
        session.stop()
