"""Where the stream's carried operations are held between micro-batches: one interface,
:class:`OpsProvider`, and two providers, as Spark's state store has two
(``docs/pipeline-design.md``, "Carried state"):

- the driver provider, :class:`~.ops_index.OpsIndex`: Arrow in the driver,
  indexed by key and due watermark; the default, while the state fits the
  driver's bound (:mod:`..resident`);
- the partitioned provider, :class:`~.partitioned.PartitionedOps`: an embedded
  RocksDB store per key partition on the executors (:mod:`.partition_store`),
  for a state past the bound, on classic sessions.

The carried events (the dedup window, bounded by the allowed lateness) stay with
the driver under both. Writing changelogs and snapshots, and rebuilding from
them, is :mod:`..changelog`'s: a provider gives its changes and its whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["OpsProvider"]


class OpsProvider(Protocol):
    """Carried operations (:data:`~...spark.outputs.OPS_COLUMNS`) held where a micro-batch
    takes in only those it can change."""

    #: ``"driver"`` or ``"partitioned"``: what a commit records as its state's provider.
    provider: str

    @property
    def rows(self) -> int:
        """The rows held."""

    @property
    def nbytes(self) -> int:
        """The bytes of the driver's memory it takes, measured."""

    def take_touched(self, keys: Mapping[str, pa.Array], watermark: int) -> pa.Table:
        """Take the rows a micro-batch whose events have ``keys`` (by rule name) can
        change at ``watermark``: those due, and every row of a touched (rule, key)."""

    def put_back(self, added: pa.Table, removed: pa.Table, tag: str) -> None:
        """What the attempt ``tag`` changed: the rows it holds on (``added``) and those it
        took in (``removed``)."""

    def committed(self) -> None:
        """The attempt whose changes were put back committed."""

    def whole(self) -> Any:
        """Every row held, with the changes put back: Arrow in the driver, or a
        DataFrame (a snapshot's, written by Spark)."""

    def without_rules(self, names: Iterable[str]) -> OpsProvider:
        """A provider of the rows held but those of the rules ``names``."""

    def release(self) -> None:
        """Let what it holds go."""
