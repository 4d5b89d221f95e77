"""``BatchRunner``, foreachBatch's function: the driver's cyclic garbage is freed as it runs.

py4j's ``JavaObject`` is in a reference cycle once a method of it was called,
and the JVM keeps what it names until Python frees it: the runner ends a
micro-batch with a full collection when the last one is old enough
(``FULL_COLLECTION_EVERY_S``). See ``docs/benchmarks.md``, "A long stream".
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tickwheel.pipeline.stream.runner import FULL_COLLECTION_EVERY_S, BatchRunner


class _Cycle:
    """An object that refers to itself, as a py4j JavaObject and its members do."""

    def __init__(self) -> None:
        self.me = self


def _garbage() -> weakref.ref[_Cycle]:
    return weakref.ref(_Cycle())


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _runner() -> BatchRunner:
    store = SimpleNamespace(
        is_committed=lambda _b: False, committed=lambda: [], refresh=lambda: None, root="ck"
    )

    def process(_frame: Any, _batch_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"events": 1, "warnings": []}

    return BatchRunner(store, sink=None, process=process)  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_automatic_collection")
def test_a_micro_batch_frees_the_cyclic_garbage_once_the_last_collection_is_old() -> None:
    runner = _runner()
    first = _garbage()
    runner(None, 0)  # type: ignore[arg-type]  # the last collection is recent: none now
    assert first() is not None
    runner.last_collection -= FULL_COLLECTION_EVERY_S
    runner(None, 1)  # type: ignore[arg-type]
    assert first() is None
    assert runner.batches_run == 2 and runner.totals == {"events": 2}
    second = _garbage()
    runner(None, 2)  # type: ignore[arg-type]  # collected just now: not again yet
    assert second() is not None
