"""Threaded stress: 8 threads add and cancel while a reaper runs on the system clock.

No task is lost (every task not cancelled, or whose ``cancel()`` returned False,
runs exactly once), none runs twice, and none whose ``cancel()`` returned True
runs. Bounded in time: small delays, and every wait has a timeout.
"""

from __future__ import annotations

import random
import threading

import pytest

from tickwheel import SystemClock, SystemTimer, SystemTimerReaper, TimerTask

THREADS = 8
TASKS_PER_THREAD = 1500
WAIT_S = 30.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [1, 2])
def test_threads_add_and_cancel_while_reaper_runs(seed: int) -> None:
    before = set(threading.enumerate())
    total = THREADS * TASKS_PER_THREAD
    runs = [0] * total
    counted = threading.Condition()
    ran_total = [0]

    def fire(task_id: int) -> None:
        with counted:
            runs[task_id] += 1
            ran_total[0] += 1
            counted.notify_all()

    cancel_result: list[bool | None] = [None] * total
    tasks: list[TimerTask | None] = [None] * total
    start = threading.Barrier(THREADS, timeout=WAIT_S)
    errors: list[BaseException] = []

    timer = SystemTimer(name="stress", clock=SystemClock())
    reaper = SystemTimerReaper(timer)

    def worker(index: int) -> None:
        try:
            rng = random.Random(seed * 1000 + index)
            start.wait()
            mine: list[int] = []
            for n in range(TASKS_PER_THREAD):
                task_id = index * TASKS_PER_THREAD + n
                task = TimerTask(rng.randint(0, 15), fire, task_id)
                tasks[task_id] = task
                reaper.add(task)
                mine.append(task_id)
                roll = rng.random()
                if roll < 0.3:  # cancel at once
                    cancel_result[task_id] = task.cancel()
                elif roll < 0.6 and len(mine) > 5:  # cancel an older one: may race its expiry
                    victim = mine[rng.randrange(len(mine) - 5, len(mine))]
                    if cancel_result[victim] is None:
                        victim_task = tasks[victim]
                        assert victim_task is not None
                        cancel_result[victim] = victim_task.cancel()
                if n % 100 == 0:
                    threading.Event().wait(0.001)  # let time pass so buckets expire
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(i,), name=f"stress-{i}") for i in range(THREADS)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()
        assert errors == []
        expected = sum(1 for result in cancel_result if result is not True)
        with counted:
            assert counted.wait_for(lambda: ran_total[0] >= expected, WAIT_S), (
                f"lost tasks: {expected - ran_total[0]} of {expected} never ran"
            )
        assert timer.size == 0
        timer._check()
    finally:
        reaper.close()
    for task_id, result in enumerate(cancel_result):
        if result is True:
            assert runs[task_id] == 0, f"task {task_id} ran although cancel() returned True"
        else:
            assert runs[task_id] == 1, f"task {task_id} ran {runs[task_id]} times"
    cancelled = sum(1 for result in cancel_result if result is True)
    raced = sum(1 for result in cancel_result if result is False)
    assert cancelled > 0  # the test exercised cancellation
    print(f"cancelled {cancelled}, cancel lost the race {raced}")
    assert not reaper.thread.is_alive()
    assert set(threading.enumerate()) <= before
