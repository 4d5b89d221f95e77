"""Retention in the stream: the carried ``ops`` state stops growing, and the rows stay exact.

30 increments of generated orders at a constant rate (a few hundred records
each, about 2.7 minutes of event time), a 2-minute timeout and a 5-minute
retention: the expiry markers of the keys whose last operation expired would
pile up without retention; with it, the ``ops`` rows of every committed state
stay within the operations opened within timeout + retention before its
watermark, and the outputs equal the reference's (which applies the same rule
on event time). ``benchmarks/bench_pipeline_retention.py`` prints the counts
of such a run next to those of a run without retention.
"""

from __future__ import annotations

import bisect
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from stream_support import ORDERS_TOML, compare_with_reference, feed

from support.reference import iter_input_lines, run_reference
from support.state_rows import record_ops_rows
from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules
from tickwheel.pipeline.stream.file_job import FileStreamJob, StreamConfig
from tickwheel.pipeline.stream.start import read_stream_outputs

pytestmark = pytest.mark.spark

INCREMENTS = 30
TIMEOUT_MS = 2 * 60_000
RETENTION_MS = 5 * 60_000


def _rules(path: Path) -> Path:
    text = ORDERS_TOML.read_text(encoding="utf-8")
    for old, new in (
        ('allowed_lateness = "0"', 'allowed_lateness = "3m"\nretention = "5m"'),
        ('timeout = "30m"', 'timeout = "2m"'),
    ):
        assert old in text
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)  # 30 micro-batches on a shared local[2] session
def test_ops_state_stays_flat_with_retention(spark: Any, tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    # One file more than fed: the generator's last file holds the long-delayed
    # payments of its last orders, a 40-minute jump of the watermark.
    generate_orders(
        5000, gen, seed=28, files=INCREMENTS + 1, timeout_ms=TIMEOUT_MS, mean_gap_ms=1000
    )
    files = sorted(gen.glob("part-*.jsonl"))[:INCREMENTS]
    rules_path = _rules(tmp_path / "rules.toml")
    rules = load_rules(rules_path)
    assert rules.input.retention_ms == RETENTION_MS
    lines = [line for file in files for line in iter_input_lines(file)]
    ref = run_reference(lines, rules)
    # The data exercise the rule: some late payments are after_expiry, others
    # come after the retention and are no_operation (after_expiry without it).
    keep_all = run_reference(
        lines, dataclasses.replace(rules, input=dataclasses.replace(rules.input, retention_ms=None))
    )
    reasons = {row[2]: row[5] for row in ref.unmatched}
    changed = [r for r in keep_all.unmatched if reasons[r[2]] != r[5]]
    assert changed and {r[5] for r in changed} == {"after_expiry"}
    assert "after_expiry" in reasons.values()

    feed(files, tmp_path / "in", INCREMENTS)
    config = StreamConfig(
        rules_path=str(rules_path),
        input=str(tmp_path / "in"),
        output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        partitions=2,
        max_files_per_trigger=1,
    )
    seen: list[tuple[int, int]] = []
    with FileStreamJob(config, spark=spark) as job:
        record_ops_rows(job, seen)
        summary = job.run()
        assert job.sink is not None
        outputs = read_stream_outputs(spark, job.sink, config.checkpoint)
    assert summary["batches_run"] == INCREMENTS
    compare_with_reference(outputs, ref)

    # Each state holds at most the operations opened within timeout + retention
    # before its watermark: the pending ones and one marker per expired key.
    opens = sorted(row[3] for row in ref.outcomes)
    window = TIMEOUT_MS + RETENTION_MS
    bounds = [
        bisect.bisect_right(opens, w) - bisect.bisect_right(opens, w - window) for w, _ in seen
    ]
    counts = [rows for _, rows in seen]
    assert all(n <= bound for n, bound in zip(counts, bounds, strict=True)), (counts, bounds)
    # Flat after the first window (timeout + retention + lateness: about four
    # increments): the last twenty within a Poisson wobble of increments 4 to 9,
    # while the markers a run without retention would carry kept growing.
    assert max(counts[10:]) <= 1.2 * max(counts[4:10]), counts
    assert counts[-1] * 5 < _markers_kept_without_retention(keep_all), counts


def _markers_kept_without_retention(result: Any) -> int:
    """Keys whose last final outcome is an expiry: the markers kept with retention off."""
    last: dict[tuple[str, str], str] = {}
    final = [row for row in result.outcomes if row[6] is not None]
    for rule, key, *_, outcome, _resolved_at, _latency, _by in sorted(final, key=lambda r: r[6]):
        last[(rule, key)] = outcome
    return sum(1 for outcome in last.values() if outcome == "expired")
