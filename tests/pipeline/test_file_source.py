"""The stream's file source: its order, its log, and the abnormal-batch warnings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

from tickwheel.pipeline.stream.file_source import (
    FileLog,
    FilesPartition,
    OrderedFileReader,
    list_new_files,
    logged_batch_files,
)
from tickwheel.pipeline.stream.micro_batch import abnormal_batch_warnings


def _touch(path: Path, mtime: int, data: bytes = b"x\n") -> Path:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def test_files_are_listed_by_mtime_then_name(tmp_path: Path) -> None:
    for name in ("h.jsonl", "b.jsonl", "f.jsonl", "a.jsonl"):
        _touch(tmp_path / name, 1000)  # copied together: one mtime
    _touch(tmp_path / "0-newest.jsonl", 2000)
    _touch(tmp_path / "z-oldest.jsonl", 500)
    _touch(tmp_path / ".hidden", 100)
    _touch(tmp_path / "_SUCCESS", 100)
    (tmp_path / "sub").mkdir()
    names = [os.path.basename(p) for p in list_new_files(str(tmp_path), set())]
    assert names == ["z-oldest.jsonl", "a.jsonl", "b.jsonl", "f.jsonl", "h.jsonl",
                     "0-newest.jsonl"]  # fmt: skip
    seen = {str(tmp_path / "a.jsonl"), str(tmp_path / "z-oldest.jsonl")}
    assert [os.path.basename(p) for p in list_new_files(str(tmp_path), seen)][:1] == ["b.jsonl"]


def test_the_log_keeps_its_order_and_survives_a_torn_append(tmp_path: Path) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    for i, name in enumerate(("c", "a", "b")):
        _touch(inp / name, 1000 + (i // 2))  # c and a share an mtime; b is newer
    log = FileLog(str(tmp_path / "ck" / "files.log"))
    assert log.take_new(str(inp)) == 3
    assert [os.path.basename(p) for p in log.paths] == ["a", "c", "b"]
    _touch(inp / "0-late-copy", 1)  # appears later, with an older mtime: goes last
    assert log.take_new(str(inp)) == 1 and log.take_new(str(inp)) == 0
    with open(log.path, "ab") as fh:
        fh.write(b'{"path": "/torn')  # a crash mid-append
    again = FileLog(log.path)
    assert again.paths == log.paths
    assert Path(log.path).read_bytes().endswith(b"\n")


def test_a_reader_beside_the_source_reads_whole_appends_and_repairs_nothing(
    tmp_path: Path,
) -> None:
    """repair=False: a partial last line is an append in progress, left in place
    and read by a later refresh once whole; entries appended later are read too."""
    inp = tmp_path / "in"
    inp.mkdir()
    _touch(inp / "a", 1000)
    source = FileLog(str(tmp_path / "files.log"))
    source.take_new(str(inp))
    with open(source.path, "ab") as fh:
        fh.write(b'{"path": "/in/b"')  # the source is mid-append
    reader = FileLog(source.path, repair=False)
    assert [os.path.basename(p) for p in reader.paths] == ["a"]
    assert Path(source.path).read_bytes().endswith(b'"/in/b"')  # not cut off
    with open(source.path, "ab") as fh:
        fh.write(b"}\n")
    assert reader.refresh() == 1 and reader.paths[-1] == "/in/b"
    assert reader.refresh() == 0 and len(reader) == 2


def _log_offsets(spark_checkpoint: Path, *taken: int) -> None:
    """Spark's offset log as the streaming engine writes it, one batch per value."""
    (spark_checkpoint / "offsets").mkdir(parents=True)
    for batch_id, n in enumerate(taken):
        (spark_checkpoint / "offsets" / str(batch_id)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n' + f'{{"taken": {n}}}'
        )


def test_a_batchs_files_come_from_sparks_offsets_and_the_file_log(tmp_path: Path) -> None:
    """Batch N takes the log's entries from batch N-1's offset to its own; any
    offset the source did not write, or a log shorter than the offsets, gives
    None (the caller reads the rows instead)."""
    log = FileLog(str(tmp_path / "files.log"))
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(5):
        _touch(inp / f"f{i}", 1000 + i)
    log.take_new(str(inp))
    spark_ck = tmp_path / "spark"
    _log_offsets(spark_ck, 2, 2, 5)
    reader = FileLog(log.path, repair=False)
    names = [
        [os.path.basename(p) for p in files]
        for files in (logged_batch_files(str(spark_ck), reader, b) for b in range(3))
        if files is not None
    ]
    assert names == [["f0", "f1"], [], ["f2", "f3", "f4"]]
    assert logged_batch_files(str(spark_ck), reader, 3) is None  # not logged yet
    offsets = spark_ck / "offsets"
    for bad in ("v2\n{}\n{\"taken\": 7}", "v1\n{}\n{\"other\": 1}", "v1\n{}\n-",
                "v1\n{}\n{\"taken\": 9}", "v1\n{}\n{\"taken\": 1}", "v1\n{}"):  # fmt: skip
        (offsets / "3").write_text(bad)  # unknown, not ours, past the log, before the start
        assert logged_batch_files(str(spark_ck), reader, 3) is None, bad
    (offsets / "3").write_text('v1\n{}\n{"taken": 6}')
    _touch(inp / "f5", 2000)
    log.take_new(str(inp))  # appended after the reader loaded the log
    assert [os.path.basename(p) for p in logged_batch_files(str(spark_ck), reader, 3) or []] == [
        "f5"
    ]


def test_offsets_respect_the_read_limit_and_available_now(tmp_path: Path) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(5):
        _touch(inp / f"f{i}", 1000 + i)
    options = {"path": str(inp), "log": str(tmp_path / "files.log"), "maxFilesPerTrigger": "2"}
    reader = OrderedFileReader(options)
    assert reader.getDefaultReadLimit() == ReadMaxFiles(2)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxFiles(2))
    assert end == {"taken": 2}
    (part,) = reader.partitions(start, end)
    assert isinstance(part, FilesPartition)
    assert [os.path.basename(p) for p in part.paths] == ["f0", "f1"]
    os.remove(part.paths[1])  # removed after it was listed: read as length None
    assert [length for _path, length in reader.read(part)] == [2, None]
    assert reader.latestOffset(end, ReadAllAvailable()) == {"taken": 5}
    assert reader.partitions(end, end) == []
    # available-now: the files present when the run starts, no later ones
    later = OrderedFileReader(options)
    later.prepareForTriggerAvailableNow()
    _touch(inp / "f9", 2000)
    assert later.latestOffset({"taken": 4}, ReadMaxFiles(2)) == {"taken": 5}
    assert later.latestOffset({"taken": 5}, ReadMaxFiles(2)) == {"taken": 5}


def test_abnormal_batch_warnings() -> None:
    half = 1_800_000
    quiet = abnormal_batch_warnings(
        arrived=10, late=5, previous_max_time=1000, watermark=1000 + half, longest_timeout_ms=half
    )
    assert quiet == []  # half late is not most; a jump of exactly the timeout is allowed
    loud = abnormal_batch_warnings(
        arrived=10, late=6, previous_max_time=1000, watermark=1001 + half, longest_timeout_ms=half
    )
    assert loud == [
        "6 of this batch's 10 events were older than the watermark and went to late/",
        "the watermark moved 30.0m past the previous batch's largest event time, more than "
        "the longest rule timeout (30.0m): every operation pending then expired",
    ]
    assert abnormal_batch_warnings(arrived=0, late=0, previous_max_time=None, watermark=5,
                                   longest_timeout_ms=1) == []  # fmt: skip
