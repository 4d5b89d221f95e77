"""Where a stream's checkpoint ``CK`` keeps tickwheel's part and Spark's: the one home of
those two paths (the layout is in the package's doc)."""

from __future__ import annotations

from ...storage import absolute, join

__all__ = ["checkpoint_of", "spark_checkpoint", "tickwheel_root"]


def tickwheel_root(checkpoint: str) -> str:
    """``CK/tickwheel``: tickwheel's part of the checkpoint ``CK`` (made absolute). O(len)."""
    return join(absolute(checkpoint), "tickwheel")


def spark_checkpoint(checkpoint: str) -> str:
    """``CK/spark``: where Spark keeps its own checkpoint (offsets, commits). O(len)."""
    return join(absolute(checkpoint), "spark")


def checkpoint_of(root: str) -> str:
    """The checkpoint ``CK`` that a ``CK/tickwheel`` root belongs to, for messages. O(len)."""
    return root.rstrip("/").rsplit("/", 1)[0]
