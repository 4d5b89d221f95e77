"""The public API is pinned: exactly these names, each documented."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import tickwheel

EXPECTED = {
    "COMPILED",
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
        if name in ("__version__", "COMPILED"):
            continue
        assert inspect.getdoc(obj), f"{name} has no docstring"
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if callable(member) or isinstance(member, property):
                    assert inspect.getdoc(member), f"{name}.{attr} has no docstring"


def test_compiled_says_which_path_runs() -> None:
    expected_module = "tickwheel._speedups" if tickwheel.COMPILED else "tickwheel._task"
    assert tickwheel.TimerTask.__module__ == expected_module
    env = {**os.environ, "TICKWHEEL_NO_EXTENSIONS": "1"}
    code = "import tickwheel; print(tickwheel.COMPILED, tickwheel.TimerTask.__module__)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["False", "tickwheel._task"]
    version = subprocess.run(
        [sys.executable, "-m", "tickwheel", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.stdout.strip() == f"tickwheel {tickwheel.__version__} (pure Python core)"
