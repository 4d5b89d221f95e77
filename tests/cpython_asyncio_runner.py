"""Runs CPython's own asyncio tests against tickwheel.aio.EventLoop (see test_cpython_asyncio.py).

Usage: ``python cpython_asyncio_runner.py MODULE EXCLUDED_JSON``. MODULE is
``events`` (``test_events.EventLoopTestsMixin`` on the new loop) or one of the
modules run under ``tickwheel.aio.EventLoopPolicy`` (``timeouts``, ``waitfor``,
``tasks``, ``locks``, ``queues``). Prints one JSON line: tests run, failures,
errors, skips, exclusions applied, and how many EventLoops were made and how
many timers went through them (proof that the tests ran on the wheel).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import platform
import sys
import unittest

import tickwheel.aio as aio
from tickwheel.aio import _loop as _aio_loop

made = {"loops": 0, "timers": 0}
_init = _aio_loop.EventLoop.__init__
_call_at = _aio_loop.EventLoop.call_at
_call_later = _aio_loop.EventLoop.call_later


def _counting_init(self: _aio_loop.EventLoop, *args: object, **kwargs: object) -> None:
    made["loops"] += 1
    _init(self, *args, **kwargs)  # type: ignore[arg-type]


def _counting_call_at(self: _aio_loop.EventLoop, *args: object, **kwargs: object) -> object:
    made["timers"] += 1
    return _call_at(self, *args, **kwargs)  # type: ignore[arg-type]


def _counting_call_later(self: _aio_loop.EventLoop, *args: object, **kwargs: object) -> object:
    # The compiled call_later does not go through call_at: count both.
    made["timers"] += 1
    return _call_later(self, *args, **kwargs)  # type: ignore[arg-type]


def _suite(module: str) -> unittest.TestSuite:
    loader = unittest.TestLoader()
    if module == "events":
        from test.test_asyncio import test_events
        from test.test_asyncio import utils as test_utils

        class TickwheelEventLoopTests(test_events.EventLoopTestsMixin, test_utils.TestCase):  # type: ignore[misc, name-defined]
            def create_event_loop(self) -> asyncio.AbstractEventLoop:
                return aio.EventLoop()

        return loader.loadTestsFromTestCase(TickwheelEventLoopTests)
    mod = importlib.import_module(f"test.test_asyncio.test_{module}")
    # Each module's tearDownModule resets the policy to asyncio's default: keep ours.
    mod.tearDownModule = aio.install  # type: ignore[attr-defined]
    return loader.loadTestsFromModule(mod)


def _without(suite: unittest.TestSuite, excluded: set[str]) -> tuple[unittest.TestSuite, list[str]]:
    kept = unittest.TestSuite()
    dropped = []
    for test in _flatten(suite):
        name = test.id().split(".", 1)[-1]  # Class.method, without the module
        if name in excluded:
            dropped.append(name)
        else:
            kept.addTest(test)
    return kept, dropped


def _flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return out


def main() -> int:
    module, excluded_json = sys.argv[1], sys.argv[2]
    _aio_loop.EventLoop.__init__ = _counting_init  # type: ignore[method-assign]
    _aio_loop.EventLoop.call_at = _counting_call_at  # type: ignore[method-assign, assignment]
    _aio_loop.EventLoop.call_later = _counting_call_later  # type: ignore[method-assign, assignment]
    suite, dropped = _without(_suite(module), set(json.loads(excluded_json)))
    aio.install()
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
    asyncio.set_event_loop_policy(None)
    print(
        json.dumps(
            {
                "run": result.testsRun,
                "failures": [[t.id(), tb] for t, tb in result.failures],
                "errors": [[t.id(), tb] for t, tb in result.errors],
                "skipped": [[t.id(), why] for t, why in result.skipped],
                "excluded": dropped,
                # Whose tests ran: this interpreter's version and its test package.
                "python": platform.python_version(),
                "test_package": sys.modules["test.test_asyncio"].__file__,
                **made,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
