"""Settings shared by the library's tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # On the pure path, tickwheel.aio's loop factories warn once that the compiled
    # core is not in use (tests/test_aio_loop.py checks it in a child process):
    # the suite's other tests make loops on both paths alike.
    config.addinivalue_line(
        "filterwarnings", "ignore:tickwheel.aio. the compiled core is not in use:RuntimeWarning"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each half of the run starts with its share of the slow modules.

    pytest-xdist's work stealing hands the first half of this order to one
    worker and the second half to the other, and a worker that runs dry takes
    tests from the end of the other's queue. So the modules that hold slow
    tests are dealt to the two halves in turn (the one with fewer slow tests so
    far takes the next), each half ending with fast modules: the tests left to
    take at the end are short, and neither worker waits alone on a long one.
    Each module's tests stay together, for its fixtures.
    """
    modules: dict[object, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(getattr(item, "module", None), []).append(item)
    slow = {m: sum(i.get_closest_marker("slow") is not None for i in g) for m, g in modules.items()}
    halves: tuple[list[pytest.Item], list[pytest.Item]] = ([], [])
    dealt = [0, 0]
    for module in (m for m in modules if slow[m]):
        fewer = dealt.index(min(dealt))
        halves[fewer].extend(modules[module])
        dealt[fewer] += slow[module]
    first_half = len(items) // 2
    for module in (m for m in modules if not slow[m]):
        half = 0 if len(halves[0]) + len(modules[module]) <= first_half else 1
        halves[half].extend(modules[module])
    items[:] = [*halves[0], *halves[1]]
