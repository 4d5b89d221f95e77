"""Load pipeline outputs with the tools a data engineer reaches for next.

Spark reads back whatever it wrote; pandas and Arrow decode every string, and
fail on a string column holding invalid UTF-8. :func:`load_everywhere` loads
each table of an output directory through pyarrow into pandas (and decodes
every value with ``to_pylist``), CSV outputs with ``pandas.read_csv`` and JSON
outputs with ``pandas.read_json``, and returns the frames.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

TABLES = ("outcomes", "unmatched", "rejected", "buffered", "late")


def _parts(table: Path, suffix: str) -> list[Path]:
    return sorted(
        p
        for p in table.rglob(f"*{suffix}")
        if p.is_file() and not any(part.startswith(("_", ".")) for part in p.parts[-2:])
    )


def load_table(table: Path, fmt: str) -> Any:
    """One output table (a Spark output directory) as a pandas DataFrame."""
    import pandas as pd
    import pyarrow.dataset as ds

    if fmt == "parquet":
        data = ds.dataset(str(table), format="parquet", partitioning="hive").to_table()
        data.to_pylist()  # decodes every string: fails on invalid UTF-8
        return data.to_pandas()
    if fmt == "csv":
        frames = [pd.read_csv(p, dtype=str, keep_default_na=False) for p in _parts(table, ".csv")]
    else:
        frames = [pd.read_json(p, lines=True, dtype=False) for p in _parts(table, ".json")]
    frames = [f for f in frames if len(f.columns)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def find_outputs(root: Path) -> list[tuple[Path, str]]:
    """Every pipeline output under ``root``: (directory, format), for batch and stream runs."""
    found = []
    for summary in root.rglob("summary.json"):
        try:
            fmt = json.loads(summary.read_text(encoding="utf-8")).get("format", "parquet")
        except ValueError:
            continue
        found.append((summary.parent, fmt))
    for marker in root.rglob("_batches"):  # the stream's Parquet sink
        if marker.is_dir():
            found.append((marker.parent, "parquet"))
    for db in root.rglob("*.db"):  # the stream's SQLite sink
        found.append((db, "sqlite"))
    return found


def load_everywhere(output: Path, fmt: str) -> dict[str, Any]:
    """Every table of one output (see :func:`find_outputs`), loaded as pandas frames."""
    import pandas as pd

    if fmt == "sqlite":
        with sqlite3.connect(output) as conn:
            query = "SELECT name FROM sqlite_master WHERE type = 'table'"
            names = [r[0] for r in conn.execute(query)]
            return {n: pd.read_sql_query(f'SELECT * FROM "{n}"', conn) for n in names}
    return {name: load_table(output / name, fmt) for name in TABLES if (output / name).is_dir()}
