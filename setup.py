"""Builds the optional compiled core: tickwheel._speedups and tickwheel.pipeline._loop (Cython).

Everything else about the package is in pyproject.toml. Each extension lists its
Cython sources: the ``.pyx`` as its source, and the ``.pxd`` and ``.pxi`` files it
includes or cimports as ``depends``, which puts them all in the sdist and rebuilds
the extension when one changes. They are cythonized only when the extensions are
built, into the build folder: no generated C lands in the source tree, the sdist
or the wheel. The extensions are built without debug information (and stripped,
on Linux): the wheel ships no symbols nobody reads.

The extensions are optional. When no C compiler works (or TICKWHEEL_NO_EXTENSIONS
is set at build time), the install goes on with the pure-Python path and says so
in one line (``pip install -v`` shows it); when only one extension fails, the
other is kept, and tickwheel runs the pure twin of the missing one (and says so
when imported, see ``tickwheel._accel``).
"""

from __future__ import annotations

import os
import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The declarations every extension compiles against (cimport tickwheel._speedups).
CORE_DECLARATIONS = ["src/tickwheel/_speedups.pxd", *sorted(glob("src/tickwheel/_twins/**/*.pxd", recursive=True))]

EXTENSIONS = [
    Extension(
        "tickwheel._speedups",
        ["src/tickwheel/_speedups.pyx"],
        depends=[*CORE_DECLARATIONS, *sorted(glob("src/tickwheel/_twins/**/*.pxi", recursive=True))],
    ),
    Extension(
        "tickwheel.pipeline._loop", ["src/tickwheel/pipeline/_loop.pyx"], depends=CORE_DECLARATIONS
    ),
]


class OptionalBuildExt(build_ext):
    """build_ext that cythonizes at build time and falls back to pure Python instead of failing."""

    def run(self) -> None:
        if os.environ.get("TICKWHEEL_NO_EXTENSIONS"):
            print(
                "tickwheel: TICKWHEEL_NO_EXTENSIONS is set: pure-Python path only", file=sys.stderr
            )
            self.extensions = []
            return
        try:
            super().run()
        except Exception as exc:  # distutils found no compiler at all
            self.extensions = []
            _say_pure("the compiled core", exc)

    def build_extensions(self) -> None:
        try:
            self._check_compiler()
        except Exception as exc:
            self.extensions = []
            _say_pure("the compiled core", exc)
            return
        self._failed: set[str] = set()
        super().build_extensions()
        # What was not built is neither copied in place nor installed.
        self.extensions = [ext for ext in self.extensions if ext.name not in self._failed]

    def _check_compiler(self) -> None:
        """Compile one empty C file, so that no compiler costs no cythonizing."""
        work = Path(self.build_temp)
        work.mkdir(parents=True, exist_ok=True)
        probe = work / "tickwheel_cc_probe.c"
        probe.write_text("int tickwheel_cc_probe(void) { return 0; }\n")
        self.compiler.compile([str(probe)], output_dir=str(work))

    def build_extension(self, ext: Extension) -> None:
        try:
            from Cython.Build import cythonize

            (cythonized,) = cythonize(
                [ext],
                compiler_directives={"language_level": "3"},
                include_path=["src"],
                build_dir=str(Path(self.build_temp) / "cython"),
                quiet=True,
            )
            ext.sources = cythonized.sources  # the generated C, in the build folder
            if self.compiler.compiler_type == "unix":
                ext.extra_compile_args = [*ext.extra_compile_args, "-g0"]
                if sys.platform.startswith("linux"):
                    ext.extra_link_args = [*ext.extra_link_args, "-s"]
            super().build_extension(ext)
        except Exception as exc:
            self._failed.add(ext.name)
            _say_pure(ext.name, exc)


def _say_pure(what: str, exc: BaseException) -> None:
    detail = " ".join(str(exc).split())
    reason = type(exc).__name__ + (
        f": {detail[:80]}" + ("…" if len(detail) > 80 else "") if detail else ""
    )
    print(
        f"tickwheel: {what} was not built ({reason}); "
        "installing the pure-Python path for it, which works the same, only slower",
        file=sys.stderr,
    )


setup(ext_modules=EXTENSIONS, cmdclass={"build_ext": OptionalBuildExt})
