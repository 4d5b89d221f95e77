"""Stage 4: fan-out: one row per (kept event, rule that uses its type), in Arrow.

A type may belong to several rules (an order's ``created`` opens both a
payment and a shipping operation, each keyed by its rule's key field), so one
event becomes one row per rule: :func:`rule_events`, an Arrow function that
runs where the purgatory runs, in the driver or inside each partition's
``mapInArrow`` function (:mod:`.partition`).

On the executors the purgatory's partitions are made by a shuffle, which
Spark must route before any Python runs: :func:`routed_events` gives each
event one row per distinct value of its key fields, its route
(:func:`route_column`), and the shuffle is by that value. All the rows of one
(rule, key) then meet in one partition, the carried operations of that key
among them (routed by their key), and the fan-out after the shuffle keeps the
rows whose key is the one they were routed by. With one key field, the common
case, an event is one row and its route is its key column itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..rules import Rules
from .classify import C_EVENT
from .records import key_column

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame

__all__ = [
    "APPLIED_EVENTS",
    "COLUMNS",
    "ROUTE",
    "events_to_apply",
    "route_column",
    "routed_events",
    "rule_events",
]

#: The column of :func:`routed_events` the shuffle partitions by, with several key
#: fields: a key's value.
ROUTE = "_route"


def route_column(rules: Rules) -> str:
    """The column the executors' shuffle routes by (:func:`routed_events`): the key
    column with one key field, else :data:`ROUTE`. O(1)."""
    return key_column(0) if len(rules.key_fields) == 1 else ROUTE


#: SQL: the classified records the purgatory applies: kept events of a type some rule
#: uses, not applied by an earlier micro-batch (:func:`events_to_apply` in Arrow).
APPLIED_EVENTS = f"c = {C_EVENT} AND NOT applied"

#: The event columns the fan-out reads, before the key columns.
_EVENT_COLUMNS = ("event_id", "event_type", "time", "seq")


def events_to_apply(classified: pa.Table) -> pa.Table:
    """The classified records (Arrow) that the purgatory applies (:data:`APPLIED_EVENTS`):
    kept events of a type some rule uses, not applied yet. O(rows)."""
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    return classified.filter(
        pc.and_(pc.equal(classified["c"], C_EVENT), pc.invert(classified["applied"]))
    )


def rule_events(events: pa.Table, rules: Rules, route: bool = False) -> pa.Table:
    """``events`` (the classified records' columns: ``event_id``, ``event_type``, ``time``,
    ``seq``, ``k0..kN``) as one row per (event, rule using its type): :data:`COLUMNS`,
    ``rule`` its name and ``key`` the value of its key field.

    With ``route``, ``events`` comes from :func:`routed_events`, and only the rows
    whose key is their route are kept: each (rule, key) is then fanned out in the
    one partition its key was routed to. O(events × rules).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    key_index = {name: i for i, name in enumerate(rules.key_fields)}
    parts = []
    for rule in rules.rules:
        key = events[key_column(key_index[rule.key])]
        types = pa.array(sorted(rule.event_types), pa.string())
        mine = pc.is_in(events["event_type"], value_set=types)
        if route and len(rules.key_fields) > 1:
            mine = pc.and_kleene(mine, pc.equal(key, events[ROUTE]))
        chosen = events.filter(mine)
        columns = {
            "rule": pa.array([rule.name] * chosen.num_rows, pa.string()),
            "key": chosen[key_column(key_index[rule.key])],
        }
        arrays = [columns[name] if name in columns else chosen[name] for name in COLUMNS]
        parts.append(pa.table(
            [array.cast(kind) for array, (_, kind) in zip(arrays, _types(pa), strict=True)],
            names=list(COLUMNS),
        ))  # fmt: skip
    return pa.concat_tables(parts)


#: The columns of :func:`rule_events`.
COLUMNS = ("rule", "key", "time", "seq", "event_id", "event_type")


def _types(pa: Any) -> list[tuple[str, Any]]:
    """:data:`COLUMNS` with their Arrow types."""
    return [(name, pa.int64() if name in ("time", "seq") else pa.string()) for name in COLUMNS]


def routed_events(classified: DataFrame, rules: Rules) -> DataFrame:
    """The classified records the purgatory applies (:data:`APPLIED_EVENTS`) in the columns
    :func:`rule_events` reads, each with its route for the shuffle
    (:func:`route_column`): with one key field its key, else one row per distinct
    non-null value of its key fields, in :data:`ROUTE`. Lazy. The expressions are
    SQL text (one call into the JVM each)."""
    keys = [key_column(i) for i in range(len(rules.key_fields))]
    routes = []
    if len(keys) > 1:
        distinct = f"filter(array_distinct(array({', '.join(keys)})), k -> k IS NOT NULL)"
        routes.append(f"explode({distinct}) AS {ROUTE}")
    return classified.where(APPLIED_EVENTS).selectExpr(*routes, *_EVENT_COLUMNS, *keys)
