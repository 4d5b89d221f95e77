"""Rules: which events open, complete and cancel which delayed operations.

A rules file is TOML (read with :mod:`tomllib`)::

    [input]                      # field names of the input records (all optional)
    key = "order_id"             # default key field of the rules
    type = "type"                # event type
    time = "ts"                  # event time: epoch ms or ISO-8601 with an offset
    id = "event_id"              # event id (deduplication)
    sequence = "seq"             # optional tie-breaker at equal times
    format = "json"              # json (JSON Lines), csv or parquet
    allowed_lateness = "0"       # the watermark is max event time minus this
    retention = "7d"             # how long a key's last expiry is kept; "off": for ever

    [rules.payment]
    key = "order_id"             # optional: defaults to [input].key
    open = ["created"]
    complete = ["paid"]
    cancel = ["cancelled"]       # optional
    timeout = "30m"              # "30m", "45s", "2h", "1d", "250ms" or an int of ms

A rule may also say how MySQL row changes, as Maxwell writes them, become its
events (read by :mod:`tickwheel.pipeline.spark.maxwell`)::

    [rules.payment.maxwell]
    database = "shop"
    table = "orders"
    primary_key = "id"           # the event key
    [rules.payment.maxwell.events]
    created = "insert"           # one pattern, or a list: the first that matches
    paid = "status: created -> paid"

Event-type patterns (first match in file order wins; a row change no pattern
matches is not an event of the rule):

* ``insert`` / ``update`` / ``delete`` — any change of that kind;
* ``bootstrap`` — a row of a Maxwell bootstrap (``bootstrap-insert``): the
  table's current row, read when the bootstrap ran. No other pattern matches
  it: a snapshot row is state, not a change;
* ``KIND: COL = V`` (KIND one of the above) — that kind, where the row's COL is V;
* ``COL: A -> B`` — an update that changed COL from A to B (``*`` for any A);
* ``COL = V`` — an insert with COL = V, or an update that set COL to V.

Every event type a ``maxwell`` table maps must be one of its rule's open,
complete or cancel types.

Every problem is reported as a :class:`RulesError` that names the rule and the
field at fault (and the file, from :func:`load_rules`).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_RETENTION_MS",
    "InputConfig",
    "MaxwellError",
    "MaxwellMapping",
    "MaxwellSpec",
    "Rule",
    "Rules",
    "RulesError",
    "load_rules",
    "parse_duration",
    "parse_event_spec",
    "parse_rules",
]

KIND_OPEN = 0
KIND_COMPLETE = 1
KIND_CANCEL = 2
KIND_NAMES = ("open", "complete", "cancel")

FORMATS = ("json", "csv", "parquet")

#: ``[input].retention`` when the rules file does not set it: seven days.
DEFAULT_RETENTION_MS = 7 * 86_400_000

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_KIND_RE = re.compile(r"^(insert|update|delete|bootstrap)(?:\s*:\s*(\w+)\s*=\s*(.+?))?$")
_TRANSITION_RE = re.compile(r"^(\w+)\s*:\s*(.+?)\s*->\s*(.+?)$")
_VALUE_RE = re.compile(r"^(\w+)\s*=\s*(.+?)$")


class RulesError(ValueError):
    """A rules file, or a rule in it, is invalid; the message says where and why."""


class MaxwellError(RulesError):
    """A rule's ``maxwell`` table, or Maxwell input with these rules, is unusable."""


def parse_duration(value: object, what: str = "duration") -> int:
    """Return ``value`` in milliseconds: an int of ms, or "250ms", "45s", "30m", "2h", "1d".

    A bare number in a string ("1500") is milliseconds. Raises :class:`RulesError`
    naming ``what`` for anything else, including negative or fractional values. O(1).
    """
    if isinstance(value, bool):
        raise RulesError(f"{what}: expected a duration like '30m', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise RulesError(f"{what}: must not be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is not None:
            return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]
    raise RulesError(
        f"{what}: expected an int of milliseconds or a string like '250ms', '45s', "
        f"'30m', '2h' or '1d', got {value!r}"
    )


def format_duration(ms: int | None, *, as_written: bool = False) -> str:
    """``ms`` for a reader, in its largest unit: ``850ms``, ``12.0s``, ``3.5h``, ``2.0d``.

    ``as_written``: as a rules file writes a setting, which :func:`parse_duration`
    reads back: the largest unit that divides it (``30m``, ``1500ms``), and None as
    ``off``. O(1).
    """
    if ms is None:
        return "off"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    for unit, size in _UNITS_LARGEST_FIRST:
        if as_written and ms and ms % size == 0:
            return f"{sign}{ms // size}{unit}"
        if not as_written and ms >= size:
            return f"{sign}{ms / size:,.1f}{unit}"
    return f"{sign}{ms}ms"


_UNITS_LARGEST_FIRST = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


@dataclass(frozen=True)
class InputConfig:
    """Field names and format of the input records, the allowed lateness and the retention.

    ``retention_ms`` is how long after its time a key's expiry marker still
    gives a late complete or cancel the reason ``after_expiry`` (None: for
    ever); see :func:`tickwheel.pipeline.core.marker_holds`.
    """

    key: str = "key"
    type: str = "type"
    time: str = "time"
    id: str = "event_id"
    sequence: str | None = None
    format: str = "json"
    allowed_lateness_ms: int = 0
    retention_ms: int | None = DEFAULT_RETENTION_MS


@dataclass(frozen=True)
class Rule:
    """One named rule: events of ``open`` types open an operation that times out."""

    name: str
    key: str
    open: tuple[str, ...]
    complete: tuple[str, ...]
    cancel: tuple[str, ...]
    timeout_ms: int

    @property
    def event_types(self) -> tuple[str, ...]:
        """The types the rule uses: its open, complete and cancel types, in that order. O(types)."""
        return (*self.open, *self.complete, *self.cancel)

    def kind_of(self, event_type: str) -> int | None:
        """KIND_OPEN, KIND_COMPLETE, KIND_CANCEL, or None if the rule ignores the type. O(types)."""
        if event_type in self.open:
            return KIND_OPEN
        if event_type in self.complete:
            return KIND_COMPLETE
        if event_type in self.cancel:
            return KIND_CANCEL
        return None


@dataclass(frozen=True, slots=True)
class MaxwellMapping:
    """One event type and the row-change pattern that produces it (see the module doc)."""

    event_type: str
    kind: str | None  # insert/update/delete/bootstrap, or None for any of insert/update
    column: str | None = None
    before: str | None = None  # None: no condition; "*": any previous value
    after: str | None = None
    transition: bool = False


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
        "'bootstrap', 'update: COL = V', 'COL: A -> B', 'COL: * -> B' or 'COL = V'"
    )


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


@dataclass(frozen=True, slots=True)
class MaxwellSpec:
    """How one rule reads one MySQL table's Maxwell stream: ``[rules.NAME.maxwell]``."""

    rule: str
    database: str
    table: str
    primary_key: str
    mappings: tuple[MaxwellMapping, ...]

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types the patterns produce, in file order, once each. O(patterns)."""
        return tuple(dict.fromkeys(m.event_type for m in self.mappings))

    @classmethod
    def from_mapping(cls, rule: str, raw: object) -> MaxwellSpec:
        """Validate a rule's ``maxwell`` TOML table. O(number of patterns)."""
        where = f"[rules.{rule}.maxwell]"
        if not isinstance(raw, Mapping):
            raise MaxwellError(f"{where}: expected a table, got {raw!r}")
        unknown = sorted(set(raw) - {"database", "table", "primary_key", "events"})
        if unknown:
            raise MaxwellError(f"{where}: unknown field(s) {unknown}")
        for name in ("database", "table", "primary_key"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise MaxwellError(f"{where}.{name}: must be a non-empty string")
        events = raw.get("events")
        if not isinstance(events, Mapping) or not events:
            raise MaxwellError(f"{where}.events: must map event types to patterns")
        mappings: list[MaxwellMapping] = []
        for event_type, spec in events.items():
            specs = [spec] if isinstance(spec, str) else spec
            if (
                not isinstance(specs, list)
                or not specs
                or not all(isinstance(s, str) for s in specs)
            ):
                raise MaxwellError(
                    f"{where}.events.{event_type}: expected a pattern or a list of patterns"
                )
            try:
                mappings.extend(parse_event_spec(event_type, s) for s in specs)
            except MaxwellError as exc:
                raise MaxwellError(f"{where}.events.{event_type}: {exc}") from None
        return cls(rule, raw["database"], raw["table"], raw["primary_key"], tuple(mappings))


@dataclass(frozen=True)
class Rules:
    """The rules of one job, in file order, with the input configuration."""

    rules: tuple[Rule, ...]
    input: InputConfig = field(default_factory=InputConfig)
    #: The rules' ``[rules.NAME.maxwell]`` tables, in file order (Maxwell input).
    maxwell: tuple[MaxwellSpec, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Rule names in order. O(rules)."""
        return tuple(rule.name for rule in self.rules)

    @property
    def key_fields(self) -> tuple[str, ...]:
        """The distinct key fields used by the rules, in first-use order. O(rules)."""
        seen: dict[str, None] = {}
        for rule in self.rules:
            seen.setdefault(rule.key, None)
        return tuple(seen)

    @property
    def record_fields(self) -> tuple[str, ...]:
        """The fields a record is read for: id, type, time, sequence, the key fields;
        each once, in that order. O(rules)."""
        cfg = self.input
        names = [cfg.id, cfg.type, cfg.time]
        if cfg.sequence is not None:
            names.append(cfg.sequence)
        names.extend(self.key_fields)
        return tuple(dict.fromkeys(names))

    @property
    def event_types(self) -> tuple[str, ...]:
        """Every event type some rule uses, sorted. O(types)."""
        types: set[str] = set()
        for rule in self.rules:
            types.update(rule.event_types)
        return tuple(sorted(types))

    @property
    def timeouts_ms(self) -> tuple[int, ...]:
        """Timeout of each rule, by rule index. O(rules)."""
        return tuple(rule.timeout_ms for rule in self.rules)


def _str_list(value: object, what: str, required: bool) -> tuple[str, ...]:
    if value is None:
        if required:
            raise RulesError(f"{what}: missing; give a list of event types")
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RulesError(f"{what}: expected a list of non-empty strings, got {value!r}")
    if required and not value:
        raise RulesError(f"{what}: needs at least one event type")
    if len(set(value)) != len(value):
        raise RulesError(f"{what}: lists an event type twice: {value!r}")
    return tuple(value)


def _field_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _FIELD_NAME.match(value):
        raise RulesError(f"{what}: expected a field name (letters, digits, _ . -), got {value!r}")
    return value


def _parse_input(table: object) -> InputConfig:
    if table is None:
        return InputConfig()
    if not isinstance(table, Mapping):
        raise RulesError(f"[input]: expected a table, got {table!r}")
    known = {"key", "type", "time", "id", "sequence", "format", "allowed_lateness", "retention"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise RulesError(f"[input]: unknown setting(s) {unknown}; known: {sorted(known)}")
    default = InputConfig()
    names = {
        name: _field_name(table[name], f"[input].{name}")
        if name in table
        else getattr(default, name)
        for name in ("key", "type", "time", "id")
    }
    sequence = table.get("sequence")
    if sequence is not None:
        sequence = _field_name(sequence, "[input].sequence")
    fmt = table.get("format", "json")
    if fmt not in FORMATS:
        raise RulesError(f"[input].format: expected one of {FORMATS}, got {fmt!r}")
    used = [names["type"], names["time"], names["id"], *([sequence] if sequence else [])]
    if len(set(used)) != len(used):
        raise RulesError(f"[input]: type, time, id and sequence must be distinct fields: {used}")
    lateness = parse_duration(table.get("allowed_lateness", 0), "[input].allowed_lateness")
    return InputConfig(
        key=names["key"],
        type=names["type"],
        time=names["time"],
        id=names["id"],
        sequence=sequence,
        format=fmt,
        allowed_lateness_ms=lateness,
        retention_ms=_retention(table.get("retention", DEFAULT_RETENTION_MS)),
    )


def _retention(value: object) -> int | None:
    """``[input].retention``: a duration (0 keeps no marker), or ``"off"`` (None: keep all)."""
    if isinstance(value, str) and value.strip().lower() == "off":  # as --max-future off
        return None
    try:
        return parse_duration(value, "[input].retention")
    except RulesError as exc:
        raise RulesError(f"{exc}, or 'off' to keep every expiry marker") from None


def _parse_rule(name: str, table: object, config: InputConfig) -> Rule:
    where = f"rule {name!r}"
    if not isinstance(table, Mapping):
        raise RulesError(f"{where}: expected a table, got {table!r}")
    known = {"key", "open", "complete", "cancel", "timeout", "maxwell"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise RulesError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
    key = _field_name(table.get("key", config.key), f"{where}.key")
    if key in (config.type, config.time, config.id, config.sequence):
        raise RulesError(f"{where}.key: {key!r} is already the type, time, id or sequence field")
    open_ = _str_list(table.get("open"), f"{where}.open", required=True)
    complete = _str_list(table.get("complete"), f"{where}.complete", required=True)
    cancel = _str_list(table.get("cancel"), f"{where}.cancel", required=False)
    for a_name, a, b_name, b in (
        ("open", open_, "complete", complete),
        ("open", open_, "cancel", cancel),
        ("complete", complete, "cancel", cancel),
    ):
        both = sorted(set(a) & set(b))
        if both:
            raise RulesError(f"{where}: event type(s) {both} are both {a_name} and {b_name}")
    if "timeout" not in table:
        raise RulesError(f"{where}.timeout: missing; give a duration like '30m'")
    timeout = parse_duration(table["timeout"], f"{where}.timeout")
    if timeout <= 0:
        raise RulesError(f"{where}.timeout: must be positive, got {table['timeout']!r}")
    return Rule(name, key, open_, complete, cancel, timeout)


def parse_rules(data: Mapping[str, Any]) -> Rules:
    """Build :class:`Rules` from a parsed TOML document; raise :class:`RulesError` if invalid."""
    unknown = sorted(set(data) - {"input", "rules"})
    if unknown:
        raise RulesError(f"unknown top-level table(s) {unknown}; expected [input] and [rules.NAME]")
    config = _parse_input(data.get("input"))
    tables = data.get("rules")
    if not isinstance(tables, Mapping) or not tables:
        raise RulesError("no rules: add at least one [rules.NAME] table")
    rules = []
    specs = []
    for name, table in tables.items():
        if not re.match(r"^[A-Za-z0-9_.-]+$", name):
            raise RulesError(f"rule name {name!r}: use letters, digits, _ . -")
        rule = _parse_rule(name, table, config)
        rules.append(rule)
        if "maxwell" in table:
            specs.append(_maxwell_spec(rule, table["maxwell"]))
    return Rules(tuple(rules), config, tuple(specs))


def _maxwell_spec(rule: Rule, table: object) -> MaxwellSpec:
    """The rule's ``maxwell`` table, whose event types must be the rule's own."""
    spec = MaxwellSpec.from_mapping(rule.name, table)
    unused = [t for t in spec.event_types if rule.kind_of(t) is None]
    if unused:
        raise MaxwellError(
            f"[rules.{rule.name}.maxwell].events: {unused} are not among the rule's "
            f"open, complete or cancel types {list(rule.event_types)}"
        )
    return spec


def load_rules(path: str | Path) -> Rules:
    """Read and validate a rules TOML file; errors name the file."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise RulesError(f"{path}: no such rules file") from None
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_rules(data)
    except RulesError as exc:
        raise RulesError(f"{path}: {exc}") from None
