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
    """The modules that hold slow tests first, each module's tests kept together.

    pytest-xdist hands out tests in this order: a slow one that starts last keeps
    one worker busy while the other has nothing left, so they start first.
    """
    slow = {getattr(i, "module", None) for i in items if i.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: getattr(item, "module", None) not in slow)
