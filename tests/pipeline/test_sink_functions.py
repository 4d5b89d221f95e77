"""``start_stream(..., sink=fn)``: a function of the user's as the sink, Spark's way.

The two examples of ``examples/stream_sinks.py`` run in a job of their own,
killed after the function wrote micro-batch 1 and before the checkpoint
committed it, then started again: Spark replays batch 1, the function gets
the same rows, and

* the table keyed by batch id holds exactly the rows the built-in Parquet
  sink commits (the replay replaced its partition);
* the topic holds batch 1 twice, and the consumer's first copies are exactly
  those rows.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from stream_support import (
    OUTCOME_COLS,
    feed,
    fresh,
    rows,
    sort_key,
    subprocess_env,
    write_rules,
)

from tickwheel.pipeline import start_stream
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.sinks import FunctionSink, ParquetSink, SinkError, as_sink

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

JOB = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from stream_sinks import append_to_topic, replace_batch_partition
    from tickwheel.pipeline import start_stream
    from tickwheel.pipeline.spark.class_archive import find
    from tickwheel.pipeline.spark.session import create_session

    inbox, rules, out, ck = sys.argv[2:6]

    class FileProducer:
        '''A producer appending (key, value) records to one file, as a topic's log.'''

        def __init__(self, path):
            self.path = path

        def send(self, topic, value, key):
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"topic": topic, "key": key.decode(),
                                     "value": value.decode()}) + "\\n")

        def flush(self):
            pass

    # Both examples in one job: each gets every micro-batch, the replay included.
    os.makedirs(out, exist_ok=True)
    to_table = replace_batch_partition(os.path.join(out, "table"))
    to_topic = append_to_topic(FileProducer(os.path.join(out, "topic.log")), "unpaid")

    def sink(tables, batch_id):
        to_table(tables, batch_id)
        to_topic(tables, batch_id)

    spark = create_session("local[2]", app_name="sink-function-job", class_archive=find())
    records = spark.readStream.option("maxFilesPerTrigger", 1).text(inbox)
    query = start_stream(records, rules, checkpoint=ck, sink=sink, trigger="available-now")
    query.awaitTermination()
    spark.stop()
    """
)


@pytest.fixture(scope="module")
def stream_input(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three files of generated orders (three micro-batches) and the rules."""
    base = tmp_path_factory.mktemp("sink-functions")
    gen = base / "gen"
    generate_orders(200, gen, seed=21, files=3, mean_gap_ms=20_000)
    feed(sorted(gen.glob("part-*.jsonl")), fresh(base / "in"), 3)
    (base / "job.py").write_text(JOB, encoding="utf-8")
    return {"base": base, "in": base / "in", "rules": write_rules(base / "rules.toml")}


@pytest.fixture(scope="module")
def committed_outcomes(spark: Any, stream_input: dict[str, Path]) -> list[tuple[Any, ...]]:
    """The outcomes (with their batch id) the built-in Parquet sink commits."""
    base = stream_input["base"]
    records = spark.readStream.option("maxFilesPerTrigger", 1).text(str(stream_input["in"]))
    query = start_stream(records, stream_input["rules"], output=str(base / "parquet"),
                         checkpoint=str(base / "parquet-ck"), trigger="available-now")  # fmt: skip
    assert query.awaitTermination(300), "the query did not finish in time"
    sink = ParquetSink(str(base / "parquet"))
    assert sink.committed_batches() == [0, 1, 2]
    outcomes = rows(sink.read_table(spark, "outcomes"), [*OUTCOME_COLS, "batch_id"])
    assert {row[-1] for row in outcomes} == {0, 1, 2}  # every batch resolves operations
    return outcomes


@pytest.fixture(scope="module")
def function_outputs(stream_input: dict[str, Path]) -> Path:
    """The job with both example sinks: killed after its function wrote micro-batch 1
    and before the checkpoint committed it, then run again to the end."""
    _job(stream_input, "after_state:1")
    return _job(stream_input, None)


def _job(stream_input: dict[str, Path], fault: str | None) -> Path:
    base = stream_input["base"]
    out, ck = base / "function-out", base / "function-ck"
    proc = subprocess.run(
        [sys.executable, str(base / "job.py"), str(EXAMPLES), str(stream_input["in"]),
         str(stream_input["rules"]), str(out), str(ck)],
        env=subprocess_env(fault), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if fault is None:
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        assert f"SIGKILL at {fault.replace(':', ' of batch ')}" in proc.stderr
    return out


@pytest.mark.jvm_process
def test_a_table_keyed_by_batch_id_holds_each_batch_once(
    spark: Any, function_outputs: Path, committed_outcomes: list[tuple[Any, ...]]
) -> None:
    out = function_outputs / "table"
    table = spark.read.parquet(str(out / "outcomes"))
    assert rows(table, [*OUTCOME_COLS, "batch_id"]) == committed_outcomes
    assert sorted(p.name for p in (out / "outcomes").glob("batch_id=*")) == [
        "batch_id=0", "batch_id=1", "batch_id=2"
    ]  # fmt: skip


@pytest.mark.jvm_process
def test_a_topic_gets_a_replayed_batch_twice_and_its_consumer_keeps_one(
    function_outputs: Path, committed_outcomes: list[tuple[Any, ...]]
) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from stream_sinks import first_copies
    finally:
        sys.path.remove(str(EXAMPLES))
    log = [json.loads(line) for line in (function_outputs / "topic.log").read_text().splitlines()]
    records = [json.loads(entry["value"]) for entry in log]
    batch_1 = [r for r in records if r["batch_id"] == 1]
    assert batch_1 and len(batch_1) == 2 * sum(1 for r in committed_outcomes if r[-1] == 1)
    kept = first_copies(records)
    got = sorted((tuple(r[c] for c in [*OUTCOME_COLS, "batch_id"]) for r in kept), key=sort_key)
    assert got == committed_outcomes
    assert all(
        e["key"] == f"{r['rule']}/{r['key']}/{r['op_id']}"
        for e, r in zip(log, records, strict=True)
    )


def test_a_sink_is_a_batch_sink_or_a_callable() -> None:
    parquet = ParquetSink.__new__(ParquetSink)
    assert as_sink(parquet) is parquet
    wrapped = as_sink(print)
    assert isinstance(wrapped, FunctionSink) and wrapped.describe() == "function:print"
    with pytest.raises(SinkError, match="a sink function must be callable, got 42"):
        as_sink(42)  # type: ignore[arg-type]


def test_the_docs_show_the_examples_as_they_run() -> None:
    """What ``docs/pipeline.md`` shows under "Your own sink" is the example's code.

    A function shown in full is the example's text; a function named in the
    prose is one the example defines.
    """
    docs = (EXAMPLES.parent / "docs" / "pipeline.md").read_text(encoding="utf-8")
    section = docs.split("### Your own sink", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    source = (EXAMPLES / "stream_sinks.py").read_text(encoding="utf-8")
    shown = [block for block in blocks if block.startswith("def ")]
    assert shown, "the section shows no sink function"
    for block in shown:
        assert block in source, block.splitlines()[0]
    prose = re.sub(r"```.*?```", "", section, flags=re.DOTALL)
    named = set(re.findall(r"`([a-z_]+)\(", prose)) | set(re.findall(r"\(`([a-z_]+)`\)", prose))
    defined = set(re.findall(r"^def ([a-z_]+)\(", source, re.MULTILINE))
    assert {"append_to_topic", "first_copies"} <= named
    assert named <= defined | {"fn"}, named - defined
