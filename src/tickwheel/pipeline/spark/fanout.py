"""Stage 4: fan-out: one row per (kept event, rule that uses its type).

A type may belong to several rules (an order's ``created`` opens both a
payment and a shipping operation, each keyed by its rule's key field), so one
event becomes one row per rule. With one rule that is a projection; with
several it is one ``explode`` of the rules that use the type, a single pass,
unlike a union of one filtered copy per rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..rules import Rules
from .frames import sql_in, sql_string
from .records import key_column, used_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["rule_events"]


def rule_events(kept: DataFrame, rules: Rules) -> DataFrame:
    """``kept`` events of rules' types as one row per (event, rule): columns ``rule`` (its
    name), ``key`` (the rule's key field), ``time``, ``seq``, ``event_id``, ``event_type``.

    ``kept`` has the columns of the classified records (``k0..kN`` for the key
    fields). Lazy. The expressions are SQL text (one call into the JVM each).
    """
    key_index = {name: i for i, name in enumerate(rules.key_fields)}

    def key_of(rule_index: int) -> str:
        return key_column(key_index[rules.rules[rule_index].key])

    if len(rules.rules) == 1:
        frame = kept.where(used_type(rules, "event_type"))
        rule_col, key_col = sql_string(rules.rules[0].name), key_of(0)
    else:
        entries = [
            f"CASE WHEN {sql_in('event_type', rule.event_types)} "
            f"THEN named_struct('r', {sql_string(rule.name)}, 'k', {key_of(index)}) END"
            for index, rule in enumerate(rules.rules)
        ]
        frame = kept.selectExpr(
            "*", f"explode(filter(array({', '.join(entries)}), e -> e IS NOT NULL)) AS _e"
        )
        rule_col, key_col = "_e.r", "_e.k"
    return frame.selectExpr(
        f"{rule_col} AS rule", f"{key_col} AS key", "`time`", "seq", "event_id", "event_type"
    )
