"""One key partition of the carried operations, in an embedded RocksDB store on the executor
that runs it: the executor's half of the partitioned provider (:mod:`.partitioned`).

A store holds two key spaces:

- ``k`` + (rule, key): that pair's rows, each with the watermark at which it
  falls due by itself (:func:`~.ops_index.due_at`);
- ``d`` + that watermark (big-endian, offset so that negative ones sort first) +
  (rule, key): an empty value, so that a scan from the start finds what is due.

and ``m:version``, the tag of the committed state it holds (``"<batch>:<attempt>"``).
A store changes only by a committed batch's changes, applied on the version they
were made on (:meth:`PartitionStore.apply`); a micro-batch's take reads and never
writes. So two attempts of one partition cannot make a store hold a state no
commit names: one that finds a store on another version reports a miss, and the
driver restores the partition from the checkpoint.

Needs ``rocksdict`` (the ``spark`` extra).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ...core import STATE_PENDING
from .ops_index import ALWAYS

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["OpsRow", "PartitionStore", "pair_key"]

#: A stored row: the six columns of :data:`~...spark.outputs.OPS_COLUMNS` (kind, rule,
#: key, event_id, time, deadline), then the watermark at which it falls due.
OpsRow = tuple[Any, ...]
_DUE = 6
_VERSION = b"m:version"
_NULL = b"\xff\xff\xff\xff"
_OFFSET = 2**63


def pair_key(rule: str | None, key: str | None) -> bytes:
    """The bytes that name a (rule, key) pair in a store: each string length-prefixed
    (a null as its own mark), so that no two pairs share them. O(len)."""
    return _text(rule) + _text(key)


def _text(value: str | None) -> bytes:
    if value is None:
        return _NULL
    data = value.encode()
    return len(data).to_bytes(4, "big") + data


def _due_key(due: int, pair: bytes) -> bytes:
    return b"d" + (due + _OFFSET).to_bytes(8, "big") + pair


class PartitionStore:
    """The store of one key partition at ``path``, opened (made when missing) until
    :meth:`close`. Costs are for the rows of the pairs a call names; RocksDB's own
    costs are O(log n) a read or write."""

    def __init__(self, path: Path) -> None:
        """Open the store at ``path``. Raises if another process has it open (RocksDB's
        lock): an attempt of the same partition still running there."""
        from rocksdict import Options, Rdict

        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = Rdict(str(path), Options(raw_mode=True))
        self._loading: tuple[bytes, list[OpsRow]] = (b"", [])  # the pair a load is in

    def close(self) -> None:
        """Flush and close the store. O(1)."""
        self._db.close()

    @property
    def version(self) -> str | None:
        """The tag of the committed state held (None: a store never written). O(1)."""
        value = self._db.get(_VERSION)
        return None if value is None else bytes(value).decode()

    def _rows(self, pair: bytes) -> list[OpsRow]:
        value = self._db.get(b"k" + pair)
        return [] if value is None else pickle.loads(value)

    def write_rows(self, rows: Iterable[OpsRow]) -> None:
        """Load ``rows`` (with their due watermarks) into a store never loaded: the rows of
        one pair together, in this call or continuing the last call's last pair (the
        load's input is sorted by pair). :meth:`finish_load` ends the load. O(rows)."""
        from rocksdict import WriteBatch

        if self.version is not None:
            raise ValueError(f"a store loads once; this one holds {self.version!r}")
        batch = WriteBatch(raw_mode=True)
        pair, group = self._loading
        for row in rows:
            row_pair = pair_key(row[1], row[2])
            if row_pair != pair:
                if group:
                    self._write_pair(batch, pair, [], group)
                pair, group = row_pair, []
            group.append(tuple(row))
        if group:  # written again, whole, if the next call continues it
            self._write_pair(batch, pair, [], group)
        self._loading = (pair, group)
        self._db.write(batch)

    def finish_load(self, version: str) -> None:
        """End a load: the store holds the committed state tagged ``version``. O(1)."""
        self._loading = (b"", [])
        self._db[_VERSION] = version.encode()

    def apply(
        self, before: str, after: str, added: Sequence[OpsRow], removed: Sequence[OpsRow]
    ) -> bool:
        """Apply a committed batch's changes, made on the state ``before``, making the
        state ``after``: ``removed`` rows (six columns) go, each once per copy, and
        ``added`` ones (with their due) come. Nothing when the store holds ``after``
        already; False, changing nothing, when it holds neither. One write batch:
        O(rows of the pairs changed)."""
        from rocksdict import WriteBatch

        held = self.version
        if held == after:
            return True
        if held != before:
            return False
        by_pair: dict[bytes, tuple[list[OpsRow], list[OpsRow]]] = {}
        for row in removed:
            by_pair.setdefault(pair_key(row[1], row[2]), ([], []))[0].append(tuple(row))
        for row in added:
            by_pair.setdefault(pair_key(row[1], row[2]), ([], []))[1].append(tuple(row))
        batch = WriteBatch(raw_mode=True)
        for pair, (gone, new) in by_pair.items():
            old = self._rows(pair)
            kept = list(old)
            for row in gone:
                at = next((i for i, held_row in enumerate(kept) if held_row[:_DUE] == row), None)
                if at is None:
                    raise ValueError(f"a changelog removes a row its state lacks: {row!r}")
                del kept[at]
            self._write_pair(batch, pair, old, kept + new)
        batch.put(_VERSION, after.encode())
        self._db.write(batch)
        return True

    def _write_pair(self, batch: Any, pair: bytes, old: list[OpsRow], new: list[OpsRow]) -> None:
        """Write ``pair``'s rows ``new`` in place of ``old``, the due index with them."""
        old_dues, new_dues = {row[_DUE] for row in old}, {row[_DUE] for row in new}
        for due in old_dues - new_dues:
            batch.delete(_due_key(due, pair))
        for due in new_dues - old_dues:
            batch.put(_due_key(due, pair), b"")
        if new:
            batch.put(b"k" + pair, pickle.dumps(new, protocol=pickle.HIGHEST_PROTOCOL))
        else:
            batch.delete(b"k" + pair)

    def take(self, pairs: Iterable[bytes], watermark: int) -> list[OpsRow]:
        """The rows a micro-batch can change, read (the store is not changed): those due
        at ``watermark``, and every row of the ``pairs`` (of its events' keys) and of
        each pair with a pending operation due, each once (six columns), as
        :meth:`~.ops_index.OpsIndex.take_touched` takes them. O(rows due + rows of the
        pairs)."""
        taken: dict[bytes, set[int]] = {}
        rows: dict[bytes, list[OpsRow]] = {}
        whole: set[bytes] = set(pairs)
        for due, pair in self._due(watermark):
            held = rows.setdefault(pair, self._rows(pair))
            for i, row in enumerate(held):
                if row[_DUE] == due:
                    taken.setdefault(pair, set()).add(i)
                    if row[0] == STATE_PENDING and due != ALWAYS:
                        whole.add(pair)  # it expires: every row of its pair is touched
        for pair in whole:
            held = rows.setdefault(pair, self._rows(pair))
            if held:
                taken[pair] = set(range(len(held)))
        return [rows[pair][i][:_DUE] for pair, found in taken.items() for i in sorted(found)]

    def _due(self, watermark: int) -> Iterator[tuple[int, bytes]]:
        """(due, pair) of each index entry due at ``watermark``, in order."""
        limit = (watermark + _OFFSET).to_bytes(8, "big")
        scan = self._db.iter()
        scan.seek(b"d")
        try:
            while scan.valid():
                key = bytes(scan.key())
                if key[:1] != b"d" or key[1:9] > limit:
                    break
                yield int.from_bytes(key[1:9], "big") - _OFFSET, key[9:]
                scan.next()
        finally:
            del scan

    def rows(self) -> Iterator[OpsRow]:
        """Every row held (six columns), pair by pair. O(rows)."""
        scan = self._db.iter()
        scan.seek(b"k")
        try:
            while scan.valid():
                key = bytes(scan.key())
                if key[:1] != b"k":
                    break
                for row in pickle.loads(scan.value()):
                    yield row[:_DUE]
                scan.next()
        finally:
            del scan
