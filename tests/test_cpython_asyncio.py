"""CPython's own asyncio tests, run against tickwheel.aio.EventLoop.

* ``test_events.EventLoopTestsMixin``, with ``create_event_loop`` returning
  an ``EventLoop``;
* ``test_timeouts``, ``test_waitfor``, ``test_tasks``, ``test_locks`` and
  ``test_queues``, under ``EventLoopPolicy``: every loop their tests make with
  ``asyncio.new_event_loop``, ``asyncio.run`` or ``IsolatedAsyncioTestCase`` is
  an ``EventLoop``.

Each module runs in a child interpreter (``cpython_asyncio_runner.py``), so
CPython's tests keep their own warning filters and policy changes to
themselves. A test here passes when the child ran the module's tests, none
failed, and the loops really were tickwheel's (the child counts the
``EventLoop``s made and the timers that went through them). The interpreter
must ship its test package (``test.test_asyncio``); when it does not, these
tests skip and say so, unless ``TICKWHEEL_REQUIRE_CPYTHON_TESTS`` is set (CI
sets it: ``.ci/run`` runs them on every CPython the machine has). The tests
that run are the running interpreter's own: the child is this interpreter, and
its report names the version and the test package it loaded.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

try:
    import test.test_asyncio  # noqa: F401
except ImportError:
    if os.environ.get("TICKWHEEL_REQUIRE_CPYTHON_TESTS"):
        raise
    pytest.skip(
        "this interpreter does not ship CPython's test suite (test.test_asyncio)",
        allow_module_level=True,
    )

RUNNER = Path(__file__).with_name("cpython_asyncio_runner.py")

#: Every test excluded from the runs, with its reason (``Class.method``).
#: None is: all of them pass on the wheel, on both paths, on CPython 3.11.
EXCLUDED: dict[str, str] = {}

#: Each module, and the least number of timers its tests must send to the wheel;
#: the longest first (``tasks`` takes about 16 s, mostly waiting on its timers), so
#: that a worker of the suite starts it early and the others go on beside it.
MODULES = {"tasks": 100, "events": 10, "waitfor": 10, "timeouts": 10, "locks": 1, "queues": 1}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("module", list(MODULES))
def test_cpython_asyncio_tests_pass_on_the_wheel(module: str) -> None:
    done = subprocess.run(
        [sys.executable, str(RUNNER), module, json.dumps(sorted(EXCLUDED))],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    problems = report["failures"] + report["errors"]
    assert not problems, "\n\n".join(f"{name}\n{tb}" for name, tb in problems)
    assert report["run"] > 10
    assert report["loops"] > 0, "no EventLoop was made: the tests did not run on the wheel"
    assert report["timers"] >= MODULES[module]
    assert set(report["excluded"]) <= set(EXCLUDED)
    assert report["python"] == platform.python_version()
    stdlib = Path(sysconfig.get_path("stdlib")).resolve()
    assert Path(report["test_package"]).resolve().is_relative_to(stdlib)
