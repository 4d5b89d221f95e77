"""tickwheel: Kafka's hierarchical timing wheel and delayed operations for Python.

The timer core imports nothing outside the standard library::

    from tickwheel import ManualClock, SystemTimer

    clock = ManualClock()
    with SystemTimer(clock=clock, executor="inline") as timer:
        timer.schedule(30_000, print, "order 42 not paid: cancel it")
        clock.advance(30_000)
        timer.advance_clock(0)

The hot classes run compiled (Cython) when the extension was built at
install, and as pure Python otherwise; both behave the same. ``COMPILED``
says which path is in use; ``TICKWHEEL_NO_EXTENSIONS=1`` forces pure Python.

See ``docs/`` for the design, the benchmarks and the pipeline.
"""

from ._accel import COMPILED
from ._clock import Clock, ManualClock, SystemClock
from ._delayed_future import DelayedFuturePurgatory
from ._purgatory import DelayedOperation, DelayedOperationPurgatory
from ._snapshot import BucketSnapshot, LevelSnapshot, WheelSnapshot
from ._task import TimerTask
from ._task_list import TimerTaskEntry, TimerTaskList
from ._timer import SystemTimer, SystemTimerReaper
from ._wheel import TimingWheel

__version__ = "0.1.0"

__all__ = [
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
]
