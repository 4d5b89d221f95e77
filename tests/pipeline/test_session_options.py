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
