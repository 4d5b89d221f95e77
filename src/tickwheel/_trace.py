"""``tickwheel trace``: run a timer on a manual clock and record every state, step by step."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ._clock import ManualClock
from ._snapshot import WheelSnapshot
from ._timer import SystemTimer

__all__ = ["TraceStep", "render_trace", "run_trace"]

#: The worked example of the TimingWheel docstring (and of Kafka lectures on it).
EXAMPLE_START_MS = 1675752020558
EXAMPLE_DELAYS = (1000, 2000, 3000, 4000, 5000, 6000, 7000)


@dataclass(frozen=True)
class TraceStep:
    """The timer's state after one step: the adds (step 0) or one ``advance_clock``."""

    label: str
    clock_ms: int
    fired: tuple[int, ...]
    snapshot: WheelSnapshot
    advanced: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "clock_ms": self.clock_ms,
            "advanced": self.advanced,
            "fired": [{"task": i, "delay_ms": self.extra["delays"][i]} for i in self.fired],
            "snapshot": self.snapshot.to_dict(),
        }


def run_trace(
    tick_ms: int = 1000,
    wheel_size: int = 3,
    start_ms: int = EXAMPLE_START_MS,
    delays: tuple[int, ...] = EXAMPLE_DELAYS,
    max_steps: int = 1000,
) -> list[TraceStep]:
    """Add one task per delay at ``start_ms``, then step the clock bucket by bucket.

    Each step moves the clock straight to the head of the delay queue (the next
    non-empty bucket, as the reaper would) and calls ``advance_clock(0)``, until
    every task has fired or ``max_steps`` is reached.
    """
    clock = ManualClock(start_ms)
    fired: list[int] = []
    meta = {"delays": list(delays)}
    steps: list[TraceStep] = []
    with SystemTimer(
        name="trace", tick_ms=tick_ms, wheel_size=wheel_size, clock=clock, executor="inline"
    ) as timer:
        for index, delay in enumerate(delays):
            timer.schedule(delay, fired.append, index)
        steps.append(
            TraceStep(
                f"after adding {len(delays)} tasks",
                start_ms,
                tuple(fired),
                timer.snapshot(),
                extra=meta,
            )
        )
        for step in range(1, max_steps + 1):
            if timer.size == 0:
                break
            head = timer._queue.head_expiration_ms()
            assert head is not None
            if head > clock.now_ms():
                clock.set(head)
            before = len(fired)
            advanced = timer.advance_clock(0)
            steps.append(
                TraceStep(
                    f"step {step}",
                    clock.now_ms(),
                    tuple(fired[before:]),
                    timer.snapshot(),
                    advanced=advanced,
                    extra=meta,
                )
            )
    return steps


def _fmt(ms: int) -> str:
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return f"{stamp:%Y-%m-%d %H:%M:%S}.{ms % 1000:03d}"


def render_trace(steps: list[TraceStep]) -> str:
    """Readable text: levels × buckets with ranges, tasks and queue, in time and raw ms."""
    lines: list[str] = []
    delays: list[int] = steps[0].extra["delays"] if steps else []
    for step in steps:
        snap = step.snapshot
        lines.append(f"== {step.label}: clock {_fmt(step.clock_ms)} ({step.clock_ms} ms) ==")
        if step.label.startswith("step"):
            what = (
                ", ".join(f"task {i} (delay {delays[i]} ms)" for i in step.fired)
                if step.fired
                else "nothing"
            )
            lines.append(f"advance_clock(0) -> {step.advanced}; fired: {what}")
        lines.append(f"size {snap.size}")
        for level_index, level in enumerate(snap.levels):
            lines.append(
                f"level {level_index}: tick {level.tick_ms} ms x {level.wheel_size} buckets "
                f"= {level.interval_ms} ms, current {_fmt(level.current_time_ms)} "
                f"({level.current_time_ms})"
            )
            for bucket in level.buckets:
                if bucket.expiration_ms == -1:
                    lines.append(f"  [{bucket.index}] unset")
                    continue
                start = bucket.expiration_ms
                end = start + level.tick_ms
                tasks = ", ".join(f"{_fmt(e)} ({e})" for e in bucket.task_expirations) or "empty"
                lines.append(
                    f"  [{bucket.index}] [{_fmt(start)}, {_fmt(end)}) = [{start}, {end}): {tasks}"
                )
        queue = ", ".join(f"L{lv}[{ix}]@{_fmt(exp)} ({exp})" for exp, lv, ix in snap.queue)
        lines.append(f"queue: {queue or 'empty'}")
        lines.append("")
    return "\n".join(lines)
