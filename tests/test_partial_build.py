"""A partial build still imports: what depends on a missing extension runs pure, said once.

The two extensions (``tickwheel._speedups`` and ``tickwheel.pipeline._loop``)
are built separately, so an install can have one without the other, or one
that cannot be loaded. Each case runs in a child interpreter in which an import
hook makes one extension fail as it would; the child records the warnings,
which path each part took, and the rows of a small pipeline run, and prints
them as JSON. Whatever the path, the rows are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import tickwheel

pytestmark = pytest.mark.skipif(
    not tickwheel.COMPILED, reason="the compiled core is not built: there is nothing to break"
)

CHILD = textwrap.dedent(
    """
    import importlib.abc, json, sys, warnings

    BLOCKED, ERROR = sys.argv[1], sys.argv[2]

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != BLOCKED:
                return None
            if ERROR == "not built":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            raise ImportError(f"{name}: undefined symbol: PyFoo_Bar", name=name)

    if BLOCKED:
        sys.meta_path.insert(0, Missing())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import tickwheel
        from tickwheel.pipeline import core
        from tickwheel.pipeline.rules import Rule
        import tickwheel.pipeline.core  # a second import says nothing more

    proc = core.PartitionProcessor([Rule("pay", "order", ("created",), ("paid",), (), 100)])
    proc.process([
        core.Event(0, "a", 1000, 0, "o1", 0, "created"),
        core.Event(0, "b", 1010, 0, "o2", 0, "created"),
        core.Event(0, "a", 1050, 0, "p1", 1, "paid"),
        core.Event(0, "c", 1060, 0, "p2", 1, "paid"),
    ])
    proc.finish(2000)
    print(json.dumps({
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "compiled": tickwheel.COMPILED,
        "loop_module": core.PartitionProcessor.__mro__[1].__module__,
        "rows": [list(r) for r in proc.outcome_rows() + proc.unmatched_rows()],
    }))
    """
)


def _child(blocked: str = "", error: str = "", **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, blocked, error],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def whole() -> dict[str, Any]:
    return _child()


def test_a_whole_build_says_nothing(whole: dict[str, Any]) -> None:
    assert whole["warnings"] == []
    assert whole["compiled"] is True
    assert whole["loop_module"] == "tickwheel.pipeline._loop"


def test_without_the_pipeline_loop_the_loop_runs_pure_and_says_so_once(
    whole: dict[str, Any],
) -> None:
    got = _child("tickwheel.pipeline._loop", "not built")
    assert got["compiled"] is True  # the timer core is still compiled
    assert got["loop_module"] == "tickwheel.pipeline.core"
    (warning,) = got["warnings"]
    assert warning.startswith("RuntimeWarning: tickwheel: tickwheel.pipeline._loop is not in use")
    assert "the pipeline's per-partition loop" in warning
    assert "TICKWHEEL_NO_EXTENSIONS=1" in warning
    assert got["rows"] == whole["rows"]


@pytest.mark.parametrize("error", ["not built", "cannot load"])
def test_without_the_core_everything_runs_pure_and_says_so_once(
    whole: dict[str, Any], error: str
) -> None:
    # "not built" while the pipeline's loop is: a partial build, not a pure install.
    got = _child("tickwheel._speedups", error)
    assert got["compiled"] is False
    assert got["loop_module"] == "tickwheel.pipeline.core"
    (warning,) = got["warnings"]  # nothing more about the loop, which needs the core
    assert warning.startswith("RuntimeWarning: tickwheel: tickwheel._speedups is not in use")
    assert ("undefined symbol" in warning) == (error == "cannot load")
    assert got["rows"] == whole["rows"]


def test_the_pure_path_by_choice_says_nothing(whole: dict[str, Any]) -> None:
    got = _child("tickwheel.pipeline._loop", "not built", TICKWHEEL_NO_EXTENSIONS="1")
    assert got["warnings"] == []
    assert got["compiled"] is False
    assert got["rows"] == whole["rows"]
