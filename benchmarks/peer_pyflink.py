"""A Flink user's program for the orders rule: PyFlink's ``KeyedProcessFunction``, one process.

What a data engineer would write with PyFlink's Python DataStream API for
"an order not paid within the timeout", as its documentation advises:

* the JSON Lines files through Flink's ``FileSource`` (text lines), in the
  order tickwheel's file source takes them (modification time, then name);
* each line parsed in Python, keeping the events of the rule's types;
* ``WatermarkStrategy.for_bounded_out_of_orderness`` of the rules' allowed
  lateness, with a timestamp assigner on the event time;
* keyed by the rule's key (the order), a ``KeyedProcessFunction`` with a
  ``ValueState`` for the pending operation, a ``MapState`` of the event ids
  seen (copies of an id are dropped), and an event-time timer at each
  deadline. The rule machine is ``_one_op_rule.OneOpRule``, the same code the
  Spark peers run (``_stream_peers.py``), shipped to the Python workers with
  ``add_python_file``;
* the outcomes as JSON Lines through Flink's ``FileSink``, committed on
  checkpoints (``--checkpoint-interval``, and the final checkpoint when the
  input ends);
* parallelism = the cores (``--parallelism``, 2), and the Python workers tuned
  as the docs advise for stateful Python functions (:data:`TUNED`: larger
  state caches and bundles); ``--defaults`` runs without that tuning.

Its semantics, those of the Spark peers: one operation per key; an event
stamped at or before the watermark is late and dropped (Flink's watermark is
the largest time seen minus the lateness minus 1 ms); a timer fires once the
watermark reaches it. The ids seen for a key are dropped once the watermark
passes the key's latest event (a copy would then be late). When the input
ends, Flink's final watermark (``Long.MAX_VALUE``) fires every timer left, so
an operation still within its timeout at the end is written as ``expired``
too, where tickwheel writes it as ``pending``; the check leaves such keys out
(their deadline is not below the stream's final watermark). ``on_timer``
cannot tell them apart: the Python operators hold a watermark until their
bundle ends, and the timers that the input's last watermarks fire report the
final one too. The outcomes are compared with the stream's by
``bench_pipeline_incremental.py --cli --cli-peers pyflink``
(``_stream_peers.check_peer``).

It runs in its own environment (PyFlink pins its own pyarrow, apache-beam and
more): ``make bench-env-pyflink`` creates ``.venvs/pyflink`` from
``benchmarks/requirements-pyflink.txt``. It needs neither tickwheel nor
PySpark: the rules file is read with ``tomllib``. Java 11 or newer on the
``PATH`` (or ``JAVA_HOME``).

    .venvs/pyflink/bin/python benchmarks/peer_pyflink.py --input DIR --output OUT \\
        [--rules RULES] [--parallelism 2] [--checkpoint-interval 2s] [--defaults]

``--output`` is replaced. The rules' ``allowed_lateness`` is the watermark's
delay: with ``examples/orders.toml``'s ``0`` nearly every event that arrives
after a later-stamped one is late, so give it the lateness the data needs
(``bench_pipeline_incremental.py --cli`` passes 3 minutes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _one_op_rule import EMPTY, OUTCOME_FIELDS, OneOpRule, State

ROOT = Path(__file__).resolve().parents[1]

#: The Python workers' settings PyFlink's configuration docs give for stateful
#: Python functions: keep more keys' state and more MapState entries in the
#: worker (defaults 1,000 each), and send larger bundles between the JVM and
#: the worker (defaults 1,000 elements, 1 s); ``--defaults`` runs without them.
TUNED = {
    "python.state.cache-size": "1000000",
    "python.map-state.read-cache-size": "1000000",
    "python.map-state.write-cache-size": "1000000",
    "python.fn-execution.bundle.size": "1000000",
    "python.fn-execution.bundle.time": "5000",
}

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_INT = re.compile(r"^-?[0-9]+$")
_ISO = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})$"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


# ----------------------------------------------------------------------------- the rules file


def _duration_ms(value: object) -> int:
    """A duration of the rules file in ms: an int of ms, or "250ms", "45s", "30m", "2h", "1d"."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise SystemExit(f"rules: expected a duration like '30m', got {value!r}")
    return int(match.group(1)) * _UNITS_MS[match.group(2) or "ms"]


@dataclass(frozen=True)
class OrderRule:
    """The first rule of a rules file, and the input's fields and lateness."""

    name: str
    key: str
    open: tuple[str, ...]
    complete: tuple[str, ...]
    cancel: tuple[str, ...]
    timeout_ms: int
    id_field: str
    type_field: str
    time_field: str
    seq_field: str
    lateness_ms: int


def read_rule(path: Path) -> OrderRule:
    """The first ``[rules.*]`` table of the rules file at ``path`` (tickwheel's format)."""
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    inp, rules = doc.get("input", {}), doc.get("rules", {})
    if not rules:
        raise SystemExit(f"{path}: no [rules.*] table")
    name, rule = next(iter(rules.items()))
    kinds = {part: tuple(rule.get(part, ())) for part in ("open", "complete", "cancel")}
    return OrderRule(
        name=name,
        key=rule.get("key", inp.get("key", "key")),
        timeout_ms=_duration_ms(rule["timeout"]),
        id_field=inp.get("id", "id"),
        type_field=inp.get("type", "type"),
        time_field=inp.get("time", "time"),
        seq_field=inp.get("sequence", "seq"),
        lateness_ms=_duration_ms(inp.get("allowed_lateness", 0)),
        **kinds,
    )


# ----------------------------------------------------------------------------- the functions


def _text(value: object) -> str | None:
    """A field read as text, as tickwheel reads it: a number is its digits; empty is missing."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _event_ms(value: object) -> int | None:
    """Epoch milliseconds of a time field: an integer, its digits, or ISO-8601 with an offset."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str):
        return None
    if _INT.match(value):
        return int(value)
    if _ISO.match(value):
        return (dt.datetime.fromisoformat(value) - _EPOCH) // dt.timedelta(milliseconds=1)
    return None


def parse_events(rule: OrderRule) -> Any:
    """The function that turns a JSON line into (key, ms, seq, id, type), or nothing."""
    kinds = frozenset((*rule.open, *rule.complete, *rule.cancel))

    def parse(line: str) -> Iterator[tuple[str, int, int, str, str]]:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict):
            return
        kind = _text(record.get(rule.type_field))
        if kind not in kinds:
            return
        key, event_id = _text(record.get(rule.key)), _text(record.get(rule.id_field))
        ms, seq = _event_ms(record.get(rule.time_field)), record.get(rule.seq_field, 0)
        if key is None or event_id is None or ms is None:
            return
        if isinstance(seq, str) and _INT.match(seq):
            seq = int(seq)
        if not isinstance(seq, int) or isinstance(seq, bool):
            return
        yield key, ms, seq, event_id, kind

    return parse


def _json_outcome(row: tuple[Any, ...]) -> str:
    return json.dumps(dict(zip(OUTCOME_FIELDS, row, strict=True)), separators=(",", ":"))


def order_process_function(rule: OrderRule) -> Any:
    """The ``KeyedProcessFunction`` applying :class:`OneOpRule` per key (see the module doc)."""
    from pyflink.common import Types
    from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
    from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

    class OrderTimeouts(KeyedProcessFunction):  # type: ignore[misc]
        """Per order: the pending operation and the key's latest event time, the ids seen."""

        def __init__(self, machine: OneOpRule) -> None:
            self.machine = machine

        def open(self, runtime_context: RuntimeContext) -> None:
            # (OneOpRule's state, the latest event time seen), pickled: fields may be None.
            self.op = runtime_context.get_state(
                ValueStateDescriptor("op", Types.PICKLED_BYTE_ARRAY())
            )
            self.seen = runtime_context.get_map_state(
                MapStateDescriptor("seen", Types.STRING(), Types.BOOLEAN())
            )

        def _wake(self, state: State, latest: int | None) -> set[int]:
            """The key's timers: its operation's (deadline), and the end of its ids' dedup."""
            return {t for t in (self.machine.timer(state), latest) if t is not None}

        def _store(self, old: tuple[State, int | None], new: tuple[State, int | None],
                   timers: Any) -> None:  # fmt: skip
            before, after = self._wake(*old), self._wake(*new)
            for t in before - after:
                timers.delete_event_time_timer(t)
            for t in after - before:
                timers.register_event_time_timer(t)
            if new == (EMPTY, None):
                self.op.clear()
            elif new != old:
                self.op.update(new)

        def process_element(self, value: Any, ctx: Any) -> Iterator[str]:
            key, ms, seq, event_id, kind = value
            timers = ctx.timer_service()
            if ms <= timers.current_watermark() or self.seen.contains(event_id):
                return  # late (the watermark passed it), or a copy of an id seen
            self.seen.put(event_id, True)
            stored = self.op.value()
            old = (EMPTY, None) if stored is None else stored
            state, out = self.machine.apply(key, old[0], [(ms, seq, event_id, kind)])
            latest = ms if old[1] is None else max(old[1], ms)
            self._store(old, (state, latest), timers)
            for row in out:
                yield _json_outcome(row)

        def on_timer(self, timestamp: int, ctx: Any) -> Iterator[str]:
            stored = self.op.value()
            if stored is None:
                return
            state, latest = stored
            if self.machine.timer(state) == timestamp:
                for row in self.machine.expire(ctx.get_current_key(), state, timestamp):
                    yield _json_outcome(row)
                state = EMPTY
            if latest is not None and timestamp >= latest:
                self.seen.clear()  # any copy of these ids would now be late
                latest = None
            if (state, latest) == (EMPTY, None):
                self.op.clear()
            else:
                self.op.update((state, latest))

    return OrderTimeouts(OneOpRule(rule))


# ----------------------------------------------------------------------------- the job


def input_files(inp: Path) -> list[Path]:
    """The input's files in the order tickwheel's source takes them: modification time, name."""
    files = [p for p in inp.iterdir() if p.is_file() and not p.name.startswith((".", "_"))]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))


def environment(parallelism: int, checkpoint_ms: int, tuned: bool) -> Any:
    """A local ``StreamExecutionEnvironment``, streaming mode, with :data:`TUNED` if ``tuned``."""
    from pyflink.common import Configuration
    from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment

    config = Configuration()
    config.set_string("python.executable", sys.executable)
    config.set_string("python.client.executable", sys.executable)
    for name, value in (TUNED if tuned else {}).items():
        config.set_string(name, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_runtime_mode(RuntimeExecutionMode.STREAMING)
    env.set_parallelism(parallelism)
    env.enable_checkpointing(checkpoint_ms)
    env.add_python_file(str(Path(__file__).with_name("_one_op_rule.py")))
    return env


def build_job(env: Any, files: list[Path], out: Path, rule: OrderRule) -> None:
    """Source, parse, watermarks, key by order, the process function, the file sink."""
    from pyflink.common import Duration, Encoder, Types, WatermarkStrategy
    from pyflink.common.watermark_strategy import TimestampAssigner
    from pyflink.datastream.connectors.file_system import (
        BucketAssigner,
        FileSink,
        FileSource,
        OutputFileConfig,
        StreamFormat,
    )
    from pyflink.datastream.connectors.hybrid_source import HybridSource

    class EventTime(TimestampAssigner):  # type: ignore[misc]
        def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
            return int(value[1])

    # One FileSource per file, read one after the other: a FileSource hands its
    # files to its readers in no set order (its split assigner keeps them in a
    # hash set), and the events must arrive in file order, as a topic partition
    # delivers them; HybridSource reads its sources in the order given.
    sources = [FileSource.for_record_stream_format(StreamFormat.text_line_format(), str(path))
               .build() for path in files]  # fmt: skip
    builder = HybridSource.builder(sources[0])
    for source in sources[1:]:
        builder.add_source(source)
    event_type = Types.TUPLE(
        [Types.STRING(), Types.LONG(), Types.LONG(), Types.STRING(), Types.STRING()]
    )
    watermarks = WatermarkStrategy.for_bounded_out_of_orderness(
        Duration.of_millis(rule.lateness_ms)
    ).with_timestamp_assigner(EventTime())
    sink = (
        FileSink.for_row_format(str(out), Encoder.simple_string_encoder())
        .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner())
        .with_output_file_config(OutputFileConfig.builder().with_part_suffix(".jsonl").build())
        .build()
    )
    (
        env.from_source(
            builder.build(), WatermarkStrategy.no_watermarks(), "orders", type_info=Types.STRING()
        )
        .set_parallelism(1)  # one reader, in file order; parsing is spread over the cores
        .flat_map(parse_events(rule), output_type=event_type)
        .assign_timestamps_and_watermarks(watermarks)
        .key_by(lambda event: event[0], key_type=Types.STRING())
        .process(order_process_function(rule), output_type=Types.STRING())
        .sink_to(sink)
    )


def count_outcomes(out: Path) -> Counter[str]:
    """The outcomes the sink committed (hidden in-progress files left out), by kind."""
    counts: Counter[str] = Counter()
    for part in out.iterdir():
        if part.is_file() and not part.name.startswith((".", "_")):
            with part.open(encoding="utf-8") as fh:
                counts.update(json.loads(line)["outcome"] for line in fh)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Run the job over ``--input`` to its end; print its time and its outcomes' counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, type=Path, help="directory of JSON Lines files")
    parser.add_argument("--output", required=True, type=Path, help="outcomes (JSON Lines)")
    parser.add_argument("--rules", type=Path, default=ROOT / "examples" / "orders.toml")
    parser.add_argument("--parallelism", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--checkpoint-interval", default="2s",
                        help="how often the sink commits (a duration: 500ms, 2s)")  # fmt: skip
    parser.add_argument("--defaults", action="store_true",
                        help="the Python workers' default settings, not TUNED")  # fmt: skip
    args = parser.parse_args(argv)
    if args.parallelism < 1:
        parser.error("--parallelism must be >= 1")
    if not args.input.is_dir():
        parser.error(f"--input {args.input}: not a directory")
    checkpoint_ms = _duration_ms(args.checkpoint_interval)
    if checkpoint_ms < 10:
        parser.error("--checkpoint-interval must be at least 10ms")
    rule = read_rule(args.rules)
    files = input_files(args.input)
    shutil.rmtree(args.output, ignore_errors=True)
    started = time.perf_counter()
    env = environment(args.parallelism, checkpoint_ms, tuned=not args.defaults)
    build_job(env, files, args.output, rule)
    result = env.execute("peer-pyflink")
    job_s = result.get_net_runtime() / 1e3
    counts = count_outcomes(args.output)
    print(f"pyflink: {len(files)} files, parallelism {args.parallelism}, "
          f"{'default' if args.defaults else 'tuned'} Python workers: job {job_s:.1f}s, "
          f"{time.perf_counter() - started:.1f}s with the environment; outcomes "
          + ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items())))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
