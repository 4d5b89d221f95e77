"""The stream's errors, and the fencing error read back out of the text Spark carries."""

from __future__ import annotations

import re

__all__ = ["CheckpointFenced", "CheckpointInUse", "StreamError"]


class StreamError(RuntimeError):
    """The stream cannot run (bad options, inconsistent checkpoint)."""


class CheckpointInUse(StreamError):
    """Another job holds the checkpoint's lock."""


class CheckpointFenced(StreamError):
    """A newer job took the checkpoint over: this one stops, and writes nothing more."""

    def __init__(self, checkpoint: str, ours: int | None, token: int, host: str | None) -> None:
        """The message names the newer owner's token and host. O(1)."""
        super().__init__(
            f"checkpoint {checkpoint} was taken over by token {token} on host "
            f"{host or 'unknown'}; this job (token {ours}) stops without writing again"
        )
        self.token, self.host = token, host

    @classmethod
    def found_in(cls, exc: BaseException) -> CheckpointFenced | None:
        """The fencing error inside ``exc`` (Spark's ``StreamingQueryException`` carries
        the text of foreachBatch's error, from whichever process ran it), or None.
        O(len(message))."""
        if isinstance(exc, cls):
            return exc
        found = _FENCED.search(str(exc))
        if found is None:
            return None
        ours = None if found["ours"] == "None" else int(found["ours"])
        return cls(found["checkpoint"], ours, int(found["token"]), found["host"])


_FENCED = re.compile(
    r"checkpoint (?P<checkpoint>\S+) was taken over by token (?P<token>\d+) on host "
    r"(?P<host>\S+); this job \(token (?P<ours>\w+)\)"
)
