"""A class-data archive of the JVM classes a pipeline job loads, for fast cold starts.

A fresh JVM spends most of a short job loading classes: Spark, Catalyst and
their libraries are about 15,000 classes read from jars, parsed and verified
one by one. HotSpot can save the classes a run loaded in an archive
(AppCDS, ``-XX:ArchiveClassesAtExit``) and map it at the next start
(``-XX:SharedArchiveFile``), already parsed and verified: Spark starts
about 2 s sooner, and the first stages run sooner too (figures in
``docs/benchmarks.md``, "Cold start").

The archive belongs to one JVM and one set of Spark jars: its name carries a
fingerprint of both (:func:`fingerprint`), and a JVM started with
``-Xshare:auto`` ignores an archive whose jars changed. It also needs the
class path it was recorded with: the stream puts the installed JDBC jars
first on the driver's class path (``sinks.spark_jdbc_conf``), so every JVM
that uses the archive, and the one that records it, starts with those jars
first (:func:`session_conf`). A
*damaged* archive is worse: a truncated one makes the JVM abort at start. So
:func:`build` records the archive under a temporary name in a child process,
waits for that JVM to exit (it writes the archive as it exits), checks the
result by starting a Spark session on it with ``-Xshare:on`` (which fails
instead of ignoring), and only then renames it into place. A run uses an
archive only under its final name (:func:`find`).

``tickwheel pipeline prepare`` builds it (``make demo`` runs it);
``TICKWHEEL_CLASS_ARCHIVE=off`` turns its use off. It lives in
``TICKWHEEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/tickwheel``, else
``~/.cache/tickwheel``, and takes about 180 MB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "ARCHIVE_ENV",
    "ArchiveError",
    "build",
    "cache_dir",
    "find",
    "fingerprint",
    "java_options",
    "session_conf",
    "startup_note",
]

ARCHIVE_ENV = "TICKWHEEL_CLASS_ARCHIVE"
CACHE_ENV = "TICKWHEEL_CACHE_DIR"
#: Orders the recording run processes: enough to load every class a batch run loads.
RECORD_ORDERS = 2_000
#: Each child (record, check) is one short Spark run; this bounds a stuck one.
CHILD_TIMEOUT_S = 300


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
    from .sinks import jdbc_jars

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
    the driver class path of :func:`~.sinks.spark_jdbc_conf`. O(1)."""
    from .sinks import spark_jdbc_conf

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


def build(force: bool = False, say: Callable[[str], None] = print) -> Path:
    """Record, check and install the archive for this JVM and Spark; return its path.

    Does nothing when it is there already (unless ``force``). Raises
    :class:`ArchiveError` when there is no ``java`` or a step fails; nothing is
    left under the final name then. Cost: two short Spark runs in child
    processes, about half a minute.
    """
    digest = fingerprint()
    if digest is None:
        raise ArchiveError("no java: set JAVA_HOME or put java on the PATH")
    final = archive_path(digest)
    if final.is_file() and not force:
        say(f"class archive: {final} (already there)")
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArchiveError(
            f"cannot make the cache directory {final.parent}: {exc.strerror or exc}"
            f" (set {CACHE_ENV} to another directory)"
        ) from None
    temporary = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        say("class archive: recording the classes of a short batch run ...")
        _child(["record", str(temporary)], "recording")
        if not temporary.is_file():
            raise ArchiveError("recording: the JVM exited without writing the archive")
        say("class archive: checking it ...")
        _child(["check", str(temporary)], "checking")
        os.replace(temporary, final)
    except OSError as exc:
        raise ArchiveError(f"cannot install {final}: {exc.strerror or exc}") from None
    finally:
        temporary.unlink(missing_ok=True)
    say(f"class archive: {final} ({final.stat().st_size / 2**20:,.0f} MB)")
    others = [p for p in final.parent.glob("spark-classes-*.jsa") if p != final]
    if others:  # another Java, Spark or class path: kept, as it may still be in use
        size = sum(p.stat().st_size for p in others) / 2**20
        say(
            f"class archive: {len(others)} other archive(s) in {final.parent} ({size:,.0f} MB),"
            " made for another java, Spark or JDBC jars: delete those no longer installed"
        )
    return final


def _child(args: Sequence[str], step: str) -> None:
    command = [sys.executable, "-m", "tickwheel.pipeline._class_archive", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ArchiveError(f"{step}: no result after {CHILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ArchiveError(f"{step} failed (exit {done.returncode}): {tail}")


def _stop_jvm(spark: object) -> None:
    """Stop the session, then the JVM, and wait for it: it writes the archive as it exits."""
    from pyspark import SparkContext

    spark.stop()  # type: ignore[attr-defined]
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway exits when its stdin closes
        proc.wait(timeout=CHILD_TIMEOUT_S)


def _record(archive: str) -> None:
    """Child: one short batch run on a fresh JVM that archives its classes at exit."""
    from .generate import generate_orders
    from .rules import parse_rules
    from .spark_job import QUICK_JIT_OPTIONS, create_session, run_job

    with tempfile.TemporaryDirectory(prefix="tickwheel-archive-") as work:
        generate_orders(RECORD_ORDERS, Path(work) / "in", seed=1)
        options = f"{QUICK_JIT_OPTIONS} -XX:ArchiveClassesAtExit={archive}"
        spark = create_session(conf={**session_conf(), "spark.driver.extraJavaOptions": options})
        run_job(spark, parse_rules(_RULES), str(Path(work) / "in"), str(Path(work) / "out"))
        _stop_jvm(spark)


def _check(archive: str) -> None:
    """Child: a Spark session on the archive with ``-Xshare:on``, which fails if unusable."""
    from .spark_job import create_session

    options = f"-XX:SharedArchiveFile={archive} -Xshare:on"
    spark = create_session(conf={**session_conf(), "spark.driver.extraJavaOptions": options})
    if spark.range(100).selectExpr("sum(id)").collect()[0][0] != 4950:
        raise SystemExit("check: wrong answer from Spark")
    _stop_jvm(spark)


#: The rules of ``examples/orders.toml`` (which an installed package does not
#: have), as :func:`~.rules.parse_rules` takes them.
_RULES = {
    "input": {"key": "order_id", "type": "type", "time": "ts", "id": "event_id",
              "sequence": "seq", "format": "json"},
    "rules": {"payment": {"open": ["created"], "complete": ["paid"], "cancel": ["cancelled"],
                          "timeout": "30m"}},
}  # fmt: skip


if __name__ == "__main__":
    step, path = sys.argv[1:3]
    {"record": _record, "check": _check}[step](path)
