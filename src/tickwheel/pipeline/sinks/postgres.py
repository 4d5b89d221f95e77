"""The PostgreSQL sink: Spark JDBC into staging tables, then ONE pg8000 transaction per
batch; and the pg8000 connection made from a pgjdbc URL (hosts, timeouts, SSL)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..spark.jdbc_drivers import POSTGRES_JARS, find_jar
from .base import SinkError
from .credentials import (
    PG_PREFIX,
    SECRET_PARAM,
    host_port,
    postgres_credentials,
    redact_url,
    split_pg_url,
)
from .jdbc import BATCHES_TABLE, JdbcSink, quote_identifier

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


__all__ = [
    "PostgresSink",
]

_PG8000_MISSING = "the PostgreSQL sink needs pg8000: pip install 'tickwheel[spark]'"
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: pgjdbc's SSL parameters that the commit's connection honours (or may ignore, the
#: last one); any other ``ssl*`` one, and ``gssEncMode=require``, is refused, so that
#: the commit's connection is never less protected than the URL asks.
_SSL_PARAMS = frozenset(
    {"ssl", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslfactory", "sslresponsetimeout"}
)
_NON_VALIDATING = "org.postgresql.ssl.NonValidatingFactory"


def _pg8000_dbapi() -> Any:
    """The ``pg8000.dbapi`` module, or a :class:`SinkError` saying how to install it. O(1)."""
    try:
        import pg8000.dbapi  # type: ignore[import-untyped]
    except ImportError as exc:
        raise SinkError(_PG8000_MISSING) from exc
    return pg8000.dbapi


@dataclass(frozen=True)
class _PgTarget:
    """What pg8000 needs from a pgjdbc URL (no secret): its hosts in pgjdbc's order,
    the database, the timeouts in seconds (None: none), the SSL mode and files,
    and the startup parameters (``search_path``, ``options``, ``application_name``)."""

    hosts: tuple[tuple[str, int], ...]
    database: str | None
    connect_timeout: float | None
    socket_timeout: float | None
    ssl_mode: str
    ssl_files: Mapping[str, str]
    startup: Mapping[str, str]


def _pg_target(url: str) -> _PgTarget:
    """Read a secret-free pgjdbc URL as pg8000 will use it. O(len(url)).

    The parameters that change where, how securely or in which schema the
    statements run are mapped as pgjdbc reads them: ``sslmode`` (else ``ssl``:
    ``verify-full`` when true, else ``prefer``), ``sslrootcert``, ``sslcert``,
    ``sslkey``, ``sslfactory=org.postgresql.ssl.NonValidatingFactory``,
    ``connectTimeout`` (default 10 s, 0 for none), ``socketTimeout`` (default
    none), ``currentSchema``, ``options`` and ``ApplicationName``; an SSL
    parameter pg8000 cannot honour is a :class:`SinkError`. The others tune
    pgjdbc (Spark's JDBC writer and reader) and are ignored here.
    """
    _, _, _, database, raw = split_pg_url(url)
    params = {name.lower(): value for name, value in raw.items()}
    rest = url[len(PG_PREFIX) :].partition("?")[0]
    hosts = ["localhost:5432"]
    if rest.startswith("//"):
        hosts = rest[2:].partition("/")[0].rpartition("@")[2].split(",")
    targets = []
    for text in hosts:
        host, port = host_port(text)
        if not port.isdigit():
            raise SinkError(f"bad port {port!r} in the PostgreSQL URL {redact_url(url)!r}")
        targets.append((host, int(port)))
    unsupported = sorted(
        name
        for name in params
        if name.startswith("ssl") and name not in _SSL_PARAMS and not SECRET_PARAM.search(name)
    )
    factory = params.get("sslfactory")
    if factory is not None and factory != _NON_VALIDATING:
        unsupported.append(f"sslfactory={factory}")
    if params.get("gssencmode", "").lower() == "require":
        unsupported.append("gssEncMode=require")
    if unsupported:
        raise SinkError(
            f"the PostgreSQL sink's commit connection (pg8000) cannot honour "
            f"{', '.join(unsupported)} in {redact_url(url)!r}"
        )
    mode = params.get("sslmode")
    if mode is None:
        ssl = params.get("ssl")
        mode = "verify-full" if ssl is not None and ssl.lower() in ("", "true") else "prefer"
    if mode not in _SSL_MODES:
        raise SinkError(f"unknown sslmode={mode} in the PostgreSQL URL {redact_url(url)!r}")
    if factory == _NON_VALIDATING and mode in ("verify-ca", "verify-full"):
        mode = "require"  # encrypted, the certificate not checked (pgjdbc's NonValidatingFactory)
    if "sslcert" in params and mode in ("disable", "allow", "prefer"):
        raise SinkError(
            f"sslcert needs sslmode=require, verify-ca or verify-full: {redact_url(url)!r}"
        )
    startup = {
        name: params[key]
        for name, key in (
            ("search_path", "currentschema"),
            ("options", "options"),
            ("application_name", "applicationname"),
        )
        if params.get(key)
    }
    return _PgTarget(
        hosts=tuple(targets),
        database=database,
        connect_timeout=_seconds(params.get("connecttimeout", "10"), "connectTimeout", url),
        socket_timeout=_seconds(params.get("sockettimeout", "0"), "socketTimeout", url),
        ssl_mode=mode,
        ssl_files={k: params[k] for k in ("sslrootcert", "sslcert", "sslkey") if k in params},
        startup=startup,
    )


def _seconds(text: str, name: str, url: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        raise SinkError(f"{name}={text} is not a number of seconds: {redact_url(url)!r}") from None
    return seconds if seconds > 0 else None


def _pg_ssl_context(target: _PgTarget, sslpassword: str | None) -> Any:
    """pg8000's ``ssl_context`` for ``target``: False (disable), None (try SSL
    without checking the certificate, else plain: allow and prefer) or an
    :class:`ssl.SSLContext` that requires SSL. ``verify-ca``/``verify-full``
    check the server's certificate against ``sslrootcert``, else
    ``~/.postgresql/root.crt`` (pgjdbc's default) when it exists, else the
    system's CAs; ``verify-full`` also checks its host name. O(certificate files).
    """
    import ssl

    mode = target.ssl_mode
    if mode == "disable":
        return False
    if mode in ("allow", "prefer"):
        return None
    context = ssl.create_default_context()
    if mode in ("verify-ca", "verify-full"):
        root = target.ssl_files.get("sslrootcert") or os.path.expanduser("~/.postgresql/root.crt")
        if "sslrootcert" in target.ssl_files or os.path.exists(root):
            context.load_verify_locations(cafile=root)
        context.check_hostname = mode == "verify-full"
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if "sslcert" in target.ssl_files:
        context.load_cert_chain(
            target.ssl_files["sslcert"], target.ssl_files.get("sslkey"), password=sslpassword
        )
    return context


def _pg_socket(target: _PgTarget) -> tuple[Any, str]:
    """(a TCP socket, its host name) to the first of ``target``'s hosts that accepts,
    tried in order as pgjdbc does; the socket's timeout is then the socket timeout.
    Raises the last host's OSError, noted with its ``host:port``."""
    import socket

    failure: OSError | None = None
    for host, port in target.hosts:
        try:
            sock = socket.create_connection((host, port), timeout=target.connect_timeout)
        except OSError as exc:
            exc.add_note(f"{host}:{port}")
            failure = exc
            continue
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(target.socket_timeout)
        return sock, host
    assert failure is not None
    raise failure


def _pg_failure(exc: BaseException, password: bool) -> str:
    """The cause of a failed connection in a few words (no secret is in any of them)."""
    details = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else None
    if details is not None:  # a PostgreSQL error response: message and SQLSTATE
        return f"{details.get('M', 'error')} (SQLSTATE {details.get('C', '?')})"
    if not password and (isinstance(exc, AttributeError) or "password" in str(exc)):
        # pg8000 asked for one (md5, cleartext), or failed on the missing one (SCRAM)
        return (
            "the server asks for a password, and none was found "
            "(not in the URL, PGPASSWORD or the password file)"
        )
    text = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    where = "".join(f"{note}: " for note in getattr(exc, "__notes__", ()))
    return f"{where}{text or type(exc).__name__}"


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()


class PostgresSink(JdbcSink):
    """PostgreSQL sink: Spark JDBC into staging tables, then ONE transaction per batch.

    The URL is ``jdbc:postgresql://host:port/db?user=...``, or None to take the
    server from ``PGHOST``/``PGPORT``/``PGDATABASE``; the password comes from
    ``PGPASSWORD`` or the password file (:func:`postgres_credentials`). The rows
    travel from the executors through Spark's JDBC writer (pgjdbc, from
    Debian's ``libpostgresql-jdbc-java``, the password a connection property),
    and :meth:`read_table` reads through Spark's JDBC reader. The DDL and the
    commit run through pg8000 in the Python process that runs the micro-batch
    (the driver on a classic session, the Python process beside the server
    under Spark Connect), with no JVM: pg8000 is pure Python (no libpq or other
    native library to install on that Python), speaks DB-API, and takes the
    password as a parameter, so the libpq-order lookup of
    :func:`postgres_credentials` stays its single source. The commit locks
    ``tickwheel_batches`` and in one transaction copies the batch's staged
    rows into the real tables and inserts ``tickwheel_batches(batch_id,
    committed_at, row_counts)``. The primary key on ``batch_id`` and the
    guarded INSERTs make a replayed or concurrent commit a no-op instead of
    doubling rows. The sink holds no session and no connection (one per
    statement group), so it pickles into a Connect server's ``foreachBatch``.
    """

    name = "postgresql"
    dialect = "postgresql"
    driver_class = "org.postgresql.Driver"

    def __init__(
        self, url: str | None, spark: SparkSession | None = None, *, prefix: str = ""
    ) -> None:
        """Use the database at ``url`` (secrets taken out of it).

        ``spark`` is accepted for compatibility and unused: the commit needs no
        JVM. Raises :class:`SinkError` when pg8000 or the pgjdbc jar is missing.
        """
        del spark
        credentials = postgres_credentials(url)
        _pg8000_dbapi()
        if find_jar(POSTGRES_JARS, "libpostgresql-jdbc-java") is None:
            raise SinkError(
                "the PostgreSQL sink needs Debian's libpostgresql-jdbc-java "
                "(run scripts/system-deps.sh)"
            )
        super().__init__(credentials.url, prefix=prefix)
        self._credentials = credentials
        self._target = _pg_target(credentials.url)

    def describe(self) -> str:
        """``postgresql:URL (user U, password from SOURCE)``, nothing secret in it."""
        return f"{self.name}:{self._credentials.describe()}"

    def _jdbc_options(self) -> dict[str, str]:
        # Spark hands its JDBC options to pgjdbc as connection properties, and
        # redacts "password" (spark.redaction.regex) wherever it shows them.
        return {**super()._jdbc_options(), **self._credentials.properties}

    def _connection(self) -> Any:
        """A new pg8000 DB-API connection (autocommit off), or a :class:`SinkError`
        naming the redacted URL and the cause (refused, authentication failed...)."""
        dbapi = _pg8000_dbapi()
        target = self._target
        secrets = self._credentials.properties
        sock = None
        try:
            ssl_context = _pg_ssl_context(target, secrets.get("sslpassword"))
            sock, host = _pg_socket(target)
            startup = dict(target.startup)
            return dbapi.connect(
                user=self._credentials.user,
                host=host,  # the socket is connected: pg8000 checks the certificate's name
                database=target.database,
                password=secrets.get("password"),
                sock=sock,
                ssl_context=ssl_context,
                application_name=startup.pop("application_name", None),
                startup_params=startup or None,
            )
        except Exception as exc:
            if sock is not None:
                _close_quietly(sock)
            raise SinkError(
                f"cannot connect to the PostgreSQL sink at {self._credentials.describe()}: "
                f"{_pg_failure(exc, password=secrets.get('password') is not None)}"
            ) from exc

    def _execute(self, statements: Sequence[str], *, transaction: bool) -> None:
        """Run ``statements`` in one transaction (rolled back on any error), or each
        in its own (autocommit)."""
        conn = self._connection()
        try:
            conn.autocommit = not transaction
            cursor = conn.cursor()
            for sql in statements:
                cursor.execute(sql)
            if transaction:
                conn.commit()
        except BaseException:
            if transaction:
                with contextlib.suppress(Exception):
                    conn.rollback()
            raise
        finally:
            _close_quietly(conn)

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` as tuples of Python values (``BIGINT`` an int, ``TEXT``
        a str, ``NULL`` None), as the SQLite sink returns them."""
        conn = self._connection()
        try:
            conn.autocommit = True
            cursor = conn.cursor()
            cursor.execute(sql)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            _close_quietly(conn)

    def _write_parallelism(self) -> int | None:
        return None

    def _commit_preamble(self) -> list[str]:
        """Serialise concurrent committers of the same sink: the guarded inserts then
        see each other's rows."""
        return [
            f"LOCK TABLE {quote_identifier(self._table(BATCHES_TABLE))} IN SHARE ROW EXCLUSIVE MODE"
        ]
