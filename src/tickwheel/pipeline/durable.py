"""Durable files: written so that a crash leaves the old content or the new, never half.

The stream's checkpoint and the Parquet sink both keep small JSON files
(plans, batch markers, owners) that must survive a crash at any instruction:
each is written to a temporary name, fsynced, renamed over the old one, and
the directory is fsynced so the rename itself is on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["fsync_dir", "read_json", "write_json"]


def write_json(path: str, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` atomically and durably.

    A temporary file, fsynced, renamed over ``path``; then the directory is
    fsynced, so the rename itself survives a power loss.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, sort_keys=True, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def read_json(path: str) -> dict[str, Any]:
    """The JSON object in ``path``."""
    with open(path, encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
        return data


def fsync_dir(path: str) -> None:
    """Flush the directory ``path`` (its entries: a rename, a new file) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
