"""One attempt at a micro-batch, and the part of its files' names that is its own.

Both the sinks (which stage an attempt's outputs) and the stream's checkpoint
(which commits the attempt that counts) name files by it; see
``docs/pipeline-design.md``, "Commit protocol (exactly once)".
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

__all__ = ["Attempt"]


class Attempt(NamedTuple):
    """One attempt at a batch: its owner's fencing token and an id of its own.

    Every file an attempt writes (the state, the sink's staged tables) is
    under a name made of :attr:`tag`, so no two attempts share a file.
    """

    token: int | None
    id: str

    @classmethod
    def new(cls, token: int | None) -> Attempt:
        """A new attempt of the owner with ``token``. O(1)."""
        return cls(token, uuid.uuid4().hex[:12])

    @property
    def tag(self) -> str:
        """``t<token>-<id>``: the attempt's part of its files' names. O(1)."""
        return f"t{self.token if self.token is not None else 0}-{self.id}"
