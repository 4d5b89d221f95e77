"""The carried operations held in the driver, found by key and by when they fall due, so that
a micro-batch takes in only those it can change (``docs/pipeline-design.md``, "Carried
state").

A pending operation changes in a micro-batch only when an event of its key
arrives, or when the watermark reaches its deadline; a key's expiry marker, when
an event of its key arrives, when an operation of its key expires, or when the
watermark reaches the end of its retention. :meth:`OpsIndex.take_touched` takes
out exactly those rows, the rows the purgatory's partitions would not have passed
through unchanged (:func:`~...spark.partition.untouched_state`), without a pass
over the others: each segment of rows is indexed by a hash of (rule, key),
sorted, and by the watermark at which each row falls due, sorted, with a pointer
that only moves forward (a watermark never moves back). The rows a micro-batch
makes go in as a new segment (:meth:`OpsIndex.add`); segments of like size
merge, as a log-structured merge tree's levels do, so that a row is merged
O(log n) times in all and a lookup asks O(log n) segments.

Costs, for n rows held and t rows touched: :meth:`~OpsIndex.take_touched`
O(t + k log n) for k keys of the micro-batch's events; :meth:`~OpsIndex.add`
O(a log a) for a rows, plus merges, O(log n) per row amortised;
:meth:`~OpsIndex.whole` O(n). :attr:`~OpsIndex.nbytes` measures what it holds
(``docs/scaling.md``, "Bytes per pending operation").
Needs numpy and pyarrow (the ``spark`` extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ...core import STATE_EXPIRED, STATE_PENDING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["ALWAYS", "NEVER", "OpsIndex", "due_at", "key_hashes", "ops_schema", "rule_indexes"]

#: A watermark no row falls due at (a marker kept for ever), and one every row
#: falls due at (a row the purgatory must see: one with a null it needs); public for
#: the partitioned provider (:mod:`.partitioned`), which files rows by them too.
NEVER = 2**63 - 1
ALWAYS = -(2**63)
#: Strings hashed per chunk (bounds the hash's scratch memory).
_HASH_CHUNK = 1 << 20


def key_hashes(rule_index: np.ndarray, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each (rule index, key): the same for the same pair in every
    array, whatever its chunks, offsets or neighbours. Vectorised over the keys'
    bytes: O(bytes)."""
    import numpy as np
    import pyarrow as pa

    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    parts = [_string_hashes(piece) for chunk in chunks for piece in _pieces(chunk)]
    hashed = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return _mix(hashed ^ (rule_index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))


def _pieces(array: pa.Array) -> Iterable[pa.Array]:
    for start in range(0, len(array), _HASH_CHUNK):
        yield array.slice(start, _HASH_CHUNK)


def _string_hashes(array: pa.Array) -> np.ndarray:
    """Σ byte_i · P^(i+1) mod 2^64 of each string, its length mixed in (nulls: 0)."""
    import numpy as np
    import pyarrow as pa

    if not pa.types.is_string(array.type):
        array = array.cast(pa.string())
    count = len(array)
    if not count:
        return np.zeros(0, np.uint64)
    _validity, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, count + 1, array.offset * 4)
    first, last = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(data_buffer, np.uint8, last - first, first)
        if data_buffer is not None and last > first
        else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    position = np.arange(last - first, dtype=np.int64) - np.repeat(offsets[:-1] - first, lengths)
    weights = _powers(int(lengths.max(initial=0)))[position]
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(data.astype(np.uint64) * weights)])
    start, end = offsets[:-1] - first, offsets[1:] - first
    length_mix = lengths.astype(np.uint64) * np.uint64(0xFF51AFD7ED558CCD)
    hashed: np.ndarray = (sums[end] - sums[start]) ^ length_mix
    if array.null_count:
        hashed[np.asarray(array.is_null())] = 0
    return hashed


_POWERS: list[np.ndarray] = []


def _powers(length: int) -> np.ndarray:
    """P^1 .. P^length mod 2^64 (cached, grown as needed)."""
    import numpy as np

    if not _POWERS or len(_POWERS[0]) < length:
        size = max(64, 2 * length)
        powers = np.empty(size, np.uint64)
        value = np.ones(1, np.uint64)
        prime = np.uint64(0x100000001B3)
        for i in range(size):  # once per process: arrays wrap silently, scalars warn
            value = value * prime
            powers[i] = value[0]
        _POWERS[:] = [powers]
    return _POWERS[0]


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit moves every output bit."""
    import numpy as np

    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


class _Segment:
    """Rows that went in together, with their indexes. Rows are taken out by marking
    them dead; a segment is merged away, never changed in place."""

    def __init__(self, table: pa.Table, rule_index: np.ndarray, due_at: np.ndarray) -> None:
        import numpy as np

        self.table = table
        self.rule_index = rule_index
        self.hashes = key_hashes(rule_index, table["key"])
        self.by_hash = np.argsort(self.hashes, kind="stable")
        self.sorted_hashes = self.hashes[self.by_hash]
        self.due_at = due_at
        self.by_due = np.argsort(due_at, kind="stable")
        self.sorted_due = due_at[self.by_due]
        self.next_due = 0  # the first of by_due not taken as due yet
        self.alive = np.ones(table.num_rows, bool)
        self.live = table.num_rows

    def due(self, watermark: int) -> np.ndarray:
        """Positions of the live rows that fall due at ``watermark``, taken from the due
        index (a later watermark is never smaller). O(rows due)."""
        import numpy as np

        end = int(np.searchsorted(self.sorted_due, watermark, side="right"))
        found = self.by_due[self.next_due : end]
        self.next_due = max(self.next_due, end)
        return found[self.alive[found]]

    def with_keys(self, hashes: np.ndarray, rule_index: np.ndarray, keys: pa.Array) -> np.ndarray:
        """Positions of the live rows of the (``rule_index``, ``keys``) pairs, whose
        ``hashes`` are given. O(k log n)."""
        import numpy as np
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        left = np.searchsorted(self.sorted_hashes, hashes, side="left")
        right = np.searchsorted(self.sorted_hashes, hashes, side="right")
        counts = right - left
        if not counts.any():
            return np.zeros(0, np.int64)
        wanted = np.repeat(np.arange(len(hashes)), counts)
        offset = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        found = self.by_hash[np.repeat(left, counts) + offset]
        same = (self.rule_index[found] == rule_index[wanted]) & self.alive[found]
        same &= np.asarray(
            pc.fill_null(pc.equal(self.table["key"].take(found), keys.take(wanted)), False)
        )
        return np.unique(found[same])

    @property
    def nbytes(self) -> int:
        """The bytes this segment holds: its rows' Arrow buffers and its indexes. O(columns)."""
        arrays = (self.rule_index, self.hashes, self.by_hash, self.sorted_hashes, self.due_at,
                  self.by_due, self.sorted_due, self.alive)  # fmt: skip
        return int(self.table.nbytes) + sum(int(a.nbytes) for a in arrays)

    def take(self, positions: np.ndarray) -> pa.Table:
        """The rows at ``positions``, marked dead. O(len)."""
        self.alive[positions] = False
        self.live -= len(positions)
        return self.table.take(positions)

    def live_rows(self) -> pa.Table:
        """The rows not taken out. O(rows)."""
        import numpy as np

        if self.live == self.table.num_rows:
            return self.table
        return self.table.take(np.flatnonzero(self.alive))


def rule_indexes(table: pa.Table, rule_names: Sequence[str]) -> np.ndarray:
    """Each row's rule as its index in ``rule_names`` (-1: a null rule, or one not in
    force). O(rows)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rule = pc.index_in(table["rule"], value_set=pa.array(list(rule_names), pa.string()))
    return np.asarray(pc.fill_null(rule, -1).to_numpy(zero_copy_only=False), np.int64)


def due_at(table: pa.Table, rule_index: np.ndarray, retention_ms: int | None) -> np.ndarray:
    """The watermark at which each row of carried operations falls due by itself: a pending
    operation's deadline; an expiry marker's time plus ``retention_ms`` (never, without
    one); at once for a row the purgatory must see whatever happens (a null it needs,
    another kind, a rule not in force: ``rule_index`` -1). O(rows)."""
    import numpy as np
    import pyarrow.compute as pc

    kind = table["kind"]
    pending = np.asarray(pc.fill_null(pc.equal(kind, STATE_PENDING), False))
    marker = np.asarray(pc.fill_null(pc.equal(kind, STATE_EXPIRED), False))
    due = np.full(table.num_rows, ALWAYS, np.int64)
    deadline = table["deadline"]
    has_deadline = np.asarray(pc.is_valid(deadline))
    values = np.asarray(pc.fill_null(deadline, 0).to_numpy(zero_copy_only=False), np.int64)
    take = pending & has_deadline
    due[take] = values[take]
    if retention_ms is None:
        due[marker] = NEVER
    else:
        time = table["time"]
        has_time = np.asarray(pc.is_valid(time))
        start = np.asarray(pc.fill_null(time, 0).to_numpy(zero_copy_only=False), np.int64)
        take = marker & has_time
        due[take] = start[take] + retention_ms
    known = (rule_index >= 0) & np.asarray(pc.is_valid(table["key"]))
    due[~known] = ALWAYS
    return due


def ops_schema() -> pa.Schema:
    """The Arrow schema of the carried operations (:data:`~...spark.outputs.OPS_COLUMNS`)."""
    import pyarrow as pa

    text, long = pa.string(), pa.int64()
    return pa.schema([("kind", text), ("rule", text), ("key", text), ("event_id", text),
                      ("time", long), ("deadline", long)])  # fmt: skip


class OpsIndex:
    """The carried operations (the columns of :data:`~...spark.outputs.OPS_COLUMNS`) of
    the rules ``rule_names``, held for the micro-batches to take in only what they
    can change. ``retention_ms`` is the expiry markers' (None: kept for ever).
    The driver provider (:class:`~.OpsProvider`)."""

    provider = "driver"

    def __init__(
        self, rule_names: Sequence[str], retention_ms: int | None, table: pa.Table | None = None
    ) -> None:
        """An index of ``table``'s rows (none). O(n log n)."""
        self.rule_names = tuple(rule_names)
        self.retention_ms = retention_ms
        self.schema = ops_schema()
        self._segments: list[_Segment] = []
        self._watermark: int | None = None
        if table is not None:
            self.add(table)

    @property
    def rows(self) -> int:
        """The rows held. O(segments)."""
        return sum(segment.live for segment in self._segments)

    @property
    def nbytes(self) -> int:
        """The bytes held, measured: every segment's Arrow buffers (dead rows too, until
        their segment merges) and its indexes. O(segments)."""
        return sum(segment.nbytes for segment in self._segments)

    def add(self, table: pa.Table) -> None:
        """Hold ``table``'s rows too (the operations a micro-batch made). O(a log a), and
        the merges it makes due."""
        if not table.num_rows:
            return
        table = table.select(list(self.schema.names)).cast(self.schema)
        self._segments.append(self._segment(table))
        self._merge()

    def _segment(self, table: pa.Table) -> _Segment:
        rule_index = rule_indexes(table, self.rule_names)
        return _Segment(table, rule_index, due_at(table, rule_index, self.retention_ms))

    def _merge(self) -> None:
        """Merge the newest segments while the one before is at most twice as big, and
        any segment mostly dead: O(log n) merges of a row in its life, amortised."""
        segments = self._segments
        while len(segments) > 1 and segments[-2].live <= 2 * segments[-1].live:
            newer, older = segments.pop(), segments.pop()
            segments.append(self._merged([older, newer]))
        for i, segment in enumerate(segments):
            if segment.live * 2 < segment.table.num_rows:
                segments[i] = self._merged([segment])
        self._segments = [s for s in segments if s.live]

    def _merged(self, parts: list[_Segment]) -> _Segment:
        import pyarrow as pa

        tables = [part.live_rows() for part in parts]
        return self._segment(pa.concat_tables(tables).combine_chunks())

    def take_touched(self, keys: Mapping[str, pa.Array], watermark: int) -> pa.Table:
        """Take out, and return, every row a micro-batch can change whose events have the
        keys ``keys`` (by rule name) and whose watermark is ``watermark``: the rows due
        at it (pending operations at their deadline, markers at the end of their
        retention, rows with a null the purgatory needs), and every row of a (rule,
        key) with an event or with a pending operation due. O(t + k log n)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if self._watermark is not None and watermark < self._watermark:
            for segment in self._segments:  # never in a stream: a watermark never moves back
                segment.next_due = 0
        self._watermark = watermark
        taken: list[pa.Table] = []
        due_keys: list[tuple[np.ndarray, pa.Array]] = []
        for segment in self._segments:
            due = segment.due(watermark)
            if not len(due):
                continue
            rows = segment.take(due)
            taken.append(rows)
            expires = np.asarray(pc.fill_null(pc.equal(rows["kind"], STATE_PENDING), False))
            expires &= (segment.rule_index[due] >= 0) & (segment.due_at[due] != ALWAYS)
            if expires.any():
                due_keys.append((segment.rule_index[due][expires], rows["key"].filter(expires)))
        rule_index, key_array = self._pairs(keys, due_keys)
        if len(key_array):
            hashes = key_hashes(rule_index, key_array)
            for segment in self._segments:
                found = segment.with_keys(hashes, rule_index, key_array)
                if len(found):
                    taken.append(segment.take(found))
        self._merge()
        if not taken:
            return self._empty()
        return pa.concat_tables(taken)

    def _pairs(
        self, keys: Mapping[str, pa.Array], more: list[tuple[np.ndarray, pa.Array]]
    ) -> tuple[np.ndarray, pa.Array]:
        """Every (rule index, key) to look up, as two aligned arrays (duplicates kept:
        a lookup finds a row once)."""
        import numpy as np
        import pyarrow as pa

        indexes, arrays = [], []
        for name, array in keys.items():
            if name in self.rule_names and len(array):
                indexes.append(np.full(len(array), self.rule_names.index(name), np.int64))
                arrays.append(array.cast(pa.string()))
        for rule_index, array in more:
            indexes.append(rule_index)
            arrays.append(array.cast(pa.string()))
        if not arrays:
            return np.zeros(0, np.int64), pa.array([], pa.string())
        chunked = pa.chunked_array(arrays, pa.string()).combine_chunks()
        return np.concatenate(indexes), chunked

    def _empty(self) -> pa.Table:
        return self.schema.empty_table()

    def without_rules(self, names: Iterable[str]) -> OpsIndex:
        """A new index of the rows held but those of the rules ``names`` (a rules change
        that dropped their state). O(n log n)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        table = self.whole()
        dropped = pc.is_in(table["rule"], value_set=pa.array(sorted(names), pa.string()))
        return OpsIndex(self.rule_names, self.retention_ms, table.filter(pc.invert(dropped)))

    def put_back(self, added: pa.Table, removed: pa.Table, tag: str) -> None:
        """What an attempt changed: the rows it holds on (``added``) go in; those it took
        in (``removed``) are out already. O(a log a), and the merges it makes due."""
        self.add(added)

    def committed(self) -> None:
        """Nothing to do: the index holds the attempt's state already. O(1)."""

    def release(self) -> None:
        """Nothing to do: the index is let go with its last reference. O(1)."""

    def whole(self) -> pa.Table:
        """Every row held, as one table (a snapshot's, a reader's). O(n)."""
        import pyarrow as pa

        if not self._segments:
            return self._empty()
        return pa.concat_tables([segment.live_rows() for segment in self._segments])
