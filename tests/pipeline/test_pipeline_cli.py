"""The CLI end to end on a small input: generate → run → report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tickwheel._cli import main

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders.toml"


def test_help_does_not_import_spark() -> None:
    code = (
        "import sys, tickwheel._cli as c\n"
        "c.build_parser()\n"
        "bad = [m for m in ('pyspark', 'pandas', 'matplotlib', 'pyarrow') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_generate_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("a", "b"):
        assert main(["pipeline", "generate", "--orders", "300", "--seed", "5",
                     "--out", str(tmp_path / name), "--files", "2"]) == 0  # fmt: skip
    assert "for 300 orders" in capsys.readouterr().out
    a = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert a == ["part-00000.jsonl", "part-00001.jsonl"]
    for name in a:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_bad_arguments_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["pipeline", "generate", "--orders", "-1", "--out", str(tmp_path)])
    assert "must be >= 0" in capsys.readouterr().err
    bad_rules = tmp_path / "r.toml"
    bad_rules.write_text("[rules.x]\nopen = ['a']\n", encoding="utf-8")
    code = main(["pipeline", "run", "--rules", str(bad_rules), "--input", str(tmp_path),
                 "--output", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    assert "complete: missing" in capsys.readouterr().err
    assert main(["pipeline", "report", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


@pytest.mark.spark
def test_generate_run_report(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, out = tmp_path / "in", tmp_path / "out"
    assert main(["pipeline", "generate", "--orders", "800", "--seed", "3", "--out", str(data),
                 "--mean-gap-ms", "5000"]) == 0  # fmt: skip
    assert main(["pipeline", "run", "--rules", str(EXAMPLE), "--input", str(data),
                 "--output", str(out), "--partitions", "2"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    for phase in ("starting Spark", "parsed and deduplicated", "wrote rejected/",
                  "through the purgatory", "done:"):  # fmt: skip
        assert phase in text
    assert "expired" in text and "records/s" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["outcomes"]["expired"] > 0
    assert main(["pipeline", "report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "outcome" in text and "p99 ms" in text
    for name in ("latency.png", "expirations.png"):
        png = out / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(png) in text
    # the session of the test run is still alive: the CLI did not stop it
    assert spark.range(3).count() == 3
