"""The stream's file source: its order, its log, and the abnormal-batch warnings."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

from tickwheel.pipeline.storage import LocalStorage
from tickwheel.pipeline.stream.file_log import (
    COMPACT_EVERY,
    FileLog,
    list_new_files,
    logged_batch_files,
    spark_source_batch_files,
)
from tickwheel.pipeline.stream.file_source import FilesPartition, OrderedFileReader
from tickwheel.pipeline.stream.micro_batch import abnormal_batch_warnings


def _touch(path: Path, mtime: int, data: bytes = b"x\n") -> Path:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def _names(log: FileLog) -> list[str]:
    """The names of the files the log holds as entries, in order."""
    return [os.path.basename(f.path) for f in log.files(log.base, log.end) or []]


def test_files_are_listed_by_mtime_then_name(tmp_path: Path) -> None:
    for name in ("h.jsonl", "b.jsonl", "f.jsonl", "a.jsonl"):
        _touch(tmp_path / name, 1000)  # copied together: one mtime
    _touch(tmp_path / "0-newest.jsonl", 2000)
    _touch(tmp_path / "z-oldest.jsonl", 500)
    _touch(tmp_path / ".hidden", 100)
    _touch(tmp_path / "_SUCCESS", 100)
    (tmp_path / "sub").mkdir()

    def every(_path: str, _mtime_ns: int) -> bool:
        return True

    names = [os.path.basename(f.path) for f in list_new_files(str(tmp_path), every)]
    assert names == ["z-oldest.jsonl", "a.jsonl", "b.jsonl", "f.jsonl", "h.jsonl",
                     "0-newest.jsonl"]  # fmt: skip
    seen = {str(tmp_path / "a.jsonl"), str(tmp_path / "z-oldest.jsonl")}

    def unseen(path: str, _mtime_ns: int) -> bool:
        return path not in seen

    assert [os.path.basename(f.path) for f in list_new_files(str(tmp_path), unseen)][:1] == [
        "b.jsonl"
    ]

    def not_older(_path: str, mtime_ns: int) -> bool:
        return mtime_ns >= 1000 * 10**9

    assert list_new_files(str(tmp_path), not_older) == [
        (str(tmp_path / name), 1000 * 10**9)
        for name in ("a.jsonl", "b.jsonl", "f.jsonl", "h.jsonl")
    ] + [(str(tmp_path / "0-newest.jsonl"), 2000 * 10**9)]  # an older file is left out


def test_the_log_keeps_its_order_and_survives_a_torn_append(tmp_path: Path) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    for i, name in enumerate(("c", "a", "b")):
        _touch(inp / name, 1000 + (i // 2))  # c and a share an mtime; b is newer
    log = FileLog(str(tmp_path / "ck" / "files.log"))
    assert log.take_new(str(inp)) == 3
    assert _names(log) == ["a", "c", "b"]
    _touch(inp / "0-late-copy", 1)  # appears later, with an older mtime: goes last
    assert log.take_new(str(inp)) == 1 and log.take_new(str(inp)) == 0
    with open(log.path, "ab") as fh:
        fh.write(b'{"path": "/torn')  # a crash mid-append
    again = FileLog(log.path)
    assert again.files(0, again.end) == log.files(0, log.end)
    assert _names(again) == ["a", "c", "b", "0-late-copy"]
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
    assert _names(reader) == ["a"]
    assert Path(source.path).read_bytes().endswith(b'"/in/b"')  # not cut off
    with open(source.path, "ab") as fh:
        fh.write(b"}\n")
    assert reader.refresh() == 1 and reader.files(1, 2) == [("/in/b", None)]
    assert reader.refresh() == 0 and reader.end == 2


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


def _spark_source_log(spark_checkpoint: Path, batches: list[list[tuple[str, int]]]) -> None:
    """Spark's file source's logs as its streaming engine writes them: each batch's end
    offset (``logOffset``) and its files (URI, modification time), one log batch each;
    ``9.compact`` stands for batch 9 and holds batches 0 to 9, as compaction leaves it."""
    offsets, source = spark_checkpoint / "offsets", spark_checkpoint / "sources" / "0"
    offsets.mkdir(parents=True)
    source.mkdir(parents=True)
    so_far = []
    for batch_id, files in enumerate(batches):
        (offsets / str(batch_id)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
            + json.dumps({"logOffset": batch_id})
        )
        lines = [json.dumps({"path": uri, "timestamp": ms, "batchId": batch_id})
                 for uri, ms in files]  # fmt: skip
        so_far += lines
        name, logged = (f"{batch_id}.compact", so_far) if batch_id == 9 else (str(batch_id), lines)
        (source / name).write_text("\n".join(["v1", *logged]))


def test_a_batchs_files_come_from_sparks_own_file_source_log(tmp_path: Path) -> None:
    """Where Spark's own file source runs (a URI), batch N's files come from its logs:
    named as its rows' ``path`` column names them (Hadoop's ``Path.toString``: decoded,
    ``file:/x`` for ``file:///x``), in (modification time, path) order, a compacted
    batch included; any log missing or in another form gives None (read the rows)."""
    ck = tmp_path / "spark"
    batches: list[list[tuple[str, int]]] = [[] for _ in range(10)]
    batches[0] = [("file:///in/b.jsonl", 5), ("file:///in/a%20b%25.jsonl", 5), ("file:///in/0", 9)]
    batches[1] = [("viewfs://cluster/in/x.jsonl", 1)]
    batches[9] = [("hdfs://nn:8020/in/z", 3)]
    _spark_source_log(ck, batches)

    def files(batch_id: int) -> list[str] | None:
        return spark_source_batch_files(str(ck), batch_id, LocalStorage())

    assert files(0) == ["file:/in/a b%.jsonl", "file:/in/b.jsonl", "file:/in/0"]
    assert files(1) == ["viewfs://cluster/in/x.jsonl"]
    assert files(9) == ["hdfs://nn:8020/in/z"]  # from 9.compact, which holds 0 to 9
    assert files(10) is None  # not logged yet
    assert files(2) == []
    source = ck / "sources" / "0"
    for bad in ("v2\n{}", '{"path": "file:///a", "timestamp": 1, "batchId": 2}', "v1\n{",
                'v1\n{"path": "file:///a?b", "timestamp": 1, "batchId": 2}',
                'v1\n{"timestamp": 1, "batchId": 2}'):  # fmt: skip
        (source / "2").write_text(bad)
        assert files(2) is None, bad
    (source / "2").unlink()
    assert files(2) is None  # neither 2 nor 2.compact
    offsets = ck / "offsets"
    for bad in ('v1\n{}\n{"taken": 3}', "v1\n{}", 'v1\n{}\n{"logOffset": 0}'):
        (offsets / "3").write_text(bad)  # the ordered source's, cut, before its start
        assert files(3) is None, bad


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


def _plan(
    reader: OrderedFileReader, start: dict[str, int], last: dict[str, int] | None
) -> tuple[dict[str, int], list[str]]:
    """One micro-batch as Spark's engine drives the source: its end offset, then the
    commit of the batch before it (Spark commits a batch when it logs the next one's
    offsets), then its partition. Returns (end, the batch's file names)."""
    end = reader.latestOffset(start, ReadAllAvailable())
    if last is not None:
        reader.commit(last)
    (part,) = reader.partitions(start, end)
    assert isinstance(part, FilesPartition)
    return end, [os.path.basename(p) for p in part.paths]


def test_a_long_run_with_clean_source_stays_flat(tmp_path: Path) -> None:
    """120 micro-batches of 3 files under cleanSource delete: the offsets stay absolute
    positions, each committed batch's files are deleted, and what the source
    remembers, holds in memory and keeps in its log stays bounded by the batches not
    yet committed and compacted. A restarted source cleans what its log still
    lists as committed (gone already: forgotten) and goes on from its position."""
    inp = tmp_path / "in"
    inp.mkdir()
    log_path = tmp_path / "ck" / "files.log"
    options = {"path": str(inp), "log": str(log_path), "cleanSource": "delete"}
    reader = OrderedFileReader(options)
    start, last = reader.initialOffset(), None
    remembered, held, lines = set(), set(), set()
    for batch in range(120):
        names = [f"f{batch:03d}-{k}" for k in range(3)]
        for name in names:
            _touch(inp / name, 1000 + batch)
        end, taken = _plan(reader, start, last)
        assert end == {"taken": 3 * (batch + 1)} and taken == names
        remembered.add(reader.log.remembered)
        held.add(reader.log.end - reader.log.base)
        lines.add(len(log_path.read_bytes().splitlines()))
        start = last = end
    assert remembered == held == {3}  # this batch's files: the others are committed, deleted
    assert max(lines) <= 1 + 3 * (COMPACT_EVERY + 1)  # header, and the batches since it
    assert sorted(os.listdir(inp)) == ["f119-0", "f119-1", "f119-2"]  # the last is not committed
    again = FileLog(str(log_path))
    assert 0 < again.base <= 357 and again.end == 360
    assert [os.path.basename(f.path) for f in again.files(357, 360) or []] == sorted(
        os.listdir(inp)
    )
    restarted = OrderedFileReader(options)  # the process ended: Spark resumes at 360
    _touch(inp / "g", 5000)
    end, taken = _plan(restarted, {"taken": 360}, {"taken": 360})
    assert end == {"taken": 361} and taken == ["g"]
    assert os.listdir(inp) == ["g"] and restarted.log.remembered == 1


def test_a_compacted_log_keeps_its_positions_and_repairs_a_torn_append(tmp_path: Path) -> None:
    """A compaction drops the committed entries, keeps remembering those not cleaned,
    forgets the cleaned ones; appends go on after it, and a torn one is cut off."""
    inp = tmp_path / "in"
    inp.mkdir()
    for i, name in enumerate("abcd"):
        _touch(inp / name, 1000 + i)
    log = FileLog(str(tmp_path / "files.log"))
    log.take_new(str(inp))
    (inp / "a").unlink()
    log.commit(2, cleaned=[str(inp / "a")])  # a cleaned; b committed, not cleaned
    log.compact()
    _touch(inp / "e", 2000)
    assert log.take_new(str(inp)) == 1
    with open(log.path, "ab") as fh:
        fh.write(b'{"path": "/torn')
    again = FileLog(log.path)
    assert (again.base, again.end) == (2, 5) and _names(again) == ["c", "d", "e"]
    assert again.files(0, 3) is None  # compacted away
    assert str(inp / "a") not in again and str(inp / "b") in again
    assert Path(log.path).read_bytes().endswith(b"\n")
    (inp / "a").write_bytes(b"a new file under a cleaned name\n")
    assert again.take_new(str(inp)) == 1 and _names(again)[-1] == "a"


def test_a_crash_before_the_compacted_log_is_switched_in_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compacted log is written beside the log and renamed over it: killed before
    the rename, the log is whole as it was; the restarted source removes the
    unswitched file (a reader beside it leaves it alone) and compacts again."""
    inp = tmp_path / "in"
    inp.mkdir()
    for i, name in enumerate("abc"):
        _touch(inp / name, 1000 + i)
    log = FileLog(str(tmp_path / "files.log"))
    log.take_new(str(inp))
    log.commit(2, cleaned=[str(inp / "a")])
    before = Path(log.path).read_bytes()

    def killed(src: str, dst: str) -> None:
        raise SystemExit("killed between writing the compacted log and switching to it")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", killed)
        with pytest.raises(SystemExit):
            log.compact()
    unswitched = Path(log.path + ".new")
    assert Path(log.path).read_bytes() == before and unswitched.exists()
    beside = FileLog(log.path, repair=False)
    assert unswitched.exists() and beside.end == 3
    restarted = FileLog(log.path)
    assert not unswitched.exists()
    assert (restarted.base, restarted.end, _names(restarted)) == (0, 3, ["a", "b", "c"])
    assert all(str(inp / name) in restarted for name in "abc")  # the commit was not durable
    restarted.commit(2, cleaned=[str(inp / "a")])
    restarted.compact()
    assert (FileLog(log.path).base, FileLog(log.path).end) == (2, 3)


def test_a_reader_beside_the_source_follows_its_compactions(tmp_path: Path) -> None:
    """The driver's log (repair=False) notices each compaction by the log's first line
    and reads the new log: a running batch's slice stays there; a compacted one is
    None, so the driver reads the rows instead."""
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(4):
        _touch(inp / f"f{i}", 1000 + i)
    source = FileLog(str(tmp_path / "files.log"))
    source.take_new(str(inp))
    reader = FileLog(source.path, repair=False)
    assert reader.end == 4
    spark_ck = tmp_path / "spark"
    _log_offsets(spark_ck, 3, 6, 8)
    for i in range(4, 6):
        _touch(inp / f"f{i}", 1000 + i)
    for i in range(3):  # cleaned, after their batch committed
        (inp / f"f{i}").unlink()
    source.commit(3, cleaned=[str(inp / f"f{i}") for i in range(3)])
    source.compact()
    assert source.take_new(str(inp)) == 2
    assert logged_batch_files(str(spark_ck), reader, 1) == [str(inp / f"f{i}") for i in (3, 4, 5)]
    assert reader.base == 3 and logged_batch_files(str(spark_ck), reader, 0) is None
    for i in range(6, 8):
        _touch(inp / f"f{i}", 1000 + i)
    source.take_new(str(inp))
    source.commit(6)
    source.compact()  # again: a new generation, the same first line's shape
    assert logged_batch_files(str(spark_ck), reader, 2) == [str(inp / "f6"), str(inp / "f7")]
    assert reader.base == 6


def test_max_file_age_ignores_old_files_and_forgets_them(tmp_path: Path) -> None:
    """maxFileAge as Spark's: the first listing takes every file; later, a file older
    than the newest seen minus the age is ignored (one exactly at the limit is not),
    and the log forgets the files below the limit. A compaction records the limit,
    which holds after a restart even without the age: the files it forgot are
    never taken again."""
    hour = 3600
    t0 = 1_700_000_000
    inp = tmp_path / "in"
    inp.mkdir()
    _touch(inp / "a", t0)
    _touch(inp / "b", t0 + hour)
    log = FileLog(str(tmp_path / "files.log"), max_file_age_ns=2 * hour * 10**9)
    assert log.take_new(str(inp)) == 2 and log.ignore_before_ns() == (t0 + hour - 2 * hour) * 10**9
    _touch(inp / "c", t0 + 4 * hour)
    assert log.take_new(str(inp)) == 1
    assert log.ignore_before_ns() == (t0 + 2 * hour) * 10**9
    assert str(inp / "a") not in log and str(inp / "b") not in log and log.remembered == 1
    _touch(inp / "late", t0 + hour)  # copied in late, keeping its old time: ignored
    _touch(inp / "at-the-limit", t0 + 2 * hour)
    assert log.take_new(str(inp)) == 1 and _names(log)[-1] == "at-the-limit"
    log.commit(log.end)
    log.compact()
    no_age = FileLog(log.path)  # a later run without --max-file-age
    assert no_age.ignore_before_ns() == (t0 + 2 * hour) * 10**9
    assert no_age.take_new(str(inp)) == 0  # a and b forgotten, late never taken: all too old
    header = json.loads(Path(log.path).read_bytes().splitlines()[0])
    assert header["max_file_age_ns"] is None  # the run recorded that it has no age limit


def test_clean_source_archives_and_keeps_what_it_must_not_touch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """archive moves a committed file to the archive directory at its absolute path.
    A file already gone is forgotten, no error; one the archive holds a file of the
    same name for, or one changed since it was taken, stays in place with a warning
    and stays remembered: it is never taken twice."""
    inp = tmp_path / "in"
    inp.mkdir()
    archive = tmp_path / "archive"
    for i, name in enumerate("abcd"):
        _touch(inp / name, 1000 + i, data=name.encode())
    options = {"path": str(inp), "log": str(tmp_path / "files.log"), "cleanSource": "archive",
               "sourceArchiveDir": str(archive)}  # fmt: skip
    reader = OrderedFileReader(options)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    (inp / "b").unlink()  # removed by someone else before the batch committed
    earlier_c = Path(str(archive) + str(inp / "c"))
    earlier_c.parent.mkdir(parents=True)
    earlier_c.write_bytes(b"an earlier c")
    _touch(inp / "d", 3000, data=b"d, changed")
    with caplog.at_level(logging.WARNING, logger="tickwheel"):
        reader.commit(end)
    assert Path(str(archive) + str(inp / "a")).read_bytes() == b"a"
    assert sorted(os.listdir(inp)) == ["c", "d"] and earlier_c.read_bytes() == b"an earlier c"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert warned[0].startswith(f"cleanSource archive: {inp / 'c'} left in place: ")
    assert "already in the archive" in warned[0]
    assert warned[1] == f"cleanSource: {inp / 'd'} changed since it was taken; left in place"
    assert [str(inp / n) in reader.log for n in "abcd"] == [False, False, True, True]
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # nothing taken twice


def test_a_log_written_before_compaction_is_read_and_compacted(tmp_path: Path) -> None:
    """The release before logged ``{"path": P}`` lines, no times, no header: its
    positions start at 0; cleanSource cleans its committed files (no time to
    compare) and the compaction keeps the times it does not have as unknown."""
    inp = tmp_path / "in"
    inp.mkdir()
    old = [_touch(inp / name, 1000) for name in ("a", "b", "c")]
    log_path = tmp_path / "files.log"
    log_path.write_text("".join(json.dumps({"path": str(p)}) + "\n" for p in old))
    reader = OrderedFileReader({"path": str(inp), "log": str(log_path), "cleanSource": "delete"})
    assert reader.latestOffset({"taken": 3}, ReadAllAvailable()) == {"taken": 3}
    reader.commit({"taken": 2})
    reader.log.compact()
    assert os.listdir(inp) == ["c"]
    again = FileLog(str(log_path))
    assert (again.base, again.end, again.files(2, 3)) == (2, 3, [(str(inp / "c"), None)])


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
