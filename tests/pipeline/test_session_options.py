"""How the CLI starts its JVM: C1 only for short local runs (no Spark needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tickwheel.pipeline.spark.session import (
    JOB_SQL_SETTINGS,
    QUICK_JIT_MAX_INPUT_BYTES,
    quick_jit_for,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders.toml"


def test_quick_jit_for_short_local_runs_only() -> None:
    assert quick_jit_for("local[2]", 20 * 2**20)
    assert quick_jit_for("local[*]", QUICK_JIT_MAX_INPUT_BYTES)
    assert not quick_jit_for("local[2]", QUICK_JIT_MAX_INPUT_BYTES + 1)
    assert not quick_jit_for("spark://host:7077", 1)


def test_job_sessions_run_without_adaptive_execution() -> None:
    assert JOB_SQL_SETTINGS["spark.sql.adaptive.enabled"] == "false"


def test_the_cli_says_which_compilers_the_jvm_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from tickwheel._cli import main

    rules = tmp_path / "r.toml"
    rules.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["pipeline", "run", "--rules", str(rules), "--input", str(tmp_path),
              "--output", str(tmp_path / "o"), "--jit", "c3"])  # fmt: skip
    assert "invalid choice: 'c3'" in capsys.readouterr().err


def test_the_worker_daemon_puts_the_installed_pyspark_before_the_zips() -> None:
    from tickwheel.pipeline.spark.worker_daemon import installed_first

    path = ["/s/python/lib/pyspark.zip", "/s/python/lib/py4j-0.10.9.9-src.zip", "/x", "/site"]
    assert installed_first(path) == ["/x", "/site", *path[:2]]
    assert installed_first(["/a", "/b"]) == ["/a", "/b"]


def test_the_local_python_runs_a_module_as_python_m_with_the_installed_pyspark(
    tmp_path: Path,
) -> None:
    """``tickwheel-spark-python -m MODULE ARGS`` under Spark's ``PYTHONPATH`` (the zips
    first): the module runs as ``__main__`` with its arguments, the current
    directory first on the path, and PySpark from the installed package."""
    import json
    import os
    import subprocess
    import sys

    import pyspark

    from tickwheel.pipeline.spark.session import LOCAL_PYTHON, local_python

    launcher = local_python()
    assert os.path.basename(launcher) == LOCAL_PYTHON  # installed with tickwheel
    (tmp_path / "probe.py").write_text(
        "import json, sys, pyspark\n"
        "print(json.dumps([__name__, sys.argv[1:], sys.path[0], pyspark.__file__]))\n"
    )
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = [str(p) for p in sorted(lib.glob("*.zip"))]
    assert any(z.endswith("pyspark.zip") for z in zips)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    run = subprocess.run(
        [launcher, "-m", "probe", "a", "--b"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    name, argv, first, imported = json.loads(run.stdout)
    assert (name, argv, first) == ("__main__", ["a", "--b"], str(tmp_path))
    assert imported == pyspark.__file__  # not .../pyspark.zip/pyspark/__init__.py
    version = subprocess.run(
        [launcher, "--version"], capture_output=True, text=True, timeout=60, check=True
    )  # any other command line: this interpreter, unchanged
    assert version.stdout.strip() == f"Python {sys.version.split()[0]}"


def test_the_local_python_runs_the_daemon_module_without_importing_it_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``-m`` the daemon module itself (imported by the command already) runs
    ``pyspark.daemon`` directly: running the module again through ``runpy``
    would warn on stderr that it was found in ``sys.modules``."""
    import runpy
    import sys

    from tickwheel.pipeline.spark import worker_daemon
    from tickwheel.pipeline.spark.session import LOCAL_PYTHON, WORKER_DAEMON

    ran: list[str] = []
    monkeypatch.setattr(runpy, "run_module", lambda name, **_: ran.append(name))
    monkeypatch.setattr(sys, "path", ["/bin", "/s/lib/pyspark.zip", "/site"])
    monkeypatch.setattr(sys, "argv", [LOCAL_PYTHON, "-m", WORKER_DAEMON, "x"])
    worker_daemon.main()
    assert ran == ["pyspark.daemon"]
    assert sys.argv[1:] == ["x"]
    assert sys.path[1:] == ["/site", "/s/lib/pyspark.zip"]


@pytest.mark.spark
def test_local_workers_import_pyspark_from_the_installed_package(spark: Any) -> None:
    import pyspark

    from tickwheel.pipeline.spark.session import WORKER_DAEMON

    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == WORKER_DAEMON

    def where(_: Any) -> Any:
        import pyspark as worker_pyspark

        yield worker_pyspark.__file__

    files = set(spark.sparkContext.parallelize(range(4), 2).mapPartitions(where).collect())
    assert files == {pyspark.__file__}  # the driver's, not the copy in pyspark.zip


def test_partitions_follow_the_input_size_not_the_cores() -> None:
    from tickwheel.pipeline.spark.session import PARTITION_INPUT_BYTES, partitions_for

    assert partitions_for(0, 2) == 2
    assert partitions_for(20 * 2**20, 2) == 2  # a small input: one partition per core
    assert partitions_for(PARTITION_INPUT_BYTES * 16 + 1, 2) == 17
    assert partitions_for(1_900 * 2**20, 2) == 30  # 1e7 generated orders
    assert partitions_for(PARTITION_INPUT_BYTES, 8) == 8


def test_driver_memory_is_a_quarter_of_the_machine_within_bounds() -> None:
    from tickwheel.pipeline.spark.session import default_driver_memory

    assert default_driver_memory(24 * 2**30) == "6144m"
    assert default_driver_memory(2 * 2**30) == "1024m"  # never below 1 GiB
    assert default_driver_memory(1024 * 2**30) == "65536m"  # nor above 64 GiB
    assert default_driver_memory().endswith("m")


def test_running_out_of_memory_is_one_line_naming_the_option() -> None:
    from tickwheel.pipeline.spark.session import memory_failure

    class Py4JJavaError(Exception):
        pass

    class Py4JNetworkError(Exception):
        pass

    jvm = Py4JJavaError(
        "An error occurred while calling o96.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
        "java.lang.OutOfMemoryError: Java heap space\n\tat java.base/java.util.Arrays..."
    )
    assert memory_failure(jvm, "2048m", 2) == (
        "the Spark JVM ran out of memory (Java heap space) with --driver-memory 2048m: give "
        "it more, or spread the work over more --partitions (it had 2)"
    )
    worker = RuntimeError("PythonException: ... MemoryError")
    assert memory_failure(worker, "2g", None) == (
        "a Python worker ran out of memory: spread the work over more --partitions "
        "(it had the default)"
    )
    gone = memory_failure(Py4JNetworkError("Answer from Java side is empty"), "6g", 30)
    assert gone is not None and "--driver-memory 6g" in gone and "(it had 30)" in gone
    assert memory_failure(ValueError("bad input"), "2g", 2) is None
    assert all("\n" not in (memory_failure(e, "1g", 1) or "") for e in (jvm, worker))


def test_a_bounded_stream_over_a_small_backlog_runs_c1_only(tmp_path: Path) -> None:
    """``--jit auto``: C1 only for once/available-now over <= 96 MB of files not yet taken."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    import json

    from tickwheel.pipeline.stream.checkpoint import StreamError
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig

    rules = tmp_path / "r.toml"
    rules.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "part-0.jsonl").write_bytes(b"{}\n" * 1000)

    def quick(**kw: Any) -> bool:
        config = StreamConfig(str(rules), str(inp), str(tmp_path / "o"), str(tmp_path / "ck"), **kw)
        with FileStreamJob(config) as job:
            return job.quick_jit()

    assert quick(trigger="available-now")
    assert quick(trigger="once")
    assert not quick(trigger="interval=30s")  # runs until stopped: C2 pays back
    assert not quick(trigger="available-now", master="spark://host:7077")
    assert not quick(trigger="available-now", jit="c2")
    assert quick(trigger="interval=30s", jit="c1")
    big = inp / "part-1.jsonl"
    with open(big, "wb") as fh:  # sparse: its size counts, not its blocks
        fh.truncate(QUICK_JIT_MAX_INPUT_BYTES)
    assert not quick(trigger="available-now")
    # files the checkpoint's log has taken are not the backlog
    log = tmp_path / "ck" / "tickwheel" / "files.log"
    log.write_text(json.dumps({"path": str(big.resolve())}) + "\n", encoding="utf-8")
    assert quick(trigger="available-now")
    with pytest.raises(StreamError, match="--jit: expected auto, c1 or c2, got 'c3'"):
        quick(jit="c3")


@pytest.mark.spark
def test_the_clis_stream_writes_sparks_checkpoint_logs_through_the_file_system_api(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pipeline stream`` starts its session with STREAM_SESSION_CONF, and with it
    Spark builds the checkpoint file manager that runs no ``readlink`` process."""
    from tickwheel.pipeline.spark import session
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig

    given: dict[str, Any] = {}

    def recording_create_session(**kw: Any) -> Any:
        given.update(kw["conf"])
        return spark

    monkeypatch.setattr(session, "create_session", recording_create_session)
    rules = tmp_path / "r.toml"
    rules.write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "in").mkdir()
    config = StreamConfig(str(rules), str(tmp_path / "in"), str(tmp_path / "o"),
                          str(tmp_path / "ck"), jit="c2")  # fmt: skip
    with FileStreamJob(config) as job:
        assert job._session() is spark
    name = "spark.sql.streaming.checkpointFileManagerClass"
    assert given[name] == session.STREAM_SESSION_CONF[name]
    jvm = spark.sparkContext._jvm
    checkpointing = jvm.org.apache.spark.sql.execution.streaming.checkpointing
    stream_session = spark.newSession()
    stream_session.conf.set(name, given[name])

    def manager(s: Any) -> str:
        hadoop_conf = s._jsparkSession.sessionState().newHadoopConf()
        path = jvm.org.apache.hadoop.fs.Path(str(tmp_path / "ck" / "spark"))
        return str(
            checkpointing.CheckpointFileManager.create(path, hadoop_conf).getClass().getName()
        )

    assert manager(stream_session) == given[name]
    stream_session.conf.unset(name)
    assert manager(stream_session).endswith(".FileContextBasedCheckpointFileManager")  # Spark's
