"""The commit of a batch is fenced: a job that lost its checkpoint never commits again.

Storage offers no compare-and-set but "create if absent", and an owner may
freeze between any check and the write that follows it. These tests play the
two jobs in one process on a local checkpoint whose ``flock`` the first job
does not hold, as on a mount shared between hosts (NFS, a FUSE volume), where
one host's lock is not seen from another: ownership then rests on the fencing
token alone (``stream/checkpoint.py``, "Fencing").
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from tickwheel.pipeline.storage import LocalStorage
from tickwheel.pipeline.stream.checkpoint import (
    Attempt,
    CheckpointFenced,
    CheckpointOwner,
    Commit,
    StateStore,
    StreamError,
)


def _job(root: Path) -> StateStore:
    """A job that took the checkpoint over, as on another host: a new owner and its
    fence. The lock is let go at once: another host's flock is not seen here."""
    owner = CheckpointOwner(str(root), LocalStorage())
    owner.acquire()
    owner._unlock_local()
    store = StateStore(str(root), LocalStorage(), owner)
    if store.token is not None and store.token > 1:  # as the drivers do: a predecessor
        store.fence()
    return store


def _commit(store: StateStore, batch_id: int) -> Commit:
    attempt = Attempt.new(store.token)
    (Path(store.attempt_path(batch_id, attempt)) / "ops").mkdir(parents=True)
    return store.commit(Commit(batch_id, attempt=attempt.tag))


def _frozen_after_its_check(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job passed its owner check, then froze: the check will not stop it again."""
    assert store.owner is not None
    monkeypatch.setattr(store.owner, "check", lambda: None)


def test_a_job_that_wakes_after_a_takeover_cannot_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _job(tmp_path)
    _commit(first, 0)
    _commit(first, 1)
    second = _job(tmp_path)  # fences batch 2, the one the first may be running
    assert Path(second.commits, "2.json").exists()
    with pytest.raises(CheckpointFenced, match="taken over by token 2 on host"):
        _commit(first, 2)  # its owner check says so first
    _frozen_after_its_check(first, monkeypatch)
    with pytest.raises(CheckpointFenced, match=r"token 2 on host .*\(token 1\) stops"):
        _commit(first, 2)  # the fence itself stops it
    _commit(second, 2)
    _commit(second, 3)
    assert second.committed() == [0, 1, 2, 3]
    assert second.read_commit(2).stamp.owner_token == 2
    assert Path(second.commits, "2.2.json").exists()  # the fence's own slot


def test_a_commit_that_wins_the_race_stands_and_the_fence_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The predecessor commits batch 1 just before the fence: its commit stands, and
    the new owner fences batch 2 instead, which the predecessor can never reach."""
    first = _job(tmp_path)
    _commit(first, 0)
    _frozen_after_its_check(first, monkeypatch)
    storage = LocalStorage()
    real_create = storage.create
    raced: list[int] = []

    def create(path: str, data: bytes) -> None:
        if path.endswith("commits/1.json") and not raced:  # the fence's create
            raced.append(1)
            _commit(first, 1)  # the predecessor's commit lands first
        real_create(path, data)

    owner = CheckpointOwner(str(tmp_path), storage)
    owner.acquire()
    owner._unlock_local()
    second = StateStore(str(tmp_path), storage, owner)
    storage.create = create  # type: ignore[method-assign]
    assert second.fence() == 2
    assert second.read_commit(1).stamp.owner_token == 1  # the predecessor's commit stands
    assert second.committed() == [0, 1]
    with pytest.raises(CheckpointFenced, match="token 2"):
        _commit(first, 2)


def test_a_fence_whose_owner_died_is_fenced_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _job(tmp_path)
    _commit(first, 0)
    second = _job(tmp_path)  # fences batch 1, then dies before committing it
    third = _job(tmp_path)  # fences the second's slot, 1.2.json
    assert Path(third.commits, "1.2.json").exists()
    _frozen_after_its_check(second, monkeypatch)
    with pytest.raises(CheckpointFenced, match="taken over by token 3"):
        _commit(second, 1)
    _frozen_after_its_check(first, monkeypatch)
    with pytest.raises(CheckpointFenced, match="taken over by token"):
        _commit(first, 1)
    _commit(third, 1)
    assert third.committed() == [0, 1]
    assert third.read_commit(1).stamp.owner_token == 3
    assert Path(third.commits, "1.3.json").exists()


def test_a_race_between_a_commit_and_a_fence_of_the_same_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The predecessor finds the slot free; the fence is created before its own create:
    its create fails, it looks again, and stops."""
    first = _job(tmp_path)
    _commit(first, 0)
    _frozen_after_its_check(first, monkeypatch)
    real_create = first.storage.create
    newer: list[StateStore] = []

    def create(path: str, data: bytes) -> None:
        if path.endswith("commits/1.json") and not newer:
            newer.append(_job(tmp_path))  # the takeover's fence lands first
        real_create(path, data)

    monkeypatch.setattr(first.storage, "create", create)
    with pytest.raises(CheckpointFenced, match="token 2"):
        _commit(first, 1)
    assert not first.is_committed(1)


def test_only_the_committed_attempt_is_kept(tmp_path: Path) -> None:
    store = _job(tmp_path)
    crashed = Attempt.new(store.token)
    (Path(store.attempt_path(0, crashed)) / "ops").mkdir(parents=True)
    record = _commit(store, 0)
    store.prune(record)
    assert record.attempt is not None
    assert sorted(p.name for p in Path(store.batch_dir(0)).iterdir()) == [record.attempt]
    assert store.state_path(store.read_commit(0)) == store.attempt_path(
        0, Attempt(store.token, record.attempt[3:])
    )


def test_a_committed_batch_is_not_committed_again(tmp_path: Path) -> None:
    store = _job(tmp_path)
    _commit(store, 0)
    with pytest.raises(StreamError, match="batch 0 is committed already"):
        _commit(store, 0)


def test_the_state_store_carries_its_owners_token_across_processes(tmp_path: Path) -> None:
    """Spark Connect runs foreachBatch in a process beside the server: the store it
    gets carries the owner's token (not its lock), and is fenced alike."""
    store = _job(tmp_path)
    shipped = pickle.loads(pickle.dumps(store))
    assert shipped.token == store.token == 1
    assert shipped.owner is not None and shipped.owner._fd is None
    _commit(shipped, 0)
    _job(tmp_path)
    with pytest.raises(CheckpointFenced, match="taken over by token 2"):
        _commit(shipped, 1)


def test_a_fence_outlives_the_pruning_of_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The predecessor froze between its owner check and its commit of batch 1, for
    longer than the new owner took to commit and prune batches 1 to 3: the batch's
    first slot still holds the fence, so the predecessor's commit is refused."""
    first = _job(tmp_path)
    _commit(first, 0)
    _frozen_after_its_check(first, monkeypatch)
    second = _job(tmp_path)
    for batch_id in (1, 2, 3):
        second.prune(_commit(second, batch_id))
    assert sorted(p.name for p in Path(second.commits).iterdir()) == ["1.json", "2.json", "3.json"]
    assert second.committed() == [2, 3]  # 1's commit pruned; its fence kept
    with pytest.raises(CheckpointFenced, match="token 2"):
        _commit(first, 1)
    assert second.committed() == [2, 3]
