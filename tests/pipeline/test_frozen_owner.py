"""A frozen owner that wakes after another job took its checkpoint over writes nothing read.

Jobs of a Spark user's stream (the Kafka-like topic's job, which calls
``start_stream``) share a ``viewfs://`` output and checkpoint, as hosts of a
cluster would share ``hdfs://`` or ``s3a://``: each runs in a UTS namespace of
its own, so each has its own host name (``unshare --uts``), and none can tell
whether another's process lives. A job freezes (``TICKWHEEL_FAULT=
POINT:BATCH:stop``: SIGSTOP of its whole process group, its JVM included, as a
long GC pause, a suspended VM or a network partition would) at one point of a
batch; the next job takes the checkpoint over once its heartbeats stop. The
points are taken in turn along one chain of owners (A freezes at the first,
B takes over and freezes at the second, C at the third, D runs to the end),
so each takeover also fences a fence's owner. Then A, B and C are woken
(SIGCONT): each must stop with the fencing message, which names the newest
owner (D), and the outputs must still equal the reference's, row for
row, whether read by tickwheel's reader or by a plain ``spark.read.parquet``
of each table.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference, fresh, subprocess_env, write_rules

from support import kafka_like
from support.reference import iter_input_lines, run_reference
from support.viewfs import ViewFs
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.stream.checkpoint import HEARTBEAT_ENV
from tickwheel.pipeline.stream.resident import DRIVER_STATE_BYTES_ENV
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.jvm_process]

JOB = Path(__file__).resolve().parents[1] / "support" / "kafka_like_job.py"
TABLES = ("outcomes", "unmatched", "rejected", "late")
#: Where each job of the chain freezes, and in which batch: during a table's write
#: (some outputs staged, the others being written), with everything staged and
#: nothing committed, and just after it found its batch not committed, before
#: writing anything of it. The last job runs to the end.
FREEZES = [("hostA", "mid_batch", 1), ("hostB", "after_state", 2), ("hostC", "batch_start", 3)]


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """120 generated orders in 6 files, the rules and the reference."""
    base = tmp_path_factory.mktemp("frozen-owner")
    generate_orders(120, base / "gen", seed=5, files=6)
    rules = write_rules(base / "rules.toml", lateness="15m")
    lines = [line for f in sorted((base / "gen").glob("part-*.jsonl"))
             for line in f.read_text(encoding="utf-8").splitlines()]  # fmt: skip
    ref = run_reference(iter_input_lines(base / "gen"), load_rules(rules))
    return {"rules": rules, "lines": [line.encode() for line in lines], "ref": ref}


def _unshare_or_skip() -> None:
    """Skip where ``unshare --uts`` cannot run, saying so; CI must run the test."""
    why = None
    if shutil.which("unshare") is None:
        why = "unshare is missing"
    else:
        probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=30,
                               check=False)  # fmt: skip
        if probe.returncode != 0:
            why = f"unshare --uts fails here: {probe.stderr.decode(errors='replace').strip()}"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the frozen-owner test (as root)")
        pytest.skip(f"{why}: the frozen-owner test needs its own UTS namespace per job")


def _command(host: str, tmp: Path, rules: Path, mount: ViewFs) -> list[str]:
    args = [sys.executable, str(JOB), "--topic", str(tmp / "topic"), "--rules", str(rules),
            "--output", mount.uri("out"), "--checkpoint", mount.uri("ck"),
            "--max-records-per-trigger", "60"]  # fmt: skip
    script = 'hostname "$0" && exec "$@"'
    return ["unshare", "--uts", "sh", "-c", script, host, *args]


def _env(tmp: Path, conf: Path, fault: str | None) -> dict[str, str]:
    env = {**subprocess_env(fault), "HADOOP_CONF_DIR": str(conf)}
    env["TICKWHEEL_FAULT_LOG"] = str(tmp / "faults.log")
    env[HEARTBEAT_ENV] = "1"  # the next job takes over after three missed beats: 3 s
    return env


def _wait_frozen(job: subprocess.Popen[bytes], log: Path, point: str, batch: int) -> None:
    """Until the job's fault log says it stopped itself and its state is ``T`` (stopped)."""
    deadline = time.monotonic() + 240
    said = f"SIGSTOP of the process group at {point} of batch {batch}"
    while time.monotonic() < deadline:
        assert job.poll() is None, f"the job ended before freezing: {job.returncode}"
        if log.exists() and said in log.read_text(encoding="utf-8"):
            with open(f"/proc/{job.pid}/stat", encoding="utf-8") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
        time.sleep(0.2)
    raise AssertionError(f"the job did not freeze at {point} of batch {batch} in 240 s")


def _plain_rows(spark: Any, table: str) -> list[tuple[Any, ...]]:
    """Every row a plain ``spark.read.parquet`` of ``table`` returns, sorted."""
    frame = spark.read.parquet(table)
    return sorted(tuple(r) for r in frame.select(*sorted(frame.columns)).collect())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("provider", ["driver", "partitioned"])
def test_frozen_owners_that_wake_are_fenced(
    spark: Any, tmp_path: Path, orders: dict[str, Any], provider: str
) -> None:
    """Three owners frozen mid-run, a fourth finishing the stream, the three woken: each
    is fenced, and the outputs are the reference's, with the state's operations
    held in the driver or partitioned on the executors (a bound of one byte)."""
    _unshare_or_skip()
    bound = {DRIVER_STATE_BYTES_ENV: "1"} if provider == "partitioned" else {}
    mount = ViewFs(fresh(tmp_path / "mnt"))
    conf = mount.hadoop_conf_dir(tmp_path / "hadoop-conf")
    kafka_like.create_topic(tmp_path / "topic", 3)
    kafka_like.append(tmp_path / "topic", orders["lines"])
    frozen: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for host, point, batch in FREEZES:
            err = tmp_path / f"{host}.err"  # a file, not a pipe: a JVM may outlive its job
            with open(err, "wb") as err_file:
                job = subprocess.Popen(
                    _command(host, tmp_path, orders["rules"], mount),
                    env={**_env(tmp_path, conf, f"{point}:{batch}:stop"), **bound},
                    stdout=subprocess.DEVNULL,
                    stderr=err_file,
                    start_new_session=True,  # its own process group, which it stops
                )
            frozen.append((job, err))
            _wait_frozen(job, tmp_path / "faults.log", point, batch)
        last = subprocess.run(
            _command("hostD", tmp_path, orders["rules"], mount),
            env={**_env(tmp_path, conf, None), **bound}, capture_output=True, text=True,
            timeout=300,
            check=False,
        )  # fmt: skip
        assert last.returncode == 0, last.stderr[-3000:]
        for job, _ in frozen:
            os.killpg(job.pid, signal.SIGCONT)
        for job, _ in frozen:
            job.wait(timeout=180)
    finally:
        for job, _ in frozen:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(timeout=60)
    for token, (job, err) in enumerate(frozen, start=1):  # each names the newest owner
        message = err.read_text(encoding="utf-8", errors="replace")
        assert job.returncode != 0, message[-3000:]
        fenced = (f"was taken over by token 4 on host hostD; this job (token {token}) stops "
                  "without writing again")  # fmt: skip
        assert fenced in message, message[-3000:]
    mount.configure(spark)  # this session reads the jobs' URIs too
    sink = ParquetSink(mount.uri("out"), spark)
    compare_with_reference(read_stream_outputs(spark, sink, mount.uri("ck")), orders["ref"])
    for table in TABLES:  # what a downstream job or a notebook reads
        mine = sink.read_table(spark, table)
        assert mine is not None
        assert _plain_rows(spark, mount.uri("out", table)) == sorted(
            tuple(r) for r in mine.select(*sorted(mine.columns)).collect()
        ), table
