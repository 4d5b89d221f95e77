"""Helpers shared by the tests that wait on other threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

#: Bound for every wait on another thread; never a timing assertion.
WAIT_S = 10.0


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Poll ``predicate`` every millisecond until it holds or ``timeout_s`` passes."""
    event = threading.Event()
    for _ in range(int(timeout_s / 0.001)):
        if predicate():
            return True
        event.wait(0.001)
    return predicate()
