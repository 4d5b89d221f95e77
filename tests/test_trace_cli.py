"""The ``tickwheel trace`` command: text, --json, options and bad options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tickwheel._cli import main

RULES = Path(__file__).resolve().parents[1] / "examples" / "orders.toml"

B = 1675752000000


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["trace", *argv]) == 0
    return capsys.readouterr().out


def test_text_shows_levels_buckets_ranges_tasks_and_queue(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _run(capsys)
    blocks = out.strip().split("\n\n")
    assert len(blocks) == 8  # after the adds, then 7 steps
    first = blocks[0]
    assert first.startswith("== after adding 7 tasks: clock 2023-02-07 06:40:20.558")
    assert f"({B + 20558} ms)" in first
    assert "size 7" in first
    assert (
        f"level 2: tick 9000 ms x 3 buckets = 27000 ms, current 2023-02-07 06:40:12.000 "
        f"({B + 12000})" in first
    )
    # A bucket with its [start, end) range in readable time and in raw ms, and its task.
    assert (
        f"  [2] [2023-02-07 06:40:21.000, 2023-02-07 06:40:30.000) = [{B + 21000}, {B + 30000}): "
        f"2023-02-07 06:40:27.558 ({B + 27558})"
    ) in first
    assert "  [0] unset" in first
    assert first.splitlines()[-1].startswith(
        f"queue: L0[0]@2023-02-07 06:40:21.000 ({B + 21000}), L1[0]@"
    )
    for n, block in enumerate(blocks[1:], start=1):
        assert block.startswith(f"== step {n}: clock 2023-02-07 06:40:{20 + n}.000")
        assert f"fired: task {n - 1} (delay {n * 1000} ms)" in block
        assert f"size {7 - n}" in block
    assert blocks[-1].splitlines()[-1] == "queue: empty"


def test_json_is_the_same_states_as_data(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(_run(capsys, "--json"))
    assert [step["clock_ms"] for step in data] == [B + 20558] + [
        B + s for s in range(21000, 28000, 1000)
    ]
    assert [step["fired"] for step in data[1:]] == [
        [{"task": i, "delay_ms": (i + 1) * 1000}] for i in range(7)
    ]
    assert [step["snapshot"]["size"] for step in data] == [7, 6, 5, 4, 3, 2, 1, 0]
    first = data[0]["snapshot"]
    assert [level["current_time_ms"] for level in first["levels"]] == [
        B + 20000,
        B + 18000,
        B + 12000,
    ]
    assert first["levels"][1]["buckets"][1] == {
        "index": 1,
        "expiration_ms": B + 24000,
        "task_expirations": [B + 24558, B + 25558, B + 26558],
    }
    assert first["queue"][0] == [B + 21000, 0, 0]
    assert data[0]["advanced"] is False
    assert all(step["advanced"] for step in data[1:])


def test_options(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(
        _run(
            capsys,
            "--json",
            "--tick-ms",
            "10",
            "--wheel-size",
            "4",
            "--start-ms",
            "5",
            "--delays",
            "5,50,500,5",
        )
    )
    first = data[0]["snapshot"]
    # tick 10 x 4 covers < 40, level 1 (tick 40) < 160, level 2 (tick 160) < 640.
    assert [lv["tick_ms"] for lv in first["levels"]] == [10, 40, 160]
    assert [lv["current_time_ms"] for lv in first["levels"]] == [0, 0, 0]
    assert first["size"] == 4
    fired = [(step["clock_ms"], [f["task"] for f in step["fired"]]) for step in data[1:]]
    # Expirations 10, 55, 505, 10. The trace steps to each queued bucket: 10 runs
    # tasks 0 and 3; 40 (level 1) cascades 55 to level 0; 50 runs task 1; 480
    # (level 2) cascades 505 to level 0's 500 bucket, which runs task 2.
    assert fired == [(10, [0, 3]), (40, []), (50, [1]), (480, []), (500, [2])]
    assert data[-1]["snapshot"]["size"] == 0


def test_max_steps_stops_early(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(_run(capsys, "--json", "--max-steps", "2"))
    assert len(data) == 3
    assert data[-1]["snapshot"]["size"] == 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tick-ms", "0"], "--tick-ms"),
        (["--tick-ms", "abc"], "--tick-ms"),
        (["--wheel-size", "1"], "--wheel-size"),
        (["--start-ms", "-1"], "--start-ms"),
        (["--delays", "1,x"], "--delays"),
        (["--delays", ","], "--delays"),
        (["--max-steps", "0"], "--max-steps"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_options_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["trace", *argv])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


def test_python_dash_m_runs_the_trace() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tickwheel", "trace", "--delays", "1000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fired: task 0 (delay 1000 ms)" in proc.stdout


def test_a_missing_spark_extra_is_one_clear_line(tmp_path: Path) -> None:
    # pyspark made unimportable in the child, as on an install without the extra.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"order_id": "o1"}\n')
    code = (
        "import sys; sys.modules['pyspark'] = None; "
        "from tickwheel._cli import main; "
        f"raise SystemExit(main(['pipeline', 'run', '--rules', {str(RULES)!r}, "
        f"'--input', {str(tmp_path / 'in')!r}, '--output', {str(tmp_path / 'out')!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "tickwheel pipeline: needs the spark extra (no module 'pyspark'): "
        "pip install 'tickwheel[spark]'"
    ]
