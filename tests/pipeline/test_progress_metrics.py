"""Each micro-batch's figures in Spark's ``StreamingQueryProgress``, read by a listener.

``start_stream(..., progress_metrics=True)`` spools the figures and a
companion query observes them (:mod:`tickwheel.pipeline.stream.progress`).
The listener's rows are checked against the rows the sink committed for the
same batch id, the checkpoint, and the plain-Python reference.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pipeline_helpers import COLUMNS
from stream_support import feed, fresh, write_rules

from support.reference import iter_input_lines, run_reference
from tickwheel.pipeline import checkpoint_status, start_stream
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.sinks import ParquetSink
from tickwheel.pipeline.stream.checkpoint import Commit
from tickwheel.pipeline.stream.progress import (
    COUNTERS,
    GAUGES,
    OBSERVATION,
    REPORT,
    SPOOLED,
    ProgressReader,
    ProgressSpool,
    SpoolOwnerGone,
)
from tickwheel.pipeline.stream.runner import BatchRunner
from tickwheel.pipeline.stream.start import read_stream_outputs

#: Bounds every wait on a streaming query or its listener.
TIMEOUT_S = 240


def test_the_spool_gives_what_waits_in_batch_order() -> None:
    """The reader's offsets are batch ids; a read takes every figure waiting, a commit
    forgets them, a stop removes the spool."""
    spool = ProgressSpool(f"test-{time.monotonic_ns()}")
    reader = ProgressReader({"spool": spool.token})
    rows, end = reader.read(reader.initialOffset())
    assert (list(rows), end) == ([], {"batch": -1})
    for batch_id in (3, 1, 2):
        spool.write(batch_id, {"events": 10 * batch_id, "watermark": None, "ignored": 7})
    rows, end = reader.read({"batch": 1})
    assert end == {"batch": 3}
    events = SPOOLED.index("events")
    assert [(r[0], r[events]) for r in rows] == [(2, 20), (3, 30)]
    rows, _ = reader.read({"batch": -1})
    first = next(rows)
    assert first == tuple(1 if n == "batch_id" else 10 if n == "events" else None
                          for n in SPOOLED)  # fmt: skip
    assert reader.read(end)[1] == end
    assert [r[0] for r in reader.readBetweenOffsets({"batch": 0}, {"batch": 2})] == [1, 2]
    reader.commit({"batch": 2})
    assert spool.batch_ids() == [3]
    reader.stop()
    assert spool.batch_ids() == []
    assert not Path(spool.path).exists()


def _spool_in_a_process(tmp: Path, token: str, *, killed: bool) -> subprocess.Popen[bytes]:
    """A process that writes batch 0's figures to spool ``token`` in ``tmp``; then it dies by
    SIGKILL (``killed``, and is waited for) or sleeps until the caller ends it."""
    code = (
        "import os, signal, sys, time\n"
        "from tickwheel.pipeline.stream.progress import ProgressSpool\n"
        f"ProgressSpool({token!r}).write(0, {{'events': 4}})\n"
        "print('written', flush=True)\n"
        f"os.kill(os.getpid(), signal.SIGKILL) if {killed} else time.sleep(120)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline() == b"written\n"
    if killed:
        assert proc.wait(timeout=60) == -signal.SIGKILL
    return proc


def test_a_new_spool_removes_the_stale_ones_of_dead_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spool whose owner was killed is removed when the next spool is made; those of
    live owners (another process, this one) and one naming no owner are kept."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = tmp_path / "tickwheel-progress"
    live = _spool_in_a_process(tmp_path, "live", killed=False)
    try:
        _spool_in_a_process(tmp_path, "dead", killed=True)  # made after: the live one stays
        (root / "ownerless").mkdir()
        assert sorted(p.name for p in root.iterdir()) == ["dead", "live", "ownerless"]
        assert ProgressSpool("dead").owner_gone() and not ProgressSpool("live").owner_gone()
        ProgressSpool("mine").write(0, {"events": 1})
        assert sorted(p.name for p in root.iterdir()) == ["live", "mine", "ownerless"]
        assert ProgressSpool("live").batch_ids() == [0]
        assert ProgressSpool("mine").owner() == {"pid": os.getpid(), "host": os.uname().nodename}
    finally:
        live.kill()
        live.wait(timeout=60)
    ProgressSpool("next").write(0, {"events": 2})  # now the other owner is gone too
    assert sorted(p.name for p in root.iterdir()) == ["mine", "next", "ownerless"]


def test_a_companions_reader_stops_once_its_spools_owner_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader first gives what the dead owner left; then, with nothing waiting and the
    owner gone for the grace, it raises (the companion stops); a live owner's does not."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _spool_in_a_process(tmp_path, "orphan", killed=True)
    reader = ProgressReader({"spool": "orphan", "orphan_grace_s": "0"})
    rows, end = reader.read(reader.initialOffset())
    assert ([r[0] for r in rows], end) == ([0], {"batch": 0})
    reader.commit(end)
    with pytest.raises(SpoolOwnerGone, match="is gone without a clean stop"):
        reader.read(end)
    reader.stop()
    assert not (tmp_path / "tickwheel-progress" / "orphan").exists()

    _spool_in_a_process(tmp_path, "waits", killed=True)  # the default grace: not at once
    patient = ProgressReader({"spool": "waits"})
    patient.commit({"batch": 0})
    assert patient.read({"batch": 0})[1] == {"batch": 0}

    ProgressSpool("alive").write(0, {"events": 1})  # this process owns it
    keeps = ProgressReader({"spool": "alive", "orphan_grace_s": "0"})
    keeps.commit({"batch": 0})
    assert keeps.read({"batch": 0})[1] == {"batch": 0}


def test_the_runner_publishes_what_a_micro_batch_counted(tmp_path: Path) -> None:
    """``publish`` receives the batch id and the counts, warnings apart; a replay of a
    committed batch publishes nothing."""

    class Store:
        root = str(tmp_path)

        def refresh(self) -> None:
            pass

        def __init__(self) -> None:
            self.done: list[int] = []

        def is_committed(self, batch_id: int) -> bool:
            return batch_id in self.done

        def committed(self) -> list[int]:
            return self.done

        def read_commit(self, batch_id: int) -> Commit:
            return Commit(batch_id)  # the commit of a published batch: nothing to publish again

        def owns(self) -> bool:
            return True

        def prune(self, commit: Commit) -> None:
            pass

    store = Store()
    published: list[tuple[int, dict[str, Any]]] = []

    def process(frame: Any, batch_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
        store.done.append(batch_id)
        return {}, {"events": 5, "expired": 2, "watermark": 1000, "warnings": ["w"]}

    published_sink = SimpleNamespace(is_committed=lambda _batch_id: True)
    runner = BatchRunner(store, published_sink, process,  # type: ignore[arg-type]
                         publish=lambda b, counts: published.append((b, dict(counts))))  # fmt: skip
    runner(None, 0)  # type: ignore[arg-type]
    runner(None, 0)  # type: ignore[arg-type]
    assert published == [(0, {"events": 5, "expired": 2, "watermark": 1000})]


def test_a_spool_that_cannot_be_written_does_not_stop_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The figures are for watching: a full or unwritable temporary directory gives a
    warning, and the micro-batch (committed already) stands."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setattr(tempfile, "tempdir", str(blocker))
    spool = ProgressSpool("unwritable")
    done: list[int] = []

    class Store:
        root = str(tmp_path)

        def refresh(self) -> None:
            pass

        def is_committed(self, batch_id: int) -> bool:
            return False

        def committed(self) -> list[int]:
            return []

    def process(frame: Any, batch_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
        done.append(batch_id)
        return {}, {"events": 1, "watermark": 5, "warnings": []}

    runner = BatchRunner(Store(), None, process, spool.write)  # type: ignore[arg-type]
    runner(None, 4)  # type: ignore[arg-type]
    assert done == [4] and runner.batches_run == 1
    assert "batch 4: warning: its figures were not published" in caplog.text
    assert all(r.levelname == "WARNING" for r in caplog.records if "figures" in r.getMessage())


class FiguresListener:
    """Collects the ``tickwheel`` reports of the companions, checking each adds up."""

    def __init__(self) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        self.reports: list[dict[str, Any]] = []
        self.seen = threading.Condition()
        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                row = event.progress.observedMetrics.get(OBSERVATION)
                if row is not None:
                    with outer.seen:
                        outer.reports.append(row.asDict(recursive=True))
                        outer.seen.notify_all()

        self.listener = Listener()

    def micro_batches(self, query_id: str, batches: int) -> dict[int, dict[str, Any]]:
        """The figures of ``batches`` micro-batches of ``query_id``, by batch id, once
        that many were reported (or the timeout passed)."""
        deadline = time.monotonic() + TIMEOUT_S
        with self.seen:
            while True:
                mine = [r for r in self.reports if r["query_id"] == query_id]
                by_batch = {m["batch_id"]: m for r in mine for m in r["micro_batches"]}
                left = deadline - time.monotonic()
                if len(by_batch) >= batches or left <= 0:
                    break
                self.seen.wait(left)
        for report in mine:  # each report: the sums and the last micro-batch's gauges
            assert set(report) == set(REPORT)
            covered = sorted(report["micro_batches"], key=lambda m: m["batch_id"])
            assert report["batches"] == len(covered)
            if not covered:  # the companion's first micro-batch, which read nothing
                assert {report[name] for name in (*COUNTERS, *GAUGES)} == {None}
                continue
            assert report["batch_id"] == covered[-1]["batch_id"]
            for name in COUNTERS:
                assert report[name] == sum(m[name] for m in covered), (name, report)
            for name in GAUGES:
                assert report[name] == covered[-1][name], (name, report)
        return by_batch


def _per_batch(frame: Any, column: str) -> Counter[tuple[int, str]]:
    return Counter((r["batch_id"], r[column]) for r in frame.select("batch_id", column).collect())


@pytest.mark.spark
@pytest.mark.connect
def test_a_listener_reads_each_micro_batchs_figures(spark: Any, tmp_path: Path) -> None:
    """Four micro-batches of orders: each one's events, outcomes, rejects and pending
    operations, as Spark's progress carries them, are what it committed."""
    gen = tmp_path / "gen"
    generate_orders(300, gen, seed=5, files=8, mean_gap_ms=20_000)
    rules_path = write_rules(tmp_path / "rules.toml")
    ref = run_reference(iter_input_lines(gen), load_rules(rules_path))
    feed(sorted(gen.glob("part-*.jsonl")), fresh(tmp_path / "in"), 4)

    figures = FiguresListener()
    spark.streams.addListener(figures.listener)
    try:
        records = spark.readStream.option("maxFilesPerTrigger", 1).text(str(tmp_path / "in"))
        query = start_stream(records, rules_path, output=str(tmp_path / "out"),
                             checkpoint=str(tmp_path / "ck"), trigger="available-now",
                             progress_metrics=True)  # fmt: skip
        assert query.awaitTermination(TIMEOUT_S), "the query did not finish in time"
        assert query.exception() is None, query.exception()
        by_batch = figures.micro_batches(str(query.id), 4)
    finally:
        spark.streams.removeListener(figures.listener)

    assert sorted(by_batch) == [0, 1, 2, 3]
    assert all(set(row) == set(SPOOLED) for row in by_batch.values())
    outs = read_stream_outputs(spark, ParquetSink(str(tmp_path / "out")), str(tmp_path / "ck"))
    final = outs["outcomes"].where("outcome != 'pending'")
    outcomes = _per_batch(final, "outcome")
    rejected = Counter(r["batch_id"] for r in outs["rejected"].select("batch_id").collect())
    for batch_id, row in by_batch.items():
        for outcome in ("completed", "expired", "cancelled"):
            assert row[outcome] == outcomes[(batch_id, outcome)], (batch_id, outcome, row)
        assert row["rejected"] == rejected[batch_id], (batch_id, row)
    # Across the batches, what the reference gives for the whole input.
    ref_outcomes = Counter(r[COLUMNS["outcomes"].index("outcome")] for r in ref.outcomes)
    for outcome in ("completed", "expired", "cancelled"):
        assert sum(r[outcome] for r in by_batch.values()) == ref_outcomes[outcome]
    status = checkpoint_status(str(tmp_path / "ck"))
    assert by_batch[3]["pending"] == status["pending"]["total"] == ref_outcomes["pending"]
    assert by_batch[3]["watermark"] == status["watermark"]
    assert sum(r["events"] for r in by_batch.values()) > 0
    assert [r["watermark"] for r in by_batch.values()] == sorted(
        r["watermark"] for r in by_batch.values()
    )

    # The companion stops once it has read what the query left.
    deadline = time.monotonic() + TIMEOUT_S
    name = f"tickwheel progress of {query.id}"
    while any(q.name == name for q in spark.streams.active) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(q.name == name for q in spark.streams.active)


@pytest.mark.spark
def test_the_command_lines_job_reports_to_listeners_and_stops_its_companion(
    spark: Any, tmp_path: Path
) -> None:
    """``tickwheel pipeline stream --progress-metrics``: the listener's figures add up
    to the run's summary, and the companion has stopped when the job returns."""
    from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig

    gen = tmp_path / "gen"
    generate_orders(150, gen, seed=7, files=3, mean_gap_ms=20_000)
    rules_path = write_rules(tmp_path / "rules.toml")
    feed(sorted(gen.glob("part-*.jsonl")), fresh(tmp_path / "in"), 3)
    config = StreamConfig(
        rules_path=str(rules_path), input=str(tmp_path / "in"), output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"), max_files_per_trigger=1,
        progress_metrics=True,
    )  # fmt: skip
    figures = FiguresListener()
    spark.streams.addListener(figures.listener)
    try:
        with FileStreamJob(config, spark=spark) as job:
            summary = job.run()
        assert not [q.name for q in spark.streams.active]
        query_ids = {r["query_id"] for r in figures.reports}
        assert len(query_ids) == 1, query_ids
        by_batch = figures.micro_batches(query_ids.pop(), 3)
    finally:
        spark.streams.removeListener(figures.listener)
    assert sorted(by_batch) == [0, 1, 2]
    for name in ("events", "duplicates", "late", "completed", "expired", "cancelled"):
        assert sum(r[name] for r in by_batch.values()) == summary[name], name
    for name in GAUGES:  # not summed: the last micro-batch's
        assert by_batch[2][name] == summary[name], name
    assert summary["expired"] > 0 and summary["completed"] > 0
