"""The timers' share of the echo server's CPU, on each loop, from a py-spy profile.

Runs ``examples/echo_idle.py``'s server under ``py-spy record --native`` (raw
collapsed stacks), drives it with the example's own client, and counts the
samples of the serving loop (start-up excluded) whose stack holds the loop's
timer service: on the stock loop ``call_at``/``call_later``, ``TimerHandle``
construction and ``cancel``, and ``_run_once``'s timer lines (dropping
cancelled handles, popping due ones); on tickwheel's, any tickwheel frame
(its ``call_at``, ``cancel``, the wheel's advance and re-arm) and the same
``_run_once`` lines. It also counts asyncio's own ``Timeout`` (enter, exit,
``reschedule`` outside its timer call). Needs py-spy (``pip install py-spy``)
and CPython 3.11's ``base_events.py`` (the line numbers below).

    python benchmarks/profile_echo.py --connections 10000 --messages 10 --idle 5
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import echo_idle

# BaseEventLoop._run_once of CPython 3.11.7: the cancelled handles dropped, the due ones popped.
TIMER_LINES = set(range(1853, 1880)) | set(range(1886, 1894))
STOCK_TIMER = re.compile(
    r"^(BaseEventLoop\.call_at|BaseEventLoop\.call_later|TimerHandle\.cancel|TimerHandle\.__init__"
    r"|Handle\.__init__ \(asyncio/events|BaseEventLoop\._timer_handle_cancelled|Handle\.cancel) "
)
TIMEOUT = re.compile(
    r"^(Timeout\.(__aenter__|__aexit__|reschedule|__init__|_on_timeout)|timeout) "
    r"\(asyncio/timeouts\.py"
)


def kind(frames: list[str]) -> str | None:
    """``timer``, ``timeout`` (asyncio's Timeout outside its timer), ``other``, or None."""
    runs = [f for f in frames if f.startswith("BaseEventLoop._run_once")]
    if not runs:
        return None  # start-up or shutdown
    in_timeout = False
    for frame in frames:
        if ("tickwheel/" in frame and not frame.startswith("<module>")) or STOCK_TIMER.match(frame):
            return "timer"
        in_timeout = in_timeout or bool(TIMEOUT.match(frame))
    line = int(runs[-1].rsplit(":", 1)[1].rstrip(")"))
    below = frames[frames.index(runs[-1]) + 1 :]
    if line in TIMER_LINES and not any("_run (asyncio/events.py" in f for f in below):
        return "timer"
    return "timeout" if in_timeout else "other"


def shares(raw: Path) -> dict[str, float]:
    """The fraction of the serving loop's samples in each kind."""
    counts = {"timer": 0, "timeout": 0, "other": 0}
    for line in raw.read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        k = kind(stack.split(";"))
        if k is not None:
            counts[k] += int(n)
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in counts.items()} | {"samples": total}


def profile(loop: str, connections: int, messages: int, idle: float, rate: int) -> dict[str, float]:
    """Serve on ``loop`` under py-spy, drive the traffic, return the shares and the checks."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / f"{loop}.raw"
        wrapper = [py_spy, "record", "--native", "--rate", str(rate), "--format", "raw",
                   "-o", str(raw), "--"]  # fmt: skip
        seen = echo_idle.run_one(loop, connections, messages, idle, wrapper, wait_s=120)
        ok = echo_idle.traffic_ok(seen, connections, messages)
        return shares(raw) | {"ok": float(ok)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--idle", type=float, default=5.0, help="idle timeout, seconds")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    args = parser.parse_args(argv)
    print(f"{'loop':<10} {'samples':>8} {'timers':>7} {'Timeout':>8} {'together':>9}  check")
    good = True
    for loop in echo_idle.LOOPS:
        r = profile(loop, args.connections, args.messages, args.idle, args.rate)
        good = good and bool(r["ok"])
        print(
            f"{loop:<10} {int(r['samples']):>8} {r['timer']:>7.1%} {r['timeout']:>8.1%} "
            f"{r['timer'] + r['timeout']:>9.1%}  {'ok' if r['ok'] else 'FAILED (load?)'}"
        )
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
