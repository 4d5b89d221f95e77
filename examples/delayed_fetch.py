"""Fetch requests waiting for ``min_bytes`` or ``max_wait_ms`` (Kafka's ``DelayedFetch``).

A consumer's fetch returns as soon as at least ``fetch.min.bytes`` of new data
is available past its offset, or after ``fetch.max.wait.ms`` with whatever there
is (possibly nothing). Each produce to the partition calls
``check_and_complete("clicks-0")``, which completes the fetches now satisfied.

Three consumers fetch at time 0 with different ``min_bytes``; producers then
append batches of various sizes. The run is deterministic (a timer on a
``ManualClock``). Run it with::

    python examples/delayed_fetch.py
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tickwheel import DelayedOperation, DelayedOperationPurgatory, ManualClock, SystemTimer

TOPIC_PARTITION = "clicks-0"
MAX_WAIT_MS = 500


class Log:
    """A partition's log: the size in bytes of each batch appended."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def bytes_after(self, offset: int) -> int:
        """Bytes available to a consumer at ``offset``."""
        return sum(self.batches[offset:])


@dataclass
class FetchResponse:
    """What a consumer got back."""

    consumer: str
    min_bytes: int
    bytes: int = 0
    batches: list[int] = field(default_factory=list)
    at_ms: int = -1
    reason: str = "pending"


class DelayedFetch(DelayedOperation):
    """Completes once ``min_bytes`` are available past ``offset``; else after ``max_wait_ms``."""

    __slots__ = ("clock", "log", "offset", "response")

    def __init__(self, response: FetchResponse, offset: int, log: Log, clock: ManualClock) -> None:
        super().__init__(MAX_WAIT_MS)
        self.response = response
        self.offset = offset
        self.log = log
        self.clock = clock

    def try_complete(self) -> bool:
        if self.log.bytes_after(self.offset) >= self.response.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        # As Kafka's onComplete: read the log now, whatever the reason.
        batches = self.log.batches[self.offset :]
        self.response.batches = batches
        self.response.bytes = sum(batches)
        self.response.at_ms = self.clock.now_ms()
        self.response.reason = "min_bytes reached"

    def on_expiration(self) -> None:
        self.response.reason = "max_wait_ms passed"


def simulate() -> tuple[list[FetchResponse], DelayedOperationPurgatory[DelayedFetch]]:
    """Run the scenario; return the responses and the (shut down) purgatory."""
    clock = ManualClock(0)
    timer = SystemTimer("fetch", clock=clock, executor="inline")
    purgatory: DelayedOperationPurgatory[DelayedFetch] = DelayedOperationPurgatory(
        "Fetch", timer=timer, reaper_enabled=False
    )
    log = Log()
    log.batches.append(300)  # already in the log before the fetches arrive
    responses = [
        FetchResponse("dashboard", min_bytes=1),
        FetchResponse("aggregator", min_bytes=4_000),
        FetchResponse("archiver", min_bytes=1_000_000),
    ]
    for response in responses:
        purgatory.try_complete_else_watch(DelayedFetch(response, 0, log, clock), [TOPIC_PARTITION])

    appends = {40: 1_200, 120: 900, 210: 2_500, 380: 700, 650: 5_000}  # ms -> batch bytes
    for ms in range(0, 1_000, 10):
        clock.set(ms)
        purgatory.advance_clock(0)
        if ms in appends:
            log.batches.append(appends[ms])
            purgatory.check_and_complete(TOPIC_PARTITION)
    purgatory.shutdown()
    return responses, purgatory


def main() -> None:
    """Print when and why each fetch returned."""
    responses, purgatory = simulate()
    print(f"fetches on {TOPIC_PARTITION}, fetch.max.wait.ms={MAX_WAIT_MS}")
    print(f"{'consumer':<10}  {'min_bytes':>9}  {'at_ms':>5}  {'bytes':>5}  reason")
    for r in responses:
        print(f"{r.consumer:<10}  {r.min_bytes:>9}  {r.at_ms:>5}  {r.bytes:>5}  {r.reason}")
    print(f"completed={purgatory.num_completed}, expired={purgatory.num_expired}")


if __name__ == "__main__":
    main()
