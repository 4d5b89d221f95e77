"""A long stream at a constant rate: the last micro-batches cost what the first did.

    .venv/bin/python benchmarks/bench_pipeline_soak.py [--batches 300] [--orders-per-batch 100]
        [--clean-source delete] [--retention 10m] [--window 30] [--histogram]
        [--spark-history N] [--progress-metrics]

``tickwheel pipeline stream``'s job (``FileStreamJob``, the ordered file source)
runs in this process on one classic ``local[2]`` session, with a
``--trigger interval=100ms``. A feeder thread drops one file of generated
orders into the input whenever the previous one has been taken, so every
micro-batch reads one file of the same size and the same span of event time
(``--orders-per-batch`` orders, one every 6 s of event time: 10 minutes a
file; a 30-minute timeout, 3 minutes of allowed lateness and ``--retention``).
Each file appears by a rename from a hidden name, as a writer should publish
one, so the source never sees half of it.

What it prints, over ``--window`` micro-batches at each end of the run:

* the median seconds per micro-batch (Spark's ``triggerExecution``, from a
  ``StreamingQueryListener``: listing the input and logging its files, the
  micro-batch and its commit) of the first window against the last;
* the carried state's rows (pending operations and expiry markers, plus the
  events carried above the watermark) and bytes, from
  :func:`tickwheel.pipeline.checkpoint_status` after each micro-batch;
* the memory of the driver (this process's resident set), of the JVM (its
  resident set) and of Spark's Python workers (the proportional set size of
  every Python process under the JVM, so that the pages a forked worker
  shares with its daemon count once), at the end of the first window and at
  the end of the run. The first window's end, not batch 0, is the start: a
  JVM's first micro-batches load classes, compile code and grow its heap.
* the JVM's heap after a full collection (``System.gc()`` at each sample:
  its live objects, which a leak would grow) after every window; with
  ``--histogram``, the classes whose live objects grew most from the first
  window's end to the end (``jcmd GC.class_histogram``).

Spark's status store (what its UI shows, kept whether the UI runs or not)
holds the last 1,000 jobs, stages and SQL executions by default; the stream
session (``STREAM_SESSION_CONF``) keeps 100 of each, and ``--spark-history N``
N instead.

The stream's outputs are then checked equal to the reference model's
(``tests/support/reference.py``) over the files fed. Targets (issue 41):
the last window within 1.15x of the first; state flat under retention;
memory within 10 %.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _support  # noqa: F401 - puts tests/ on the path: the reference of the semantics
from _stream_state import python_workers, status_mb, total_mb

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = "30m"
#: Event time between two orders: 100 orders span 10 minutes of it.
ORDER_GAP_MS = 6_000
#: How long a wait for the stream may take before the run is called stuck.
STUCK_S = 120.0


def _rules(path: Path, retention: str) -> Path:
    """``examples/orders.toml`` with 3 minutes of allowed lateness and ``retention``."""
    text = (ROOT / "examples" / "orders.toml").read_text(encoding="utf-8")
    text = text.replace(
        'allowed_lateness = "0"', f'allowed_lateness = "3m"\nretention = "{retention}"'
    )
    path.write_text(text, encoding="utf-8")
    return path


# -- memory -------------------------------------------------------------------
@dataclass
class Memory:
    """Memory of the three kinds of process, in MiB, and the JVM's heap."""

    driver: float
    jvm: float
    workers: float
    worker_processes: int
    heap_committed: float  # what the JVM's heap has taken from the system
    heap_live: float  # what the heap holds after a full collection

    @classmethod
    def sample(cls, jvm: Any, jvm_pid: int) -> Memory:
        """Driver and JVM resident sets, the workers' proportional set sizes, then
        the JVM's heap after ``System.gc()``. O(processes) plus a full collection."""
        workers = python_workers(jvm_pid)
        pss = total_mb(workers, "Pss", "smaps_rollup")
        driver = status_mb(os.getpid(), "VmRSS")
        resident = status_mb(jvm_pid, "VmRSS")
        runtime = jvm.java.lang.Runtime.getRuntime()
        committed = runtime.totalMemory() / 2**20
        jvm.java.lang.System.gc()  # the live set: what a leak would grow
        live = (runtime.totalMemory() - runtime.freeMemory()) / 2**20
        return cls(driver, resident, pss, len(workers), committed, live)


def _file_log(ck: Path) -> tuple[int, int]:
    """Lines and bytes of the ordered source's file log (what it keeps of the files taken)."""
    data = (ck / "tickwheel" / "files.log").read_bytes()
    return data.count(b"\n"), len(data)


def _class_histogram(jvm_pid: int) -> dict[str, tuple[int, int]]:
    """The JVM's live objects by class: (instances, bytes); ``jcmd`` collects first."""
    done = subprocess.run(["jcmd", str(jvm_pid), "GC.class_histogram"], capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    found: dict[str, tuple[int, int]] = {}
    for line in done.stdout.splitlines():
        match = re.match(r"\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)", line)
        if match:
            found[match[3]] = (int(match[1]), int(match[2]))
    return found


def _histogram_growth(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                      top: int = 12) -> None:  # fmt: skip
    """Print the classes whose live bytes grew most between two histograms."""
    grown = sorted(after, key=lambda c: after[c][1] - before.get(c, (0, 0))[1], reverse=True)
    print("\nlive objects that grew most, first window's end to the end (jcmd GC.class_histogram):")
    print("| class | instances | bytes |")
    print("|---|---:|---:|")
    for name in grown[:top]:
        (n0, b0), (n1, b1) = before.get(name, (0, 0)), after[name]
        print(f"| `{name}` | {n0:,} → {n1:,} | {b0:,} → {b1:,} |")


# -- the run --------------------------------------------------------------------
@dataclass
class Soak:
    """What the listener and the feeder share: per-batch figures, under one condition."""

    batches: int
    seconds: dict[int, float] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)
    failure: BaseException | None = None
    figures: int = 0  # micro-batches whose figures a --progress-metrics listener read

    def progressed(self, batch_id: int, seconds: float) -> None:
        # Spark runs no micro-batch while no new file waits (the query keeps no state
        # of Spark's): each one takes the one file the feeder published, in order.
        with self.changed:
            self.seconds[batch_id] = seconds
            self.changed.notify_all()

    def wait_for(self, done: int) -> None:
        """Block until ``done`` micro-batches have run (or the feeder failed)."""
        deadline = time.monotonic() + STUCK_S
        with self.changed:
            while len(self.seconds) < done and self.failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no micro-batch {done} within {STUCK_S:.0f} s")
                self.changed.wait(left)


def _listener(soak: Soak) -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    from tickwheel.pipeline.stream.progress import COMPANION_PREFIX

    class Progress(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if (p.name or "").startswith(COMPANION_PREFIX):  # --progress-metrics
                report = p.observedMetrics.get("tickwheel")
                soak.figures += report.batches if report is not None else 0
                return
            soak.progressed(p.batchId, p.durationMs.get("triggerExecution", 0) / 1000)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            with soak.changed:
                soak.changed.notify_all()

    return Progress()


def _publish(src: Path, inp: Path) -> None:
    """Copy ``src`` into ``inp`` under a hidden name, then rename it into view."""
    hidden = inp / f".{src.name}.tmp"
    shutil.copyfile(src, hidden)
    os.replace(hidden, inp / src.name)


def _feed_and_sample(
    soak: Soak, files: list[Path], inp: Path, ck: Path, jvm: Any, jvm_pid: int, window: int,
    samples: dict[str, Any], stop: Any, histogram: bool,
) -> None:  # fmt: skip
    """The feeder: one file after each micro-batch; memory after every ``window`` of them."""
    from tickwheel.pipeline import checkpoint_status

    try:
        state: list[tuple[int, int]] = []
        memory: list[tuple[int, Memory]] = []
        for i, src in enumerate(files):
            soak.wait_for(i)  # file i once batch i - 1 has run: one file waits at a time
            if i:
                status = checkpoint_status(str(ck))
                state.append((status["state"]["rows"], status["state"]["bytes"], *_file_log(ck)))
            if i and i % window == 0:  # between micro-batches: the stream is idle
                memory.append((i, Memory.sample(jvm, jvm_pid)))
                if histogram and i == window:
                    samples["histogram"] = [_class_histogram(jvm_pid)]
            _publish(src, inp)
        soak.wait_for(len(files))
        status = checkpoint_status(str(ck))
        state.append((status["state"]["rows"], status["state"]["bytes"], *_file_log(ck)))
        memory.append((len(files), Memory.sample(jvm, jvm_pid)))
        if histogram:
            samples["histogram"].append(_class_histogram(jvm_pid))
        samples["memory"] = memory
        samples["state"] = state
        samples["status"] = status
    except BaseException as exc:
        soak.failure = exc
    finally:
        stop()


def _check(spark: Any, job: Any, files: list[Path], rules_path: Path, ck: Path) -> None:
    """The stream's outcomes and unmatched rows equal the reference's over ``files``."""
    from support.reference import iter_input_lines, run_reference
    from tickwheel.pipeline.rules import load_rules
    from tickwheel.pipeline.stream.start import read_stream_outputs

    lines = [line for f in files for line in iter_input_lines(f)]
    ref = run_reference(lines, load_rules(str(rules_path)))
    outs = read_stream_outputs(spark, job.sink, str(ck))
    for table, cols, expected in (
        ("outcomes", ["op_id", "outcome", "resolved_at"],
         [(r[2], r[5], r[6]) for r in ref.outcomes]),
        ("unmatched", ["event_id", "reason"], [(r[2], r[5]) for r in ref.unmatched]),
    ):  # fmt: skip
        got = sorted(tuple(row[c] for c in cols) for row in outs[table].collect())
        key = lambda r: tuple((v is not None, v) for v in r)  # noqa: E731
        if sorted(got, key=key) != sorted(expected, key=key):
            raise SystemExit(f"{table}: the stream's rows differ from the reference's")


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.2f}x" if a else "-"


def _report(args: argparse.Namespace, soak: Soak, samples: dict[str, Any]) -> None:
    window = args.window
    ids = sorted(soak.seconds)
    first = statistics.median(soak.seconds[b] for b in ids[:window])
    last = statistics.median(soak.seconds[b] for b in ids[-window:])
    state = samples["state"]
    rows_first, bytes_first, lines_first, log_first = state[window - 1]
    rows_last, bytes_last, lines_last, log_last = state[-1]
    rows_max = max(entry[0] for entry in state[window - 1 :])
    memory = samples["memory"]
    start, end = memory[0][1], memory[-1][1]
    print(f"\n{len(ids)} micro-batches of {args.orders_per_batch} orders "
          "(one file each); "
          f"clean source: {args.clean_source}, retention {args.retention}, Spark's history: "
          f"{args.spark_history} each; progress metrics: "
          f"{f'{soak.figures} read' if args.progress_metrics else 'off'}")  # fmt: skip
    print(f"| figure | first {window} (their end) | last {window} (the end) | ratio | target |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| median s per micro-batch | {first:.3f} | {last:.3f} | {_ratio(first, last)} | ≤ 1.15x |"
    )
    print(f"| state rows | {rows_first:,} | {rows_last:,} (max after the first window "
          f"{rows_max:,}) | {_ratio(rows_first, rows_last)} | flat |")  # fmt: skip
    ratio = _ratio(bytes_first, bytes_last)
    print(f"| state bytes | {bytes_first:,} | {bytes_last:,} | {ratio} | flat |")
    most = max(entry[2] for entry in state[window - 1 :])
    print(
        f"| the source's file log: lines (bytes) | {lines_first} ({log_first:,}) | "
        f"{lines_last} ({log_last:,}); at most {most} lines after the first window | | flat |"
    )
    for name, label in (("driver", "driver memory (MiB, resident)"),
                        ("jvm", "JVM memory (MiB, resident)"),
                        ("heap_live", "JVM heap after a full GC (MiB)"),
                        ("workers", "workers' memory (MiB, proportional)")):  # fmt: skip
        a, b = getattr(start, name), getattr(end, name)
        print(f"| {label} | {a:,.0f} | {b:,.0f} | {_ratio(a, b)} | ≤ 1.10x |")
    print(f"| Python worker processes | {start.worker_processes} | {end.worker_processes} | | |")
    print("\nmemory after each window (MiB): batch, driver, JVM resident, JVM heap committed, "
          "heap after a full GC, workers (processes)")  # fmt: skip
    for batch, m in memory:
        print(f"  {batch:>5} {m.driver:7,.0f} {m.jvm:7,.0f} {m.heap_committed:7,.0f} "
              f"{m.heap_live:7,.0f} {m.workers:7,.0f} ({m.worker_processes})")  # fmt: skip
    later = [(batch, m.heap_live) for batch, m in memory[1:]]
    if len(later) >= 2:
        slope = statistics.linear_regression(*zip(*later, strict=True)).slope
        lives = [live for _batch, live in later]
        print(f"heap after a full GC from batch {later[0][0]} on: {min(lives):,.0f}–"
              f"{max(lives):,.0f} MiB, trend {slope * 100:+.1f} MiB per 100 micro-batches "
              "(least squares)")  # fmt: skip
    files = samples["status"]["files"]
    print(f"\nat the end, status: files {files}")
    if "histogram" in samples:
        _histogram_growth(*samples["histogram"])


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--orders-per-batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=30)
    parser.add_argument("--retention", default="10m")
    parser.add_argument("--clean-source", choices=("off", "archive", "delete"), default="delete")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument(
        "--spark-history", type=int, default=None, metavar="N",
        help="keep N jobs, stages and SQL executions in Spark's status store (its UI's "
        "history) instead of the stream session's 100 each (Spark's default: 1000)",
    )  # fmt: skip
    parser.add_argument(
        "--progress-metrics", action="store_true",
        help="the stream's --progress-metrics: each micro-batch's figures counted and "
        "observed by a companion query, whose progress the listener counts",
    )  # fmt: skip
    parser.add_argument(
        "--histogram", action="store_true",
        help="also the JVM's live objects by class (jcmd) at the first window's end and the "
        "end, and the classes that grew most",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.window < 1 or args.batches < 2 * args.window:
        parser.error(
            f"--batches must be at least twice --window ({args.window}), got {args.batches}"
        )
    if args.orders_per_batch < 1:
        parser.error(f"--orders-per-batch must be positive, got {args.orders_per_batch}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from tickwheel.pipeline.generate import generate_orders
    from tickwheel.pipeline.rules import parse_duration
    from tickwheel.pipeline.spark.class_archive import find
    from tickwheel.pipeline.spark.session import STREAM_SESSION_CONF, create_session
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
    from tickwheel.pipeline.stream.progress import COMPANION_PREFIX

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-soak-"))
    shutil.rmtree(work, ignore_errors=True)
    gen, inp, ck = work / "gen", work / "in", work / "ck"
    inp.mkdir(parents=True)
    # One file more than fed: the generator's last holds the long-delayed payments
    # of its last orders, a jump of the watermark, not a constant rate.
    generate_orders(args.batches * args.orders_per_batch, gen, seed=41, files=args.batches + 1,
                    timeout_ms=parse_duration(TIMEOUT), mean_gap_ms=ORDER_GAP_MS)  # fmt: skip
    files = sorted(gen.glob("part-*.jsonl"))[: args.batches]
    rules_path = _rules(work / "rules.toml", args.retention)
    conf = dict(STREAM_SESSION_CONF)
    if args.spark_history is None:  # the stream session's own
        args.spark_history = int(conf.get("spark.ui.retainedJobs", "1000"))
    for name in ("spark.ui.retainedJobs", "spark.ui.retainedStages",
                 "spark.sql.ui.retainedExecutions"):  # fmt: skip
        conf[name] = str(args.spark_history)
    spark = create_session("local[2]", shuffle_partitions=args.partitions, conf=conf,
                           class_archive=find())  # fmt: skip
    jvm = spark.sparkContext._jvm
    jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
    print(f"python {sys.version.split()[0]}, spark {spark.version}, local[2], "
          f"{os.cpu_count()} cores, work {work}")  # fmt: skip
    config = StreamConfig(
        rules_path=str(rules_path), input=str(inp), output=str(work / "out"),
        checkpoint=str(ck), trigger="interval=100ms", max_files_per_trigger=1,
        partitions=args.partitions, clean_source=args.clean_source,
        source_archive_dir=str(work / "archive") if args.clean_source == "archive" else None,
        progress_metrics=args.progress_metrics,
    )  # fmt: skip
    soak = Soak(args.batches)
    spark.streams.addListener(_listener(soak))
    samples: dict[str, Any] = {}

    def stop() -> None:  # the job's query: its progress companion then stops after it
        for query in spark.streams.active:
            if not (query.name or "").startswith(COMPANION_PREFIX):
                query.stop()

    feeder = threading.Thread(
        target=_feed_and_sample,
        args=(soak, files, inp, ck, jvm, jvm_pid, args.window, samples, stop, args.histogram),
        daemon=True,
    )
    with FileStreamJob(config, spark=spark) as job:
        feeder.start()
        job.run()
        feeder.join(STUCK_S)
        if soak.failure is not None:
            raise soak.failure
        if sorted(soak.seconds) != list(range(len(files))):
            raise SystemExit(f"expected micro-batches 0..{len(files) - 1}, one file each; "
                             f"Spark ran {sorted(soak.seconds)}")  # fmt: skip
        _check(spark, job, files, rules_path, ck)
    _report(args, soak, samples)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
