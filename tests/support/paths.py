"""The pure-Python path beside the installed one, in one process: ``load_pure``.

The tests (``test_paths_agree.py``, ``test_purgatory_paths_agree.py``) and the
benchmarks (through ``benchmarks/_support.py``) drive both paths side by side
with it, as CPython's tests load ``heapq.py`` beside ``_heapq`` with
``test.support.import_helper.import_fresh_module``; like that helper, it is not
part of the package.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType


def load_pure(*submodules: str) -> ModuleType:
    """A second, independent copy of the ``tickwheel`` package on the pure-Python path.

    Its classes are distinct from the running package's; its submodules are
    attributes of the returned package (``pure.aio``), and ``submodules`` names
    more to import into it (``"tickwheel.pipeline.core"``). The running
    package's modules are left as they were. O(the package's import time).
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
