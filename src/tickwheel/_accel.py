"""Which implementation runs: the compiled core or the pure-Python reference.

``tickwheel._speedups`` (Cython, built at install when a C compiler is
present) holds compiled twins of the hot classes: the task list and its
entries, ``TimerTask``, ``TimingWheel``, the bucket delay queue, ``TimerCore``,
and the hot halves of ``SystemTimer`` and ``AsyncTimer``;
``tickwheel.pipeline._loop``, built with it, the per-partition loop's. Each pure module
defines its reference classes, then takes the twins from here when they are
in use, as CPython's ``heapq.py`` ends with ``from _heapq import *``.

Setting ``TICKWHEEL_NO_EXTENSIONS`` to a non-empty value before the first
import forces the pure path (as aiohttp's ``AIOHTTP_NO_EXTENSIONS`` does).
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

__all__ = ["COMPILED", "load_pure", "speedups"]

speedups: ModuleType | None = None
if not os.environ.get("TICKWHEEL_NO_EXTENSIONS"):
    try:
        speedups = importlib.import_module("tickwheel._speedups")
    except ImportError:  # not built: no C compiler at install, or an sdist without it
        speedups = None

#: True when the compiled core is in use.
COMPILED: bool = speedups is not None


def load_pure(*submodules: str) -> ModuleType:
    """A second, independent copy of the ``tickwheel`` package on the pure-Python path.

    For tests and benchmarks that run both paths side by side in one process
    (as CPython's ``test.support.import_helper.import_fresh_module`` does for
    ``heapq``). Its classes are distinct from the running package's; its
    submodules are attributes of the returned package (``pure.aio``), and
    ``submodules`` names more to import into it (``"tickwheel.pipeline.core"``).
    The running package's modules are left as they were.
    """
    own = {name: mod for name, mod in sys.modules.items() if name.partition(".")[0] == "tickwheel"}
    saved_env = os.environ.get("TICKWHEEL_NO_EXTENSIONS")
    for name in own:
        del sys.modules[name]
    os.environ["TICKWHEEL_NO_EXTENSIONS"] = "1"
    try:
        pure = importlib.import_module("tickwheel")
        for name in ("tickwheel.aio", *submodules):
            importlib.import_module(name)
    finally:
        if saved_env is None:
            del os.environ["TICKWHEEL_NO_EXTENSIONS"]
        else:
            os.environ["TICKWHEEL_NO_EXTENSIONS"] = saved_env
        for name in [name for name in sys.modules if name.partition(".")[0] == "tickwheel"]:
            del sys.modules[name]
        sys.modules.update(own)
    return pure
