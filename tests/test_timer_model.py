"""A hypothesis state machine: SystemTimer on a ManualClock against a reference model.

Random add, cancel, re-add (move) and advance steps, with random tick_ms and
wheel_size. After every step ``timer._check()`` asserts the internal invariants
and the model checks the public behaviour:

* every task that is not cancelled fires exactly once per add;
* never before the start of its expiration's finest tick
  (``exp // tick * tick <= now`` when it fires);
* a pending task fires at the first ``advance_clock`` at or after that tick start;
* an add fires a task at once exactly when its expiration is before the wheel's
  current time + tick;
* ``size`` equals the model's pending count, and ``cancel()`` returns True iff
  the model says the task was pending.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from tickwheel import ManualClock, SystemTimer, TimerTask


@dataclass
class _Model:
    task: TimerTask
    pending: bool = False
    cancelled: bool = False
    expiration: int = -1


class TimerMachine(RuleBasedStateMachine):
    """The timer against a dict of what should be pending."""

    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.clock: ManualClock
        self.timer: SystemTimer
        self.tick = 1
        self.models: dict[int, _Model] = {}
        self.fired: list[tuple[int, int]] = []  # (task id, clock when it ran)

    @initialize(
        tick=st.sampled_from([1, 2, 3, 7, 10]),
        size=st.sampled_from([2, 3, 4, 8, 20]),
        start=st.integers(0, 10**6),
    )
    def setup(self, tick: int, size: int, start: int) -> None:
        self.tick = tick
        self.clock = ManualClock(start)
        self.timer = SystemTimer(tick_ms=tick, wheel_size=size, clock=self.clock, executor="inline")

    # -- helpers ---------------------------------------------------------------

    def _tick_start(self, expiration: int) -> int:
        return expiration // self.tick * self.tick

    def _record(self, task_id: int) -> None:
        self.fired.append((task_id, self.clock.now_ms()))

    def _add(self, task_id: int) -> None:
        """Add (or re-add) the task and check the immediate outcome against the model."""
        model = self.models[task_id]
        task = model.task
        now = self.clock.now_ms()
        current = self.timer._wheel.current_time_ms
        before = len(self.fired)
        self.timer.add(task)
        new = self.fired[before:]
        if model.cancelled:
            assert new == [] and task.is_cancelled
            return
        expiration = task.delay_ms + now
        assert task.expiration_ms == expiration
        model.expiration = expiration
        if expiration < current + self.tick:
            assert new == [(task_id, now)], "a due task must run at once"
            assert self._tick_start(expiration) <= now
            model.pending = False
        else:
            assert new == [], "a task that is not due ran at once"
            assert task.is_pending
            model.pending = True

    # -- rules -------------------------------------------------------------------

    @rule(target=tasks, delay=st.integers(-5, 3000))
    def add(self, delay: int) -> int:
        task_id = len(self.models)
        task = TimerTask(delay, self._record, task_id)
        self.models[task_id] = _Model(task)
        self._add(task_id)
        return task_id

    @rule(target=tasks, delay=st.integers(-5, 3000))
    def schedule(self, delay: int) -> int:
        """``schedule`` inlines the task's creation and ``add``: same outcome."""
        task_id = len(self.models)
        now = self.clock.now_ms()
        current = self.timer._wheel.current_time_ms
        before = len(self.fired)
        task = self.timer.schedule(delay, self._record, task_id)
        model = self.models[task_id] = _Model(task, expiration=delay + now)
        assert task.delay_ms == delay and task.expiration_ms == delay + now
        if delay + now < current + self.tick:
            assert self.fired[before:] == [(task_id, now)]
            assert not task.is_pending
        else:
            assert self.fired[before:] == []
            model.pending = True
        return task_id

    @rule(task_id=tasks, delay=st.integers(-5, 3000))
    def readd(self, task_id: int, delay: int) -> None:
        model = self.models[task_id]
        size = self.timer.size
        was_pending = model.pending
        model.task.delay_ms = delay
        self._add(task_id)
        if was_pending and model.pending:
            assert self.timer.size == size, "a move must keep the size"

    @rule(task_id=consumes(tasks))
    def cancel(self, task_id: int) -> None:
        model = self.models[task_id]
        assert model.task.cancel() is model.pending
        if model.pending:
            model.cancelled = True
        model.pending = False

    @rule(task_id=tasks)
    def cancel_again(self, task_id: int) -> None:
        model = self.models[task_id]
        result = model.task.cancel()
        assert result is model.pending
        if result:
            model.cancelled = True
            model.pending = False

    @rule(step=st.one_of(st.integers(0, 30), st.integers(0, 5000)))
    def advance(self, step: int) -> None:
        now = self.clock.advance(step)
        due = sorted(
            task_id
            for task_id, m in self.models.items()
            if m.pending and self._tick_start(m.expiration) <= now
        )
        before = len(self.fired)
        result = self.timer.advance_clock(0)
        new = self.fired[before:]
        assert all(at == now for _, at in new)
        assert sorted(task_id for task_id, _ in new) == due, f"at {now} expected {due}, fired {new}"
        if due:
            assert result is True
        for task_id in due:
            self.models[task_id].pending = False
        # Nothing left pending is due: a second call finds nothing to run.
        before = len(self.fired)
        self.timer.advance_clock(0)
        assert self.fired[before:] == []

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "timer"):
            return
        self.timer._check()
        pending = [m for m in self.models.values() if m.pending]
        assert self.timer.size == len(pending)
        for m in self.models.values():
            assert m.task.is_pending is m.pending
            assert m.task.is_cancelled is m.cancelled

    def teardown(self) -> None:
        if not hasattr(self, "timer"):
            return
        # Drain: every task still pending fires exactly once, and nothing else does.
        pending = {task_id for task_id, m in self.models.items() if m.pending}
        last = max([m.expiration for m in self.models.values()] + [self.clock.now_ms()])
        before = len(self.fired)
        self.clock.set(last)
        self.timer.advance_clock(0)
        assert sorted(task_id for task_id, _ in self.fired[before:]) == sorted(pending)
        assert self.timer.size == 0
        # Per add, at most one run: a task id never fires twice without a re-add in
        # between; in total it fired no more often than it was added.
        cancelled = {task_id for task_id, m in self.models.items() if m.cancelled}
        assert not any(task_id in cancelled for task_id, _ in self.fired[before:])
        self.timer.close()


TimerMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTimerModel = TimerMachine.TestCase


# -- staging is invisible ---------------------------------------------------------------

_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(-5, 3000)),
        st.tuples(st.just("readd"), st.integers(0, 10**6), st.integers(-5, 3000)),
        st.tuples(st.just("advance"), st.one_of(st.integers(0, 30), st.integers(0, 5000))),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tick=st.sampled_from([1, 3, 10]),
    size=st.sampled_from([2, 4, 20]),
    start=st.integers(0, 10**6),
    steps=_STEPS,
)
def test_staged_adds_build_kafkas_wheel(
    tick: int, size: int, start: int, steps: list[tuple[str, int] | tuple[str, int, int]]
) -> None:
    """A timer that stages adds and one placed at every add (Kafka's eager ``add``) agree.

    ``snapshot()`` places the staged tasks, so calling it after every add of
    the ``eager`` twin gives Kafka's behaviour. After every step both have run
    the same tasks in the same order at the same times, every ``advance_clock``
    returns the same, and after every advance the wheels, buckets, tasks and
    queue are identical.

    Re-adds move only tasks that both timers hold in a bucket (added before
    the last advance, and not moved since), and there are no cancels: a task
    that leaves while staged never queued a bucket, where Kafka's leaves an
    empty bucket queued (``test_advance_clock_return_values`` covers that).
    """
    clocks = [ManualClock(start), ManualClock(start)]
    staged, eager = timers = [
        SystemTimer(tick_ms=tick, wheel_size=size, clock=clock, executor="inline")
        for clock in clocks
    ]
    fired: list[list[tuple[int, int]]] = [[], []]
    tasks: list[list[TimerTask]] = [[], []]
    placed: list[int] = []  # ids of the tasks both timers hold in a bucket

    def record(side: int, task_id: int) -> None:
        fired[side].append((task_id, clocks[side].now_ms()))

    for step in steps:
        if step[0] == "advance":
            results = []
            for clock, timer in zip(clocks, timers, strict=True):
                clock.advance(step[1])
                results.append(timer.advance_clock(0))
            assert results[0] is results[1], f"advance_clock returned {results}"
            assert staged.snapshot() == eager.snapshot()
            placed = [i for i, task in enumerate(tasks[0]) if task.is_pending]
        elif step[0] == "add":
            task_id = len(tasks[0])
            for side, timer in enumerate(timers):
                task = TimerTask(step[1], record, side, task_id)
                tasks[side].append(task)
                timer.add(task)
        elif placed:
            task_id = placed.pop(step[1] % len(placed))
            for side, timer in enumerate(timers):
                task = tasks[side][task_id]
                task.delay_ms = step[2]
                timer.add(task)
        eager.snapshot()
        assert fired[0] == fired[1], "the two timers ran different tasks"
        assert staged.size == eager.size
        staged._check()
        eager._check()
    for timer in timers:
        timer.close()
