"""The timer, asyncio and purgatory benchmark scripts still run and print their tables.

Tiny sizes, one run each: these tests check that the scripts work (every peer,
the floor rows and the bound line), never how fast anything is. The compiled
floors (``floor-c``) are there when ``make bench`` built them for this
interpreter (``make test`` does); without them a script says how to build them.
"""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
from pathlib import Path

import pytest

import tickwheel

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: True when the compiled floors are built for this interpreter (and the core is compiled).
FLOORS = (
    tickwheel.COMPILED
    and importlib.machinery.PathFinder.find_spec("_floors", [str(BENCHMARKS)]) is not None
)


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Without the floors, a script that has floor-c rows says how to build them.
    assert ("`make bench` builds them" in done.stderr) == (
        tickwheel.COMPILED and not FLOORS and script in ("bench_timer.py", "bench_aio.py")
    )
    return done.stdout


def test_bench_timer_prints_every_peer_and_the_floor() -> None:
    out = _run("bench_timer.py", "--sizes", "2000", "--repeat", "1")
    rows = {line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")}
    assert {"tickwheel", "tickwheel-pure", "asyncio", "heapq", "sched", "floor"} <= rows
    assert ("floor-c" in rows) == FLOORS  # the C floor, under the compiled core
    floor = next(line for line in out.splitlines() if line.startswith("| floor |"))
    cells = [cell.strip() for cell in floor.strip("|").split("|")]
    assert cells[3] == "n/a"  # the floor cannot fire: no fire figure, no lifecycle
    assert cells[4] == "n/a"


def test_bench_aio_prints_the_floor_and_its_bound() -> None:
    out = _run("bench_aio.py", "--sizes", "2000", "--repeat", "1", "--memory-n", "1000")
    lines = out.splitlines()
    assert any(line.startswith("tickwheel ") for line in lines)
    assert any(line.startswith("tickwheel-pure ") for line in lines)
    # The floor fires too: one loop.call_at and one loop iteration per deadline.
    floor = next(line for line in lines if line.startswith("floor ")).split()
    assert "n/a" not in floor and floor[-1].endswith("x")
    bound = next(line for line in lines if line.startswith("bound:"))
    assert bound.endswith("x asyncio")
    # Under the compiled core, the C floor and its bound too.
    assert any(line.startswith("floor-c ") for line in lines) == FLOORS
    assert any(line.startswith("bound-c:") for line in lines) == FLOORS


def test_bench_aio_drop_in_prints_its_floors() -> None:
    out = _run(
        "bench_aio.py", "--sizes", "2000", "--repeat", "1", "--memory-n", "1000", "--drop-in"
    )
    lines = out.splitlines()
    sides = next(line for line in lines if line.startswith("path ")).split()[1:]
    assert sides[:4] == ["stock", "tickwheel", "tickwheel-pure", "floor"]
    assert ("floor-c" in sides) == FLOORS
    # Each of asyncio's paths has a figure and a ratio on every side, the floors too.
    for path in ("loop.call_later/cancel", "asyncio.timeout", "asyncio.sleep"):
        row = next(line for line in lines if line.startswith(path))
        assert row.count("x") >= len(sides) - 1, row


def test_bench_aio_drop_in_runs_in_debug_mode() -> None:
    out = _run(
        "bench_aio.py",
        *("--sizes", "500", "--repeat", "1", "--memory-n", "500", "--no-floor"),
        *("--drop-in", "--debug"),
    )
    lines = out.splitlines()
    assert any(line.startswith("drop-in loop, N = 500, debug mode:") for line in lines)
    for path in ("loop.call_later/cancel", "asyncio.timeout", "asyncio.sleep"):
        row = next(line for line in lines if line.startswith(path))
        assert row.count("x") >= 2, row


def test_bench_pipeline_loop_runs_both_paths() -> None:
    out = _run("bench_pipeline_loop.py", "--orders", "500", "--repeat", "1")
    sides = {line.split()[0] for line in out.splitlines() if line.startswith("tickwheel")}
    assert sides == {"tickwheel", "tickwheel-pure"}


def test_bench_state_replay_prints_all_three_ways() -> None:
    """The replay's benchmark checks each way's state equal, then prints the ratios."""
    pytest.importorskip("pyarrow")
    out = _run("bench_state_replay.py", "--pending", "2000", "--changelogs", "3",
               "--touched", "50", "--repeat", "1")  # fmt: skip
    row = next(line for line in out.splitlines() if line.strip().startswith("2,000"))
    assert row.count("x") == 2  # row by row / tickwheel, tickwheel / floor


def test_bench_purgatory_prints_both_paths() -> None:
    out = _run(
        "bench_purgatory.py",
        *("--requests", "2000", "--rates", "max", "--repeat", "1", "--det-ops", "1000"),
    )
    rows = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"tickwheel", "tickwheel-pure", "heapq-lazy"} <= rows
    assert sum(line.startswith("target at saturation") for line in out.splitlines()) == 2
    assert "lifecycle (watch + mean of the two ends)" in out


@pytest.mark.parametrize("workload", ["timer", "purgatory"])
def test_callgrind_workloads_run_on_the_compiled_core(workload: str) -> None:
    script = BENCHMARKS / "callgrind_workloads.py"
    done = subprocess.run(
        [sys.executable, str(script), workload, "2", "--n", "1000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if tickwheel.COMPILED:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2
        assert "the compiled core is not in use" in done.stderr


def _refused(script: str, *args: str) -> str:
    """Run ``script`` with bad ``args``; it must exit 2 (argparse's error) before any Spark."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


def test_stream_peer_scripts_name_bad_arguments(tmp_path: Path) -> None:
    # The stream benchmarks import Spark's stateful peers at start: the spark extra,
    # which `make test` installs and the other CPythons' library runs leave out.
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    err = _refused("bench_pipeline_incremental.py", "--repeat", "0")
    assert "--repeat must be >= 1, got 0" in err
    err = _refused("bench_pipeline_incremental.py", "--peer-orders", "-1")
    assert "--peer-orders must be >= 0" in err
    err = _refused("bench_pipeline_incremental.py", "--peers", "mapGroupsWithState")
    assert "invalid choice: 'mapGroupsWithState'" in err
    err = _refused("bench_pipeline.py", "--incremental", "--fixed-records", "-5")
    assert "--fixed-records must be >= 0, got -5" in err  # passed on to the incremental bench
    err = _refused("bench_pipeline_incremental.py", "--orders", "1e5", "-1")
    assert "--orders must be >= 0, got 100000 -1" in err
    err = _refused("bench_pipeline.py", "--scale", "0", "1000")
    assert "--scale sizes must be >= 1, got [0, 1000]" in err
    missing = tmp_path / "absent"
    err = _refused(
        "peer_transform_with_state.py",
        *("--input", str(missing), "--output", str(tmp_path / "out")),
        *("--checkpoint", str(tmp_path / "ck"), "--triggers", "10"),
    )
    assert f"--input {missing}: not a directory" in err
    err = _refused("peer_transform_with_state.py", "--input", str(tmp_path), "--output", "o",
                   "--checkpoint", "c", "--triggers", "0")  # fmt: skip
    assert "--triggers and --partitions must be >= 1" in err
    err = _refused("bench_stream_steady.py", "--batches", "1")
    assert "--batches must be >= 2 (micro-batch 1 and a steady one), got 1" in err
    err = _refused("bench_stream_steady.py", "--pending", "100", "1e5")
    assert "--pending must be >= 875 (the load orders the steady files pay)" in err
