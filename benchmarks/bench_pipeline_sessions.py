"""The pipeline on a classic session and on Spark Connect: the same two figures on each.

    .venv/bin/python benchmarks/bench_pipeline_sessions.py [--orders 1e6] [--repeat 2]

For each session kind, in a process of its own (PySpark follows one kind per
process), on one local[2] JVM:

* **batch vs the DataFrame formulation**: ``tickwheel pipeline run``'s job
  (``run_job``) against the pure DataFrame answer of ``bench_pipeline.py``
  over the same files, alternately; the ratio is the formulation's time over
  tickwheel's (higher is better);
* **stream vs batch**: ``tickwheel pipeline stream``'s job over the same
  orders in ``--increments`` files, one per micro-batch, against the batch
  job; the ratio is the stream's time over the batch's. Each stream run's
  outcomes are checked equal to the batch run's.

The classic session is ``create_session("local[2]")``; the Connect one is
``create_session(remote="local[2]")``: a Connect server on the same local
master, started in the process with the same settings, and a client to it,
so the difference is what Connect adds (gRPC, plans sent as protobuf, Arrow
results, ``foreachBatch`` in a Python process beside the server). The best
run of each job counts. Prints one table with both kinds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KINDS = ("classic", "connect")


def _one_kind(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one session kind, measured in this process."""
    from _pipeline_names import STREAM_SESSION_CONF, create_session, generate_orders, run_job
    from _stream_inputs import count_records, feed, lateness_rules
    from bench_pipeline import dataframe_formulation
    from bench_pipeline_incremental import _check_against_batch, _incremental

    from tickwheel.pipeline.rules import load_rules

    work = Path(args.workdir) / kind
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    remote = "local[2]" if kind == "connect" else None
    spark = create_session("local[2]", shuffle_partitions=args.partitions,
                           conf=STREAM_SESSION_CONF, remote=remote)  # fmt: skip
    rules_path = lateness_rules(work / "rules.toml")
    rules = load_rules(str(rules_path))

    def workload(n: int, tag: str) -> tuple[Path, Path, int]:
        gen = work / f"gen-{tag}"
        generate_orders(n, gen, seed=1, files=args.increments)
        paths = sorted(gen.glob("part-*.jsonl"))
        feed(paths, work / f"in-{tag}")
        return gen, work / f"in-{tag}", count_records(paths)

    def batch(gen: Path, out: Path) -> float:
        started = time.perf_counter()
        run_job(spark, rules, str(gen), str(out), partitions=args.partitions)
        return time.perf_counter() - started

    def formulation(gen: Path, out: Path) -> float:
        started = time.perf_counter()
        dataframe_formulation(spark, gen, out)
        return time.perf_counter() - started

    def stream(inp: Path, ck: Path) -> tuple[float, Any]:
        shutil.rmtree(ck, ignore_errors=True)
        seconds, _summary, outs = _incremental(spark, rules_path, inp, ck, args.partitions)
        return seconds, outs

    try:
        gen, inp, _ = workload(1_000, "warm")  # class loading, code generation: untimed
        batch(gen, work / "warm-batch")
        formulation(gen, work / "warm-df")
        stream(inp, work / "warm-stream")
        gen, inp, records = workload(int(args.orders), "big")
        runs: dict[str, list[float]] = {"batch": [], "dataframe": [], "stream": []}
        for attempt in range(args.repeat):
            out = work / f"batch-{attempt}"
            runs["batch"].append(batch(gen, out))
            runs["dataframe"].append(formulation(gen, work / f"df-{attempt}"))
            seconds, outs = stream(inp, work / f"stream-{attempt}")
            runs["stream"].append(seconds)
            checked = _check_against_batch(spark, out, outs)
            took = ", ".join(f"{name} {secs[-1]:.1f}s" for name, secs in runs.items())
            print(f"{kind} run {attempt + 1}: {took}; stream == batch "
                  f"({checked:,} outcome rows)", flush=True)  # fmt: skip
        return {"kind": kind, "spark": spark.version, "records": records, "runs": runs}
    finally:
        spark.stop()


def _table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    best = {r["kind"]: {k: min(v) for k, v in r["runs"].items()} for r in results}
    lines = [
        f"{int(args.orders):,} orders ({results[0]['records']:,} records), stream in "
        f"{args.increments} micro-batches, local[2], best of {args.repeat}",
        "",
        "| session | batch s | DataFrame formulation s | batch vs formulation | stream s "
        "| stream vs batch |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, b in best.items():
        lines.append(
            f"| {kind} | {b['batch']:.1f} | {b['dataframe']:.1f} | "
            f"{b['dataframe'] / b['batch']:.2f}x | {b['stream']:.1f} | "
            f"{b['stream'] / b['batch']:.2f}x |"
        )
    if len(best) == 2:
        c, k = best["classic"], best["connect"]
        lines.append("")
        slower = (f"{name} {k[name] / c[name]:.2f}x" for name in ("batch", "dataframe", "stream"))
        lines.append("connect / classic: " + ", ".join(slower))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=float, default=1e6)
    parser.add_argument("--increments", type=int, default=10, help="files = micro-batches")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--session", choices=(*KINDS, "both"), default="both")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", help="(internal) write one kind's figures to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    own_workdir = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="tw-bench-sessions-")
    if args.session != "both":
        result = _one_kind(args.session, args)
        if args.json:
            Path(args.json).write_text(json.dumps(result), encoding="utf-8")
        else:
            print(_table([result], args))
        return 0
    results = []
    for kind in KINDS:  # each kind in a process of its own
        target = Path(args.workdir) / f"{kind}.json"
        command = [sys.executable, __file__, "--session", kind, "--json", str(target),
                   "--orders", str(args.orders), "--increments", str(args.increments),
                   "--partitions", str(args.partitions), "--repeat", str(args.repeat),
                   "--workdir", args.workdir]  # fmt: skip
        subprocess.run(command, check=True)
        results.append(json.loads(target.read_text(encoding="utf-8")))
    print()
    print(_table(results, args))
    if own_workdir:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
