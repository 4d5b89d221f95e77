"""Generate realistic order events as JSON Lines: the demo's and the benchmark's input.

Each order is ``created``; most are ``paid`` within the timeout, some after it
(paid after the auto-cancel: ``after_expiry``), some exactly at the deadline or
one millisecond before it, some are ``cancelled`` by their user, the rest never
resolve and expire. Some keys are re-opened (several operations per key), some
payments have no order (``no_operation``), some orders are paid twice. About 5%
of the records are sent twice (producer retries), a few are conflicting copies
(same id, other content), a few lines are malformed, and the arrival order is
shuffled within two minutes. Times are epoch milliseconds, with about 10% of
them written as ISO-8601 with an offset.

Fields: ``event_id``, ``order_id``, ``type``, ``ts``, ``seq`` and ``amount``,
matching ``examples/orders.toml``.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GenerateStats", "generate_orders"]

BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
_OFFSETS = ((0, "Z"), (2 * 60, "+02:00"), (-5 * 60 - 30, "-05:30"), (9 * 60, "+09:00"))


@dataclass(frozen=True)
class GenerateStats:
    """What :func:`generate_orders` wrote."""

    orders: int
    records: int
    files: int
    first_ms: int
    last_ms: int

    def events_per_order(self) -> float:
        """Records written per order (duplicates and malformed lines included). O(1)."""
        return self.records / self.orders if self.orders else 0.0


def _iso(ms: int, rng: random.Random) -> str:
    minutes, suffix = _OFFSETS[rng.randrange(len(_OFFSETS))]
    tz = dt.UTC if suffix == "Z" else dt.timezone(dt.timedelta(minutes=minutes))
    when = dt.datetime.fromtimestamp(ms / 1000, tz=tz).replace(microsecond=(ms % 1000) * 1000)
    text = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}"
    return text + suffix


class _Records:
    """The generated records, as (arrival ms, line), and the id and RNG they are made with."""

    def __init__(self, rng: random.Random, shuffle_ms: int) -> None:
        self.rng = rng
        self.shuffle_ms = shuffle_ms
        self.lines: list[tuple[int, str]] = []
        self.serial = 0

    def emit(self, key: str, kind: str, ms: int, seq: int) -> None:
        """One event's record, sometimes sent twice, rarely with a conflicting copy."""
        rng, rand = self.rng, self.rng.random
        self.serial += 1
        event_id = f"e{self.serial:09d}"
        ts = f'"{_iso(ms, rng)}"' if rand() < 0.10 else str(ms)
        amount = f"{rng.randrange(100, 20_000) / 100:.2f}" if kind != "cancelled" else "0.00"
        line = (
            f'{{"event_id":"{event_id}","order_id":"{key}","type":"{kind}",'
            f'"ts":{ts},"seq":{seq},"amount":{amount}}}'
        )
        arrival = ms + int(rand() * self.shuffle_ms)
        self.lines.append((arrival, line))
        roll = rand()
        if roll < 0.05:  # a producer retry: the same record again, a little later
            self.lines.append((arrival + int(rand() * 5_000), line))
        elif roll < 0.051:  # a conflicting copy: same id, other time
            other = line.replace(f'"seq":{seq}', f'"seq":{seq + 7}')
            self.lines.append((arrival + int(rand() * 5_000), other))


def _resolution(records: _Records, key: str, now: int, timeout_ms: int) -> None:
    """What happens to an order created at ``now``: paid, late, cancelled, or nothing."""
    emit, rng, rand = records.emit, records.rng, records.rng.random
    u = rand()
    if u < 0.60:  # paid, mostly well within the timeout, some after it
        delay = int(rng.lognormvariate(11.5, 1.0))  # median about 100 s
        emit(key, "paid", now + max(delay, 1), 1)
        if rand() < 0.02:  # paid twice: the second finds nothing pending
            emit(key, "paid", now + max(delay, 1) + 1 + int(rand() * 60_000), 2)
    elif u < 0.61:  # paid exactly at the deadline: too late, already expired
        emit(key, "paid", now + timeout_ms, 1)
    elif u < 0.62:  # one millisecond before the deadline: in time
        emit(key, "paid", now + timeout_ms - 1, 1)
    elif u < 0.625:  # paid at the same millisecond as created, after it by sequence
        emit(key, "paid", now, 1)
    elif u < 0.63:  # paid at the same millisecond, but ordered before the creation
        emit(key, "paid", now, -1)
    elif u < 0.71:  # cancelled by the user before the deadline
        emit(key, "cancelled", now + 1 + int(rand() * (timeout_ms - 2)), 1)
    elif u < 0.72:  # cancelled after the auto-cancel
        emit(key, "cancelled", now + timeout_ms + int(rand() * 600_000), 1)
    # else: never resolved; it expires (or stays pending near the end)


def _write_files(lines: list[tuple[int, str]], out: Path, files: int) -> int:
    """The lines in arrival order, cut into ``files`` files; the number of files."""
    lines.sort(key=lambda r: r[0])
    n_files = max(1, min(files, len(lines))) if lines else files
    handles = [(out / f"part-{i:05d}.jsonl").open("w", encoding="utf-8") for i in range(n_files)]
    try:
        chunk = max(1, -(-len(lines) // n_files))
        for index, (_, line) in enumerate(lines):
            handles[min(index // chunk, n_files - 1)].write(line + "\n")
    finally:
        for handle in handles:
            handle.close()
    return n_files


def generate_orders(
    orders: int,
    out_dir: str | Path,
    seed: int = 0,
    files: int = 4,
    timeout_ms: int = 30 * 60_000,
    mean_gap_ms: int = 50,
    shuffle_ms: int = 120_000,
    start_ms: int = BASE_MS,
) -> GenerateStats:
    """Write ``orders`` orders' events to ``files`` JSON Lines files in ``out_dir``.

    Deterministic for a given ``seed``. ``timeout_ms`` should match the rule's
    timeout so that the deadline cases land on it. O(orders log orders).
    """
    if type(orders) is not int or orders < 0:
        raise ValueError(f"orders must be an int >= 0, got {orders!r}")
    if type(files) is not int or files < 1:
        raise ValueError(f"files must be an int >= 1, got {files!r}")
    if timeout_ms < 2:
        raise ValueError(f"timeout_ms must be >= 2, got {timeout_ms!r}")
    rng = random.Random(seed)
    rand = rng.random
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.jsonl"):
        old.unlink()
    records = _Records(rng, shuffle_ms)
    now = start_ms
    keys: list[str] = []
    for i in range(orders):
        now += int(rng.expovariate(1.0 / mean_gap_ms))
        if keys and rand() < 0.02:
            key = keys[-1 - int(rand() * min(len(keys), 50))]  # re-opened: several ops per key
        else:
            key = f"o{i:08d}"
            keys.append(key)
        records.emit(key, "created", now, 0)
        _resolution(records, key, now, timeout_ms)
        if rand() < 0.01:  # a payment for an order that does not exist
            records.emit(f"x{i:08d}", "paid", now + int(rand() * 60_000), 0)
        if rand() < 0.0005:
            records.lines.append((now, _malformed(rng, i, now)))
    n_files = _write_files(records.lines, out, files)
    return GenerateStats(
        orders=orders,
        records=len(records.lines),
        files=n_files,
        first_ms=start_ms,
        last_ms=now,
    )


def _malformed(rng: random.Random, i: int, ms: int) -> str:
    choice = rng.randrange(7)
    if choice == 0:
        return f'{{"event_id":"m{i}","order_id":"o{i:08d}","type":"paid","ts":{ms}'  # truncated
    if choice == 1:
        return f'{{"order_id":"o{i:08d}","type":"paid","ts":{ms},"seq":1}}'  # no id
    if choice == 2:
        return f'{{"event_id":"m{i}","order_id":"o{i:08d}","type":"paid","ts":"yesterday"}}'
    if choice == 3:
        return (
            f'{{"event_id":"m{i}","order_id":"o{i:08d}","type":"paid","ts":"2024-01-01T10:00:00"}}'
        )
    if choice == 4:
        return f'{{"event_id":"m{i}","type":"paid","ts":{ms},"seq":1}}'  # no key
    if choice == 5:
        return f'{{"event_id":"m{i}","order_id":"o{i:08d}","type":"paid","ts":{ms},"seq":"x"}}'
    return "not json at all"
