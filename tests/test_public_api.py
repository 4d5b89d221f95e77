"""The public API is pinned: exactly these names, each documented."""

from __future__ import annotations

import inspect

import tickwheel

EXPECTED = {
    "BucketSnapshot",
    "Clock",
    "DelayedFuturePurgatory",
    "DelayedOperation",
    "DelayedOperationPurgatory",
    "LevelSnapshot",
    "ManualClock",
    "SystemClock",
    "SystemTimer",
    "SystemTimerReaper",
    "TimerTask",
    "TimerTaskEntry",
    "TimerTaskList",
    "TimingWheel",
    "WheelSnapshot",
    "__version__",
}


def test_all_is_pinned() -> None:
    assert set(tickwheel.__all__) == EXPECTED
    assert len(tickwheel.__all__) == len(EXPECTED)
    for name in tickwheel.__all__:
        assert hasattr(tickwheel, name), name


def test_every_public_name_has_a_docstring() -> None:
    assert tickwheel.__doc__
    assert isinstance(tickwheel.__version__, str)
    for name in tickwheel.__all__:
        obj = getattr(tickwheel, name)
        if name == "__version__":
            continue
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if callable(member) or isinstance(member, property):
                    assert inspect.getdoc(member), f"{name}.{attr} has no docstring"
