"""Kill the driver (SIGKILL) at named points of a multi-batch run; restart; compare.

Each run is ``python -m tickwheel.pipeline.stream`` in a subprocess (its own
driver and JVM). ``TICKWHEEL_FAULT=POINT:BATCH`` makes the driver kill itself at
POINT of micro-batch BATCH; the next run restarts from the checkpoint. After the
last, uninterrupted run, the outputs equal the batch semantics (the reference):
no row lost, none doubled. The same for the Parquet and the PostgreSQL sinks.

Every fault point is taken by ``test_sources.py``'s Kafka-like job (with the
checkpoint and output at URIs on a classic session, at local paths under
Spark Connect); here, the command line's file source and each sink take the
points where they differ: the Parquet sink's half-written attempt left aside
and its replay killed again, the PostgreSQL sink's staged rows left behind
and its transaction committed before Spark's own commit log; and what
``read_stream_outputs`` reads between the checkpoint's commit of a batch and
its publication in the sink.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference, feed, fresh, subprocess_env, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.sinks import ParquetSink, PostgresSink
from tickwheel.pipeline.stream.checkpoint import FAULT_POINTS
from tickwheel.pipeline.stream.resident import SNAPSHOT_EVERY_ENV
from tickwheel.pipeline.stream.start import read_stream_outputs

# Up to four driver starts per test (killed runs, then a clean one): a JVM each; generous
# bound for shared, loaded CI machines.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.jvm_process,
]

#: A snapshot of the state every K = 3 commits: batches 0 and 3 commit the whole
#: state, 1, 2 and 4 its changelog (``stream/resident.py``).
SNAPSHOT_EVERY = "3"
#: (point, batch) of each killed run of the command line's Parquet job, in order; the
#: run after the last kill ends. Batch 3 dies once committed, before its outputs are
#: published; at the end, the job dies writing batch 4's state whole beside its
#: changelog. (The points before a commit are killed along the Kafka-like topic's
#: job, whose Parquet sink is the same: ``test_sources.py``.)
PARQUET_KILLS = [("after_commit", 3), ("mid_snapshot", 4)]
#: The same for the PostgreSQL sink: staged rows left (a snapshot's batch), then rows
#: committed before Spark's own commit log (a changelog's batch).
POSTGRES_KILLS = [("mid_batch", 0), ("after_sink_commit", 2)]


def _run(args: list[str], fault: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tickwheel.pipeline.stream", *args],
        env={**subprocess_env(fault), SNAPSHOT_EVERY_ENV: SNAPSHOT_EVERY},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _stream_args(tmp: Path, extra: list[str]) -> tuple[list[str], Any, list[Path]]:
    """The job's arguments over 150 orders in 5 files, its reference, and the files."""
    gen = tmp / "gen"
    generate_orders(150, gen, seed=5, files=5)
    rules = write_rules(tmp / "rules.toml")
    ref = run_reference(iter_input_lines(gen), load_rules(rules))
    files = sorted(gen.glob("part-*.jsonl"))
    feed(files, fresh(tmp / "in"), 5)
    args = [
        "--rules",
        str(rules),
        "--input",
        str(tmp / "in"),
        "--output",
        str(tmp / "out"),
        "--checkpoint",
        str(tmp / "ck"),
        "--trigger",
        "available-now",
        "--max-files-per-trigger",
        "1",
        "--partitions",
        "2",
        *extra,
    ]
    return args, ref, files


def _kill_and_restart(
    tmp: Path,
    extra: list[str],
    kills: list[tuple[str, int]],
    after_kill: Callable[[str, int, list[Path]], None] | None = None,
) -> tuple[Path, Any, list[subprocess.CompletedProcess[str]]]:
    """The job killed at each of ``kills`` in turn (``after_kill(point, batch, files)``
    looks at what each left), then run to the end: its reference and every run."""
    args, ref, files = _stream_args(tmp, extra)
    assert {p for p, _ in kills} <= set(FAULT_POINTS)
    runs = []
    for point, batch in kills:
        proc = _run(args, f"{point}:{batch}")
        runs.append(proc)
        assert proc.returncode == -signal.SIGKILL, (point, batch, proc.stderr[-3000:])
        assert f"SIGKILL at {point} of batch {batch}" in proc.stderr
        if after_kill is not None:
            after_kill(point, batch, files)
    proc = _run(args, None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp, ref, [*runs, proc]


@pytest.mark.parametrize("provider", ["driver", "partitioned"])
def test_kill_and_restart_parquet_sink(spark: Any, tmp_path: Path, provider: str) -> None:
    """Two SIGKILLs, then a clean run: exactly the uninterrupted outputs, with the state's
    operations in the driver or partitioned on the executors (a bound of one byte).

    Killed after the checkpoint committed batch 3 and before the sink
    published it, ``read_stream_outputs``, given the checkpoint alone, reads
    what batches 0 to 2 and their own state make (a batch run over their
    three files; batch 2's state is its changelogs applied to batch 0's),
    never batch 3's outcomes beside batch 2's pending rows; the restart
    publishes batch 3, once. Killed while writing batch 4's state whole at the
    end, the checkpoint still reads batch 4's state from its changelog."""
    rules = tmp_path / "rules.toml"

    def after_kill(point: str, batch: int, files: list[Path]) -> None:
        if point not in ("after_commit", "mid_snapshot"):
            return
        done = batch + 1 if point == "mid_snapshot" else batch
        assert ParquetSink(str(tmp_path / "out")).committed_batches() == list(range(done))
        before = run_reference(
            (line for f in files[:done] for line in iter_input_lines(f)), load_rules(rules)
        )
        outs = read_stream_outputs(spark, checkpoint=str(tmp_path / "ck"))
        compare_with_reference(outs, before)

    extra = ["--sink", "parquet"]
    if provider == "partitioned":
        extra += ["--driver-state-bytes", "1"]
    tmp, ref, runs = _kill_and_restart(tmp_path, extra, PARQUET_KILLS, after_kill)
    rolled = "batch 3: already committed; its outputs published now"
    assert [rolled in run.stdout for run in runs] == [False, True, False]
    sink = ParquetSink(str(tmp / "out"))
    assert sink.committed_batches() == [0, 1, 2, 3, 4]
    compare_with_reference(read_stream_outputs(spark, sink, str(tmp / "ck")), ref)


@pytest.fixture
def postgres() -> Iterator[Any]:
    """A throw-away PostgreSQL server on 127.0.0.1 (Debian's package), stopped after."""
    from support.pgserver import PostgresUnavailable, ThrowawayPostgres

    try:
        server = ThrowawayPostgres()
    except PostgresUnavailable as exc:  # pragma: no cover - system-deps installs it
        pytest.fail(str(exc))
    with server:
        yield server


def test_kill_and_restart_postgres_sink(spark: Any, tmp_path: Path, postgres: Any) -> None:
    """The same with the PostgreSQL sink: one transaction per batch, replays are no-ops."""
    url = postgres.jdbc_url
    tmp, ref, _ = _kill_and_restart(
        tmp_path, ["--sink", "postgresql", "--jdbc-url", url], POSTGRES_KILLS
    )
    sink = PostgresSink(url, spark)
    assert sink.committed_batches() == [0, 1, 2, 3, 4]
    assert postgres.psql("SELECT count(*) FROM tickwheel_batches").strip() == "5"
    compare_with_reference(read_stream_outputs(spark, sink, str(tmp / "ck")), ref)
