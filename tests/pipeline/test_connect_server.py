"""The command line against a real Spark Connect server, started as a user starts one.

The server is pyspark's own ``sbin/start-connect-server.sh`` on a local master,
on a free port of 127.0.0.1, with its pid and log files in the test's
directory; the server's Python workers run this interpreter. ``tickwheel
pipeline run`` and ``tickwheel pipeline stream`` then run with ``--remote``
(and with ``SPARK_REMOTE``), and their outputs are compared with the
reference's. The server runs on this machine, so its paths are this test's.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import RULES_TOML, make_input, read_outputs
from stream_support import compare_with_reference, feed, fresh, subprocess_env, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.jvm_process,
]

#: Bounds the server's start and every command run against it.
SERVER_START_S = 180
COMMAND_S = 400


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server from ``sbin/start-connect-server.sh``; its URL."""
    import pyspark

    home = Path(pyspark.__file__).parent
    work = tmp_path_factory.mktemp("connect-server")
    port = _free_port()
    env = subprocess_env()  # its JVM on C1 only, as every JVM of the suite
    env.update(SPARK_HOME=str(home), SPARK_PID_DIR=str(work), SPARK_LOG_DIR=str(work),
               SPARK_IDENT_STRING=f"tickwheel-test-{port}")  # fmt: skip
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.driver.memory": "1g",
        "spark.pyspark.python": sys.executable,
    }
    args = [f"--conf={key}={value}" for key, value in conf.items()]
    subprocess.run(
        ["bash", str(home / "sbin" / "start-connect-server.sh"), "--master", "local[2]", *args],
        env=env, check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _listening(port):
            if time.monotonic() > deadline:
                logs = "".join(p.read_text(errors="replace")[-3000:] for p in work.glob("*.out"))
                pytest.fail(f"the Connect server did not listen within {SERVER_START_S} s:\n{logs}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run(
            ["bash", str(home / "sbin" / "stop-connect-server.sh")],
            env=env, check=False, timeout=120, capture_output=True,
        )  # fmt: skip


def _tickwheel(
    args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("tickwheel")
    return subprocess.run(
        [str(command), *args],
        env=env if env is not None else subprocess_env(),
        capture_output=True, text=True, timeout=COMMAND_S, check=False,
    )  # fmt: skip


def test_pipeline_run_with_remote(connect_server: str, tmp_path: Path) -> None:
    """``pipeline run --remote``: the rows of the reference, from the server."""
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES_TOML, encoding="utf-8")
    data = make_input(tmp_path / "in", orders=300, seed=13, files=2)
    proc = _tickwheel(["pipeline", "run", "--remote", connect_server, "--rules", str(rules),
                       "--input", str(data), "--output", str(tmp_path / "out")])  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"connecting to Spark Connect at {connect_server}" in proc.stdout
    ref = run_reference(iter_input_lines(data), load_rules(rules))
    got = read_outputs(tmp_path / "out")
    for name in ("outcomes", "unmatched", "rejected", "buffered"):
        assert got[name] == sorted(
            getattr(ref, name), key=lambda r: tuple((v is not None, v) for v in r)
        ), name


def test_pipeline_stream_with_spark_remote(spark: Any, connect_server: str, tmp_path: Path) -> None:
    """``pipeline stream`` with ``SPARK_REMOTE``: a file a micro-batch, exactly the
    reference's outputs; ``--master`` beside it is refused."""
    gen = tmp_path / "gen"
    generate_orders(200, gen, seed=17, files=3)
    rules = write_rules(tmp_path / "rules.toml")
    ref = run_reference(iter_input_lines(gen), load_rules(rules))
    feed(sorted(gen.glob("part-*.jsonl")), fresh(tmp_path / "in"), 3)
    args = ["pipeline", "stream", "--rules", str(rules), "--input", str(tmp_path / "in"),
            "--output", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck"),
            "--max-files-per-trigger", "1"]  # fmt: skip
    env = {**subprocess_env(), "SPARK_REMOTE": connect_server}
    refused = _tickwheel([*args, "--master", "local[1]"], env)
    assert refused.returncode == 2
    assert f"--remote {connect_server} and --master local[1]: give one" in refused.stderr
    proc = _tickwheel(args, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"connecting to Spark Connect at {connect_server}" in proc.stdout
    assert '"batches_run": 3' in proc.stdout
    sink = ParquetSink(str(tmp_path / "out"))
    assert sink.committed_batches() == [0, 1, 2]
    compare_with_reference(read_stream_outputs(spark, sink, str(tmp_path / "ck")), ref)
