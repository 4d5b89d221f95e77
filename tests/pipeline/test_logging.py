"""The pipeline reports through logging (``tickwheel.pipeline.*``), and prints nothing.

The rules change and the dropped state reuse the checkpoints of
``test_rules_change.py``; the scan needs no Spark.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from typing import Any

import pytest
from test_rules_change import Stream, event, rules_text

import tickwheel.pipeline

PIPELINE = Path(tickwheel.pipeline.__file__).parent
#: The command line's modules: the application, which prints its own output.
CLI_MODULES = {"_cli.py", "stream/cli.py"}


def _records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


@pytest.mark.spark
def test_an_applied_rules_change_is_logged_at_info(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0))
    stream.run(rules_text(timeout="30m"))
    stream.add(event("b1", "created", "B", 10))
    with caplog.at_level(logging.INFO, logger="tickwheel.pipeline"):
        stream.run(rules_text(timeout="45m"))
    [record] = _records(caplog, "timeout 30m -> 45m")
    assert record.levelno == logging.INFO
    assert record.name.startswith("tickwheel.pipeline")


@pytest.mark.spark
def test_dropped_state_is_logged_at_warning(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Stream(spark, tmp_path)
    stream.add(event("a1", "created", "A", 0))
    stream.run(rules_text())
    stream.add(event("c1", "created", "C", 2))
    with caplog.at_level(logging.INFO, logger="tickwheel.pipeline"):
        stream.run(rules_text(name="pay"), drop_incompatible_state=True)
    [record] = _records(caplog, "drop_incompatible_state: dropping")
    assert record.levelno == logging.WARNING
    assert record.name.startswith("tickwheel.pipeline")


def test_no_library_module_prints() -> None:
    """Only the command line's modules call ``print``."""
    printing = []
    for path in sorted(PIPELINE.rglob("*.py")):
        name = path.relative_to(PIPELINE).as_posix()
        if name in CLI_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if called and node.func.id == "print":  # type: ignore[union-attr]
                printing.append(f"{name}:{node.lineno}")
    assert printing == []
