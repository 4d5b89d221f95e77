"""Where a pipeline job's time goes: Spark's stage metrics, run by run, cold and warm.

Runs the batch job (``run_job``) or the incremental one (``tickwheel pipeline
stream``, one micro-batch per file) in a fresh SparkSession with Spark's event
log on, then reads the log back and prints, for every run:

* each Spark stage, named by the operators it runs (the RDD scopes Spark
  records: ``Scan text``, ``Exchange``, ``Window``, ``mapInArrow``, …) and by
  the job description tickwheel gives each of its Spark jobs, with its wall
  time, the executors' run time and CPU time, and its shuffle traffic;
* the run's phases as the job itself reports them (``phases_seconds``);
* the CPU seconds of the JVM (all its threads: tasks, JIT, GC) and of its
  Python workers, read from ``/proc``.

The first run is cold (a fresh JVM: class loading, code generation and the
JIT's warm-up are in it), the later ones warm. ``--jfr FILE`` also records
the last run with Java Flight Recorder and prints the JVM's hottest methods
and a breakdown by kind of work.

    python benchmarks/profile_pipeline.py --orders 1000000 --runs 3
    python benchmarks/profile_pipeline.py --orders 1000000 --incremental 10 --runs 2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Kinds of JVM work, by the frames of a JFR sample (first match wins).
JFR_KINDS = (
    ("json parse", ("JsonToStructs", "JacksonParser", "fasterxml.jackson")),
    ("python (arrow to/from workers)", ("python.Python", "ArrowWriter", "ArrowColumnVector",
                                        "ArrowPythonRunner", "arrow.vector")),
    ("parquet / json / csv write", ("parquet", "FileFormatWriter", "JacksonGenerator",
                                    "UnivocityGenerator")),
    ("sort", ("UnsafeExternalSorter", "UnsafeInMemorySorter", "UnsafeExternalRowSorter",
              "TimSort", "RadixSort")),
    ("window", ("WindowEvaluator", "WindowExec", "WindowFunctionFrame")),
    ("aggregate", ("HashAggregate", "Aggregat", "Percentile")),
    ("shuffle", ("shuffle", "ShuffleExternalSorter", "BlockStoreShuffleReader")),
    ("cache", ("InMemoryRelation", "CachedBatch", "columnar.", "MemoryStore")),
    ("read text", ("LineRecordReader", "HadoopFileLinesReader", "FileScanRDD")),
    ("codegen / planning", ("janino", "codehaus", "CodeGenerator", "QueryExecution",
                            "optimizer", "analysis")),
)  # fmt: skip


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children[ppid].append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cpu_snapshot(jvm: int) -> tuple[float, dict[int, float]]:
    """The JVM's CPU seconds, and each Python worker's (the JVM's descendants)."""
    workers = {}
    for pid in _descendants(jvm):
        with contextlib.suppress(OSError):  # the worker exited
            workers[pid] = _proc_cpu(pid)
    return _proc_cpu(jvm), workers


def _read_event_log(directory: Path) -> list[dict[str, Any]]:
    logs = sorted(
        p for p in directory.rglob("*") if p.is_file() and not p.name.startswith((".", "app"))
    )
    events = []
    for log in logs:
        with log.open(encoding="utf-8") as fh:
            events.extend(json.loads(line) for line in fh if line.strip())
    return events


def _accumulable(info: dict[str, Any], name: str) -> float:
    for acc in info.get("Accumulables", []):
        if acc.get("Name") == name:
            return float(acc.get("Value", 0) or 0)
    return 0.0


def stages_by_job(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every completed stage, in order, with its job's description and its metrics."""
    description: dict[int, str] = {}
    job_of_stage: dict[int, int] = {}
    stages = []
    for event in events:
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            text = " ".join((props.get("spark.job.description") or "").split())
            if "batch = " in text:  # Structured Streaming's: id, runId, batch
                text = "stream batch " + text.rsplit("batch = ", 1)[1].split()[0]
            description[event["Job ID"]] = text
            for stage in event.get("Stage IDs", []):
                job_of_stage.setdefault(stage, event["Job ID"])
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            if "Completion Time" not in info or info.get("Number of Tasks", 0) == 0:
                continue
            scopes: list[str] = []
            for rdd in info.get("RDD Info", []):
                scope = json.loads(rdd["Scope"])["name"] if rdd.get("Scope") else rdd["Name"]
                scope = scope.split(" (")[0]
                if scope not in scopes:
                    scopes.append(scope)
            job = job_of_stage.get(info["Stage ID"], -1)
            stages.append({
                "stage": info["Stage ID"], "job": job, "description": description.get(job, ""),
                "operators": ", ".join(s for s in scopes if s != "WholeStageCodegen"),
                "tasks": info["Number of Tasks"],
                "wall_s": (info["Completion Time"] - info["Submission Time"]) / 1000,
                "start": info["Submission Time"],
                "run_s": _accumulable(info, "internal.metrics.executorRunTime") / 1000,
                "cpu_s": _accumulable(info, "internal.metrics.executorCpuTime") / 1e9,
                "gc_s": _accumulable(info, "internal.metrics.jvmGCTime") / 1000,
                "shuffle_w_mb": _accumulable(info, "internal.metrics.shuffle.write.bytesWritten")
                / 2**20,
                "shuffle_r_mb": (
                    _accumulable(info, "internal.metrics.shuffle.read.localBytesRead")
                    + _accumulable(info, "internal.metrics.shuffle.read.remoteBytesRead")
                ) / 2**20,
                "in_records": _accumulable(info, "internal.metrics.input.recordsRead")
                + _accumulable(info, "internal.metrics.shuffle.read.recordsRead"),
            })  # fmt: skip
    return stages


def print_stages(stages: list[dict[str, Any]], title: str) -> None:
    print(f"\n-- {title}: {len(stages)} stages")
    print(f"{'stage':>5} {'wall s':>7} {'run s':>7} {'cpu s':>7} {'gc s':>5} {'shuf w MB':>9} "
          f"{'shuf r MB':>9} {'records in':>11}  job: operators")  # fmt: skip
    for s in stages:
        print(f"{s['stage']:>5} {s['wall_s']:>7.2f} {s['run_s']:>7.2f} {s['cpu_s']:>7.2f} "
              f"{s['gc_s']:>5.2f} {s['shuffle_w_mb']:>9.1f} {s['shuffle_r_mb']:>9.1f} "
              f"{s['in_records']:>11,.0f}  {s['description'] or '-'}: "
              f"{s['operators']}")  # fmt: skip
    total = {k: sum(s[k] for s in stages) for k in ("wall_s", "run_s", "cpu_s")}
    print(f"{'sum':>5} {total['wall_s']:>7.2f} {total['run_s']:>7.2f} {total['cpu_s']:>7.2f}")


def jfr_summary(path: Path, top: int = 20) -> None:
    """The JVM's hottest methods (self time) and its samples by kind of work."""
    text = subprocess.run(
        ["jfr", "print", "--json", "--events", "jdk.ExecutionSample", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    samples = json.loads(text)["recording"]["events"]
    own: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    for sample in samples:
        frames = [
            f["method"]["type"]["name"].replace("/", ".") + "." + f["method"]["name"]
            for f in sample["values"]["stackTrace"]["frames"]
        ]
        if not frames:
            continue
        own[frames[0]] += 1
        stack = " ".join(frames)
        kinds[next((k for k, pats in JFR_KINDS if any(p in stack for p in pats)), "other")] += 1
    n = max(1, len(samples))
    print(f"\n-- JFR: {len(samples)} samples; by kind of work")
    for kind, count in kinds.most_common():
        print(f"{100 * count / n:5.1f}%  {kind}")
    print("-- hottest methods (self)")
    for name, count in own.most_common(top):
        print(f"{100 * count / n:5.1f}%  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--data", default=None, help="existing input (default: generate)")
    parser.add_argument("--files", type=int, default=8, help="files of generated input")
    parser.add_argument("--incremental", type=int, default=0, metavar="K",
                        help="profile the stream over K increments, not the batch")  # fmt: skip
    parser.add_argument("--runs", type=int, default=2, help="the first is cold")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--jfr", default=None, help="record the last run with JFR to this file")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark settings, to measure their effect")  # fmt: skip
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _stream_inputs import feed, lateness_rules

    from tickwheel.pipeline.batch import run_job
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.spark.session import STREAM_SESSION_CONF, create_session

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="profile-pipeline-"))
    events_dir = work / "events"
    shutil.rmtree(events_dir, ignore_errors=True)
    events_dir.mkdir(parents=True)
    files = max(args.files, args.incremental)
    data = Path(args.data) if args.data else work / f"orders-{args.orders}-{files}"
    if not data.exists():
        generate_orders(args.orders, data, seed=42, files=files)
    rules_path = (
        lateness_rules(work / "rules.toml") if args.incremental else ROOT / "examples/orders.toml"
    )
    rules = load_rules(rules_path)
    conf = {
        **STREAM_SESSION_CONF,  # as the CLI's stream runs
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events_dir),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    conf.update(item.split("=", 1) for item in args.conf)  # type: ignore[arg-type]
    started = time.perf_counter()
    spark = create_session("local[2]", shuffle_partitions=args.partitions, conf=conf)
    print(f"SparkSession up in {time.perf_counter() - started:.1f}s; input {data}")
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    marks = []
    try:
        for run in range(args.runs):
            record = args.jfr is not None and run == args.runs - 1
            if record:
                start = ["jcmd", str(jvm), "JFR.start", "name=profile", "settings=profile"]
                subprocess.run([*start, f"filename={args.jfr}"], check=True, capture_output=True)
            jvm0, workers0 = _cpu_snapshot(jvm)
            t0 = time.time() * 1000
            wall = time.perf_counter()
            if args.incremental:
                from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig

                inp = work / f"in-{run}"
                shutil.rmtree(inp, ignore_errors=True)
                shutil.rmtree(work / f"out-{run}", ignore_errors=True)
                shutil.rmtree(work / f"ck-{run}", ignore_errors=True)
                feed(sorted(data.glob("*.jsonl")), inp)
                cfg = StreamConfig(
                    rules_path=str(rules_path), input=str(inp), output=str(work / f"out-{run}"),
                    checkpoint=str(work / f"ck-{run}"), max_files_per_trigger=1,
                    partitions=args.partitions, max_future_ms=None,
                )  # fmt: skip
                FileStreamJob(cfg, spark=spark).run()
                phases: Any = "see the stages"
            else:
                summary = run_job(spark, rules, str(data), str(work / "out"),
                                  partitions=args.partitions, max_future_ms=None)  # fmt: skip
                phases = summary["phases_seconds"]
            seconds = time.perf_counter() - wall
            jvm1, workers1 = _cpu_snapshot(jvm)
            if record:
                subprocess.run(["jcmd", str(jvm), "JFR.stop", "name=profile"], check=True,
                               capture_output=True)  # fmt: skip
            python_cpu = sum(cpu - workers0.get(pid, 0.0) for pid, cpu in workers1.items())
            marks.append((t0, time.time() * 1000, run, seconds, jvm1 - jvm0, python_cpu, phases))
    finally:
        spark.stop()

    stages = stages_by_job(_read_event_log(events_dir))
    for t0, t1, run, seconds, jvm_cpu, python_cpu, phases in marks:
        mine = [s for s in stages if t0 <= s["start"] <= t1]
        print_stages(mine, f"run {run + 1} ({'cold' if run == 0 else 'warm'}): {seconds:.1f} s")
        print(f"JVM CPU {jvm_cpu:.1f} s (all threads), Python workers' CPU {python_cpu:.1f} s; "
              f"phases {phases}")  # fmt: skip
    if args.jfr:
        jfr_summary(Path(args.jfr))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
