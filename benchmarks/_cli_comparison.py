"""The stream against ``transformWithStateInPandas`` as users run them: one process each.

``bench_pipeline_incremental.py --cli``: ``tickwheel pipeline generate``
writes the orders as K files (their times set in arrival order); then, for
``--cli-repeat`` rounds, four programs run one after another from fresh
outputs, each its own process with its own JVM, timed from start to exit:

* ``tickwheel pipeline run`` (the batch job);
* ``tickwheel pipeline stream --max-files-per-trigger 1`` (K micro-batches);
* ``benchmarks/peer_transform_with_state.py --triggers K`` (Spark's
  ``transformWithStateInPandas`` with event-time timers, RocksDB);
* the same program with ``--api floor``: the files through Spark's JSON
  source into a ``foreachBatch`` that writes each micro-batch as one Parquet
  file. The least a program of this shape costs from the command line: the
  JVM's start, the source, K micro-batches. ``transformWithStateInPandas``
  time ÷ its time is the most any stream could reach against that peer.

All with the same rules (``examples/orders.toml`` with 3 minutes of
lateness) and their default options. Afterwards, untimed, the peer's
outcomes are checked against the stream's (``_stream_peers.check_peer``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _stream_peers as peers
from _pipeline_names import create_session, make_sink, read_stream_outputs
from _stream_inputs import feed, lateness_rules, sci


def _tickwheel_command() -> list[str]:
    """``tickwheel`` as installed beside this interpreter, else ``python -m tickwheel``."""
    script = Path(sys.executable).with_name("tickwheel")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tickwheel"]


#: Where each program writes: this directory, and this name + "-ck" for a checkpoint.
OUTPUTS = {
    "pipeline run": "cli-run",
    "pipeline stream": "cli-stream",
    "transformWithStateInPandas": "cli-peer",
    "floor (foreachBatch)": "cli-floor",
}


def _cli_commands(work: Path, rules: Path, inp: Path, triggers: int) -> dict[str, list[str]]:
    """The programs as a user runs them, each writing under ``work/cli-<name>``."""
    tw = _tickwheel_command()
    peer = [
        sys.executable,
        str(Path(__file__).with_name("peer_transform_with_state.py")),
        "--rules",
        str(rules),
        "--input",
        str(inp),
        "--triggers",
        str(triggers),
    ]
    return {
        "pipeline run": [*tw, "pipeline", "run", "--rules", str(rules), "--input", str(inp),
                         "--output", str(work / "cli-run")],
        "pipeline stream": [*tw, "pipeline", "stream", "--rules", str(rules), "--input", str(inp),
                            "--output", str(work / "cli-stream"),
                            "--checkpoint", str(work / "cli-stream-ck"),
                            "--max-files-per-trigger", "1"],
        "transformWithStateInPandas": [*peer, "--output", str(work / "cli-peer"),
                                       "--checkpoint", str(work / "cli-peer-ck")],
        "floor (foreachBatch)": [*peer, "--api", "floor", "--output", str(work / "cli-floor"),
                                 "--checkpoint", str(work / "cli-floor-ck")],
    }  # fmt: skip


def _cli_check(work: Path, stream_stdout: str) -> str:
    """Check the peer program's outcomes against the stream's (untimed, one more JVM)."""
    done = [line for line in stream_stdout.splitlines() if " stream: done: " in line]
    if not done:
        raise SystemExit("the stream printed no 'done:' summary; cannot check the peer")
    watermark = json.loads(done[-1].split(" stream: done: ", 1)[1])["watermark"]
    spark = create_session("local[2]", shuffle_partitions=2)
    try:
        sink = make_sink("parquet", str(work / "cli-stream"), spark)
        outs = read_stream_outputs(spark, sink, str(work / "cli-stream-ck"))
        expected = peers.comparable_outcomes(outs, watermark)
        return peers.check_peer("transformWithStateInPandas", spark, work / "cli-peer", expected)
    finally:
        spark.stop()


def cli_comparison(args: argparse.Namespace) -> int:
    """As users run them, one process (one JVM start) each, over the same generated files.

    ``tickwheel pipeline generate --orders N --files K``, the files' times set in
    their order; then, ``--cli-repeat`` rounds of: ``pipeline run``, ``pipeline
    stream --max-files-per-trigger 1``, ``peer_transform_with_state.py
    --triggers K`` and the same with ``--api floor``, each timed from its start
    to its exit, from fresh outputs.
    """
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-cli-"))
    work.mkdir(parents=True, exist_ok=True)
    rules, k, n = lateness_rules(work / "rules.toml"), args.increments, int(args.cli_orders)
    gen = work / "cli-gen"
    generate = ["pipeline", "generate", "--orders", str(n), "--files", str(k), "--seed", "1"]
    subprocess.run([*_tickwheel_command(), *generate, "--out", str(gen)], check=True)
    feed(sorted(gen.glob("part-*.jsonl")), work / "cli-in")
    commands = _cli_commands(work, rules, work / "cli-in", k)
    times: dict[str, list[float]] = {name: [] for name in commands}
    stream_stdout = ""
    for attempt in range(args.cli_repeat):
        for name, command in commands.items():
            for old in work.glob(f"{OUTPUTS[name]}*"):  # its output and checkpoint
                shutil.rmtree(old)
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            times[name].append(time.perf_counter() - started)
            if done.returncode:
                print(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}", file=sys.stderr)
                return 1
            stream_stdout = done.stdout if name == "pipeline stream" else stream_stdout
            if name.startswith(("transformWithState", "floor")):  # its micro-batches' times
                print(done.stdout.strip().splitlines()[-1], flush=True)
            print(f"round {attempt + 1}: {name}: {times[name][-1]:.1f}s", flush=True)
    check = _cli_check(work, stream_stdout)
    print(f"\n{sci(n)} orders in {k} files, one process each; seconds from start to exit "
          f"(best of {args.cli_repeat}):")  # fmt: skip
    for name, command in commands.items():
        print(f"  {name:28} {min(times[name]):>7.1f}  {' '.join(command)}")
    print(f"  checked: the peer's outcomes {check}")
    best = {name: min(runs) for name, runs in times.items()}
    rows = [
        (f"from the CLI, {sci(n)} orders in {k} files: transformWithStateInPandas time "
         "/ stream time", best["transformWithStateInPandas"] / best["pipeline stream"], ">= 10x"),
        ("from the CLI, same: stream time / pipeline run time",
         best["pipeline stream"] / best["pipeline run"], "<= 2.0x"),
    ]  # fmt: skip
    ceiling = best["transformWithStateInPandas"] / best["floor (foreachBatch)"]
    print(f"\n{'target':84} {'measured':>9} {'target':>9}  verdict")
    for name, value, target in rows:
        ok = value >= 10 if target.startswith(">=") else value <= 2.0
        print(f"{name:84} {value:>8.2f}x {target:>9}  {'met' if ok else 'NOT met'}")
    print(f"the floor's: transformWithStateInPandas time / floor time {ceiling:.2f}x, the most "
          "any stream could reach from the CLI")  # fmt: skip
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0
