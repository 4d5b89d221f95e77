"""PyFlink's peer of the stream benchmark reads the rules and the records as tickwheel does.

``benchmarks/peer_pyflink.py`` runs in an environment of its own (``make
bench-env-pyflink``), which neither ``.venv`` nor CI has: its rules reader and
its record parser import no PyFlink, and are checked here against tickwheel's.
Where that environment exists, the program itself runs once on a few orders,
and every key with one creation and one payment is completed at the payment.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.rules import load_rules

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
PYFLINK_PYTHON = ROOT / ".venvs" / "pyflink" / "bin" / "python"


def _peer() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("peer_pyflink")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_rules_file_reads_as_tickwheel_reads_it(tmp_path: Path) -> None:
    peer = _peer()
    text = (ROOT / "examples" / "orders.toml").read_text(encoding="utf-8")
    path = tmp_path / "rules.toml"
    path.write_text(text.replace('allowed_lateness = "0"', 'allowed_lateness = "3m"'))
    ours, theirs = load_rules(path), peer.read_rule(path)
    rule = ours.rules[0]
    assert (theirs.name, theirs.key, theirs.timeout_ms) == (rule.name, rule.key, rule.timeout_ms)
    assert (theirs.open, theirs.complete, theirs.cancel) == (
        tuple(rule.open), tuple(rule.complete), tuple(rule.cancel))  # fmt: skip
    assert theirs.lateness_ms == ours.input.allowed_lateness_ms == 180_000
    fields = (theirs.id_field, theirs.type_field, theirs.time_field, theirs.seq_field)
    assert fields == (ours.input.id, ours.input.type, ours.input.time, ours.input.sequence)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (1704067200000, 1704067200000),
        ("1704067200000", 1704067200000),
        ("2024-01-01T00:00:00Z", 1704067200000),
        ("2024-01-01T02:00:00.1239+02:00", 1704067200123),  # truncated to the millisecond
        ("2023-12-31T18:30:00.5-05:30", 1704067200500),
        ("2024-01-01T00:00:00", None),  # no offset
        ("yesterday", None),
        (True, None),
        (1.5, None),
    ],
)
def test_times_parse_as_tickwheel_parses_them(value: object, ms: int | None) -> None:
    assert _peer()._event_ms(value) == ms


def test_the_generated_records_parse_to_their_fields(tmp_path: Path) -> None:
    """Every well-formed generated record gives its event; the malformed ones give none."""
    peer = _peer()
    generate_orders(3_000, tmp_path / "in", seed=3, files=1)
    parse = peer.parse_events(peer.read_rule(ROOT / "examples" / "orders.toml"))
    lines = (tmp_path / "in" / "part-00000.jsonl").read_text(encoding="utf-8").splitlines()
    events = [event for line in lines for event in parse(line)]
    malformed = [line for line in lines if not line.startswith('{"event_id":"e')]
    assert malformed and len(events) == len(lines) - len(malformed)
    record = json.loads(lines[0])
    assert events[0][0] == record["order_id"] and events[0][3] == record["event_id"]


@pytest.mark.jvm_process
@pytest.mark.skipif(
    not PYFLINK_PYTHON.exists(), reason="no PyFlink environment (make bench-env-pyflink)"
)
@pytest.mark.timeout(600)
def test_the_program_completes_each_paid_order(tmp_path: Path) -> None:
    generate_orders(600, tmp_path / "gen", seed=5, files=3)
    inp = tmp_path / "in"
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _stream_inputs import feed, lateness_rules
    finally:
        sys.path.remove(str(BENCHMARKS))
    feed(sorted((tmp_path / "gen").glob("part-*.jsonl")), inp)
    rules = lateness_rules(tmp_path / "rules.toml")
    done = subprocess.run(
        [str(PYFLINK_PYTHON), str(BENCHMARKS / "peer_pyflink.py"), "--input", str(inp),
         "--output", str(tmp_path / "out"), "--rules", str(rules)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("pyflink: 3 files")
    outcomes: dict[str, list[dict[str, object]]] = {}
    for part in (tmp_path / "out").glob("*.jsonl"):
        for line in part.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            outcomes.setdefault(str(row["key"]), []).append(row)
    events: dict[str, list[dict[str, object]]] = {}
    for part in inp.iterdir():
        for line in part.read_text(encoding="utf-8").splitlines():
            if line.startswith('{"event_id":"e'):
                record = json.loads(line)
                events.setdefault(record["order_id"], []).append(record)
    simple = {
        key: sorted(records, key=lambda r: r["type"] != "created")
        for key, records in events.items()
        if [r["type"] for r in records].count("created") == 1
        and [r["type"] for r in records].count("paid") == 1
        and len({r["event_id"] for r in records}) == len(records) == 2
        and all(isinstance(r["ts"], int) for r in records)
        and 0 < records[1]["ts"] - records[0]["ts"] < 30 * 60_000
    }
    assert len(simple) > 50
    for key, (created, paid) in simple.items():
        row = {"key": key, "opened_at": created["ts"], "deadline": created["ts"] + 30 * 60_000,
               "outcome": "completed", "resolved_at": paid["ts"]}  # fmt: skip
        assert outcomes.get(key) == [row]
