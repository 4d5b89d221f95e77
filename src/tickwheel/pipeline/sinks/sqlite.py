"""The SQLite database sink: Spark JDBC (Debian's xerial jar) + one SQLite transaction."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..spark.jdbc_drivers import SQLITE_JARS, find_jar
from .base import SinkError
from .credentials import redact_url
from .jdbc import JdbcSink

if TYPE_CHECKING:
    pass


__all__ = [
    "SqliteSink",
]


class SqliteSink(JdbcSink):
    """SQLite database sink: Spark JDBC (Debian's xerial jar) + one SQLite transaction.

    The URL is ``jdbc:sqlite:/path/to/file.db``. DDL and the commit transaction go
    through Python's ``sqlite3`` on the driver (the database is a local file);
    the rows travel through Spark's JDBC writer, one writer at a time (SQLite
    has a single writer lock).
    """

    name = "sqlite"
    dialect = "sqlite"
    driver_class = "org.sqlite.JDBC"

    def __init__(self, url: str, *, prefix: str = "") -> None:
        """Use the SQLite file named by ``url`` (``jdbc:sqlite:PATH``)."""
        if not url.startswith("jdbc:sqlite:"):
            raise SinkError(
                f"a SQLite sink URL looks like jdbc:sqlite:/path/out.db, got {redact_url(url)!r}"
            )
        if find_jar(SQLITE_JARS, "libxerial-sqlite-jdbc-java") is None:
            raise SinkError(
                "the SQLite sink needs Debian's libxerial-sqlite-jdbc-java "
                "(run scripts/system-deps.sh)"
            )
        super().__init__(url, prefix=prefix)
        self.path = url[len("jdbc:sqlite:") :]
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _execute(self, statements: Sequence[str], *, transaction: bool) -> None:
        conn = self._connect()
        try:
            if transaction:
                conn.execute("BEGIN IMMEDIATE")
            for sql in statements:
                conn.execute(sql)
            if transaction:
                conn.execute("COMMIT")
        except BaseException:
            if transaction and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            return list(conn.execute(sql).fetchall())
        finally:
            conn.close()

    def _write_parallelism(self) -> int | None:
        return 1
