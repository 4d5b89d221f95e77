"""examples/echo_idle.py runs small on both loops and its checks hold (no timing asserts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "echo_idle.py"


def test_echo_server_times_out_the_silent_half_on_both_loops() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--connections", "60", "--messages", "3", "--idle", "0.2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("stock", "tickwheel"))]
    assert [row.split()[0] for row in rows] == ["stock", "tickwheel"]
    assert "(EventLoop)" in rows[1]
    for row in rows:
        # 60 x 3 lines echoed, 30 silent connections timed out, the check held.
        assert row.split()[-3:] == ["180", "30", "ok"], row


def test_bad_arguments_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--connections", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "--connections >= 2" in done.stderr
