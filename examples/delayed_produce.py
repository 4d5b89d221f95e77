"""Produce requests with ``acks=all`` waiting in a purgatory (Kafka's ``DelayedProduce``).

The leader of ``orders-0`` appends each produce request to its log, then the
request waits until every in-sync replica has fetched up to the request's last
offset, or until ``request.timeout.ms`` passes, whichever comes first. Each
simulated replica fetch advances that replica's log end offset and calls
``check_and_complete("orders-0")``, exactly where Kafka's leader calls
``tryCompleteDelayedRequests``.

Replica 3 stalls (a long GC pause) between 1000 and 2800 ms, so the requests
that cannot be acknowledged within 1500 ms time out.

The run is deterministic: the purgatory sits on a timer driven by a
``ManualClock`` (``executor="inline"``, no reaper). Run it with::

    python examples/delayed_produce.py
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from tickwheel import DelayedOperation, DelayedOperationPurgatory, ManualClock, SystemTimer

REQUEST_TIMEOUT_MS = 1_500
TOPIC_PARTITION = "orders-0"
LEADER = 1
FOLLOWERS = (2, 3)


class Partition:
    """The leader's view of one partition: its log end offset and each in-sync replica's."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.log_end_offset = 0
        self.replica_leo = {LEADER: 0, **dict.fromkeys(FOLLOWERS, 0)}

    def append(self, messages: int) -> int:
        """Append to the leader's log; return the offset every replica must reach."""
        self.log_end_offset += messages
        self.replica_leo[LEADER] = self.log_end_offset
        return self.log_end_offset

    def high_watermark(self) -> int:
        """The offset every in-sync replica has: what ``acks=all`` waits for."""
        return min(self.replica_leo.values())


@dataclass
class Outcome:
    """How one produce request ended."""

    request: int
    sent_ms: int
    required_offset: int
    result: str = "pending"
    at_ms: int = -1


class DelayedProduce(DelayedOperation):
    """Waits until the partition's high watermark reaches ``required_offset``."""

    __slots__ = ("clock", "outcome", "partition")

    def __init__(self, outcome: Outcome, partition: Partition, clock: ManualClock) -> None:
        super().__init__(REQUEST_TIMEOUT_MS)
        self.outcome = outcome
        self.partition = partition
        self.clock = clock

    def try_complete(self) -> bool:
        if self.partition.high_watermark() >= self.outcome.required_offset:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        # As Kafka's onComplete: build the response, acked or REQUEST_TIMED_OUT.
        acked = self.partition.high_watermark() >= self.outcome.required_offset
        self.outcome.result = "acked" if acked else "timed out"
        self.outcome.at_ms = self.clock.now_ms()


def simulate() -> tuple[list[Outcome], DelayedOperationPurgatory[DelayedProduce]]:
    """Run the scenario; return the outcomes and the (shut down) purgatory."""
    clock = ManualClock(0)
    timer = SystemTimer("produce", clock=clock, executor="inline")
    purgatory: DelayedOperationPurgatory[DelayedProduce] = DelayedOperationPurgatory(
        "Produce", timer=timer, reaper_enabled=False
    )
    partition = Partition(TOPIC_PARTITION)
    outcomes: list[Outcome] = []
    events: list[tuple[int, int, Callable[[], None]]] = []
    seq = itertools.count()

    def at(ms: int, action: Callable[[], None]) -> None:
        heapq.heappush(events, (ms, next(seq), action))

    def produce(request: int) -> None:
        required = partition.append(10)
        outcome = Outcome(request, clock.now_ms(), required)
        outcomes.append(outcome)
        purgatory.try_complete_else_watch(
            DelayedProduce(outcome, partition, clock), [TOPIC_PARTITION]
        )

    def fetch(replica: int) -> None:
        stalled = replica == 3 and 1_000 <= clock.now_ms() < 2_800
        if not stalled:
            partition.replica_leo[replica] = partition.log_end_offset
            purgatory.check_and_complete(TOPIC_PARTITION)

    for request in range(1, 16):
        at(request * 200 - 150, functools.partial(produce, request))
    for ms in range(0, 5_000, 100):
        for replica in FOLLOWERS:
            at(ms, functools.partial(fetch, replica))
    for ms in range(0, 5_000, 10):
        at(ms, lambda: None)  # the expiration reaper's tick: only advance_clock below

    while events:
        ms, _, action = heapq.heappop(events)
        clock.set(ms)
        purgatory.advance_clock(0)  # expire what is due before the event at this time
        action()
    purgatory.shutdown()
    return outcomes, purgatory


def main() -> None:
    """Print which requests were acknowledged and which timed out."""
    outcomes, purgatory = simulate()
    print(f"acks=all produce to {TOPIC_PARTITION}, request.timeout.ms={REQUEST_TIMEOUT_MS}")
    print(f"{'request':>7}  {'sent_ms':>7}  {'offset':>6}  {'result':<9}  {'at_ms':>5}  waited_ms")
    for o in outcomes:
        print(
            f"{o.request:>7}  {o.sent_ms:>7}  {o.required_offset:>6}  {o.result:<9}  "
            f"{o.at_ms:>5}  {o.at_ms - o.sent_ms}"
        )
    acked = sum(o.result == "acked" for o in outcomes)
    timed_out = sum(o.result == "timed out" for o in outcomes)
    print(
        f"{acked} acked, {timed_out} timed out "
        f"(purgatory: completed={purgatory.num_completed}, expired={purgatory.num_expired})"
    )


if __name__ == "__main__":
    main()
