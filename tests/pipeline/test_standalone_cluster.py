"""The stream on a real standalone cluster whose two workers share no local disk.

A master on 127.0.0.1 and two workers, 127.0.0.2 and 127.0.0.3, each in
namespaces of its own (mount, and PID where the machine allows) with a private
/tmp (``support.standalone_cluster``): two machines as Spark sees them, with
nothing on a local disk in common. The
stream's driver is ``python -m tickwheel.pipeline.stream --master spark://...``
in a subprocess outside the namespaces; its input, output and checkpoint are
``file:`` URIs of a directory every process sees, not under /tmp, so the job
takes Spark's file source and reaches its files through Hadoop.

Two faults, then the outputs against the reference (the batch semantics): no
row lost, none doubled.

1. the driver kills itself mid-batch (``TICKWHEEL_FAULT=mid_batch:1``);
2. the rerun replays that batch, and while a later one runs, worker 2 is
   SIGKILLed with its executor and everything else in its namespaces: the job
   finishes on worker 1's executor alone.

Spark's event logs (written by the drivers, in the shared directory) show
where the executors and their tasks ran.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference, feed, fresh, subprocess_env, write_rules

from support.reference import iter_input_lines, run_reference
from support.standalone_cluster import (
    WORKER_DIR,
    StandaloneCluster,
    group_members,
    kill_all,
    namespaces_unavailable,
    shared_directory,
)
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

#: Increment files, one micro-batch each (``--max-files-per-trigger 1``).
INCREMENTS = 4
#: Bound of each driver run (a JVM, two executors, a few micro-batches).
RUN_TIMEOUT = 300.0
WORKER_1, WORKER_2 = "127.0.0.2", "127.0.0.3"


def location(path: Path) -> str:
    """How the command and the sink name the directory ``path``: a ``file:`` URI, which
    every process of the cluster resolves through Hadoop's ``FileSystem``, as it
    would ``hdfs://`` or ``s3a://``."""
    return path.as_uri()


@pytest.fixture
def cluster() -> Iterator[StandaloneCluster]:
    """A master and two workers in namespaces of their own; skipped where that cannot be."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(f"no standalone cluster with private /tmp here: {reason}")
    # C1 only in the daemons and their executors: short-lived JVMs on 2 cores
    env = {"JDK_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1"}
    with shared_directory() as base, StandaloneCluster(base, env=env) as running:
        yield running


class Driver:
    """One run of ``tickwheel pipeline stream`` in a process group of its own."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.out = cwd / f"{name}.out"
        self.err = cwd / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tickwheel.pipeline.stream", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )

    def stdout(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(encoding="utf-8", errors="replace")

    def output(self) -> str:
        return f"stdout:\n{self.stdout()[-3000:]}\nstderr:\n{self.stderr()[-6000:]}"

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        """The driver's exit status, once its JVM has ended too (it follows the Python
        process out, stopping the SparkContext and closing the event log)."""
        deadline = time.monotonic() + timeout
        try:
            status = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver ran over {timeout}s\n{self.output()}")
        while group_members(self.process.pid):
            if time.monotonic() > deadline:
                pytest.fail(f"the driver's JVM outlived it by {timeout}s\n{self.output()}")
            time.sleep(0.05)
        return status

    def kill(self) -> None:
        """SIGKILL what is left of the driver's process group (its JVM too)."""
        kill_all(self.process.pid)
        self.process.wait(timeout=30)


def running_tasks(cluster: StandaloneCluster, worker: int) -> int:
    """How many tasks worker ``worker``'s executors have started (their logs' lines)."""
    logs = cluster.executor_logs(worker).values()
    return sum(text.count("Executor: Running task ") for text in logs)


def event_logs(directory: Path) -> list[list[dict[str, Any]]]:
    """Each application's Spark events, in the order the master numbered the
    applications; a killed driver's log (``.inprogress``) may end mid-line."""
    files = sorted(directory.iterdir(), key=lambda p: p.name.split(".")[0].rsplit("-", 1)[1])
    apps = []
    for path in files:
        events = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the last line of a log cut by SIGKILL
        apps.append(events)
    return apps


def executor_hosts(events: list[dict[str, Any]]) -> dict[str, str]:
    """Executor id → host, from the executors' ``SparkListenerExecutorAdded`` events."""
    return {
        e["Executor ID"]: e["Executor Info"]["Host"]
        for e in events
        if e["Event"] == "SparkListenerExecutorAdded"
    }


def succeeded_tasks(events: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(host, launch time in ms) of every task that succeeded."""
    return [
        (e["Task Info"]["Host"], e["Task Info"]["Launch Time"])
        for e in events
        if e["Event"] == "SparkListenerTaskEnd" and e["Task End Reason"]["Reason"] == "Success"
    ]


def wait_until(ready: Any, timeout: float, what: str, driver: Driver) -> None:
    """Poll ``ready()`` until true; fail after ``timeout`` s or if the driver ends first."""
    deadline = time.monotonic() + timeout
    while not ready():
        if driver.process.poll() is not None:
            pytest.fail(f"the driver ended ({driver.process.returncode}) before {what}\n"
                        f"{driver.output()}")  # fmt: skip
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{driver.output()}")
        time.sleep(0.05)


@pytest.mark.parametrize("provider", ["driver", "partitioned"])
def test_stream_survives_a_driver_kill_and_a_lost_worker(
    spark: Any, cluster: StandaloneCluster, provider: str
) -> None:
    """Driver SIGKILLed mid-batch, rerun, worker 2 lost mid-run: the reference's outputs.
    With the state's operations partitioned on the executors (a bound of one byte),
    the stores worker 2 held are lost with it: the rerun loads them again from the
    checkpoint onto worker 1, and the outcomes are the same."""
    base = cluster.base
    gen = base / "gen"
    generate_orders(300, gen, seed=23, files=INCREMENTS)
    rules = write_rules(base / "rules.toml")
    ref = run_reference(iter_input_lines(gen), load_rules(rules))
    feed(sorted(gen.glob("part-*.jsonl")), fresh(base / "in"), INCREMENTS)
    events = fresh(base / "events")
    conf = cluster.driver_conf(
        **{
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",  # one plain file per application
        }
    )
    env = {**subprocess_env(), "SPARK_CONF_DIR": str(cluster.driver_conf_dir(conf))}
    args = [
        "--rules", str(rules),
        "--input", location(base / "in"),
        "--output", location(base / "out"),
        "--checkpoint", location(base / "ck"),
        "--trigger", "available-now",
        "--max-files-per-trigger", "1",
        "--partitions", "2",
        "--sink", "parquet",
        "--master", cluster.master_url,
        "--driver-memory", "1g",
    ]  # fmt: skip
    if provider == "partitioned":
        args += ["--driver-state-bytes", "1"]
    drivers: list[Driver] = []
    try:
        # 1. the driver dies mid-batch 1
        first = Driver("driver-1", args, {**env, "TICKWHEEL_FAULT": "mid_batch:1"}, base)
        drivers.append(first)
        assert first.wait() == -signal.SIGKILL, first.output()
        assert "SIGKILL at mid_batch of batch 1" in first.stderr(), first.output()
        assert "batch 0: " in first.stdout(), first.output()
        # each worker ran an executor, whose directory is in that worker's /tmp alone
        for worker in (1, 2):
            assert cluster.executor_logs(worker), f"worker {worker} ran no executor"
        assert not Path(WORKER_DIR).exists()

        # 2. the rerun replays batch 1; while a later batch runs, worker 2 goes away
        second = Driver("driver-2", args, env, base)
        drivers.append(second)
        wait_until(lambda: "batch 1: " in second.stdout(), RUN_TIMEOUT, "batch 1's end", second)
        before = running_tasks(cluster, 2)
        wait_until(
            lambda: running_tasks(cluster, 2) > before,
            RUN_TIMEOUT,
            "a task on worker 2 after batch 1",
            second,
        )
        cluster.kill_worker(2)
        cluster.wait_for(
            lambda s: cluster.alive_worker_hosts(s) == [WORKER_1], "worker 2 to be lost"
        )
        assert second.wait() == 0, second.output()
        assert second.process.returncode == 0
        if provider == "partitioned":  # worker 2's stores went with it
            assert "loaded again" in second.stderr(), second.output()
    finally:
        for driver in drivers:
            driver.kill()

    # Nothing lost, nothing doubled.
    # URIs: Spark's file source took the files (its log), not the local ordered one
    assert (base / "ck" / "spark" / "sources" / "0").is_dir()
    assert not (base / "ck" / "tickwheel" / "files.log").exists()
    sink = ParquetSink(location(base / "out"), spark)
    assert sink.committed_batches() == list(range(INCREMENTS))
    compare_with_reference(read_stream_outputs(spark, sink, location(base / "ck")), ref)

    # Both runs had an executor on each worker; the second lost worker 2's and
    # went on on worker 1's.
    apps = event_logs(events)
    assert len(apps) == 2, sorted(p.name for p in events.iterdir())
    for app in apps:
        assert sorted(executor_hosts(app).values()) == [WORKER_1, WORKER_2]
    assert {host for host, _ in succeeded_tasks(apps[0])} == {WORKER_1, WORKER_2}
    hosts = executor_hosts(apps[1])
    removed = [
        e["Timestamp"]
        for e in apps[1]
        if e["Event"] == "SparkListenerExecutorRemoved" and hosts[e["Executor ID"]] == WORKER_2
    ]
    assert len(removed) == 1, [e for e in apps[1] if e["Event"] == "SparkListenerExecutorRemoved"]
    after = [host for host, launched in succeeded_tasks(apps[1]) if launched > removed[0]]
    assert after, "no task started after worker 2 was lost"
    assert set(after) == {WORKER_1}
