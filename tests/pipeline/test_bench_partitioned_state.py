"""The partitioned state's benchmark still runs both designs and checks its outcomes.

Tiny sizes on ``local[2]``, one run: this checks that the script works (the load, every
payment found once, each row and ratio printed), never how fast anything is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.jvm_process]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_partitioned_state.py"


def test_both_designs_run_and_find_every_payment_once() -> None:
    pytest.importorskip("rocksdict")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--pending", "300", "900", "--batches", "3",
         "--records", "40", "--buckets", "4"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("pending ")]
    assert [line.split(";")[0] for line in lines] == ["pending 300", "pending 900"]
    for line in lines:
        assert "partitions found local, least 100% of 2" in line  # local[2]: 2 partitions
        assert "state store " in line and "not finished" not in line
    assert "embedded: 900 against 300 pending: " in done.stdout
    assert "state store against the floor at 900: " in done.stdout


def test_bad_arguments_are_named() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--batches", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--batches >= 2" in done.stderr
