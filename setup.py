"""Builds the optional compiled core: tickwheel._speedups and tickwheel.pipeline._loop (Cython).

Everything else about the package is in pyproject.toml. The extension is
optional: when it cannot be built (no C compiler, or TICKWHEEL_NO_EXTENSIONS
set at build time) the install goes on with the pure-Python path and says so
in one line.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: distutils raises before any extension
            _say_pure(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _say_pure(exc)


def _say_pure(exc: BaseException) -> None:
    detail = " ".join(str(exc).split())
    reason = type(exc).__name__ + (
        f": {detail[:80]}" + ("…" if len(detail) > 80 else "") if detail else ""
    )
    print(
        f"tickwheel: the compiled core was not built ({reason}); "
        "installing the pure-Python path, which works the same, only slower",
        file=sys.stderr,
    )


def _extensions() -> list[Extension]:
    if os.environ.get("TICKWHEEL_NO_EXTENSIONS"):
        print("tickwheel: TICKWHEEL_NO_EXTENSIONS is set: pure-Python path only", file=sys.stderr)
        return []
    from Cython.Build import cythonize

    return cythonize(
        [
            Extension("tickwheel._speedups", ["src/tickwheel/_speedups.pyx"]),
            Extension("tickwheel.pipeline._loop", ["src/tickwheel/pipeline/_loop.pyx"]),
        ],
        compiler_directives={"language_level": "3"},
        include_path=["src"],  # _loop cimports tickwheel/_speedups.pxd
        quiet=True,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
