"""The rule machine every stateful peer of the stream applies: one operation per key.

The Spark peers (``_stream_peers.py``: ``transformWithStateInPandas``,
``transformWithState``, ``applyInPandasWithState``) and PyFlink's
``KeyedProcessFunction`` (``peer_pyflink.py``) call this same code, so they
differ only in their framework's API. It imports neither PySpark nor
PyFlink nor tickwheel: PyFlink's program runs it in an environment of its
own, and its Python workers import it as a file the job ships to them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["EMPTY", "OUTCOME_FIELDS", "OneOpRule", "Outcome", "RuleTypes", "State"]

#: One row per resolved operation, as every peer emits it.
OUTCOME_FIELDS = ("key", "opened_at", "deadline", "outcome", "resolved_at")


class RuleTypes(Protocol):
    """What the machine reads of a rule (tickwheel's ``Rule`` has these)."""

    timeout_ms: int
    open: Iterable[str]
    complete: Iterable[str]
    cancel: Iterable[str]


State = tuple[Any, Any, Any, Any, Any]
Outcome = tuple[str, int, int, str, int]
EMPTY: State = (None, None, None, None, None)


class OneOpRule:
    """A rule with at most one pending operation per key, as the peers apply it.

    The state is a :data:`State` tuple; the key's one timer is :meth:`timer`.
    An operation expires at its deadline, before an event stamped at it (as
    in tickwheel); a complete or cancel with no operation is kept until a
    later-stamped open arrives (it arrived first, out of order) or until its
    own time plus the timeout, when no open could still match it.
    """

    def __init__(self, rule: RuleTypes) -> None:
        """Take the open, complete and cancel types and the timeout of ``rule``. O(1)."""
        self.timeout_ms = rule.timeout_ms
        self.opens = frozenset(rule.open)
        self.outcome = {kind: "completed" for kind in rule.complete}
        self.outcome.update((kind, "cancelled") for kind in rule.cancel)

    def timer(self, state: State) -> int | None:
        """The time the key's timer is set for: the deadline, or the early resolution's end."""
        open_ms, _, _, early_ms, _ = state
        if open_ms is not None:
            return int(open_ms) + self.timeout_ms
        return None if early_ms is None else int(early_ms) + self.timeout_ms

    def apply(
        self, key: str, state: State, events: Iterable[tuple[int, int, str, str]]
    ) -> tuple[State, list[Outcome]]:
        """Apply ``events`` (time, seq, id, type) in order; the next state and the outcomes."""
        open_ms, open_seq, early_type, early_ms, early_seq = state
        timeout, out = self.timeout_ms, []
        for ms, seq, _id, kind in sorted(events):
            if open_ms is not None and ms >= open_ms + timeout:
                out.append((key, open_ms, open_ms + timeout, "expired", open_ms + timeout))
                open_ms = open_seq = None
            if kind in self.opens:
                if open_ms is not None:
                    continue  # one operation per key: a second open is not comparable
                open_ms, open_seq = ms, seq
                if (early_type is not None and (ms, seq) < (early_ms, early_seq)
                        and early_ms < ms + timeout):  # fmt: skip
                    out.append((key, ms, ms + timeout, self.outcome[early_type], early_ms))
                    open_ms = open_seq = None
                early_type = early_ms = early_seq = None
            elif kind in self.outcome:
                if open_ms is not None:
                    out.append((key, open_ms, open_ms + timeout, self.outcome[kind], ms))
                    open_ms = open_seq = None
                elif early_type is None or (ms, seq) < (early_ms, early_seq):
                    early_type, early_ms, early_seq = kind, ms, seq
        return (open_ms, open_seq, early_type, early_ms, early_seq), out

    def expire(self, key: str, state: State, expiry_ms: int) -> list[Outcome]:
        """The outcome of the key's timer firing at ``expiry_ms`` (the state then ends)."""
        open_ms = state[0]
        if open_ms is not None and int(open_ms) + self.timeout_ms == expiry_ms:
            return [(key, int(open_ms), expiry_ms, "expired", expiry_ms)]
        return []
