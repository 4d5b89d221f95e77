"""``--clean-source`` and ``--max-file-age`` on a real stream: Spark's file source options.

A stream over three increment files (one per micro-batch) gives the
reference's outputs while its source cleans the files of the batches Spark
has committed: moved under the archive directory at their absolute path, or
deleted. Spark tells a source that a batch committed when it plans the next
one, so the last batch's file stays until a later batch is planned, as with
Spark's own file source; a rerun with no new file takes nothing again. The
same options reach Spark's own file source for a ``file:`` URI input.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference, feed, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.stream.checkpoint import StreamError
from tickwheel.pipeline.stream.cli import main
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs
from tickwheel.pipeline.stream.status import checkpoint_status

#: How long Spark's own file source may take to clean a file: it cleans in a
#: thread of its own (spark.sql.streaming.fileSource.cleaner.numThreads).
CLEANED_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """150 generated orders in 6 arrival-ordered files, the rules and the reference."""
    base = tmp_path_factory.mktemp("orders")
    gen = base / "gen"
    generate_orders(150, gen, seed=5, files=6)
    rules = write_rules(base / "rules.toml")
    ref = run_reference(iter_input_lines(gen), load_rules(rules))
    return {"files": sorted(gen.glob("part-*.jsonl")), "rules": rules, "ref": ref}


def _run(spark: Any, tmp: Path, rules: Path, input: str, **kw: Any) -> dict[str, Any]:
    """A quiet job on ``input`` with ``tmp``'s ``out`` and ``ck``: its summary and outputs."""
    config = StreamConfig(
        rules_path=str(rules), input=input, output=str(tmp / "out"), checkpoint=str(tmp / "ck"),
        max_files_per_trigger=1, **kw,
    )  # fmt: skip
    with FileStreamJob(config, spark=spark) as job:
        summary = job.run()
        assert job.sink is not None
        summary["outputs"] = read_stream_outputs(spark, job.sink, str(tmp / "ck"))
    return summary


def _archived(archive: Path, path: Path) -> Path:
    """Where cleanSource ``archive`` puts ``path``: the archive, then its absolute path."""
    return Path(str(archive) + str(path.resolve()))


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["archive", "delete"])
def test_committed_files_are_cleaned_and_a_rerun_takes_nothing(
    spark: Any, tmp_path: Path, orders: dict[str, Any], mode: str
) -> None:
    """Three batches, one file each: the files of the two batches Spark told the
    source it committed are archived (contents intact) or deleted; the last one's
    stays in the input, remembered. The outputs are the reference's. Rerun (once,
    with archive: the source remembers alike in both modes), the job runs no batch
    and the last file stays."""
    inp = tmp_path / "in"
    files = feed(orders["files"], inp, 3)
    contents = [f.read_bytes() for f in files]
    archive = tmp_path / "archive"
    options: dict[str, Any] = {"clean_source": mode}
    if mode == "archive":
        options["source_archive_dir"] = str(archive)
    first = _run(spark, tmp_path, orders["rules"], str(inp), **options)
    assert first["batches_run"] == 3
    compare_with_reference(first["outputs"], orders["ref"])
    assert [f.exists() for f in files] == [False, False, True]
    if mode == "delete":
        assert not archive.exists()
        return
    assert [_archived(archive, f).read_bytes() for f in files[:2]] == contents[:2]
    assert not _archived(archive, files[2]).exists()
    again = _run(spark, tmp_path, orders["rules"], str(inp), **options)
    assert again["batches_run"] == 0
    compare_with_reference(again["outputs"], orders["ref"])
    assert files[2].read_bytes() == contents[2]


def _wait_until_gone(paths: list[Path]) -> None:
    deadline = time.monotonic() + CLEANED_TIMEOUT_S
    while any(p.exists() for p in paths):
        assert time.monotonic() < deadline, [str(p) for p in paths if p.exists()]
        time.sleep(0.1)


@pytest.mark.spark
def test_sparks_own_file_source_takes_the_options(
    spark: Any, tmp_path: Path, orders: dict[str, Any]
) -> None:
    """A ``file:`` URI input goes to Spark's binaryFile source, with cleanSource
    archive and maxFileAge as Spark's options: the committed batches' files are
    archived by Spark, at their absolute path, and the outputs are the reference's."""
    inp = tmp_path / "in"
    files = feed(orders["files"], inp, 3)
    contents = [f.read_bytes() for f in files]
    archive = tmp_path / "archive"
    summary = _run(
        spark, tmp_path, orders["rules"], inp.resolve().as_uri(), clean_source="archive",
        source_archive_dir=str(archive), max_file_age="30d",
    )  # fmt: skip
    assert summary["batches_run"] == 3
    compare_with_reference(summary["outputs"], orders["ref"])
    _wait_until_gone(files[:2])
    assert [_archived(archive, f).read_bytes() for f in files[:2]] == contents[:2]
    assert files[2].exists()


def test_the_options_are_checked_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command refuses options that disagree, naming them, before any Spark:
    archive without a directory, a directory inside the input (also through a
    link), a directory without archive, a bad or zero age."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    inp = tmp_path / "in"
    inp.mkdir()
    (tmp_path / "link").symlink_to(inp)
    rules = write_rules(tmp_path / "rules.toml")
    base = ["--rules", str(rules), "--input", str(inp), "--output", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "ck")]  # fmt: skip
    refused = {
        ("--clean-source", "archive"): "--clean-source archive needs --source-archive-dir",
        ("--clean-source", "archive", "--source-archive-dir", str(inp / "done")):
            f"--source-archive-dir {inp / 'done'} is inside --input {inp}",
        ("--clean-source", "archive", "--source-archive-dir", str(tmp_path / "link" / "x")):
            "is inside --input",
        ("--source-archive-dir", str(tmp_path / "done")):
            "--source-archive-dir is for --clean-source archive (here off)",
        ("--clean-source", "delete", "--source-archive-dir", str(tmp_path / "done")):
            "--source-archive-dir is for --clean-source archive (here delete)",
        ("--max-file-age", "7 days"): "--max-file-age: expected an int of milliseconds or a "
                                      "string like '250ms'",
        ("--max-file-age", "0d"): "--max-file-age must be positive, got '0d'",
    }  # fmt: skip
    for args, message in refused.items():
        assert main([*base, *args]) == 2, args
        error = capsys.readouterr().err
        assert error.startswith("tickwheel pipeline stream: error: ") and message in error, error
    config = StreamConfig(str(rules), str(inp), str(tmp_path / "out"), str(tmp_path / "ck"),
                          clean_source="move")  # fmt: skip
    with pytest.raises(StreamError, match="--clean-source: expected off, archive or delete"):
        FileStreamJob(config)


def test_the_options_reach_the_source_by_sparks_names(tmp_path: Path) -> None:
    """Both file sources take Spark's option names: the archive directory absolute,
    the age in milliseconds (which Spark's own source parses too)."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    (tmp_path / "in").mkdir()
    rules = write_rules(tmp_path / "rules.toml")
    config = StreamConfig(
        str(rules), str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck"),
        max_files_per_trigger=2, clean_source="archive", source_archive_dir=str(tmp_path / "a"),
        max_file_age="7d",
    )  # fmt: skip
    with FileStreamJob(config) as job:
        assert job.files.source_options() == {
            "maxFilesPerTrigger": "2",
            "cleanSource": "archive",
            "sourceArchiveDir": str(tmp_path / "a"),
            "maxFileAge": "604800000ms",
        }
    default = StreamConfig(str(rules), str(tmp_path / "in"), str(tmp_path / "out"),
                           str(tmp_path / "ck2"))  # fmt: skip
    with FileStreamJob(default) as job:
        assert job.files.source_options() == {}  # Spark's own source keeps its defaults


def test_status_counts_what_a_compacted_log_took_and_what_waits(tmp_path: Path) -> None:
    """``pipeline status`` on a compacted file log: ``taken`` counts every file ever
    taken, and ``waiting`` leaves out the files the log remembers and those below
    the age limit it records, as the source would."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from tickwheel.pipeline.stream.file_log import FileLog

    hour, t0 = 3600, 1_700_000_000
    inp = tmp_path / "in"
    inp.mkdir()
    ck = tmp_path / "ck"
    (ck / "tickwheel" / "commits").mkdir(parents=True)

    def put(name: str, mtime: int) -> None:
        (inp / name).write_text("{}\n", encoding="utf-8")
        os.utime(inp / name, (mtime, mtime))

    put("a", t0)
    put("b", t0 + hour)
    log = FileLog(str(ck / "tickwheel" / "files.log"), max_file_age_ns=2 * hour * 10**9)
    log.take_new(str(inp))
    put("c", t0 + 4 * hour)
    log.take_new(str(inp))  # a and b are now below the limit: forgotten
    log.commit(log.end)
    log.compact()
    put("late", t0 + hour)  # below the limit: never taken
    put("new", t0 + 5 * hour)
    files = checkpoint_status(str(ck), input=str(inp))["files"]
    assert files["source"] == "tickwheel" and files["taken"] == 3
    assert files["waiting"] == 1 and files["next_waiting"] == [str(inp / "new")]
