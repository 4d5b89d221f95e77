"""The carried ``ops`` rows of each committed micro-batch: what retention must keep flat.

Shared by the retention test and its benchmark. The stream prunes a committed
state once the next batch commits, so the rows are counted at the commit.
"""

from __future__ import annotations

import os
from typing import Any


def record_ops_rows(job: Any, seen: list[tuple[int, int]]) -> None:
    """Append (watermark, ops rows) to ``seen`` as ``job`` commits each batch's state."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    commit = job.store.commit

    def recording(batch_id: int, meta: dict[str, Any]) -> dict[str, Any]:
        record: dict[str, Any] = commit(batch_id, meta)
        path = job.store.state_path(batch_id, record)
        seen.append((meta["watermark"], pq.read_table(os.path.join(path, "ops")).num_rows))
        return record

    job.store.commit = recording
