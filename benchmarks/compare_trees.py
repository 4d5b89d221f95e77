"""The outputs of two trees, table for table and value for value, on every fixture.

For a change that must not move a single output row (a rewrite of how the
step runs, not of what it computes), this runs ``tickwheel pipeline run`` and
``tickwheel pipeline stream`` from this tree and from another one (``--base``,
a checkout run with ``PYTHONPATH``, as the benchmarks run a "before") on each
input below, and compares every table they write, as sets of rows (each
table's rows counted, so a doubled row differs too), every column's value
and type, and the batch job's ``summary.json`` counts:

* the checkpoint fixtures' inputs (``tests/pipeline/fixtures/checkpoint-format-*``,
  with their rules, one of them with two rules);
* generated orders with every edge case of the tests (``EDGE_LINES``: malformed
  lines, missing and bad fields, ISO times, conflicts, ties), under
  ``examples/orders.toml`` and, as a stream, ``examples/orders_stream.toml``;
* the same records as CSV and as Parquet (typed columns);
* Maxwell's binlog JSON (``examples/maxwell_orders.jsonl``,
  ``examples/maxwell_bootstrap.jsonl``).

The stream takes one file per micro-batch. Each run is a process of its own
with a fresh Spark; the script prints one line per (input, driver, table) and
exits non-zero if anything differs.

Run::

    .venv/bin/python benchmarks/compare_trees.py --base /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "pipeline"))

from pipeline_helpers import make_input  # noqa: E402

#: The tables each driver writes.
BATCH_TABLES = ("outcomes", "unmatched", "rejected", "buffered")
STREAM_TABLES = ("outcomes", "unmatched", "rejected", "late")
#: The CLI's entry point, run with the tree's sources first on the path.
ENTRY = "import sys; from tickwheel._cli import main; sys.argv[0] = 'tickwheel'; sys.exit(main())"


def _inputs(work: Path) -> list[dict[str, Any]]:
    """Every input: a name, its rules, its directory (one file per micro-batch) and format."""
    cases = []
    for fixture in sorted((ROOT / "tests/pipeline/fixtures").glob("checkpoint-format-*")):
        files = work / fixture.name
        files.mkdir(parents=True)
        for src in sorted(fixture.glob("in-*.jsonl")):
            shutil.copy(src, files / src.name)
        cases.append({"name": fixture.name, "rules": fixture / "rules.toml", "input": files,
                      "format": "json"})  # fmt: skip
    orders = make_input(work / "orders", orders=1200, seed=11, files=4)
    # Lines that are not valid UTF-8: rejected, and kept with their exact bytes.
    (orders / "part-bytes.jsonl").write_bytes(
        b'\xb2\xff not json\n{"event_id":"u1","order_id":"z9","type":"created",'
        b'"ts":1704067200000,"note":"\xc3\x28"}\n{"event_id":"u1","order_id":"z9",'
        b'"type":"paid","ts":1704067200000,"note":"\xe2\x82"}\n'
    )
    for rules in ("orders.toml", "orders_stream.toml"):
        cases.append({"name": f"orders+edges/{rules}", "rules": ROOT / "examples" / rules,
                      "input": orders, "format": "json"})  # fmt: skip
    typed = [json.loads(line) for p in sorted(orders.glob("part-0*.jsonl"))
             for line in p.read_text().splitlines() if line.strip()]  # fmt: skip
    for fmt in ("csv", "parquet"):
        cases.append({"name": f"orders/{fmt}", "rules": ROOT / "examples/orders_stream.toml",
                      "input": _typed_files(typed, work / fmt, fmt), "format": fmt})  # fmt: skip
    for name in ("maxwell_orders", "maxwell_bootstrap"):
        cases.append({"name": name, "rules": ROOT / "examples" / f"{name}.toml",
                      "input": _split(ROOT / "examples" / f"{name}.jsonl", work / name, 3),
                      "format": "maxwell"})  # fmt: skip
    return cases


def _typed_files(records: list[dict[str, Any]], out: Path, fmt: str) -> Path:
    """``records`` as three files of typed columns (CSV with a header, or Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir()
    names = ("event_id", "order_id", "type", "ts", "seq")
    for part in range(3):
        rows = records[part::3]
        if fmt == "csv":
            with (out / f"part-{part}.csv").open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(names)
                writer.writerows([[r.get(n, "") for n in names] for r in rows])
        else:
            # The times as text (the generator writes epoch ms and ISO-8601 alike).
            table = pa.table({
                "event_id": pa.array([r.get("event_id") for r in rows], pa.string()),
                "order_id": pa.array([r.get("order_id") for r in rows], pa.string()),
                "type": pa.array([r.get("type") for r in rows], pa.string()),
                "ts": pa.array([None if r.get("ts") is None else str(r["ts"]) for r in rows]),
                "seq": pa.array([r.get("seq") for r in rows], pa.int64()),
            })  # fmt: skip
            pq.write_table(table, out / f"part-{part}.parquet")
    return out


def _split(source: Path, out: Path, parts: int) -> Path:
    """``source``'s lines in ``parts`` files, in order."""
    out.mkdir()
    lines = source.read_text().splitlines()
    size = -(-len(lines) // parts)
    for part in range(parts):
        chunk = lines[part * size : (part + 1) * size]
        (out / f"part-{part}.jsonl").write_text("\n".join(chunk) + "\n")
    return out


def _run(tree: Path, args: list[str], log: Path) -> None:
    """``tickwheel ARGS`` with ``tree``'s sources first on the path (its workers too)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "-c", ENTRY, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
            timeout=900, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed in {tree}; see {log}")


def _outputs(tree: Path, case: dict[str, Any], out: Path) -> dict[str, Any]:
    """Both drivers' tables (and the batch job's counts) for ``case`` from ``tree``."""
    fmt = ["--input-format", case["format"]]
    common = ["--rules", str(case["rules"]), "--input", str(case["input"]), *fmt]
    _run(tree, ["pipeline", "run", *common, "--output", str(out / "batch")], out / "batch.log")
    _run(tree, ["pipeline", "stream", *common, "--output", str(out / "stream"),
                "--checkpoint", str(out / "ck"), "--max-files-per-trigger", "1"],
         out / "stream.log")  # fmt: skip
    got: dict[str, Any] = {}
    for table in BATCH_TABLES:
        got[f"batch {table}"] = _rows(_parquet_files(out / "batch" / table))
    summary = json.loads((out / "batch" / "summary.json").read_text())
    got["batch counts"] = (summary["counts"], summary["watermark"], summary["latency_ms"])
    sink = _stream_files(out / "stream")
    for table in STREAM_TABLES:
        got[f"stream {table}"] = _rows(sink.get(table, []), by_batch=True)
    return got


def _parquet_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.parquet") if "_staging" not in p.parts)


def _stream_files(output: Path) -> dict[str, list[Path]]:
    """The stream's committed files, by table, as its ``_spark_metadata`` names them."""
    from tickwheel.pipeline.sinks.parquet import ParquetSink
    from tickwheel.pipeline.storage import local_path

    sink = ParquetSink(str(output))
    return {
        table: [Path(local_path(f)) for f in sink.committed_files(table)]
        for table in STREAM_TABLES
        if (output / table).exists()
    }


def _rows(files: list[Path], by_batch: bool = False) -> tuple[Any, Counter[tuple[Any, ...]]]:
    """The files' rows as a multiset (text as bytes, so invalid UTF-8 compares too), each
    with its micro-batch's id ``by_batch`` (from its ``batch_id=N`` directory), and
    their columns with their types."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: Counter[tuple[Any, ...]] = Counter()
    types: set[tuple[tuple[str, str], ...]] = set()
    for path in files:
        table = pq.read_table(path, partitioning=None)
        columns = [
            c.cast(pa.binary()).to_pylist() if pa.types.is_string(c.type) else c.to_pylist()
            for c in table.columns
        ]
        batch = (path.parent.name,) if by_batch else ()
        rows.update(batch + row for row in zip(*columns, strict=True))
        types.add(tuple((f.name, str(f.type)) for f in table.schema))
    return tuple(sorted(types)), rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the other tree's checkout")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="tw-trees-"))
    cases = _inputs(work / "inputs")
    differ = 0
    for number, case in enumerate(cases):
        runs = {}
        for label, tree in (("this", ROOT), ("base", args.base.resolve())):
            out = work / f"{number}-{label}"
            out.mkdir(parents=True)
            runs[label] = _outputs(tree, case, out)
        for name in runs["this"]:
            same = runs["this"][name] == runs["base"][name]
            differ += not same
            rows = runs["this"][name][1]
            size = f"{sum(rows.values()):,} rows" if isinstance(rows, Counter) else ""
            print(f"{'same' if same else 'DIFFERENT':9} {case['name']:34} {name:18} {size}")
    verdict = f"{differ} table(s) differ" if differ else "every table the same"
    print(f"{len(cases)} inputs, both drivers: {verdict}")
    if args.work is None and not differ:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
