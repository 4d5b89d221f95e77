"""The idle-timeout example runs bounded in time: idle connections closed, active ones kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "idle_timeouts.py"

pytestmark = pytest.mark.timeout(180)


def test_idle_connections_closed_active_ones_survive() -> None:
    # Fewer connections than the example's default 5,000 to keep CI quick.
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--connections", "400", "--idle-timeout", "0.5"],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "connections           400 of 400" in out
    assert "idle closed           200 of 200" in out
    assert "active survived       200 of 200" in out
    assert "closed early          0" in out
    assert "result                OK" in out
    assert proc.stderr == ""


def test_bad_arguments_are_rejected() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--connections", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--connections >= 1" in proc.stderr
