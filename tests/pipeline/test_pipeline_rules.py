"""Rules files: durations, defaults and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tickwheel.pipeline.rules import (
    KIND_CANCEL,
    KIND_COMPLETE,
    KIND_OPEN,
    RulesError,
    load_rules,
    parse_duration,
    parse_rules,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders.toml"


@pytest.mark.parametrize(
    ("text", "ms"),
    [("30m", 1_800_000), ("45s", 45_000), ("2h", 7_200_000), ("1d", 86_400_000),
     ("250ms", 250), ("1500", 1500), (1500, 1500), (" 5 m ", 300_000)],
)  # fmt: skip
def test_durations(text: object, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["30 minutes", "1.5h", "-5s", -5, True, None, "", "m"])
def test_bad_durations_are_named(bad: object) -> None:
    with pytest.raises(RulesError, match="timeout"):
        parse_duration(bad, "rule 'x'.timeout")


def test_example_rules_file() -> None:
    rules = load_rules(EXAMPLE)
    assert rules.names == ("payment",)
    rule = rules.rules[0]
    assert (rule.key, rule.timeout_ms) == ("order_id", 1_800_000)
    assert rules.input.sequence == "seq"
    assert rule.kind_of("created") == KIND_OPEN
    assert rule.kind_of("paid") == KIND_COMPLETE
    assert rule.kind_of("cancelled") == KIND_CANCEL
    assert rule.kind_of("shipped") is None


def _rules(**rule: object) -> dict[str, object]:
    base: dict[str, object] = {"open": ["a"], "complete": ["b"], "timeout": "1s"}
    base.update(rule)
    return {"rules": {"r": {k: v for k, v in base.items() if v is not None}}}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "no rules"),
        ({"rules": {}}, "no rules"),
        (_rules(timeout=None), r"rule 'r'.timeout: missing"),
        (_rules(timeout="0"), "must be positive"),
        (_rules(open=[]), "needs at least one"),
        (_rules(open=None), r"rule 'r'.open: missing"),
        (_rules(complete=["a"]), "both open and complete"),
        (_rules(cancel=["b"]), "both complete and cancel"),
        (_rules(open=["a", "a"]), "twice"),
        (_rules(color="red"), "unknown setting"),
        (_rules(key="ts", timeout="1s") | {"input": {"time": "ts"}}, "already the type"),
        ({"input": {"format": "xml"}, **_rules()}, "format"),
        ({"input": {"allowed_lateness": "soon"}, **_rules()}, "allowed_lateness"),
        ({"inputs": {}, **_rules()}, "unknown top-level"),
    ],
)
def test_invalid_rules_are_explained(doc: dict[str, object], message: str) -> None:
    with pytest.raises(RulesError, match=message):
        parse_rules(doc)


def test_rules_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[rules.x\n", encoding="utf-8")
    with pytest.raises(RulesError, match=r"bad\.toml: not valid TOML"):
        load_rules(bad)
    with pytest.raises(RulesError, match="no such rules file"):
        load_rules(tmp_path / "missing.toml")


def test_several_rules_and_key_fields() -> None:
    rules = parse_rules(
        {
            "input": {"key": "order_id", "allowed_lateness": "5m"},
            "rules": {
                "pay": {"open": ["created"], "complete": ["paid"], "timeout": "30m"},
                "ship": {"key": "shipment", "open": ["packed"], "complete": "shipped",
                         "timeout": 3_600_000},
            },
        }
    )  # fmt: skip
    assert rules.key_fields == ("order_id", "shipment")
    assert rules.event_types == ("created", "packed", "paid", "shipped")
    assert rules.input.allowed_lateness_ms == 300_000
    assert rules.timeouts_ms == (1_800_000, 3_600_000)


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (None, 7 * 86_400_000),
        ("off", None),
        ("Off", None),
        ("10m", 600_000),
        (0, 0),
        ("2d", 172_800_000),
    ],
)
def test_retention(value: object, ms: int | None) -> None:
    doc = _rules() | ({} if value is None else {"input": {"retention": value}})
    assert parse_rules(doc).input.retention_ms == ms


@pytest.mark.parametrize("bad", ["forever", "of", "-1d", "1.5h", -5, True, False, 2.5, ""])
def test_bad_retention_is_named(bad: object) -> None:
    with pytest.raises(RulesError, match=r"\[input\]\.retention: .*or 'off'"):
        parse_rules({"input": {"retention": bad}, **_rules()})
