"""The carried ``ops`` rows of each committed micro-batch: what retention must keep flat.

Shared by the retention test and its benchmark. The stream prunes a committed
state once the next batch commits, so the rows are counted at the commit, from
what the checkpoint holds (a snapshot and the changelogs after it).
"""

from __future__ import annotations

from typing import Any


def record_ops_rows(job: Any, seen: list[tuple[int, int]]) -> None:
    """Append (watermark, ops rows) to ``seen`` as ``job`` commits each batch's state."""
    from tickwheel.pipeline.stream.changelog import committed_tables

    commit = job.store.commit

    def recording(made: Any) -> Any:
        record = commit(made)
        ops = committed_tables(job.store, record.batch_id, record)["ops"]
        seen.append((record.watermark, ops.num_rows))
        return record

    job.store.commit = recording
