"""Helpers of the incremental-pipeline tests (imported by the test modules)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: The environment variable that makes a test process's session a Connect one
#: (``conftest.py``): ``classic`` (the default) or ``connect``.
SESSION_ENV = "TICKWHEEL_TEST_SESSION"


def connect_run() -> bool:
    """Whether this test process runs on Spark Connect (:data:`SESSION_ENV`)."""
    kind = os.environ.get(SESSION_ENV, "classic")
    if kind not in ("classic", "connect"):
        raise ValueError(f"{SESSION_ENV} must be classic or connect, got {kind!r}")
    return kind == "connect"


def connect_url(spark: Any) -> str:
    """The ``sc://`` URL of the Connect server that a Connect test process's session
    talks to (``conftest.py`` starts it in the process, on a free loopback port)."""
    return f"sc://127.0.0.1:{spark.conf.get('spark.connect.grpc.binding.port')}"


ORDERS_TOML = ROOT / "examples" / "orders.toml"

OUTCOME_COLS = [
    "rule",
    "key",
    "op_id",
    "opened_at",
    "deadline",
    "outcome",
    "resolved_at",
    "latency_ms",
    "resolve_event_id",
]
UNMATCHED_COLS = ["rule", "key", "event_id", "event_type", "event_time", "reason"]
REJECTED_COLS = ["event_id", "reason", "raw", "raw_bytes"]


def sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Sort rows holding None next to values."""
    return tuple((v is not None, v) for v in row)


def rows(df: Any, cols: list[str]) -> list[tuple[Any, ...]]:
    """All rows of ``df`` (duplicates kept) as sorted tuples of ``cols``."""
    if df is None:
        return []
    return sorted((tuple(r[c] for c in cols) for r in df.collect()), key=sort_key)


def write_rules(path: Path, lateness: str = "3m") -> Path:
    """examples/orders.toml with an allowed lateness above the generator's 2 min shuffle."""
    text = ORDERS_TOML.read_text(encoding="utf-8")
    text = text.replace('allowed_lateness = "0"', f'allowed_lateness = "{lateness}"')
    assert f'allowed_lateness = "{lateness}"' in text
    path.write_text(text, encoding="utf-8")
    return path


def feed(src_files: list[Path], dest: Path, groups: int, start: int = 0) -> list[Path]:
    """Concatenate ``src_files`` (in order) into ``groups`` increment files in ``dest``.

    Modification times increase with the increment, so the stream's file source
    (ordered by modification time) takes them in order.
    """
    dest.mkdir(parents=True, exist_ok=True)
    per = -(-len(src_files) // groups)
    out = []
    for g in range(groups):
        chunk = src_files[g * per : (g + 1) * per]
        if not chunk:
            continue
        target = dest / f"inc-{start + g:04d}.jsonl"
        with target.open("w", encoding="utf-8") as fh:
            for src in chunk:
                fh.write(src.read_text(encoding="utf-8"))
        stamp = 1_700_000_000 + start + g
        os.utime(target, (stamp, stamp))
        out.append(target)
    return out


def compare_with_reference(outs: dict[str, Any], ref: Any) -> None:
    """Assert the stream's outputs equal the reference's, row for row."""
    assert rows(outs["outcomes"], OUTCOME_COLS) == sorted(ref.outcomes, key=sort_key)
    assert rows(outs["unmatched"], UNMATCHED_COLS) == sorted(ref.unmatched, key=sort_key)
    assert rows(outs["rejected"], REJECTED_COLS) == sorted(ref.rejected, key=sort_key)
    buffered = rows(outs["buffered"], ["event_id", "time"])
    assert buffered == sorted({(b[2], b[4]) for b in ref.buffered}, key=sort_key)
    assert rows(outs["late"], ["event_id"]) == []


def subprocess_env(fault: str | None = None) -> dict[str, str]:
    """Environment of a stream job run as a subprocess (loopback, this interpreter)."""
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.pop("TICKWHEEL_FAULT", None)
    # A Connect test process's own session state is not its children's: each job
    # starts the session it asks for.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE"):
        env.pop(name, None)
    if fault is not None:
        env["TICKWHEEL_FAULT"] = fault
    # Each of these drivers lives for a few small micro-batches, so the JVM's
    # optimising (C2) compiler mostly competes with the work for the 2 cores (the
    # tests' shared session runs C1 only too: conftest.py).
    env["JDK_JAVA_OPTIONS"] = f"{env.get('JDK_JAVA_OPTIONS', '')} -XX:TieredStopAtLevel=1".strip()
    return env


def fresh(path: Path) -> Path:
    """An empty directory at ``path``."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
