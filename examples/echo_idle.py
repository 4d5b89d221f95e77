"""A TCP echo server whose connections time out when idle: plain asyncio, on either loop.

The server is the code a service developer writes without tickwheel: each
connection reads lines inside ``asyncio.timeout(idle)`` and reschedules it on
every message. Run it on asyncio's stock loop or, with one line
(``loop_factory=tickwheel.aio.new_event_loop``), on tickwheel's, and compare.

The server runs in a child process (so it has the file limit to itself); this
process is the client, on 127.0.0.1 only: it opens ``--connections``
connections, sends ``--messages`` lines on each and reads every echo back, then
closes the active half and leaves the rest silent until the server times them
out. For each loop it prints the server's CPU seconds for the same traffic,
the timeouts that fired, and the lines echoed; it exits 1 if a check failed
(every silent connection timed out, no active one did, every line came back).

    python examples/echo_idle.py                        # 10,000 connections, both loops
    python examples/echo_idle.py --connections 200 --messages 5 --idle 0.3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

LOOPS = ("stock", "tickwheel")


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        limit = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


# -- the server (child process) -------------------------------------------------------


async def _serve(connections: int, idle: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stats = {"timeouts": 0, "lines": 0, "closed": 0}
    all_closed = loop.create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(idle) as deadline:
                while line := await reader.readline():
                    deadline.reschedule(loop.time() + idle)
                    stats["lines"] += 1
                    writer.write(line)
                    await writer.drain()
        except TimeoutError:
            stats["timeouts"] += 1
        except ConnectionError:
            pass
        finally:
            writer.close()
            stats["closed"] += 1
            if stats["closed"] == connections and not all_closed.done():
                all_closed.set_result(None)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port}), flush=True)
    cpu = time.process_time()
    await asyncio.wait_for(all_closed, timeout=120 + 10 * idle)
    stats["cpu_s"] = time.process_time() - cpu
    server.close()
    await server.wait_closed()
    return stats


def serve_main(loop_kind: str, connections: int, idle: float) -> None:
    """The child: serve on ``loop_kind`` until every connection closed; print the stats."""
    _raise_fd_limit(connections + 100)
    factory = None
    if loop_kind == "tickwheel":
        import tickwheel.aio

        factory = tickwheel.aio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        stats = runner.run(_serve(connections, idle))
        stats["loop"] = type(runner.get_loop()).__name__
    print(json.dumps(stats), flush=True)


# -- the client (this process) ---------------------------------------------------------


async def _client(port: int, connections: int, messages: int) -> dict[str, int]:
    """Open the connections, echo ``messages`` lines on each, close half, idle the rest."""
    opened = []
    for _ in range(connections):
        opened.append(await asyncio.open_connection("127.0.0.1", port))
    echoed = 0

    async def talk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal echoed
        for i in range(messages):
            writer.write(b"ping %d\n" % i)
            if await reader.readline():
                echoed += 1

    await asyncio.gather(*(talk(r, w) for r, w in opened))
    active = connections // 2
    for _, writer in opened[:active]:
        writer.close()
    # The silent half waits for the server to time it out (EOF).
    for reader, _ in opened[active:]:
        await reader.read()
    for _, writer in opened[active:]:
        writer.close()
    return {"echoed": echoed, "silent": connections - active}


def run_one(
    loop_kind: str,
    connections: int,
    messages: int,
    idle: float,
    wrapper: Sequence[str] = (),
    wait_s: float = 60,
) -> dict[str, Any]:
    """Start the server on ``loop_kind``, drive it, and return what both sides saw.

    ``wrapper`` runs the server under another command (a profiler, say), whose
    own output lines, before the server's first JSON line, are skipped.
    """
    child = subprocess.Popen(
        [*wrapper, sys.executable, __file__, "--serve", loop_kind,
         "--connections", str(connections), "--idle", str(idle)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if wrapper else None,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        port = None
        while port is None:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError("the server did not start")
            if line.startswith("{"):
                port = json.loads(line)["port"]
        _raise_fd_limit(connections + 100)
        client = asyncio.run(_client(port, connections, messages))
        server = json.loads(child.stdout.readline())
        child.wait(timeout=wait_s)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    return {**server, **client}


def traffic_ok(seen: dict[str, Any], connections: int, messages: int) -> bool:
    """Every line echoed, and exactly the silent connections timed out."""
    return bool(
        seen["lines"] == seen["echoed"] == connections * messages
        and seen["timeouts"] == seen["silent"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--idle", type=float, default=2.0, help="idle timeout, seconds")
    parser.add_argument("--loops", default=",".join(LOOPS), help="stock,tickwheel")
    parser.add_argument("--serve", choices=LOOPS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.connections < 2 or args.messages < 1 or args.idle <= 0:
        parser.error("--connections >= 2, --messages >= 1 and --idle > 0")
    if args.serve:
        serve_main(args.serve, args.connections, args.idle)
        return 0
    loops = [name for name in args.loops.split(",") if name]
    if not loops or set(loops) - set(LOOPS):
        parser.error(f"--loops takes {','.join(LOOPS)}")
    ok = True
    print(
        f"{args.connections:,} connections x {args.messages} lines, idle timeout {args.idle} s, "
        f"pid {os.getpid()} is the client"
    )
    print(f"{'loop':<34} {'server CPU s':>12} {'lines':>9} {'timeouts':>9}  check")
    for name in loops:
        r = run_one(name, args.connections, args.messages, args.idle)
        good = traffic_ok(r, args.connections, args.messages)
        ok = ok and good
        label = f"{name} ({r['loop']})"
        print(
            f"{label:<34} {r['cpu_s']:>12.2f} {r['lines']:>9,} {r['timeouts']:>9,}  "
            f"{'ok' if good else 'FAILED'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
