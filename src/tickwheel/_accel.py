"""Which implementation runs: the compiled core or the pure-Python reference.

``tickwheel._speedups`` (Cython, built at install when a C compiler is
present) holds the compiled twins of the hot classes: the task list and its
entries, ``TimerTask``, ``TimingWheel``, the bucket delay queue, ``TimerCore``
and its ``Lock``, the hot halves of ``SystemTimer``, the purgatory and
``AsyncTimer``, and the drop-in loop's ``call_later``/``call_at``;
``tickwheel.pipeline._loop``, built with it, the per-partition loop's. Each
pure module defines its reference classes, then takes the twins from here when
they are in use, as CPython's ``heapq.py`` ends with ``from _heapq import *``.

Setting ``TICKWHEEL_NO_EXTENSIONS`` to a non-empty value before the first
import forces the pure path (as aiohttp's ``AIOHTTP_NO_EXTENSIONS`` does).

The two extensions are built separately, so one can be missing: a build that
failed for one of them, or an extension that is there but cannot be loaded.
Then whatever depends on the missing one runs on the pure path, and a
``RuntimeWarning`` says so once. An install without any extension (no C
compiler; its install said so) runs pure Python silently.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import warnings
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED", "compiled", "speedups"]

_SPEEDUPS = "tickwheel._speedups"

#: Each compiled module, and what runs on the pure path without it.
EXTENSIONS = {
    _SPEEDUPS: "the timers, the purgatory and the asyncio timer",
    "tickwheel.pipeline._loop": "the pipeline's per-partition loop",
}

_FORCED_PURE = bool(os.environ.get("TICKWHEEL_NO_EXTENSIONS"))
_loaded: dict[str, ModuleType | None] = {}


def compiled(name: str) -> ModuleType | None:
    """The compiled module ``name`` (a key of :data:`EXTENSIONS`), or None for the pure path.

    None when ``TICKWHEEL_NO_EXTENSIONS`` is set, when the module was not built,
    or when it needs ``tickwheel._speedups`` and that is not in use. A missing
    module while another was built, or one that fails to load, is a partial
    build: a ``RuntimeWarning`` names it, once. O(1) after the first call.
    """
    if name not in _loaded:
        _loaded[name] = None if _FORCED_PURE else _load(name)
    return _loaded[name]


def _load(name: str) -> ModuleType | None:
    if name != _SPEEDUPS and compiled(_SPEEDUPS) is None:
        return None  # every other twin runs on the compiled TimerCore (it cimports it)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            _warn_pure(name, exc)
        elif name != _SPEEDUPS or any(_built(other) for other in EXTENSIONS if other != name):
            _warn_pure(name, "not built")
        return None
    except ImportError as exc:  # built, but it cannot be loaded here
        _warn_pure(name, exc)
        return None


def _built(name: str) -> bool:
    """True when the compiled module's file is installed (without importing it)."""
    *folders, leaf = name.split(".")[1:]
    where = Path(__file__).parent.joinpath(*folders)
    return any(
        (where / (leaf + suffix)).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _warn_pure(name: str, reason: object) -> None:
    if isinstance(reason, BaseException):
        reason = f"{type(reason).__name__}: {reason}"
    warnings.warn(
        f"tickwheel: {name} is not in use ({reason}), so the pure-Python path runs "
        f"{EXTENSIONS[name]}: the same behaviour, only slower. Reinstall tickwheel where a C "
        "compiler works to build it, or set TICKWHEEL_NO_EXTENSIONS=1 to choose pure Python.",
        RuntimeWarning,
        stacklevel=1,
    )


#: ``tickwheel._speedups`` when the compiled core is in use, else None.
speedups: ModuleType | None = compiled(_SPEEDUPS)

#: True when the compiled core is in use.
COMPILED: bool = speedups is not None
