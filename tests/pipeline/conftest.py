"""Shared fixtures of the pipeline tests: ONE SparkSession for the whole run.

Spark tests are marked ``@pytest.mark.spark``. The session is ``local[2]`` with
the UI off, few shuffle partitions, loopback networking and this interpreter
for the Python workers; it starts on first use and stops at the end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
    """The one SparkSession of the test run (local[2])."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from tickwheel.pipeline.sinks import spark_jdbc_conf
    from tickwheel.pipeline.spark.session import STREAM_SESSION_CONF, create_session

    session = create_session(
        "local[2]",
        app_name="tickwheel-tests",
        shuffle_partitions=4,
        conf={
            "spark.driver.memory": "1g",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "500",
            # the JDBC sinks' Debian jars (SQLite, PostgreSQL), when installed
            **spark_jdbc_conf(),
            # the stream's checkpoint logs, as tickwheel pipeline stream writes them
            **STREAM_SESSION_CONF,
        },
    )
    try:
        yield session
    finally:
        session.stop()
