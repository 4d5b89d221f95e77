"""A class-data archive of the JVM classes a pipeline job loads, for fast cold starts.

A fresh JVM spends most of a short job loading classes: Spark, Catalyst and
their libraries are about 15,000 classes read from jars, parsed and verified
one by one. HotSpot can save the classes a run loaded in an archive
(AppCDS, ``-XX:ArchiveClassesAtExit``) and map it at the next start
(``-XX:SharedArchiveFile``), already parsed and verified: Spark starts
sooner, and the first stages run sooner too (``docs/benchmarks.md``, "Cold
start").

The archive belongs to one JVM and one set of Spark jars: its name carries a
fingerprint of both (:func:`fingerprint`), and a JVM started with
``-Xshare:auto`` ignores an archive whose jars changed. It also needs the
class path it was recorded with: the stream puts the installed JDBC jars
first on the driver's class path (``jdbc_drivers.spark_jdbc_conf``), so every JVM
that uses the archive, and the one that records it, starts with those jars
first (:func:`session_conf`). A *damaged* archive is worse: a truncated one
makes the JVM abort at start. So :func:`tickwheel.pipeline.prepare.build`
records the archive under a temporary name in a child process, waits for
that JVM to exit (it writes the archive as it exits), checks the
result by starting a Spark session on it with ``-Xshare:on`` (which fails
instead of ignoring), and only then renames it into place. A run uses an
archive only under its final name (:func:`find`).

``tickwheel pipeline prepare`` builds it (:mod:`tickwheel.pipeline.prepare`;
``make demo`` runs it);
``TICKWHEEL_CLASS_ARCHIVE=off`` turns its use off. It lives in
``TICKWHEEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tickwheel``, else
``~/.cache/tickwheel``, and takes about 180 MB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "ARCHIVE_ENV",
    "ArchiveError",
    "cache_dir",
    "find",
    "fingerprint",
    "java_options",
    "session_conf",
    "startup_note",
]

ARCHIVE_ENV = "TICKWHEEL_CLASS_ARCHIVE"
CACHE_ENV = "TICKWHEEL_CACHE_DIR"


class ArchiveError(RuntimeError):
    """The archive could not be recorded or did not pass its check."""


def cache_dir() -> Path:
    """Where archives live (see the module doc). O(1)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tickwheel"


def _java_executable() -> str | None:
    """The ``java`` Spark's launcher starts: ``$JAVA_HOME/bin/java``, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _spark_jars() -> Path:
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    return Path(home) / "jars"


def _driver_classpath() -> list[str]:
    """The jars before Spark's on an archived JVM's class path: the installed JDBC jars."""
    from .jdbc_drivers import jdbc_jars

    return jdbc_jars()


def fingerprint(
    java: str | None = None, jars: Path | None = None, classpath: Sequence[str] | None = None
) -> str | None:
    """A digest of the JVM binary, every Spark jar and the class path's first jars
    (path, size, mtime). O(jars).

    None when there is no ``java``. Any change to them gives another digest,
    so an archive is never offered to a JVM, a Spark or a class path it was
    not made with.
    """
    java = java if java is not None else _java_executable()
    if java is None:
        return None
    jars = jars if jars is not None else _spark_jars()
    first = classpath if classpath is not None else _driver_classpath()
    digest = hashlib.sha256()
    for path in [Path(java), *map(Path, first), *sorted(jars.glob("*.jar"))]:
        stat = path.stat()
        digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def archive_path(digest: str) -> Path:
    """The final name of the archive for ``digest``. O(1)."""
    return cache_dir() / f"spark-classes-{digest}.jsa"


def find() -> Path | None:
    """The checked archive for this JVM and Spark, or None (absent, or turned off). O(jars)."""
    if os.environ.get(ARCHIVE_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    digest = fingerprint()
    if digest is None:
        return None
    path = archive_path(digest)
    return path if path.is_file() else None


def startup_note(master: str) -> tuple[Path | None, str]:
    """The archive a run on ``master`` starts its JVM on, and the words saying so. O(jars).

    Only a local master's JVM is this machine's; for another, (None, "").
    """
    if not master.startswith("local"):
        return None, ""
    archive = find()
    if archive is not None:
        return archive, "class archive"
    return None, "no class archive: see `tickwheel pipeline prepare`"


def session_conf() -> dict[str, str]:
    """The Spark settings an archived JVM starts with: its class path's first jars,
    the driver class path of :func:`~.jdbc_drivers.spark_jdbc_conf`. O(1)."""
    from .jdbc_drivers import spark_jdbc_conf

    name = "spark.driver.extraClassPath"
    return {name: value} if (value := spark_jdbc_conf().get(name)) else {}


def java_options(archive: str | os.PathLike[str] | None) -> list[str]:
    """The JVM options that map ``archive``; none for None. O(1).

    ``-Xshare:auto``: should the jars change after the check, the JVM starts
    without the archive instead of failing.
    """
    if archive is None:
        return []
    return [f"-XX:SharedArchiveFile={os.fspath(archive)}", "-Xshare:auto"]
