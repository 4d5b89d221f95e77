"""The check that Spark's Python workers run the driver's tickwheel (``spark/workers.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stream_support import subprocess_env

import tickwheel
from tickwheel.pipeline.batch import run_job
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.spark import workers
from tickwheel.pipeline.spark.workers import JobCheck, WorkersError, check_workers

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


ORDERS = "".join(
    f'{{"event_id":"e{i}","type":"{kind}","order_id":"o{i // 2}","ts":{1000 * i},"seq":0}}\n'
    for i, kind in enumerate(["created", "paid"] * 3)
)


def _no_probe(spark: Any) -> None:
    raise AssertionError("the batch job ran the probe's job")


def test_the_batch_job_checks_its_workers_in_the_purgatory(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh application's batch job runs no probe: the purgatory's workers check
    themselves, and once it ran, the application counts as checked."""
    monkeypatch.setattr(workers, "_CHECKED", set())
    monkeypatch.setattr(workers, "_probe_workers", _no_probe)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(ORDERS)
    summary = run_job(spark, load_rules(str(EXAMPLE)), str(tmp_path / "in"), str(tmp_path / "out"))
    assert summary["counts"]["outcomes"] == {"completed": 3}
    assert workers._session_key(spark) in workers._CHECKED


def test_another_release_stops_the_batch_job_before_it_writes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers' release differs from the driver's: the purgatory's partitions report
    it instead of running, and the job raises the probe's message with nothing written."""
    installed = tickwheel.__version__
    monkeypatch.setattr(workers, "_CHECKED", set())
    monkeypatch.setattr(workers, "_probe_workers", _no_probe)
    monkeypatch.setattr(tickwheel, "__version__", "0.0.0-driver")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(ORDERS)
    out = tmp_path / "out"
    with pytest.raises(WorkersError) as failure:
        run_job(spark, load_rules(str(EXAMPLE)), str(tmp_path / "in"), str(out))
    message = str(failure.value)
    assert message.startswith(f"Spark's Python workers run tickwheel {installed} (")
    assert "the driver 0.0.0-driver" in message and "PYSPARK_PYTHON" in message
    assert list(out.iterdir()) == []  # no table, no summary
    assert workers._session_key(spark) not in workers._CHECKED


def test_a_failed_first_python_job_is_explained_by_the_probe(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the first job with Python fails (a worker without pyarrow fails before the
    guard), the probe runs: its message when the workers are the cause, else the job's
    own error."""
    monkeypatch.setattr(workers, "_CHECKED", set())
    check = JobCheck(spark, workers._session_key(spark))

    def fail() -> None:
        raise RuntimeError("the job's own error")

    def rows() -> Any:
        raise AssertionError("no rows to read after a failed job")

    with pytest.raises(RuntimeError, match="the job's own error"):
        check.after_first_python_job(fail, rows, lambda _: True)  # the workers pass the probe

    def cannot_import(spark: Any) -> None:
        workers._raise_for(spark, [{"python": "/bare/python", "error": "ModuleNotFoundError"}])

    monkeypatch.setattr(workers, "_probe_workers", cannot_import)
    with pytest.raises(WorkersError, match="cannot import tickwheel: /bare/python says"):
        check.after_first_python_job(fail, rows, lambda _: True)
    assert not check.done


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python of this version without tickwheel (nor anything else installed)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)  # fmt: skip
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module")
def arrow_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python of this version with pyarrow and without tickwheel: a cluster's own, which
    runs PySpark's Arrow functions but not tickwheel's."""
    import pyarrow as pa

    root = tmp_path_factory.mktemp("arrow")
    venv, deps = root / "venv", root / "deps"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)  # fmt: skip
    deps.mkdir()
    (deps / "pyarrow").symlink_to(Path(pa.__file__).parent)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(f"{deps}\n")
    return python


@pytest.mark.jvm_process
@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "python"),
    [("run", "arrow_python"), ("run", "bare_python"), ("stream", "bare_python")],
)
def test_workers_without_tickwheel_stop_the_cli_in_one_message(
    tmp_path: Path, request: pytest.FixtureRequest, command: str, python: str
) -> None:
    """``PYSPARK_PYTHON`` names a Python without tickwheel (a cluster's own, say): exit 2
    before any output is written, one message naming it and the ways out, no
    traceback.

    The batch job checks the workers in its first job with Python, the purgatory's
    Arrow function; a Python without pyarrow fails that job before tickwheel's code
    runs, so Spark logs the task's failure (with its Python traceback) before the
    probe names the cause."""
    workers_python = request.getfixturevalue(python)
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.jsonl").write_text(
        '{"event_id":"1","type":"created","order_id":"A","ts":0,"seq":0}\n'
    )
    args = [sys.executable, "-m", "tickwheel._cli", "pipeline", command, "--rules",
            str(EXAMPLE), "--input", str(inp), "--output", str(tmp_path / "out")]  # fmt: skip
    if command == "stream":
        args += ["--checkpoint", str(tmp_path / "ck")]
    env = {**subprocess_env(), "PYSPARK_PYTHON": workers_python}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-3000:])
    if (command, python) != ("run", "bare_python"):
        assert "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "Spark's Python workers" in line]
    assert len(said) == 1, proc.stderr[-3000:]
    assert f"cannot import tickwheel: {workers_python} says ModuleNotFoundError" in said[0]
    assert "PYSPARK_PYTHON" in said[0]
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


@pytest.mark.jvm_process
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
