"""The stream's steady state from the command line: micro-batches of 1,000 records after N pending.

For each N of ``--pending`` (issue 54: 1e3, 1e5, 1e6 and 1e7), one input
directory of ``1 + --batches`` JSON Lines files, read one file per
micro-batch:

* ``part-00000.jsonl``, the *load*: one ``created`` event per order, N
  orders, their times 1 ms apart. The rules (``examples/orders.toml`` with a
  30-day timeout) leave all N pending: nothing expires within the few hours
  of event time the files span. 96 bytes an order: 96 MB at 1e6, 0.96 GB at
  1e7, written as formatted strings 100,000 lines at a time, before any
  program runs (``tickwheel pipeline generate`` makes other data: orders
  that resolve, copies, arrival shuffled);
* ``part-00001.jsonl`` ... k = ``--batches`` *steady* files of ``--records``
  records each, their times going on 1 ms apart from where the previous
  file's stopped, so that the watermark moves every micro-batch: three in
  four records are ``created`` events of new orders, one in four a ``paid``
  event that completes a pending order (half of them an order of the load,
  chosen at random; half an order of the previous steady file, or of the
  load for the first one). Each ``paid`` names a different order, so the
  operations pending at the end are known in advance.

No record is late, duplicated or malformed, and the allowed lateness is 0:
no event waits above the watermark, and Spark's peer drops none.

Each program runs as a user runs it, one process each, with
``_cli_comparison``'s commands and its timeout (the process group is stopped
after ``--timeout`` seconds, ``--stream-timeout`` for the stream, and the
micro-batches it finished are kept):

* ``tickwheel pipeline stream --max-files-per-trigger 1``: each micro-batch's
  seconds from its progress lines (``batch N: 1 file(s), ... in S.Ss``, from
  the frame Spark hands over to the commit of tickwheel's state and outputs,
  to 0.1 s); the operations pending at the end from ``tickwheel pipeline
  status --json``, after it exits;
* with ``--peers tws`` (default), ``benchmarks/peer_transform_with_state.py``:
  Spark's ``transformWithStateInPandas`` with event-time timers, on the RocksDB
  state store with changelog checkpointing, as Spark's documentation advises;
  ``--triggers`` = files, so one file per micro-batch. Each micro-batch's
  seconds come from its ``--progress`` file (Spark's ``triggerExecution``,
  which also covers the listing of the input and Spark's offset and commit
  logs), its pending operations from the ``transformWithStateInPandasExec``
  operator's state rows (one per order with an operation pending). The
  micro-batch that only moves the watermark, after the last file, is left
  out. After a size where the peer did not finish, it is not run at the
  larger ones.

As the two programs time a micro-batch differently, a second table times
both alike from Spark's own checkpoint (:func:`checkpoint_spans`: from the
trigger's start to the commit log's file, to the ms).

Micro-batch 0 reads the load. Micro-batch 1, the first after the load, is
reported apart from the steady ones; the *steady* figure is the median of
micro-batches 2..k. Each
program's operations pending at the end are checked equal to the generated
count and, when both finished, the peer's outcomes equal to the stream's on
every key where both must agree (``_stream_peers.check_peer``: here, every
order paid). Also each program's peak memory, sampled from ``/proc`` every
half second: the JVM's peak resident set (``VmHWM``) and the largest sum of
the resident sets of all the program's processes (its Python driver, the
JVM, Spark's Python workers).

What bounds the sizes on a 24 GB machine: the stream's driver heap is a
quarter of the memory by default (6 GB); the peer sets its own to 2 GB (its
state is RocksDB's, off the heap). A run that fails is reported with its exit
and the heap error its log names, if any, and the larger sizes are not run.

The tables give, per N, each program's load, first and steady micro-batch,
the peer's steady median over tickwheel's, and tickwheel's steady median
over its own at the smallest N (1e3, as the issue asks); then the issue's
targets, with a verdict where both sides of a ratio were measured.

    .venv/bin/python benchmarks/bench_stream_steady.py --pending 1e3 1e5 1e6 1e7
    .venv/bin/python benchmarks/bench_stream_steady.py --pending 1e3 1e6 --peers none
    .venv/bin/python benchmarks/bench_stream_steady.py --pending 1e6 --batches 20 \
        --peers none --check-batch

With ``--check-batch``, after the timed runs, the stream's outcomes and the
operations still pending at its end are checked equal to the batch job's
(``tickwheel pipeline run``) over the same files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _stream_peers as peers
from _cli_comparison import PYFLINK_PYTHON, _cli_commands, _Run, _run_timed, _tickwheel_command
from _cli_scale import HEAP_ERRORS
from _pipeline_names import create_session, make_sink, read_stream_outputs
from _stream_inputs import ROOT, sci
from _stream_state import _largest, python_workers, total_mb

STREAM, PEER = "stream", "transformWithStateInPandas"
#: The peer's stateful operator, whose state rows are its pending operations.
PEER_OPERATOR = "transformWithStateInPandasExec"
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
#: Load orders written per ``write`` call.
CHUNK = 100_000
LOAD_LINE = '{{"event_id":"l{0:010d}","order_id":"p{0:010d}","type":"created","ts":{1},"seq":0}}\n'
#: A stream's progress line: ``[12:00:01] stream: batch 3: 1 file(s), a=1, b=2 in 0.8s``.
BATCH_LINE = re.compile(r"\] stream: batch (\d+): .*? in (\d+(?:\.\d+)?)s(?:;|$)")
#: Seconds between two samples of a program's memory.
SAMPLE_S = 0.5


# ----------------------------------------------------------------------------- the input


@dataclass(frozen=True)
class Workload:
    """The files of one N: where they are, and the operations pending after the last."""

    input: Path
    pending: int
    paid: int
    files: int


def steady_rules(path: Path) -> Path:
    """Write ``examples/orders.toml`` with a 30-day timeout (and no lateness) to ``path``."""
    text = (ROOT / "examples" / "orders.toml").read_text(encoding="utf-8")
    if 'timeout = "30m"' not in text or 'allowed_lateness = "0"' not in text:
        raise SystemExit("examples/orders.toml changed: update steady_rules")
    path.write_text(text.replace('timeout = "30m"', 'timeout = "30d"'), encoding="utf-8")
    return path


def _write_load(path: Path, n: int) -> None:
    """N ``created`` events, one order each, 1 ms apart from :data:`BASE_MS`. O(n)."""
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, n, CHUNK):
            stop = min(n, start + CHUNK)
            out.write("".join(LOAD_LINE.format(i, BASE_MS + i) for i in range(start, stop)))


def write_workload(inp: Path, n: int, batches: int, records: int, seed: int = 1) -> Workload:
    """The load and ``batches`` steady files in ``inp``, modification times in file order."""
    inp.mkdir(parents=True)
    rng = random.Random(seed)
    _write_load(inp / "part-00000.jsonl", n)
    paid_per_file = records // 4
    from_load = [paid_per_file if j == 1 else paid_per_file // 2 for j in range(1, batches + 1)]
    load_paid = iter(rng.sample(range(n), sum(from_load)))
    ms, previous, paid = BASE_MS + n, [], 0
    for j in range(1, batches + 1):
        created: list[str] = []
        targets = [f"p{next(load_paid):010d}" for _ in range(from_load[j - 1])]
        targets += rng.sample(previous, paid_per_file - from_load[j - 1])
        lines = []
        for i in range(records):
            if i % 4 == 3 and i // 4 < len(targets):
                key, kind, seq = targets[i // 4], "paid", 1
                paid += 1
            else:
                key, kind, seq = f"q{j:03d}{i:06d}", "created", 0
                created.append(key)
            lines.append(f'{{"event_id":"s{j:03d}-{i:06d}","order_id":"{key}","type":"{kind}",'
                         f'"ts":{ms},"seq":{seq}}}\n')  # fmt: skip
            ms += 1
        (inp / f"part-{j:05d}.jsonl").write_text("".join(lines), encoding="utf-8")
        previous = created
    files = sorted(inp.glob("part-*.jsonl"))
    for i, path in enumerate(files):  # Spark's file source takes files in this order
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    pending = n + batches * records - 2 * paid  # each paid event also took a record
    return Workload(inp, pending, paid, len(files))


# ----------------------------------------------------------------------------- a program's run


@dataclass
class Batch:
    """One micro-batch with data: 0 is the load's. Its seconds as the program reports
    them, and from Spark's checkpoint (:func:`checkpoint_spans`)."""

    index: int
    seconds: float
    span: float | None = None
    pending: int | None = None  # the peer's state rows after it


@dataclass
class Memory:
    """A program's peak memory in MB: its JVM's ``VmHWM``, and the most its processes held."""

    jvm_peak: float = 0.0
    total_peak: float = 0.0
    #: This process's descendants before the program started (the check's JVM
    #: outlives its session): not the program's.
    before: frozenset[int] = field(default_factory=lambda: frozenset(python_workers(os.getpid())))

    def sample(self) -> None:
        """Read the resident sets of the running program's processes."""
        pids = [pid for pid in python_workers(os.getpid()) if pid not in self.before]
        jvms = []
        for pid in pids:
            with contextlib.suppress(OSError):  # gone since it was listed
                if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                    jvms.append(pid)
        self.jvm_peak = max(self.jvm_peak, _largest(jvms, "VmHWM"))
        self.total_peak = max(self.total_peak, total_mb(pids, "VmRSS"))

    def __str__(self) -> str:
        return f"{self.jvm_peak / 1024:.1f}/{self.total_peak / 1024:.1f}"


@dataclass
class Outcome:
    """A program's run at one N: its exit, micro-batches, pending operations at the end
    and memory."""

    name: str
    run: _Run | None  # None: not run
    batches: list[Batch] = field(default_factory=list)
    pending: int | None = None
    memory: Memory = field(default_factory=Memory)
    why: str = ""  # why it was not run

    @property
    def finished(self) -> bool:
        return self.run is not None and self.run.code == 0

    def values(self, first: int, last: int, what: str = "seconds") -> list[float]:
        """``what`` (``seconds`` or ``span``) of micro-batches ``first``..``last``."""
        found = [getattr(b, what) for b in self.batches if first <= b.index <= last]
        return [value for value in found if value is not None]

    def load(self, what: str = "seconds") -> float | None:
        """Micro-batch 0's, the load's."""
        return next(iter(self.values(0, 0, what)), None)

    def first(self, what: str = "seconds") -> float | None:
        """Micro-batch 1's, the first after the load."""
        return next(iter(self.values(1, 1, what)), None)

    def steady(self, batches: int, what: str = "seconds") -> float | None:
        """The median of micro-batches 2..``batches``, once all of them ran."""
        found = self.values(2, batches, what)
        return statistics.median(found) if len(found) == batches - 1 else None

    def status(self, timeout_s: float) -> str:
        if self.run is None:
            return f"not run: {self.why}"
        if self.run.code is None:
            return f"did not finish in {timeout_s:.0f} s ({len(self.batches)} micro-batch(es) done)"
        if self.run.code:
            heap = HEAP_ERRORS.search(self.run.stdout + self.run.stderr)
            return f"failed, exit {self.run.code}" + (f" ({heap.group(0)})" if heap else "")
        return f"{self.run.seconds:.1f} s from start to exit"


def run_measured(command: list[str], timeout_s: float, memory: Any = None) -> tuple[_Run, Any]:
    """Run ``command`` (:func:`_run_timed`), sampling its processes' memory meanwhile:
    into ``memory`` (anything with a ``sample()``; default a :class:`Memory`)."""
    memory, done = Memory() if memory is None else memory, threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            memory.sample()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = _run_timed(command, timeout_s)
    finally:
        done.set()
        sampler.join()
    return run, memory


def checkpoint_spans(spark_checkpoint: Path) -> dict[int, float]:
    """Each committed batch's seconds from its trigger to its commit, alike for any query.

    From Spark's checkpoint: the offset log's ``batchTimestampMs`` (taken as the
    trigger starts, before the source lists its input) to the modification time
    of the commit log's file (written once the batch's sink is done). To the ms.
    """
    spans: dict[int, float] = {}
    commits = spark_checkpoint / "commits"
    for commit in commits.iterdir() if commits.is_dir() else ():
        if commit.name.isdigit():
            offsets = (spark_checkpoint / "offsets" / commit.name).read_text(encoding="utf-8")
            started_ms = json.loads(offsets.splitlines()[1])["batchTimestampMs"]
            spans[int(commit.name)] = commit.stat().st_mtime - started_ms / 1e3
    return spans


def stream_batches(stdout: str, spans: dict[int, float]) -> list[Batch]:
    """The micro-batches of the stream's progress lines, in order."""
    found = []
    for line in stdout.splitlines():
        match = BATCH_LINE.search(line)
        if match:
            batch_id = int(match.group(1))
            found.append(Batch(len(found), float(match.group(2)), spans.get(batch_id)))
    return found


def stream_pending(checkpoint: Path) -> int:
    """The operations pending in the stream's last commit (``tickwheel pipeline status``)."""
    status = [*_tickwheel_command(), "pipeline", "status", "--checkpoint", str(checkpoint),
              "--json"]  # fmt: skip
    done = subprocess.run(status, capture_output=True, text=True, check=True)
    return int(json.loads(done.stdout)["pending"]["total"])


def peer_batches(progress: Path, spans: dict[int, float]) -> list[Batch]:
    """The peer's micro-batches with data, from its ``--progress`` file."""
    if not progress.exists():
        return []
    found = []
    for line in progress.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry["data"]:  # not the last one, which only moves the watermark
            rows = entry["state_rows"].get(PEER_OPERATOR)
            found.append(Batch(len(found), entry["ms"] / 1e3, spans.get(entry["batch"]), rows))
    return found


# ----------------------------------------------------------------------------- one N


@dataclass
class Size:
    """One N's runs, and what was checked."""

    n: int
    workload: Workload
    stream: Outcome
    peer: Outcome
    checks: list[str] = field(default_factory=list)


def _check_pending(size: Size) -> None:
    """Each finished program's pending operations at the end equal the generated count."""
    want = size.workload.pending
    for side in (size.stream, size.peer):
        if not side.finished:
            continue
        if side.pending != want:
            raise SystemExit(
                f"MISMATCH at {sci(size.n)}: {side.name} ends with {side.pending} pending "
                f"operations; the input leaves {want:,}"
            )
        size.checks.append(f"{side.name}: {want:,} pending at the end, as generated")


def _stream_outputs(spark: Any, work: Path) -> dict[str, Any]:
    """The tables the command line's stream published, read through its checkpoint."""
    sink = make_sink("parquet", str(work / "cli-stream"), spark)
    return read_stream_outputs(spark, sink, str(work / "cli-stream-ck"))


def _check_outcomes(size: Size, work: Path) -> None:
    """The peer's outcomes equal the stream's on comparable keys (untimed, one more JVM)."""
    assert size.stream.run is not None
    done = [line for line in size.stream.run.stdout.splitlines() if " stream: done: " in line]
    watermark = json.loads(done[-1].split(" stream: done: ", 1)[1])["watermark"]
    spark = create_session("local[2]", shuffle_partitions=2)
    try:
        outs = _stream_outputs(spark, work)
        # Every key has one operation, so the pending rows change no key's standing:
        # they are left out of what is collected (N of them).
        outs["outcomes"] = outs["outcomes"].where("outcome != 'pending'")
        expected = peers.comparable_outcomes(outs, watermark)
        if len(expected) != size.workload.paid:
            raise SystemExit(f"MISMATCH at {sci(size.n)}: {len(expected):,} comparable keys, "
                             f"{size.workload.paid:,} orders paid")  # fmt: skip
        check = peers.check_peer(PEER, spark, work / "cli-peer", expected)  # exits if unequal
        size.checks.append(f"{PEER}'s outcomes {check}")
    finally:
        spark.stop()


def _check_batch(size: Size, work: Path, rules: Path) -> None:
    """The stream's outcomes and pending operations at the end equal what the batch job
    (``tickwheel pipeline run``) gives over the same files (untimed, two more JVMs)."""
    batch = _cli_commands(
        work, rules, size.workload.input, size.workload.files, ["run"], PYFLINK_PYTHON
    )
    done = subprocess.run(batch["run"], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the batch job failed:\n{done.stderr[-3000:]}")
    spark = create_session("local[2]", shuffle_partitions=2)
    try:
        streamed = _stream_outputs(spark, work)["outcomes"]
        ran = spark.read.parquet(str(work / "cli-run" / "outcomes"))
        columns = sorted(set(streamed.columns) & set(ran.columns) - {"batch_id"})
        streamed, ran = streamed.select(*columns), ran.select(*columns)
        apart = streamed.exceptAll(ran).count() + ran.exceptAll(streamed).count()
        if apart:
            raise SystemExit(f"MISMATCH at {sci(size.n)}: {apart:,} outcome rows differ "
                             "between the stream and the batch job")  # fmt: skip
        pending = ran.where("outcome = 'pending'").count()
        size.checks.append(f"stream: its {streamed.count():,} outcomes, {pending:,} of them "
                           "pending, equal the batch job's over the same files")  # fmt: skip
    finally:
        spark.stop()


def _timeout(args: argparse.Namespace, name: str) -> float:
    return float(args.stream_timeout if name == STREAM else args.timeout)


def _run_program(args: argparse.Namespace, work: Path, name: str, command: list[str]) -> Outcome:
    """Run one program over N's files; its micro-batches, pending operations, memory."""
    run, memory = run_measured(command, _timeout(args, name))
    if name == STREAM:
        ck = work / "cli-stream-ck"
        batches = stream_batches(run.stdout, checkpoint_spans(ck / "spark"))
        pending = stream_pending(ck) if run.code == 0 else None
    else:
        batches = peer_batches(work / "peer-progress.jsonl", checkpoint_spans(work / "cli-peer-ck"))
        pending = batches[-1].pending if batches else None
    if run.code:
        print(f"{name}: exit {run.code}:\n{run.stderr[-3000:]}", file=sys.stderr)
    return Outcome(name, run, batches, pending, memory)


def measure_size(args: argparse.Namespace, work: Path, rules: Path, n: int, peer_why: str) -> Size:
    """Generate N's files, run the stream and the peer over them, check; the figures."""
    workload = write_workload(work / "in", n, args.batches, args.records)
    names = [PEER] if args.peers == "tws" and not peer_why else []
    commands = _cli_commands(work, rules, workload.input, workload.files, names, PYFLINK_PYTHON)
    if names:
        commands[PEER] += ["--progress", str(work / "peer-progress.jsonl")]
    ran = {}
    for name, command in commands.items():
        side = ran[name] = _run_program(args, work, name, command)
        print(f"{sci(n)} pending: {name}: {side.status(_timeout(args, name))}; micro-batches "
              + " ".join(f"{b.seconds:.1f}" for b in side.batches)
              + f" s; peak GB (JVM/all) {side.memory}", flush=True)  # fmt: skip
    peer = ran.get(PEER) or Outcome(PEER, None, why=peer_why or "--peers none")
    size = Size(n, workload, ran[STREAM], peer)
    _check_pending(size)
    if size.stream.finished and size.peer.finished:
        _check_outcomes(size, work)
    if size.stream.finished and args.check_batch:
        _check_batch(size, work, rules)
    for check in size.checks:
        print(f"  checked: {check}", flush=True)
    return size


# ----------------------------------------------------------------------------- the tables


def _cell(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def _table(sizes: list[Size], k: int, what: str) -> None:
    """One row per N of ``what`` (``seconds`` or ``span``): each side's load, first
    and steady micro-batch, the peer's steady over tickwheel's, and tickwheel's steady
    over its own at the smallest N."""
    base = sizes[0].stream.steady(k, what)
    print(f"{'pending':>8} {'load':>7} {'first':>7} {'steady':>7} {'tws load':>9} "
          f"{'tws first':>9} {'tws steady':>10} {'tws/tickwheel':>13} "
          f"{'vs ' + sci(sizes[0].n):>8}")  # fmt: skip
    for s in sizes:
        stream, peer = s.stream, s.peer
        steady = stream.steady(k, what)
        print(f"{sci(s.n):>8} {_cell(stream.load(what)):>7} {_cell(stream.first(what)):>7} "
              f"{_cell(steady):>7} {_cell(peer.load(what)):>9} {_cell(peer.first(what)):>9} "
              f"{_cell(peer.steady(k, what)):>10} "
              f"{_cell(_ratio(peer.steady(k, what), steady), 'x'):>13} "
              f"{_cell(_ratio(steady, base), 'x'):>8}")  # fmt: skip


def report(sizes: list[Size], args: argparse.Namespace) -> None:
    """The figures per N, the ratios, and the issue's targets."""
    k = args.batches
    print(f"\nmicro-batches of {args.records:,} records after N pending operations, one file "
          f"each, one process per program (tws: {PEER}); seconds. load: micro-batch 0; first: "
          f"micro-batch 1, the first after the load; steady: the median of micro-batches "
          f"2..{k}")  # fmt: skip
    print("\nas each program reports them (tickwheel: its progress lines, from the frame Spark "
          "hands over to the commit; tws: Spark's triggerExecution):")  # fmt: skip
    _table(sizes, k, "seconds")
    print("\ntimed alike from Spark's checkpoints (the trigger's batchTimestampMs to the commit "
          "log's file):")  # fmt: skip
    _table(sizes, k, "span")
    print("\npeak memory, GB: the JVM's resident set (VmHWM) / all its processes' (sampled)")
    for s in sizes:
        peer = str(s.peer.memory) if s.peer.run is not None else "-"
        print(f"{sci(s.n):>8}  tickwheel {s.stream.memory}  tws {peer}")
    for s in sizes:
        for side in (s.stream, s.peer):
            if not side.finished:
                print(f"{sci(s.n):>8}  {side.name}: {side.status(_timeout(args, side.name))}")
    _targets(sizes, args)


def _targets(sizes: list[Size], args: argparse.Namespace) -> None:
    """The issue's targets (54) at the sizes that ran, from the programs' own figures."""
    k, by_n = args.batches, {s.n: s for s in sizes}
    rows: list[tuple[str, float | None, str, str]] = []

    def row(name: str, ratio: float | None, target: str, ok: bool, why: str) -> None:
        verdict = f"not measured: {why}" if ratio is None else ("met" if ok else "NOT met")
        rows.append((name, ratio, target, verdict))

    base = by_n.get(1_000)
    for n, bound in ((1_000_000, 1.3), (10_000_000, 2.0)):
        if n in by_n:
            ratio = _ratio(by_n[n].stream.steady(k), base.stream.steady(k) if base else None)
            why = "no run at 1e3" if base is None else "the stream did not finish"
            row(f"tickwheel's steady micro-batch, {sci(n)} pending against 1e3", ratio,
                f"<= {bound}x", ratio is not None and ratio <= bound, why)  # fmt: skip
    for n in (100_000, 1_000_000):
        if n in by_n:
            peer = by_n[n].peer
            ratio = _ratio(peer.steady(k), by_n[n].stream.steady(k))
            why = peer.status(args.timeout) if not peer.finished else "the stream did not finish"
            row(f"{PEER} against tickwheel, steady, {sci(n)} pending", ratio, ">= 3x",
                ratio is not None and ratio >= 3, f"{PEER} {why}")  # fmt: skip
    if rows:
        print(f"\n{'target':66} {'measured':>9} {'target':>9}  verdict")
    for name, value, target, verdict in rows:
        print(f"{name:66} {_cell(value, 'x'):>9} {target:>9}  {verdict}")


# ----------------------------------------------------------------------------- main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=float, nargs="+", default=[1e3, 1e5, 1e6, 1e7],
                        help="N: operations the load leaves pending, a run at each")  # fmt: skip
    parser.add_argument("--batches", type=int, default=6, help="steady files after the load")
    parser.add_argument("--records", type=int, default=1_000, help="records per steady file")
    parser.add_argument("--peers", choices=("tws", "none"), default="tws",
                        help="tws: transformWithStateInPandas beside the stream")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds after which the peer is stopped (not finished)")  # fmt: skip
    parser.add_argument("--stream-timeout", type=float, default=3600.0,
                        help="the same for the stream")  # fmt: skip
    parser.add_argument("--check-batch", action="store_true",
                        help="check the stream's outcomes against the batch job's")  # fmt: skip
    parser.add_argument("--workdir", type=Path, help="kept afterwards (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.batches < 2:
        parser.error(f"--batches must be >= 2 (micro-batch 1 and a steady one), got {args.batches}")
    if args.records < 4:
        parser.error(f"--records must be >= 4, got {args.records}")
    if args.timeout <= 0 or args.stream_timeout <= 0:
        parser.error("--timeout and --stream-timeout must be > 0")
    sizes = sorted({int(n) for n in args.pending})
    # Micro-batch 1 pays only load orders; later ones half of their paid events.
    least = args.records // 4 + (args.batches - 1) * (args.records // 8)
    if sizes[0] < least:
        parser.error(f"--pending must be >= {least:,} (the load orders the steady files pay)")
    args.pending = sizes
    missing = peers.missing_dependency([PEER] if args.peers == "tws" else [])
    if missing:
        parser.error(missing)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; 1 if a program failed (not a timeout)."""
    args = _parse(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tw-bench-steady-"))
    work.mkdir(parents=True, exist_ok=True)
    rules = steady_rules(work / "rules.toml")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, work {work}", flush=True)
    sizes: list[Size] = []
    peer_why = ""
    try:
        for n in args.pending:
            here = work / f"n-{sci(n)}"
            shutil.rmtree(here, ignore_errors=True)
            here.mkdir()
            size = measure_size(args, here, rules, n, peer_why)
            sizes.append(size)
            if args.workdir is None:  # the largest N's files are GBs
                shutil.rmtree(here, ignore_errors=True)
            if size.peer.run is not None and not size.peer.finished:
                peer_why = f"it did not finish at {sci(n)}"
            if not size.stream.finished:
                print(f"the stream did not finish at {sci(n)}: no larger N is run", flush=True)
                break
        report(sizes, args)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = [side for s in sizes for side in (s.stream, s.peer) if side.run and side.run.code]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
