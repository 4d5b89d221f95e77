"""A function of the user's as the stream's sink, with ``foreachBatch``'s contract."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from .base import SinkError, SinkFunction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..attempt import Attempt


__all__ = [
    "FunctionSink",
]


class FunctionSink:
    """A function of the user's as the stream's sink, with ``foreachBatch``'s contract.

    ``fn(tables, batch_id)`` gets the micro-batch's ``outcomes``,
    ``unmatched``, ``rejected`` and ``late`` DataFrames. It is called before
    the checkpoint commits the batch, so after a crash it may be called again
    with the same batch id, and then gets the same rows: the step recomputes
    them from the same records and the same carried state. Making the writes
    idempotent by batch id (a table keyed by it, Delta's
    ``txnAppId``/``txnVersion``, a MERGE), or leaving the duplicates to the
    consumer (a Kafka topic), is the function's part, as with Spark's own
    ``foreachBatch``. The built-in sinks keep their own exactly-once commit.
    """

    name = "function"

    def __init__(self, fn: SinkFunction) -> None:
        """Call ``fn`` for each micro-batch. O(1)."""
        if not callable(fn):
            raise SinkError(f"a sink function must be callable, got {fn!r}")
        self.fn = fn

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        attempt: Attempt,
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
    ) -> None:
        """Call the function with the batch's tables (every one, empty or not)."""
        self.fn(dict(tables), batch_id)
        if on_table is not None:
            for name in sorted(tables):
                on_table(name)

    def commit(self, batch_id: int, staged: Mapping[str, Any] | None) -> bool:
        """Nothing to do: the function wrote what it wrote. O(1)."""
        return True

    def location(self) -> dict[str, Any]:
        """A function's sink cannot be opened again from a checkpoint. O(1)."""
        return {"name": self.name}

    def is_committed(self, batch_id: int) -> bool:
        """False: a replayed batch is handed to the function again. O(1)."""
        return False

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """None: the rows are where the function put them. O(1)."""
        return None

    def describe(self) -> str:
        """``function:<qualified name>``."""
        return f"function:{getattr(self.fn, '__qualname__', repr(self.fn))}"
