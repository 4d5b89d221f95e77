"""The worked example of the TimingWheel docstring, asserted state by state.

Setup: tick 1000 ms, 3 buckets, start 1675752020558, delays 1000 … 7000 ms, so the
expirations are …21558 … …27558 (B + 21558 … B + 27558 with B = 1675752000000).

Every expected value below is derived from the algorithm by hand:

* level 0: tick 1000, interval 3000, current = start rounded down = B+20000.
* level 1: tick 3000, start = level 0's current; (B+20000) % 3000 = 2000, so
  current B+18000; interval 9000.
* level 2: tick 9000, start B+18000; (B+18000) % 9000 = 6000, so current B+12000.
* Bucket indices: (B+21000) // 1000 = 1675752021, digit sum 36, so index 0 on
  level 0 for B+21000 (22000 -> 1, 23000 -> 2, 24000 -> 0, ...). On level 1,
  (B+21000) // 3000 = 558584007, digit sum 42 -> index 0 (24000 -> 1, 27000 -> 2).
  On level 2, (B+21000) // 9000 = 186194669, digit sum 50 -> index 2.
* Adds: 21558 and 22558 fit level 0 (< 23000). 23558..26558 go to level 1
  (< 27000): 23558 in [21000, 24000), the others in [24000, 27000). 27558 goes
  to level 2 (< 39000), bucket [21000, 30000).
* Clock 21000: three buckets due at 21000, polled in queueing order. All levels
  advance to 21000 (a multiple of 1000, 3000 and 9000). Level 0's bucket runs
  21558; level 1's re-inserts 23558 into level 0's 23000 bucket; level 2's
  re-inserts 27558 into level 1 (21000 + 9000 > 27558), bucket 27000.
* 22000, 23000: level 0 buckets run 22558, 23558.
* 24000: level 1 advances to 24000; its 24000 bucket runs 24558 (< 25000) and
  cascades 25558, 26558 into level 0 buckets 25000 (index 1), 26000 (index 2).
* 25000, 26000: level 0 runs 25558, 26558.
* 27000: level 1 advances to 27000 (level 2 stays at 21000: 27000 < 21000+9000);
  its 27000 bucket re-inserts 27558, now < 27000 + 1000: it runs.
"""

from __future__ import annotations

from tickwheel import ManualClock, SystemTimer, WheelSnapshot

B = 1675752000000
START = B + 20558
UNSET = (-1, ())

# Per level: (tick, current, {index: (bucket expiration, task expirations)}).
Level = tuple[int, int, dict[int, tuple[int, tuple[int, ...]]]]
State = tuple[list[Level], list[tuple[int, int, int]], int]


def _b(*offsets: int) -> tuple[int, ...]:
    return tuple(B + o for o in offsets)


AFTER_ADDS: State = (
    [
        (1000, B + 20000, {0: (B + 21000, _b(21558)), 1: (B + 22000, _b(22558))}),
        (3000, B + 18000, {0: (B + 21000, _b(23558)), 1: (B + 24000, _b(24558, 25558, 26558))}),
        (9000, B + 12000, {2: (B + 21000, _b(27558))}),
    ],
    [(B + 21000, 0, 0), (B + 21000, 1, 0), (B + 21000, 2, 2), (B + 22000, 0, 1), (B + 24000, 1, 1)],
    7,
)

# (clock, task index fired, expected state after advance_clock(0) at that clock)
STEPS: list[tuple[int, int, State]] = [
    (
        B + 21000,
        0,
        (
            [
                (1000, B + 21000, {1: (B + 22000, _b(22558)), 2: (B + 23000, _b(23558))}),
                (
                    3000,
                    B + 21000,
                    {1: (B + 24000, _b(24558, 25558, 26558)), 2: (B + 27000, _b(27558))},
                ),
                (9000, B + 21000, {}),
            ],
            [(B + 22000, 0, 1), (B + 23000, 0, 2), (B + 24000, 1, 1), (B + 27000, 1, 2)],
            6,
        ),
    ),
    (
        B + 22000,
        1,
        (
            [
                (1000, B + 22000, {2: (B + 23000, _b(23558))}),
                (
                    3000,
                    B + 21000,
                    {1: (B + 24000, _b(24558, 25558, 26558)), 2: (B + 27000, _b(27558))},
                ),
                (9000, B + 21000, {}),
            ],
            [(B + 23000, 0, 2), (B + 24000, 1, 1), (B + 27000, 1, 2)],
            5,
        ),
    ),
    (
        B + 23000,
        2,
        (
            [
                (1000, B + 23000, {}),
                (
                    3000,
                    B + 21000,
                    {1: (B + 24000, _b(24558, 25558, 26558)), 2: (B + 27000, _b(27558))},
                ),
                (9000, B + 21000, {}),
            ],
            [(B + 24000, 1, 1), (B + 27000, 1, 2)],
            4,
        ),
    ),
    (
        B + 24000,
        3,
        (
            [
                (1000, B + 24000, {1: (B + 25000, _b(25558)), 2: (B + 26000, _b(26558))}),
                (3000, B + 24000, {2: (B + 27000, _b(27558))}),
                (9000, B + 21000, {}),
            ],
            [(B + 25000, 0, 1), (B + 26000, 0, 2), (B + 27000, 1, 2)],
            3,
        ),
    ),
    (
        B + 25000,
        4,
        (
            [
                (1000, B + 25000, {2: (B + 26000, _b(26558))}),
                (3000, B + 24000, {2: (B + 27000, _b(27558))}),
                (9000, B + 21000, {}),
            ],
            [(B + 26000, 0, 2), (B + 27000, 1, 2)],
            2,
        ),
    ),
    (
        B + 26000,
        5,
        (
            [
                (1000, B + 26000, {}),
                (3000, B + 24000, {2: (B + 27000, _b(27558))}),
                (9000, B + 21000, {}),
            ],
            [(B + 27000, 1, 2)],
            1,
        ),
    ),
    (
        B + 27000,
        6,
        (
            [(1000, B + 27000, {}), (3000, B + 27000, {}), (9000, B + 21000, {})],
            [],
            0,
        ),
    ),
]


def _assert_state(snap: WheelSnapshot, state: State) -> None:
    levels, queue, size = state
    assert snap.size == size
    assert list(snap.queue) == queue
    assert len(snap.levels) == len(levels)
    for got, (tick, current, buckets) in zip(snap.levels, levels, strict=True):
        assert (got.tick_ms, got.wheel_size, got.interval_ms) == (tick, 3, 3 * tick)
        assert got.current_time_ms == current
        assert [b.index for b in got.buckets] == [0, 1, 2]
        for bucket in got.buckets:
            expected = buckets.get(bucket.index, UNSET)
            assert (bucket.expiration_ms, bucket.task_expirations) == expected, (
                f"tick {tick} bucket {bucket.index}"
            )


def test_worked_example_state_by_state() -> None:
    clock = ManualClock(START)
    fired: list[tuple[int, int]] = []
    with SystemTimer(tick_ms=1000, wheel_size=3, clock=clock, executor="inline") as timer:
        for index, delay in enumerate(range(1000, 8000, 1000)):
            timer.schedule(delay, lambda i=index: fired.append((i, clock.now_ms())))
        timer._check()
        _assert_state(timer.snapshot(), AFTER_ADDS)
        for clock_ms, task_index, state in STEPS:
            # Just before the bucket's start nothing is due.
            clock.set(clock_ms - 1)
            assert timer.advance_clock(0) is False
            clock.set(clock_ms)
            before = len(fired)
            assert timer.advance_clock(0) is True
            assert fired[before:] == [(task_index, clock_ms)]
            timer._check()
            _assert_state(timer.snapshot(), state)
        assert timer.advance_clock(0) is False
    assert [i for i, _ in fired] == list(range(7))


def test_trace_default_matches_the_worked_example() -> None:
    from tickwheel._trace import run_trace

    steps = run_trace()
    assert len(steps) == 1 + len(STEPS)
    _assert_state(steps[0].snapshot, AFTER_ADDS)
    assert steps[0].clock_ms == START
    for step, (clock_ms, task_index, state) in zip(steps[1:], STEPS, strict=True):
        assert step.clock_ms == clock_ms
        assert step.fired == (task_index,)
        assert step.advanced is True
        _assert_state(step.snapshot, state)
