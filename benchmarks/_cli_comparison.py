"""The stream against its peers as users run them: one process each.

``bench_pipeline_incremental.py --cli``: for each N of ``--cli-orders``,
``tickwheel pipeline generate`` writes the orders as K files (their times set
in arrival order); then, for ``--cli-repeat`` rounds, the programs run one
after another from fresh outputs, each its own process, timed from start to
exit (so the peers' rounds alternate with the stream's):

* ``tickwheel pipeline stream --max-files-per-trigger 1`` (K micro-batches),
  always: the one every peer is compared with;

and those of ``--cli-peers`` (by default the first three):

* ``run``: ``tickwheel pipeline run`` (the batch job);
* ``transformWithStateInPandas``: ``benchmarks/peer_transform_with_state.py
  --triggers K`` (Spark's ``transformWithStateInPandas`` with event-time
  timers, RocksDB);
* ``floor``: the same program with ``--api floor``: the files through Spark's
  JSON source into a ``foreachBatch`` that writes each micro-batch as one
  Parquet file. The least a program of this shape costs from the command
  line: the JVM's start, the source, K micro-batches.
  ``transformWithStateInPandas`` time ÷ its time is the most any stream could
  reach against that peer;
* ``pyflink``: ``benchmarks/peer_pyflink.py`` (PyFlink's
  ``KeyedProcessFunction`` with event-time timers, parallelism = cores, its
  Python workers tuned as its docs advise) run by the interpreter of its own
  environment, ``--pyflink-python`` (``.venvs/pyflink/bin/python``, made by
  ``make bench-env-pyflink``). Without it, this says so and skips the peer.

All with the same rules (``examples/orders.toml`` with 3 minutes of
lateness) and their default options. A program still running after
``--cli-timeout`` seconds is stopped (its process group) and reported as not
finished. Afterwards, untimed, each stateful peer's outcomes are checked
against the stream's (``_stream_peers.check_peer``, one more JVM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _stream_peers as peers
from _pipeline_names import create_session, make_sink, read_stream_outputs
from _stream_inputs import ROOT, feed, lateness_rules, sci

#: The programs by their ``--cli-peers`` name: the name they have in the
#: tables, and where each writes (this directory, and this + "-ck" for a checkpoint).
PROGRAMS = {
    "stream": ("pipeline stream", "cli-stream"),
    "run": ("pipeline run", "cli-run"),
    "transformWithStateInPandas": ("transformWithStateInPandas", "cli-peer"),
    "floor": ("floor (foreachBatch)", "cli-floor"),
    "pyflink": ("PyFlink KeyedProcessFunction", "cli-pyflink"),
}
#: The peers run unless ``--cli-peers`` says otherwise.
DEFAULT_PEERS = ("run", "transformWithStateInPandas", "floor")
#: The peers whose outcomes are checked against the stream's, and their output's format.
CHECKED = {"transformWithStateInPandas": "parquet", "pyflink": "json"}
#: PyFlink's environment (``make bench-env-pyflink``).
PYFLINK_PYTHON = ROOT / ".venvs" / "pyflink" / "bin" / "python"


def _tickwheel_command() -> list[str]:
    """``tickwheel`` as installed beside this interpreter, else ``python -m tickwheel``."""
    script = Path(sys.executable).with_name("tickwheel")
    return [str(script)] if script.exists() else [sys.executable, "-m", "tickwheel"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--cli`` comparison's options, on the benchmark's parser."""
    parser.add_argument("--cli", action="store_true", help="the one-process-each comparison")
    parser.add_argument("--cli-orders", type=float, nargs="+", default=[5e4],
                        help="orders for --cli, one comparison at each")  # fmt: skip
    parser.add_argument("--cli-repeat", type=int, default=1, help="rounds of --cli")
    parser.add_argument(
        "--cli-peers", nargs="+", choices=[p for p in PROGRAMS if p != "stream"],
        default=list(DEFAULT_PEERS), help="the programs beside the stream (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--cli-timeout", type=float, default=600.0,
        help="seconds after which a program is stopped, as not finished",
    )  # fmt: skip
    parser.add_argument(
        "--pyflink-python", type=Path, default=PYFLINK_PYTHON,
        help="the interpreter of PyFlink's environment (make bench-env-pyflink)",
    )  # fmt: skip


def pyflink_missing(python: Path) -> str | None:
    """Why PyFlink's peer cannot run with ``python``, or None when it can."""
    if not python.exists():
        return f"{python} does not exist: `make bench-env-pyflink` creates it"
    done = subprocess.run([str(python), "-c", "import pyflink"], capture_output=True, check=False)
    if done.returncode:
        return f"{python} cannot import pyflink: `make bench-env-pyflink` installs it"
    return None


def _cli_commands(
    work: Path, rules: Path, inp: Path, triggers: int, names: list[str], pyflink_python: Path
) -> dict[str, list[str]]:
    """The programs ``names`` as a user runs them, each writing under ``work/cli-<name>``."""
    tw = _tickwheel_command()
    out = {name: work / PROGRAMS[name][1] for name in PROGRAMS}
    ck = {name: work / f"{PROGRAMS[name][1]}-ck" for name in PROGRAMS}
    here = Path(__file__).parent
    spark_peer = [sys.executable, str(here / "peer_transform_with_state.py"), "--rules",
                  str(rules), "--input", str(inp), "--triggers", str(triggers)]  # fmt: skip
    tws = "transformWithStateInPandas"
    commands = {
        "stream": [*tw, "pipeline", "stream", "--rules", str(rules), "--input", str(inp),
                   "--output", str(out["stream"]), "--checkpoint", str(ck["stream"]),
                   "--max-files-per-trigger", "1"],
        "run": [*tw, "pipeline", "run", "--rules", str(rules), "--input", str(inp),
                "--output", str(out["run"])],
        tws: [*spark_peer, "--output", str(out[tws]), "--checkpoint", str(ck[tws])],
        "floor": [*spark_peer, "--api", "floor", "--output", str(out["floor"]),
                  "--checkpoint", str(ck["floor"])],
        "pyflink": [str(pyflink_python), str(here / "peer_pyflink.py"),
                    "--rules", str(rules), "--input", str(inp), "--output", str(out["pyflink"]),
                    "--parallelism", str(os.cpu_count() or 2)],
    }  # fmt: skip
    return {name: commands[name] for name in ["stream", *names]}


@dataclass
class _Run:
    """A program's exit (None: stopped at the timeout), seconds, and what it printed
    (until it was stopped)."""

    code: int | None
    seconds: float
    stdout: str = ""
    stderr: str = ""


def _run_timed(command: list[str], timeout_s: float) -> _Run:
    """Run ``command`` to its exit, timed; stop its process group after ``timeout_s``."""
    started = time.perf_counter()
    # A process group of its own: PyFlink's and Spark's JVMs (and their Python
    # workers) are the program's children, and a timeout stops them all.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()  # what it printed before it was stopped
        return _Run(None, time.perf_counter() - started, stdout, stderr)
    return _Run(proc.returncode, time.perf_counter() - started, stdout, stderr)


def _cli_check(work: Path, stream_stdout: str, names: list[str]) -> dict[str, str]:
    """Check the peers ``names``' outcomes against the stream's (untimed, one more JVM)."""
    done = [line for line in stream_stdout.splitlines() if " stream: done: " in line]
    if not done:
        raise SystemExit("the stream printed no 'done:' summary; cannot check the peers")
    watermark = json.loads(done[-1].split(" stream: done: ", 1)[1])["watermark"]
    spark = create_session("local[2]", shuffle_partitions=2)
    try:
        sink = make_sink("parquet", str(work / PROGRAMS["stream"][1]), spark)
        outs = read_stream_outputs(spark, sink, str(work / f"{PROGRAMS['stream'][1]}-ck"))
        expected = peers.comparable_outcomes(outs, watermark)
        return {name: peers.check_peer(PROGRAMS[name][0], spark, work / PROGRAMS[name][1],
                                       expected, CHECKED[name])
                for name in names}  # fmt: skip
    finally:
        spark.stop()


@dataclass
class _SizeResult:
    """One N's figures: each program's runs (None: did not finish) and the checks."""

    orders: int
    files: int
    times: dict[str, list[float | None]] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)

    def best(self, name: str) -> float | None:
        """The program's best finished run, or None if no run finished."""
        done = [t for t in self.times.get(name, []) if t is not None]
        return min(done) if done else None


def _seconds(value: float | None, timeout_s: float) -> str:
    return f"{value:.1f}" if value is not None else f"did not finish in {timeout_s:.0f} s"


def _compare_at(args: argparse.Namespace, work: Path, rules: Path, n: int,
                names: list[str]) -> _SizeResult:  # fmt: skip
    """Generate ``n`` orders, run the programs ``--cli-repeat`` times in turn, check the peers."""
    k = args.increments
    gen, inp = work / f"cli-gen-{n}", work / f"cli-in-{n}"
    for old in (gen, inp):
        shutil.rmtree(old, ignore_errors=True)
    generate = ["pipeline", "generate", "--orders", str(n), "--files", str(k), "--seed", "1"]
    subprocess.run([*_tickwheel_command(), *generate, "--out", str(gen)], check=True)
    feed(sorted(gen.glob("part-*.jsonl")), inp)
    commands = _cli_commands(work, rules, inp, k, names, args.pyflink_python)
    result = _SizeResult(n, k, {name: [] for name in commands})
    stream_stdout = ""
    for attempt in range(args.cli_repeat):
        for name, command in commands.items():
            for old in work.glob(f"{PROGRAMS[name][1]}*"):  # its output and checkpoint
                shutil.rmtree(old)
            run = _run_timed(command, args.cli_timeout)
            if run.code:
                print(f"{name} failed ({run.code}):\n{run.stderr[-4000:]}", file=sys.stderr)
                raise SystemExit(1)
            result.times[name].append(None if run.code is None else run.seconds)
            stream_stdout = run.stdout if name == "stream" else stream_stdout
            if run.code is None:
                print(f"round {attempt + 1}: {PROGRAMS[name][0]}: did not finish in "
                      f"{args.cli_timeout:.0f} s (stopped)", flush=True)  # fmt: skip
                continue
            if name in ("transformWithStateInPandas", "floor", "pyflink"):  # its own summary
                print(run.stdout.strip().splitlines()[-1], flush=True)
            print(f"round {attempt + 1}: {PROGRAMS[name][0]}: {run.seconds:.1f}s", flush=True)
    checked = [name for name in CHECKED if name in names and result.best(name) is not None]
    if result.best("stream") is None:
        print("the stream did not finish: no peer is checked", flush=True)
    elif checked:
        result.checks = _cli_check(work, stream_stdout, checked)
    # The last round's outputs are checked; keep the work directory small for the next N.
    for old in [gen, inp, *work.glob("cli-*")]:
        shutil.rmtree(old, ignore_errors=True)
    print(f"\n{sci(n)} orders in {k} files, one process each; seconds from start to exit "
          f"(best of {args.cli_repeat}):")  # fmt: skip
    for name, command in commands.items():
        print(f"  {PROGRAMS[name][0]:28} {_seconds(result.best(name), args.cli_timeout):>7}  "
              f"{' '.join(command)}")  # fmt: skip
    for name, check in result.checks.items():
        print(f"  checked: {PROGRAMS[name][0]}'s outcomes {check}")
    _print_targets(result)
    return result


def _print_targets(result: _SizeResult) -> None:
    """The issue's targets, where the programs they name ran and finished."""
    best = {name: result.best(name) for name in result.times}
    tag = f"from the CLI, {sci(result.orders)} orders in {result.files} files"
    rows = []
    stream, peer, run = best["stream"], best.get("transformWithStateInPandas"), best.get("run")
    if stream and peer:
        rows.append((f"{tag}: transformWithStateInPandas time / stream time", peer / stream,
                     ">= 10x"))  # fmt: skip
    if stream and run:
        rows.append(("from the CLI, same: stream time / pipeline run time", stream / run,
                     "<= 2.0x"))  # fmt: skip
    if rows:
        print(f"\n{'target':84} {'measured':>9} {'target':>9}  verdict")
    for name, value, target in rows:
        ok = value >= 10 if target.startswith(">=") else value <= 2.0
        print(f"{name:84} {value:>8.2f}x {target:>9}  {'met' if ok else 'NOT met'}")
    floor = best.get("floor")
    if peer and floor:
        print(f"the floor's: transformWithStateInPandas time / floor time {peer / floor:.2f}x, "
              "the most any stream could reach from the CLI")  # fmt: skip


def _print_pyflink(results: list[_SizeResult], timeout_s: float) -> None:
    """PyFlink's table over every N: its seconds, the stream's, the ratio, the check."""
    print("\nPyFlink's KeyedProcessFunction against the stream, one process each, "
          "seconds from start to exit:")  # fmt: skip
    print(f"  {'orders':>7} {'PyFlink s':>28} {'stream s':>9} {'PyFlink / stream':>17}  check")
    for r in results:
        flink, stream = r.best("pyflink"), r.best("stream")
        ratio = f"{flink / stream:.2f}x" if flink and stream else (
            f"> {timeout_s / stream:.2f}x" if stream else "n/a")  # fmt: skip
        check = r.checks.get("pyflink", "not checked: it did not finish")
        print(f"  {sci(r.orders):>7} {_seconds(flink, timeout_s):>28} "
              f"{_seconds(stream, timeout_s):>9} {ratio:>17}  {check}")  # fmt: skip


def cli_comparison(args: argparse.Namespace) -> int:
    """As users run them, one process each, over the same generated files, at each N.

    See the module doc. Returns 0 when every program that finished agreed with
    the stream where they are compared (a mismatch raises SystemExit).
    """
    names = list(dict.fromkeys(args.cli_peers))
    if "pyflink" in names:
        missing = pyflink_missing(args.pyflink_python)
        if missing:
            print(f"PyFlink's peer is skipped: {missing}", flush=True)
            names.remove("pyflink")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tw-bench-cli-"))
    work.mkdir(parents=True, exist_ok=True)
    rules = lateness_rules(work / "rules.toml")
    results = [_compare_at(args, work, rules, n, names) for n in args.cli_orders]
    if "pyflink" in names:
        _print_pyflink(results, args.cli_timeout)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0
