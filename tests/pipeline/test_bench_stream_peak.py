"""The peak benchmark still runs its stream and checks the pending count at the end.

Tiny sizes, one run: this checks that the script works, never how fast anything is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.jvm_process]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_stream_peak.py"


def test_the_micro_batch_after_a_peak_is_reported_against_both_steady_ones() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--pending", "300", "--peak", "500", "--batches", "3",
         "--records", "20"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    seconds = out.split("micro-batches (s): ")[1].splitlines()[0].split()
    assert len(seconds) == 8  # the load, 3 steady, the peak, 3 steady
    assert "the first after the peak against the steady one after it: " in out
    assert "checked: " in out and "pending at the end, as generated" in out


def test_bad_arguments_are_named() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--batches", "2"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "--batches >= 3" in done.stderr
