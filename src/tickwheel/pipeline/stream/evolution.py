"""Rules that change under a running stream: what applies, what is refused.

Each commit records the rules it was computed with (:func:`rules_record`, the
whole normalised rules) and the input format. When a stream starts on a
checkpoint that holds state, :func:`check_rules_change` compares them with
the rules in force, before Spark runs a batch.

Changes that apply, each by one rule (``docs/pipeline.md``, "Changing the
rules"):

* a rule's **timeout**: an operation keeps the deadline it was opened with;
  operations opened from then on take the new timeout;
* a **new rule**, and **new (or removed) event types** of a rule: they apply to
  the events applied from then on (events still buffered above the
  watermark included), not to those applied before;
* **allowed_lateness**: the watermark is the largest event time minus the new
  lateness, and never moves back;
* **retention**: expiry markers are kept and consulted by the new retention;
* the event type field's name and the Maxwell mappings: they say how new
  records are read.

Changes that cannot apply to the state are refused (:class:`RulesChangeRefused`,
one message naming each difference and the ways out):

* a removed or renamed rule that has pending operations;
* a changed key, id, time or sequence field: the carried state is keyed and
  deduplicated by the old fields;
* a changed input format.

With ``drop_incompatible_state`` the stream goes on instead: it drops the
state rows of removed rules (or, for a changed field or format, the whole
carried state) from the first micro-batch on, and reports what it dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..rules import Rules, format_duration
from .checkpoint import StateStore, StreamError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "RulesChange",
    "RulesChangeRefused",
    "StateAdjustment",
    "check_rules_change",
    "compare_rules",
    "rules_record",
]

logger = logging.getLogger(__name__)

#: The fields whose change the carried state cannot follow.
_STATE_FIELDS = ("key", "id", "time", "sequence")
#: The option that drops what the old rules left, named as each driver takes it.
DROP_OPTION = "--drop-incompatible-state (start_stream(..., drop_incompatible_state=True))"


def rules_record(rules: Rules) -> dict[str, Any]:
    """The rules as plain JSON data: every field, normalised (durations in ms). O(rules)."""
    record: dict[str, Any] = _lists(dataclasses.asdict(rules))
    return record


def _lists(value: Any) -> Any:
    """``value`` with tuples as lists, as JSON reads it back."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


@dataclass(frozen=True)
class StateAdjustment:
    """What the first micro-batch after a refused-but-forced change drops from the state
    the batch ``after`` committed: the rows of ``rules``, or everything (``everything``)."""

    after: int
    rules: frozenset[str] = frozenset()
    everything: bool = False


@dataclass
class RulesChange:
    """The differences between the recorded rules and those in force."""

    applied: list[str] = field(default_factory=list)  # how each applies
    refused: list[str] = field(default_factory=list)  # what the state cannot follow
    removed: list[str] = field(default_factory=list)  # rules no longer in force
    drop_everything: bool = False  # a field or the format changed

    def __bool__(self) -> bool:
        return bool(self.applied or self.refused or self.removed)


class RulesChangeRefused(StreamError):
    """The rules changed in a way the checkpoint's state cannot follow."""


def compare_rules(
    recorded: Mapping[str, Any],
    rules: Rules,
    *,
    recorded_format: str | None = None,
    input_format: str | None = None,
) -> RulesChange:
    """What changed from the ``recorded`` rules (:func:`rules_record`) to ``rules``.

    Removed rules are listed in ``removed``; whether they are refused depends on
    their pending operations (:func:`check_rules_change`). O(rules × types).
    """
    change = RulesChange()
    now = rules_record(rules)
    old_in, new_in = recorded.get("input", {}), now["input"]
    for name in _STATE_FIELDS:
        if old_in.get(name) != new_in.get(name):
            change.refused.append(
                f"[input].{name} changed: {old_in.get(name)!r} -> {new_in.get(name)!r}"
            )
            change.drop_everything = True
    if old_in.get("type") != new_in.get("type"):
        change.applied.append(
            f"[input].type changed: {old_in.get('type')!r} -> {new_in.get('type')!r}; "
            "new records are read by the new field"
        )
    if None not in (recorded_format, input_format) and recorded_format != input_format:
        change.refused.append(f"the input format changed: {recorded_format!r} -> {input_format!r}")
        change.drop_everything = True
    old_lateness, new_lateness = old_in.get("allowed_lateness_ms"), new_in["allowed_lateness_ms"]
    if old_lateness != new_lateness:
        was, becomes = (format_duration(ms, as_written=True) for ms in (old_lateness, new_lateness))
        change.applied.append(
            f"allowed_lateness {was} -> {becomes}: the watermark is the largest event time "
            "minus the new lateness, and never moves back"
        )
    if old_in.get("retention_ms") != new_in["retention_ms"]:
        was, becomes = (
            format_duration(ms, as_written=True)
            for ms in (old_in.get("retention_ms"), new_in["retention_ms"])
        )
        change.applied.append(
            f"retention {was} -> {becomes}: expiry markers are consulted, and dropped, "
            "by the new retention"
        )
    old_rules = {r["name"]: r for r in recorded.get("rules", [])}
    new_rules = {r["name"]: r for r in now["rules"]}
    for name, old in old_rules.items():
        new = new_rules.get(name)
        if new is None:
            change.removed.append(name)
            continue
        if old["key"] != new["key"]:
            change.refused.append(
                f"rule {name!r}: its key field changed: {old['key']!r} -> {new['key']!r}"
            )
            change.drop_everything = True
        if old["timeout_ms"] != new["timeout_ms"]:
            was, becomes = (format_duration(r["timeout_ms"], as_written=True) for r in (old, new))
            change.applied.append(
                f"rule {name!r}: timeout {was} -> {becomes}: pending operations keep the "
                "deadline they were opened with; operations opened from now on take the new "
                "timeout"
            )
        for kind in ("open", "complete", "cancel"):
            if old[kind] != new[kind]:
                change.applied.append(
                    f"rule {name!r}: {kind} types {old[kind]} -> {new[kind]}: from the events "
                    "applied from now on"
                )
    for name in new_rules.keys() - old_rules.keys():
        change.applied.append(f"rule {name!r} is new: it sees the events applied from now on")
    if recorded.get("maxwell") != now["maxwell"]:
        change.applied.append("the Maxwell mappings changed: new rows are read by them")
    return change


def _pending_by_rule(
    spark: SparkSession, store: StateStore, batch_id: int, names: list[str]
) -> dict[str, int]:
    """Pending operations of the rules ``names`` in batch ``batch_id``'s state: one Spark job."""
    from pyspark.sql import functions as F

    from .changelog import committed_frames

    ops = committed_frames(store, spark, batch_id).get("ops")
    if ops is None:
        return {}
    rows = (
        ops.where((F.col("kind") == "pending") & F.col("rule").isin(names))
        .groupBy("rule")
        .count()
        .collect()
    )
    return {row["rule"]: int(row["count"]) for row in rows}


def check_rules_change(
    store: StateStore,
    rules: Rules,
    spark: SparkSession,
    *,
    input_format: str | None = None,
    drop_incompatible_state: bool = False,
) -> StateAdjustment | None:
    """Compare the rules in force with those the last commit recorded, before any batch.

    Raises :class:`RulesChangeRefused` for a change the state cannot follow,
    unless ``drop_incompatible_state``: then returns what the first batch
    drops. How each applied change applies is logged at INFO, what is
    dropped at WARNING (this module's logger). A checkpoint without a commit,
    or one written before the rules were recorded, has nothing to compare.
    O(1) calls, plus one Spark job when a rule was removed.
    """
    committed = store.committed()
    if not committed:
        return None
    last = committed[-1]
    commit = store.read_commit(last)
    recorded = commit.rules
    if not isinstance(recorded, Mapping):
        return None
    change = compare_rules(
        recorded, rules, recorded_format=commit.input_format, input_format=input_format
    )
    if not change:
        return None
    pending = _pending_by_rule(spark, store, last, change.removed) if change.removed else {}
    removed_text = []
    for name in change.removed:
        count = pending.get(name, 0)
        if count:
            change.refused.append(
                f"rule {name!r} was removed (or renamed) and has {count:,} pending operations"
            )
        else:
            removed_text.append(f"rule {name!r} was removed; it had no pending operations")
    where = store.root.rstrip("/").rsplit("/", 1)[0]
    if change.refused and not drop_incompatible_state:
        raise RulesChangeRefused(
            f"checkpoint {where}: the rules differ from those batch {last} was committed with, "
            "in ways its state cannot follow:\n"
            + "".join(f"  - {line}\n" for line in change.refused)
            + "Ways out: a new checkpoint (start over from the input), or "
            f"{DROP_OPTION}, which drops what the old rules left pending, says how much, "
            "and goes on."
        )
    for line in [*change.applied, *removed_text]:
        logger.info("rules changed since batch %d: %s", last, line)
    if change.refused:
        dropped = (
            "the whole carried state (pending operations, buffered events, expiry markers)"
            if change.drop_everything
            else "the state rows of rule(s) "
            + ", ".join(map(repr, change.removed))
            + f" ({sum(pending.values()):,} pending operations)"
        )
        for line in change.refused:
            logger.warning("rules changed since batch %d: %s", last, line)
        logger.warning("drop_incompatible_state: dropping %s", dropped)
    return StateAdjustment(
        after=last,
        rules=frozenset(change.removed),
        everything=change.drop_everything and bool(change.refused),
    )
