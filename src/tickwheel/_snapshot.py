"""Immutable snapshots of a timer's wheels and delay queue, for tracing and tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BucketSnapshot", "LevelSnapshot", "WheelSnapshot"]


@dataclass(frozen=True, slots=True)
class BucketSnapshot:
    """One bucket: its index, expiration (-1 when unset) and its tasks' expirations, in order."""

    index: int
    expiration_ms: int
    task_expirations: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LevelSnapshot:
    """One level of the wheel, with all of its buckets."""

    tick_ms: int
    wheel_size: int
    interval_ms: int
    current_time_ms: int
    buckets: tuple[BucketSnapshot, ...]


@dataclass(frozen=True, slots=True)
class WheelSnapshot:
    """The whole timer: levels (finest first), queued buckets, and the task count.

    ``queue`` is sorted in due order and holds ``(expiration_ms, level_index,
    bucket_index)`` for every bucket queued now.
    """

    levels: tuple[LevelSnapshot, ...]
    queue: tuple[tuple[int, int, int], ...]
    size: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the snapshot."""
        return asdict(self)
