"""A restart after a crash against a clean restart, from the command line, N operations pending.

For each N of ``--pending``, the input of ``bench_stream_steady.py``: a load
of N ``created`` events (all left pending: 30-day timeout), then files of
``--records`` records (three in four new orders, one in four payments of
pending ones), one file per micro-batch. With a snapshot every 10 commits
(the default), micro-batch 0 (the load) commits a snapshot and micro-batches
1..9 commit changelogs. Then, in two checkpoints:

- **crash**: ``tickwheel pipeline stream --trigger interval=1s`` runs the
  load and 9 files; once batch 9 is committed, the process group is killed
  (SIGKILL), so no snapshot is written at the end;
- **clean**: ``--trigger available-now`` over the same 10 files, to its end,
  where the job writes the state whole beside its last changelog.

One more file is added to each input, and the stream is started again
(``--trigger available-now``). Reported for each: the seconds from the
start of that process to the commit of batch 10 (its commit file's
modification time), and the micro-batch's own seconds from its progress
line; then crash / clean. The state after batch 10 is checked equal in the
two checkpoints (the pending count from ``tickwheel pipeline status``).

Run: ``.venv/bin/python benchmarks/bench_crash_restart.py --pending 1e5 1e6``.
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
from dataclasses import dataclass
from pathlib import Path

from _cli_comparison import _tickwheel_command
from bench_stream_steady import BATCH_LINE, steady_rules, write_workload

#: Files the first run reads: the load and 9 steady files (9 changelogs after the snapshot).
FIRST_FILES = 10


@dataclass
class Restart:
    """One restart: seconds from its start to batch 10's commit, and that batch's own."""

    to_commit: float
    batch: float | None


def _commit_file(checkpoint: Path, batch_id: int) -> Path | None:
    """The file that committed ``batch_id`` in tickwheel's log, if any (fences left out)."""
    commits = checkpoint / "tickwheel" / "commits"
    for path in sorted(commits.glob(f"{batch_id}.*json")) if commits.is_dir() else ():
        if not json.loads(path.read_text(encoding="utf-8")).get("fence"):
            return path
    return None


def _stream(rules: Path, inp: Path, work: Path, trigger: str) -> list[str]:
    return [*_tickwheel_command(), "pipeline", "stream", "--rules", str(rules),
            "--input", str(inp), "--output", str(work / "out"),
            "--checkpoint", str(work / "ck"), "--max-files-per-trigger", "1",
            "--trigger", trigger]  # fmt: skip


def _run_to_crash(command: list[str], checkpoint: Path, timeout_s: float) -> None:
    """Run ``command`` until batch 9 is committed, then kill its process group."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        while _commit_file(checkpoint, FIRST_FILES - 1) is None:
            if process.poll() is not None:
                raise SystemExit(f"the stream exited ({process.returncode}) before batch 9")
            if time.monotonic() > deadline:
                raise SystemExit(f"batch 9 not committed within {timeout_s:.0f} s")
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def _run(command: list[str], timeout_s: float) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:3])} failed: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def _restart(command: list[str], checkpoint: Path, timeout_s: float) -> Restart:
    started = time.time()
    out = _run(command, timeout_s)
    commit = _commit_file(checkpoint, FIRST_FILES)
    if commit is None:
        raise SystemExit("the restart committed no batch 10")
    found = (BATCH_LINE.search(line) for line in out.splitlines())
    seconds = [float(m.group(2)) for m in found if m is not None and m.group(1) == "10"]
    return Restart(commit.stat().st_mtime - started, seconds[0] if seconds else None)


def _pending(checkpoint: Path) -> int:
    status = [*_tickwheel_command(), "pipeline", "status", "--checkpoint", str(checkpoint),
              "--json"]  # fmt: skip
    return int(json.loads(_run(status, 300))["pending"]["total"])


def measure(n: int, records: int, work: Path, timeout_s: float) -> tuple[Restart, Restart]:
    """(crash restart, clean restart) at ``n`` pending."""
    rules = steady_rules(work / "rules.toml")
    workload = write_workload(work / "all", n, FIRST_FILES, records)
    files = sorted(workload.input.glob("part-*.jsonl"))
    results = {}
    for kind in ("crash", "clean"):
        run = work / kind
        inp = run / "in"
        inp.mkdir(parents=True)
        for path in files[:FIRST_FILES]:
            shutil.copy2(path, inp / path.name)
        if kind == "crash":
            _run_to_crash(_stream(rules, inp, run, "interval=1s"), run / "ck", timeout_s)
        else:
            _run(_stream(rules, inp, run, "available-now"), timeout_s)
        shutil.copy2(files[FIRST_FILES], inp / files[FIRST_FILES].name)
        results[kind] = _restart(_stream(rules, inp, run, "available-now"), run / "ck", timeout_s)
    crash, clean = _pending(work / "crash" / "ck"), _pending(work / "clean" / "ck")
    if crash != clean:
        raise SystemExit(f"pending after the restarts differ: crash {crash}, clean {clean}")
    return results["crash"], results["clean"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", nargs="+", type=float, default=[1e5, 1e6])
    parser.add_argument("--records", type=int, default=1_000)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take")
    args = parser.parse_args(argv)
    print(f"{'pending':>10} {'crash: to commit s':>19} {'(its batch s)':>14} "
          f"{'clean: to commit s':>19} {'(its batch s)':>14} {'crash / clean':>14}")  # fmt: skip
    for n in (int(p) for p in args.pending):
        with tempfile.TemporaryDirectory(prefix="tw-restart-") as tmp:
            crash, clean = measure(n, args.records, Path(tmp), args.timeout)

        def cell(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        print(f"{n:>10,} {crash.to_commit:>19.1f} {cell(crash.batch):>14} "
              f"{clean.to_commit:>19.1f} {cell(clean.batch):>14} "
              f"{crash.to_commit / clean.to_commit:>13.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
