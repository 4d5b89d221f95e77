"""The commit log: each batch's write-ahead plan, its states by attempt, and the fenced
commit that names the attempt that counts (``docs/pipeline-design.md``, "Commit
protocol (exactly once)")."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...attempt import Attempt
from ...storage import Storage, StorageError, create_json, join, read_json, storage_for
from .errors import CheckpointFenced, StreamError
from .owner import CheckpointOwner
from .paths import checkpoint_of, tickwheel_root
from .record import STATE_FORMAT, Commit, Fence, Stamp, read_slot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["StateStore", "new_plan", "take_checkpoint"]

#: What :meth:`StateStore._resolve` finds of a batch: its commit (None: not
#: committed), the slot it is in (or the free one), and the last fence passed.
_Resolved = tuple["Commit | None", str, "Fence | None"]


class StateStore:
    """The carried state after each batch, and the commits that make it count.

    ``state/N/A/`` holds batch ``N``'s next state as attempt ``A`` wrote it;
    the commit of ``N`` (a :class:`~.record.Commit`, in the chain of slots of
    the design doc) names the attempt that counts. Checkpoints of format 2
    kept the state in ``state/N/`` and the commit in ``commits/N.json``; those
    of format 1 kept the commit in ``state/N/meta.json``: both are read as
    committed. With an ``owner``, every commit checks its fencing token first
    and is fenced (:meth:`fence`).
    """

    def __init__(self, root: str, storage: Storage, owner: CheckpointOwner | None = None) -> None:
        """O(1): nothing is read or made until asked."""
        self.root, self.storage, self.owner = root, storage, owner
        self.state = join(root, "state")
        self.commits = join(root, "commits")
        self.plans = join(root, "plans")
        #: The commits read so far, by batch id (:meth:`_resolve`).
        self._known: dict[int, _Resolved] = {}
        #: The names listed in ``commits/`` and ``state/`` since :meth:`refresh`.
        self._listed: dict[str, list[str]] = {}
        #: The commit slot files read as fences (a file never changes once made).
        self._fences: set[str] = set()

    @property
    def token(self) -> int | None:
        """The owner's fencing token (None without an owner). O(1)."""
        return self.owner.token if self.owner is not None else None

    # -- reading ---------------------------------------------------------------------
    def refresh(self) -> None:
        """Forget what was listed: the next question lists ``commits/`` and ``state/``
        again. A runner calls it once per micro-batch; between two calls, what this
        store lists and writes itself is kept up to date without listing again (a
        commit another owner made meanwhile is found by the commit's claim of its
        slot, which reads the slots themselves). O(1)."""
        self._listed.clear()

    def _names(self, directory: str) -> list[str]:
        """The names in ``directory`` (``commits/`` or ``state/``), listed once per
        :meth:`refresh`. One listing, or none."""
        names = self._listed.get(directory)
        if names is None:
            names = self._listed[directory] = self.storage.list_names(directory)
        return names

    def _listed_too(self, directory: str, name: str) -> None:
        """Keep a listing of ``directory`` true to a file this store just made there."""
        names = self._listed.get(directory)
        if names is not None and name not in names:
            names.append(name)

    def _delete(self, directory: str, name: str) -> None:
        """Delete ``directory/name``, and keep a listing of ``directory`` true to it."""
        self.storage.delete(join(directory, name))
        names = self._listed.get(directory)
        if names is not None and name in names:
            names.remove(name)

    def _slot_ids(self) -> dict[int, int]:
        """How many commit slot files each batch id has (``N.json``, ``N.T.json``).
        One listing, or none since the last :meth:`refresh`."""
        found: dict[int, int] = {}
        names = self._names(self.commits)
        for name in names:
            parts = name[:-5].split(".") if name.endswith(".json") else []
            if parts and len(parts) <= 2 and all(p.isdigit() for p in parts):
                found[int(parts[0])] = found.get(int(parts[0]), 0) + 1
        listed = set(names)  # a commit pruned since it was read is gone: forget it
        for batch_id, (_commit, path, _fence) in list(self._known.items()):
            if path.rsplit("/", 1)[-1] not in listed:
                del self._known[batch_id]
        return found

    def _resolve(self, batch_id: int) -> _Resolved:
        """Follow batch ``batch_id``'s chain of commit slots: (its commit, or None; the
        commit's slot, or the free one; the last fence passed). O(chain) reads, none
        for a commit seen before: a commit file never changes once made."""
        known = self._known.get(batch_id)
        if known is not None:
            return known
        path, fence = self._slot(batch_id), None
        while True:
            try:
                record = read_slot(read_json(self.storage, path))
            except FileNotFoundError:
                return None, path, fence
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"the commit of batch {batch_id} cannot be read: {exc}") from None
            self._listed_too(self.commits, path.rsplit("/", 1)[-1])  # made since it was listed
            if isinstance(record, Commit):
                self._known[batch_id] = (record, path, fence)
                return record, path, fence
            fence = record
            path = self._slot(batch_id, record.token)

    def committed(self) -> list[int]:
        """The committed batch ids in order. Two listings (none again until the next
        :meth:`refresh`), and a read of each batch's commit slots not read before:
        those :meth:`prune` keeps, two batches' and the fences."""
        slots = self._slot_ids()
        ids = {b for b in slots if self._resolve(b)[0] is not None}
        for name in self._names(self.state):  # format 1: no commits/
            legacy = name.isdigit() and int(name) not in ids and int(name) not in slots
            if legacy and self.storage.exists(self._legacy_commit(int(name))):
                ids.add(int(name))
        return sorted(ids)

    def is_committed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` committed. O(chain) reads."""
        return self._resolve(batch_id)[0] is not None or self.storage.exists(
            self._legacy_commit(batch_id)
        )

    def read_commit(self, batch_id: int) -> Commit:
        """The commit of batch ``batch_id`` (FileNotFoundError if it did not commit).
        O(chain) reads."""
        commit = self._resolve(batch_id)[0]
        if commit is not None:
            return commit
        return Commit.from_json(read_json(self.storage, self._legacy_commit(batch_id)))

    def latest_before(self, batch_id: int) -> int | None:
        """The newest committed batch before ``batch_id``. O(batches kept)."""
        ids = [b for b in self.committed() if b < batch_id]
        return ids[-1] if ids else None

    # -- paths -------------------------------------------------------------------------
    def _slot(self, batch_id: int, fenced_by: int | None = None) -> str:
        """Batch ``batch_id``'s first commit slot, or the one after the fence of
        ``fenced_by``. O(1)."""
        name = f"{batch_id}.json" if fenced_by is None else f"{batch_id}.{fenced_by}.json"
        return join(self.commits, name)

    def _legacy_commit(self, batch_id: int) -> str:
        """Where format 1 kept batch ``batch_id``'s commit. O(1)."""
        return join(self.batch_dir(batch_id), "meta.json")

    def batch_dir(self, batch_id: int) -> str:
        """Batch ``batch_id``'s directory of attempts' states (format 2: its state). O(1)."""
        return join(self.state, str(batch_id))

    def attempt_path(self, batch_id: int, attempt: Attempt) -> str:
        """Where ``attempt`` writes batch ``batch_id``'s next state. O(1)."""
        return join(self.batch_dir(batch_id), attempt.tag)

    def state_path(self, commit: Commit) -> str:
        """Where the state of ``commit`` is: the attempt it names. O(1)."""
        directory = self.batch_dir(commit.batch_id)
        return directory if commit.attempt is None else join(directory, commit.attempt)

    # -- the write-ahead plan ----------------------------------------------------------
    def plan(self, batch_id: int, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The write-ahead plan of a batch: made once, reused when the batch replays.

        The first attempt's plan holds for every attempt of the batch, whoever's
        (it says what the batch is, as Spark's offset log does, not what it
        made), so that all of them decide alike."""
        path = join(self.plans, f"{batch_id}.json")
        with contextlib.suppress(FileNotFoundError):
            return read_json(self.storage, path)
        plan = make()
        try:
            create_json(self.storage, path, plan)
        except FileExistsError:  # made meanwhile by an attempt we never heard of
            return read_json(self.storage, path)
        return plan

    # -- ownership ---------------------------------------------------------------------
    def check_owner(self) -> None:
        """:class:`CheckpointFenced` if a newer owner took the checkpoint over (nothing
        without an owner). O(owners)."""
        if self.owner is not None:
            self.owner.check()

    def owns(self) -> bool:
        """Whether this store's owner is still the newest (True without an owner): only
        the owner cleans. O(owners)."""
        try:
            self.check_owner()
        except StreamError:
            return False
        return True

    def _fenced(self, token: int, host: str | None) -> CheckpointFenced:
        if self.owner is not None:
            return self.owner.fenced_by(token, host)
        return CheckpointFenced(checkpoint_of(self.root), self.token, token, host)

    # -- committing --------------------------------------------------------------------
    def _create_fence(self, path: str) -> None:
        """This owner's fence, a new file at the free slot ``path`` (FileExistsError if
        a commit or another fence came first). O(1) calls."""
        assert self.token is not None
        create_json(self.storage, path, Fence(self.token, Stamp.now(self.token)).to_json())

    def _claim(self, batch_id: int) -> tuple[str, Fence | None]:
        """The slot of batch ``batch_id`` this owner may commit in, and the last fence
        before it, fencing a slot an older owner fenced (:class:`CheckpointFenced` if
        a newer one did, or if the batch is committed already: only a newer owner
        commits past our fence). O(chain) reads."""
        while True:
            commit, path, fence = self._resolve(batch_id)
            if commit is not None:
                by = commit.stamp.owner_token
                if by is not None and self.token is not None and by > self.token:
                    raise self._fenced(by, commit.stamp.host)
                raise StreamError(f"checkpoint {checkpoint_of(self.root)}: batch "
                                  f"{batch_id} is committed already")  # fmt: skip
            if fence is None or self.token is None or fence.token == self.token:
                return path, fence
            if fence.token > self.token:
                raise self._fenced(fence.token, fence.host)
            with contextlib.suppress(FileExistsError):  # an older owner's fence: ours on it
                self._create_fence(path)
                self._listed_too(self.commits, path.rsplit("/", 1)[-1])

    def fence(self) -> int:
        """Fence the first batch not committed, which a predecessor that froze may still
        be running, so that it can never commit; its id. A new owner calls it once,
        before any batch. O(batches kept) reads."""
        assert self.token is not None, "fencing needs an owner's token"
        committed = self.committed()
        batch_id = committed[-1] + 1 if committed else 0
        while True:
            commit, path, fence = self._resolve(batch_id)
            if commit is not None:  # committed by a predecessor meanwhile: it stands
                batch_id += 1
                continue
            if fence is not None and fence.token >= self.token:
                if fence.token == self.token:
                    return batch_id
                raise self._fenced(fence.token, fence.host)
            try:
                self._create_fence(path)
            except FileExistsError:  # a commit or a fence came first: look again
                continue
            self._listed_too(self.commits, path.rsplit("/", 1)[-1])
            return batch_id

    def commit(self, commit: Commit) -> Commit:
        """Commit ``commit``'s batch: one new file in its slot (:meth:`_claim`), after
        the owner's check, stamped with the owner's token and host, the state format,
        the release and the time; the stamped commit is returned.
        :class:`CheckpointFenced` if a newer owner took over."""
        self.check_owner()
        stamped = commit.stamped(self.token)
        while True:
            path, fence = self._claim(commit.batch_id)
            try:
                create_json(self.storage, path, stamped.to_json())
            except FileExistsError:  # a fence or a commit came first: look again
                continue
            self._listed_too(self.commits, path.rsplit("/", 1)[-1])
            self._known[commit.batch_id] = (stamped, path, fence)  # as a read would find it
            self._listed_too(self.state, str(commit.batch_id))
            return stamped

    def check_format(self) -> None:
        """Refuse (:class:`StreamError`) a checkpoint whose last commit, or a fence past
        it, is in a state format newer than this release reads. O(1) calls."""
        from .... import __version__

        committed = self.committed()
        stamps = [self.read_commit(committed[-1]).stamp] if committed else []
        newest = max(self._slot_ids(), default=None)
        if newest is not None and newest not in committed:  # a fence past the last commit
            fence = self._resolve(newest)[2]
            stamps.append(fence.stamp if fence is not None else Stamp())
        for stamp in stamps:
            if stamp.readable:
                continue
            raise StreamError(
                f"checkpoint {checkpoint_of(self.root)}: its state is in format "
                f"{stamp.version!r}, written by tickwheel {stamp.tickwheel or '?'}; tickwheel "
                f"{__version__} reads formats 1 to {STATE_FORMAT}. Run a release that reads "
                "it (the one that wrote it, or newer), or start a new checkpoint"
            )

    # -- cleaning ----------------------------------------------------------------------
    def _is_fence(self, name: str) -> bool:
        """Whether the commit slot file ``name`` holds a fence. One read, none for a
        fence read before."""
        if name in self._fences:
            return True
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if isinstance(read_slot(read_json(self.storage, join(self.commits, name))), Fence):
                self._fences.add(name)
                return True
        return False

    def prune(self, commit: Commit) -> None:
        """After ``commit``: drop what no commit will read.

        Kept: the states of its batch and of the committed batch before it, with
        what each is rebuilt from (the snapshot its changelogs follow, and the
        changelogs between), and every fence: a predecessor that froze between
        its owner check and its commit would otherwise find its batch's first
        slot free again. Dropped: older states, commits and plans, and the other
        attempts' states of the batch (crashed or fenced ones: its commit names
        one). Only committed batches are touched, so an attempt still running
        (one that will be fenced) loses nothing a commit names. O(batches kept).
        """
        batch_id, keep = commit.batch_id, commit.snapshot_base
        before = self.latest_before(batch_id)
        if before is not None:
            keep = min(keep, self.read_commit(before).snapshot_base)
        for name in list(self._names(self.state)):
            if name.isdigit() and int(name) < keep:
                self._delete(self.state, name)
        for name in list(self._names(self.commits)):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < keep and not self._is_fence(name):
                self._delete(self.commits, name)
        for name in self.storage.list_names(self.plans):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < batch_id:
                self.storage.delete(join(self.plans, name))
        if commit.attempt is not None:
            for name in self.storage.list_names(self.batch_dir(batch_id)):
                if name != commit.attempt and not name.startswith("."):
                    self.storage.delete(join(self.batch_dir(batch_id), name))


def new_plan(batch_id: int, **more: Any) -> dict[str, Any]:
    """A new write-ahead plan (:meth:`StateStore.plan`): the batch id, ``more``, and the
    processing time now. O(1)."""
    return {"batch_id": batch_id, **more, "now_ms": int(time.time() * 1000)}


def take_checkpoint(checkpoint: str, spark: SparkSession | None = None) -> StateStore:
    """The state store of the checkpoint ``checkpoint``, its ownership taken (the
    store's :attr:`~StateStore.owner`; :class:`~.errors.CheckpointInUse` while
    another job holds it) and its format checked. A URI checkpoint goes through
    ``spark``'s Hadoop file systems."""
    root = tickwheel_root(checkpoint)
    try:
        storage = storage_for(root, spark)
    except StorageError as exc:
        raise StreamError(f"--checkpoint {exc}") from None
    owner = CheckpointOwner(root, storage)
    owner.acquire()
    store = StateStore(root, storage, owner)
    try:
        store.check_format()
    except BaseException:
        owner.release()
        raise
    return store
