"""The step on DataFrames from sources that are not tickwheel's file source.

Every output here is compared with the plain-Python reference, and so with
every other way of running the same records: the command line's batch run,
the library's batch step on an in-memory frame of each form, and the stream
over Spark's own text and JSON sources and over a Kafka-like topic, in one
micro-batch or many, killed and restarted at every fault point.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import COLUMNS, RULES_TOML, make_input, read_outputs
from stream_support import (
    compare_with_reference,
    connect_run,
    connect_url,
    feed,
    fresh,
    rows,
    subprocess_env,
    write_rules,
)

from support import kafka_like
from support.reference import ReferenceResult, _sort_key, iter_input_lines, run_reference
from support.viewfs import FileWatch, ViewFs
from tickwheel.pipeline import delayed_operations, start_stream
from tickwheel.pipeline.batch import run_job
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import Rules, load_rules, parse_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.stream.checkpoint import FAULT_POINTS
from tickwheel.pipeline.stream.resident import DRIVER_STATE_BYTES_ENV, SNAPSHOT_EVERY_ENV
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

#: Bounds every wait on a streaming query.
QUERY_TIMEOUT_S = 240


def _tables(ops: Any) -> dict[str, list[tuple[Any, ...]]]:
    """The step's four tables as sorted tuples, in the command line's columns."""
    return {
        name: sorted(
            (tuple(r[c] for c in cols) for r in getattr(ops, name).collect()), key=_sort_key
        )
        for name, cols in COLUMNS.items()
    }


def _reference_tables(ref: ReferenceResult) -> dict[str, list[tuple[Any, ...]]]:
    return {name: sorted(getattr(ref, name), key=_sort_key) for name in COLUMNS}


@pytest.fixture(scope="module")
def edge_input(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Generated orders plus every edge case, the rules, and the reference's outputs."""
    base = tmp_path_factory.mktemp("sources")
    data = make_input(base / "in", orders=600)
    (base / "rules.toml").write_text(RULES_TOML, encoding="utf-8")
    rules = load_rules(base / "rules.toml")
    return {"base": base, "data": data, "rules": rules, "lines": iter_input_lines(data)}


@pytest.mark.connect
def test_library_batch_equals_the_command_line_and_the_reference(
    spark: Any, edge_input: dict[str, Any]
) -> None:
    """``delayed_operations`` on Spark's text source: the rows and counts of ``run_job``."""
    rules, base = edge_input["rules"], edge_input["base"]
    summary = run_job(spark, rules, str(edge_input["data"]), str(base / "cli"), 3)
    records = spark.read.text(str(edge_input["data"]))
    with delayed_operations(records, rules, partitions=3) as ops:
        got = _tables(ops)
        counts = ops.summary()["counts"]
    assert got == read_outputs(base / "cli")
    assert got == _reference_tables(run_reference(edge_input["lines"], rules))
    assert counts == summary["counts"]


def test_a_batch_step_makes_no_next_state(spark: Any, edge_input: dict[str, Any]) -> None:
    """Without ``carry`` the purgatory outputs no expiry markers, and ``next_state``
    says what it needs instead of carrying a state without them."""
    from tickwheel.pipeline.spark.step import DelayedOperations, StepOptions

    records = spark.read.text(str(edge_input["data"]))
    kinds = {}
    for carry in (False, True):
        with DelayedOperations(records, edge_input["rules"], StepOptions(carry=carry)) as ops:
            kinds[carry] = {row.kind for row in ops.rows().select("kind").distinct().collect()}
            if not carry:
                with pytest.raises(ValueError, match=r"next_state needs StepOptions\(carry=True\)"):
                    ops.next_state()
    assert kinds[True] - kinds[False] == {"expired"}


def test_the_step_keeps_its_stages_as_sparks_own_cache_does(
    spark: Any, edge_input: dict[str, Any]
) -> None:
    """The classified records and the partitions' rows stay in memory deserialized,
    spilling to disk (``Dataset.cache()``'s level), until the step is released."""
    from pyspark import StorageLevel

    from tickwheel.pipeline.spark.step import DelayedOperations

    records = spark.read.text(str(edge_input["data"]))
    with DelayedOperations(records, edge_input["rules"]) as ops:
        ops.stats()
        classified, rows = ops.classified(), ops.rows()
        assert classified.storageLevel == StorageLevel.MEMORY_AND_DISK_DESER
        assert rows.storageLevel == StorageLevel.MEMORY_AND_DISK_DESER
    assert classified.storageLevel == StorageLevel.NONE
    assert rows.storageLevel == StorageLevel.NONE


def test_binary_values_keep_invalid_bytes(spark: Any, edge_input: dict[str, Any]) -> None:
    """A Kafka-like frame of bytes: invalid UTF-8 is rejected with its exact bytes."""
    rules = edge_input["rules"]
    good = [line.encode() for line in edge_input["lines"]]
    bad = b"\xb2\xff not json"
    frame = spark.createDataFrame([(v,) for v in [*good, bad]], "value binary")
    with delayed_operations(frame, rules, partitions=2) as ops:
        got = _tables(ops)
    expected = _reference_tables(run_reference(edge_input["lines"], rules))
    expected["rejected"] = sorted(
        [*expected["rejected"], (None, "malformed", "\ufffd\ufffd not json", bad)], key=_sort_key
    )
    assert got == expected


def _typed_rows(lines: list[str]) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The valid integer-time records as typed rows, and the same records as JSON lines."""
    typed, same = [], []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or type(obj.get("ts")) is not int or "event_id" not in obj:
            continue
        if not isinstance(obj.get("order_id"), str | None) or type(obj.get("seq", 0)) is not int:
            continue
        typed.append((obj["event_id"], obj.get("order_id"), obj.get("type"), obj["ts"],
                      obj.get("seq")))  # fmt: skip
        same.append(line)
    return typed, same


def test_typed_columns_give_the_rows_of_their_json(spark: Any, edge_input: dict[str, Any]) -> None:
    """Form (b): the ``[input]`` fields as typed columns, a TIMESTAMP time included."""
    from pyspark.sql import functions as F

    rules = edge_input["rules"]
    typed, same = _typed_rows(edge_input["lines"])
    frame = spark.createDataFrame(
        typed, "event_id string, order_id string, type string, ts long, seq long"
    )
    expected = _reference_tables(run_reference(same, rules))
    for records in (frame, frame.withColumn("ts", F.timestamp_millis("ts"))):
        with delayed_operations(records, rules, partitions=2, input_format="columns") as ops:
            got = _tables(ops)
        assert {k: v for k, v in got.items() if k != "rejected"} == {
            k: v for k, v in expected.items() if k != "rejected"
        }
        assert [r[:2] for r in got["rejected"]] == [r[:2] for r in expected["rejected"]]


def test_frames_the_step_cannot_read_are_refused(spark: Any, edge_input: dict[str, Any]) -> None:
    rules = edge_input["rules"]
    frame = spark.createDataFrame([(1, 2)], "a int, b int")
    with pytest.raises(ValueError, match=r"expected a 'value' column .* \['event_id', 'type'"):
        delayed_operations(frame, rules)
    with pytest.raises(ValueError, match="input_format must be one of"):
        delayed_operations(spark.createDataFrame([("x",)], "value string"), rules,
                           input_format="avro")  # fmt: skip
    with pytest.raises(ValueError, match="partitions must be an int >= 1"):
        delayed_operations(spark.createDataFrame([("x",)], "value string"), rules, partitions=0)
    with pytest.raises(ValueError, match="for a streaming one use start_stream"):
        delayed_operations(spark.readStream.text(str(edge_input["data"])), rules)
    with pytest.raises(ValueError, match="for a batch one use delayed_operations"):
        start_stream(frame, rules, output="o", checkpoint=str(edge_input["base"] / "never"))
    streaming = spark.readStream.text(str(edge_input["data"]))
    with pytest.raises(ValueError, match="the parquet sink needs output=, a directory"):
        start_stream(streaming, rules, checkpoint=str(edge_input["base"] / "never"))
    assert not (edge_input["base"] / "never").exists()  # refused before the checkpoint


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """300 generated orders in 12 arrival-ordered files, the rules and the reference.

    The allowed lateness covers more than the generator's 2-minute disorder: a
    topic's partitions are read at slightly different paces, and the data's
    last minutes are sparse (minutes between events), so a record a few lines
    behind another in the files may arrive a micro-batch after it.
    """
    base = tmp_path_factory.mktemp("stream-sources")
    gen = base / "gen"
    generate_orders(300, gen, seed=3, files=12)
    rules_path = write_rules(base / "rules.toml", lateness="15m")
    ref = run_reference(iter_input_lines(gen), load_rules(rules_path))
    return {"base": base, "files": sorted(gen.glob("part-*.jsonl")), "rules": rules_path,
            "ref": ref}  # fmt: skip


def _finish(query: Any) -> None:
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    assert query.exception() is None, query.exception()


def _stream_outputs(spark: Any, tmp: Path) -> dict[str, Any]:
    return read_stream_outputs(spark, ParquetSink(str(tmp / "out")), str(tmp / "ck"))


@pytest.mark.slow
@pytest.mark.parametrize("source", [pytest.param("text", marks=pytest.mark.connect), "json"])
def test_start_stream_over_sparks_file_sources(
    spark: Any, tmp_path: Path, orders: dict[str, Any], source: str
) -> None:
    """``readStream.text`` (form a) and ``readStream.json`` (form b), one file a batch."""
    feed(orders["files"], fresh(tmp_path / "in"), 4)
    reader = spark.readStream.option("maxFilesPerTrigger", 1)
    if source == "text":
        records = reader.text(str(tmp_path / "in"))
    else:  # every field read as text, as the step reads any typed column
        schema = "event_id string, order_id string, type string, ts string, seq long"
        records = reader.schema(schema).json(str(tmp_path / "in"))
    query = start_stream(records, orders["rules"], output=str(tmp_path / "out"),
                         checkpoint=str(tmp_path / "ck"), trigger="available-now")  # fmt: skip
    _finish(query)
    outs = _stream_outputs(spark, tmp_path)
    assert ParquetSink(str(tmp_path / "out")).committed_batches() == [0, 1, 2, 3]
    if source == "text":
        compare_with_reference(outs, orders["ref"])
    else:  # raw text is the record as Spark's JSON: compare everything else
        ref = orders["ref"]
        assert rows(outs["outcomes"], list(COLUMNS["outcomes"])) == sorted(
            ref.outcomes, key=_sort_key
        )
        assert rows(outs["unmatched"], list(COLUMNS["unmatched"])) == sorted(
            ref.unmatched, key=_sort_key
        )
        assert [r[:2] for r in rows(outs["rejected"], ["event_id", "reason"])] == sorted(
            (r[0], r[1]) for r in ref.rejected
        )


def _topic(base: Path, files: list[Path], partitions: int = 3) -> tuple[Path, list[bytes]]:
    topic = base / "topic"
    kafka_like.create_topic(topic, partitions)
    lines = [line.encode() for f in files for line in f.read_text(encoding="utf-8").splitlines()]
    return topic, lines


@pytest.mark.slow
@pytest.mark.connect
def test_kafka_like_topic_appended_while_the_query_runs(
    spark: Any, tmp_path: Path, orders: dict[str, Any]
) -> None:
    """Records appended to a three-partition topic while the query runs, taken in order."""
    kafka_like.register(spark)
    topic, lines = _topic(tmp_path, orders["files"])
    thirds = [lines[: len(lines) // 3], lines[len(lines) // 3 : 2 * len(lines) // 3],
              lines[2 * len(lines) // 3 :]]  # fmt: skip
    kafka_like.append(topic, thirds[0])
    records = (
        spark.readStream.format(kafka_like.NAME)
        .option("path", str(topic))
        .option("maxRecordsPerTrigger", "120")
        .load()
    )
    query = start_stream(records, orders["rules"], output=str(tmp_path / "out"),
                         checkpoint=str(tmp_path / "ck"), partitions=2)  # fmt: skip
    try:
        for more in thirds[1:]:
            query.processAllAvailable()
            kafka_like.append(topic, more)
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert len(ParquetSink(str(tmp_path / "out")).committed_batches()) > 3
    compare_with_reference(_stream_outputs(spark, tmp_path), orders["ref"])


#: (point, batch) of each killed run of the topic's job, in order; every run but the last dies.
KILLS = [
    ("batch_start", 0),
    ("mid_batch", 1),
    ("after_outputs", 1),
    ("after_state", 2),
    ("after_commit", 3),
    ("after_sink_commit", 4),
]
#: Under Spark Connect, one kill: half-written outputs, replayed by the process beside
#: the server. (Every point is killed on a classic session; the commit protocol is the
#: same code on both.)
CONNECT_KILLS = [("mid_batch", 1)]


@dataclass
class _Storage:
    """Where the topic's job keeps its output and checkpoint: ``out`` and ``ck`` as the
    job names them, ``local`` the directory that holds them on this machine."""

    local: Path
    out: str
    ck: str
    env: dict[str, str]
    mount: ViewFs | None = None

    def reader(self, spark: Any) -> Any:
        """``spark``, able to read the job's URIs: the output's Spark file sink log names
        its files by the URIs the job wrote them at, as Spark's own sink does."""
        if self.mount is not None:
            self.mount.configure(spark)
        return spark


def _job_storage(tmp: Path) -> _Storage:
    """On a classic session, URIs: ``viewfs://`` over ``TMP/mnt``, configured as a
    cluster's client is (``HADOOP_CONF_DIR``); under Connect, local paths (its
    foreachBatch process has no Hadoop FileSystem of its own)."""
    if connect_run():
        return _Storage(tmp, str(tmp / "out"), str(tmp / "ck"), {})
    mount = ViewFs(fresh(tmp / "mnt"))
    conf = mount.hadoop_conf_dir(tmp / "hadoop-conf")
    env = {"HADOOP_CONF_DIR": str(conf)}
    return _Storage(mount.root, mount.uri("out"), mount.uri("ck"), env, mount)


def _job(
    tmp: Path, rules: Path, fault: str | None, where: _Storage, provider: str = "driver"
) -> subprocess.CompletedProcess[str]:
    """The Kafka-like topic's job, in an empty working directory; a killed run's fault
    message is at the end of its standard error, and of ``TMP/faults.log``
    (Connect: the process beside the server dies, and its standard error may not
    reach the job's)."""
    script = Path(__file__).resolve().parents[1] / "support" / "kafka_like_job.py"
    args = ["--topic", str(tmp / "topic"), "--rules", str(rules), "--output", where.out,
            "--checkpoint", where.ck, "--max-records-per-trigger", "90"]  # fmt: skip
    if connect_run():  # the job's own Connect server on a local master
        args += ["--remote", "local[2]"]
    # A snapshot every second commit: of the kills, those at batches 1 and 3 hit a
    # commit of the state's changelog, those at 2 and 4 one of the whole state.
    env = {**subprocess_env(fault), **where.env, SNAPSHOT_EVERY_ENV: "2"}
    if provider == "partitioned":  # past the driver's bound from the first state
        env[DRIVER_STATE_BYTES_ENV] = "1"
    env["TICKWHEEL_FAULT_LOG"] = str(tmp / "faults.log")
    cwd = tmp / "cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _only_published_batches(spark: Any, where: _Storage) -> None:
    """What a plain ``spark.read.parquet`` of each table reads (a downstream job's, a
    notebook's): the published batches' rows, each once, never a killed attempt's."""
    published = set(ParquetSink(str(where.local / "out")).committed_batches())
    for table in ("outcomes", "unmatched", "rejected", "late"):
        if not (where.local / "out" / table).exists():
            continue
        from pyspark.sql import functions as F

        frame = where.reader(spark).read.parquet(f"{where.out}/{table}")
        rows, distinct, batches = frame.agg(  # one job
            F.count("*"), F.count_distinct(F.struct(*frame.columns)), F.collect_set("batch_id")
        ).first()
        assert set(batches) <= published, (table, batches, published)
        assert rows == distinct, table


@pytest.mark.jvm_process
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("provider", [pytest.param("driver", marks=pytest.mark.connect),
                                      "partitioned"])  # fmt: skip
def test_kafka_like_topic_killed_at_every_fault_point(
    spark: Any, tmp_path: Path, orders: dict[str, Any], provider: str
) -> None:
    """SIGKILL at each fault point (under Connect, at one), records appended between runs:
    nothing lost or doubled; after each kill, before the restart, a plain
    ``spark.read.parquet`` of each table reads only published batches, once. The
    state's operations are held in the driver, or partitioned on the executors (a
    bound of one byte; classic sessions only).

    On a classic session the output and checkpoint are at ``viewfs://`` URIs,
    and no visible file there is ever overwritten or renamed; nothing is
    written in the job's working directory. (A rerun that adds nothing at
    URIs: ``test_storage_uris.py``.)
    """
    # The one point left (at a job's end, writing its state whole) is in test_stream_kill.py.
    assert {p for p, _ in KILLS} == set(FAULT_POINTS) - {"mid_snapshot"}
    kills = CONNECT_KILLS if connect_run() else KILLS
    where = _job_storage(tmp_path)
    topic, lines = _topic(tmp_path, orders["files"])
    halves = [lines[: len(lines) // 2], lines[len(lines) // 2 :]]
    kafka_like.append(topic, halves[0])
    with FileWatch(where.local) as watch:
        for i, (point, batch) in enumerate(kills):
            if i == len(kills) // 2:  # the producer goes on while the job is down
                kafka_like.append(topic, halves[1])
            proc = _job(tmp_path, orders["rules"], f"{point}:{batch}", where, provider)
            if connect_run():  # the process that runs foreachBatch died: the query fails
                assert proc.returncode != 0, (point, batch, proc.stderr[-3000:])
            else:
                assert proc.returncode == -signal.SIGKILL, (point, batch, proc.stderr[-3000:])
                assert f"SIGKILL at {point} of batch {batch}" in proc.stderr
            faults = (tmp_path / "faults.log").read_text(encoding="utf-8").splitlines()
            assert faults[-1].endswith(f"SIGKILL at {point} of batch {batch}"), faults
            _only_published_batches(spark, where)  # before any restart
        proc = _job(tmp_path, orders["rules"], None, where, provider)
        assert proc.returncode == 0, proc.stderr[-3000:]
        sink = ParquetSink(str(where.local / "out"))
        committed = sink.committed_batches()
        assert committed == list(range(len(committed)))
        outs = read_stream_outputs(where.reader(spark), checkpoint=where.ck)
        compare_with_reference(outs, orders["ref"])
    if not connect_run():
        watch.check()
    assert list((tmp_path / "cwd").iterdir()) == []


def test_rules_may_be_a_rules_object_or_a_path(spark: Any, edge_input: dict[str, Any]) -> None:
    """The step takes a :class:`Rules` or a rules file's path; both give the same rows."""
    rules: Rules = parse_rules({"rules": {"r": {"open": ["a"], "complete": ["b"],
                                                "timeout": 10}}})  # fmt: skip
    path = edge_input["base"] / "small.toml"
    path.write_text('[rules.r]\nopen = ["a"]\ncomplete = ["b"]\ntimeout = 10\n', encoding="utf-8")
    lines = ['{"event_id":"1","key":"k","type":"a","time":0}',
             '{"event_id":"2","key":"k","type":"b","time":5}',
             '{"event_id":"3","key":"k","type":"a","time":30}']  # fmt: skip
    frame = spark.createDataFrame([(v,) for v in lines], "value string")
    got = [_tables(delayed_operations(frame, r, partitions=1)) for r in (rules, str(path))]
    assert got[0] == got[1] == _reference_tables(run_reference(lines, rules))


@pytest.mark.jvm_process
@pytest.mark.slow
@pytest.mark.connect
def test_the_example_plain_pyspark_program_runs(spark: Any, tmp_path: Path) -> None:
    """``examples/spark_library.py``: a batch and a stream from a plain PySpark program,
    on a classic session, or on Spark Connect as ``SPARK_REMOTE`` asks: here, this test
    process's own server, as a program is pointed at a cluster's (a server of its own,
    ``SPARK_REMOTE=local[2]``, cost a JVM's start more)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "spark_library.py"
    env = subprocess_env()  # its JVM on C1 only, as every JVM of the suite: same results
    env.pop("PYSPARK_PYTHON")  # the program says which Python its workers run
    env.pop("PYSPARK_DRIVER_PYTHON")
    env.pop("SPARK_REMOTE", None)
    if connect_run():
        env["SPARK_REMOTE"] = connect_url(spark)
    proc = subprocess.run(
        [sys.executable, str(example), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "batch unmatched: [('o3', 'no_operation')]" in out
    assert "batch rejected: [('malformed', 'not json')]" in out
    assert "batch counts: {'completed': 1, 'expired': 1, 'pending': 1}" in out
    assert "stream batches committed: [0, 1]" in out
    assert "stream outcomes: [('o1', 'completed'), ('o2', 'expired'), ('o4', 'pending')]" in out
