"""A cold ``tickwheel pipeline run`` against a plain PySpark job over the same files.

``tickwheel pipeline generate --orders N --seed 1`` (the demo's data: 1e5
orders, 4 files, 19 MB) once; then ``--rounds`` rounds of two programs, each
a fresh process with its own JVM, timed from its start to its exit:

* ``tickwheel pipeline run --rules examples/orders.toml`` with its defaults
  (as ``make demo`` runs it);
* ``plain_pyspark_job.py``: read the JSON, drop duplicate ids, aggregate per
  order, write Parquet (what a user would write without tickwheel).

The two alternate, and which goes first alternates from round to round, so
that a drift of the machine's speed weighs on both. Printed: each run's
seconds (the CLI's with its phases from ``summary.json``), the ratio of each
round, and the median of the rounds' ratios and the ratio of the best runs,
against the target (cold CLI ≤ 0.8× the plain job).

    python benchmarks/bench_pipeline_cold.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.8


def _tickwheel_command() -> list[str]:
    """``tickwheel`` as installed beside this interpreter, else ``python -m tickwheel``."""
    script = Path(sys.executable).with_name("tickwheel")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tickwheel"]


def _timed(command: list[str]) -> tuple[float, str]:
    """(seconds from start to exit, what it printed); exits if the command fails."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return seconds, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-dir", default=None, help="where data and outputs go")
    args = parser.parse_args(argv)

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tw-bench-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"orders-{args.orders}"
    tw = _tickwheel_command()
    if not data.exists():
        generate = ["pipeline", "generate", "--orders", str(args.orders), "--seed", "1"]
        subprocess.run([*tw, *generate, "--out", str(data)], check=True)
    commands = {
        "pipeline run": [*tw, "pipeline", "run", "--rules", str(ROOT / "examples" / "orders.toml"),
                         "--input", str(data), "--output", str(work / "cli-out")],
        "plain PySpark": [sys.executable, str(Path(__file__).with_name("plain_pyspark_job.py")),
                          "--input", str(data), "--output", str(work / "plain-out")],
    }  # fmt: skip
    outputs = {"pipeline run": work / "cli-out", "plain PySpark": work / "plain-out"}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(args.rounds):
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for name in order:
            shutil.rmtree(outputs[name], ignore_errors=True)
            seconds, _ = _timed(commands[name])
            times[name].append(seconds)
            note = ""
            if name == "pipeline run":
                summary = json.loads((outputs[name] / "summary.json").read_text())
                note = f"  phases {summary['phases_seconds']}"
            print(f"round {round_ + 1}: {name}: {seconds:.2f} s{note}", flush=True)
        ratio = times["pipeline run"][-1] / times["plain PySpark"][-1]
        print(f"round {round_ + 1}: pipeline run / plain PySpark {ratio:.2f}x", flush=True)
    ratios = [a / b for a, b in zip(times["pipeline run"], times["plain PySpark"], strict=True)]
    best = min(times["pipeline run"]) / min(times["plain PySpark"])
    print(f"\n{args.orders:,} orders, one process each, seconds from start to exit:")
    for name, command in commands.items():
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"  {name:14} {runs}  ({' '.join(command)})")
    median = statistics.median(ratios)
    verdict = "met" if median <= TARGET else "NOT met"
    print(f"pipeline run / plain PySpark: median of the rounds {median:.2f}x, best / best "
          f"{best:.2f}x (target <= {TARGET}x: {verdict})")  # fmt: skip
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
