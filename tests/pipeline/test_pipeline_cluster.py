"""The job survives executors in separate JVMs: master ``local-cluster[2,1,1024]``.

Runs in a subprocess with its own SparkSession (a JVM holds one SparkContext),
bounded in time, on a small input, and checks the output against the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, sys.argv[2])
    sys.path.insert(0, str(Path(sys.argv[2]).parent))  # tests/: the support package
    from pipeline_helpers import RULES_TOML, make_input, read_outputs
    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.rules import parse_rules
    from tickwheel.pipeline.batch import run_job
    from tickwheel.pipeline.spark.session import create_session
    import tomllib

    root = Path(sys.argv[1])
    rules = parse_rules(tomllib.loads(RULES_TOML))
    data = make_input(root / "input", orders=300, seed=11, files=3)
    spark = create_session("local-cluster[2,1,1024]", shuffle_partitions=4)
    try:
        summary = run_job(spark, rules, str(data), str(root / "out"), partitions=3)
        # the block managers of the driver and of each executor JVM
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1

        def parent(_: int) -> int:
            import os, time
            time.sleep(0.2)  # keep both executors busy at once
            return os.getppid()

        pids = spark.sparkContext.parallelize(range(8), 8).map(parent).distinct().count()
    finally:
        spark.stop()
    ref = run_reference(iter_input_lines(data), rules)
    got = read_outputs(root / "out")
    expected = {
        "outcomes": ref.outcomes, "unmatched": ref.unmatched,
        "rejected": ref.rejected, "buffered": ref.buffered,
    }
    for name in expected:
        assert got[name] == expected[name], name
    print(f"executors={executors} worker_parents={pids} outcomes={len(ref.outcomes)} OK")
    """
)


def test_job_on_executors_in_separate_jvms(tmp_path: Path) -> None:
    script = tmp_path / "cluster_job.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith("OK"), proc.stdout[-2000:]
    fields = dict(part.split("=") for part in last.split()[:-1])
    assert fields["executors"] == "2"
    # the Python workers hang off two different executor JVMs
    assert int(fields["worker_parents"]) == 2
