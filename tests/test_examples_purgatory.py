"""The purgatory examples run, and tell the truth about what completed and what timed out."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.mark.parametrize("name", ["delayed_produce", "delayed_fetch"])
def test_example_runs_as_a_script(name: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "completed=" in result.stdout


def test_delayed_produce_acks_or_times_out() -> None:
    module = _load("delayed_produce")
    outcomes, purgatory = module.simulate()
    timeout = module.REQUEST_TIMEOUT_MS
    assert len(outcomes) == 15
    acked = [o for o in outcomes if o.result == "acked"]
    timed_out = [o for o in outcomes if o.result == "timed out"]
    assert len(acked) + len(timed_out) == len(outcomes)  # nothing left pending
    assert acked and timed_out
    for o in timed_out:
        # Replica 3 stalls from 1000 to 2800 ms: a request sent in the stall whose
        # timeout ends before the stall does, times out exactly at its timeout.
        assert o.sent_ms >= 1_000 and o.sent_ms + timeout < 2_800
        assert o.at_ms - o.sent_ms == timeout
    for o in acked:
        assert 0 <= o.at_ms - o.sent_ms < timeout
    assert purgatory.num_completed == len(acked)
    assert purgatory.num_expired == len(timed_out)
    assert purgatory.num_delayed == 0


def test_delayed_produce_prints_both_outcomes() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "delayed_produce.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.splitlines()
    rows = lines[2:-1]
    assert len(rows) == 15
    assert sum(" acked " in row for row in rows) == 13
    assert sum(" timed out " in row for row in rows) == 2
    assert lines[-1].startswith("13 acked, 2 timed out")


def test_delayed_fetch_min_bytes_or_max_wait() -> None:
    module = _load("delayed_fetch")
    responses, purgatory = module.simulate()
    by_name = {r.consumer: r for r in responses}
    dashboard, aggregator, archiver = (
        by_name["dashboard"],
        by_name["aggregator"],
        by_name["archiver"],
    )
    assert (dashboard.at_ms, dashboard.bytes, dashboard.reason) == (0, 300, "min_bytes reached")
    # 300 + 1200 + 900 + 2500 >= 4000 first at the 210 ms append.
    assert (aggregator.at_ms, aggregator.bytes, aggregator.reason) == (
        210,
        4_900,
        "min_bytes reached",
    )
    assert archiver.at_ms == module.MAX_WAIT_MS and archiver.reason == "max_wait_ms passed"
    assert archiver.bytes == 300 + 1_200 + 900 + 2_500 + 700  # what was there at 500 ms
    assert purgatory.num_completed == 2 and purgatory.num_expired == 1
