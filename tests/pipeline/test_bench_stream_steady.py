"""``benchmarks/bench_stream_steady.py`` runs, and its input and tables say what they claim.

Never how fast: the workload leaves the pending operations it says it does,
each program's figures are read from what it prints, the tables give each
ratio, and the script runs end to end from the command line at a tiny size,
the stream only (Spark's peer takes a minute even there; its progress file is
checked in ``test_benchmark_floors.py``, and its reading here).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from stream_support import subprocess_env

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench() -> ModuleType:
    # The benchmark imports Spark's stateful peers: the spark extra.
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("bench_stream_steady")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_workload_leaves_the_operations_it_says(tmp_path: Path) -> None:
    bench = _bench()
    workload = bench.write_workload(tmp_path / "in", 100, batches=3, records=40)
    files = sorted(workload.input.iterdir())
    assert [f.name for f in files] == [f"part-{i:05d}.jsonl" for i in range(4)]
    assert [f.stat().st_mtime for f in files] == sorted(f.stat().st_mtime for f in files)
    pending: set[str] = set()
    times, paid = [], 0
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            times.append(event["ts"])
            if event["type"] == "created":
                pending.add(event["order_id"])
            else:  # each payment completes an order still pending
                pending.remove(event["order_id"])
                paid += 1
    assert times == sorted(set(times))  # in order, no two at one millisecond
    assert (len(pending), paid) == (workload.pending, workload.paid) == (100 + 90 - 30, 30)


def test_the_figures_are_read_from_what_each_program_writes(tmp_path: Path) -> None:
    bench = _bench()
    stdout = (
        "[12:00:00] stream: starting Spark (local[2])\n"
        "[12:00:09] stream: batch 0: 1 file(s), duplicates=0, events=1000 in 6.1s\n"
        "[12:00:12] stream: batch 1: 1 file(s), events=1000 in 0.9s; WARNING: odd\n"
        '[12:00:13] stream: done: {"watermark": 5}\n'
    )
    batches = bench.stream_batches(stdout, {0: 6.5, 1: 1.0})
    assert [(b.index, b.seconds, b.span) for b in batches] == [(0, 6.1, 6.5), (1, 0.9, 1.0)]
    progress = tmp_path / "progress.jsonl"
    rows = [(0, True, 9000, 100), (1, True, 800, 150), (2, False, 300, 150)]
    progress.write_text("".join(
        json.dumps({"batch": i, "data": data, "ms": ms,
                    "state_rows": {bench.PEER_OPERATOR: n, "dedupeWithinWatermark": 7}}) + "\n"
        for i, data, ms, n in rows
    ))  # fmt: skip
    batches = bench.peer_batches(progress, {0: 9.1})
    assert [(b.index, b.seconds, b.span, b.pending) for b in batches] == [
        (0, 9.0, 9.1, 100), (1, 0.8, None, 150),
    ]  # fmt: skip
    ck = tmp_path / "ck"
    for name in ("offsets", "commits"):
        (ck / name).mkdir(parents=True)
    (ck / "offsets" / "0").write_text('v1\n{"batchTimestampMs":1000000}\n{"logOffset":0}\n')
    (ck / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    os.utime(ck / "commits" / "0", (1002.5, 1002.5))
    assert bench.checkpoint_spans(ck) == {0: 2.5}


def _side(bench: ModuleType, name: str, seconds: list[float]) -> object:
    batches = [bench.Batch(i, s, s + 0.1) for i, s in enumerate(seconds)]
    return bench.Outcome(name, bench._Run(0, sum(seconds)), batches, 0)


def test_the_tables_give_each_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    workload = bench.Workload(Path("in"), 0, 0, 4)
    sizes = [
        bench.Size(n, workload, _side(bench, "stream", stream), _side(bench, bench.PEER, peer))
        for n, stream, peer in (
            (1_000, [5.0, 2.0, 1.0, 1.0], [20.0, 4.0, 3.0, 3.0]),
            (1_000_000, [30.0, 9.0, 2.0, 2.0], [500.0, 5.0, 8.0, 8.0]),
        )
    ]
    bench.report(sizes, bench._parse(["--pending", "1e3", "1e6", "--batches", "3"]))
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.lstrip().startswith(("1e3 ", "1e6 "))]
    # load, first, steady, then the peer's, peer / tickwheel, tickwheel against 1e3
    assert rows[0] == ["1e3", "5.00", "2.00", "1.00", "20.00", "4.00", "3.00", "3.00x", "1.00x"]
    assert rows[1] == ["1e6", "30.00", "9.00", "2.00", "500.00", "5.00", "8.00", "4.00x", "2.00x"]
    assert rows[3][3] == "2.10"  # the same from the checkpoints' spans
    targets = [line.split() for line in out if line.startswith(("tickwheel's", bench.PEER))]
    assert [row[-5:] for row in targets] == [
        ["2.00x", "<=", "1.3x", "NOT", "met"],  # tickwheel's steady at 1e6 against 1e3
        ["pending", "4.00x", ">=", "3x", "met"],  # the peer's against tickwheel's at 1e6
    ]


@pytest.mark.jvm_process
@pytest.mark.spark
@pytest.mark.slow
def test_the_benchmark_runs_from_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_stream_steady.py"), "--pending", "1e3",
         "--batches", "2", "--peers", "none", "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=240, check=False,
        env=subprocess_env(),  # loopback, and C1 only: a short-lived JVM
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "checked: stream: 2,000 pending at the end, as generated" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("     1e3 ")]
    rows = [row for row in rows if len(row) == 9]
    assert len(rows) == 2  # the programs' own figures, and the checkpoints'
    for row in rows:  # load, first, steady, the peer's three (not run), its ratio, vs 1e3
        assert row[4:8] == ["-", "-", "-", "-"] and row[8] == "1.00x"
        assert all(float(cell) > 0 for cell in row[1:4])
    assert "transformWithStateInPandas: not run: --peers none" in out


@pytest.mark.spark
@pytest.mark.jvm_process
@pytest.mark.slow
def test_the_providers_benchmark_runs_both_providers_end_to_end(tmp_path: Path) -> None:
    """``bench_state_providers.py`` at a tiny size: the stream with the operations in the
    driver and partitioned on the executors, each ending with the operations it
    generated pending (the script checks), and a row of both in its table."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_state_providers.py"), "--pending", "300",
         "--batches", "2", "--records", "40"],
        capture_output=True, text=True, timeout=400, check=False, env=subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "3e2 pending: driver: micro-batches " in out
    assert "3e2 pending: partitioned: micro-batches " in out
    rows = [line.split() for line in out.splitlines() if line.startswith("     3e2 ")]
    assert len(rows) == 1 and rows[0][3].endswith("x"), out  # the ratio of the two
