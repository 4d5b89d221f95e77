"""One fault suite: every kind of bad input, through the batch job and the stream.

Each case is a file of bad input written beside good ones. For each, the test
states what the user sees: the exit code and the message, the rows in
``rejected/`` (and ``late/``), the good records around the bad ones applied,
and, in the stream, the files after it still processed. Outputs are read back
through pyarrow into pandas, as a user would.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from output_readers import load_everywhere, load_table

from tickwheel._cli import main
from tickwheel.pipeline.batch import run_job
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.spark.records import MISSING_FILE
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
RULES = """
[input]
key = "order_id"
type = "type"
time = "ts"
id = "event_id"
sequence = "seq"
allowed_lateness = "1m"

[rules.payment]
open = ["created"]
complete = ["paid"]
timeout = "30m"
"""


def record(event_id: Any, key: Any, ts: Any, kind: str = "created", **extra: Any) -> bytes:
    """One JSON line (bytes, with its newline)."""
    fields = {"event_id": event_id, "order_id": key, "type": kind, "ts": ts, **extra}
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def random_lines(seed: int, lines: int = 20, width: int = 200) -> bytes:
    """Random bytes cut into lines (no CR or LF inside a line)."""
    rnd = random.Random(seed)
    out = b""
    for _ in range(lines):
        chunk = bytes(b for b in rnd.randbytes(width * 2) if b not in (10, 13))[:width]
        out += chunk + b"\n"
    return out


@dataclass
class Case:
    """A file of bad input and what the user must see for it."""

    name: str
    data: Callable[[int], bytes]  # the file's bytes, given the case's base event time
    rejected: list[tuple[str | None, str]]  # (event_id, reason), sorted
    applied: list[str] = field(default_factory=list)  # event ids that open an operation
    hook: str | None = None  # "added" or "removed": the file changes during the run


def _lines(t: int) -> dict[str, bytes]:
    return {
        "truncated": record("tr1", "otr", t) + b'{"event_id":"tr2","order_id":"otr","ty',
        "nul": b"\x00" * 64 + b"\n" + record("nul1\x00", "on", t).replace(b"\\u0000", b"\x00"),
        "long": record("long1", "olong", t, pad="x" * 5_000_000) + b"y" * 5_000_000 + b"\n",
        "columns": record("col1", "oc1", t, extra=[1, 2])
        + json.dumps({"event_id": "col2", "type": "created", "ts": t}).encode()
        + b"\n",
        "types": (
            record("ty1", "ot1", True)
            + record("ty2", "ot2", {"at": t})
            + record("ty3", "ot3", t, seq="x")
            + record("ty4", "ot4", 1.5)
            + record(7005, "ot5", t)  # a number as the id: read as text
            + record("ty6", ["ok6"], t)  # an array as the key: its JSON text
            + record("ty7", "ot7", str(t))  # a string of digits as the time
        ),
    }


CASES = [
    Case("zero_byte", lambda t: b"", []),
    Case("random_bytes", lambda t: random_lines(21), [(None, "malformed")] * 20),
    Case("nul_bytes", lambda t: _lines(t)["nul"], [(None, "malformed")] * 2),
    Case("truncated_last_line", lambda t: _lines(t)["truncated"], [(None, "malformed")], ["tr1"]),
    Case("line_of_5mb", lambda t: _lines(t)["long"], [(None, "malformed")], ["long1"]),
    Case(
        "extra_and_missing_columns",
        lambda t: _lines(t)["columns"],
        [("col2", "missing_field:order_id")],
        ["col1"],
    ),
    Case(
        "wrong_value_types",
        lambda t: _lines(t)["types"],
        [("ty1", "bad_time"), ("ty2", "bad_time"), ("ty3", "bad_sequence"), ("ty4", "bad_time")],
        ["7005", "ty6", "ty7"],
    ),
    Case(
        "far_future_time",
        lambda t: (
            record("ff1", "off", int(time.time() * 1000) + 400 * 86_400_000)
            + record("ff2", "off", t)
        ),
        [("ff1", "far_future")],
        ["ff2"],
    ),
    Case("file_added_during_a_run", lambda t: record("add1", "oadd", t), [], [], hook="added"),
    Case(
        "file_removed_after_listing",
        lambda t: record("rm1", "orm", t),
        [(None, MISSING_FILE)],
        [],
        hook="removed",
    ),
]
IDS = [case.name for case in CASES]


def _good(t: int, tag: str) -> bytes:
    """An order opened and paid: the good records around a bad file."""
    return record(f"{tag}-open", f"o-{tag}", t) + record(
        f"{tag}-paid", f"o-{tag}", t + 1000, kind="paid"
    )


def _rejected(frame: Any) -> list[tuple[str | None, str]]:
    rows = [
        (None if isinstance(e, float) or e is None else e, r)
        for e, r in zip(frame["event_id"], frame["reason"], strict=True)
    ]
    return sorted(rows, key=lambda r: (r[0] is not None, r[0] or "", r[1]))


def _check_raw(frame: Any, data: bytes) -> None:
    """Each rejected record's ``raw`` is text and ``raw_bytes`` its exact bytes when needed."""
    lines = {line for line in data.split(b"\n") if line.strip(b" ")}
    for raw, exact in zip(frame["raw"], frame["raw_bytes"], strict=True):
        assert isinstance(raw, str)
        original = raw.encode() if exact is None else exact
        if exact is not None:
            assert original.decode("utf-8", errors="replace") == raw
        assert original in lines or raw.endswith(".jsonl")


# ----------------------------------------------------------------------------- batch


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_batch_job(
    case: Case,
    spark: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (tmp_path / "rules.toml").write_text(RULES, encoding="utf-8")
    (inp / "a-good.jsonl").write_bytes(_good(T0, "before"))
    # an event of a type no rule uses moves the watermark past every case's records
    (inp / "d-later.jsonl").write_bytes(record("tick", "otick", T0 + 600_000, kind="viewed"))
    bad = inp / "b-case.jsonl"
    data = case.data(T0 + 60_000)
    late_file = inp / "c-added.jsonl"
    if case.hook != "added":
        bad.write_bytes(data)
    if case.hook is None:
        code = main(["pipeline", "run", "--rules", str(tmp_path / "rules.toml"),
                     "--input", str(inp), "--output", str(out), "--partitions", "2"])  # fmt: skip
        assert code == 0
        said = capsys.readouterr().out
    else:
        # The change lands once the job has listed its input, before it reads it.
        said_lines: list[str] = []

        def progress(message: str) -> None:
            said_lines.append(message)
            if "reading" in message:
                if case.hook == "added":
                    late_file.write_bytes(data)
                else:
                    bad.unlink()

        run_job(spark, load_rules(tmp_path / "rules.toml"), str(inp), str(out), 2,
                progress=progress)  # fmt: skip
        said = "\n".join(said_lines)
    assert "done:" in said
    if case.name == "far_future_time":
        assert "rejected 1 far_future record(s)" in said
    tables = load_everywhere(out, "parquet")  # through pyarrow into pandas
    rejected = tables["rejected"]
    assert _rejected(rejected) == sorted(
        case.rejected, key=lambda r: (r[0] is not None, r[0] or "", r[1])
    )
    _check_raw(rejected, data)
    opened = set(tables["outcomes"]["op_id"])
    assert {"before-open", *case.applied} == opened
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["rejected"] == len(case.rejected)


def test_batch_far_future_guard_can_be_turned_off(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--max-future off`` accepts the far record: it then moves the watermark."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (tmp_path / "rules.toml").write_text(RULES, encoding="utf-8")
    far = int(time.time() * 1000) + 400 * 86_400_000
    (inp / "a.jsonl").write_bytes(_good(T0, "g") + record("far", "ofar", far))
    args = ["pipeline", "run", "--rules", str(tmp_path / "rules.toml"), "--input", str(inp),
            "--output", str(out)]  # fmt: skip
    assert main([*args, "--max-future", "off"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_future_ms"] is None and summary["watermark"] == far - 60_000
    with pytest.raises(SystemExit):
        main([*args, "--max-future", "soon"])
    assert "--max-future" in capsys.readouterr().err


# ----------------------------------------------------------------------------- stream


class _HookedJob(FileStreamJob):
    """A stream job that runs a hook when a batch's plan names a given file, before the
    batch reads its files."""

    hooks: dict[str, Callable[[], None]]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        read = self.files._records

        def records(plan: Any, spark: Any) -> Any:
            for path in plan["files"]:
                hook = self.hooks.pop(os.path.basename(path), None)
                if hook is not None:
                    hook()
            return read(plan, spark)

        self.files._records = records  # type: ignore[method-assign]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stream(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every case in one stream, a file per micro-batch, each followed by a good file."""
    inp, out, ck = tmp_path / "in", tmp_path / "out", tmp_path / "ck"
    inp.mkdir()
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES, encoding="utf-8")
    stamp = 1_700_000_000
    data_of: dict[str, bytes] = {}
    hooks: dict[str, Callable[[], None]] = {}
    added = inp / "zz-added.jsonl"

    def write(name: str, data: bytes) -> Path:
        nonlocal stamp
        path = inp / name
        path.write_bytes(data)
        os.utime(path, (stamp, stamp))
        stamp += 1
        return path

    for i, case in enumerate(CASES):
        # Event times grow with the files; the added file's come after them all.
        t = T0 + (len(CASES) if case.hook == "added" else i) * 120_000
        data = data_of[case.name] = case.data(t)
        name = f"{i:02d}-{case.name}.jsonl"
        if case.hook == "added":  # written while the previous case's batch runs
            hooks[f"{i - 1:02d}-after.jsonl"] = lambda d=data: added.write_bytes(d)
            write(name, b"")
        else:
            path = write(name, data)
            if case.hook == "removed":
                hooks[name] = path.unlink
        write(f"{i:02d}-after.jsonl", _good(T0 + i * 120_000 + 60_000, f"after{i}"))
    config = StreamConfig(
        rules_path=str(rules), input=str(inp), output=str(out), checkpoint=str(ck),
        max_files_per_trigger=1,
    )  # fmt: skip
    with _HookedJob(config, spark=spark) as job:
        job.hooks = hooks
        summary = job.run()
        assert job.sink is not None
        # final outcomes from the sink, pending ones from the checkpoint
        so_far = read_stream_outputs(spark, job.sink, str(ck))
        assert so_far["outcomes"] is not None and so_far["buffered"] is not None
        opened = {row["op_id"] for row in so_far["outcomes"].select("op_id").collect()}
        # the last file's events are above the watermark: taken, not applied yet
        buffered = {row["event_id"] for row in so_far["buffered"].select("event_id").collect()}
    assert summary["batches_run"] == 2 * len(CASES)
    assert not hooks  # every hook ran
    assert summary["warnings"] == []
    tables = load_everywhere(out, "parquet")
    assert len(tables["late"]) == 0
    rejected = tables["rejected"]
    for i, case in enumerate(CASES):
        if case.hook == "added":
            continue  # not listed by this run: see below
        lines = {line for line in data_of[case.name].split(b"\n") if line}
        mine = rejected[
            [
                raw == f"{i:02d}-{case.name}.jsonl"  # a file-level reject
                or (raw.encode() if exact is None else exact) in lines
                for raw, exact in zip(rejected["raw"], rejected["raw_bytes"], strict=True)
            ]
        ]
        assert _rejected(mine) == sorted(
            case.rejected, key=lambda r: (r[0] is not None, r[0] or "", r[1])
        ), case.name
        _check_raw(mine, data_of[case.name])
        assert set(case.applied) <= opened, case.name
        assert f"after{i}-open" in opened | buffered, case.name  # the stream went on
    # The file added during a run is the next run's first file; the CLI runs it,
    # and a batch that moves the watermark a month ahead, then one that is late.
    write("zz-jump.jsonl", record("jump", "ojump", T0 + 30 * 86_400_000))
    os.utime(added, (stamp - 10, stamp - 10))
    write("zz-old.jsonl", b"".join(record(f"old{k}", "oold", T0 + k) for k in range(3)))
    code = main(["pipeline", "stream", "--rules", str(rules), "--input", str(inp),
                 "--output", str(out), "--checkpoint", str(ck), "--max-files-per-trigger", "1",
                 "--quiet"])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: the watermark moved 30.0d past the previous batch's largest event time" in err
    assert "warning: 3 of this batch's 3 events were older than the watermark" in err
    tables = load_everywhere(out, "parquet")
    assert "add1" in set(tables["outcomes"]["op_id"])  # expired: the watermark jumped
    assert sorted(tables["late"]["event_id"]) == ["old0", "old1", "old2"]
    meta = [json.loads(p.read_text()) for p in (ck / "tickwheel" / "commits").glob("*.json")]
    assert any(m.get("warnings") for m in meta)


def test_sqlite_sink_keeps_invalid_bytes_as_a_blob(spark: Any, tmp_path: Path) -> None:
    """The SQLite sink keeps invalid bytes as a BLOB beside valid text."""
    inp = tmp_path / "in"
    inp.mkdir()
    (tmp_path / "rules.toml").write_text(RULES, encoding="utf-8")
    (inp / "a.jsonl").write_bytes(_good(T0, "g") + b"\xb2\xff not json\n")
    config = StreamConfig(
        rules_path=str(tmp_path / "rules.toml"), input=str(inp), output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"), sink="sqlite",
    )  # fmt: skip
    with FileStreamJob(config, spark=spark) as job:
        job.run()
    tables = load_everywhere(tmp_path / "out" / "tickwheel.db", "sqlite")
    rejected = tables["rejected"]
    assert list(rejected["raw"]) == ["\ufffd\ufffd not json"]
    assert list(rejected["raw_bytes"]) == [b"\xb2\xff not json"]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_batch_text_outputs_load_in_pandas(spark: Any, tmp_path: Path, fmt: str) -> None:
    """CSV and JSON outputs: raw is text, raw_bytes base64 of the exact bytes."""
    import base64

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (tmp_path / "rules.toml").write_text(RULES, encoding="utf-8")
    tick = record("tick", "otick", T0 + 600_000, kind="viewed")  # moves the watermark
    (inp / "a.jsonl").write_bytes(_good(T0, "g") + b"\xb2\xff not json\n" + tick)
    run_job(spark, load_rules(tmp_path / "rules.toml"), str(inp), str(out), 2, output_format=fmt)
    rejected = load_table(out / "rejected", fmt)
    assert list(rejected["raw"]) == ["\ufffd\ufffd not json"]
    assert [base64.b64decode(v) for v in rejected["raw_bytes"]] == [b"\xb2\xff not json"]
    assert set(load_table(out / "outcomes", fmt)["op_id"]) == {"g-open"}
