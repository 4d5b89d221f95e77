"""The records of the commit log: a batch's :class:`Commit`, and an owner's :class:`Fence`.

Each is one JSON file in a commit slot (``commits/N.json``, ``commits/N.T.json``;
format 1: ``state/N/meta.json``). This module is the one place that knows their
keys: :meth:`Commit.from_json` reads every format this release reads, and
:meth:`Commit.to_json` writes :data:`STATE_FORMAT`. What the records mean in the
protocol is told in ``docs/pipeline-design.md``, "Commit protocol (exactly once)"
and "Versions of the state".
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["STATE_FORMAT", "Commit", "Fence", "Stamp", "StateEntry", "read_slot"]

#: The version of the state's format that this release writes. It reads every
#: earlier one: 1, the layout without ``commits/`` (``state/N/meta.json``); 2, the
#: commit files, which record the rules, the input format and the release; 3, a
#: directory per attempt (``state/N/A/``), commits that name it and the sink's
#: staged outputs, and the fenced commit slots (``commits/N.T.json``); 4, commits
#: that hold the state's changes since the previous batch, with a whole state every
#: K batches (:mod:`..resident`). Each has a checkpoint its last writer left in
#: ``tests/pipeline/fixtures/checkpoint-format-N/``.
STATE_FORMAT = 4


@dataclass(frozen=True)
class Stamp:
    """What every commit and fence records of its writer: the owner's token and host,
    the state format and the release."""

    owner_token: int | None = None
    host: str | None = None
    format: object = None  # as recorded: None before format 2 recorded it
    tickwheel: str | None = None

    @classmethod
    def now(cls, owner_token: int | None) -> Stamp:
        """This process's stamp, in :data:`STATE_FORMAT`. O(1)."""
        from .... import __version__

        return cls(owner_token, socket.gethostname(), STATE_FORMAT, __version__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stamp:
        """The stamp of a record as read (any format). O(1)."""
        token = data.get("owner_token")
        return cls(
            owner_token=token if isinstance(token, int) else None,
            host=data.get("host"),
            format=data.get("format"),
            tickwheel=data.get("tickwheel"),
        )

    @property
    def version(self) -> object:
        """The record's state format: as recorded, or 1 for a record without one. O(1)."""
        return 1 if self.format is None else self.format

    @property
    def readable(self) -> bool:
        """Whether this release reads the record's format (1 to :data:`STATE_FORMAT`). O(1)."""
        return isinstance(self.version, int) and self.version <= STATE_FORMAT

    def to_json(self) -> dict[str, Any]:
        """The stamp's keys. O(1)."""
        return {
            "owner_token": self.owner_token,
            "host": self.host,
            "format": self.format,
            "tickwheel": self.tickwheel,
        }


@dataclass(frozen=True)
class StateEntry:
    """How a commit holds its state (format 4): whole (``snapshot``), or as a
    ``changelog`` on the state committed with batch ``after``, the ``changelogs``-th
    since the snapshot of batch ``base``; ``whole`` names the tables a changelog
    holds whole (the carried events)."""

    kind: Literal["snapshot", "changelog"]
    base: int | None = None
    after: int | None = None
    changelogs: int = 0
    whole: tuple[str, ...] = ()

    @classmethod
    def snapshot(cls) -> StateEntry:
        """A whole state. O(1)."""
        return cls("snapshot")

    @property
    def is_changelog(self) -> bool:
        """Whether the commit holds only the changes since batch :attr:`after`. O(1)."""
        return self.kind == "changelog"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateEntry:
        """The entry as a commit holds it. O(1)."""
        if data.get("kind") != "changelog":
            return cls.snapshot()
        return cls(
            "changelog",
            base=int(data["base"]),
            after=int(data["after"]),
            changelogs=int(data.get("changelogs", 0)),
            whole=tuple(data.get("whole", ())),
        )

    def to_json(self) -> dict[str, Any]:
        """The entry's keys (a snapshot has only its kind; ``whole`` only when set)."""
        if not self.is_changelog:
            return {"kind": "snapshot"}
        out: dict[str, Any] = {
            "kind": "changelog",
            "base": self.base,
            "after": self.after,
            "changelogs": self.changelogs,
        }
        if self.whole:
            out["whole"] = list(self.whole)
        return out


@dataclass(frozen=True)
class Commit:
    """The commit of one micro-batch: what it took, what it left, and who wrote it.

    ``attempt`` names the attempt whose state and staged outputs count (None
    before format 3: the state is in ``state/N/`` itself); ``state`` says how
    the state is held (None before format 4: whole); ``sink`` is where the
    outputs are and what the sink staged (before format 3: None); ``rules`` the
    rules it ran with (before format 2: None). ``state_provider`` says who held the
    state the commit left, ``"driver"`` or ``"partitioned"``, and ``state_bytes`` the
    driver's memory it took there, measured (for a partitioned state, the events and
    the changes in flight; None: an older release's commit). A partitioned state
    also records its ``state_partitions`` and the share of them its micro-batch's job
    found on their own executor (``state_local_share``; None: a job that read none). ``stamp`` and
    ``committed_at_ms`` are set by the store as it commits
    (:meth:`~.commits.StateStore.commit`).
    """

    batch_id: int
    watermark: int | None = None
    max_time: int | None = None
    new_min_time: int | None = None
    new_max_time: int | None = None
    files: tuple[str, ...] | None = None
    rules: Mapping[str, Any] | None = None
    input: str | None = None
    input_format: str | None = None
    purgatory_partitions: int | None = None
    written_by: str | None = None
    counts: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    attempt: str | None = None
    state_rows: int | None = None
    state_provider: str | None = None
    state_bytes: int | None = None
    state_partitions: int | None = None
    state_local_share: float | None = None
    state: StateEntry | None = None
    sink: Mapping[str, Any] | None = None
    stamp: Stamp = field(default_factory=Stamp)
    committed_at_ms: int | None = None

    @property
    def staged(self) -> Any:
        """What the sink staged for this commit to publish (None: nothing recorded). O(1)."""
        return (self.sink or {}).get("staged")

    @property
    def snapshot_base(self) -> int:
        """The batch of the snapshot this commit's state builds on: its own, for a
        snapshot or an older format's whole state. O(1)."""
        state = self.state
        return int(state.base) if state is not None and state.base is not None else self.batch_id

    @property
    def holds_changelog(self) -> bool:
        """Whether the commit holds its state as changes only. O(1)."""
        return self.state is not None and self.state.is_changelog

    def stamped(self, token: int | None) -> Commit:
        """This commit as the owner with ``token`` makes it, now. O(1)."""
        return dataclasses.replace(
            self, stamp=Stamp.now(token), committed_at_ms=int(time.time() * 1000)
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Commit:
        """A commit as any format (1 to :data:`STATE_FORMAT`) wrote it. O(size)."""
        files, state = data.get("files"), data.get("state")
        return cls(
            batch_id=int(data["batch_id"]),
            watermark=data.get("watermark"),
            max_time=data.get("max_time"),
            new_min_time=data.get("new_min_time"),
            new_max_time=data.get("new_max_time"),
            files=None if files is None else tuple(files),
            rules=data.get("rules"),
            input=data.get("input"),
            input_format=data.get("input_format"),
            purgatory_partitions=data.get("purgatory_partitions"),
            written_by=data.get("written_by"),
            counts=dict(data.get("counts") or {}),
            warnings=tuple(data.get("warnings") or ()),
            attempt=data.get("attempt"),
            state_rows=data.get("state_rows"),
            state_provider=data.get("state_provider"),
            state_bytes=data.get("state_bytes"),
            state_partitions=data.get("state_partitions"),
            state_local_share=data.get("state_local_share"),
            state=None if state is None else StateEntry.from_json(state),
            sink=data.get("sink"),
            stamp=Stamp.from_json(data),
            committed_at_ms=data.get("committed_at_ms"),
        )

    def to_json(self) -> dict[str, Any]:
        """The commit's file, in :data:`STATE_FORMAT`. O(size)."""
        return {
            "batch_id": self.batch_id,
            "watermark": self.watermark,
            "max_time": self.max_time,
            "new_min_time": self.new_min_time,
            "new_max_time": self.new_max_time,
            "files": None if self.files is None else list(self.files),
            "rules": None if self.rules is None else dict(self.rules),
            "input": self.input,
            "input_format": self.input_format,
            "purgatory_partitions": self.purgatory_partitions,
            "written_by": self.written_by,
            "counts": dict(self.counts),
            "warnings": list(self.warnings),
            "attempt": self.attempt,
            "state_rows": self.state_rows,
            "state_provider": self.state_provider,
            "state_bytes": self.state_bytes,
            "state_partitions": self.state_partitions,
            "state_local_share": self.state_local_share,
            "state": None if self.state is None else self.state.to_json(),
            "sink": None if self.sink is None else dict(self.sink),
            **self.stamp.to_json(),
            "committed_at_ms": self.committed_at_ms,
        }


@dataclass(frozen=True)
class Fence:
    """An owner's fence in a commit slot: only ``token`` commits in the slot after it."""

    token: int
    stamp: Stamp = field(default_factory=Stamp)

    @property
    def host(self) -> str | None:
        """The fencing owner's host, as its stamp says. O(1)."""
        return self.stamp.host

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fence:
        """A fence as any format wrote it. O(1)."""
        return cls(int(data["token"]), Stamp.from_json(data))

    def to_json(self) -> dict[str, Any]:
        """The fence's file. O(1)."""
        return {"fence": True, "token": self.token, **self.stamp.to_json()}


def read_slot(data: Mapping[str, Any]) -> Commit | Fence:
    """What a commit slot's file holds: a fence, or a commit. O(size)."""
    return Fence.from_json(data) if data.get("fence") else Commit.from_json(data)
