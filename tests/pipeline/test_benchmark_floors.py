"""The pipeline benchmarks' floors do the work their docs say they do.

A floor is the least a job of some shape costs; the benchmarks compare
tickwheel's job with it. These tests check what the floors run, never how
fast: the batch floor of the semantics writes one outcome row per open event,
in tickwheel's outcome columns, and the command-line floor of the stream
reads every file, one micro-batch per trigger, writes each micro-batch, and
reports each one's progress (``--progress``, which ``bench_stream_steady.py`` reads).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from stream_support import subprocess_env

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench_pipeline() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("bench_pipeline")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_raw_skeleton_writes_one_outcome_row_per_open_event() -> None:
    pa = pytest.importorskip("pyarrow")
    from tickwheel.pipeline.spark.outputs import OUTCOME_COLUMNS

    bench = _bench_pipeline()
    batch = pa.record_batch(
        [
            pa.array(["o1", "o1", "o2", "o3"]),
            pa.array([1_000, 2_000, 3_000, 4_000], pa.int64()),
            pa.array([0, 0, 0, 0], pa.int64()),
            pa.array(["e1", "e2", "e3", "e4"]),
            pa.array(["created", "paid", "created", "cancelled"]),
        ],
        names=["order_id", "t", "q", "event_id", "type"],
    )
    rows = pa.Table.from_batches(list(bench._open_rows(iter([batch, batch.slice(0, 0)]))))
    assert tuple(rows.column_names) == OUTCOME_COLUMNS
    assert rows.to_pydict() == {
        "rule": ["payment", "payment"],
        "key": ["o1", "o2"],
        "op_id": ["e1", "e3"],
        "opened_at": [1_000, 3_000],
        "deadline": [1_000 + bench.TIMEOUT_MS, 3_000 + bench.TIMEOUT_MS],
        "outcome": ["expired", "expired"],
        "resolved_at": [1_000 + bench.TIMEOUT_MS, 3_000 + bench.TIMEOUT_MS],
        "latency_ms": [bench.TIMEOUT_MS, bench.TIMEOUT_MS],
        "resolve_event_id": [None, None],
    }


@pytest.mark.jvm_process
@pytest.mark.spark
def test_the_command_line_floor_reads_every_file_and_writes_each_micro_batch(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(3):
        lines = [
            {"event_id": f"e{i}-{j}", "order_id": f"o{j}", "type": "created",
             "ts": 1_704_067_200_000 + i * 1_000 + j, "seq": 0}
            for j in range(4)
        ]  # fmt: skip
        (inp / f"part-{i}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "peer_transform_with_state.py"), "--api", "floor",
         "--input", str(inp), "--output", str(out), "--checkpoint", str(tmp_path / "ck"),
         "--triggers", "3", "--progress", str(tmp_path / "progress.jsonl")],
        capture_output=True, text=True, timeout=180, check=False,
        env=subprocess_env(),  # loopback, and C1 only: a short-lived JVM, as the stream's
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "floor: 3 micro-batches in " in done.stdout
    # Each micro-batch's progress, one JSON line as Spark reported it (the floor keeps no state).
    progress = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(p["batch"], p["data"], p["state_rows"]) for p in progress] == [
        (0, True, {}), (1, True, {}), (2, True, {}),
    ]  # fmt: skip
    assert all(p["ms"] > 0 for p in progress)
    pq = pytest.importorskip("pyarrow.parquet")
    written = sorted(path.name for path in out.iterdir())
    assert written == ["batch-0", "batch-1", "batch-2"]
    ids = sorted(i for name in written for i in pq.read_table(out / name)["event_id"].to_pylist())
    assert ids == sorted(f"e{i}-{j}" for i in range(3) for j in range(4))
