"""A plain-Python reference of the pipeline's semantics, for tests and benchmarks.

Written to be obviously right rather than fast, and independently of
:mod:`tickwheel.pipeline.core` and the Spark job: no timing wheel, no purgatory,
just lists, sorting and one loop per (rule, key). It reads JSON Lines.

The semantics (see ``docs/pipeline.md``):

1. a record that is not a JSON object, misses a field or has a bad time or
   sequence, or a time after the far-future limit, is rejected with its raw
   text and a reason (``raw_bytes`` is always None here: the reference reads
   valid UTF-8 text);
2. records are deduplicated by event id; the kept record is the smallest
   (time, sequence, raw text); copies with the same content are duplicates,
   copies with other content are rejected as ``conflict``;
3. per (rule, key), events apply in (time, sequence, event id) order;
4. an open event opens an operation with deadline = time + timeout; a complete
   (cancel) event completes (cancels) every pending operation of its key; an
   operation still pending at its deadline expires, before any event stamped at
   the deadline is applied;
5. a complete or cancel event that finds nothing pending is unmatched:
   ``after_expiry`` when the key's last resolved operation expired, at a time
   ``e`` with ``event time < e + retention`` (``[input].retention``; any time
   with retention off), else ``no_operation``;
6. the watermark is the largest kept event time minus the allowed lateness;
   events above it are buffered (not applied), operations due at or before it
   are final, the others are ``pending``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tickwheel.pipeline.rules import DEFAULT_RETENTION_MS, Rules

__all__ = ["ReferenceResult", "iter_input_lines", "run_reference"]

MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_INT = re.compile(r"^-?[0-9]+$")
_ISO = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
)
_DECODER = json.JSONDecoder()
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass
class ReferenceResult:
    """Rows of every output, as sorted lists of tuples, and the counts."""

    outcomes: list[tuple[Any, ...]] = field(default_factory=list)
    unmatched: list[tuple[Any, ...]] = field(default_factory=list)
    rejected: list[tuple[Any, ...]] = field(default_factory=list)
    buffered: list[tuple[Any, ...]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    watermark: int | None = None


def iter_input_lines(path: str | Path) -> list[str]:
    """Every line of every ``*.json``/``*.jsonl`` file under ``path`` (or the file itself)."""
    path = Path(path)
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    )
    lines: list[str] = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        lines.extend(text.split("\n"))
    return lines


def _text(value: Any) -> str | None:
    """A JSON value as Spark reads it into a string column (for the values we produce)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def _time_ms(text: str) -> int | None:
    if _INT.match(text):
        value = int(text)
    elif _ISO.match(text):
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        value = (when - _EPOCH) // dt.timedelta(milliseconds=1)
    else:
        return None
    return value if 0 <= value <= MAX_TIME_MS else None


def run_reference(
    lines: Iterable[str], rules: Rules, max_time_ms: int | None = None
) -> ReferenceResult:
    """Apply the semantics to raw JSON Lines ``lines``; return every output, sorted.

    ``max_time_ms`` is the far-future guard's limit (None: no guard).
    """
    cfg = rules.input
    key_fields = rules.key_fields
    result = ReferenceResult()
    counts: Counter[str] = Counter()
    # 1. parse and validate
    valid: list[
        tuple[str, str, int, int, str, tuple[str | None, ...]]
    ] = []  # id,type,time,seq,raw,keys
    for raw in lines:
        if raw.endswith("\r"):
            raw = raw[:-1]
        if not raw.strip():
            continue
        counts["records"] += 1
        try:  # like Spark's from_json: leading blanks and trailing text are ignored
            obj, _end = _DECODER.raw_decode(raw.lstrip())
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            result.rejected.append((None, "malformed", raw, None))
            continue
        event_id = _text(obj.get(cfg.id))
        event_type = _text(obj.get(cfg.type))
        time_text = _text(obj.get(cfg.time))
        keys = tuple(_text(obj.get(name)) for name in key_fields)
        reason = None
        needed = [
            r.key
            for r in rules.rules
            if event_type is not None and r.kind_of(event_type) is not None
        ]
        if not event_id:
            reason = f"missing_field:{cfg.id}"
        elif not event_type:
            reason = f"missing_field:{cfg.type}"
        elif not time_text:
            reason = f"missing_field:{cfg.time}"
        else:
            for name, value in zip(key_fields, keys, strict=True):
                if name in needed and not value:
                    reason = f"missing_field:{name}"
                    break
        time = None
        seq = 0
        if reason is None:
            assert time_text is not None
            time = _time_ms(time_text)
            if time is None:
                reason = "bad_time"
            elif max_time_ms is not None and time > max_time_ms:
                reason = "far_future"
        if reason is None and cfg.sequence is not None:
            seq_text = _text(obj.get(cfg.sequence))
            if seq_text:
                if _INT.match(seq_text) and -(2**63) <= int(seq_text) < 2**63:
                    seq = int(seq_text)
                else:
                    reason = "bad_sequence"
        if reason is not None:
            result.rejected.append((event_id or None, reason, raw, None))
            continue
        assert event_id is not None and event_type is not None and time is not None
        valid.append((event_id, event_type, time, seq, raw, keys))
    # 2. deduplicate
    by_id: dict[str, list[tuple[str, str, int, int, str, tuple[str | None, ...]]]] = defaultdict(
        list
    )
    for record in valid:
        by_id[record[0]].append(record)
    kept = []
    for event_id, group in by_id.items():
        group.sort(key=lambda r: (r[2], r[3], r[4]))
        first = group[0]
        kept.append(first)
        for other in group[1:]:
            if (other[1], other[2], other[3], other[5]) == (first[1], first[2], first[3], first[5]):
                counts["duplicates"] += 1
            else:
                counts["conflicts"] += 1
                result.rejected.append((event_id, "conflict", other[4], None))
    counts["events"] = len(kept)
    if kept:
        result.watermark = max(r[2] for r in kept) - cfg.allowed_lateness_ms
    watermark = result.watermark
    # 3. per (rule, key), in (time, seq, id) order
    streams: dict[tuple[str, str], list[tuple[int, int, str, str, int]]] = defaultdict(list)
    for event_id, event_type, time, seq, _raw, keys in kept:
        used = False
        for rule in rules.rules:
            kind = rule.kind_of(event_type)
            if kind is not None:
                used = True
                key = keys[key_fields.index(rule.key)]
                assert key is not None
                streams[(rule.name, key)].append((time, seq, event_id, event_type, kind))
        if not used:
            counts["ignored"] += 1
    timeouts = {rule.name: rule.timeout_ms for rule in rules.rules}
    if watermark is not None:
        outcomes, unmatched, buffered = simulate(
            streams, timeouts, watermark, retention_ms=cfg.retention_ms
        )
        result.outcomes.extend(outcomes)
        result.unmatched.extend(unmatched)
        result.buffered.extend(buffered)
    counts["rejected"] = len(result.rejected)
    counts["buffered"] = len(result.buffered)
    counts["unmatched"] = len(result.unmatched)
    for row in result.outcomes:
        counts[f"outcome_{row[5]}"] += 1
    result.counts = dict(counts)
    result.outcomes.sort(key=_sort_key)
    result.unmatched.sort(key=_sort_key)
    result.rejected.sort(key=_sort_key)
    result.buffered.sort(key=_sort_key)
    return result


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is not None, v) for v in row)


def simulate(
    streams: dict[tuple[str, str], list[tuple[int, int, str, str, int]]],
    timeouts: dict[str, int],
    watermark: int,
    retention_ms: int | None = DEFAULT_RETENTION_MS,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Semantics 3 to 6 for each (rule, key) stream of ``(time, seq, id, type, kind)`` events.

    ``retention_ms`` None is retention off. Returns (outcomes, unmatched,
    buffered) rows, unsorted. O(events × pending).
    """
    outcomes: list[tuple[Any, ...]] = []
    unmatched: list[tuple[Any, ...]] = []
    buffered: list[tuple[Any, ...]] = []
    for (rule_name, key), stream in streams.items():
        timeout = timeouts[rule_name]
        pending: list[tuple[str, int, int]] = []  # op_id, opened_at, deadline
        last_expired: int | None = None  # when the last resolved operation expired
        for time, seq, event_id, event_type, kind in [*sorted(stream), (None, 0, "", "", -1)]:
            now = watermark if time is None or time > watermark else time
            # operations due at or before now expire first, with resolved_at = deadline
            for op_id, opened, deadline in pending:
                if deadline <= now:
                    outcomes.append(
                        (
                            rule_name,
                            key,
                            op_id,
                            opened,
                            deadline,
                            "expired",
                            deadline,
                            timeout,
                            None,
                        )
                    )
                    last_expired = deadline
            pending = [op for op in pending if op[2] > now]
            if time is None:
                break
            if time > watermark:
                buffered.append((rule_name, key, event_id, event_type, time, seq))
            elif kind == 0:
                pending.append((event_id, time, time + timeout))
            elif pending:
                outcome = "completed" if kind == 1 else "cancelled"
                for op_id, opened, deadline in pending:
                    outcomes.append(
                        (
                            rule_name,
                            key,
                            op_id,
                            opened,
                            deadline,
                            outcome,
                            time,
                            time - opened,
                            event_id,
                        )
                    )
                pending = []
                last_expired = None
            else:
                held = last_expired is not None and (
                    retention_ms is None or time < last_expired + retention_ms
                )
                reason = "after_expiry" if held else "no_operation"
                unmatched.append((rule_name, key, event_id, event_type, time, reason))
        for op_id, opened, deadline in pending:
            outcomes.append((rule_name, key, op_id, opened, deadline, "pending", None, None, None))
    return outcomes, unmatched, buffered
