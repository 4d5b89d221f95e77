"""The workload the stream's benchmarks share: the rules, and files fed as increments.

The stream, its peers and its floors all read the same generated orders,
copied into an input directory with modification times in arrival order:
Spark's file source takes files in that order, and ``maxFilesPerTrigger=1``
then makes each file one micro-batch (tickwheel's own source orders by
modification time, then name).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lateness_rules(path: Path) -> Path:
    """Write ``examples/orders.toml`` with 3 minutes of allowed lateness to ``path``.

    The generator shuffles arrival within two minutes, so with 3 minutes no
    event is late: a Spark peer's watermark (the same lateness) drops none.
    """
    text = (ROOT / "examples" / "orders.toml").read_text(encoding="utf-8")
    path.write_text(text.replace('allowed_lateness = "0"', 'allowed_lateness = "3m"'))
    return path


def feed(files: list[Path], dest: Path) -> None:
    """Copy ``files`` into ``dest``, their modification times one second apart, in order."""
    dest.mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(files):
        target = dest / src.name
        shutil.copy(src, target)
        os.utime(target, (1_700_000_000 + i, 1_700_000_000 + i))


def count_records(files: list[Path]) -> int:
    """The non-blank lines of ``files``: the records a job reads."""
    n = 0
    for f in files:
        with f.open("rb") as fh:
            n += sum(1 for line in fh if line.strip())
    return n


def sci(n: int) -> str:
    """``100000`` as ``1e5``, as the issue names sizes; other sizes with commas."""
    text = f"{n:.0e}".replace("e+0", "e").replace("e+", "e")
    return text if float(text) == n else f"{n:,}"
