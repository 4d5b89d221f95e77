"""The commit record (``stream/checkpoint/record.py``): every format's commits load through
one typed :class:`Commit`, and what this release writes reads back the same. No Spark."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.pipeline.storage import LocalStorage
from tickwheel.pipeline.stream.checkpoint import (
    STATE_FORMAT,
    Commit,
    Fence,
    Stamp,
    StateEntry,
    StateStore,
    StreamError,
)
from tickwheel.pipeline.stream.checkpoint.record import read_slot

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("checkpoint-format-*"))


def _store(fixture: Path) -> StateStore:
    return StateStore(str(fixture / "ck" / "tickwheel"), LocalStorage())


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_every_formats_commits_load_as_typed_records(fixture: Path) -> None:
    """Formats 1 to 4: the two committed batches, their watermark, counts and state rows as
    their files hold them, and the format each was written in."""
    fmt = int(fixture.name.rsplit("-", 1)[1])
    store = _store(fixture)
    store.check_format()
    assert store.committed() == [0, 1]
    for batch_id in (0, 1):
        commit = store.read_commit(batch_id)
        raw = _raw(store, batch_id)
        assert commit.batch_id == batch_id
        assert commit.watermark == raw["watermark"] and commit.max_time == raw["max_time"]
        assert commit.state_rows == raw["state_rows"]
        assert dict(commit.counts) == raw["counts"]
        assert commit.stamp.version == fmt
        assert (commit.attempt is not None) == (fmt >= 3)  # a directory per attempt
        assert (commit.rules is not None) == (fmt >= 2)  # the rules recorded
        assert (commit.state is not None) == (fmt >= 4)  # changelogs
        assert (commit.staged is not None) == (fmt >= 3)  # the sink's staging named
    last = store.read_commit(1)
    if fmt >= 4:  # the fixture ends on a changelog on batch 0's snapshot
        assert last.state == StateEntry("changelog", base=0, after=0, changelogs=1)
        assert last.snapshot_base == 0 and last.holds_changelog
    else:
        assert last.snapshot_base == 1 and not last.holds_changelog


def _raw(store: StateStore, batch_id: int) -> dict[str, Any]:
    commit = Path(store.commits) / f"{batch_id}.json"
    path = commit if commit.exists() else Path(store.batch_dir(batch_id)) / "meta.json"
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
def test_a_commit_read_back_from_what_this_release_writes_is_the_same(fixture: Path) -> None:
    for batch_id in (0, 1):
        commit = _store(fixture).read_commit(batch_id)
        assert Commit.from_json(json.loads(json.dumps(commit.to_json()))) == commit


entries = st.one_of(
    st.just(StateEntry.snapshot()),
    st.builds(
        StateEntry,
        st.just("changelog"),
        base=st.integers(0, 100),
        after=st.integers(0, 100),
        changelogs=st.integers(1, 10),
        whole=st.sampled_from([(), ("events",)]),
    ),
)
commits = st.builds(
    Commit,
    batch_id=st.integers(0, 10**6),
    watermark=st.one_of(st.none(), st.integers(-(10**12), 10**12)),
    files=st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=3).map(tuple)),
    counts=st.dictionaries(st.sampled_from(["late", "events"]), st.integers(0, 99)),
    warnings=st.lists(st.text(max_size=5), max_size=2).map(tuple),
    attempt=st.one_of(st.none(), st.just("t1-0123456789ab")),
    state=st.one_of(st.none(), entries),
    stamp=st.builds(
        Stamp, st.one_of(st.none(), st.integers(1, 9)), st.just("host"), st.just(STATE_FORMAT)
    ),
)


@given(commits)
@settings(max_examples=200, deadline=None)
def test_a_commit_survives_its_file(commit: Commit) -> None:
    assert Commit.from_json(json.loads(json.dumps(commit.to_json()))) == commit


def test_a_slot_holds_a_fence_or_a_commit() -> None:
    fence = Fence(3, Stamp(3, "h", STATE_FORMAT, "0.1.0"))
    assert read_slot(fence.to_json()) == fence
    assert fence.host == "h"
    assert isinstance(read_slot(Commit(2).to_json()), Commit)


@pytest.mark.parametrize("found", [STATE_FORMAT + 1, "five"])
def test_a_newer_or_unknown_format_is_refused_by_name(tmp_path: Path, found: object) -> None:
    copy = tmp_path / "ck"
    shutil.copytree(FIXTURES[-1] / "ck", copy)
    last = copy / "tickwheel" / "commits" / "1.json"
    record = json.loads(last.read_text(encoding="utf-8"))
    last.unlink()
    last.write_text(json.dumps({**record, "format": found}), encoding="utf-8")
    store = StateStore(str(copy / "tickwheel"), LocalStorage())
    with pytest.raises(StreamError, match=f"in format {found!r}"):
        store.check_format()


def test_start_streams_quiet_is_deprecated() -> None:
    """``quiet`` never changed anything: given, it warns, before any other check."""
    from tickwheel.pipeline.stream.start import start_stream

    batch_frame = SimpleNamespace(isStreaming=False)
    with (
        pytest.warns(DeprecationWarning, match="quiet"),
        pytest.raises(ValueError, match="streaming DataFrame"),
    ):
        start_stream(batch_frame, "rules.toml", checkpoint="ck", quiet=True)  # type: ignore[arg-type]
