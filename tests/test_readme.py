"""The README's quick start runs as written and prints what its comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs_and_prints_what_it_says() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the quick start has no python block"
    code = match.group(1)
    assert len(code.strip().splitlines()) <= 10, "the quick start should stay 10 lines"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "readme_quick_start"})
    assert out.getvalue().splitlines() == ["request 7 timed out", "0"]
