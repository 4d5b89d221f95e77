"""``tickwheel pipeline prepare``: record, check and install the JVM's class-data archive.

What the archive is, where it lives and how runs find it is in
:mod:`tickwheel.pipeline.spark.class_archive`. Recording needs a batch run on a
fresh JVM, so it is done here, in child processes (``python -m
tickwheel.pipeline.prepare record|check PATH``), above both the session set-up
and the batch driver.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .spark.class_archive import (
    CACHE_ENV,
    ArchiveError,
    archive_path,
    fingerprint,
    session_conf,
)

__all__ = ["build"]

logger = logging.getLogger(__name__)

#: Orders the recording run processes: enough to load every class a batch run loads.
RECORD_ORDERS = 2_000
#: Each child (record, check) is one short Spark run; this bounds a stuck one.
CHILD_TIMEOUT_S = 300


def build(force: bool = False, say: Callable[[str], None] | None = None) -> Path:
    """Record, check and install the archive for this JVM and Spark; return its path.

    Each step's line goes to ``say``, by default this module's logger at INFO.

    Does nothing when it is there already (unless ``force``). Raises
    :class:`ArchiveError` when there is no ``java`` or a step fails; nothing is
    left under the final name then. Cost: two short Spark runs in child
    processes, about half a minute.
    """
    if say is None:
        say = logger.info
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
    command = [sys.executable, "-m", "tickwheel.pipeline.prepare", *args]
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
    from .batch import run_job
    from .generate import generate_orders
    from .rules import parse_rules
    from .spark.session import QUICK_JIT_OPTIONS, create_session

    with tempfile.TemporaryDirectory(prefix="tickwheel-archive-") as work:
        generate_orders(RECORD_ORDERS, Path(work) / "in", seed=1)
        options = f"{QUICK_JIT_OPTIONS} -XX:ArchiveClassesAtExit={archive}"
        spark = create_session(conf={**session_conf(), "spark.driver.extraJavaOptions": options})
        run_job(spark, parse_rules(_RULES), str(Path(work) / "in"), str(Path(work) / "out"))
        _stop_jvm(spark)


def _check(archive: str) -> None:
    """Child: a Spark session on the archive with ``-Xshare:on``, which fails if unusable."""
    from .spark.session import create_session

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
