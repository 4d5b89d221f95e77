"""A script that calls ``start_stream`` on a Spark Connect session ends cleanly.

pyspark's Connect client reads a ``StreamingQueryListener``'s events on a thread
that holds a server stream open; a script that stops its session just after its
query ended used to end with that thread's warning (``StreamingQueryListenerBus
Handler thread received exception``, the channel closed or "cannot schedule new
futures after shutdown"), or with ``Failed to remove the listener ...
NO_ACTIVE_SESSION``, as tickwheel's listener that releases the checkpoint was
still in place. Under Connect the release now polls the query instead
(:func:`tickwheel.pipeline.stream.checkpoint.when_inactive`). The script runs
as a program of its own against this test process's Connect server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stream_support import connect_run, connect_url, subprocess_env

pytestmark = [pytest.mark.spark, pytest.mark.connect, pytest.mark.jvm_process]

SCRIPT = """
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from tickwheel.pipeline import start_stream

url, base = sys.argv[1], Path(sys.argv[2])
spark = SparkSession.builder.remote(url).getOrCreate()
records = spark.readStream.text(str(base / "in"))
query = start_stream(records, str(base / "rules.toml"), output=str(base / "out"),
                     checkpoint=str(base / "ck"), trigger="available-now")
if not query.awaitTermination(240):
    sys.exit("the query did not finish in time")
print("exception:", query.exception(), flush=True)
spark.stop()
"""


def test_a_script_on_connect_ends_without_the_listener_buss_warning(
    spark: Any, tmp_path: Path
) -> None:
    """start_stream on a tiny input, wait for the query, stop the session, exit: the
    script's standard error holds no warning of pyspark's listener bus."""
    if not connect_run():
        pytest.skip("a Connect run's test: TICKWHEEL_TEST_SESSION=connect")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.jsonl").write_text(
        '{"event_id":"1","key":"k","type":"a","time":0}\n'
        '{"event_id":"2","key":"k","type":"b","time":5}\n',
        encoding="utf-8",
    )
    (tmp_path / "rules.toml").write_text(
        '[rules.r]\nopen = ["a"]\ncomplete = ["b"]\ntimeout = 10\n', encoding="utf-8"
    )
    script = tmp_path / "script.py"
    script.write_text(SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script), connect_url(spark), str(tmp_path)],
        env=subprocess_env(), capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exception: None" in proc.stdout, proc.stdout
    assert "cannot schedule new futures" not in proc.stderr, proc.stderr[-3000:]
    assert "Handler thread received exception" not in proc.stderr, proc.stderr[-3000:]
    # The same race's other ends: the listener removed after the session stopped.
    assert "Failed to remove the listener" not in proc.stderr, proc.stderr[-3000:]
    assert "connect/streaming/query.py" not in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "ck" / "tickwheel" / "commits").iterdir()) == [
        "0.json"
    ]
