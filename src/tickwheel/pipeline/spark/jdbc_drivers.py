"""The JDBC drivers' jars that Spark loads: Debian's SQLite and PostgreSQL jars, and the
session settings that put them on the driver's and executors' class paths (the sinks
write through them; the class archive records them)."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["POSTGRES_JARS", "SQLITE_JARS", "find_jar", "jdbc_jars", "spark_jdbc_conf"]

_JAR_DIR = "/usr/share/java"
SQLITE_JARS = ("sqlite-jdbc.jar", "xerial-sqlite-jdbc.jar")
POSTGRES_JARS = ("postgresql.jar",)
_JNI_DIRS = ("/usr/lib/x86_64-linux-gnu/jni", "/usr/lib/aarch64-linux-gnu/jni", "/usr/lib/jni")


def find_jar(names: Sequence[str], package: str) -> str | None:
    """The first of the jars ``names`` installed by Debian's ``package``, or None. O(names)."""
    for name in names:
        path = os.path.join(_JAR_DIR, name)
        if os.path.exists(path):
            return path
    return None


def jdbc_jars() -> list[str]:
    """Return the Debian JDBC driver jars that are installed (SQLite, PostgreSQL). O(1)."""
    jars = []
    for names, package in (
        (SQLITE_JARS, "libxerial-sqlite-jdbc-java"),
        (POSTGRES_JARS, "libpostgresql-jdbc-java"),
    ):
        jar = find_jar(names, package)
        if jar is not None:
            jars.append(jar)
    return jars


def spark_jdbc_conf() -> dict[str, str]:
    """Spark settings that put the installed JDBC jars on the driver and executors.

    They must be given before the SparkSession starts (``builder.config(k, v)``).
    The driver class path matters: Spark's JDBC reader and writer connect from
    the driver JVM too (to resolve a table's schema, to check that it exists),
    and the class archive records it (:func:`~tickwheel.pipeline.spark.class_archive.session_conf`);
    the sinks' own DDL and commits do not use the JVM. The SQLite jar's native
    half lives in Debian's JNI directory, which is added to
    ``java.library.path``. O(1).
    """
    jars = jdbc_jars()
    if not jars:
        return {}
    jni = [d for d in _JNI_DIRS if os.path.isdir(d)]
    conf = {
        "spark.jars": ",".join(jars),
        "spark.driver.extraClassPath": os.pathsep.join(jars),
        "spark.executor.extraClassPath": os.pathsep.join(jars),
    }
    if jni:
        lib = os.pathsep.join(jni)
        conf["spark.driver.extraLibraryPath"] = lib
        conf["spark.executor.extraLibraryPath"] = lib
    return conf
