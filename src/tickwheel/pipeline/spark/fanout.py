"""Stage 4: fan-out: one row per (kept event, rule that uses its type).

A type may belong to several rules (an order's ``created`` opens both a
payment and a shipping operation, each keyed by its rule's key field), so one
event becomes one row per rule. With one rule that is a projection; with
several it is one ``explode`` of the rules that use the type, a single pass,
unlike a union of one filtered copy per rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..rules import Rules
from .records import key_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["rule_events"]


def rule_events(kept: DataFrame, rules: Rules) -> DataFrame:
    """``kept`` events of rules' types as one row per (event, rule): columns ``rule`` (its
    name), ``key`` (the rule's key field), ``time``, ``seq``, ``event_id``, ``event_type``.

    ``kept`` has the columns of the classified records (``k0..kN`` for the key
    fields). Lazy.
    """
    from pyspark.sql import functions as F

    key_index = {name: i for i, name in enumerate(rules.key_fields)}

    def key_of(rule_index: int) -> Any:
        return F.col(key_column(key_index[rules.rules[rule_index].key]))

    if len(rules.rules) == 1:
        frame = kept.where(F.col("event_type").isin(list(rules.event_types)))
        rule_col, key_col = F.lit(rules.rules[0].name), key_of(0)
    else:
        entries = [
            F.when(
                F.col("event_type").isin([*rule.open, *rule.complete, *rule.cancel]),
                F.struct(F.lit(rule.name).alias("r"), key_of(index).alias("k")),
            )
            for index, rule in enumerate(rules.rules)
        ]
        frame = kept.select(
            "*", F.explode(F.filter(F.array(*entries), lambda e: e.isNotNull())).alias("_e")
        )
        rule_col, key_col = F.col("_e.r"), F.col("_e.k")
    return frame.select(
        rule_col.alias("rule"), key_col.alias("key"), "time", "seq", "event_id", "event_type"
    )
