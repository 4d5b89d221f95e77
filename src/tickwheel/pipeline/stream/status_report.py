"""A stream checkpoint's figures as a report for a reader: ``tickwheel pipeline status``.

:func:`render_status` renders what :func:`~.status.checkpoint_status` collects;
it reads nothing itself.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from ..rules import format_duration
from .resident import format_bytes
from .status import listable, rule_names

__all__ = ["render_status"]

#: Who holds the state, for a reader (:attr:`~.resident.ResidentState.provider`).
_PROVIDERS = {"driver": "the driver", "partitioned": "the executors"}


def _held_by(state: dict[str, Any]) -> str:
    """Who holds the state, and what it takes of the driver's memory."""
    memory = state.get("memory_bytes")
    provider = str(state["provider"])
    held = _PROVIDERS.get(provider, provider)
    if provider == "partitioned":
        share = state.get("partitions_local")
        local = "" if share is None else f", {share:.0%} found local by the last micro-batch"
        held += f" ({state.get('partitions')} key partitions{local})"
        return held + ("" if memory is None else f", {format_bytes(memory)} of the driver's memory")
    return held + ("" if memory is None else f", {format_bytes(memory)} of its memory")


def _when(ms: int | None) -> str:
    if ms is None:
        return "unknown"
    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def render_status(status: Mapping[str, Any]) -> str:
    """:func:`checkpoint_status`'s figures as a report for a reader. O(rules + lines)."""
    out = [f"checkpoint {status['checkpoint']}"]

    def line(label: str, text: str) -> None:
        out.append(f"  {label:<16}{text}")

    last = status["last_batch"]
    if last is None:
        line("last batch", "none committed yet")
    else:
        at = status["committed_at_ms"]
        when = (
            "commit time not recorded"
            if at is None
            else f"committed {_when(at)} ({format_duration(status['commit_age_ms'])} ago)"
        )
        line("last batch", f"{last}, {when}")
    if status.get("running_batch") is not None:
        line("running batch", f"{status['running_batch']} (planned by Spark, not committed)")
    wm = status["watermark"]
    if wm is None:
        line("watermark", "none yet")
    else:
        line("watermark", f"{_when(wm)} ({format_duration(status['watermark_lag_ms'])} behind now)")
    if status.get("last_batch") is not None:  # a commit records them
        line("rules", _rules_text(status.get("rules")))
    if status.get("format") is not None or status.get("tickwheel") is not None:
        made = [f"state format {status['format']}"] if status.get("format") is not None else []
        if status.get("tickwheel") is not None:
            made.append(f"written by tickwheel {status['tickwheel']}")
        line("written", ", ".join(made))
    pending = status.get("pending")
    if pending is not None:
        line("pending", f"{pending['total']:,} operation(s)")
        for rule, figures in pending["by_rule"].items():
            oldest = figures["oldest_deadline"]
            first = "" if oldest is None else f", oldest deadline {_when(oldest)}"
            if oldest is not None and wm is not None:
                first += f" ({format_duration(oldest - wm)} after the watermark)"
            line(f"  {rule}", f"{figures['count']:,}{first}")
        line("expiry markers", f"{status['markers']:,}")
        events = status["events"]
        line("events carried", f"{events['rows']:,} ({events['buffered']:,} buffered above "
             "the watermark)")  # fmt: skip
        state = status["state"]
        rows = "unknown" if state["rows"] is None else f"{state['rows']:,}"
        line("state", f"{rows} rows, {format_bytes(state['bytes'])} in {state['files']} file(s)")
        if state.get("provider") is not None:
            line("state held by", _held_by(state))
    files = status["files"]
    source = {"tickwheel": "tickwheel's file log", "spark": "Spark's file source log"}
    taken = (
        "unknown (no file log in the checkpoint)"
        if files["taken"] is None
        else f"{files['taken']:,} taken ({source.get(files['source'], files['source'])})"
    )
    line("files", taken)
    if files["waiting"] is not None:
        size = format_bytes(files["waiting_bytes"])
        waiting = f"{files['waiting']:,} file(s) ({size}) in {files['input']}"
    elif files["input"] is None:
        waiting = "unknown (no input recorded: give --input)"
    elif not listable(files["input"]):
        waiting = f"unknown (the input recorded, {files['input']}, is relative: give --input)"
    else:
        waiting = f"unknown ({files['input']} not listed)"
    line("waiting", waiting)
    for path in files.get("next_waiting") or []:
        line("  next", path)
    owner = status.get("owner")
    if owner is None:
        line("owner", "none recorded")
    else:
        who = (
            f"pid {owner['pid']} on {owner['host']} since {owner['since']} (token {owner['token']})"
        )
        state_text = "HOLDS the checkpoint" if owner["holding"] else "not holding it"
        line("owner", f"{who}: {state_text} ({owner['how']})")
    for warning in status.get("warnings") or []:
        line("warning", f"batch {last}: {warning}")
    return "\n".join(out) + "\n"


def _rules_text(rules: Any) -> str:
    """The recorded rules in one line: each rule's types and timeout, else its name."""
    if rules is None:
        return "not recorded (a checkpoint of an older release)"
    inner = rules.get("rules") if isinstance(rules, Mapping) else None
    if isinstance(inner, list) and all(isinstance(r, Mapping) for r in inner):
        text = "; ".join(_rule_text(r) for r in inner)
        lateness = rules.get("input", {}).get("allowed_lateness_ms")
        if isinstance(lateness, int):
            text += f"; allowed lateness {format_duration(lateness)}"
        return text
    names = rule_names(rules)
    return ", ".join(names) if names else json.dumps(rules, sort_keys=True)


def _rule_text(rule: Mapping[str, Any]) -> str:
    parts = [
        f"{kind} {'|'.join(map(str, rule[kind]))}"
        for kind in ("open", "complete", "cancel")
        if rule.get(kind)
    ]
    timeout = rule.get("timeout_ms")
    if isinstance(timeout, int):
        parts.append(f"timeout {format_duration(timeout)}")
    if rule.get("key"):
        parts.append(f"key {rule['key']}")
    return f"{rule.get('name')} ({', '.join(parts)})"
