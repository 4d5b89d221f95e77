"""This release goes on from a checkpoint of every state format it claims to read.

``fixtures/checkpoint-format-N/`` is a stream checkpoint that a release
writing format ``N`` left after two micro-batches (``make_checkpoint_fixture.py``
writes one). The test copies it, adds the third input file, and runs the
stream with this release: one more batch, and the outputs of all three equal
the reference's. A release that changes the format keeps the fixtures of the
formats before it, so this test shows that it reads them.

Format 1 (``state/N/meta.json``, before ``commits/``) was written by the
release at commit 39f6a8c, the last before the commit files (see
``fixtures/checkpoint-format-1/README``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from stream_support import compare_with_reference

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.stream.checkpoint import STATE_FORMAT
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("checkpoint-format-*"))


def test_this_releases_format_has_a_fixture() -> None:
    assert [f.name for f in FIXTURES][-1] == f"checkpoint-format-{STATE_FORMAT}"


def _moved(copy: Path) -> None:
    """Point the copy's logged paths (the file log, the plans) at its own input, and
    its output's Spark file sink logs (format 3 on) at its own output files."""
    origin = (copy / "origin.txt").read_text(encoding="utf-8").strip()
    here = str(copy / "in")
    root = copy / "ck" / "tickwheel"
    logged = [root / "files.log", *(root / "plans").glob("*.json")]
    for path in [*logged, *(root / "state").glob("*/meta.json")]:  # format 1's metas too
        text = path.read_text(encoding="utf-8").replace(json.dumps(origin)[1:-1], here)
        path.unlink()
        path.write_text(text, encoding="utf-8")
    fixture_uri = Path(origin).parent.as_uri()  # the log names files by URI, as Spark's
    for path in (copy / "out").glob("*/_spark_metadata/*"):
        text = path.read_text(encoding="utf-8").replace(fixture_uri + "/", copy.as_uri() + "/")
        path.unlink()
        path.write_text(text, encoding="utf-8")


def _last_commit(root: Path) -> Path:
    """The last commit's file: ``commits/N.json``, or in format 1 ``state/N/meta.json``."""
    commits = sorted((root / "commits").glob("*.json"),
                     key=lambda p: [int(n) for n in p.stem.split(".")])  # fmt: skip
    if commits:
        return commits[-1]
    return sorted((root / "state").glob("*/meta.json"), key=lambda p: int(p.parent.name))[-1]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_this_release_goes_on_from_a_kept_checkpoint(
    spark: Any, tmp_path: Path, fixture: Path
) -> None:
    copy = tmp_path / fixture.name
    shutil.copytree(fixture, copy)
    _moved(copy)
    written = json.loads(_last_commit(copy / "ck" / "tickwheel").read_text(encoding="utf-8"))
    assert written.get("format", 1) == int(fixture.name.rsplit("-", 1)[1])
    shutil.copy(copy / "in-2.jsonl", copy / "in" / "2.jsonl")
    config = StreamConfig(
        rules_path=str(copy / "rules.toml"), input=str(copy / "in"), output=str(copy / "out"),
        checkpoint=str(copy / "ck"), max_files_per_trigger=1, partitions=1,
    )  # fmt: skip
    with FileStreamJob(config, spark=spark) as job:
        summary = job.run()
    assert summary["batches_run"] == 1, summary
    lines = [line for i in range(3) for line in iter_input_lines(copy / f"in-{i}.jsonl")]
    ref = run_reference(lines, load_rules(copy / "rules.toml"))
    sink = ParquetSink(str(copy / "out"))
    compare_with_reference(read_stream_outputs(spark, sink, str(copy / "ck")), ref)
