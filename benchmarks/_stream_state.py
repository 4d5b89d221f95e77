"""The stream's memory per micro-batch and its carried state's size, measured.

Used by ``bench_pipeline_incremental.py``: the JVM's and the Python workers'
resident and peak memory after each micro-batch (from ``/proc``: the readers
``bench_pipeline_soak.py`` shares), the
carried state at the end of a run, and the bytes a pending operation costs in
a processor's heap and in the checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _pipeline_names import Event, PartitionProcessor, Rule


def status_mb(pid: int, field: str, name: str = "status") -> float:
    """``field`` of ``/proc/PID/<name>`` (``status``, or ``smaps_rollup`` for ``Pss``)
    in MB; NaN when the file has no such field."""
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _values_mb(pids: list[int], field: str, name: str) -> list[float]:
    """``field`` of each of ``pids`` in MB; a process without it (a zombie, or one gone
    since it was listed) is left out, as its NaN would poison a max or a sum."""
    values = []
    for pid in pids:
        try:
            value = status_mb(pid, field, name)
        except OSError:
            continue
        if not math.isnan(value):
            values.append(value)
    return values


def _largest(pids: list[int], field: str) -> float:
    """The largest ``field`` of ``pids`` in MB (0 for none)."""
    return max(_values_mb(pids, field, "status"), default=0.0)


def total_mb(pids: list[int], field: str, name: str = "status") -> float:
    """The sum of ``field`` over ``pids`` in MB (``Pss`` from ``smaps_rollup``: the pages
    a forked worker shares with its daemon count once)."""
    return sum(_values_mb(pids, field, name))


def python_workers(jvm: int) -> list[int]:
    """The JVM's Python daemon and workers (its child processes, and theirs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [jvm]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                found.append(pid)
                todo.append(pid)
    return found


@contextlib.contextmanager
def memory_per_batch(spark: Any, memory: list[dict[str, float]]) -> Iterator[None]:
    """Within the block, after each micro-batch of this process's streams, record the
    JVM's and the Python workers' RSS and peak RSS."""
    from tickwheel.pipeline.stream.runner import MicroBatches

    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    inner = MicroBatches.__call__

    def run_batch(self: MicroBatches, frame: Any, batch_id: int) -> Any:
        out = inner(self, frame, batch_id)
        workers = [pid for pid in python_workers(jvm) if Path(f"/proc/{pid}").exists()]
        memory.append({
            "jvm_rss": status_mb(jvm, "VmRSS"), "jvm_peak": status_mb(jvm, "VmHWM"),
            "driver_peak": status_mb(os.getpid(), "VmHWM"),
            "worker_rss": _largest(workers, "VmRSS"),
            "worker_peak": _largest(workers, "VmHWM"),
        })  # fmt: skip
        return out

    MicroBatches.__call__ = run_batch  # type: ignore[method-assign]
    try:
        yield
    finally:
        MicroBatches.__call__ = inner  # type: ignore[method-assign]


def state_bytes_per_pending(n: int = 100_000) -> float:
    """Python heap bytes per pending operation in a processor (tracemalloc)."""
    rule = Rule("payment", "order_id", ("created",), ("paid",), ("cancelled",), 1_800_000)
    events = [Event(0, f"o{i:08d}", 1_000 + i, 0, f"e{i:09d}", 0, "created") for i in range(n)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    proc = PartitionProcessor([rule])
    proc.process(events)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(proc.pending_operations()) == n
    proc.close()
    return (after - before) / n


def parquet_bytes_per_pending(n: int = 100_000) -> float:
    """Bytes per pending operation of the checkpoint's ``ops`` state, as Parquet (snappy).

    The rows are those the stream writes for pending operations (kind, rule,
    key, op id, opened_at, deadline), for ``n`` generated orders' creations.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = 1_704_067_200_000
    table = pa.table(
        {
            "kind": ["pending"] * n,
            "rule": ["payment"] * n,
            "key": [f"o{i:08d}" for i in range(n)],
            "event_id": [f"e{2 * i:09d}" for i in range(n)],
            "time": [t0 + 50 * i for i in range(n)],
            "deadline": [t0 + 50 * i + 1_800_000 for i in range(n)],
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ops.parquet")
        pq.write_table(table, path, compression="snappy")
        return os.path.getsize(path) / n


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.parquet"))


def state_line(spark: Any, run: Path) -> str:
    """The carried state at the end of a stream run: pending operations, ``ops`` rows, bytes."""
    from pyspark.sql import functions as F

    from tickwheel.pipeline.storage import LocalStorage
    from tickwheel.pipeline.stream.checkpoint import StateStore

    store = StateStore(str(run / "ck" / "tickwheel"), LocalStorage())
    last = Path(store.state_path(store.read_commit(store.committed()[-1])))
    ops = spark.read.parquet(str(last / "ops"))
    pending = ops.where(F.col("kind") == "pending").count()
    rows, size = ops.count(), _dir_bytes(last / "ops")
    return (f"state after {run.name}: {pending:,} pending ops at the end; ops state {rows:,} rows, "
            f"{size:,} B Parquet ({size / max(rows, 1):.1f} B/row)")  # fmt: skip


def print_memory(memory: list[dict[str, float]]) -> None:
    """Print what :func:`memory_per_batch` recorded, one line per micro-batch."""
    print("memory after each increment (MB; the best stream run): "
          "JVM RSS / peak, Python workers' largest RSS / peak, this driver's peak")  # fmt: skip
    for i, m in enumerate(memory):
        print(f"  increment {i + 1:>2}: JVM {m['jvm_rss']:,.0f} / {m['jvm_peak']:,.0f}, "
              f"workers {m['worker_rss']:,.0f} / {m['worker_peak']:,.0f}, "
              f"driver {m['driver_peak']:,.0f}")  # fmt: skip
