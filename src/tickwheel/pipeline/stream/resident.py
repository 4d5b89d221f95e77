"""The state held between micro-batches by the process that runs them, and when a commit
writes it whole (``docs/pipeline-design.md``, "Versions of the state").

:class:`HeldState` belongs to whoever runs the micro-batches (the
``foreachBatch`` runner), not to the checkpoint: it holds the
:class:`ResidentState` the last commit of this process left, and gives it to
the next micro-batch only when it is exactly the state the last commit names.
Writing and rebuilding states is :mod:`.changelog`'s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .checkpoint import Commit, StateEntry

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from .state import OpsProvider

__all__ = [
    "DRIVER_STATE_BYTES_ENV",
    "DRIVER_STATE_SHARE",
    "SNAPSHOT_EVERY",
    "SNAPSHOT_EVERY_ENV",
    "UNMEASURED_ROW_BYTES",
    "HeldState",
    "ResidentState",
    "default_driver_state_bytes",
    "driver_state_bytes",
    "format_bytes",
    "next_entry",
    "next_resident",
    "parse_bytes",
    "snapshot_every",
]

logger = logging.getLogger(__name__)

#: A snapshot every this many commits (K), as Spark's ``minDeltasForSnapshot``.
SNAPSHOT_EVERY = 10
#: Environment variable that sets K for a job (tests use small values).
SNAPSHOT_EVERY_ENV = "TICKWHEEL_SNAPSHOT_EVERY"


#: The driver's bound on the state it holds, by default: this share of the machine's
#: memory (the driver's JVM takes a quarter by default, ``spark.session``). Past the
#: bound, the next micro-batch partitions its operations on the executors
#: (``docs/scaling.md``).
DRIVER_STATE_SHARE = 8
#: Environment variable that sets the bound for a job: bytes, or with a unit (``"3g"``).
DRIVER_STATE_BYTES_ENV = "TICKWHEEL_DRIVER_STATE_BYTES"
#: The bytes a row of state is taken to need in the driver before any was measured: where
#: to rebuild or first hold a state that was never held in the driver is decided by it
#: (``docs/scaling.md``, "Bytes per pending operation": 121 measured at 1e6). Once
#: held, the state's bytes are measured, and it moves if they pass the bound.
UNMEASURED_ROW_BYTES = 128

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def snapshot_every() -> int:
    """K: ``TICKWHEEL_SNAPSHOT_EVERY`` if set (an int >= 1), else :data:`SNAPSHOT_EVERY`. O(1)."""
    return _positive_int(SNAPSHOT_EVERY_ENV, SNAPSHOT_EVERY)


def default_driver_state_bytes(total_bytes: int | None = None) -> int:
    """The driver's bound on its state when none is set: 1/:data:`DRIVER_STATE_SHARE` of
    ``total_bytes`` (default: this machine's memory). O(1)."""
    if total_bytes is None:
        total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(int(total_bytes) // DRIVER_STATE_SHARE, 1)


def driver_state_bytes(given: int | str | None = None) -> int:
    """The driver's bound on its state, in bytes: ``given`` (bytes, or a size as
    :func:`parse_bytes` reads it), else ``TICKWHEEL_DRIVER_STATE_BYTES`` if set, else
    :func:`default_driver_state_bytes`. O(1)."""
    if given is not None:
        return parse_bytes(given, "driver_state_bytes")
    text = os.environ.get(DRIVER_STATE_BYTES_ENV)
    if not text:
        return default_driver_state_bytes()
    return parse_bytes(text, DRIVER_STATE_BYTES_ENV)


def format_bytes(n: int) -> str:
    """``n`` bytes for a reader, in the largest binary unit it reaches (``"2.4 GiB"``). O(1)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def parse_bytes(value: int | str, name: str) -> int:
    """A size >= 1 byte: an int, or a number with a binary unit as Spark writes memory
    (``"512m"``, ``"3g"``, ``"1.5t"``; k, m, g, t). A ValueError names ``name``. O(len)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number: float = value
    else:
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:].isalpha() else ""
        try:
            number = float(text[: len(text) - len(unit)]) * _UNITS[unit]
        except (KeyError, ValueError):
            number = 0
    if not 1 <= number < float("inf"):
        raise ValueError(
            f"{name} must be a size of at least 1 byte (bytes, or with a unit: '512m', "
            f"'3g'), got {value!r}"
        )
    return int(number)


def _positive_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {text!r}")
    return value


@dataclass
class ResidentState:
    """The state a committed batch left, held in this process.

    ``tables`` holds the events as Arrow (the dedup window, with the driver
    under both providers) and, until :meth:`indexed`, the operations; then the
    operations are ``ops``, held by a provider (:mod:`.state`): indexed by key
    and due time in the driver, or partitioned on the executors. ``attempt`` is
    the tag of the attempt whose commit made it; ``base`` the batch of the
    snapshot its chain of changelogs starts from, ``changelogs`` their number.
    """

    batch_id: int
    attempt: str | None
    rows: int
    base: int
    changelogs: int
    tables: dict[str, pa.Table] | None = None
    ops: OpsProvider | None = None

    @property
    def provider(self) -> str:
        """Who holds the operations: ``"driver"`` or ``"partitioned"``. O(1)."""
        return self.ops.provider if self.ops is not None else "driver"

    @property
    def tag(self) -> str:
        """The state's name for a provider: its batch and attempt. O(1)."""
        return f"{self.batch_id}:{self.attempt}"

    @property
    def nbytes(self) -> int:
        """The bytes of the driver's memory the state takes, measured: the Arrow tables'
        buffers and what its provider holds there (:attr:`.state.OpsProvider.nbytes`:
        the index, or the partitioned provider's changes in flight). O(tables + segments)."""
        held = sum(int(table.nbytes) for table in (self.tables or {}).values())
        return held + (self.ops.nbytes if self.ops is not None else 0)

    def matches(self, commit: Commit) -> bool:
        """Whether this is the state that ``commit`` names: its batch and attempt. O(1)."""
        return commit.batch_id == self.batch_id and commit.attempt == self.attempt

    def as_tables(self) -> dict[str, pa.Table]:
        """The tables as Arrow (a reader's): partitioned operations collected. O(rows)."""
        tables = dict(self.tables or {})
        if self.ops is not None:
            whole = self.ops.whole()
            tables["ops"] = whole if self.ops.provider == "driver" else whole.toArrow()
        return tables

    def held(self) -> Mapping[str, Any]:
        """The tables as a snapshot writes them: Arrow, but partitioned operations as a
        DataFrame read from their stores. O(rows) for indexed operations."""
        tables: dict[str, Any] = dict(self.tables or {})
        if self.ops is not None:
            tables["ops"] = self.ops.whole()
        return tables

    def indexed(self, rule_names: Sequence[str], retention_ms: int | None) -> ResidentState:
        """This state, its Arrow operations indexed (:mod:`.state.ops_index`; no change for
        one held by a provider already). O(n log n)."""
        if self.tables is None or self.ops is not None or "ops" not in self.tables:
            return self
        from .state.ops_index import OpsIndex

        tables = dict(self.tables)
        self.ops = OpsIndex(rule_names, retention_ms, tables.pop("ops"))
        self.tables = tables
        return self

    def release(self) -> None:
        """Let the state go: a partitioned provider's stores too. O(partitions)."""
        if self.ops is not None:
            self.ops.release()
        self.tables = self.ops = None


class HeldState:
    """The state the last commit of this process left, held for the next micro-batch.

    One per running query, owned by its runner. ``snapshot_every`` is K
    (:func:`snapshot_every` when the holder is made); ``driver_state_bytes`` the
    driver's bound on the state it holds. Pickled (Spark Connect
    ships the runner to the process that runs ``foreachBatch``), a holder
    arrives empty: a state stays in the process that computed it.
    """

    def __init__(
        self, snapshot_every_k: int | None = None, state_bytes: int | str | None = None
    ) -> None:
        """An empty holder. ``state_bytes`` is the driver's bound on the state it holds
        (:func:`driver_state_bytes`: it reads the environment when None). O(1)."""
        self.state: ResidentState | None = None
        self.snapshot_every = snapshot_every() if snapshot_every_k is None else snapshot_every_k
        #: The most bytes of the driver's memory the state may take there
        #: (:attr:`ResidentState.nbytes`); past it, the next micro-batch moves it to the
        #: executors.
        self.driver_state_bytes = driver_state_bytes(state_bytes)
        #: Whether the last micro-batch's records fitted in the driver: the next one's are
        #: expected to (:attr:`~..spark.step.StepOptions.expect_driver`).
        self.records_fit_driver = False

    def fits_driver(self, nbytes: int | None = None, rows: int | None = None) -> bool:
        """Whether a state fits the driver's bound: its ``nbytes`` as measured, or, for one
        never measured, its ``rows`` at :data:`UNMEASURED_ROW_BYTES` each (neither
        known: it does not). O(1)."""
        if nbytes is None and rows is not None:
            nbytes = rows * UNMEASURED_ROW_BYTES
        return nbytes is not None and nbytes <= self.driver_state_bytes

    def __getstate__(self) -> dict[str, Any]:
        """A copy in another process holds nothing. O(1)."""
        return {**self.__dict__, "state": None}

    def take_for(self, commit: Commit, batch_id: int) -> ResidentState | None:
        """The state held if it is the one ``commit`` names; else None, the state held
        (if any) let go and logged as not the last commit's, which micro-batch
        ``batch_id`` then rebuilds. O(1)."""
        state = self.state
        if state is not None and state.matches(commit):
            return state
        if state is not None:
            logger.info(
                "batch %d: the state held (batch %d) is not the last commit's (batch %d): "
                "rebuilt", batch_id, state.batch_id, commit.batch_id,
            )  # fmt: skip
            self.drop()
        return None

    def hold(self, state: ResidentState) -> None:
        """Hold ``state`` from now on, letting the one held before go, but for the provider
        of its operations when ``state`` took it on. O(tables)."""
        previous, self.state = self.state, state
        if previous is not None and previous is not state:
            if previous.ops is state.ops:  # handed on: the next state's now
                previous.ops = None
            previous.release()

    def drop(self) -> None:
        """Let the state held go. O(tables)."""
        if self.state is not None:
            self.state.release()
        self.state = None


def next_entry(previous: ResidentState | None, every: int, full: bool = False) -> StateEntry:
    """The state entry of the commit after the one that left ``previous`` (None: no
    state before): a changelog on it, or a snapshot when ``full``, when there is
    nothing before, or when ``every`` - 1 changelogs follow the last snapshot
    already. O(1)."""
    if full or previous is None or previous.changelogs + 1 >= every:
        return StateEntry.snapshot()
    return StateEntry(
        "changelog",
        base=previous.base,
        after=previous.batch_id,
        changelogs=previous.changelogs + 1,
    )


def next_resident(
    batch_id: int,
    attempt: str,
    entry: StateEntry,
    events: pa.Table,
    changes: Mapping[str, Any],
    ops: OpsProvider,
) -> tuple[ResidentState, StateEntry, dict[str, Any]]:
    """The state that batch ``batch_id``'s attempt leaves (its ``events``, and its
    operations held by ``ops``, this attempt's changes put back), to hold once it
    commits; the commit's state entry; and what the commit writes: every table
    whole for a snapshot ``entry`` (:func:`next_entry`); else ``changes`` (the rows
    the operations gained and lost: ``ops.added``, ``ops.removed``) and, whole, the
    events above the watermark (at most the allowed lateness's worth), which the
    entry names in ``whole``: a rebuild reads no other. O(1) calls, and O(rows)
    for a snapshot.
    """
    snapshot = not entry.is_changelog
    resident = ResidentState(
        batch_id,
        attempt,
        rows=int(events.num_rows) + ops.rows,
        base=batch_id if snapshot or entry.base is None else entry.base,
        changelogs=entry.changelogs,
        tables={"events": events},
        ops=ops,
    )
    if snapshot:
        return resident, entry, dict(resident.held())
    entry = StateEntry("changelog", entry.base, entry.after, entry.changelogs, whole=("events",))
    return resident, entry, {"events": events, **changes}
