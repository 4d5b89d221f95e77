"""``tickwheel pipeline status``: what a stream checkpoint holds, read without writing.

The figures of a finished checkpoint are checked against the reference (the
pending operations per rule, the watermark, the buffered events) and against
the checkpoint's own files read independently (Spark, the file system); a job
that holds the checkpoint shows as its owner, and stops showing once it lets
go; the same figures come through Spark for a URI, and out of the command line
as JSON; a path that is not a checkpoint is named in one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from stream_support import feed, fresh, subprocess_env, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel._cli import main
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.stream.checkpoint import CheckpointInUse, StreamError
from tickwheel.pipeline.stream.resident import format_bytes
from tickwheel.pipeline.stream.status import checkpoint_status
from tickwheel.pipeline.stream.status_report import render_status

#: Every figure that does not depend on the time it is read at, or on who reads it.
STEADY = (
    "last_batch",
    "committed_batches",
    "committed_at_ms",
    "running_batch",
    "watermark",
    "max_time",
    "rules",
    "format",
    "tickwheel",
    "pending",
    "markers",
    "events",
    "state",
    "files",
)

CLI_TIMEOUT_S = 120


def _config(base: Path, rules: Path, **kw: Any) -> Any:
    from tickwheel.pipeline.stream.file_job import StreamConfig

    kw.setdefault("input", str(base / "in"))
    return StreamConfig(
        rules_path=str(rules),
        output=str(base / "out"),
        checkpoint=str(base / "ck"),
        **kw,
    )


@pytest.fixture(scope="module")
def finished(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A checkpoint after three micro-batches (one file each) of 150 orders, the job gone."""
    from tickwheel.pipeline.stream.file_job import FileStreamJob

    base = tmp_path_factory.mktemp("status")
    gen = base / "gen"
    generate_orders(150, gen, seed=7, files=3, mean_gap_ms=60_000)  # 2.5 h: some pending
    rules = write_rules(base / "rules.toml")
    feed(sorted(gen.glob("part-*.jsonl")), fresh(base / "in"), 3)
    config = _config(base, rules, trigger="available-now", max_files_per_trigger=1)
    with FileStreamJob(config, spark=spark) as job:
        summary = job.run()
    assert summary["batches_run"] == 3
    ref = run_reference(iter_input_lines(gen), load_rules(rules))
    return {"base": base, "ck": base / "ck", "in": base / "in", "rules": rules, "ref": ref}


def _last_commit(ck: Path) -> dict[str, Any]:
    commits = sorted((ck / "tickwheel" / "commits").glob("*.json"),
                     key=lambda p: [int(n) for n in p.stem.split(".")])  # fmt: skip
    metas = [json.loads(p.read_text()) for p in commits]
    meta: dict[str, Any] = [m for m in metas if not m.get("fence")][-1]
    return meta


def _tree_bytes(directory: Path) -> tuple[int, int]:
    files = [p for p in directory.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


@pytest.mark.spark
def test_status_of_a_finished_checkpoint(spark: Any, finished: dict[str, Any]) -> None:
    """Every figure, against the reference and the checkpoint's files read independently."""
    from pyspark.sql import functions as F

    ck, ref = finished["ck"], finished["ref"]
    meta = _last_commit(ck)
    now = int(time.time() * 1000)
    status = checkpoint_status(str(ck), input=str(finished["in"]), now_ms=now)
    json.dumps(status)  # plain JSON values only

    assert status["checkpoint"] == str(ck)
    assert status["last_batch"] == 2 == meta["batch_id"]
    assert status["running_batch"] is None
    assert status["watermark"] == ref.watermark == meta["watermark"]
    assert status["watermark_lag_ms"] == now - ref.watermark
    # The keys a commit records from this release on, None in older checkpoints.
    for key in ("committed_at_ms", "rules", "format", "tickwheel"):
        assert status[key] == meta.get(key)
    if "committed_at_ms" in meta:
        assert status["commit_age_ms"] == now - meta["committed_at_ms"] >= 0
    if "format" in meta:  # recorded from this release on: shown
        assert f"state format {meta['format']}, written by tickwheel " in render_status(status)

    # Pending operations per rule: the reference's ``pending`` outcomes.
    expected: dict[str, dict[str, Any]] = {}
    for rule, _key, _op, _opened, deadline, outcome, *_ in ref.outcomes:
        if outcome == "pending":
            entry = expected.setdefault(rule, {"count": 0, "oldest_deadline": deadline})
            entry["count"] += 1
            entry["oldest_deadline"] = min(entry["oldest_deadline"], deadline)
    assert expected, "the data leaves operations pending"
    assert status["pending"]["by_rule"] == expected
    assert status["pending"]["total"] == sum(e["count"] for e in expected.values())

    # The state's rows, read by Spark: pending, expiry markers, events, buffered.
    state = ck / "tickwheel" / "state" / "2" / _last_commit(ck)["attempt"]
    kinds = Counter(
        r["kind"] for r in spark.read.parquet(str(state / "ops")).select("kind").collect()
    )
    assert kinds["pending"] == status["pending"]["total"]
    assert sum(n for k, n in kinds.items() if k != "pending") == status["markers"]
    events = spark.read.parquet(str(state / "events"))
    buffered = events.where(F.col("time") > ref.watermark).count()
    assert status["events"] == {"rows": events.count(), "buffered": buffered}
    assert buffered == len({(b[2], b[4]) for b in ref.buffered})
    assert status["state"]["rows"] == meta["state_rows"]
    assert meta["state_rows"] == sum(kinds.values()) + status["events"]["rows"]
    size, count = _tree_bytes(state)
    assert status["state"] == {**status["state"], "path": str(state), "bytes": size, "files": count}
    # Who held the state, and the driver's memory it took there, measured.
    assert status["state"]["provider"] == meta["state_provider"] == "driver"
    assert status["state"]["memory_bytes"] == meta["state_bytes"] > 0
    held = f"  state held by   the driver, {format_bytes(meta['state_bytes'])} of its memory\n"
    assert held in render_status(status)

    files = status["files"]
    assert files["source"] == "tickwheel" and files["taken"] == 3
    assert files["waiting"] == 0 and files["next_waiting"] == []

    owner = status["owner"]
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert owner["holding"] is False and owner["how"] == "LOCK is free"

    text = render_status(status)
    assert f"checkpoint {ck}\n" in text and "  last batch      2, " in text
    assert f"pending         {status['pending']['total']} operation(s)" in text
    assert "payment" in text and "oldest deadline" in text
    assert "  files           3 taken (tickwheel's file log)\n" in text
    assert f"  waiting         0 file(s) (0 B) in {finished['in']}\n" in text
    assert "not holding it (LOCK is free)" in text


@pytest.mark.spark
def test_a_new_file_is_waiting(finished: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A file in the input that the source has not taken counts as waiting, named."""
    ck, inp = finished["ck"], finished["in"]
    new = inp / "inc-9999.jsonl"
    new.write_text('{"event_id": "x"}\n', encoding="utf-8")
    (inp / ".hidden.jsonl").write_text("{}\n", encoding="utf-8")  # not data, as Spark says
    try:
        files = checkpoint_status(str(ck), input=str(inp))["files"]
        assert files["taken"] == 3 and files["waiting"] == 1
        assert files["waiting_bytes"] == new.stat().st_size
        assert files["next_waiting"] == [str(new)]
        if "input" in _last_commit(ck):  # the input the job recorded, without --input
            assert checkpoint_status(str(ck))["files"]["waiting"] == 1
        with monkeypatch.context() as patch:  # --input as given: relative to the cwd
            patch.chdir(inp)
            assert checkpoint_status(str(ck), input=".")["files"]["waiting"] == 1
    finally:
        new.unlink()
        (inp / ".hidden.jsonl").unlink()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tickwheel", "pipeline", "status", *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_status_into_a_pipe_closed_early_ends_quietly() -> None:
    """``tickwheel pipeline status | head``: a reader gone before the output ends the
    command with 141 (128 + SIGPIPE) and no traceback. The pipe is closed before the
    command writes, so its first write fails every time."""
    fixture = Path(__file__).parent / "fixtures" / "checkpoint-format-2" / "ck"
    args = [sys.executable, "-m", "tickwheel", "pipeline", "status", "--checkpoint", str(fixture)]
    proc = subprocess.Popen(args, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    # The same through a shell's pipe: head takes the first line, nothing else is said.
    shell = subprocess.run(
        ["sh", "-c", '"$@" | head -1', "sh", *args], env=subprocess_env(),
        capture_output=True, timeout=CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert shell.stdout.decode().startswith("checkpoint "), shell.stdout
    assert shell.stderr == b"", shell.stderr.decode()


@pytest.mark.spark
def test_status_of_a_live_checkpoint(finished: dict[str, Any]) -> None:
    """A job holding the checkpoint shows as its owner, here and from another process;
    looking does not take the lock from it; once it lets go, it no longer holds it."""
    from tickwheel.pipeline.stream.file_job import FileStreamJob

    ck = finished["ck"]
    before = checkpoint_status(str(ck))["owner"]["token"]
    config = _config(finished["base"], finished["rules"])
    job = FileStreamJob(config)  # takes the checkpoint
    try:
        owner = checkpoint_status(str(ck))["owner"]
        assert owner["token"] == before + 1
        assert owner["holding"] is True and owner["pid"] == os.getpid()
        assert owner["how"] == "a process holds the flock on LOCK"
        out = _cli("--checkpoint", str(ck), "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["owner"]["holding"] is True
        with pytest.raises(CheckpointInUse):  # still the job's
            FileStreamJob(config)
        text = _cli("--checkpoint", str(ck)).stdout
        assert f"pid {os.getpid()} on {socket.gethostname()}" in text
        assert "HOLDS the checkpoint" in text
    finally:
        job.close()
    owner = checkpoint_status(str(ck))["owner"]
    assert owner["token"] == before + 1 and owner["holding"] is False


def _wait_for(ck: Path, done: Any, timeout_s: float) -> dict[str, Any]:
    """The checkpoint's status once ``done(status)``; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = checkpoint_status(str(ck))
        if done(status):
            return status
        assert time.monotonic() < deadline, f"not reached in {timeout_s}s: {status}"
        time.sleep(0.5)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_status_of_a_running_query(spark: Any, tmp_path: Path) -> None:
    """A query of ``start_stream`` (Spark's text source, a trigger interval) holds its
    checkpoint while it runs, and lets go when it stops (Spark's listener event)."""
    from tickwheel.pipeline import start_stream

    gen = tmp_path / "gen"
    generate_orders(40, gen, seed=5, files=1, mean_gap_ms=60_000)
    rules = write_rules(tmp_path / "rules.toml")
    inp, ck = fresh(tmp_path / "in"), tmp_path / "ck"
    feed(sorted(gen.glob("part-*.jsonl")), inp, 1)
    records = spark.readStream.text(str(inp))
    query = start_stream(records, rules, output=str(tmp_path / "out"), checkpoint=str(ck),
                         trigger="interval=1s")  # fmt: skip
    try:
        status = _wait_for(ck, lambda s: s["last_batch"] == 0, 120)
        owner = status["owner"]
        assert owner["holding"] is True and owner["pid"] == os.getpid()
        assert status["files"]["source"] == "spark" and status["files"]["taken"] == 1
        assert checkpoint_status(str(ck), input=str(inp))["files"]["waiting"] == 0
    finally:
        query.stop()
    assert _wait_for(ck, lambda s: not s["owner"]["holding"], 60)["owner"]["how"] == "LOCK is free"


@pytest.mark.spark
def test_the_command_prints_the_figures_as_json(finished: dict[str, Any]) -> None:
    """``--json`` prints the dict the library returns; without it, a report."""
    ck, inp = str(finished["ck"]), str(finished["in"])
    out = _cli("--checkpoint", ck, "--input", inp, "--json")
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    expected = checkpoint_status(ck, input=inp)
    assert {k: printed[k] for k in STEADY} == {k: expected[k] for k in STEADY}
    assert printed["owner"]["holding"] is False
    text = _cli("--checkpoint", ck, "--input", inp)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"checkpoint {ck}\n")
    for label in ("last batch", "watermark", "rules", "pending", "events carried", "state",
                  "files", "waiting", "owner"):  # fmt: skip
        assert f"\n  {label} " in text.stdout


@pytest.mark.spark
def test_status_at_a_uri_reads_through_spark(
    spark: Any, finished: dict[str, Any], tmp_path: Path
) -> None:
    """A ``file:`` URI checkpoint (Hadoop's file system, Parquet through Spark) gives the
    local figures; its owner is decided as on any URI: its process, then ``T.released``."""
    from tickwheel.pipeline.storage import HadoopStorage, join
    from tickwheel.pipeline.stream.checkpoint import CheckpointOwner

    copy = tmp_path / "ck"
    shutil.copytree(finished["ck"], copy)
    shutil.rmtree(copy / "tickwheel" / "owners")  # the copy's owner would be this process
    inp = str(finished["in"])
    local = checkpoint_status(str(copy), input=inp)
    status = checkpoint_status(copy.as_uri(), spark=spark, input=inp)
    assert status["checkpoint"] == copy.as_uri()
    assert {k: status[k] for k in STEADY if k != "state"} == {
        k: local[k] for k in STEADY if k != "state"
    }
    assert {**status["state"], "path": None} == {**local["state"], "path": None}
    assert status["owner"] is None

    root = join(copy.as_uri(), "tickwheel")
    owner = CheckpointOwner(root, HadoopStorage(spark))
    owner.acquire()
    try:
        held = checkpoint_status(copy.as_uri(), spark=spark)["owner"]
        assert held["holding"] is True and held["pid"] == os.getpid()
        assert held["how"] == f"process {os.getpid()} on this host is running"
    finally:
        owner.release()
    gone = checkpoint_status(copy.as_uri(), spark=spark)["owner"]
    assert gone["holding"] is False and gone["how"] == "released"


@pytest.mark.spark
def test_files_taken_by_sparks_own_file_source(spark: Any, tmp_path: Path) -> None:
    """With the input at a URI the job takes Spark's file source, whose log
    (``CK/spark/sources/0``) gives the files taken."""
    from tickwheel.pipeline.stream.file_job import FileStreamJob

    gen = tmp_path / "gen"
    generate_orders(40, gen, seed=3, files=2)
    rules = write_rules(tmp_path / "rules.toml")
    feed(sorted(gen.glob("part-*.jsonl")), fresh(tmp_path / "in"), 2)
    uri = (tmp_path / "in").as_uri()
    with FileStreamJob(_config(tmp_path, rules, input=uri), spark=spark) as job:
        assert not job.files.ordered_source
        job.run()
    status = checkpoint_status(str(tmp_path / "ck"), spark=spark, input=uri)
    assert status["files"]["source"] == "spark" and status["files"]["taken"] == 2
    assert status["files"]["waiting"] == 0
    new = tmp_path / "in" / "late.jsonl"
    new.write_text("{}\n", encoding="utf-8")
    files = checkpoint_status(str(tmp_path / "ck"), spark=spark, input=uri)["files"]
    assert files["waiting"] == 1 and files["next_waiting"][0].endswith("/late.jsonl")


# -- without Spark ------------------------------------------------------------------


def test_a_path_that_is_not_a_checkpoint_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing path, a directory that is no checkpoint, an unreadable commit: one
    clear error naming the path; the command exits 2 with one line, no traceback."""
    missing = tmp_path / "nope"
    with pytest.raises(StreamError, match=re.escape(f"checkpoint {missing}: not found")):
        checkpoint_status(str(missing))
    with pytest.raises(StreamError, match="not a tickwheel stream checkpoint"):
        checkpoint_status(str(tmp_path))
    broken = tmp_path / "broken"
    (broken / "tickwheel" / "commits").mkdir(parents=True)
    (broken / "tickwheel" / "commits" / "0.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(StreamError, match=re.escape(f"checkpoint {broken}: the commit of batch 0")):
        checkpoint_status(str(broken))
    for path, words in ((missing, "not found"), (tmp_path, "not a tickwheel")):
        assert main(["pipeline", "status", "--checkpoint", str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
        assert captured.err.startswith(f"tickwheel pipeline status: error: checkpoint {path}")
        assert words in captured.err
    out = _cli("--checkpoint", str(missing), "--json")
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr


def _write_ops(directory: Path, rows: list[tuple[str, str, str, str, int, int]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    columns = list(zip(*rows, strict=True)) if rows else [[]] * 6
    names = ["kind", "rule", "key", "event_id", "time", "deadline"]
    types = [pa.string()] * 4 + [pa.int64()] * 2
    table = pa.table({n: pa.array(c, t) for n, c, t in zip(names, columns, types, strict=True)})
    pq.write_table(table, directory / "part-00000-a.parquet")


def test_an_older_checkpoint_without_the_recorded_keys(tmp_path: Path) -> None:
    """A commit without ``committed_at_ms``, ``rules``, ``format``, ``tickwheel`` or
    ``input`` (older releases): those figures are None, the report says so."""
    pytest.importorskip("pyarrow")
    root = tmp_path / "ck" / "tickwheel"
    (root / "commits").mkdir(parents=True)
    meta = {"batch_id": 4, "watermark": 1_000_000, "max_time": 1_000_500, "state_rows": 3}
    (root / "commits" / "4.json").write_text(json.dumps(meta), encoding="utf-8")
    _write_ops(root / "state" / "4" / "ops", [
        ("pending", "pay", "k1", "e1", 999_000, 1_002_000),
        ("pending", "pay", "k2", "e2", 999_500, 1_001_000),
        ("expired", "ship", "k3", "e3", 900_000, 950_000),
    ])  # fmt: skip
    status = checkpoint_status(str(tmp_path / "ck"), now_ms=1_060_000)
    assert status["last_batch"] == 4 and status["committed_batches"] == [4]
    for key in ("committed_at_ms", "commit_age_ms", "rules", "format", "tickwheel"):
        assert status[key] is None
    assert status["watermark_lag_ms"] == 60_000
    assert status["pending"] == {
        "total": 2,
        "by_rule": {"pay": {"count": 2, "oldest_deadline": 1_001_000}},
    }
    assert status["markers"] == 1 and status["events"] == {"rows": 0, "buffered": 0}
    assert status["files"] == {
        "source": None, "taken": None, "input": None, "waiting": None,
        "waiting_bytes": None, "next_waiting": [],
    }  # fmt: skip
    assert status["owner"] is None
    text = render_status(status)
    assert "last batch      4, commit time not recorded" in text
    assert "1.0m behind now" in text
    assert "rules           not recorded" in text
    assert "files           unknown (no file log in the checkpoint)\n" in text
    assert "waiting         unknown (no input recorded: give --input)\n" in text
    assert "owner           none recorded" in text
    # Named by its tickwheel/ directory, the same checkpoint.
    assert checkpoint_status(str(root), now_ms=1_060_000) == status


def test_sparks_file_source_log_is_read_with_its_compactions(tmp_path: Path) -> None:
    """``sources/0``: batch files of JSON lines after a version line, and every tenth
    batch a ``.compact`` file holding all entries so far; another source's log (Kafka's
    offsets) leaves the files unknown."""
    pytest.importorskip("pyarrow")
    ck = tmp_path / "ck"
    (ck / "tickwheel" / "commits").mkdir(parents=True)
    log = ck / "spark" / "sources" / "0"
    log.mkdir(parents=True)

    def entry(name: str, batch: int) -> str:
        return json.dumps({"path": f"file:///data/in/{name}", "timestamp": 1, "batchId": batch})

    (log / "8").write_text("v1\n" + entry("old.jsonl", 8) + "\n", encoding="utf-8")
    compact = [entry(f"f{i}.jsonl", i) for i in range(10)]
    (log / "9.compact").write_text("v1\n" + "\n".join(compact), encoding="utf-8")
    (log / "10").write_text("v1\n" + entry("f10.jsonl", 10), encoding="utf-8")
    (log / ".10.crc").write_bytes(b"\0")
    files = checkpoint_status(str(ck), input=str(tmp_path / "absent"))["files"]
    assert files["source"] == "spark" and files["taken"] == 11
    assert files["waiting"] is None  # the input is not there to list
    # A relative input recorded by a job names a directory relative to where it ran.
    commit = {"batch_id": 0, "watermark": 5, "input": "in"}
    (ck / "tickwheel" / "commits" / "0.json").write_text(json.dumps(commit), encoding="utf-8")
    status = checkpoint_status(str(ck))
    assert status["files"]["input"] == "in" and status["files"]["waiting"] is None
    assert "unknown (the input recorded, in, is relative: give --input)" in render_status(status)

    for name in ("8", "9.compact", "10", ".10.crc"):
        (log / name).unlink()
    (log / "0").write_text('v1\n{"topic":{"0":42}}\n', encoding="utf-8")
    files = checkpoint_status(str(ck))["files"]
    assert files["source"] is None and files["taken"] is None
