"""Maxwell's binlog JSON (MySQL change data capture) as a form of the pipeline's records.

Seed 004's deployment is MySQL → Maxwell → Kafka → a consumer. Maxwell writes
one JSON object per row change::

    {"database": "shop", "table": "orders", "type": "update", "ts": 1767225600,
     "xid": 9134, "xoffset": 0, "position": "master.000001:4400",
     "data": {"id": 42, "status": "paid"}, "old": {"status": "created"}}

``xid`` and ``commit`` come with ``output_commit_info`` (on by default);
``xoffset`` also needs ``output_xoffset``, and Maxwell leaves it out of a
transaction's last row, the one with ``"commit": true``; ``position`` comes with
``output_binlog_position``. A bootstrap (a table's current rows, sent on
request) writes ``bootstrap-start``, one ``bootstrap-insert`` per row and
``bootstrap-complete``, none with an ``xid``; with ``output_ddl``, schema
changes (``table-create``, ...) come too, their ``ts`` in milliseconds.

:func:`maxwell_records` turns a frame of such records (a ``value`` column of
string or binary, one record per row: what Spark's ``text`` and Kafka sources
give) into the pipeline's record frame, the one
:func:`.records.record_fields_frame` gives for JSON Lines, plus the
rows it rejects. The rules' ``[rules.NAME.maxwell]`` tables (grammar in
:mod:`tickwheel.pipeline.rules`, parsed into
:class:`~tickwheel.pipeline.rules.MaxwellSpec`) say which row changes are which
rule's events. An event's time is ``ts`` × 1000 (``ts_ms`` when present); its
key, for the key field of each rule that maps it, is ``data[primary_key]``.

**Order.** The pipeline applies a key's events by (time, sequence, id), so
the sequence orders the changes of one row within one second. A row's changes
come with non-decreasing ``ts`` but in one case: ``ts`` is when a change's
statement started, and a statement that started before the row's previous
change, then waited for its lock, is stamped earlier; such a pair (a statement
that ran across a second boundary) applies in ``ts`` order. The sequence comes
from the most exact order a record carries:

==================  ====================================  =================================
the record has      sequence (a non-negative long)        order within one second
==================  ====================================  =================================
``position``        ``2^62 + N × 2^32 + OFFSET``, from    the binlog's order: exact (a
                    ``FILE.N:OFFSET``                     binlog rows event changes a row
                                                          at most once)
``xid`` only        ``xid × 2^20 + xoffset``; a last      exact within a transaction with
                    row without ``xoffset``: 2^20 − 1;    ``output_xoffset`` (without it,
                    others without it: 0                  only its last row is placed);
                                                          between transactions, ``xid``
                                                          order, which follows the
                                                          transactions' starts, not their
                                                          commits
neither             0 bootstrap row, 1 insert, 2 update,  a row's life: snapshot, insert,
                    3 delete                              updates, delete
==================  ====================================  =================================

A stream that mixes them (bootstrap rows among binlog rows with an ``xid``)
orders a tie the same way: the sequences without ``xid`` or ``position`` are
below 4, those from an ``xid`` (of at least 1) are from 2^20 to below 2^62, and
those from a ``position`` are 2^62 and above. So a bootstrap row comes before a
binlog change of the same row in the same second, as Maxwell sends them. The
encodings' limits are rejected, with the reason: a binlog file number N of 2^30
or more, an OFFSET of 2^32 or more (MySQL's event header holds a 32-bit
offset), an ``xid`` of 2^42 or more, an ``xoffset`` of 2^20 − 1 or more. The
file's base name is not compared: positions of one server's binlog only.

**Event ids** stay the same for a record sent twice (a duplicate) and differ
for different changes:

* with ``position``: ``db.table/KEY@FILE.N:OFFSET/TYPE``;
* with ``xid`` only: ``db.table/KEY@XID:XOFFSET/TYPE`` (XOFFSET 0 when absent).
  Without ``output_xoffset``, two changes of one row into one event type in one
  transaction share an id, and the second is rejected as a ``conflict``;
* with neither, and for every bootstrap row: ``db.table/KEY@TIME#HASH/TYPE``,
  HASH the first 16 hex digits of the SHA-256 of the record's parsed content
  (type, position, xid, xoffset, ts, data and old, sorted by column). Two
  identical changes of a row in one second count as one. A bootstrap row's
  ``position`` is its request's, shared by every row of the bootstrap, so its
  time names it: a restarted bootstrap's rows are new events, a redelivered
  record is a duplicate.

**Bootstrap rows** are events only through a ``bootstrap`` pattern (for
example ``created = ["insert", "bootstrap: status = created"]``), at the time
Maxwell read them. ``insert`` does not match them: a bootstrap row is a row's
current state, not a change, and taking it as an insert would open an operation
for every row of the table, stamped with the time of the read.

**Not events, counted.** A valid record that no rule's table maps (another
table, a change no pattern matches, ``bootstrap-start``/``-complete``, a schema
change, a bootstrap row no ``bootstrap`` pattern maps) becomes a record of type
``maxwell:TYPE`` (``maxwell:bootstrap-start``, ...), id
``db.table@TIME#HASH/maxwell:TYPE``, without a key. No rule uses the type, so
the pipeline counts it as ``ignored``, and its time moves the watermark as
every record's does: binlog time passes for every table.

**Rejected** (with the reason): a record that is not a JSON object or not a
Maxwell record, misses or mistypes ``database``, ``table``, ``type``, ``ts`` or
(for a row) ``data``, has an unknown ``type``, an unreadable or unencodable
``position``, ``xid`` or ``xoffset``, or is mapped but has no primary key.

Everything runs as Spark expressions over the records: no Python row loop, no
shuffle (one projection and one ``explode``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..rules import MaxwellError, MaxwellMapping, MaxwellSpec, Rules, parse_event_spec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "EVENT_COLUMNS",
    "IGNORED_PREFIX",
    "MaxwellError",
    "MaxwellMapping",
    "MaxwellSpec",
    "check_maxwell_rules",
    "maxwell_events",
    "maxwell_records",
    "parse_event_spec",
]

#: Columns of the normalized event frame :func:`maxwell_events` returns.
EVENT_COLUMNS = ("key", "event_type", "event_time", "event_id", "seq", "raw")
#: The event type of a record that is not an event is this + Maxwell's type.
IGNORED_PREFIX = "maxwell:"

_ROW_KINDS = ("insert", "update", "delete")
_BOOTSTRAP_ROW = "bootstrap-insert"
_BOOTSTRAP_MARKERS = ("bootstrap-start", "bootstrap-complete")
_DDL_KINDS = (
    "database-create",
    "database-alter",
    "database-drop",
    "table-create",
    "table-alter",
    "table-drop",
)
_KNOWN_TYPES = (*_ROW_KINDS, _BOOTSTRAP_ROW, *_BOOTSTRAP_MARKERS, *_DDL_KINDS)
#: A pattern's kind → the Maxwell type it matches.
_PATTERN_TYPES = {kind: kind for kind in _ROW_KINDS} | {"bootstrap": _BOOTSTRAP_ROW}
#: The sequence without xid or position: a row's life.
_LIFE_RANK = {_BOOTSTRAP_ROW: 0, "insert": 1, "update": 2, "delete": 3}

POSITION_BASE = 1 << 62
FILE_NUMBER_BITS = 30
OFFSET_BITS = 32
XID_BITS = 42
XOFFSET_BITS = 20
_LAST_XOFFSET = (1 << XOFFSET_BITS) - 1
_POSITION_RE = r"^(.+)\.([0-9]{1,10}):([0-9]{1,10})$"
_STRING_FIELDS = ("database", "table", "type", "ts", "ts_ms", "xid", "xoffset", "commit")


def check_maxwell_rules(rules: Rules) -> None:
    """Raise :class:`MaxwellError` when ``rules`` cannot read Maxwell input. O(1)."""
    if not rules.maxwell:
        raise MaxwellError(
            "Maxwell input needs a [rules.NAME.maxwell] table "
            "(database, table, primary_key, events) in the rules"
        )
    if rules.input.sequence is None:
        raise MaxwellError(
            "Maxwell input orders a row's changes by binlog position: set "
            '[input].sequence (for example sequence = "seq") in the rules'
        )


def maxwell_records(values: DataFrame, rules: Rules) -> tuple[DataFrame, DataFrame]:
    """Maxwell records as the pipeline's records: ``(records, rejected)``.

    ``values`` has a ``value`` column (string, or binary read as UTF-8), one
    Maxwell JSON record per row; blank values are not records. ``records`` has
    the columns of :func:`.records.record_fields_frame` (``raw``, ``malformed``,
    ``rejected``, ``f_<field>`` for the ``[input]`` fields, all strings), one
    row per event and one per ignored record; ``rejected`` has ``raw`` and
    ``reason``. Both are lazy and read ``values`` once each. Raises
    :class:`MaxwellError` if the rules cannot read Maxwell input. One projection
    and one ``explode``: O(rows × patterns).
    """
    from pyspark.sql import functions as F

    check_maxwell_rules(rules)
    key_fields = rules.key_fields
    rule_key = {rule.name: key_fields.index(rule.key) for rule in rules.rules}
    normalized, rejected = _normalized(values, rules.maxwell, rule_key, len(key_fields))
    cfg = rules.input
    assert cfg.sequence is not None  # check_maxwell_rules
    columns: dict[str, Column] = {
        cfg.id: F.col("event_id"),
        cfg.type: F.col("event_type"),
        cfg.time: F.col("event_time").cast("string"),
        cfg.sequence: F.col("seq").cast("string"),
    }
    for index, name in enumerate(key_fields):
        columns[name] = F.col(f"k{index}")
    records = normalized.select(
        "raw",
        F.lit(False).alias("malformed"),
        F.lit(None).cast("string").alias("rejected"),
        *[columns[name].alias(f"f_{name}") for name in rules.record_fields],
    )
    return records, rejected


def maxwell_events(values: DataFrame, specs: Sequence[MaxwellSpec]) -> tuple[DataFrame, DataFrame]:
    """Maxwell records (column ``value``) as normalized events: ``(events, rejected)``.

    ``events`` has :data:`EVENT_COLUMNS` (key, event_type, event_time ms,
    event_id, seq, raw): the events of :func:`maxwell_records`, without the
    ignored records. ``rejected`` has ``raw`` and ``reason``. Lazy; O(rows ×
    patterns).
    """
    from pyspark.sql import functions as F

    if not specs:
        raise MaxwellError("no Maxwell mapping: give at least one MaxwellSpec")
    normalized, rejected = _normalized(values, specs, {s.rule: 0 for s in specs}, 1)
    events = normalized.where(~F.col("ignored")).select(*EVENT_COLUMNS)
    return events, rejected


# ----------------------------------------------------------------------------- parsing


def _schema() -> Any:
    from pyspark.sql import types as T

    text = [T.StructField(name, T.StringType()) for name in (*_STRING_FIELDS, "position")]
    row = T.MapType(T.StringType(), T.StringType())
    return T.StructType([*text, T.StructField("data", row), T.StructField("old", row)])


def _parsed(values: DataFrame) -> DataFrame:
    """``raw`` (the record's text) and Maxwell's fields, all as text but data and old."""
    from pyspark.sql import functions as F

    types = dict(values.dtypes)
    if types.get("value") not in ("string", "binary"):
        raise MaxwellError(
            "Maxwell records are a frame with a 'value' column of string or binary, "
            f"got columns {values.dtypes}"
        )
    lines = values.select(F.col("value").cast("string").alias("raw"))
    lines = lines.where(F.trim(F.col("raw")) != "")
    return lines.select("raw", F.from_json("raw", _schema()).alias("m")).select("raw", "m.*")


def _whole(text: Column, digits: int) -> Column:
    """``text`` as a long when it is a whole number of at most ``digits`` digits."""
    from pyspark.sql import functions as F

    return F.when(text.rlike(f"^[0-9]{{1,{digits}}}$"), text.cast("long"))


def _typed(parsed: DataFrame) -> DataFrame:
    """Adds the numbers (``_ts``, ``_xid``, ``_file``, ...) and the event time ``_time``."""
    from pyspark.sql import functions as F

    ts = _whole(F.col("ts"), 12)
    position = F.col("position")
    return parsed.select(
        "*",
        F.when(F.col("type").isin(*_DDL_KINDS), _whole(F.col("ts"), 15))
        .otherwise(F.coalesce(_whole(F.col("ts_ms"), 15), ts * 1000))
        .alias("_time"),
        _whole(F.col("xid"), 18).alias("_xid"),
        _whole(F.col("xoffset"), 18).alias("_xoffset"),
        F.when(position.rlike(_POSITION_RE), F.regexp_extract(position, _POSITION_RE, 2))
        .cast("long")
        .alias("_file"),
        F.when(position.rlike(_POSITION_RE), F.regexp_extract(position, _POSITION_RE, 3))
        .cast("long")
        .alias("_offset"),
    )


def _reason() -> Column:
    """Why a parsed record is rejected, or null."""
    from pyspark.sql import functions as F

    c = F.col
    kind = c("type")

    def missing(name: str) -> Column:
        return F.lit(f"missing or invalid field '{name}'")

    reason = F.when(
        c("database").isNull() & c("table").isNull() & kind.isNull(),
        F.lit("not a Maxwell JSON record"),
    )
    reason = reason.when(kind.isNull(), missing("type"))
    reason = reason.when(~kind.isin(*_KNOWN_TYPES), F.concat(F.lit("unknown change type "), kind))
    reason = reason.when(c("database").isNull(), missing("database"))
    reason = reason.when(c("table").isNull() & ~kind.isin(*_DDL_KINDS), missing("table"))
    rows = kind.isin(*_ROW_KINDS, _BOOTSTRAP_ROW)
    reason = reason.when(c("data").isNull() & rows, missing("data"))
    reason = reason.when(c("_time").isNull(), missing("ts"))
    return _order_reason(reason)


def _order_reason(reason: Column) -> Column:
    """The rejections of a position, xid or xoffset the sequence cannot hold."""
    from pyspark.sql import functions as F

    c = F.col
    position = c("position")
    reason = reason.when(
        position.isNotNull() & c("_file").isNull(),
        F.concat(F.lit("invalid field 'position': expected FILE.N:OFFSET, got "), position),
    )
    reason = reason.when(
        (c("_file") >= 1 << FILE_NUMBER_BITS) | (c("_offset") >= 1 << OFFSET_BITS),
        F.concat(
            F.lit("binlog position "),
            position,
            F.lit(" cannot be encoded in the sequence: the file number must be below 2^30 "),
            F.lit("and the offset below 2^32"),
        ),
    )
    by_xid = position.isNull() & c("xid").isNotNull()
    reason = reason.when(
        by_xid & (c("_xid").isNull() | (c("_xid") >= 1 << XID_BITS)),
        F.concat(F.lit("xid "), c("xid"), F.lit(" cannot be encoded: expected 0 to 2^42 - 1")),
    )
    return reason.when(
        by_xid
        & c("xoffset").isNotNull()
        & (c("_xoffset").isNull() | (c("_xoffset") >= _LAST_XOFFSET)),
        F.concat(
            F.lit("xoffset "), c("xoffset"), F.lit(" cannot be encoded: expected 0 to 2^20 - 2")
        ),
    )


# ----------------------------------------------------------------------------- order, ids


def _sequence() -> Column:
    """The sequence: from the position, else from xid and xoffset, else a row's life."""
    from pyspark.sql import functions as F

    c = F.col
    by_position = F.lit(POSITION_BASE) + F.shiftleft(c("_file"), OFFSET_BITS) + c("_offset")
    xoffset = F.coalesce(
        c("_xoffset"), F.when(c("commit") == "true", F.lit(_LAST_XOFFSET)), F.lit(0)
    )
    by_xid = F.shiftleft(c("_xid"), XOFFSET_BITS) + xoffset
    life: Column = F.lit(0)
    for kind, rank in _LIFE_RANK.items():
        life = F.when(c("type") == kind, F.lit(rank)).otherwise(life)
    return F.coalesce(by_position, by_xid, life.cast("long"))


def _content_hash() -> Column:
    """16 hex digits of SHA-256 over the record's parsed content, columns sorted."""
    from pyspark.sql import functions as F

    c = F.col
    content = F.struct(
        *[c(name) for name in ("type", "position", "xid", "xoffset", "ts", "ts_ms")],
        F.array_sort(F.map_entries(c("data"))).alias("data"),
        F.array_sort(F.map_entries(c("old"))).alias("old"),
    )
    return F.substring(F.sha2(F.to_json(content), 256), 1, 16)


def _identity() -> Column:
    """What names a change in its event id (the module doc's table of ids)."""
    from pyspark.sql import functions as F

    c = F.col
    by_content = F.concat(c("_time").cast("string"), F.lit("#"), c("_hash"))
    return (
        F.when(c("type") == _BOOTSTRAP_ROW, by_content)
        .when(c("position").isNotNull(), c("position"))
        .when(
            c("xid").isNotNull(),
            F.concat(c("xid"), F.lit(":"), F.coalesce(c("xoffset"), F.lit("0"))),
        )
        .otherwise(by_content)
    )


# ----------------------------------------------------------------------------- patterns


def _condition(mapping: MaxwellMapping) -> Column:
    """The Spark condition selecting the row changes ``mapping`` matches. O(1)."""
    from pyspark.sql import functions as F

    conds: list[Column] = []
    if mapping.kind is not None:
        conds.append(F.col("type") == _PATTERN_TYPES[mapping.kind])
    if mapping.transition:
        assert mapping.column is not None
        conds.append(F.col("type") == "update")
        conds.append(F.map_contains_key(F.col("old"), mapping.column))
        if mapping.before != "*":
            conds.append(F.col("old")[mapping.column] == F.lit(mapping.before))
        conds.append(F.col("data")[mapping.column] == F.lit(mapping.after))
    elif mapping.column is not None:
        conds.append(F.col("data")[mapping.column] == F.lit(mapping.after))
        if mapping.kind is None:
            changed = (F.col("type") == "update") & F.coalesce(
                F.map_contains_key(F.col("old"), mapping.column), F.lit(False)
            )
            conds.append((F.col("type") == "insert") | changed)
    cond = conds[0]
    for more in conds[1:]:
        cond = cond & more
    return cond


def _spec_type(spec: MaxwellSpec) -> Column:
    """The event type ``spec`` gives a record (its first matching pattern), or null."""
    from pyspark.sql import functions as F

    event_type: Column = F.lit(None).cast("string")
    for mapping in reversed(spec.mappings):
        event_type = F.when(_condition(mapping), F.lit(mapping.event_type)).otherwise(event_type)
    in_table = (F.col("database") == spec.database) & (F.col("table") == spec.table)
    return F.when(in_table, event_type)


def _matches(specs: Sequence[MaxwellSpec], rule_key: dict[str, int], keys: int) -> Column:
    """One struct per event type some spec gives the record (``present``), with its keys.

    Rules that map one table to one event type give ONE event, not one per
    rule: its key field ``k<i>`` is the primary key of the first such spec
    of a rule keyed by field ``i``; ``key`` (for the id) that of the first.
    Reads the per-spec types ``_t<n>``.
    """
    from pyspark.sql import functions as F

    structs = []
    for event_type in dict.fromkeys(t for spec in specs for t in spec.event_types):
        hits = [(n, s) for n, s in enumerate(specs) if event_type in s.event_types]
        is_type = {n: F.col(f"_t{n}") == event_type for n, _ in hits}
        pk = {n: F.col("data")[s.primary_key] for n, s in hits}
        present = is_type[hits[0][0]]
        for n, _ in hits[1:]:
            present = present | is_type[n]
        missing = [
            F.when(
                is_type[n] & pk[n].isNull(), F.lit(f"missing primary key '{s.primary_key}' in data")
            )
            for n, s in hits
        ]
        fields = [
            F.lit(event_type).alias("event_type"),
            present.alias("present"),
            F.coalesce(*[F.when(is_type[n], pk[n]) for n, _ in hits]).alias("key"),
            F.coalesce(*missing).alias("reason"),
        ]
        for index in range(keys):
            own = [F.when(is_type[n], pk[n]) for n, s in hits if rule_key[s.rule] == index]
            key = F.coalesce(*own) if own else F.lit(None).cast("string")
            fields.append(key.alias(f"k{index}"))
        structs.append(F.struct(*fields))
    return F.filter(F.array(*structs), lambda match: match["present"])


def _event_id() -> Column:
    """``db.table/KEY@IDENTITY/TYPE`` of the event ``e``."""
    from pyspark.sql import functions as F

    c = F.col
    table = F.coalesce(c("table"), F.lit(""))
    parts = [c("database"), F.lit("."), table, F.lit("/"), c("e.key"), F.lit("@")]
    return F.concat(*parts, _identity(), F.lit("/"), c("e.event_type"))


def _ignored_id(event_type: Column) -> Column:
    """``db.table@TIME#HASH/maxwell:TYPE`` of a record that is not an event."""
    from pyspark.sql import functions as F

    c = F.col
    table = F.coalesce(c("table"), F.lit(""))
    parts = [c("database"), F.lit("."), table, F.lit("@"), c("_time").cast("string")]
    return F.concat(*parts, F.lit("#"), c("_hash"), F.lit("/"), event_type)


def _normalized(
    values: DataFrame, specs: Sequence[MaxwellSpec], rule_key: dict[str, int], keys: int
) -> tuple[DataFrame, DataFrame]:
    """(records: raw, event_type, event_time, event_id, seq, key, k0.., ignored; rejected)."""
    from pyspark.sql import functions as F

    c = F.col
    checked = _typed(_parsed(values))
    checked = checked.select("*", _reason().alias("reason"))
    invalid = checked.where(c("reason").isNotNull()).select("raw", "reason")
    good = checked.where(c("reason").isNull()).select(
        "*",
        _sequence().alias("_seq"),
        _content_hash().alias("_hash"),
        *[_spec_type(spec).alias(f"_t{n}") for n, spec in enumerate(specs)],
    )
    good = good.select("*", F.explode_outer(_matches(specs, rule_key, keys)).alias("e"))
    no_key = good.where(c("e.reason").isNotNull()).select("raw", c("e.reason"))
    good = good.where(c("e.reason").isNull())
    event = c("e").isNotNull()
    ignored_type = F.concat(F.lit(IGNORED_PREFIX), c("type"))
    records = good.select(
        "raw",
        F.when(event, c("e.event_type")).otherwise(ignored_type).alias("event_type"),
        c("_time").alias("event_time"),
        F.when(event, _event_id()).otherwise(_ignored_id(ignored_type)).alias("event_id"),
        c("_seq").alias("seq"),
        c("e.key").alias("key"),
        *[c(f"e.k{index}").alias(f"k{index}") for index in range(keys)],
        (~event).alias("ignored"),
    )
    return records, invalid.unionByName(no_key)
