"""Builds the benchmarks' compiled floors (``_floors.pyx``) in place, beside the scripts.

``make bench`` runs it; by hand::

    python benchmarks/setup_floors.py

The floors ``cimport`` the compiled core's declarations (``src/tickwheel/_speedups.pxd``)
and import ``tickwheel._speedups`` when loaded, so build them with the interpreter that
has tickwheel installed with its compiled core, after each rebuild of that core. The
generated C and the objects go to ``build/floors``; only the extension lands here. Run
again, it rebuilds only what changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "build" / "floors"


def main() -> None:
    os.chdir(HERE)  # build_ext --inplace puts a top-level module in the current folder
    extensions = cythonize(
        [Extension("_floors", ["_floors.pyx"])],
        include_path=[str(ROOT / "src")],
        build_dir=str(BUILD),
        compiler_directives={"language_level": "3"},
    )
    setup(
        name="tickwheel-benchmark-floors",
        ext_modules=extensions,
        script_args=[
            *("--quiet", "build_ext", "--inplace"),
            *("--build-temp", str(BUILD), "--build-lib", str(BUILD / "lib")),
        ],
    )


if __name__ == "__main__":
    main()
