"""The stream's warning on a watermark jump: not for files that arrive at their normal pace."""

from __future__ import annotations

from tickwheel.pipeline.stream.micro_batch import abnormal_batch_warnings

HOUR = 3_600_000
HALF_HOUR = 1_800_000


def jump_warnings(jump: int, span: int | None) -> list[str]:
    return abnormal_batch_warnings(
        arrived=100, late=0, previous_max_time=10 * HOUR, watermark=10 * HOUR + jump,
        longest_timeout_ms=HALF_HOUR, previous_span_ms=span,
    )  # fmt: skip


def test_files_of_an_hour_each_move_the_watermark_an_hour_without_a_warning() -> None:
    assert jump_warnings(int(1.3 * HOUR), span=int(1.3 * HOUR)) == []
    assert jump_warnings(int(2.8 * HOUR), span=int(1.3 * HOUR)) == []  # a longer last file


def test_a_jump_far_beyond_the_previous_batches_span_warns() -> None:
    (message,) = jump_warnings(30 * 24 * HOUR, span=int(1.3 * HOUR))
    assert message.startswith("the watermark moved 30.0d past the previous batch's largest")
    (message,) = jump_warnings(4 * HOUR, span=HOUR)
    assert "moved 4.0h" in message


def test_a_jump_within_the_longest_timeout_never_warns() -> None:
    assert jump_warnings(HALF_HOUR, span=0) == []
    assert len(jump_warnings(HALF_HOUR + 1, span=0)) == 1


def test_without_the_previous_span_the_timeout_alone_decides() -> None:
    assert len(jump_warnings(HALF_HOUR + 1, span=None)) == 1
