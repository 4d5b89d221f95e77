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
