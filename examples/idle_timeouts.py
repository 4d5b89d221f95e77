"""Idle timeouts for thousands of loopback connections with tickwheel.aio.

A server on 127.0.0.1 (port 0, so any free port) gives every connection an
idle timeout that restarts on each message: the handler reads inside
``timer.timeout(idle)`` and calls ``reschedule`` per line, so one pending
timer per connection lives in the wheel, not in the loop's heap.

In the same process, ``--connections`` clients connect. Half of them (see
``--active-fraction``) send a ping every quarter of the timeout; the rest say
hello and fall silent. The server must close every silent one, never before
its timeout, and keep every active one open. The summary gives how late the
closes were (timeout + loop latency) and exits 1 if a check failed.

    python examples/idle_timeouts.py                    # 5,000 connections, 2 s timeout
    python examples/idle_timeouts.py --connections 200 --idle-timeout 0.3
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field

from tickwheel.aio import AsyncTimer


@dataclass
class Stats:
    """What the server and the clients saw."""

    connected: int = 0
    idle_expected: int = 0
    active_expected: int = 0
    idle_closed: int = 0
    active_closed: int = 0  # active connections the server closed: must stay 0
    early: int = 0  # closes before the idle timeout: must stay 0
    messages: int = 0
    lateness_ms: list[float] = field(default_factory=list)
    peak_timers: int = 0  # most pending timers in the wheel at once


def raise_fd_limit(needed: int) -> tuple[int, int]:
    """Raise the soft open-file limit toward ``needed`` (at most the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        new = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


async def run(connections: int, idle: float, active_fraction: float, linger: float) -> Stats:
    """Serve, connect, wait for the idle ones to be closed, check the active ones."""
    loop = asyncio.get_running_loop()
    stats = Stats()
    n_active = round(connections * active_fraction)
    stats.active_expected = n_active
    stats.idle_expected = connections - n_active
    all_idle_closed = asyncio.Event()
    stop = asyncio.Event()

    async with AsyncTimer() as timer:
        handlers: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            task.add_done_callback(handlers.discard)
            hello = await reader.readline()
            kind = hello.split()[-1] if hello else b"?"
            last = loop.time()
            try:
                async with timer.timeout(idle) as idle_timeout:
                    stats.peak_timers = max(stats.peak_timers, timer.size)
                    while True:
                        line = await reader.readline()
                        if not line:
                            return  # the client hung up
                        stats.messages += 1
                        last = loop.time()
                        idle_timeout.reschedule(last + idle)
            except TimeoutError:
                silent = loop.time() - last
                if silent < idle:
                    stats.early += 1
                stats.lateness_ms.append((silent - idle) * 1000)
                if kind == b"idle":
                    stats.idle_closed += 1
                    if stats.idle_closed == stats.idle_expected:
                        all_idle_closed.set()
                else:
                    stats.active_closed += 1
            finally:
                writer.close()

        server = await asyncio.start_server(
            handle, "127.0.0.1", 0, backlog=min(connections, 4096), limit=1024
        )
        port = server.sockets[0].getsockname()[1]

        async def client(i: int, active: bool, gate: asyncio.Semaphore) -> None:
            async with gate:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            stats.connected += 1
            writer.write(b"hello %d %s\n" % (i, b"active" if active else b"idle"))
            try:
                if active:
                    while not stop.is_set():
                        await asyncio.sleep(idle / 4)
                        writer.write(b"ping\n")
                        await writer.drain()
                else:
                    await reader.read()  # until the server closes us
            except ConnectionError:
                pass
            finally:
                writer.close()

        gate = asyncio.Semaphore(256)
        # Spread active and idle connections evenly.
        clients = []
        for i in range(connections):
            active = (i * n_active) // connections != ((i + 1) * n_active) // connections
            clients.append(asyncio.ensure_future(client(i, active, gate)))
        if stats.idle_expected == 0:
            all_idle_closed.set()
        # Bounded: every idle close is due `idle` after its hello.
        try:
            async with asyncio.timeout(idle * 4 + connections / 100 + 30):
                await all_idle_closed.wait()
                await asyncio.sleep(linger)  # the active ones must outlive this too
        except TimeoutError:
            pass
        stop.set()
        await asyncio.wait(clients, timeout=idle + 30)
        for c in clients:
            c.cancel()
        if handlers:
            await asyncio.wait(handlers, timeout=idle + 30)
        server.close()
        await server.wait_closed()
    return stats


def main(argv: list[str] | None = None) -> int:
    """Run the example; print the summary; return 0 if every check passed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--idle-timeout", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument("--active-fraction", type=float, default=0.5)
    parser.add_argument(
        "--linger", type=float, default=None, help="seconds to keep the active ones after"
    )
    args = parser.parse_args(argv)
    if args.connections < 1 or not args.idle_timeout > 0 or not 0 <= args.active_fraction <= 1:
        parser.error("need --connections >= 1, --idle-timeout > 0, 0 <= --active-fraction <= 1")
    linger = args.idle_timeout if args.linger is None else args.linger
    soft, _ = raise_fd_limit(2 * args.connections + 64)
    if soft != resource.RLIM_INFINITY and soft < 2 * args.connections + 64:
        print(f"open-file limit {soft} is too low for {args.connections} connections")
        return 2
    started = time.perf_counter()
    stats = asyncio.run(run(args.connections, args.idle_timeout, args.active_fraction, linger))
    elapsed = time.perf_counter() - started
    late = sorted(stats.lateness_ms)
    ok = (
        stats.connected == args.connections
        and stats.idle_closed == stats.idle_expected
        and stats.active_closed == 0
        and stats.early == 0
    )
    print(f"connections           {stats.connected} of {args.connections} (loopback)")
    print(f"idle timeout          {args.idle_timeout:g} s, reset on every message")
    print(f"idle closed           {stats.idle_closed} of {stats.idle_expected}")
    print(
        f"active survived       {stats.active_expected - stats.active_closed} of "
        f"{stats.active_expected} ({stats.messages} messages)"
    )
    print(f"closed early          {stats.early}")
    print(f"peak timers in wheel  {stats.peak_timers}")
    if late:
        p99 = late[min(len(late) - 1, int(len(late) * 0.99))]
        print(
            f"close lateness ms     median {statistics.median(late):.1f}  "
            f"p99 {p99:.1f}  max {late[-1]:.1f}"
        )
    print(f"wall time             {elapsed:.1f} s")
    print("result                " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
