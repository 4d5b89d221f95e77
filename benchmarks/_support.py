"""What the benchmark scripts share: the pure path beside the installed one, and the floors.

* ``load_pure`` is the tests' (``tests/support/paths.py``, as CPython keeps
  ``import_fresh_module`` in ``test.support``): this module puts ``tests/`` on
  the path to import it.
* ``compiled_floors()`` is the compiled floors' module (``_floors.pyx``, built
  by ``make bench``), or None when the core is not compiled or the floors are
  not built: then the scripts leave out their ``floor-c`` rows, and it says
  how to build them.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import tickwheel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.paths import load_pure

__all__ = ["compiled_floors", "load_pure"]


def compiled_floors() -> ModuleType | None:
    """The compiled floors (``FloorTimer``, ``AsyncFloorTimer``, ``DropInFloor``), or None."""
    if not tickwheel.COMPILED:
        return None
    try:
        return importlib.import_module("_floors")
    except ModuleNotFoundError as exc:
        if exc.name != "_floors":
            raise
        print(
            "note: the compiled floors are not built, so there is no floor-c row: "
            "`make bench` builds them (or: python benchmarks/setup_floors.py)",
            file=sys.stderr,
        )
        return None
