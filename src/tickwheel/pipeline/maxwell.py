"""Maxwell's binlog JSON (MySQL change data capture) → the pipeline's events.

A Maxwell record looks like (seed 004)::

    {"database": "shop", "table": "orders", "type": "update", "ts": 1767225600,
     "xid": 9134, "xoffset": 0, "data": {"id": 42, "status": "paid"},
     "old": {"status": "created"}}

A rule says how its table's row changes become events, in a ``maxwell`` table
of the rules TOML::

    [rules.unpaid_orders.maxwell]
    database = "shop"
    table = "orders"
    primary_key = "id"                 # the event key
    [rules.unpaid_orders.maxwell.events]
    created = "insert"                 # any insert
    paid = "status: created -> paid"   # an update moving status from created to paid
    cancelled = "status: * -> cancelled"

Event-type grammar (first match in file order wins; a row change that matches
nothing is not an event and is only counted):

* ``insert`` / ``update`` / ``delete`` — any change of that kind;
* ``insert: COL = V`` (or update/delete) — that kind, where the row's COL is V;
* ``COL: A -> B`` — an update that changed COL from A to B (``*`` for any A);
* ``COL = V`` — an insert with COL = V, or an update that set COL to V.

The normalized event: key = ``data[primary_key]``; event time = ``ts`` seconds ×
1000 (``ts_ms`` when present); sequence = ``xid * 2**20 + xoffset``, so within a
key the pipeline's (time, sequence, id) order is the binlog order (ts, xid,
xoffset) and an update never overtakes its insert; event id =
``db.table/key@xid:xoffset/type``, so a record Maxwell's producer sent twice is a
duplicate. Records that are not JSON, or miss ``database``, ``table``, ``type``,
``ts``, ``xid``, ``data`` or the primary key, are rejected with a reason.
Everything is done with Spark's own functions (no Python row loops).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "EVENT_COLUMNS",
    "MaxwellError",
    "MaxwellMapping",
    "MaxwellSpec",
    "load_maxwell_specs",
    "maxwell_events",
    "maxwell_records",
    "parse_event_spec",
    "split_maxwell_tables",
]

#: Columns of the normalized event frame :func:`maxwell_events` returns.
EVENT_COLUMNS = ("key", "event_type", "event_time", "event_id", "seq", "raw")

_KINDS = ("insert", "update", "delete")
_XOFFSET_BITS = 20
_KIND_RE = re.compile(r"^(insert|update|delete)(?:\s*:\s*(\w+)\s*=\s*(.+?))?$")
_TRANSITION_RE = re.compile(r"^(\w+)\s*:\s*(.+?)\s*->\s*(.+?)$")
_VALUE_RE = re.compile(r"^(\w+)\s*=\s*(.+?)$")


class MaxwellError(ValueError):
    """A Maxwell mapping in the rules file is malformed."""


@dataclass(frozen=True, slots=True)
class MaxwellMapping:
    """One event type and the row-change pattern that produces it."""

    event_type: str
    kind: str | None  # insert/update/delete, or None for any of insert/update
    column: str | None = None
    before: str | None = None  # None: no condition; "*": any previous value
    after: str | None = None
    transition: bool = False

    def condition(self) -> Column:
        """The Spark condition selecting the matching row changes. O(1)."""
        from pyspark.sql import functions as F

        conds: list[Column] = []
        if self.kind is not None:
            conds.append(F.col("type") == self.kind)
        if self.transition:
            assert self.column is not None
            conds.append(F.col("type") == "update")
            conds.append(F.map_contains_key(F.col("old"), self.column))
            if self.before != "*":
                conds.append(F.col("old")[self.column] == F.lit(self.before))
            conds.append(F.col("data")[self.column] == F.lit(self.after))
        elif self.column is not None:
            conds.append(F.col("data")[self.column] == F.lit(self.after))
            if self.kind is None:
                changed = (F.col("type") == "update") & F.coalesce(
                    F.map_contains_key(F.col("old"), self.column), F.lit(False)
                )
                conds.append((F.col("type") == "insert") | changed)
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        return cond


def parse_event_spec(event_type: str, spec: str) -> MaxwellMapping:
    """Parse one event-type pattern (see the module docstring). O(len(spec))."""
    text = spec.strip()
    if m := _KIND_RE.match(text):
        kind, col, value = m.groups()
        return MaxwellMapping(event_type, kind, col, None, _unquote(value) if value else None)
    if m := _TRANSITION_RE.match(text):
        col, before, after = m.groups()
        return MaxwellMapping(event_type, None, col, _unquote(before), _unquote(after), True)
    if m := _VALUE_RE.match(text):
        col, value = m.groups()
        return MaxwellMapping(event_type, None, col, None, _unquote(value))
    raise MaxwellError(
        f"event type {event_type!r}: cannot read the pattern {spec!r}; use 'insert', "
        "'update: COL = V', 'COL: A -> B', 'COL: * -> B' or 'COL = V'"
    )


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


@dataclass(frozen=True, slots=True)
class MaxwellSpec:
    """How one rule reads one MySQL table's Maxwell stream."""

    rule: str
    database: str
    table: str
    primary_key: str
    mappings: tuple[MaxwellMapping, ...]

    @classmethod
    def from_mapping(cls, rule: str, raw: Mapping[str, Any]) -> MaxwellSpec:
        """Validate a rule's ``maxwell`` TOML table. O(number of event types)."""
        where = f"rule {rule!r}: maxwell"
        for field in ("database", "table", "primary_key"):
            if not isinstance(raw.get(field), str) or not raw[field]:
                raise MaxwellError(f"{where}.{field} must be a non-empty string")
        events = raw.get("events")
        if not isinstance(events, Mapping) or not events:
            raise MaxwellError(f"{where}.events must map event types to patterns")
        unknown = set(raw) - {"database", "table", "primary_key", "events"}
        if unknown:
            raise MaxwellError(f"{where}: unknown field(s) {sorted(unknown)}")
        mappings = []
        for event_type, spec in events.items():
            if not isinstance(spec, str):
                raise MaxwellError(f"{where}.events.{event_type} must be a string pattern")
            mappings.append(parse_event_spec(event_type, spec))
        return cls(rule, raw["database"], raw["table"], raw["primary_key"], tuple(mappings))


def split_maxwell_tables(doc: Mapping[str, Any]) -> tuple[dict[str, Any], list[MaxwellSpec]]:
    """Split a parsed rules document into (document without maxwell tables, specs). O(rules)."""
    clean: dict[str, Any] = dict(doc)
    rules = doc.get("rules")
    specs = []
    if isinstance(rules, Mapping):
        clean_rules = {}
        for name, rule in rules.items():
            if isinstance(rule, Mapping) and "maxwell" in rule:
                specs.append(MaxwellSpec.from_mapping(name, rule["maxwell"]))
                rule = {k: v for k, v in rule.items() if k != "maxwell"}
            clean_rules[name] = rule
        clean["rules"] = clean_rules
    return clean, specs


def load_maxwell_specs(rules_path: str) -> list[MaxwellSpec]:
    """Read every rule's ``[rules.NAME.maxwell]`` table from the rules TOML file.

    Raises :class:`MaxwellError` when no rule has one. O(file size).
    """
    with open(rules_path, "rb") as fh:
        doc = tomllib.load(fh)
    _, specs = split_maxwell_tables(doc)
    if not specs:
        raise MaxwellError(
            f"{rules_path}: --input-format maxwell needs a [rules.NAME.maxwell] table "
            "(database, table, primary_key, events)"
        )
    return specs


def maxwell_records(
    raw: DataFrame,
    specs: Sequence[MaxwellSpec],
    *,
    key: str,
    type_field: str,
    time_field: str,
    id_field: str,
    sequence_field: str | None,
) -> tuple[DataFrame, DataFrame]:
    """Like :func:`maxwell_events`, but as the pipeline's own input records.

    Returns ``(records, rejected)``: ``records`` has one column ``value``, a JSON
    Lines record named with the rules' ``[input]`` fields (key, type, time in
    epoch ms, id, sequence), which the JSON reader of the batch pipeline then
    parses and validates like any other input. O(rows × specs).
    """
    from pyspark.sql import functions as F

    if sequence_field is None:
        raise MaxwellError(
            "--input-format maxwell orders events by binlog position: set "
            '[input].sequence (for example sequence = "seq") in the rules file'
        )
    events, rejected = maxwell_events(raw, specs)
    record = F.struct(
        F.col("key").alias(key),
        F.col("event_type").alias(type_field),
        F.col("event_time").alias(time_field),
        F.col("event_id").alias(id_field),
        F.col("seq").alias(sequence_field),
    )
    return events.select(F.to_json(record).alias("value")), rejected


def _maxwell_schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("database", T.StringType()),
            T.StructField("table", T.StringType()),
            T.StructField("type", T.StringType()),
            T.StructField("ts", T.LongType()),
            T.StructField("ts_ms", T.LongType()),
            T.StructField("xid", T.LongType()),
            T.StructField("xoffset", T.LongType()),
            T.StructField("data", T.MapType(T.StringType(), T.StringType())),
            T.StructField("old", T.MapType(T.StringType(), T.StringType())),
        ]
    )


def maxwell_events(raw: DataFrame, specs: Sequence[MaxwellSpec]) -> tuple[DataFrame, DataFrame]:
    """Turn raw Maxwell lines (column ``value``) into ``(events, rejected)`` frames.

    ``events`` has :data:`EVENT_COLUMNS` (key, event_type, event_time ms,
    event_id, seq, raw). ``rejected`` has ``raw`` and ``reason``. Rows of other
    tables and row changes that match no pattern are neither (they are not
    events). Runs as one Spark projection per spec: O(rows × specs).
    """
    from pyspark.sql import functions as F

    parsed = raw.select(
        F.col("value").alias("raw"),
        F.from_json(F.col("value"), _maxwell_schema(), {"mode": "PERMISSIVE"}).alias("m"),
    ).select("raw", "m.*")
    required = ["database", "table", "type", "xid", "data"]
    reason = F.when(F.trim(F.col("raw")) == "", F.lit("empty line"))
    reason = reason.when(
        F.col("database").isNull() & F.col("table").isNull() & F.col("type").isNull(),
        F.lit("not a Maxwell JSON record"),
    )
    for field in required:
        reason = reason.when(F.col(field).isNull(), F.lit(f"missing or invalid field '{field}'"))
    reason = reason.when(
        F.col("ts").isNull() & F.col("ts_ms").isNull(), F.lit("missing or invalid field 'ts'")
    )
    reason = reason.when(
        ~F.col("type").isin(*_KINDS), F.concat(F.lit("unknown change type "), F.col("type"))
    )
    reason = reason.when(
        F.coalesce(F.col("xoffset"), F.lit(0)) >= (1 << _XOFFSET_BITS),
        F.lit("xoffset too large"),
    )
    checked = parsed.withColumn("reason", reason)
    rejected = [checked.where(F.col("reason").isNotNull()).select("raw", "reason")]
    good = checked.where(F.col("reason").isNull())
    outs: list[DataFrame] = []
    for spec in specs:
        rows = good.where((F.col("database") == spec.database) & (F.col("table") == spec.table))
        etype: Column = F.lit(None).cast("string")
        for mapping in reversed(spec.mappings):
            etype = F.when(mapping.condition(), F.lit(mapping.event_type)).otherwise(etype)
        key = F.col("data")[spec.primary_key]
        rows = rows.select("*", etype.alias("event_type"), key.alias("key")).where(
            F.col("event_type").isNotNull()
        )
        rejected.append(
            rows.where(F.col("key").isNull()).select(
                "raw", F.lit(f"missing primary key '{spec.primary_key}' in data").alias("reason")
            )
        )
        rows = rows.where(F.col("key").isNotNull())
        xoffset = F.coalesce(F.col("xoffset"), F.lit(0))
        outs.append(
            rows.select(
                F.col("key"),
                F.col("event_type"),
                F.coalesce(F.col("ts_ms"), F.col("ts") * 1000).alias("event_time"),
                F.concat_ws(
                    "",
                    F.col("database"),
                    F.lit("."),
                    F.col("table"),
                    F.lit("/"),
                    F.col("key"),
                    F.lit("@"),
                    F.col("xid").cast("string"),
                    F.lit(":"),
                    xoffset.cast("string"),
                    F.lit("/"),
                    F.col("event_type"),
                ).alias("event_id"),
                (F.shiftleft(F.col("xid"), _XOFFSET_BITS) + xoffset).alias("seq"),
                F.col("raw"),
            )
        )
    events = outs[0]
    for more in outs[1:]:
        events = events.unionByName(more)
    rej = rejected[0]
    for more in rejected[1:]:
        rej = rej.unionByName(more)
    return events, rej
