"""Stage 2: classify and deduplicate: each record and carried event gets its class.

The new records and the events carried from earlier micro-batches go through
one window by event id (:func:`rank_copies`). Of the copies of one id the one
that sorts first is kept (a copy already applied first, then the smallest
(time, sequence, raw text)); copies with the kept one's content are
duplicates, and the others are rejected as conflicts. Rejected records, and
valid records older than the previous watermark (late), fall in windows of
their own (the window is partitioned by reason and lateness too), so every
record is read and parsed once and classified in one pass (:func:`classify`).

The window sorts every record, raw text included, by its group and its
order. The group's event id comes first: Spark's sort keeps an 8-byte prefix
of its first key beside each row and compares whole rows only where the
prefixes tie, so with the id first most comparisons end at the prefix, where
a first key that is null for nearly every row (the reason) made each one
compare the rows. Sorting by a 64-bit hash of the group first was no faster.
The content is compared column by column, nulls equal to nulls, as a
struct's equality.
"""

from __future__ import annotations

from collections.abc import Sequence

from .frames import Step, parameter_columns, parameter_name, sql_name, steps_sql
from .records import key_column, raw_text_columns

__all__ = [
    "C_CONFLICT",
    "C_DUPLICATE",
    "C_EVENT",
    "C_IGNORED",
    "C_LATE",
    "C_REJECTED",
    "EVENT_STATE_COLUMNS",
    "classify",
    "rank_copies",
]

# A record's class (column ``c`` of the classified records).
C_EVENT = 0  # kept event of a type some rule uses: its rules' events
C_IGNORED = 1  # kept event of a type no rule uses: counted, its time raises the watermark
C_DUPLICATE = 2  # a copy with the kept record's content: counted only
C_CONFLICT = 3  # a copy with other content: rejected, reason "conflict"
C_REJECTED = 4  # invalid record: rejected with its reason
C_LATE = 5  # valid, older than the previous watermark: the stream's late/

#: The carried events' columns before the key columns (``k_<field>`` in the state files).
EVENT_STATE_COLUMNS = ("event_id", "event_type", "time", "seq", "raw")


def rank_copies(by: Sequence[str], order: Sequence[str], content: Sequence[str]) -> Step:
    """The step (:func:`.frames.steps_sql`) that adds ``_rn`` (1: the kept copy of its
    ``by`` group) and ``_same`` to a relation.

    ``order`` (SQL sort expressions) sorts the copies of one group (the first
    is kept); ``_same`` is true where the row's ``content`` columns equal the
    kept copy's, nulls equal to nulls. One sort within the groups, which must
    be in one partition each (a shuffle by ``by``, or a single partition).
    """
    window = f"OVER (PARTITION BY {', '.join(map(sql_name, by))} ORDER BY {', '.join(order)})"
    # A struct's null-safe equality compares its fields in turn, nulls equal to nulls.
    row = f"struct({', '.join(map(sql_name, content))})"
    same = f"{row} <=> first({row}) {window}"
    return ("select", ["*", f"row_number() {window} AS _rn", f"{same} AS _same"])


#: A record's class (``C_*``) as SQL, from the columns ``rank_copies`` and
#: ``classify`` give it.
_CLASS = f"""CASE
    WHEN reason IS NOT NULL THEN {C_REJECTED}
    WHEN late THEN {C_LATE}
    WHEN _rn = 1 THEN CASE WHEN relevant THEN {C_EVENT} ELSE {C_IGNORED} END
    WHEN _same THEN {C_DUPLICATE}
    ELSE {C_CONFLICT}
END"""


def classify(
    parsed: str,
    columns: Sequence[str],
    key_count: int,
    partitions: int | None,
    previous_watermark: int | None,
    carried: str | None = None,
    keep_raw: bool = False,
) -> str:
    """The records of ``parsed`` and the ``carried`` events, classified: SQL text. O(1).

    ``parsed`` and ``carried`` are queries (SQL text) with the ``columns`` of
    :func:`.records.parse_steps`; a carried event is valid and relevant as its
    type says. ``previous_watermark`` (None for none) is read as a run
    parameter (:func:`.frames.parameter_sql`), once for both: what is late, and
    what was applied already. Columns of the result: ``c`` (the class,
    ``C_*``), ``old`` (a carried event), ``applied`` (carried and at or below
    the previous watermark), ``reason`` (``conflict`` for conflicts), ``raw``
    (of rejected and late records, as valid UTF-8 with their exact bytes in
    ``raw_bytes`` when it was not: :func:`.records.raw_text_columns`; of kept
    events as it came, when ``keep_raw``: the stream carries it for the next
    batch's ranking), ``event_id``, ``event_type``, ``time``, ``seq`` and the
    key columns. One shuffle into ``partitions`` partitions by (event id,
    reason, late), then a sort within them; with ``partitions`` None, every
    row in one partition, with no shuffle (for a micro-batch known to be small).
    """
    keys = [key_column(i) for i in range(key_count)]
    listed = [*map(sql_name, columns), "old"]
    new = steps_sql(f"({parsed})", [("select", ["*", "false AS old"]), ("select", listed)])
    if carried is not None:
        old = steps_sql(f"({carried})", [("select", ["*", "true AS old"]), ("select", listed)])
        new = f"{old} UNION ALL {new}"
    w_prev = sql_name(parameter_name("w_prev"))
    group = ["event_id", "reason", "late"]  # the id first: see the module doc
    text, exact = raw_text_columns("_raw")
    kept_raw = f"WHEN c <= {C_IGNORED} THEN _raw " if keep_raw else ""
    return steps_sql(f"({new})", [
        ("select", ["*", *parameter_columns(w_prev=previous_watermark)]),
        ("select", [
            "*", f"NOT old AND reason IS NULL AND coalesce(time < {w_prev}, false) AS late",
            f"old AND coalesce(time <= {w_prev}, false) AS applied",
        ]),
        ("one partition", ()) if partitions is None else ("repartition", (partitions, group)),
        rank_copies(group, ["applied DESC", "time", "seq", "raw"],
                    ["event_type", "time", "seq", *keys]),
        ("select", [
            f"CAST({_CLASS} AS INT) AS c", "old", "applied", "reason AS _reason", "raw AS _raw",
            "event_id", "event_type", "time", "seq", *keys,
        ]),
        ("select", [
            "c", "old", "applied",
            f"CASE WHEN c = {C_CONFLICT} THEN 'conflict' ELSE _reason END AS reason",
            f"CASE WHEN c >= {C_CONFLICT} THEN {text} {kept_raw}END AS raw",
            f"CASE WHEN c >= {C_CONFLICT} THEN {exact} END AS raw_bytes",
            "event_id", "event_type", "time", "seq", *keys,
        ]),
    ])  # fmt: skip
