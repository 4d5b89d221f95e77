"""Which implementation runs: the compiled core or the pure-Python reference.

``tickwheel._speedups`` (Cython, built at install when a C compiler is
present) holds compiled twins of the hot classes: the task list and its
entries, ``TimerTask``, ``TimingWheel``, the bucket delay queue, ``TimerCore``,
and the hot halves of ``SystemTimer`` and ``AsyncTimer``. Each pure module
defines its reference classes, then takes the twins from here when they are
in use, as CPython's ``heapq.py`` ends with ``from _heapq import *``.

Setting ``TICKWHEEL_NO_EXTENSIONS`` to a non-empty value before the first
import forces the pure path (as aiohttp's ``AIOHTTP_NO_EXTENSIONS`` does).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["COMPILED", "speedups"]

speedups: ModuleType | None = None
if not os.environ.get("TICKWHEEL_NO_EXTENSIONS"):
    try:
        speedups = importlib.import_module("tickwheel._speedups")
    except ImportError:  # not built: no C compiler at install, or an sdist without it
        speedups = None

#: True when the compiled core is in use.
COMPILED: bool = speedups is not None
