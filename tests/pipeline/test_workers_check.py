"""The check that Spark's Python workers run the driver's tickwheel (``spark/workers.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stream_support import subprocess_env

import tickwheel
from tickwheel.pipeline.spark import workers
from tickwheel.pipeline.spark.workers import WorkersError, check_workers

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders.toml"


def test_workers_that_run_this_release_pass_once(spark: Any) -> None:
    check_workers(spark)
    assert workers._session_key(spark) in workers._CHECKED


def test_another_release_on_the_workers_is_named(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver claims another release: the workers' one and their Python are named."""
    installed = tickwheel.__version__
    monkeypatch.setattr(workers, "_CHECKED", set())
    monkeypatch.setattr(tickwheel, "__version__", "0.0.0-driver")
    with pytest.raises(WorkersError) as failure:
        check_workers(spark)
    message = str(failure.value)
    assert f"workers run tickwheel {installed} (" in message
    assert "the driver 0.0.0-driver" in message and "PYSPARK_PYTHON" in message


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python of this version without tickwheel (nor anything else installed)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)  # fmt: skip
    return str(venv / "bin" / "python")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "stream"])
def test_workers_without_tickwheel_stop_the_cli_in_one_message(
    tmp_path: Path, bare_python: str, command: str
) -> None:
    """``PYSPARK_PYTHON`` names a Python without tickwheel (a cluster's own, say): exit 2
    before any output is written, one message naming it and the ways out, no
    traceback."""
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.jsonl").write_text(
        '{"event_id":"1","type":"created","order_id":"A","ts":0,"seq":0}\n'
    )
    args = [sys.executable, "-m", "tickwheel._cli", "pipeline", command, "--rules",
            str(EXAMPLE), "--input", str(inp), "--output", str(tmp_path / "out")]  # fmt: skip
    if command == "stream":
        args += ["--checkpoint", str(tmp_path / "ck")]
    env = {**subprocess_env(), "PYSPARK_PYTHON": bare_python}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "Spark's Python workers" in line]
    assert len(said) == 1, proc.stderr[-3000:]
    assert bare_python in said[0] and "PYSPARK_PYTHON" in said[0]
    assert not (tmp_path / "out" / "outcomes").exists()


LIBRARY_JOB = """
import sys
from pyspark.sql import SparkSession
from tickwheel.pipeline import delayed_operations
from tickwheel.pipeline.spark.workers import WorkersError

spark = SparkSession.builder.master("local[1]").getOrCreate()
records = spark.createDataFrame([('{"event_id":"1","type":"created","order_id":"A","ts":0}',)],
                                "value string")
try:
    delayed_operations(records, sys.argv[1])
except WorkersError as exc:
    print("refused:", exc)
spark.stop()
"""


@pytest.mark.slow
def test_a_library_call_on_a_session_whose_workers_lack_tickwheel(
    tmp_path: Path, bare_python: str
) -> None:
    """A plain PySpark program whose workers run a Python without tickwheel: the step
    raises WorkersError, naming that Python and its import error."""
    script = tmp_path / "job.py"
    script.write_text(LIBRARY_JOB)
    env = {**subprocess_env(), "PYSPARK_PYTHON": bare_python}
    proc = subprocess.run([sys.executable, str(script), str(EXAMPLE)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    refused = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 1, proc.stdout[-2000:]
    assert f"cannot import tickwheel: {bare_python} says ModuleNotFoundError" in refused[0]
