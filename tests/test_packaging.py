"""The package installs from every form it is published in: the sdist and the wheel.

``python -m build`` makes both, the wheel from the sdist, with this interpreter's
own build tools (the dev extra pins them; ``--no-isolation``, so nothing is
downloaded). Each install goes into a fresh virtual environment from the file
alone (``pip --no-index --no-deps``: the library needs nothing else):

* the wheel, built where a C compiler works: the compiled core, no warning,
  and ``tickwheel trace`` runs;
* the sdist built with ``CC=false``, a compiler that always fails (``pip wheel``
  of the sdist, then the install of that wheel: what ``pip install`` of an sdist
  does): the pure path, said in one line by the build, and nothing at import.

The files themselves are checked too: the sdist carries the Cython sources and
declarations and no generated C; the wheel carries the package's modules, its
extensions (without debug information or symbols) and ``py.typed``, nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tickwheel"

#: Each build or install step's bound, in seconds (a full build compiles the core).
STEP_TIMEOUT_S = 600

#: The check run in each fresh environment: which path, and no warning at import.
IMPORT_CHECK = (
    "import tickwheel, tickwheel.pipeline.core as core; "
    "print(tickwheel.COMPILED, core.PartitionProcessor.__mro__[1].__module__)"
)


def _env(**extra: str) -> dict[str, str]:
    """This environment without what would steer the build or the imports."""
    env = {k: v for k, v in os.environ.items() if k not in ("TICKWHEEL_NO_EXTENSIONS", "CC")}
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


def _run(*cmd: str | Path, cwd: Path | None = None, **env: str) -> str:
    done = subprocess.run(
        [str(part) for part in cmd],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        check=False,
        cwd=cwd,
        env=_env(**env),
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT)
    return out


def _one(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def _fresh_install(where: Path, wheel: Path) -> Path:
    """A new virtual environment with ``wheel`` installed from the file alone; its bin/."""
    _run(sys.executable, "-m", "venv", "--without-pip", where)
    python = where / "bin" / "python"
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", wheel
    )
    return where / "bin"


def _sections(shared_object: bytes) -> Iterator[bytes]:
    """The ELF section names of a shared object (64-bit, little-endian)."""
    assert shared_object[:4] == b"\x7fELF" and shared_object[4] == 2 and shared_object[5] == 1
    shoff = int.from_bytes(shared_object[0x28:0x30], "little")
    shentsize, shnum, shstrndx = (
        int.from_bytes(shared_object[at : at + 2], "little") for at in (0x3A, 0x3C, 0x3E)
    )
    headers = [
        shared_object[shoff + i * shentsize : shoff + (i + 1) * shentsize] for i in range(shnum)
    ]
    names_at = int.from_bytes(headers[shstrndx][0x18:0x20], "little")
    for header in headers:
        start = names_at + int.from_bytes(header[:4], "little")
        yield shared_object[start : shared_object.index(b"\0", start)]


def test_the_sdist_carries_the_cython_sources_and_no_generated_c(dist: Path) -> None:
    with tarfile.open(_one(dist, "tickwheel-*.tar.gz")) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    cython_sources = {
        str(path.relative_to(ROOT))
        for pattern in ("**/*.pyx", "**/*.pxd", "**/*.pxi")
        for path in SRC.glob(pattern)
    }
    assert "src/tickwheel/_speedups.pyx" in cython_sources
    assert cython_sources <= names
    assert {"setup.py", "pyproject.toml", "README.md"} <= names
    assert not [name for name in names if name.endswith((".c", ".so", ".html"))]


def test_the_wheel_holds_the_package_and_stripped_extensions_only(dist: Path) -> None:
    with zipfile.ZipFile(_one(dist, "tickwheel-*.whl")) as wheel:
        names = wheel.namelist()
        extensions = {name: wheel.read(name) for name in names if name.endswith(".so")}
    package = [name for name in names if not name.startswith("tickwheel-0.1.0.dist-info/")]
    assert all(name.startswith("tickwheel/") for name in package)
    assert {Path(name).suffix for name in package} == {".py", ".so", ".typed"}
    assert not [name for name in package if "test" in name or "bench" in name or "floor" in name]
    assert sorted(name.split(".")[0] for name in extensions) == [
        "tickwheel/_speedups",
        "tickwheel/pipeline/_loop",
    ]
    for name, data in extensions.items():
        sections = set(_sections(data))
        assert not {s for s in sections if s.startswith(b".debug")}, name
        assert b".symtab" not in sections, name  # stripped: only the dynamic symbols remain


def test_the_wheel_installs_compiled_and_runs(dist: Path, tmp_path: Path) -> None:
    bin_dir = _fresh_install(tmp_path / "venv", _one(dist, "tickwheel-*.whl"))
    out = _run(bin_dir / "python", "-W", "error", "-c", IMPORT_CHECK, cwd=tmp_path)
    assert out.split() == ["True", "tickwheel.pipeline._loop"]
    trace = _run(bin_dir / "tickwheel", "trace", cwd=tmp_path)
    assert "bucket" in trace


def test_the_sdist_without_a_compiler_installs_pure_and_says_so(dist: Path, tmp_path: Path) -> None:
    built = tmp_path / "wheel"
    log = _run(
        *(sys.executable, "-m", "pip", "wheel", "-v", "--no-index", "--no-deps"),
        *("--no-build-isolation", "--wheel-dir", built, _one(dist, "tickwheel-*.tar.gz")),
        CC="false",
    )
    said = [line for line in log.splitlines() if line.lstrip().startswith("tickwheel: ")]
    assert len(said) == 1, said
    assert "the compiled core was not built" in said[0]
    assert "installing the pure-Python path" in said[0]
    bin_dir = _fresh_install(tmp_path / "venv", _one(built, "tickwheel-*.whl"))
    out = _run(bin_dir / "python", "-W", "error", "-c", IMPORT_CHECK, cwd=tmp_path)
    assert out.split() == ["False", "tickwheel.pipeline.core"]
    assert "bucket" in _run(bin_dir / "tickwheel", "trace", cwd=tmp_path)
