"""The sinks: Parquet, SQLite and PostgreSQL (JDBC rows, a Python commit), idempotent per batch."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tickwheel.pipeline.sinks import (
    ParquetSink,
    PostgresSink,
    SinkError,
    SqliteSink,
    jdbc_jars,
    make_sink,
)
from tickwheel.pipeline.stream.checkpoint import Attempt

pytestmark = pytest.mark.spark

SCHEMA = (
    "rule string, key string, opened_at long, deadline long, outcome string, "
    "latency_ms long, ratio double, final boolean"
)
BIG = 1_767_225_600_123  # epoch ms: needs BIGINT, comes back as a long, not a decimal


def _frame(spark: Any, n: int, tag: str) -> Any:
    rows = [
        ("payment", f"{tag}{i}", BIG + i, BIG + i + 1_800_000, "expired", None, i / 2, i % 2 == 0)
        for i in range(n)
    ]
    return spark.createDataFrame(rows, SCHEMA)


def _round_trip(spark: Any, sink: Any) -> None:
    first = _frame(spark, 3, "a")
    staged = sink.stage(0, {"outcomes": first, "late": _frame(spark, 0, "x")}, Attempt.new(1))
    assert not sink.is_committed(0)
    assert (
        sink.read_table(spark, "outcomes") is None
        or sink.read_table(spark, "outcomes").count() == 0
    )
    assert sink.commit(0, staged) is True
    assert sink.commit(0, staged) is False  # a roll-forward of a published batch
    # another attempt at batch 0 (even with other rows) is never published
    again = sink.stage(0, {"outcomes": _frame(spark, 5, "b"), "late": _frame(spark, 0, "x")},
                       Attempt.new(1))  # fmt: skip
    assert sink.commit(0, again) is False
    staged = sink.stage(1, {"outcomes": _frame(spark, 2, "c"), "late": _frame(spark, 1, "l")},
                        Attempt.new(2))  # fmt: skip
    assert sink.commit(1, staged) is True
    assert sink.committed_batches() == [0, 1]
    back = sink.read_table(spark, "outcomes")
    assert back is not None
    assert dict(back.dtypes) == {
        "rule": "string",
        "key": "string",
        "opened_at": "bigint",
        "deadline": "bigint",
        "outcome": "string",
        "latency_ms": "bigint",
        "ratio": "double",
        "final": "boolean",
        "batch_id": "bigint",
    }
    got = sorted((r.batch_id, r.key, r.opened_at, r.ratio, r.final) for r in back.collect())
    assert got == [
        (0, "a0", BIG, 0.0, True),
        (0, "a1", BIG + 1, 0.5, False),
        (0, "a2", BIG + 2, 1.0, True),
        (1, "c0", BIG, 0.0, True),
        (1, "c1", BIG + 1, 0.5, False),
    ]
    late = sink.read_table(spark, "late")
    assert late is not None and late.count() == 1


@pytest.mark.parametrize("arrow", [False, True], ids=["spark-writer", "driver"])
def test_parquet_stage_names_exactly_the_files_it_wrote(
    spark: Any, tmp_path: Path, arrow: bool
) -> None:
    """Whoever writes a staged table (Spark's writer for a frame, or the driver for an
    Arrow table, whose files the sink names without listing them), the staged names
    are the data files in each table's staging directory, an empty table's included,
    and the commit publishes their rows."""
    sink = ParquetSink(str(tmp_path / "out"))
    tables = {"outcomes": _frame(spark, 3, "a"), "late": _frame(spark, 0, "x")}
    if arrow:
        tables = {name: frame.toArrow() for name, frame in tables.items()}
    staged = sink.stage(0, tables, Attempt.new(1), empty=["late"])
    directory = tmp_path / "out" / "_staging" / "0" / staged["attempt"]
    for table in tables:
        on_disk = sorted(p.name for p in (directory / table).glob("*.parquet"))
        assert staged["tables"][table] == on_disk and on_disk, table
    assert sink.commit(0, staged) is True
    back = sink.read_table(spark, "outcomes")
    assert back is not None and sorted(r.key for r in back.collect()) == ["a0", "a1", "a2"]


def test_parquet_sink_round_trip(spark: Any, tmp_path: Path) -> None:
    """Staged files moved into place and named in Spark's file sink log; an attempt
    that was not published is never read, and is dropped by the owner's clean."""
    sink = ParquetSink(str(tmp_path / "out"))
    _round_trip(spark, sink)
    assert sorted(p.name for p in (tmp_path / "out" / "outcomes").iterdir()) == [
        "_spark_metadata",
        "batch_id=0",
        "batch_id=1",
    ]
    assert sorted(p.name for p in (tmp_path / "out" / "_staging").iterdir()) == ["0", "1"]
    sink.clean(1)
    assert list((tmp_path / "out" / "_staging").iterdir()) == []


def _plain(spark: Any, table: Path) -> list[str]:
    """The keys a plain ``spark.read.parquet`` of ``table`` reads."""
    return sorted(r.key for r in spark.read.parquet(str(table)).collect())


def test_only_the_published_attempt_is_read_by_any_spark_reader(spark: Any, tmp_path: Path) -> None:
    """Two attempts at one batch (a crashed or fenced one, and the one a commit names):
    tickwheel's reader and a plain ``spark.read.parquet`` read the named one's rows,
    and nothing before its publication."""
    sink = ParquetSink(str(tmp_path / "out"))
    crashed = sink.stage(0, {"outcomes": _frame(spark, 3, "a")}, Attempt.new(1))
    named = sink.stage(0, {"outcomes": _frame(spark, 2, "b")}, Attempt.new(2))
    assert crashed is not None and named is not None
    assert sink.read_table(spark, "outcomes") is None
    assert sink.commit(0, named) is True
    assert sorted(r.key for r in sink.read_table(spark, "outcomes").collect()) == ["b0", "b1"]  # type: ignore[union-attr]
    assert _plain(spark, tmp_path / "out" / "outcomes") == ["b0", "b1"]
    published = tmp_path / "out" / "outcomes" / "batch_id=0"
    assert sink.committed_files("outcomes") == sorted(str(p) for p in published.iterdir())
    assert all(named["attempt"] in p.name for p in published.iterdir())
    import pyarrow.dataset as ds  # the recipe docs/pipeline.md gives pandas and pyarrow users

    without_spark = ds.dataset(sink.committed_files("outcomes"), format="parquet",
                               partitioning="hive",
                               partition_base_dir=str(tmp_path / "out" / "outcomes"))  # fmt: skip
    assert sorted(without_spark.to_table().column("key").to_pylist()) == ["b0", "b1"]
    assert set(without_spark.to_table().column("batch_id").to_pylist()) == {0}
    more = sink.stage(1, {"outcomes": _frame(spark, 1, "c")}, Attempt.new(2))
    # a file left in a batch's directory by no commit (as an older release's crashed
    # attempt left them) is not read either
    stray = tmp_path / "out" / "outcomes" / "batch_id=1"
    stray.mkdir()
    (tmp_path / "out" / "_staging" / "0" / crashed["attempt"] / "outcomes").rename(stray / "x")
    assert sink.commit(1, more) is True
    assert _plain(spark, tmp_path / "out" / "outcomes") == ["b0", "b1", "c0"]


def test_a_publication_cut_short_rolls_forward(spark: Any, tmp_path: Path) -> None:
    """A crash during the publication (the file moved, its log entry and the marker
    not written): publishing the same commit again completes it, once."""
    sink = ParquetSink(str(tmp_path / "out"))
    staged = sink.stage(0, {"outcomes": _frame(spark, 3, "a")}, Attempt.new(1))
    assert sink.commit(0, staged) is True
    (tmp_path / "out" / "_batches" / "0.json").unlink()
    (tmp_path / "out" / "outcomes" / "_spark_metadata" / "0").unlink()
    assert not sink.is_committed(0)
    assert sink.commit(0, staged) is True
    assert sink.read_table(spark, "outcomes").count() == 3  # type: ignore[union-attr]
    assert _plain(spark, tmp_path / "out" / "outcomes") == ["a0", "a1", "a2"]


def test_an_older_releases_batches_stay_readable(spark: Any, tmp_path: Path) -> None:
    """An output whose first batches an older release published (its marker, no log):
    the log the first new batch starts names them, so every Spark reader keeps
    them; batches the older release did not publish are not read."""
    out = tmp_path / "out"
    spark.createDataFrame([("payment", "old0", BIG, BIG, "expired", None, 0.0, True)],
                          SCHEMA).write.parquet(str(out / "outcomes" / "batch_id=0"))  # fmt: skip
    (out / "_batches").mkdir()
    (out / "_batches" / "0.json").write_text('{"batch_id": 0, "tables": ["outcomes"]}')
    spark.createDataFrame([("payment", "crashed", BIG, BIG, "expired", None, 0.0, True)],
                          SCHEMA).write.parquet(str(out / "outcomes" / "batch_id=1"))  # fmt: skip
    sink = ParquetSink(str(out))
    staged = sink.stage(1, {"outcomes": _frame(spark, 1, "new")}, Attempt.new(1))
    assert sink.commit(1, staged) is True
    assert _plain(spark, out / "outcomes") == ["new0", "old0"]
    assert sorted(r.key for r in sink.read_table(spark, "outcomes").collect()) == ["new0", "old0"]  # type: ignore[union-attr]


def test_sqlite_sink_round_trip(spark: Any, tmp_path: Path) -> None:
    """Tables created first (Spark cannot), BIGINT read back as long, one copy per batch."""
    assert len(jdbc_jars()) == 2, "run scripts/system-deps.sh: the Debian JDBC jars are missing"
    _round_trip(spark, SqliteSink(f"jdbc:sqlite:{tmp_path / 'out.db'}"))


def test_sqlite_sink_copies_only_the_named_attempts_rows(spark: Any, tmp_path: Path) -> None:
    """Two attempts staged for one batch (a crashed or fenced one, and the one a commit
    names), in either order: the commit copies the named one's rows, and drops every
    staged row of the batch; the other's rows never reach the tables."""
    sink = SqliteSink(f"jdbc:sqlite:{tmp_path / 'out.db'}")
    named = sink.stage(0, {"outcomes": _frame(spark, 2, "b")}, Attempt.new(2))
    other = sink.stage(0, {"outcomes": _frame(spark, 3, "a")}, Attempt.new(1))
    assert named["attempt"] != other["attempt"]
    assert sink.commit(0, named) is True
    back = sink.read_table(spark, "outcomes")
    assert back is not None and sorted(r.key for r in back.collect()) == ["b0", "b1"]
    import sqlite3

    with sqlite3.connect(tmp_path / "out.db") as db:
        assert db.execute("SELECT COUNT(*) FROM stage_outcomes").fetchone() == (0,)
        row_counts = db.execute("SELECT row_counts FROM tickwheel_batches").fetchone()[0]
    assert json.loads(row_counts) == {"outcomes": 2}
    assert sink.commit(0, other) is False  # the batch is published: never a second copy
    assert sorted(r.key for r in sink.read_table(spark, "outcomes").collect()) == ["b0", "b1"]  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Any]:
    """A throw-away PostgreSQL server on 127.0.0.1 (Debian's package), stopped after."""
    from support.pgserver import ThrowawayPostgres

    with ThrowawayPostgres() as server:
        yield server


def test_postgres_sink_round_trip(spark: Any, postgres: Any) -> None:
    """Rows and the tickwheel_batches row in one transaction; a replay is a no-op."""
    sink = PostgresSink(postgres.jdbc_url, spark)
    _round_trip(spark, sink)
    assert postgres.psql("SELECT batch_id FROM tickwheel_batches ORDER BY 1").split() == ["0", "1"]
    assert postgres.psql("SELECT count(*) FROM stage_outcomes").strip() == "0"


def test_postgres_sink_commits_without_a_jvm(spark: Any, postgres: Any) -> None:
    """Spark stages the rows; a sink built without a session (pickled, as into a Spark
    Connect server's foreachBatch) commits them through pg8000, once."""
    import pickle

    staging = PostgresSink(postgres.jdbc_url, spark, prefix="nojvm_")
    committer = pickle.loads(pickle.dumps(PostgresSink(postgres.jdbc_url, prefix="nojvm_")))
    staged = staging.stage(4, {"outcomes": _frame(spark, 3, "a"), "late": _frame(spark, 0, "x")},
                           Attempt.new(1))  # fmt: skip
    assert committer.is_committed(4) is False
    assert committer.commit(4, staged) is True
    assert committer.committed_batches() == [4]

    def rows() -> list[str]:
        return postgres.psql("SELECT key FROM nojvm_outcomes ORDER BY key").split()

    assert rows() == ["a0", "a1", "a2"]
    again = staging.stage(4, {"outcomes": _frame(spark, 5, "b"), "late": _frame(spark, 0, "x")},
                          Attempt.new(2))  # fmt: skip
    assert committer.commit(4, again) is False  # a replay: no second copy, its staged rows dropped
    assert rows() == ["a0", "a1", "a2"]
    assert postgres.psql("SELECT count(*) FROM nojvm_stage_outcomes").strip() == "0"
    counts = postgres.psql("SELECT row_counts FROM nojvm_tickwheel_batches WHERE batch_id = 4")
    assert json.loads(counts) == {"late": 0, "outcomes": 3}
    back = committer.read_table(spark, "outcomes")  # Spark's JDBC reader, as before
    assert back is not None
    assert sorted(r.key for r in back.collect()) == ["a0", "a1", "a2"]


def test_make_sink_names_the_problem(spark: Any, tmp_path: Path) -> None:
    """Unknown sinks and missing URLs fail with a message naming them."""
    with pytest.raises(SinkError, match="unknown sink 'kafka'"):
        make_sink("kafka", str(tmp_path), spark)
    with pytest.raises(SinkError, match="--jdbc-url"):
        make_sink("postgresql", str(tmp_path), spark)
    with pytest.raises(SinkError, match="jdbc:sqlite:"):
        SqliteSink("sqlite:///x.db")
    with pytest.raises(SinkError, match="not staged"):
        ParquetSink(str(tmp_path / "o")).commit(7, None)


def test_descriptions_hold_no_password(spark: Any, tmp_path: Path) -> None:
    """describe() (printed at the stream's start and in its summary) redacts secrets;
    a password in a PostgreSQL URL leaves the URL for the connection properties."""
    sqlite = SqliteSink(f"jdbc:sqlite:{tmp_path / 'o.db'}?password=pw1")
    assert sqlite.describe() == f"sqlite:jdbc:sqlite:{tmp_path / 'o.db'}?password=***"
    url = "jdbc:postgresql://127.0.0.1:5432/db?user=u&password=pw2&sslpassword=pw3"
    sink = PostgresSink(url, spark)
    assert sink.url == "jdbc:postgresql://127.0.0.1:5432/db?user=u"
    assert sink.describe() == (
        "postgresql:jdbc:postgresql://127.0.0.1:5432/db?user=u (user u, password from the URL)"
    )
    with pytest.raises(SinkError) as bad:
        PostgresSink("postgres://u:pw4@host/db", spark)
    assert "pw4" not in str(bad.value)


def test_tables_known_empty_get_no_write_but_exist(spark: Any, tmp_path: Path) -> None:
    """``empty`` tables: no Spark job writes them; a database still has the table."""
    staged: list[str] = []
    parquet = ParquetSink(str(tmp_path / "pq"))
    done = parquet.stage(0, {"outcomes": _frame(spark, 2, "a"), "late": _frame(spark, 0, "x")},
                         Attempt.new(1), on_table=staged.append, empty={"late"})  # fmt: skip
    assert sorted(staged) == ["late", "outcomes"]  # the empty one is staged too: nothing
    assert parquet.commit(0, done) is True
    late = parquet.read_table(spark, "late")
    assert late is not None and late.count() == 0  # the table exists, with no row
    assert parquet.read_table(spark, "outcomes").count() == 2  # type: ignore[union-attr]
    assert len(jdbc_jars()) == 2, "run scripts/system-deps.sh: the Debian JDBC jars are missing"
    sqlite = SqliteSink(f"jdbc:sqlite:{tmp_path / 's.db'}")
    done = sqlite.stage(0, {"outcomes": _frame(spark, 2, "a"), "late": _frame(spark, 0, "x")},
                        Attempt.new(1), empty={"late"})  # fmt: skip
    assert sqlite.commit(0, done) is True
    late = sqlite.read_table(spark, "late")
    assert late is not None and late.count() == 0  # the table exists, with no row
    done = parquet.stage(1, {"late": _frame(spark, 0, "x")}, Attempt.new(1), empty={"late"})
    assert parquet.commit(1, done) is True  # nothing was written but an empty file
    assert parquet.committed_batches() == [0, 1]


@pytest.mark.connect
@pytest.mark.parametrize("in_driver", [False, True], ids=["spark-writer", "driver"])
def test_write_parquet_writes_the_same_rows_and_types_either_way(
    spark: Any, tmp_path: Path, in_driver: bool
) -> None:
    """Spark's writer (a frame) or the driver's pyarrow (an Arrow table): the same rows,
    read back with the frame's own column types (nulls, bytes and epoch-ms longs
    included); a second write into the same directory is refused, never an
    overwrite."""
    from pyspark.errors import AnalysisException

    from tickwheel.pipeline.spark.frames import write_parquet

    schema = f"{SCHEMA}, raw_bytes binary"
    rows = [
        ("payment", "k1", BIG, BIG + 1, "expired", None, 0.5, True, b"\xff\x00"),
        ("payment", None, BIG + 2, None, None, 7, None, None, None),
    ]
    frame = spark.createDataFrame(rows, schema)
    out = tmp_path / "table"
    write_parquet(frame.toArrow() if in_driver else frame, str(out))
    again = spark.createDataFrame(rows[:1], schema)
    with pytest.raises((FileExistsError, AnalysisException)):
        write_parquet(again.toArrow() if in_driver else again, str(out))
    back = spark.read.parquet(str(out))  # the types inferred from the files
    assert [(f.name, f.dataType) for f in back.schema] == [
        (f.name, f.dataType) for f in frame.schema
    ]
    assert sorted(map(tuple, back.collect()), key=repr) == sorted(
        (tuple(bytearray(v) if isinstance(v, bytes) else v for v in r) for r in rows), key=repr
    )
