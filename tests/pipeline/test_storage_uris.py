"""Inputs, outputs and checkpoints at URIs: Hadoop's ``viewfs://`` over a temporary directory.

Nothing here reaches the files but through Hadoop's ``FileSystem`` (Spark's
readers and writers, and :class:`tickwheel.pipeline.storage.HadoopStorage`),
as on ``hdfs://`` or ``s3a://``; the tests read the files under the mount's
local root to check them. The kill test at every fault point with the
checkpoint and output at such URIs is
``test_sources.py::test_kafka_like_topic_killed_at_every_fault_point``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import RULES_TOML, make_input, read_outputs
from stream_support import compare_with_reference, feed, write_rules

from support.reference import iter_input_lines, run_reference
from support.viewfs import FileWatch, ViewFs
from tickwheel.pipeline import start_stream
from tickwheel.pipeline.batch import resolve_inputs, run_job
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules, parse_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.storage import HadoopStorage, LocalStorage, is_uri, join
from tickwheel.pipeline.stream import file_log
from tickwheel.pipeline.stream.checkpoint import (
    HEARTBEAT_ENV,
    CheckpointInUse,
    CheckpointOwner,
    StreamError,
)
from tickwheel.pipeline.stream.file_input import InputFiles
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 240


@pytest.fixture
def viewfs(spark: Any, tmp_path: Path) -> ViewFs:
    """A mount table of its own over ``TMP/mnt``, in the session's Hadoop configuration."""
    (tmp_path / "mnt").mkdir()
    mount = ViewFs(tmp_path / "mnt")
    mount.configure(spark)
    return mount


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, to show that nothing is written there."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_uris_and_paths_are_told_apart() -> None:
    """A scheme makes a URI; a path stays local, made absolute; joins keep the scheme."""
    assert is_uri("viewfs://c/data") and is_uri("s3a://b/k") and is_uri("file:/tmp/x")
    assert not is_uri("out/ck") and not is_uri("/tmp/out")
    assert join("s3a://b/k/", "tickwheel", "state") == "s3a://b/k/tickwheel/state"
    assert join("ck", "tickwheel") == os.path.join("ck", "tickwheel")


def test_inputs_are_a_directory_a_file_or_a_glob(tmp_path: Path) -> None:
    """A directory gives its data files (not hidden ones nor Spark's markers), a file
    itself, a glob its matches; each with the bytes that size the run."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    for name, text in (("a.jsonl", "1\n"), ("sub/b.jsonl", "22\n"), (".c.jsonl", "x\n"),
                       ("_SUCCESS", ""), ("d.csv", "h\n")):  # fmt: skip
        (tmp_path / "in" / name).write_text(text)
    found = resolve_inputs(str(tmp_path / "in"), "json")
    assert found.paths == [
        str(tmp_path / "in" / "a.jsonl"),
        str(tmp_path / "in" / "sub" / "b.jsonl"),
    ]
    assert found.bytes == 5
    one = resolve_inputs(str(tmp_path / "in" / "a.jsonl"), "json")
    assert one.paths == [str(tmp_path / "in" / "a.jsonl")] and one.bytes == 2
    assert resolve_inputs(str(tmp_path / "in" / "*.csv"), "csv").paths == [
        str(tmp_path / "in" / "d.csv")
    ]
    with pytest.raises(FileNotFoundError, match="no json input files"):
        resolve_inputs(str(tmp_path / "missing"), "json")


def test_local_create_never_overwrites(tmp_path: Path) -> None:
    """A new file appears whole under its name, and a second create of the name fails."""
    storage = LocalStorage()
    path = str(tmp_path / "a" / "b.json")
    storage.create(path, b"first")
    with pytest.raises(FileExistsError):
        storage.create(path, b"second")
    assert storage.read_bytes(path) == b"first"
    assert storage.list_names(str(tmp_path / "a")) == ["b.json"]  # no temporary file left


def test_the_watch_sees_an_overwrite_and_a_directory_renamed(tmp_path: Path) -> None:
    """The proof's own check: a visible file replaced, or a directory renamed into
    sight, fails it; hidden temporary names do not."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"1")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "g").write_bytes(b"2")
    watch = FileWatch(tmp_path)
    watch.sample()
    os.rename(tmp_path / ".hidden", tmp_path / "shown")  # hidden into sight: allowed
    watch.sample()
    watch.check()
    os.rename(tmp_path / "a", tmp_path / "b")
    (tmp_path / "shown" / "g").write_bytes(b"22")
    watch.sample()
    assert watch.moved == {(os.path.join("a", "f"), os.path.join("b", "f"))}
    assert watch.overwritten == {os.path.join("shown", "g")}
    with pytest.raises(AssertionError, match="overwritten"):
        watch.check()


def test_hadoop_storage_at_a_uri(spark: Any, viewfs: ViewFs) -> None:
    """The same operations through Hadoop's FileSystem; what they do is seen on disk."""
    storage = HadoopStorage(spark)
    path = viewfs.uri("x", "1.json")
    storage.create(path, b'{"n": 1}')
    with pytest.raises(FileExistsError):
        storage.create(path, b'{"n": 2}')
    assert (viewfs.root / "x" / "1.json").read_bytes() == b'{"n": 1}'
    assert storage.read_bytes(path) == b'{"n": 1}' and storage.read_bytes(path, 3) == b'{"n'
    assert "1.json" in storage.list_names(viewfs.uri("x"))
    assert storage.list_names(viewfs.uri("missing")) == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(viewfs.uri("missing"))
    storage.delete(viewfs.uri("x"))
    assert not (viewfs.root / "x").exists()


def test_batch_driver_reads_and_writes_uris(
    spark: Any, viewfs: ViewFs, tmp_path: Path, empty_cwd: Path
) -> None:
    """``run_job`` with its input and output at URIs: the reference's rows, the summary
    beside them, and nothing in the working directory."""
    data = make_input(viewfs.root / "in", orders=300, seed=5, files=3)
    rules = parse_rules(tomllib.loads(RULES_TOML))
    inputs = resolve_inputs(viewfs.uri("in"), "json", HadoopStorage(spark))
    local = resolve_inputs(str(data), "json")
    assert [p.rsplit("/", 1)[1] for p in inputs.paths] == [Path(p).name for p in local.paths]
    assert all(p.startswith("viewfs://") for p in inputs.paths)
    assert inputs.bytes == local.bytes > 0
    summary = run_job(spark, rules, viewfs.uri("in"), viewfs.uri("out"), partitions=2)
    ref = run_reference(iter_input_lines(data), rules)
    got = read_outputs(viewfs.root / "out")
    for name in ("outcomes", "unmatched", "rejected", "buffered"):
        assert got[name] == getattr(ref, name), name
    written = json.loads((viewfs.root / "out" / "summary.json").read_text())
    assert written["output"] == viewfs.uri("out") == summary["output"]
    assert list(empty_cwd.iterdir()) == []


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """200 generated orders in 6 files, the rules and the reference."""
    base = tmp_path_factory.mktemp("uri-orders")
    generate_orders(200, base / "gen", seed=9, files=6)
    rules = write_rules(base / "rules.toml", lateness="15m")
    ref = run_reference(iter_input_lines(base / "gen"), load_rules(rules))
    return {"files": sorted((base / "gen").glob("part-*.jsonl")), "rules": rules, "ref": ref}


def _stream(spark: Any, viewfs: ViewFs, rules: Path) -> Any:
    records = spark.readStream.option("maxFilesPerTrigger", 2).text(viewfs.uri("in"))
    query = start_stream(records, rules, output=viewfs.uri("out"),
                         checkpoint=viewfs.uri("ck"), trigger="available-now",
                         partitions=2)  # fmt: skip
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    assert query.exception() is None, query.exception()
    return query


@pytest.mark.slow
def test_stream_at_uris_commits_by_new_files_only(
    spark: Any, viewfs: ViewFs, orders: dict[str, Any], empty_cwd: Path
) -> None:
    """``start_stream`` with its input, output and checkpoint at URIs: the reference's
    rows; no visible file overwritten or renamed; a rerun adds nothing; the
    working directory stays empty."""
    feed(orders["files"], viewfs.root / "in", 6)
    with FileWatch(viewfs.root) as watch:
        _stream(spark, viewfs, orders["rules"])
    watch.check()
    sink = ParquetSink(viewfs.uri("out"), spark)
    batches = sink.committed_batches()
    assert batches == [0, 1, 2]
    # Kept: what the last two commits are rebuilt from, batch 0's snapshot and the
    # changelogs of batches 1 and 2 (stream/resident.py).
    commits = (viewfs.root / "ck" / "tickwheel" / "commits").iterdir()
    assert sorted(p.name for p in commits if not p.name.startswith(".")) == [
        "0.json", "1.json", "2.json",
    ]  # fmt: skip
    assert sorted(p.name for p in (viewfs.root / "ck" / "tickwheel" / "state").iterdir()
                  if not p.name.startswith(".")) == ["0", "1", "2"]  # fmt: skip
    outs = read_stream_outputs(spark, sink, viewfs.uri("ck"))
    compare_with_reference(outs, orders["ref"])
    before = {t: sorted(map(tuple, df.collect())) for t, df in outs.items() if df is not None}
    with FileWatch(viewfs.root) as watch:  # the same input again: nothing new
        _stream(spark, viewfs, orders["rules"])
    watch.check()
    assert sink.committed_batches() == batches
    again = read_stream_outputs(spark, sink, viewfs.uri("ck"))
    assert {t: sorted(map(tuple, df.collect())) for t, df in again.items()
            if df is not None} == before  # fmt: skip
    assert list(empty_cwd.iterdir()) == []


def _stream_job(spark: Any, viewfs: ViewFs, rules: Path) -> dict[str, Any]:
    config = StreamConfig(
        rules_path=str(rules), input=viewfs.uri("in"), output=viewfs.uri("out"),
        checkpoint=viewfs.uri("ck"), max_files_per_trigger=2, partitions=2,
    )  # fmt: skip
    with FileStreamJob(config, spark=spark) as job:
        assert not job.files.ordered_source
        summary: dict[str, Any] = job.run()
    return summary


@pytest.mark.slow
def test_stream_job_at_uris(
    spark: Any, viewfs: ViewFs, orders: dict[str, Any], empty_cwd: Path
) -> None:
    """``pipeline stream``'s job with ``--input``, ``--output`` and ``--checkpoint`` at
    URIs takes Spark's file source: the reference's rows, a heartbeat marker read
    through Hadoop, no visible file overwritten or renamed, a rerun that adds
    nothing, and an empty working directory."""
    feed(orders["files"], viewfs.root / "in", 6)
    (viewfs.root / "in" / "zz.heartbeat").write_text("1")  # taken, before every event
    with FileWatch(viewfs.root) as watch:
        summary = _stream_job(spark, viewfs, orders["rules"])
    watch.check()
    assert summary["batches_run"] == 4  # 7 files, 2 per trigger
    last_plan = viewfs.root / "ck" / "tickwheel" / "plans" / "3.json"  # the newest file's
    assert viewfs.uri("in/zz.heartbeat") in json.loads(last_plan.read_text())["files"]
    sink = ParquetSink(viewfs.uri("out"), spark)
    outs = read_stream_outputs(spark, sink, viewfs.uri("ck"))
    compare_with_reference(outs, orders["ref"])  # the marker was read, not refused
    assert (viewfs.root / "ck" / "spark" / "sources" / "0").is_dir()  # Spark's source log
    assert not (viewfs.root / "ck" / "tickwheel" / "files.log").exists()
    with FileWatch(viewfs.root) as watch:
        again = _stream_job(spark, viewfs, orders["rules"])
    watch.check()
    assert again["batches_run"] == 0 and sink.committed_batches() == [0, 1, 2, 3]
    assert list(empty_cwd.iterdir()) == []


@pytest.mark.slow
def test_stream_job_with_a_local_input_and_a_uri_checkpoint(
    spark: Any,
    viewfs: ViewFs,
    orders: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A local ``--input`` with a URI checkpoint: Spark's file source names the files
    ``file:/...``, which the job reads as local paths: the reference's rows. Each
    micro-batch's files come from Spark's source log, read through the checkpoint's
    storage, and are the files its rows name, in the same order, a name with a space
    and a ``%`` included."""
    for made in feed(orders["files"], tmp_path / "local-in", 3):
        made.rename(made.with_name(f"{made.stem} 100%.jsonl"))  # its time is kept
    from_logs: list[list[str] | None] = []
    from_rows: list[list[str]] = []
    logged_files = file_log.spark_source_batch_files

    def spied(spark_checkpoint: str, batch_id: int, storage: Any) -> list[str] | None:
        from_logs.append(logged_files(spark_checkpoint, batch_id, storage))
        return from_logs[-1]

    def both_ways(files: InputFiles, files_df: Any, batch_id: int, store: Any) -> list[str]:
        rows = files_df.select("modificationTime", "path").collect()
        from_rows.append([path for _mtime, path in sorted((r[0], r[1]) for r in rows)])
        return taken(files, files_df, batch_id, store)

    taken = InputFiles._files
    monkeypatch.setattr(file_log, "spark_source_batch_files", spied)
    monkeypatch.setattr(InputFiles, "_files", both_ways)
    config = StreamConfig(
        rules_path=str(orders["rules"]), input=str(tmp_path / "local-in"),
        output=viewfs.uri("out"), checkpoint=viewfs.uri("ck"), partitions=2,
        max_files_per_trigger=1,
    )  # fmt: skip
    with FileStreamJob(config, spark=spark) as job:
        assert not job.files.ordered_source
        assert job.run()["batches_run"] == 3
    assert from_logs == from_rows and len(from_rows) == 3
    assert all(len(files) == 1 and files[0].endswith(" 100%.jsonl") for files in from_rows)
    assert all(files[0].startswith("file:/") for files in from_rows)
    sink = ParquetSink(viewfs.uri("out"), spark)
    compare_with_reference(read_stream_outputs(spark, sink, viewfs.uri("ck")), orders["ref"])


def test_stream_job_refuses_a_missing_uri_input(spark: Any, viewfs: ViewFs, tmp_path: Path) -> None:
    """An ``--input`` URI that names nothing is refused, naming it, before a batch runs."""
    rules = write_rules(tmp_path / "rules.toml")
    config = StreamConfig(
        rules_path=str(rules), input=viewfs.uri("nothing"), output=viewfs.uri("out"),
        checkpoint=viewfs.uri("ck"),
    )  # fmt: skip
    with (
        FileStreamJob(config, spark=spark) as job,
        pytest.raises(StreamError, match="nothing: not found"),
    ):
        job.run()
    assert not (viewfs.root / "out").exists()


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return int(proc.stdout)


def test_uri_checkpoint_owners_refuse_a_second_job_and_fence_a_stale_one(
    spark: Any, viewfs: ViewFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``fcntl``: a live owner refuses a second job; a dead one on this host is
    taken over at once; one on another host once its heartbeat stops; and the job
    that lost its checkpoint stops at its next commit."""
    monkeypatch.setenv(HEARTBEAT_ENV, "0.2")
    storage = HadoopStorage(spark)
    root = viewfs.uri("ck", "tickwheel")
    first = CheckpointOwner(root, storage)
    first.acquire()
    with pytest.raises(CheckpointInUse, match="in use by job pid"):
        CheckpointOwner(root, storage).acquire()
    first.check()
    first.release()  # a clean end: the next job needs no wait

    second = CheckpointOwner(root, storage)
    second.acquire()
    assert second.token == 2
    # a job on another host took over, as after deciding that this one was gone
    owners = viewfs.root / "ck" / "tickwheel" / "owners"
    (owners / "3.json").write_text(json.dumps({"token": 3, "pid": _dead_pid(),
                                               "host": "elsewhere"}))  # fmt: skip
    with pytest.raises(StreamError, match="was taken over by token 3 on host elsewhere"):
        second.check()
    second.release()

    # owner 3's host is elsewhere and it never beats: taken over after three beats
    third = CheckpointOwner(root, storage)
    third.acquire()
    assert third.token == 4
    third.release()

    # owner 5 elsewhere keeps beating: refused
    (owners / "5.json").write_text(json.dumps({"token": 5, "pid": 1, "host": "elsewhere"}))
    stop = threading.Event()

    def beat() -> None:
        n = 0
        while not stop.wait(0.1):
            n += 1
            (owners / f"5.alive-{n}").write_bytes(b"")

    beating = threading.Thread(target=beat, daemon=True)
    beating.start()
    try:
        with pytest.raises(CheckpointInUse, match="on elsewhere"):
            CheckpointOwner(root, storage).acquire()
    finally:
        stop.set()
        beating.join(timeout=10)
    # owner 6 on this host, dead: taken over at once
    (owners / "6.json").write_text(json.dumps({"token": 6, "pid": _dead_pid(),
                                               "host": socket.gethostname()}))  # fmt: skip
    fourth = CheckpointOwner(root, storage)
    fourth.acquire()
    assert fourth.token == 7
    fourth.release()
